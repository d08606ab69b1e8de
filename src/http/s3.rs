//! The S3-compatible API, path-style, on the data listener (and its bodiless reads on the admin listener).
//!
//! A request is an S3 request when it carries SigV4 (an `AWS4-…` Authorization header, or `X-Amz-Algorithm`,
//! `X-Amz-Credential` or `X-Amz-Signature` in the query; SigV2's `AWS ak:sig` header and presign
//! `AWSAccessKeyId` too, to be refused in S3's words) or names an S3-only route (`/`, `/{bucket}`) with a query: see [`is_s3_request`]. Everything
//! else is the native API, unchanged. Routes:
//! - `GET /`: ListBuckets (the key's bucket);
//! - `HEAD /{bucket}`: HeadBucket (`x-amz-bucket-region`); `GET /{bucket}?location`: GetBucketLocation;
//! - `GET /{bucket}?list-type=2`: ListObjectsV2; `GET /{bucket}`: ListObjects (V1);
//! - `GET`/`HEAD /{bucket}/{key}`: GetObject/HeadObject through the native object pipeline
//!   (`object::serve_object`: the same lookup, preconditions, ranges and `FileBody` regions sent by sendfile),
//!   with `response-*` overrides on presigned requests only;
//! - `GET /{bucket}/{key}?tagging`: GetObjectTagging (from the cached entry).
//!
//! The pipeline is the native one: parse the path, look the bucket up, authorise (`Authorizer::s3`: SigV4, then
//! the token rules) before any object lookup, then serve. Every S3 response carries `x-amz-request-id`; errors are
//! S3 XML (`<Error><Code/><Message/><Resource/><RequestId/></Error>`) with S3's status codes.

use std::borrow::Cow;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use super::DataState;
use super::error::ApiError;
use super::object::{self, ObjectRequest, ResponseOverrides};
use crate::access_log::{Principal, RequestId};
use crate::auth::sigv4::RequestParts;
use crate::auth::{Access, AllowedS3Request, AuthError, S3Target};
use crate::header_values::upload_digest::DigestError;
use crate::names::{BucketName, ObjectKey, parse_object_path};

pub static AMZ_REQUEST_ID: HeaderName = HeaderName::from_static("x-amz-request-id");
static AMZ_BUCKET_REGION: HeaderName = HeaderName::from_static("x-amz-bucket-region");
static XML: HeaderValue = HeaderValue::from_static("application/xml");

