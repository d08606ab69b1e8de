//! The one error type at the HTTP edge, and its one conversion into a response. Bodies are small JSON objects:
//! `{"error": "<code>", "message": "<text>"}`. Client mistakes are 4xx; only our own failures are 5xx. A 5xx's
//! cause is logged once, by [`log_server_error`] (outermost on both listeners), never by the conversion.

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::auth::AuthError;
use crate::header_values::upload_digest::DigestError;
use crate::names::NameError;
use crate::store::{MetadataError, StoreError};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidName(#[from] NameError),
    /// The driver refused a request head (malformed, over a limit, timed out).
    #[error("{message}")]
    BadRequestHead { status: StatusCode, message: &'static str },
    #[error("{0}")]
    BadRequest(String),
    /// Missing, malformed, expired or revoked credentials.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Valid credentials that do not grant this access.
    #[error("access denied")]
    Forbidden,
    /// Bucket or object does not exist. One message for both, so responses do not tell them apart.
    #[error("no such object")]
    NotFound,
    #[error("no such bucket")]
    NoSuchBucket,
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("precondition failed")]
    PreconditionFailed,
    #[error("range not satisfiable")]
    RangeNotSatisfiable { size: u64 },
    #[error("{0}")]
    PayloadTooLarge(String),
    /// An upload with neither `Content-Length` nor chunked `Transfer-Encoding`: its end cannot be told from a
    /// lost connection, so nothing is stored (RFC 9110 §15.5.12).
    #[error("Content-Length or chunked Transfer-Encoding is required")]
    LengthRequired,
    /// A declared body digest (`Content-MD5`, `Repr-Digest`, `Content-Digest`) malformed or not matched.
    #[error(transparent)]
    Digest(#[from] crate::header_values::upload_digest::DigestError),
    #[error("not enough storage space")]
    InsufficientStorage,
    #[error("not ready")]
    NotReady,
    /// Authorisation and lookup did not finish within `timeouts.handler` (a stuck database, say).
    #[error("the request was not handled in time")]
    HandlerTimeout,
    /// The request needs the database, and it cannot be reached (`MetadataError::Unavailable`, anywhere in the
    /// cause chain), or this server's caches are too stale to answer it (`MetadataError::Stale`): 503 with
    /// `Retry-After`, so clients and load balancers come back later.
    /// A limit on the request's principal or bucket (`blobgate limits`) refused it: 429 natively, S3's 503
    /// `SlowDown`; `Retry-After` and the IETF `RateLimit-Policy` / `RateLimit` fields either way.
    #[error("{}", .0.message())]
    Throttled(Box<crate::throttle::Throttled>),
    #[error("the metadata database is unreachable; retry later")]
    DatabaseUnavailable,
    /// The object store blobs live in cannot be reached: a blob not in the local cache cannot be read, and no upload
    /// can be stored. 503 with `Retry-After`; cached objects are still served.
    #[error("the object store is unreachable; retry later")]
    BlobStoreUnavailable(String),
    /// The object exists but its blob is missing or unreadable. The source names the object and the IO error; the
    /// client sees the short message only.
    #[error("object data unavailable")]
    BlobUnavailable(#[source] anyhow::Error),
    /// Made by `From<anyhow::Error>`, which first takes out an unreachable database.
    #[error("internal error")]
    Internal(anyhow::Error),
    /// Beyond `limits.max_connections_per_ip` on the data listener.
    #[error("too many connections from this address")]
    TooManyConnectionsFromAddress,
    /// Beyond `limits.max_concurrent_uploads` on the admin listener.
    #[error("too many uploads in progress; retry later")]
    TooManyUploads,
    /// An upload body sent nothing for `timeouts.body_idle`.
    #[error("the request body stalled")]
    BodyTimeout,
    /// An upload body arrived slower than `limits.min_upload_rate`.
    #[error("the request body arrived slower than {0} bytes per second")]
    BodyTooSlow(u64),
}

/// The IETF fields of a throttled answer (draft-ietf-httpapi-ratelimit-headers).
const RATELIMIT_POLICY: header::HeaderName = header::HeaderName::from_static("ratelimit-policy");
const RATELIMIT: header::HeaderName = header::HeaderName::from_static("ratelimit");

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::InvalidName(_) => (StatusCode::BAD_REQUEST, "invalid_name"),
            ApiError::BadRequestHead { status, .. } => (*status, "bad_request"),
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::NoSuchBucket => (StatusCode::NOT_FOUND, "no_such_bucket"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::PreconditionFailed => (StatusCode::PRECONDITION_FAILED, "precondition_failed"),
            ApiError::RangeNotSatisfiable { .. } => (StatusCode::RANGE_NOT_SATISFIABLE, "range_not_satisfiable"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::LengthRequired => (StatusCode::LENGTH_REQUIRED, "length_required"),
            ApiError::Digest(DigestError::Invalid(..)) => (StatusCode::BAD_REQUEST, "invalid_digest"),
            ApiError::Digest(DigestError::Mismatch(_)) => (StatusCode::BAD_REQUEST, "bad_digest"),
            ApiError::InsufficientStorage => (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage"),
            ApiError::NotReady => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            ApiError::HandlerTimeout => (StatusCode::SERVICE_UNAVAILABLE, "handler_timeout"),
            ApiError::DatabaseUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "database_unavailable"),
            ApiError::BlobStoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "blob_store_unavailable"),
            ApiError::BlobUnavailable(_) => (StatusCode::INTERNAL_SERVER_ERROR, "object_data_unavailable"),
            ApiError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
            ApiError::TooManyConnectionsFromAddress => (StatusCode::SERVICE_UNAVAILABLE, "too_many_connections"),
            ApiError::TooManyUploads => (StatusCode::SERVICE_UNAVAILABLE, "too_many_uploads"),
            ApiError::BodyTimeout => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            ApiError::BodyTooSlow(_) => (StatusCode::REQUEST_TIMEOUT, "body_too_slow"),
            ApiError::Throttled(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_requests"),
        }
    }
}

impl ApiError {
    /// Refuses an upload whose head declares no body framing (see [`ApiError::LengthRequired`]).
    pub fn require_length(headers: &HeaderMap) -> Result<(), ApiError> {
        let framed = headers.contains_key(header::CONTENT_LENGTH) || headers.contains_key(header::TRANSFER_ENCODING);
        if framed { Ok(()) } else { Err(ApiError::LengthRequired) }
    }

    /// Whether the log must show this error: our own failures. A refused head is the client's doing even when its
    /// status is 5xx (505), and the driver logs what it needs of those itself. Load shedding is counted in metrics,
    /// not logged: a flood of refusals must not flood the log. Nor is an unreachable database, once per request:
    /// the readiness probe logs the outage when it starts and when it ends.
    fn is_logged(&self, status: StatusCode) -> bool {
        let shed = matches!(
            self,
            ApiError::TooManyConnectionsFromAddress
                | ApiError::TooManyUploads
                | ApiError::DatabaseUnavailable
                | ApiError::BlobStoreUnavailable(_)
        );
        status.is_server_error() && !shed && !matches!(self, ApiError::BadRequestHead { .. })
    }
}

/// A 5xx that the log must show, carried in the response's extensions from [`ApiError::into_response`] to
/// [`log_server_error`]. Only such responses carry it, so a success costs no allocation.
#[derive(Debug, Clone)]
struct LoggedError(Arc<ApiError>);

/// Logs a 5xx response once, with its cause chain: the one place server errors are logged. It runs as the
/// outermost layer of the data service and of the admin router (`tower::util::MapResponseLayer`), and only
/// looks at the status unless the response is a 5xx.
pub fn log_server_error(mut response: Response) -> Response {
    if !response.status().is_server_error() {
        return response;
    }
    if let Some(LoggedError(error)) = response.extensions_mut().remove::<LoggedError>() {
        // The cause chain goes to the log; the client got the short message only.
        let chain = match &*error {
            ApiError::Internal(e) | ApiError::BlobUnavailable(e) => format!("{e:#}"),
            _ => String::new(),
        };
        tracing::error!(status = response.status().as_u16(), error = %error, cause = %chain, "request failed");
    }
    response
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = serde_json::json!({ "error": code, "message": self.to_string() }).to_string();
        self.respond(status, axum::body::Body::from(body), HeaderValue::from_static("application/json"), true)
    }
}

