//! `GET`/`HEAD /{bucket}/{key}` on the data listener. The request pipeline, in order:
//!
//! 1. Parse the path (one percent-decode) into a bucket name and key: 400 on bad input.
//! 2. Authorise against the bucket *before* looking the object up, so an unauthorised caller learns nothing
//!    about which keys exist (`auth`).
//! 3. Look the object up: 404.
//! 4. Evaluate preconditions (RFC 9110 §13.2.2): 412 or 304, with no file IO.
//! 5. Open the blob and `fstat` it: Content-Length comes from the same fd that will be sent.
//! 6. Evaluate Range (RFC 9110 §14) for GET: 200, 206 (single or multipart) or 416.
//! 7. Answer an empty body plus a `FileBody` extension; the driver sends its regions with sendfile.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri};

use super::AppState;
use super::conditional::{self, Precondition, Validators, etag_from_sha256, format_http_date};
use super::disposition::{DispositionKind, content_disposition, repr_digest_sha256};
use super::error::ApiError;
use super::multipart;
use super::range::{self, RangeDecision};
use crate::file_body::{DownloadKind, FileBody, ObjectRef, Segment};
use crate::names::parse_object_path;
use crate::store::{ObjectRecord, effective_content_type};

static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
static BYTES: HeaderValue = HeaderValue::from_static("bytes");

pub async fn get_object(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if method != Method::GET && method != Method::HEAD {
        return Err(ApiError::MethodNotAllowed);
    }
    let (bucket_name, key) = parse_object_path(uri.path())?;
    let bucket = app.store.meta.bucket(&bucket_name).await?;
    let grant = crate::auth::authorize_read(&app, bucket, &key, &uri, &headers).await?;
    let bucket = grant.bucket;
    let object = app.store.meta.object(bucket.id, &key).await?.ok_or(ApiError::NotFound)?;

    let etag = etag_from_sha256(&object.sha256);
    let last_modified = UNIX_EPOCH + Duration::from_secs(object.updated_at.max(0) as u64);
    let validators = Validators { etag: &etag, last_modified };
    let mut representation = representation_headers(&object, &etag, last_modified);
    // A signed URL may choose the download name; the signature covered it, so it is the signer's choice.
    if let Some(v) = grant.content_disposition.as_deref().and_then(|v| disposition_value(v, &object.key)) {
        representation.insert(header::CONTENT_DISPOSITION, v);
    }
    let honor_range = match conditional::evaluate(&method, &headers, &validators, SystemTime::now()) {
        Precondition::Failed => return Err(ApiError::PreconditionFailed),
        Precondition::NotModified => {
            let object_ref = ObjectRef { bucket_id: bucket.id, key: Arc::from(object.key.as_str()) };
            return Ok(not_modified(representation, object_ref));
        }
        Precondition::Proceed { honor_range } => honor_range,
    };

    let (file, size) = open_blob(&app, &object).await?;
    // RFC 9110 §14.2: Range is defined for GET only; HEAD answers what a plain GET would.
    let range_header = match (honor_range && method == Method::GET, headers.get_all(header::RANGE).iter().count()) {
        (true, 1) => headers.get(header::RANGE).map(HeaderValue::as_bytes),
        // Several Range fields cannot be combined meaningfully: ignore them all.
        _ => None,
    };
    let object_ref = ObjectRef { bucket_id: bucket.id, key: Arc::from(object.key.as_str()) };
    let content_type = effective_content_type(object.attrs.content_type.as_deref(), &object.key);
    let file = Arc::new(file);
    let (status, kind, segments, extra) = match range::evaluate(range_header, size, &app.range_policy) {
        RangeDecision::Full => {
            (StatusCode::OK, DownloadKind::Full, vec![Segment::Region { offset: 0, len: size }], None)
        }
        RangeDecision::Unsatisfiable => return Err(ApiError::RangeNotSatisfiable { size }),
        RangeDecision::Partial(ranges) if ranges.len() == 1 => {
            let r = ranges[0];
            let content_range = format!("bytes {}-{}/{size}", r.start, r.last());
            let segments = vec![Segment::Region { offset: r.start, len: r.len() }];
            (StatusCode::PARTIAL_CONTENT, DownloadKind::Range, segments, Some((header::CONTENT_RANGE, content_range)))
        }
        RangeDecision::Partial(ranges) => {
            let boundary = multipart::new_boundary();
            let segments = multipart::layout(&ranges, size, &content_type, &boundary);
            let ct = format!("multipart/byteranges; boundary={boundary}");
            (StatusCode::PARTIAL_CONTENT, DownloadKind::Multipart, segments, Some((header::CONTENT_TYPE, ct)))
        }
    };
    let body = FileBody { file, file_size: size, segments, kind, object: object_ref };

    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    let h = response.headers_mut();
    *h = representation;
    h.insert(header::CONTENT_TYPE, header_value(&content_type)?);
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(body.total_len()));
    if let Some((name, value)) = extra {
        h.insert(name, header_value(&value)?);
    }
    response.extensions_mut().insert(body);
    Ok(response)
}

