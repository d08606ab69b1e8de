//! Which API, and which S3 operation, a request is: decided once per request from its head alone
//! ([`classify`]), so that routing, the listener's role, error rendering and the handler deadline all read the same
//! answer. Pure: no IO, no state; table- and property-tested below.
//!
//! A request is an S3 one when it carries AWS credentials (a SigV4 `AWS4-…` or SigV2 `AWS …` Authorization header,
//! or a presign's parameters in the query), when its `Host` is a bucket under `s3.domain` (virtual-hosted style),
//! or when it names an S3-only path (`/`, `/{bucket}`, `/{bucket}/`) with a query an S3 client sends. Anything else
//! is the native API: an unsigned `/{bucket}/` with `?utm_source=…` is a static site's home, not a listing.

use http::Method;
use http::header;

use crate::header_values::fields::{self, FieldName, Fields};

use crate::names::{BucketName, ObjectKey, RequestedKey, parse_data_path};

/// The API a request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Api {
    /// The native API: the object handler answers GET and HEAD (and CORS preflights), the upload handler PUT and
    /// DELETE.
    Native,
    /// An S3 request: its operation, or why it is refused before anything is looked up.
    S3(Result<S3Call, Refusal>),
}

impl Api {
    /// Whether the request would change something (a write or a delete), as `listen_read_only` refuses them.
    #[must_use]
    pub fn is_write(&self, method: &Method) -> bool {
        match self {
            Api::Native => matches!(*method, Method::PUT | Method::DELETE | Method::POST),
            Api::S3(Ok(call)) => call.operation.is_write(),
            // A refusal changes nothing, whatever its method.
            Api::S3(Err(_)) => false,
        }
    }
}

/// One S3 operation on the resource it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Call {
    pub operation: Operation,
    pub resource: Resource,
    /// Addressed virtual-hosted style (`Host: bucket.s3.example.com`), not path-style.
    pub virtual_hosted: bool,
}

/// What an S3 request names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resource {
    Service,
    Bucket(BucketName),
    Object(BucketName, ObjectKey),
}

impl Resource {
    #[must_use]
    pub fn bucket(&self) -> Option<&BucketName> {
        match self {
            Resource::Service => None,
            Resource::Bucket(b) | Resource::Object(b, _) => Some(b),
        }
    }
}

/// Every S3 operation blobgate answers, by S3's own names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    ListBuckets,
    CreateBucket,
    DeleteBucket,
    HeadBucket,
    GetBucketLocation,
    ListObjects,
    ListObjectsV2,
    ListMultipartUploads,
    DeleteObjects,
    GetBucketVersioning,
    GetBucketAcl,
    GetBucketCors,
    PutBucketCors,
    DeleteBucketCors,
    GetBucketLifecycleConfiguration,
    GetBucketPolicy,
    GetBucketEncryption,
    GetBucketTagging,
    GetObject,
    HeadObject,
    GetObjectTagging,
    GetObjectAcl,
    GetObjectAttributes,
    ListParts,
    PutObject,
    CopyObject,
    DeleteObject,
    PutObjectTagging,
    DeleteObjectTagging,
    CreateMultipartUpload,
    UploadPart,
    UploadPartCopy,
    CompleteMultipartUpload,
    AbortMultipartUpload,
    /// S3's "OPTIONS object": a browser's CORS preflight (`OPTIONS` with `Origin` and
    /// `Access-Control-Request-Method`) for a bucket or an object, answered from the bucket's rule alone.
    CorsPreflight,
}

impl Operation {
    /// Every operation, for tables and tests.
    pub const ALL: [Operation; 35] = [
        Operation::ListBuckets,
        Operation::CreateBucket,
        Operation::DeleteBucket,
        Operation::HeadBucket,
        Operation::GetBucketLocation,
        Operation::ListObjects,
        Operation::ListObjectsV2,
        Operation::ListMultipartUploads,
        Operation::DeleteObjects,
        Operation::GetBucketVersioning,
        Operation::GetBucketAcl,
        Operation::GetBucketCors,
        Operation::PutBucketCors,
        Operation::DeleteBucketCors,
        Operation::GetBucketLifecycleConfiguration,
        Operation::GetBucketPolicy,
        Operation::GetBucketEncryption,
        Operation::GetBucketTagging,
        Operation::GetObject,
        Operation::HeadObject,
        Operation::GetObjectTagging,
        Operation::GetObjectAcl,
        Operation::GetObjectAttributes,
        Operation::ListParts,
        Operation::PutObject,
        Operation::CopyObject,
        Operation::DeleteObject,
        Operation::PutObjectTagging,
        Operation::DeleteObjectTagging,
        Operation::CreateMultipartUpload,
        Operation::UploadPart,
        Operation::UploadPartCopy,
        Operation::CompleteMultipartUpload,
        Operation::AbortMultipartUpload,
        Operation::CorsPreflight,
    ];