/// Whether a request is for the S3 API rather than the native one: it carries SigV4, or it names an S3-only
/// path with a query that an S3 client sends (`/{bucket}?list-type=2`, `/?x-id=ListBuckets`). An unsigned `/` or
/// `/{name}` without a query is native (a static site's home, or 404), and so is `/{name}/` or `/{name}` with a
/// query that names no S3 parameter: links to a static site's home carry `?utm_source=…` or `?fbclid=…`. Cheap on
/// the native hot path: one header lookup, a scan of the query when there is one, a look at the path's shape.
pub fn is_s3_request(request: &Request) -> bool {
    carries_aws_credentials(request)
        || request.uri().query().is_some_and(|q| !q.is_empty() && is_s3_query(request.uri().path(), q))
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

/// The subresources and parameters of S3's bucket operations besides the listings' (most get `NotImplemented`
/// here): an unsigned request on a bucket's path that names one is an S3 client's.
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

/// Whether a request carries AWS credentials: SigV4 (`AWS4-…`) or SigV2 (`AWS ak:sig`, refused in S3's words:
/// use AWS4-HMAC-SHA256) in the Authorization header, or a presign's parameters in the query.
pub fn carries_aws_credentials(request: &Request) -> bool {
    let aws = |v: &HeaderValue| v.as_bytes().starts_with(b"AWS4-") || v.as_bytes().starts_with(b"AWS ");
    if request.headers().get(header::AUTHORIZATION).is_some_and(aws) {
        return true;
    }
    request.uri().query().is_some_and(|query| AWS_QUERY_CREDENTIALS.iter().any(|p| query.contains(p)))
}

/// The query parameters (as `name=`) that make a request an AWS one. Each is a credential the logs redact
/// (`access_log::is_credential_param`; a test checks it).
const AWS_QUERY_CREDENTIALS: [&str; 4] =
    ["X-Amz-Algorithm=", "X-Amz-Credential=", "X-Amz-Signature=", "AWSAccessKeyId="];

/// `/`, `/{bucket}` and `/{bucket}/`: paths that name no object, so the native API has no route there.
fn is_s3_only_path(path: &str) -> bool {
    let rest = path.strip_prefix('/').unwrap_or(path);
    match rest.find('/') {
        None => true,
        Some(i) => i + 1 == rest.len(),
    }
}

/// What an S3 path names.
pub(super) enum S3Path {
    Service,
    Bucket(BucketName),
    Object(BucketName, ObjectKey),
}

pub(super) fn parse_path(path: &str) -> Result<S3Path, S3Error> {
    if path == "/" {
        return Ok(S3Path::Service);
    }
    if is_s3_only_path(path) {
        let name = path.trim_matches('/');
        let decoded = percent_encoding::percent_decode_str(name).decode_utf8().map_err(|_| invalid_bucket_name())?;
        return BucketName::parse(&decoded).map(S3Path::Bucket).map_err(|_| invalid_bucket_name());
    }
    let (bucket, key) =
        parse_object_path(path).map_err(|e| S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", e.to_string()))?;
    Ok(S3Path::Object(bucket, key))
}

fn invalid_bucket_name() -> S3Error {
    S3Error::new(StatusCode::BAD_REQUEST, "InvalidBucketName", "The specified bucket is not valid.")
}

/// What every S3 response and error of one request shares.
pub struct S3Context<'r> {
    pub request_id: HeaderValue,
    /// `<Resource>` of an error: the request's path (borrowed: only an error needs it).
    pub resource: &'r str,
}

impl<'r> S3Context<'r> {
    pub fn new(path: &'r str) -> Self {
        Self { request_id: RequestId::next().header_value(), resource: path }
    }
}

/// Every way an S3 request fails, rendered as S3 XML by [`S3Error::render`].
#[derive(Debug)]
pub enum S3Error {
    /// An error of the shared object pipeline or the store, answered with S3's code for it.
    Api(ApiError),
    /// A refusal of credentials (counted like every refusal).
    Auth(AuthError),
    /// An error only S3 has.
    S3 { status: StatusCode, code: &'static str, message: Cow<'static, str> },
}

impl From<ApiError> for S3Error {
    fn from(e: ApiError) -> Self {
        S3Error::Api(e)
    }
}

impl From<AuthError> for S3Error {
    fn from(e: AuthError) -> Self {
        S3Error::Auth(e)
    }
}

impl From<crate::store::MetadataError> for S3Error {
    fn from(e: crate::store::MetadataError) -> Self {
        S3Error::Api(e.into())
    }
}

impl S3Error {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        S3Error::S3 { status, code, message: message.into() }
    }

    /// The XML error response. An [`ApiError`] keeps what its own response carries (`Content-Range` of a 416,
    /// `Allow`, `Retry-After`, and the log's record of a 5xx), with S3's status, code and body instead.
    pub fn render(self, ctx: &S3Context<'_>) -> Response {
        let (status, code, message, base) = match self {
            S3Error::S3 { status, code, message } => (status, code, message, None),
            S3Error::Auth(e) => {
                if let Some(reason) = e.reason() {
                    crate::metrics::auth_failure(reason);
                }
                match e {
                    AuthError::SigV4 { error, .. } => (error.status(), error.code(), error.to_string().into(), None),
                    AuthError::InvalidAccessKeyId { .. } => {
                        (StatusCode::FORBIDDEN, "InvalidAccessKeyId", e.to_string().into(), None)
                    }
                    AuthError::Unauthorized { .. } | AuthError::Forbidden => {
                        (StatusCode::FORBIDDEN, "AccessDenied", "Access Denied".into(), None)
                    }
                    AuthError::NoSuchBucket => {
                        (StatusCode::NOT_FOUND, "NoSuchBucket", "The specified bucket does not exist".into(), None)
                    }
                    AuthError::BadRequest(why) => (StatusCode::BAD_REQUEST, "InvalidRequest", why.into(), None),
                    AuthError::Lookup(e) => return S3Error::Api(e.into()).render(ctx),
                }
            }
            S3Error::Api(e) => {
                let (status, code, message) = api_error_parts(&e);
                (status, code, message, Some(e.into_response()))
            }
        };
        let body = error_xml(code, &message, ctx.resource, ctx.request_id.to_str().unwrap_or(""));
        let mut response = match base {
            Some(base) => {
                let (mut parts, _json) = base.into_parts();
                parts.headers.remove(header::WWW_AUTHENTICATE);
                parts.headers.remove(header::CONTENT_LENGTH);
                Response::from_parts(parts, Body::from(body))
            }
            None => Response::new(Body::from(body)),
        };
        *response.status_mut() = status;
        response.headers_mut().insert(header::CONTENT_TYPE, XML.clone());
        response
    }
}

