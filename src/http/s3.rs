//! The S3-compatible API's reads: what the catalog alone answers, on either listener. Which request is an S3 one,
//! and which operation, is decided once by `s3::operation::classify`; this module dispatches on it:
//! - ListBuckets (the key's bucket); HeadBucket (`x-amz-bucket-region`); GetBucketLocation; ListObjects V1/V2;
//! - GetObject/HeadObject through the native object pipeline (`object::serve_object`: the same lookup,
//!   preconditions, ranges and `FileBody` regions sent by sendfile), with `response-*` overrides on presigned
//!   requests only; unsigned on a public bucket, anonymously (S3's public-read: `Authorizer::s3_object_read`);
//!   the object's checksums (`x-amz-checksum-*`, `x-amz-checksum-type`) when the request sends
//!   `x-amz-checksum-mode: ENABLED`; GetObjectTagging and GetObjectAttributes (from the cached entry);
//! - the probes clients send routinely, never `501`: GetBucketVersioning (never enabled), GetBucketAcl and
//!   GetObjectAcl (the owner, FULL_CONTROL), GetBucketCors (the bucket's rule), and the configurations we do not
//!   keep (lifecycle, policy, encryption, tagging) with S3's 404 for each.
//!
//! The pipeline is the native one: look the bucket up, authorise (`Authorizer::s3`: SigV4, then the grant rules)
//! before any object lookup, then serve. Every S3 response carries `x-amz-request-id`; errors are S3 XML
//! (`<Error><Code/><Message/><Resource/><RequestId/></Error>`) with S3's status codes, from one mapping
//! ([`S3Error::render`]). The writes, and the multipart listings, are `s3_write`'s; `http::dispatch_s3` chooses.
//! A `partNumber` GetObject or HeadObject reads the part's bytes as the range they are in the object.

use std::borrow::Cow;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode};

use super::DataState;
use super::error::ApiError;
use super::object::{self, ObjectRequest, ResponseOverrides};
use super::throttling::{self, Asker};
use crate::access_log::{Principal, RequestId};
use crate::auth::sigv4::RequestParts;
use crate::auth::{Access, AllowedS3Request, AuthError, S3Target};
use crate::catalog::representation::ObjectEntry;
use crate::driver::ClientAddr;
use crate::header_values::checksum::{self, ObjectChecksum};
use crate::header_values::upload_digest::DigestError;
use crate::names::{BucketName, ObjectKey};
use crate::s3::operation::{Operation, Refusal, Resource, S3Call};

pub static AMZ_REQUEST_ID: HeaderName = HeaderName::from_static("x-amz-request-id");
static AMZ_BUCKET_REGION: HeaderName = HeaderName::from_static("x-amz-bucket-region");
static XML: HeaderValue = HeaderValue::from_static("application/xml");

/// Whether this module answers the operation from the catalog (the reads and the probes); the writes and the
/// multipart listings need the store (`s3_write`).
#[must_use]
pub fn answered_from_catalog(operation: Operation) -> bool {
    !operation.is_write() && !matches!(operation, Operation::ListMultipartUploads | Operation::ListParts)
}

/// An S3 error answer to `request`, with its request id.
pub fn refuse(request: &Request, error: S3Error) -> Response {
    refuse_at(request.uri().path(), error)
}

/// An S3 error answer to a request for `path` (its `<Resource>`), with its request id.
pub fn refuse_at(path: &str, error: S3Error) -> Response {
    let ctx = S3Context::new(path);
    let mut response = error.render(&ctx);
    response.headers_mut().insert(AMZ_REQUEST_ID.clone(), ctx.request_id);
    response
}

impl From<Refusal> for S3Error {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::InvalidBucketName => invalid_bucket_name(),
            Refusal::InvalidKey(why) => S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", why),
            Refusal::NotImplemented(what) => not_implemented(what),
            Refusal::MethodNotAllowed => ApiError::MethodNotAllowed.into(),
        }
    }
}