    /// Whether it changes something: refused by a read-only listener, and authorised for writing.
    #[must_use]
    pub fn is_write(self) -> bool {
        use Operation::*;
        matches!(
            self,
            CreateBucket
                | DeleteBucket
                | PutBucketCors
                | DeleteBucketCors
                | DeleteObjects
                | PutObject
                | CopyObject
                | DeleteObject
                | PutObjectTagging
                | DeleteObjectTagging
                | CreateMultipartUpload
                | UploadPart
                | UploadPartCopy
                | CompleteMultipartUpload
                | AbortMultipartUpload
        )
    }

    /// Whether the request carries a body the handler must read (an object, a part, or a small XML document).
    #[must_use]
    pub fn reads_body(self) -> bool {
        use Operation::*;
        matches!(
            self,
            PutObject
                | UploadPart
                | DeleteObjects
                | PutObjectTagging
                | CompleteMultipartUpload
                | CreateBucket
                | PutBucketCors
        )
    }

    /// The query parameters the operation reads, besides its own subresource (see [`classify`]), SigV4's
    /// `X-Amz-*` and the SDKs' `x-id`. Any other names something we do not implement.
    fn params(self) -> &'static [&'static str] {
        use Operation::*;
        match self {
            ListBuckets => &["max-buckets", "prefix", "continuation-token", "bucket-region"],
            ListObjects | ListObjectsV2 => LIST_PARAMS,
            ListMultipartUploads => {
                &["uploads", "prefix", "delimiter", "key-marker", "upload-id-marker", "max-uploads", "encoding-type"]
            }
            ListParts => &["uploadId", "max-parts", "part-number-marker", "encoding-type"],
            GetObject => &[
                "partNumber",
                "response-content-type",
                "response-content-language",
                "response-expires",
                "response-cache-control",
                "response-content-disposition",
                "response-content-encoding",
            ],
            HeadObject => &["partNumber"],
            GetBucketLocation => &["location"],
            GetBucketVersioning => &["versioning"],
            GetBucketAcl | GetObjectAcl => &["acl"],
            GetObjectAttributes => &["attributes"],
            GetBucketCors | PutBucketCors | DeleteBucketCors => &["cors"],
            GetBucketLifecycleConfiguration => &["lifecycle"],
            GetBucketPolicy => &["policy"],
            GetBucketEncryption => &["encryption"],
            GetBucketTagging | GetObjectTagging | PutObjectTagging | DeleteObjectTagging => &["tagging"],
            DeleteObjects => &["delete"],
            CreateMultipartUpload => &["uploads"],
            UploadPart | UploadPartCopy => &["uploadId", "partNumber"],
            CompleteMultipartUpload | AbortMultipartUpload => &["uploadId"],
            CreateBucket | DeleteBucket | HeadBucket | PutObject | CopyObject | DeleteObject => &[],
            // The preflight of any request carries that request's query: it reads none of it.
            CorsPreflight => &[],
        }
    }
}

/// The query parameters of ListObjects V1 and V2.
const LIST_PARAMS: &[&str] = &[
    "list-type",
    "prefix",
    "delimiter",
    "marker",
    "max-keys",
    "continuation-token",
    "start-after",
    "fetch-owner",
    "encoding-type",
];

/// The subresources and parameters of S3's bucket operations besides the listings': an unsigned request on a
/// bucket's path that names one is an S3 client's (most are then answered `NotImplemented`).
const BUCKET_SUBRESOURCES: &[&str] = &[
    "location",
    "uploads",
    "uploadId",
    "max-uploads",
    "key-marker",
    "upload-id-marker",
    "versions",
    "versioning",
    "acl",
    "policy",
    "policyStatus",
    "cors",
    "lifecycle",
    "tagging",
    "website",
    "encryption",
    "logging",
    "notification",
    "replication",
    "requestPayment",
    "object-lock",
    "publicAccessBlock",
    "ownershipControls",
    "accelerate",
    "analytics",
    "inventory",
    "metrics",
    "intelligent-tiering",
    "delete",
];

/// The query parameters (as `name=`) that make a request an AWS one. Each is a credential the logs redact
/// (`access_log::is_credential_param`; a test in `http::s3` checks it).
pub const AWS_QUERY_CREDENTIALS: [&str; 4] =
    ["X-Amz-Algorithm=", "X-Amz-Credential=", "X-Amz-Signature=", "AWSAccessKeyId="];

/// CopyObject's and UploadPartCopy's source header.
pub const COPY_SOURCE: &str = "x-amz-copy-source";