impl ApiError {
    /// The one response builder of an error, whatever its body (our JSON, or S3's XML from `http::s3`): `body` with
    /// `status`, the headers this error adds (a 416's `Content-Range`, a 405's `Allow`, `Retry-After`,
    /// `Connection: close` after a broken body, and the bearer challenge of a 401 when `bearer_challenge`),
    /// `Cache-Control: no-store`, and the log's record of a 5xx.
    pub fn respond(
        self,
        status: StatusCode,
        body: axum::body::Body,
        content_type: HeaderValue,
        bearer_challenge: bool,
    ) -> Response {
        let mut response = Response::new(body);
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, content_type);
        match &self {
            ApiError::Unauthorized(_) if bearer_challenge => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"blobgate\""));
            }
            ApiError::RangeNotSatisfiable { size } => {
                let value = HeaderValue::from_str(&format!("bytes */{size}")).expect("digits are a valid header value");
                headers.insert(header::CONTENT_RANGE, value);
            }
            ApiError::MethodNotAllowed => {
                headers.insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            }
            ApiError::TooManyUploads
            | ApiError::DatabaseUnavailable
            | ApiError::HandlerTimeout
            | ApiError::BlobStoreUnavailable(_) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            ApiError::BodyTimeout | ApiError::BodyTooSlow(_) => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            ApiError::Throttled(throttled) => {
                let field = |text: String| HeaderValue::from_str(&text).expect("names and digits are a valid value");
                headers.insert(header::RETRY_AFTER, HeaderValue::from(throttled.retry_after_secs));
                headers.insert(RATELIMIT_POLICY, field(throttled.policy_field()));
                headers.insert(RATELIMIT, field(throttled.limit_field()));
            }
            _ => {}
        }
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let ApiError::Throttled(throttled) = &self {
            let by = crate::access_log::ThrottledBy { limit: throttled.kind.label(), scope: throttled.scope };
            response.extensions_mut().insert(by);
        }
        if self.is_logged(self.status_and_code().0) {
            response.extensions_mut().insert(LoggedError(Arc::new(self)));
        }
        response
    }
}