use crate::s3::xml::error as error_xml;

/// S3's status, code and message for an error of the shared pipeline or the store: what an error response carries,
/// and what one failed entry of a DeleteObjects result says.
pub(super) fn api_error_parts(e: &ApiError) -> (StatusCode, &'static str, Cow<'static, str>) {
    match e {
        ApiError::NotFound => (StatusCode::NOT_FOUND, "NoSuchKey", "The specified key does not exist.".into()),
        ApiError::NoSuchBucket => (StatusCode::NOT_FOUND, "NoSuchBucket", "The specified bucket does not exist".into()),
        ApiError::PreconditionFailed => (
            StatusCode::PRECONDITION_FAILED,
            "PreconditionFailed",
            "At least one of the pre-conditions you specified did not hold".into(),
        ),
        ApiError::RangeNotSatisfiable { .. } => {
            (StatusCode::RANGE_NOT_SATISFIABLE, "InvalidRange", "The requested range is not satisfiable".into())
        }
        ApiError::InvalidName(n) => (StatusCode::BAD_REQUEST, "InvalidArgument", n.to_string().into()),
        ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, "InvalidArgument", m.clone().into()),
        ApiError::BadRequestHead { status, message } => (*status, "InvalidRequest", (*message).into()),
        ApiError::Unauthorized(_) | ApiError::Forbidden => {
            (StatusCode::FORBIDDEN, "AccessDenied", "Access Denied".into())
        }
        ApiError::MethodNotAllowed => (
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "The specified method is not allowed against this resource.".into(),
        ),
        ApiError::PayloadTooLarge(m) => (StatusCode::BAD_REQUEST, "EntityTooLarge", m.clone().into()),
        ApiError::Digest(DigestError::Invalid("Content-MD5", _)) => {
            (StatusCode::BAD_REQUEST, "InvalidDigest", "The Content-MD5 you specified was invalid.".into())
        }
        ApiError::Digest(d @ DigestError::Invalid(..)) => {
            (StatusCode::BAD_REQUEST, "InvalidDigest", d.to_string().into())
        }
        ApiError::Digest(DigestError::Mismatch(field)) => (
            StatusCode::BAD_REQUEST,
            "BadDigest",
            format!("The {field} you specified did not match what we received.").into(),
        ),
        ApiError::BodyTimeout | ApiError::BodyTooSlow(_) => {
            (StatusCode::BAD_REQUEST, "RequestTimeout", e.to_string().into())
        }
        ApiError::DatabaseUnavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "The metadata database is unreachable; retry shortly.".into(),
        ),
        ApiError::NotReady
        | ApiError::HandlerTimeout
        | ApiError::TooManyConnectionsFromAddress
        | ApiError::TooManyUploads => {
            (StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate.".into())
        }
        ApiError::InsufficientStorage | ApiError::BlobUnavailable(_) | ApiError::Internal(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error. Please try again.".into(),
        ),
    }
}

/// Serves one S3 request (its routing decided by [`is_s3_request`]).
pub async fn serve(app: DataState, request: Request) -> Response {
    let (parts, _no_body) = request.into_parts();
    let ctx = S3Context::new(parts.uri.path());
    let request = RequestParts {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
    };
    let mut response = match route(&app, &parts.method, &request, &ctx).await {
        Ok(response) => response,
        Err(e) => e.render(&ctx),
    };
    response.headers_mut().insert(AMZ_REQUEST_ID.clone(), ctx.request_id);
    response
}