/// Why an S3 request is refused from its head alone, before any lookup or authorisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The path's bucket is not a valid bucket name.
    InvalidBucketName,
    /// The path's key is not a valid key.
    InvalidKey(String),
    /// A subresource or parameter we do not implement (`?website`, `?retention`…): S3's `NotImplemented`.
    NotImplemented(String),
    /// A method the resource has no operation for (`POST /{bucket}/{key}` without `uploads`…).
    MethodNotAllowed,
}

/// What [`classify`] reads of a request.
#[derive(Clone, Copy)]
pub struct RequestHead<'r> {
    pub method: &'r Method,
    /// The request target's path, still percent-encoded.
    pub path: &'r str,
    pub query: Option<&'r str>,
    pub headers: &'r dyn Fields,
    /// `s3.domain`, when virtual-hosted-style addressing is on.
    pub s3_domain: Option<&'r str>,
}

/// Decides a request's API and, for S3, its operation.
#[must_use]
pub fn classify(head: RequestHead<'_>) -> Api {
    let (s3, virtual_bucket) = s3_signals(&head);
    if !s3 {
        return Api::Native;
    }
    let query = head.query.filter(|q| !q.is_empty());
    let resource = match virtual_bucket {
        Some(bucket) => virtual_hosted_resource(bucket, head.path),
        None => path_style_resource(head.path),
    };
    Api::S3(resource.and_then(|resource| {
        let params = QueryNames::parse(query);
        let operation = operation(head.method, &resource, &params, head.headers)?;
        params.refuse_unknown(operation)?;
        Ok(S3Call { operation, resource, virtual_hosted: virtual_bucket.is_some() })
    }))
}

/// Whether [`classify`] would call the request native, without classifying an S3 one: what decides whether the
/// data listener answers it from its parsed head.
#[must_use]
pub fn is_native(head: RequestHead<'_>) -> bool {
    !s3_signals(&head).0
}

/// Whether a request is for the S3 API (a bucket under `s3.domain` in Host, AWS credentials, or an S3 query), and
/// the virtual-hosted bucket if there is one.
fn s3_signals<'r>(head: &RequestHead<'r>) -> (bool, Option<&'r str>) {
    let virtual_bucket = head.s3_domain.and_then(|domain| virtual_host_bucket(head.headers, domain));
    let query = head.query.filter(|q| !q.is_empty());
    let s3 = virtual_bucket.is_some()
        || carries_aws_credentials(head.headers, query)
        || query.is_some_and(|q| is_s3_query(head.path, q));
    (s3, virtual_bucket)
}

/// Whether a request comes from an AWS SDK: botocore, aws-cli and every AWS SDK send `amz-sdk-invocation-id` or
/// `amz-sdk-request` on every request, signed or not; curl and browsers send neither. It does not make a request
/// an S3 one (an unsigned path-style read stays native), but it chooses the words of a refusal: an SDK understands
/// S3's XML errors, not a bearer challenge (`http::object::refusal`).
#[must_use]
pub fn from_aws_sdk(headers: &dyn Fields) -> bool {
    headers.has_any(&[&fields::SDK_INVOCATION_ID, &fields::SDK_REQUEST])
}

/// Whether a request carries AWS credentials: SigV4 (`AWS4-…`) or SigV2 (`AWS ak:sig`, refused in S3's words)
/// in the Authorization header, or a presign's parameters in the query.
#[must_use]
pub fn carries_aws_credentials(headers: &dyn Fields, query: Option<&str>) -> bool {
    let aws = |v: &[u8]| v.starts_with(b"AWS4-") || v.starts_with(b"AWS ");
    if headers.get(&fields::AUTHORIZATION).is_some_and(aws) {
        return true;
    }
    query.is_some_and(|query| AWS_QUERY_CREDENTIALS.iter().any(|p| query.contains(p)))
}

/// SigV4's own `X-Amz-*` parameters, and `x-id`, the operation name newer SDKs add (`?x-id=GetObject`).
#[must_use]
pub fn is_signing_or_sdk_param(name: &str) -> bool {
    name == "x-id" || name.starts_with("X-Amz-") || name.starts_with("x-amz-")
}

/// Whether an unsigned request for `path` with `query` is an S3 one: `/` with any query, a bucket's path with a
/// query naming a parameter of S3's bucket operations.
fn is_s3_query(path: &str, query: &str) -> bool {
    if path == "/" {
        return true;
    }
    is_s3_only_path(path)
        && form_urlencoded::parse(query.as_bytes()).any(|(name, _)| {
            LIST_PARAMS.contains(&&*name) || BUCKET_SUBRESOURCES.contains(&&*name) || is_signing_or_sdk_param(&name)
        })
}