impl From<MetadataError> for ApiError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::NoSuchBucket(_) => ApiError::NoSuchBucket,
            MetadataError::Unavailable(_) | MetadataError::Stale { .. } => ApiError::DatabaseUnavailable,
            other => ApiError::Internal(other.into()),
        }
    }
}

/// The one place an unreachable database becomes a 503, whichever layer's error carried it (store, upload,
/// stats): it is looked for in the whole cause chain.
impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        if MetadataError::in_chain_is_unavailable(&e) { ApiError::DatabaseUnavailable } else { ApiError::Internal(e) }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NoSuchBucket(_) => ApiError::NoSuchBucket,
            StoreError::PreconditionFailed => ApiError::PreconditionFailed,
            StoreError::NoSuchKey => ApiError::NotFound,
            StoreError::BlobStoreUnavailable(e) => e.into(),
            StoreError::Other(e) => e.into(),
        }
    }
}

impl From<crate::store::remote::RemoteError> for ApiError {
    fn from(e: crate::store::remote::RemoteError) -> Self {
        use crate::store::remote::RemoteError;
        match e {
            RemoteError::Refused(why) => {
                tracing::warn!(error = %why, "the object store refused its credentials");
                ApiError::BlobStoreUnavailable(why)
            }
            RemoteError::Unavailable(why) => {
                tracing::warn!(error = %why, "the object store did not answer");
                ApiError::BlobStoreUnavailable(why)
            }
            RemoteError::NotFound(sha) => {
                ApiError::BlobUnavailable(anyhow::anyhow!("blob {sha} is missing from the object store"))
            }
            RemoteError::Local(e) => ApiError::Internal(e.into()),
        }
    }
}