async fn route(
    app: &DataState,
    method: &Method,
    request: &RequestParts<'_>,
    ctx: &S3Context<'_>,
) -> Result<Response, S3Error> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::MethodNotAllowed.into());
    }
    let query = Query::parse(request.query);
    match parse_path(request.path)? {
        S3Path::Service => {
            // ListBuckets' paging parameters are accepted and ignored: a key sees one bucket.
            query.refuse_subresources(&["max-buckets", "prefix", "continuation-token", "bucket-region"])?;
            Box::pin(list_buckets(app, request)).await
        }
        S3Path::Bucket(name) => {
            let bucket = app.catalog.bucket(name.as_str()).await?;
            if query.has("location") {
                query.refuse_subresources(&["location"])?;
                let allowed = app.auth.s3(request, S3Target::Bucket(bucket.as_ref()), Access::Read).await?;
                return Ok(with_principal(app, location(app), &allowed));
            }
            query.refuse_subresources(LIST_PARAMS)?;
            let allowed = app.auth.s3(request, S3Target::Bucket(bucket.as_ref()), Access::Read).await?;
            let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
            if method == Method::HEAD {
                let mut response = Response::new(Body::empty());
                let region = HeaderValue::from_str(app.auth.s3_region()).map_err(|e| ApiError::Internal(e.into()))?;
                response.headers_mut().insert(AMZ_BUCKET_REGION.clone(), region);
                return Ok(with_principal(app, response, &allowed));
            }
            let response =
                Box::pin(super::s3_list::list_objects(app, &bucket, &allowed, &query, request.query)).await?;
            Ok(with_principal(app, response, &allowed))
        }
        S3Path::Object(name, key) if query.has("tagging") => {
            Box::pin(get_object_tagging(app, method, request, &query, name, key)).await
        }
        S3Path::Object(name, key) => {
            query.refuse_subresources(OBJECT_PARAMS)?;
            let bucket = app.catalog.bucket(name.as_str()).await?;
            let allowed = app.auth.s3(request, S3Target::Object(bucket.as_ref(), &key), Access::Read).await?;
            let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
            let overrides = if allowed.presigned { query.response_overrides()? } else { Default::default() };
            let render = |e: ApiError| S3Error::Api(e).render(ctx);
            let object_request = ObjectRequest {
                method,
                headers: request.headers,
                bucket: &bucket,
                key: &key,
                content_disposition: overrides.1.as_deref(),
                overrides: Some(&overrides.0),
                s3: true,
                principal: app.log_principal.then(|| Principal::S3(allowed.key.id.as_str().into())),
                render: &render,
            };
            Ok(object::serve_object(app, object_request).await?)
        }
    }
}

/// GetObjectTagging (`GET ?tagging`): the object's tags, to a key that may read it (on either listener).
async fn get_object_tagging(
    app: &DataState,
    method: &Method,
    request: &RequestParts<'_>,
    query: &Query,
    name: BucketName,
    key: ObjectKey,
) -> Result<Response, S3Error> {
    query.refuse_subresources(&["tagging"])?;
    let bucket = app.catalog.bucket(name.as_str()).await?;
    let allowed = app.auth.s3(request, S3Target::Object(bucket.as_ref(), &key), Access::Read).await?;
    let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
    if method != Method::GET {
        return Err(ApiError::MethodNotAllowed.into());
    }
    let entry = app.catalog.object(bucket.id, key.as_str()).await?.ok_or(ApiError::NotFound)?;
    Ok(with_principal(app, xml_response(crate::s3::xml::tagging(&entry.record.attrs.tags)), &allowed))
}

pub(super) fn with_principal(app: &DataState, mut response: Response, allowed: &AllowedS3Request) -> Response {
    if app.log_principal {
        response.extensions_mut().insert(Principal::S3(allowed.key.id.as_str().into()));
    }
    response
}

/// The query parameters the listings read (others on a bucket name a subresource we do not have).
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

/// The query parameters GetObject reads.
const OBJECT_PARAMS: &[&str] = &[
    "response-content-type",
    "response-content-language",
    "response-expires",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
];