/// `/`, `/{bucket}` and `/{bucket}/`: paths that name no object, so the native API has no route there.
fn is_s3_only_path(path: &str) -> bool {
    let rest = path.strip_prefix('/').unwrap_or(path);
    match rest.find('/') {
        None => true,
        Some(i) => i + 1 == rest.len(),
    }
}

/// The bucket a `Host` under `domain` names (`releases.s3.example.com`, any port, any case), if it is one.
fn virtual_host_bucket<'h>(headers: &'h dyn Fields, domain: &str) -> Option<&'h str> {
    let host = std::str::from_utf8(headers.get(&fields::HOST)?).ok()?;
    // A port, but not an IPv6 literal's colons (which cannot end in the domain anyway).
    let host = host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |h| h.0);
    let host = host.strip_suffix('.').unwrap_or(host);
    let cut = host.len().checked_sub(domain.len() + 1)?;
    let (bucket, suffix) = host.split_at(cut);
    let suffix = &suffix[1..];
    (host.as_bytes()[cut] == b'.' && suffix.eq_ignore_ascii_case(domain) && !bucket.is_empty()).then_some(bucket)
}

fn path_style_resource(path: &str) -> Result<Resource, Refusal> {
    if path == "/" {
        return Ok(Resource::Service);
    }
    if is_s3_only_path(path) {
        let name = path.trim_matches('/');
        let decoded =
            percent_encoding::percent_decode_str(name).decode_utf8().map_err(|_| Refusal::InvalidBucketName)?;
        return BucketName::parse(&decoded).map(Resource::Bucket).map_err(|_| Refusal::InvalidBucketName);
    }
    match parse_data_path(path) {
        Ok((bucket, RequestedKey::Key(key))) => Ok(Resource::Object(bucket, key)),
        Ok((_, RequestedKey::Root { .. })) => Err(Refusal::InvalidKey("key is empty".into())),
        Err(crate::names::NameError::Bucket { .. }) => Err(Refusal::InvalidBucketName),
        Err(e) => Err(Refusal::InvalidKey(e.to_string())),
    }
}

fn virtual_hosted_resource(bucket: &str, path: &str) -> Result<Resource, Refusal> {
    let bucket = BucketName::parse(&bucket.to_ascii_lowercase()).map_err(|_| Refusal::InvalidBucketName)?;
    match path.strip_prefix('/').unwrap_or(path) {
        "" => Ok(Resource::Bucket(bucket)),
        key => ObjectKey::from_url_path(key)
            .map(|key| Resource::Object(bucket, key))
            .map_err(|e| Refusal::InvalidKey(e.to_string())),
    }
}

/// The names of a request's query parameters, decoded.
struct QueryNames {
    names: Vec<String>,
    /// A SigV2 presign (`AWSAccessKeyId`, not SigV4's `X-Amz-Algorithm`): its other parameters are not judged, so
    /// that authorisation answers it in SigV2's words.
    sigv2_presign: bool,
}

impl QueryNames {
    fn parse(query: Option<&str>) -> Self {
        let names: Vec<String> =
            form_urlencoded::parse(query.unwrap_or("").as_bytes()).map(|(k, _)| k.into_owned()).collect();
        let sigv2_presign =
            names.iter().any(|n| n == "AWSAccessKeyId") && !names.iter().any(|n| n == "X-Amz-Algorithm");
        Self { names, sigv2_presign }
    }