/// S3's answer to what we do not implement (a subresource, a header, an option).
pub fn not_implemented(what: impl std::fmt::Display) -> S3Error {
    S3Error::new(
        StatusCode::NOT_IMPLEMENTED,
        "NotImplemented",
        format!("A header or parameter you provided implies functionality that is not implemented: {what}"),
    )
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

/// A malformed request parameter or XML body: 400 with the code the parser names.
impl From<crate::s3::request::RequestError> for S3Error {
    fn from(e: crate::s3::request::RequestError) -> Self {
        S3Error::new(StatusCode::BAD_REQUEST, e.code(), e.to_string())
    }
}

/// A PutBucketCors document the bucket's rule cannot hold: 501 naming the element, or 400.
impl From<crate::s3::buckets::CorsConfigError> for S3Error {
    fn from(e: crate::s3::buckets::CorsConfigError) -> Self {
        let status = match e {
            crate::s3::buckets::CorsConfigError::NotImplemented(_) => StatusCode::NOT_IMPLEMENTED,
            _ => StatusCode::BAD_REQUEST,
        };
        S3Error::new(status, e.code(), e.to_string())
    }
}

/// A SigV4 refusal of a body (a chunk signature, a payload hash, a trailing checksum), after the head verified.
impl From<crate::auth::sigv4::SigV4Error> for S3Error {
    fn from(e: crate::auth::sigv4::SigV4Error) -> Self {
        S3Error::new(e.status(), e.code(), e.to_string())
    }
}

/// `Content-MD5` and friends: S3's `InvalidDigest` and `BadDigest`, from the one mapping (`api_error_parts`).
impl From<crate::header_values::upload_digest::DigestError> for S3Error {
    fn from(e: crate::header_values::upload_digest::DigestError) -> Self {
        S3Error::Api(ApiError::Digest(e))
    }
}

/// The multipart layer's refusals, by S3's code; its internal errors are 500s.
impl From<crate::store::multipart::MultipartError> for S3Error {
    fn from(e: crate::store::multipart::MultipartError) -> Self {
        use crate::store::multipart::MultipartError;
        let status = match e {
            MultipartError::NoSuchUpload | MultipartError::NoSuchBucket(_) | MultipartError::NoSuchKey => {
                StatusCode::NOT_FOUND
            }
            MultipartError::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
            MultipartError::QuotaExceeded { .. } => StatusCode::FORBIDDEN,
            MultipartError::Other(e) => return ApiError::Internal(e).into(),
            MultipartError::BlobStoreUnavailable(e) => return ApiError::from(e).into(),
            _ => StatusCode::BAD_REQUEST,
        };
        S3Error::new(status, e.s3_code(), e.to_string())
    }
}

impl S3Error {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<Cow<'static, str>>) -> Self {
        S3Error::S3 { status, code, message: message.into() }
    }

    /// S3's refusal of a request without the credentials it needs: the same for a private and an absent bucket.
    pub fn access_denied() -> Self {
        S3Error::new(StatusCode::FORBIDDEN, "AccessDenied", "Access Denied")
    }

    /// The XML error response, rendered directly. An [`ApiError`] keeps what its JSON response carries besides the
    /// body (`Content-Range` of a 416, `Allow`, `Retry-After`, the log's record of a 5xx: `ApiError::respond`), with
    /// S3's status, code and body, and no bearer challenge.
    pub fn render(self, ctx: &S3Context<'_>) -> Response {
        let (status, code, message) = match self {
            S3Error::S3 { status, code, message } => (status, code, message),
            S3Error::Auth(e) => {
                if let Some(reason) = e.reason() {
                    crate::metrics::auth_failure(reason);
                }
                match e {
                    AuthError::SigV4 { error, .. } => (error.status(), error.code(), error.to_string().into()),
                    AuthError::InvalidAccessKeyId { .. } => {
                        (StatusCode::FORBIDDEN, "InvalidAccessKeyId", e.to_string().into())
                    }
                    AuthError::Unauthorized { .. } | AuthError::Forbidden => {
                        return S3Error::access_denied().render(ctx);
                    }
                    AuthError::NoSuchBucket => {
                        (StatusCode::NOT_FOUND, "NoSuchBucket", "The specified bucket does not exist".into())
                    }
                    AuthError::BadRequest(why) => (StatusCode::BAD_REQUEST, "InvalidRequest", why.into()),
                    AuthError::Lookup(e) => return S3Error::Api(e.into()).render(ctx),
                }
            }
            S3Error::Api(e) => {
                let (status, code, message) = api_error_parts(&e);
                let body = error_xml(code, &message, ctx.resource, ctx.request_id.to_str().unwrap_or(""));
                return e.respond(status, Body::from(body), XML.clone(), false);
            }
        };
        let body = error_xml(code, &message, ctx.resource, ctx.request_id.to_str().unwrap_or(""));
        let mut response = Response::new(Body::from(body));
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
        ApiError::LengthRequired => (
            StatusCode::LENGTH_REQUIRED,
            "MissingContentLength",
            "You must provide the Content-Length HTTP header.".into(),
        ),
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
        ApiError::BlobStoreUnavailable(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "The object store is unreachable; retry shortly.".into(),
        ),
        ApiError::NotReady
        | ApiError::HandlerTimeout
        | ApiError::TooManyConnectionsFromAddress
        | ApiError::TooManyUploads
        | ApiError::Throttled(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, "SlowDown", "Please reduce your request rate.".into())
        }
        ApiError::InsufficientStorage | ApiError::BlobUnavailable(_) | ApiError::Internal(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "We encountered an internal error. Please try again.".into(),
        ),
    }
}