/// SigV4's own `X-Amz-*` parameters, and `x-id`, the operation name newer SDKs add (`?x-id=GetObject`).
pub(super) fn is_signing_or_sdk_param(name: &str) -> bool {
    name == "x-id" || name.starts_with("X-Amz-") || name.starts_with("x-amz-")
}

/// A request's query, decoded once.
pub struct Query {
    pairs: Vec<(String, String)>,
}

impl Query {
    fn parse(query: Option<&str>) -> Self {
        let pairs = form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        Self { pairs }
    }

    pub fn has(&self, name: &str) -> bool {
        self.pairs.iter().any(|(k, _)| k == name)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// A parameter outside `known` (and SigV4's own `X-Amz-*`) names a subresource or operation we do not
    /// implement (`?acl`, `?versioning`, `?uploads`…): S3's `NotImplemented`, rather than a wrong answer.
    fn refuse_subresources(&self, known: &[&str]) -> Result<(), S3Error> {
        match self.pairs.iter().find(|(k, _)| !known.contains(&k.as_str()) && !is_signing_or_sdk_param(k)) {
            None => Ok(()),
            // A SigV2 presign (`AWSAccessKeyId`, `Signature`, `Expires`) gets the SigV2 answer, whichever of its
            // parameters comes first.
            Some(_) if self.has("AWSAccessKeyId") && !self.has("X-Amz-Algorithm") => {
                let error = crate::auth::sigv4::sigv2_refused();
                Err(AuthError::SigV4 { reason: crate::auth::FailureReason::Malformed, error }.into())
            }
            Some((k, _)) => Err(S3Error::new(
                StatusCode::NOT_IMPLEMENTED,
                "NotImplemented",
                format!("A parameter you provided implies functionality that is not implemented: {k}"),
            )),
        }
    }

    /// The `response-*` overrides of a presigned GetObject, as header values, and the disposition apart (it
    /// goes through the object pipeline's own RFC 6266 check). An empty value is refused: it must never remove
    /// a stored header. `response-content-encoding` is refused too: the bytes sent are the stored ones, and the
    /// driver sends a file only under its own coding.
    fn response_overrides(&self) -> Result<(ResponseOverrides, Option<String>), S3Error> {
        let mut overrides = ResponseOverrides::default();
        let mut disposition = None;
        for (param, name) in [
            ("response-content-type", header::CONTENT_TYPE),
            ("response-content-language", header::CONTENT_LANGUAGE),
            ("response-expires", header::EXPIRES),
            ("response-cache-control", header::CACHE_CONTROL),
            ("response-content-disposition", header::CONTENT_DISPOSITION),
            ("response-content-encoding", header::CONTENT_ENCODING),
        ] {
            let Some(value) = self.get(param) else { continue };
            let invalid = || S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", format!("invalid {param}"));
            if value.is_empty() {
                return Err(invalid());
            }
            if name == header::CONTENT_ENCODING {
                return Err(S3Error::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "NotImplemented",
                    "response-content-encoding is not supported",
                ));
            }
            if name == header::CONTENT_DISPOSITION {
                disposition = Some(value.to_owned());
                continue;
            }
            overrides.headers.push((name, HeaderValue::from_str(value).map_err(|_| invalid())?));
        }
        Ok((overrides, disposition))
    }
}

async fn list_buckets(app: &DataState, request: &RequestParts<'_>) -> Result<Response, S3Error> {
    let allowed = app.auth.s3(request, S3Target::Service, Access::Read).await?;
    // A key sees its own bucket (keys are per bucket, as tokens are).
    let bucket = app.catalog.bucket(&allowed.key.grant.bucket_name).await?;
    let body = super::s3_list::list_buckets_xml(bucket.as_deref());
    Ok(with_principal(app, xml_response(body), &allowed))
}

fn location(app: &DataState) -> Response {
    xml_response(super::s3_list::location_xml(app.auth.s3_region()))
}