    fn has(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    fn refuse_unknown(&self, operation: Operation) -> Result<(), Refusal> {
        if self.sigv2_presign || operation == Operation::CorsPreflight {
            return Ok(());
        }
        let known = operation.params();
        match self.names.iter().find(|n| !known.contains(&n.as_str()) && !is_signing_or_sdk_param(n)) {
            Some(name) => Err(Refusal::NotImplemented(name.clone())),
            None => Ok(()),
        }
    }
}

/// The bucket subresources a GET reads, and the operation each is.
const BUCKET_GETS: [(&str, Operation); 9] = [
    ("location", Operation::GetBucketLocation),
    ("uploads", Operation::ListMultipartUploads),
    ("versioning", Operation::GetBucketVersioning),
    ("acl", Operation::GetBucketAcl),
    ("cors", Operation::GetBucketCors),
    ("lifecycle", Operation::GetBucketLifecycleConfiguration),
    ("policy", Operation::GetBucketPolicy),
    ("encryption", Operation::GetBucketEncryption),
    ("tagging", Operation::GetBucketTagging),
];

fn operation(method: &Method, resource: &Resource, q: &QueryNames, headers: &dyn Fields) -> Result<Operation, Refusal> {
    use Operation::*;
    // Looked up for a PUT of an object only: a hashed header lookup that reads need not pay.
    static COPY_SOURCE_NAME: FieldName = FieldName::other(header::HeaderName::from_static(COPY_SOURCE));
    let copy = || headers.contains(&COPY_SOURCE_NAME);
    let preflight = || headers.contains(&fields::ORIGIN) && headers.contains(&fields::ACCESS_CONTROL_REQUEST_METHOD);
    let op = match (resource, method.as_str()) {
        (Resource::Bucket(_) | Resource::Object(..), "OPTIONS") if preflight() => CorsPreflight,
        (Resource::Service, "GET") => ListBuckets,
        (Resource::Service, _) => return Err(Refusal::MethodNotAllowed),

        (Resource::Bucket(_), "GET") => match BUCKET_GETS.iter().find(|(name, _)| q.has(name)) {
            Some(&(_, op)) => op,
            None if q.names.iter().any(|n| n == "list-type") => ListObjectsV2,
            None => ListObjects,
        },
        (Resource::Bucket(_), "HEAD") => HeadBucket,
        (Resource::Bucket(_), "PUT") if q.has("cors") => PutBucketCors,
        (Resource::Bucket(_), "PUT") => CreateBucket,
        (Resource::Bucket(_), "DELETE") if q.has("cors") => DeleteBucketCors,
        (Resource::Bucket(_), "DELETE") => DeleteBucket,
        (Resource::Bucket(_), "POST") if q.has("delete") => DeleteObjects,
        (Resource::Bucket(_), _) => return Err(Refusal::MethodNotAllowed),

        (Resource::Object(..), "GET") if q.has("uploadId") => ListParts,
        (Resource::Object(..), "GET") if q.has("tagging") => GetObjectTagging,
        (Resource::Object(..), "GET") if q.has("acl") => GetObjectAcl,
        (Resource::Object(..), "GET") if q.has("attributes") => GetObjectAttributes,
        (Resource::Object(..), "GET") => GetObject,
        (Resource::Object(..), "HEAD") => HeadObject,
        (Resource::Object(..), "PUT") if q.has("tagging") => PutObjectTagging,
        (Resource::Object(..), "PUT") if q.has("uploadId") || q.has("partNumber") => {
            if copy() {
                UploadPartCopy
            } else {
                UploadPart
            }
        }
        (Resource::Object(..), "PUT") if copy() => CopyObject,
        (Resource::Object(..), "PUT") => PutObject,
        (Resource::Object(..), "DELETE") if q.has("tagging") => DeleteObjectTagging,
        (Resource::Object(..), "DELETE") if q.has("uploadId") => AbortMultipartUpload,
        (Resource::Object(..), "DELETE") => DeleteObject,
        (Resource::Object(..), "POST") if q.has("uploads") => CreateMultipartUpload,
        (Resource::Object(..), "POST") if q.has("uploadId") => CompleteMultipartUpload,
        (Resource::Object(..), _) => return Err(Refusal::MethodNotAllowed),
    };
    Ok(op)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SIGV4: &str =
        "AWS4-HMAC-SHA256 Credential=AKBG/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00";

    fn head_of(method: &str, target: &str, headers: &[(&str, &str)], domain: Option<&str>) -> Api {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.append(header::HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        let (path, query) = match target.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (target, None),
        };
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let head = RequestHead { method: &method, path, query, headers: &map, s3_domain: domain };
        let api = classify(head);
        assert_eq!(is_native(head), api == Api::Native, "is_native agrees with classify on {target}");
        api
    }

    fn signed(method: &str, target: &str) -> Api {
        head_of(method, target, &[("authorization", SIGV4)], None)
    }

    fn op(api: &Api) -> Option<Operation> {
        match api {
            Api::S3(Ok(call)) => Some(call.operation),
            _ => None,
        }
    }

    /// A presigned PUT's URL, and the headers of a browser's preflight for it.
    const PRESIGNED_PUT: &str = "/bkt/k?X-Amz-Credential=c&X-Amz-Signature=00&partNumber=1&uploadId=u";
    const PREFLIGHT: &[(&str, &str)] = &[("origin", "https://app.example"), ("access-control-request-method", "PUT")];

    #[test]
    fn every_operation_is_classified_from_its_request() {
        use Operation::*;
        let copy = [("authorization", SIGV4), ("x-amz-copy-source", "/src/k")];
        let cases: Vec<(Api, Operation)> = vec![
            (signed("GET", "/"), ListBuckets),
            (signed("GET", "/?x-id=ListBuckets&max-buckets=10"), ListBuckets),
            (signed("PUT", "/bkt"), CreateBucket),
            (signed("PUT", "/bkt/"), CreateBucket),
            (signed("DELETE", "/bkt"), DeleteBucket),
            (signed("HEAD", "/bkt"), HeadBucket),
            (signed("GET", "/bkt?location"), GetBucketLocation),
            (signed("GET", "/bkt"), ListObjects),
            (signed("GET", "/bkt?prefix=a&marker=m&max-keys=3"), ListObjects),
            (signed("GET", "/bkt?list-type=2&prefix=a&continuation-token=t&start-after=s"), ListObjectsV2),
            (signed("GET", "/bkt?uploads&key-marker=k&max-uploads=2"), ListMultipartUploads),
            (signed("POST", "/bkt?delete"), DeleteObjects),
            (signed("GET", "/bkt?versioning"), GetBucketVersioning),
            (signed("GET", "/bkt?acl"), GetBucketAcl),
            (signed("GET", "/bkt?cors"), GetBucketCors),
            (signed("PUT", "/bkt?cors"), PutBucketCors),
            (signed("DELETE", "/bkt?cors"), DeleteBucketCors),
            (signed("GET", "/bkt?lifecycle"), GetBucketLifecycleConfiguration),
            (signed("GET", "/bkt?policy"), GetBucketPolicy),
            (signed("GET", "/bkt?encryption"), GetBucketEncryption),
            (signed("GET", "/bkt?tagging"), GetBucketTagging),
            (signed("GET", "/bkt/k"), GetObject),
            (signed("GET", "/bkt/k?partNumber=2"), GetObject),
            (signed("GET", "/bkt/k?response-content-type=text%2Fplain"), GetObject),
            (signed("HEAD", "/bkt/k?partNumber=1"), HeadObject),
            (signed("GET", "/bkt/k?tagging"), GetObjectTagging),
            (signed("GET", "/bkt/k?acl"), GetObjectAcl),
            (signed("GET", "/bkt/k?attributes"), GetObjectAttributes),
            (signed("GET", "/bkt/k?uploadId=u&max-parts=5&part-number-marker=2"), ListParts),
            (signed("PUT", "/bkt/k"), PutObject),
            (head_of("PUT", "/bkt/k", &copy, None), CopyObject),
            (signed("DELETE", "/bkt/k"), DeleteObject),
            (signed("PUT", "/bkt/k?tagging"), PutObjectTagging),
            (signed("DELETE", "/bkt/k?tagging"), DeleteObjectTagging),
            (signed("POST", "/bkt/k?uploads"), CreateMultipartUpload),
            (signed("POST", "/bkt/k?uploads&x-id=CreateMultipartUpload"), CreateMultipartUpload),
            (signed("PUT", "/bkt/k?partNumber=1&uploadId=u"), UploadPart),
            (head_of("PUT", "/bkt/k?partNumber=1&uploadId=u", &copy, None), UploadPartCopy),
            (signed("POST", "/bkt/k?uploadId=u"), CompleteMultipartUpload),
            (signed("DELETE", "/bkt/k?uploadId=u"), AbortMultipartUpload),
            (head_of("OPTIONS", PRESIGNED_PUT, PREFLIGHT, None), CorsPreflight),
            (head_of("OPTIONS", "/bkt?uploads&X-Amz-Signature=00", PREFLIGHT, None), CorsPreflight),
        ];
        let mut seen = std::collections::HashSet::new();
        for (api, want) in &cases {
            assert_eq!(op(api), Some(*want), "{api:?}");
            seen.insert(*want);
        }
        let missing: Vec<_> = Operation::ALL.iter().filter(|o| !seen.contains(o)).collect();
        assert!(missing.is_empty(), "operations the table does not cover: {missing:?}");
    }

    #[test]
    fn unknown_subresources_and_methods_are_refused_before_any_lookup() {
        let not_implemented = |name: &str| Api::S3(Err(Refusal::NotImplemented(name.into())));
        let cases = [
            (signed("GET", "/bkt?website"), not_implemented("website")),
            (signed("GET", "/bkt?versions"), not_implemented("versions")),
            (signed("GET", "/bkt?acl&policy"), not_implemented("policy")),
            (signed("PUT", "/bkt?tagging"), not_implemented("tagging")),
            (signed("PUT", "/bkt?versioning"), not_implemented("versioning")),
            (signed("DELETE", "/bkt?cors&policy"), not_implemented("policy")),
            (signed("GET", "/bkt/k?retention"), not_implemented("retention")),
            (signed("PUT", "/bkt/k?acl"), not_implemented("acl")),
            (signed("PUT", "/bkt/k?legal-hold"), not_implemented("legal-hold")),
            (signed("HEAD", "/bkt/k?response-content-type=x"), not_implemented("response-content-type")),
            (signed("GET", "/bkt?list-type=2&uploadId=u"), not_implemented("uploadId")),
            (signed("POST", "/bkt/k?select&select-type=2"), Api::S3(Err(Refusal::MethodNotAllowed))),
            (signed("POST", "/bkt/k"), Api::S3(Err(Refusal::MethodNotAllowed))),
            (signed("POST", "/bkt"), Api::S3(Err(Refusal::MethodNotAllowed))),
            (signed("PUT", "/"), Api::S3(Err(Refusal::MethodNotAllowed))),
            (signed("PATCH", "/bkt/k"), Api::S3(Err(Refusal::MethodNotAllowed))),
            // OPTIONS is a preflight only with its two headers.
            (signed("OPTIONS", "/bkt/k"), Api::S3(Err(Refusal::MethodNotAllowed))),
            (head_of("OPTIONS", PRESIGNED_PUT, &PREFLIGHT[..1], None), Api::S3(Err(Refusal::MethodNotAllowed))),
            (head_of("OPTIONS", "/?X-Amz-Signature=00", PREFLIGHT, None), Api::S3(Err(Refusal::MethodNotAllowed))),
            (signed("GET", "/Not_A_Bucket"), Api::S3(Err(Refusal::InvalidBucketName))),
            (signed("GET", "/Not_A_Bucket/k"), Api::S3(Err(Refusal::InvalidBucketName))),
        ];
        for (api, want) in cases {
            assert_eq!(api, want);
        }
        // SigV4's own parameters and the SDKs' x-id are never a subresource.
        let presigned = "/bkt/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=c&X-Amz-Date=d&X-Amz-Expires=60\
                         &X-Amz-SignedHeaders=host&X-Amz-Signature=00&x-id=GetObject";
        assert_eq!(op(&head_of("GET", presigned, &[], None)), Some(Operation::GetObject));
        // A SigV2 presign is left whole to authorisation, which answers it in SigV2's words.
        let sigv2 = head_of("GET", "/bkt/k?AWSAccessKeyId=AK&Signature=s&Expires=1", &[], None);
        assert_eq!(op(&sigv2), Some(Operation::GetObject));
    }

    #[test]
    fn native_requests_stay_native() {
        let native = [
            ("GET", "/bkt/k", vec![]),
            ("GET", "/bkt/dir/k.txt?bg-expires=1&bg-key=k&bg-sig=s", vec![]),
            ("GET", "/bkt/k", vec![("authorization", "Bearer x")]),
            ("PUT", "/bkt/k", vec![("authorization", "Bearer x")]),
            ("DELETE", "/bkt/k", vec![("authorization", "Bearer x")]),
            ("OPTIONS", "/bkt/k", vec![("origin", "https://a.example")]),
            ("GET", "/", vec![]),
            ("GET", "/healthz", vec![]),
            ("GET", "/bkt/", vec![]),
            ("GET", "/bkt//", vec![]),
            ("GET", "/bkt/?utm_source=mail&fbclid=x", vec![]),
            ("GET", "/bkt?utm_source=mail", vec![]),
            ("GET", "/bkt/?list-type2", vec![]),
            ("GET", "/bkt/k?list-type=2", vec![]),
        ];
        for (method, target, headers) in native {
            assert_eq!(head_of(method, target, &headers, None), Api::Native, "{method} {target}");
            // With virtual hosting on, a host that is not a bucket under the domain changes nothing.
            let mut with_host = headers.clone();
            with_host.push(("host", "dl.example.com:8080"));
            assert_eq!(head_of(method, target, &with_host, Some("s3.example.com")), Api::Native, "{target}");
        }
        let s3 = [
            ("GET", "/bkt/?list-type=2"),
            ("HEAD", "/bkt?location"),
            ("GET", "/bkt/?delimiter=%2F"),
            ("GET", "/bkt?x-id=ListObjects"),
            ("GET", "/?utm_source=x"),
            ("GET", "/bkt/k?X-Amz-Signature=00"),
        ];
        for (method, target) in s3 {
            assert!(matches!(head_of(method, target, &[], None), Api::S3(_)), "{method} {target}");
        }
        assert!(matches!(head_of("GET", "/bkt/k", &[("authorization", "AWS AK:sig")], None), Api::S3(_)));
    }

    #[test]
    fn an_aws_sdk_is_known_by_its_marks_which_leave_a_request_native() {
        let map = |headers: &[(&str, &str)]| {
            headers
                .iter()
                .map(|(n, v)| (header::HeaderName::from_bytes(n.as_bytes()).unwrap(), v.parse().unwrap()))
                .collect::<http::HeaderMap>()
        };
        let invocation = ("amz-sdk-invocation-id", "0b8a3f7e-46a2-4d1c-9d1e-7f2c1a6b5e44");
        let attempt = ("amz-sdk-request", "attempt=1; max=3");
        let curl = ("user-agent", "curl/8.5.0");
        for sdk in [vec![invocation, attempt], vec![invocation], vec![attempt, curl]] {
            assert!(from_aws_sdk(&map(&sdk)), "{sdk:?}");
            assert_eq!(head_of("GET", "/bkt/k", &sdk, None), Api::Native, "unsigned path-style stays native");
        }
        for other in [vec![], vec![curl], vec![("x-amz-date", "20260101T000000Z"), ("authorization", "Bearer x")]] {
            assert!(!from_aws_sdk(&map(&other)), "{other:?}");
        }
    }

    #[test]
    fn virtual_hosted_requests_address_the_bucket_in_the_host() {
        let domain = Some("s3.example.com");
        let at = |method: &str, host: &str, target: &str| head_of(method, target, &[("host", host)], domain);
        let call = |api: Api| match api {
            Api::S3(Ok(call)) => (call.operation, call.resource, call.virtual_hosted),
            other => panic!("not an S3 call: {other:?}"),
        };
        let b = || BucketName::parse("releases").unwrap();
        let key = |k: &str| ObjectKey::parse(k).unwrap();
        assert_eq!(
            call(at("GET", "releases.s3.example.com", "/v1/app%20x.tar.gz")),
            (Operation::GetObject, Resource::Object(b(), key("v1/app x.tar.gz")), true)
        );
        assert_eq!(
            call(at("GET", "Releases.S3.Example.com:9000", "/?list-type=2")),
            (Operation::ListObjectsV2, Resource::Bucket(b()), true)
        );
        assert_eq!(
            call(at("GET", "releases.s3.example.com.", "/")),
            (Operation::ListObjects, Resource::Bucket(b()), true)
        );
        assert_eq!(
            call(at("PUT", "releases.s3.example.com", "/")),
            (Operation::CreateBucket, Resource::Bucket(b()), true)
        );
        // The domain itself (and anything else) is path-style.
        assert_eq!(
            head_of("GET", "/releases/k", &[("host", "s3.example.com"), ("authorization", SIGV4)], domain),
            signed("GET", "/releases/k")
        );
        assert_eq!(at("GET", "s3.example.com", "/releases/k"), Api::Native);
        assert_eq!(at("GET", "xs3.example.com", "/releases/k"), Api::Native);
        assert_eq!(at("GET", "bad_name.s3.example.com", "/k"), Api::S3(Err(Refusal::InvalidBucketName)));
        // Without s3.domain, Host is never read.
        assert_eq!(head_of("GET", "/k", &[("host", "releases.s3.example.com")], None), Api::Native);
    }

    #[test]
    fn writes_are_told_from_reads() {
        let writes: Vec<_> = Operation::ALL.iter().filter(|o| o.is_write()).collect();
        assert_eq!(writes.len(), 15);
        for op in Operation::ALL {
            if op.reads_body() {
                assert!(op.is_write(), "{op:?} reads a body, so it writes");
            }
        }
        let get = Method::GET;
        assert!(!signed("GET", "/bkt/k").is_write(&get));
        assert!(signed("PUT", "/bkt/k").is_write(&Method::PUT));
        assert!(Api::Native.is_write(&Method::PUT) && Api::Native.is_write(&Method::DELETE));
        assert!(!Api::Native.is_write(&get) && !Api::Native.is_write(&Method::OPTIONS));
        assert!(!signed("PUT", "/bkt/k?acl").is_write(&Method::PUT), "a refusal changes nothing");
    }

    proptest! {
        /// Whatever the method, path, query and headers, classify answers (never panics), is deterministic, and
        /// an unsigned request with no query and no virtual host is native.
        #[test]
        fn classify_is_total_and_deterministic(
            method in prop::sample::select(vec!["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"]),
            path in "/[a-z0-9._%/-]{0,24}",
            query in proptest::option::of("[a-zA-Z0-9=&%.-]{0,32}"),
            signed in any::<bool>(),
            copy in any::<bool>(),
            host in "[a-z0-9.:-]{0,24}",
        ) {
            let mut headers = vec![("host", host.as_str())];
            if signed {
                headers.push(("authorization", SIGV4));
            }
            if copy {
                headers.push(("x-amz-copy-source", "/bkt/k"));
            }
            let target = match &query {
                Some(q) => format!("{path}?{q}"),
                None => path.clone(),
            };
            let first = head_of(method, &target, &headers, Some("s3.example.com"));
            prop_assert_eq!(&first, &head_of(method, &target, &headers, Some("s3.example.com")));
            if !signed && query.as_deref().is_none_or(str::is_empty) {
                prop_assert_eq!(head_of(method, &target, &headers, None), Api::Native);
            }
            if let Api::S3(Ok(call)) = &first {
                // The operation reads no parameter outside its own list (or SigV4's).
                let names = QueryNames::parse(query.as_deref());
                prop_assert!(names.refuse_unknown(call.operation).is_ok());
                prop_assert_eq!(call.operation.is_write(), first.is_write(&Method::from_bytes(method.as_bytes()).unwrap()));
            }
        }
    }
}