/// Serves one S3 read (one that [`answered_from_catalog`]).
pub async fn serve(app: DataState, call: S3Call, request: Request) -> Response {
    let (parts, _no_body) = request.into_parts();
    let ctx = S3Context::new(parts.uri.path());
    let request = RequestParts {
        method: parts.method.as_str(),
        path: parts.uri.path(),
        query: parts.uri.query(),
        headers: &parts.headers,
    };
    let peer = parts.extensions.get::<ClientAddr>().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |c| c.0);
    let mut response = match route(&app, &parts.method, call, &request, &ctx, peer).await {
        Ok(response) => response,
        Err(e) => e.render(&ctx),
    };
    response.headers_mut().insert(AMZ_REQUEST_ID.clone(), ctx.request_id);
    response
}

async fn route(
    app: &DataState,
    method: &Method,
    call: S3Call,
    request: &RequestParts<'_>,
    ctx: &S3Context<'_>,
    peer: std::net::IpAddr,
) -> Result<Response, S3Error> {
    if call.operation == Operation::CorsPreflight {
        // From the bucket's rule alone, before and without any lookup of the object or of credentials (a
        // preflight carries none).
        // `classify` names a preflight only for a bucket or an object, and only with `Origin`.
        let origin = request.headers.get(header::ORIGIN).cloned().unwrap_or(HeaderValue::from_static(""));
        let policy = match call.resource.bucket() {
            Some(bucket) => super::cors::policy_of(app, bucket).await,
            None => None,
        };
        return Ok(super::cors::preflight(policy.as_deref(), &origin, request.headers));
    }
    let query = Query::parse(request.query);
    match call.resource {
        Resource::Service => Box::pin(list_buckets(app, request)).await,
        Resource::Bucket(name) => Box::pin(bucket_read(app, call.operation, name, request, &query)).await,
        Resource::Object(name, key) => match call.operation {
            Operation::GetObjectTagging | Operation::GetObjectAcl | Operation::GetObjectAttributes => {
                Box::pin(object_subresource(app, call.operation, request, name, key)).await
            }
            _ => {
                let bucket = app.catalog.bucket(name.as_str()).await?;
                // `None`: an unsigned read of a public bucket, logged as the native one is.
                let allowed = app.auth.s3_object_read(request, bucket.as_ref(), &key).await?;
                let asker = match &allowed {
                    Some(allowed) => Asker::S3Key(&allowed.key.id),
                    None => Asker::Anonymous(peer),
                };
                let admitted = throttling::admit(app, &asker, name.as_str()).await?;
                let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
                let presigned = allowed.as_ref().is_some_and(|allowed| allowed.presigned);
                let overrides = if presigned { query.response_overrides()? } else { Default::default() };
                let render = |e: ApiError| S3Error::Api(e).render(ctx);
                // `partNumber=N`: that part's bytes, served as the range they are.
                let part = match query.get("partNumber") {
                    Some(number) => Some(part_range(app, &bucket, &key, number, request.headers).await?),
                    None => None,
                };
                let object_request = ObjectRequest {
                    method,
                    headers: part.as_ref().map_or(request.headers, |(headers, _)| headers),
                    bucket: &bucket,
                    key: &key,
                    content_disposition: overrides.1.as_deref(),
                    overrides: Some(&overrides.0),
                    s3: true,
                    part: part.is_some(),
                    principal: app.log_principal.then(|| match &allowed {
                        Some(allowed) => Principal::S3(allowed.key.id.as_str().into()),
                        None => Principal::Public,
                    }),
                    admitted,
                    render: &render,
                };
                let mut response = object::serve_object(app, object_request).await?;
                if let Some((_, count)) = part.filter(|_| response.status().is_success()) {
                    response.headers_mut().insert(PARTS_COUNT.clone(), HeaderValue::from(count));
                }
                Ok(response)
            }
        },
    }
}