/// The one place an authorisation failure becomes a response; a refusal of credentials is counted here, by reason.
impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        if let Some(reason) = e.reason() {
            crate::metrics::auth_failure(reason);
        }
        match e {
            AuthError::BadRequest(why) => ApiError::BadRequest(why.into()),
            AuthError::Unauthorized { message, .. } => ApiError::Unauthorized(message),
            AuthError::Forbidden => ApiError::Forbidden,
            AuthError::NoSuchBucket => ApiError::NotFound,
            // S3 routes render these themselves (`http::s3`); natively they are plain refusals.
            AuthError::SigV4 { error, .. } if error.status() == StatusCode::FORBIDDEN => ApiError::Forbidden,
            AuthError::SigV4 { error, .. } => ApiError::BadRequest(error.to_string()),
            AuthError::InvalidAccessKeyId { .. } => ApiError::Unauthorized("invalid access key"),
            AuthError::Lookup(e) => e.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn carries_a_log(error: ApiError) -> bool {
        error.into_response().extensions().get::<LoggedError>().is_some()
    }

    #[test]
    fn only_our_own_failures_are_left_for_the_log() {
        assert!(carries_a_log(ApiError::Internal(anyhow::anyhow!("disk on fire"))));
        assert!(carries_a_log(ApiError::BlobUnavailable(anyhow::anyhow!("gone"))));
        assert!(carries_a_log(ApiError::HandlerTimeout));
        assert!(carries_a_log(ApiError::InsufficientStorage));
        // Shed load and refused heads (even a 505) are not logged, nor is any 4xx.
        assert!(!carries_a_log(ApiError::TooManyUploads));
        assert!(!carries_a_log(ApiError::TooManyConnectionsFromAddress));
        let refused = ApiError::BadRequestHead { status: StatusCode::HTTP_VERSION_NOT_SUPPORTED, message: "HTTP/2" };
        assert!(!carries_a_log(refused));
        assert!(!carries_a_log(ApiError::NotFound));
        assert!(!carries_a_log(ApiError::BadRequest("no".into())));
    }

    #[test]
    fn an_unreachable_database_anywhere_in_the_chain_is_a_503_with_retry_after() {
        let unreachable = || MetadataError::no_answer_within(std::time::Duration::from_secs(1));
        let through_store = ApiError::from(StoreError::Other(anyhow::Error::from(unreachable()).context("put")));
        for error in [ApiError::from(unreachable()), through_store] {
            assert!(matches!(error, ApiError::DatabaseUnavailable), "{error:?}");
            let response = error.into_response();
            assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(response.headers()[header::RETRY_AFTER], "1");
            assert!(response.extensions().get::<LoggedError>().is_none(), "an outage is logged by the probe");
        }
        let timeout = ApiError::HandlerTimeout.into_response();
        assert_eq!(timeout.headers()[header::RETRY_AFTER], "1");
        assert!(matches!(ApiError::from(anyhow::anyhow!("disk on fire")), ApiError::Internal(_)));
    }

    #[test]
    fn the_log_layer_takes_the_error_out_of_the_response() {
        let response = log_server_error(ApiError::Internal(anyhow::anyhow!("x")).into_response());
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.extensions().get::<LoggedError>().is_none(), "logged once, then gone");
    }
}