/// Headers that describe the representation and go on 200, 206 and 304 alike (RFC 9110 §15.4.5 lists what a
/// 304 must repeat: Cache-Control, Content-Location, Date, ETag, Expires and Vary).
fn representation_headers(object: &ObjectRecord, etag: &str, last_modified: SystemTime) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(12);
    h.insert(header::ETAG, HeaderValue::from_str(etag).expect("hex digits in quotes are a valid header value"));
    h.insert(
        header::LAST_MODIFIED,
        HeaderValue::from_str(&format_http_date(last_modified)).expect("an HTTP date is a valid header value"),
    );
    h.insert(header::ACCEPT_RANGES, BYTES.clone());
    h.insert(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
    // Stored values were validated on the way in; an unrepresentable one is skipped rather than failing reads.
    if let Some(v) = object.attrs.cache_control.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
        h.insert(header::CACHE_CONTROL, v);
    }
    if let Some(v) = object.attrs.content_disposition.as_deref().and_then(|v| disposition_value(v, &object.key)) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    if let Some(digest) = repr_digest_sha256(&object.sha256).and_then(|d| HeaderValue::from_str(&d).ok()) {
        h.insert(HeaderName::from_static("repr-digest"), digest);
    }
    h
}

/// A stored bare `attachment` or `inline` gets the key's last segment as its file name (RFC 6266, with
/// `filename*` for non-ASCII names); any other stored value is sent as it is.
fn disposition_value(stored: &str, key: &str) -> Option<HeaderValue> {
    let kind = if stored.eq_ignore_ascii_case("attachment") {
        Some(DispositionKind::Attachment)
    } else if stored.eq_ignore_ascii_case("inline") {
        Some(DispositionKind::Inline)
    } else {
        None
    };
    let value = match kind {
        Some(kind) => content_disposition(kind, key.rsplit('/').next().unwrap_or(key)),
        None => stored.to_owned(),
    };
    HeaderValue::from_str(&value).ok()
}

/// The object reference goes along as an extension so the driver can count the 304 for this object.
fn not_modified(mut representation: HeaderMap, object: ObjectRef) -> Response {
    // RFC 9110 §15.4.5: a 304 carries no content, so no content headers.
    representation.remove(header::CONTENT_DISPOSITION);
    representation.remove(HeaderName::from_static("repr-digest"));
    let mut response = (StatusCode::NOT_MODIFIED, representation).into_response();
    response.extensions_mut().insert(object);
    response
}

/// Opens the blob off the event loop (open and fstat can block on a cold disk) and returns it with its size.
async fn open_blob(app: &AppState, object: &ObjectRecord) -> Result<(File, u64), ApiError> {
    let blobs = app.store.blobs.clone();
    let sha = object.sha256.clone();
    let opened = tokio::task::spawn_blocking(move || -> io::Result<(File, u64)> {
        let file = blobs.open_blob(&sha)?;
        let size = file.metadata()?.len();
        Ok((file, size))
    })
    .await
    .map_err(|e| ApiError::Internal(anyhow::anyhow!("blob open task failed: {e}")))?;
    match opened {
        Ok(pair) => Ok(pair),
        Err(e) => {
            crate::metrics::blob_open_error();
            tracing::error!(bucket_id = object.bucket_id, key = %object.key, sha256 = %object.sha256, error = %e,
                "blob missing or unreadable");
            Err(ApiError::BlobUnavailable(e))
        }
    }
}

fn header_value(v: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(v).map_err(|_| ApiError::Internal(anyhow::anyhow!("unrepresentable header value {v:?}")))
}