/// How many parts the object has, on an answer to a `partNumber` GetObject or HeadObject.
static PARTS_COUNT: http::HeaderName = http::HeaderName::from_static("x-amz-mp-parts-count");

/// The request headers that make the object pipeline send part `number` of the object (a `Range` of its bytes),
/// and the object's number of parts. A part past the last one is `416 InvalidPartNumber`; a request with both a
/// `Range` and a `partNumber` is refused, as S3 refuses it.
async fn part_range(
    app: &DataState,
    bucket: &crate::store::Bucket,
    key: &ObjectKey,
    number: &str,
    headers: &http::HeaderMap,
) -> Result<(http::HeaderMap, u32), S3Error> {
    let valid = 1..=crate::store::multipart::MAX_PART_NUMBER;
    let number = number.parse::<u32>().ok().filter(|n| valid.contains(n)).ok_or_else(|| {
        S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidArgument",
            "Part number must be an integer between 1 and 10000, inclusive",
        )
    })?;
    if headers.contains_key(header::RANGE) {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "Cannot specify both Range header and partNumber query parameter",
        ));
    }
    let entry = app.catalog.object(bucket.id, key.as_str()).await?.ok_or(ApiError::NotFound)?;
    let (region, count) = entry.part(number);
    let Some((offset, length)) = region else {
        return Err(S3Error::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "InvalidPartNumber",
            "The requested partnumber is not satisfiable",
        ));
    };
    let mut headers = headers.clone();
    // An empty object's one part is the whole (empty) object: no range to ask for.
    if length > 0 {
        let range = format!("bytes={offset}-{}", offset + length - 1);
        headers.insert(header::RANGE, HeaderValue::try_from(range).expect("digits are a valid header value"));
    }
    Ok((headers, count))
}