pub fn xml_response(body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(header::CONTENT_TYPE, XML.clone());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_query_credential_the_front_end_detects_is_one_the_logs_redact() {
        for param in AWS_QUERY_CREDENTIALS {
            let name = param.trim_end_matches('=');
            assert!(crate::access_log::is_credential_param(name), "{name}");
            assert_eq!(crate::access_log::redacted_query(&format!("{name}=secret&a=1")).as_deref(), Some("a=1"));
        }
        assert!(crate::access_log::is_credential_param("Signature"), "SigV2's signature, refused but redacted");
    }

    fn request(method: &str, target: &str, authorization: Option<&str>) -> Request {
        let mut builder = http::Request::builder().method(method).uri(target);
        if let Some(a) = authorization {
            builder = builder.header(header::AUTHORIZATION, a);
        }
        builder.body(Body::empty()).unwrap()
    }

    #[test]
    fn s3_requests_are_told_from_native_ones() {
        let sigv4 = Some(
            "AWS4-HMAC-SHA256 Credential=AKBG/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00",
        );
        let cases = [
            ("GET", "/b/k", None, false),
            ("GET", "/b/dir/k.txt?bg-expires=1&bg-key=k&bg-sig=s", None, false),
            ("GET", "/b/k", Some("Bearer x"), false),
            ("GET", "/b/k", sigv4, true),
            ("GET", "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=x", None, true),
            ("GET", "/b/k?X-Amz-Signature=00", None, true),
            ("GET", "/", sigv4, true),
            ("HEAD", "/b", sigv4, true),
            ("GET", "/b/?list-type=2", None, true),
            ("HEAD", "/b?location", None, true),
            ("GET", "/b?list-type=2&prefix=a", None, true),
            ("GET", "/b/?delimiter=%2F", None, true),
            ("GET", "/b?x-id=ListObjects", None, true),
            ("GET", "/b?acl", None, true),
            ("GET", "/?utm_source=x", None, true),
            // Unsigned and without a query, or with one no S3 client sends (a link to a static site's home): native.
            ("GET", "/", None, false),
            ("GET", "/healthz", None, false),
            ("GET", "/b/", None, false),
            ("GET", "/b//", None, false),
            ("GET", "/b/?utm_source=mail&fbclid=x", None, false),
            ("GET", "/b?utm_source=mail", None, false),
            ("GET", "/b/?list-type2", None, false),
        ];
        for (method, target, auth, want) in cases {
            assert_eq!(is_s3_request(&request(method, target, auth)), want, "{method} {target} {auth:?}");
        }
    }

    #[test]
    fn errors_are_s3_xml_with_s3_status_codes() {
        let ctx = S3Context { request_id: HeaderValue::from_static("rid"), resource: "/b/<k>" };
        let cases: Vec<(S3Error, StatusCode, &str)> = vec![
            (ApiError::NotFound.into(), StatusCode::NOT_FOUND, "NoSuchKey"),
            (ApiError::PreconditionFailed.into(), StatusCode::PRECONDITION_FAILED, "PreconditionFailed"),
            (ApiError::RangeNotSatisfiable { size: 9 }.into(), StatusCode::RANGE_NOT_SATISFIABLE, "InvalidRange"),
            (AuthError::Forbidden.into(), StatusCode::FORBIDDEN, "AccessDenied"),
            (
                AuthError::InvalidAccessKeyId { reason: crate::auth::FailureReason::UnknownToken }.into(),
                StatusCode::FORBIDDEN,
                "InvalidAccessKeyId",
            ),
            (
                ApiError::Internal(anyhow::anyhow!("secret detail")).into(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
            ),
        ];
        for (error, status, code) in cases {
            let response = error.render(&ctx);
            assert_eq!(response.status(), status, "{code}");
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/xml");
            assert!(!response.headers().contains_key(header::WWW_AUTHENTICATE));
            let body = futures_util::FutureExt::now_or_never(axum::body::to_bytes(response.into_body(), 1 << 16))
                .unwrap()
                .unwrap();
            let body = String::from_utf8(body.to_vec()).unwrap();
            assert!(body.contains(&format!("<Code>{code}</Code>")), "{body}");
            assert!(body.contains("<Resource>/b/&lt;k&gt;</Resource><RequestId>rid</RequestId>"), "{body}");
            assert!(!body.contains("secret detail"));
        }
        let range = S3Error::from(ApiError::RangeNotSatisfiable { size: 9 }).render(&ctx);
        assert_eq!(range.headers()[header::CONTENT_RANGE], "bytes */9", "the 416 keeps its Content-Range");
    }
}