/// The bucket reads: HeadBucket, GetBucketLocation, the listings and the probes, each authorised for reading the
/// bucket before it is looked at.
async fn bucket_read(
    app: &DataState,
    operation: Operation,
    name: BucketName,
    request: &RequestParts<'_>,
    query: &Query,
) -> Result<Response, S3Error> {
    let bucket = app.catalog.bucket(name.as_str()).await?;
    let allowed = app.auth.s3(request, S3Target::Bucket(bucket.as_ref()), Access::Read).await?;
    let _held = throttling::admit(app, &Asker::S3Key(&allowed.key.id), name.as_str()).await?;
    if operation == Operation::GetBucketLocation {
        return Ok(with_principal(app, location(app), &allowed));
    }
    let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
    let not_configured =
        |code: &'static str, message: &'static str| Err(S3Error::new(StatusCode::NOT_FOUND, code, message));
    let response = match operation {
        Operation::HeadBucket => {
            let mut response = Response::new(Body::empty());
            let region = HeaderValue::from_str(app.auth.s3_region()).map_err(|e| ApiError::Internal(e.into()))?;
            response.headers_mut().insert(AMZ_BUCKET_REGION.clone(), region);
            response
        }
        Operation::ListObjects | Operation::ListObjectsV2 => {
            Box::pin(super::s3_list::list_objects(app, &bucket, &allowed, query, request.query)).await?
        }
        Operation::GetBucketVersioning => xml_response(crate::s3::xml::versioning_never_enabled()),
        Operation::GetBucketAcl => xml_response(super::s3_list::owner_full_control_xml()),
        Operation::GetBucketCors => match &bucket.cors {
            Some(policy) => xml_response(super::s3_list::cors_configuration_xml(policy)),
            None => return not_configured("NoSuchCORSConfiguration", "The CORS configuration does not exist"),
        },
        Operation::GetBucketLifecycleConfiguration => {
            return not_configured("NoSuchLifecycleConfiguration", "The lifecycle configuration does not exist");
        }
        Operation::GetBucketPolicy => return not_configured("NoSuchBucketPolicy", "The bucket policy does not exist"),
        Operation::GetBucketEncryption => {
            return not_configured(
                "ServerSideEncryptionConfigurationNotFoundError",
                "The server side encryption configuration was not found",
            );
        }
        Operation::GetBucketTagging => return not_configured("NoSuchTagSet", "The TagSet does not exist"),
        other => return Err(ApiError::Internal(anyhow::anyhow!("{other:?} routed as a bucket read")).into()),
    };
    Ok(with_principal(app, response, &allowed))
}

/// GetObjectTagging (`GET ?tagging`: the object's tags) and GetObjectAcl (`GET ?acl`: the owner's full control),
/// to a key that may read the object, which must exist (on either listener).
async fn object_subresource(
    app: &DataState,
    operation: Operation,
    request: &RequestParts<'_>,
    name: BucketName,
    key: ObjectKey,
) -> Result<Response, S3Error> {
    let bucket = app.catalog.bucket(name.as_str()).await?;
    let allowed = app.auth.s3(request, S3Target::Object(bucket.as_ref(), &key), Access::Read).await?;
    let _held = throttling::admit(app, &Asker::S3Key(&allowed.key.id), name.as_str()).await?;
    let bucket = bucket.ok_or(AuthError::NoSuchBucket)?;
    // GetObjectAttributes names what it wants; a request that names nothing is refused before the lookup.
    let wanted = match operation {
        Operation::GetObjectAttributes => Some(object_attributes_wanted(request.headers)?),
        _ => None,
    };
    let entry = app.catalog.object(bucket.id, key.as_str()).await?.ok_or(ApiError::NotFound)?;
    let body = match operation {
        Operation::GetObjectAcl => super::s3_list::owner_full_control_xml(),
        Operation::GetObjectAttributes => {
            let attributes = object_attributes(&entry, &wanted.unwrap_or_default());
            let mut response = xml_response(crate::s3::xml::object_attributes(&attributes));
            let last_modified = crate::header_values::format_http_date(entry.last_modified());
            if let Ok(value) = HeaderValue::from_str(&last_modified) {
                response.headers_mut().insert(header::LAST_MODIFIED, value);
            }
            return Ok(with_principal(app, response, &allowed));
        }
        _ => crate::s3::xml::tagging(entry.tags()),
    };
    Ok(with_principal(app, xml_response(body), &allowed))
}

/// GetObjectAttributes' `x-amz-object-attributes`: the names it lists (S3's, any case), at least one.
fn object_attributes_wanted(headers: &http::HeaderMap) -> Result<Vec<String>, S3Error> {
    const KNOWN: [&str; 5] = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"];
    let invalid = |message: String| S3Error::new(StatusCode::BAD_REQUEST, "InvalidArgument", message);
    let mut wanted = Vec::new();
    for value in headers.get_all(&OBJECT_ATTRIBUTES) {
        let text = value.to_str().map_err(|_| invalid(format!("{OBJECT_ATTRIBUTES} is not ASCII")))?;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let known = KNOWN.iter().find(|k| k.eq_ignore_ascii_case(name));
            wanted.push(known.ok_or_else(|| invalid(format!("Invalid attribute name specified: {name}")))?.to_string());
        }
    }
    if wanted.is_empty() {
        return Err(invalid(format!("{OBJECT_ATTRIBUTES} must name at least one attribute")));
    }
    Ok(wanted)
}

static OBJECT_ATTRIBUTES: http::HeaderName = http::HeaderName::from_static("x-amz-object-attributes");

/// What GetObjectAttributes answers for `entry`, of the `wanted` attributes.
fn object_attributes(entry: &ObjectEntry, wanted: &[String]) -> crate::s3::xml::ObjectAttributes {
    let wants = |name: &str| wanted.iter().any(|w| w == name);
    let checksums = checksum::answered(entry.checksum(), entry.sha256());
    let parts = entry.part_sizes().map(|sizes| {
        let listed = sizes.iter().zip(1u32..).take(1000).map(|(&size, number)| (number, size)).collect();
        (u32::try_from(sizes.len()).unwrap_or(u32::MAX), listed)
    });
    crate::s3::xml::ObjectAttributes {
        etag: wants("ETag").then(|| entry.s3_etag().trim_matches('"').to_owned()),
        checksum: wants("Checksum").then(|| crate::s3::xml::Checksums::of(checksums.iter())),
        parts: parts.filter(|_| wants("ObjectParts")),
        storage_class: wants("StorageClass"),
        size: wants("ObjectSize").then_some(entry.size),
    }
}

/// The checksum fields of S3's answers: `x-amz-checksum-<algorithm>` for each checksum, and `x-amz-checksum-type`
/// (the first's).
pub(super) fn insert_checksum_headers(headers: &mut http::HeaderMap, checksums: &[ObjectChecksum]) {
    for c in checksums {
        if let Ok(value) = HeaderValue::from_str(&c.value()) {
            headers.insert(c.algorithm.header_name(), value);
        }
    }
    if let Some(first) = checksums.first() {
        headers.insert(CHECKSUM_TYPE.clone(), HeaderValue::from_static(first.kind.name()));
    }
}

static CHECKSUM_TYPE: http::HeaderName = http::HeaderName::from_static("x-amz-checksum-type");

pub(super) fn with_principal(app: &DataState, mut response: Response, allowed: &AllowedS3Request) -> Response {
    if app.log_principal {
        response.extensions_mut().insert(Principal::S3(allowed.key.id.as_str().into()));
    }
    response
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
    // On no bucket: the key's own limit (or the default) alone.
    let _held = throttling::admit(app, &Asker::S3Key(&allowed.key.id), "").await?;
    let params = crate::s3::buckets::ListBucketsParams::from_query(request.query.unwrap_or(""))?;
    // A key sees the buckets its grants name; a grant of every bucket sees them all.
    let rights = &allowed.key.rights;
    let buckets: Vec<std::sync::Arc<crate::store::Bucket>> = if rights.grants.iter().any(|g| g.bucket.is_none()) {
        app.catalog.list_buckets().await?.into_iter().map(std::sync::Arc::new).collect()
    } else {
        let mut names: Vec<&str> =
            rights.grants.iter().filter_map(|g| Some(g.bucket.as_ref()?.name.as_str())).collect();
        names.sort_unstable();
        names.dedup();
        let mut found = Vec::with_capacity(names.len());
        for name in names {
            found.extend(app.catalog.bucket(name).await?);
        }
        found
    };
    let mut buckets = buckets;
    buckets.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let body = super::s3_list::list_buckets_xml(&buckets, &params);
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
        for param in crate::s3::operation::AWS_QUERY_CREDENTIALS {
            let name = param.trim_end_matches('=');
            assert!(crate::access_log::is_credential_param(name), "{name}");
            assert_eq!(crate::access_log::redacted_query(&format!("{name}=secret&a=1")).as_deref(), Some("a=1"));
        }
        assert!(crate::access_log::is_credential_param("Signature"), "SigV2's signature, refused but redacted");
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
