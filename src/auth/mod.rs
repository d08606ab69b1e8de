//! TEMPORARY: public buckets only; replaced by tokens and signed URLs.
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::names::ObjectKey;
use crate::store::Bucket;
use axum::http::{HeaderMap, Method, Uri};

pub async fn authorize_read(
    _app: &AppState,
    bucket: Option<Bucket>,
    _key: &ObjectKey,
    _m: &Method,
    _u: &Uri,
    _h: &HeaderMap,
) -> Result<Bucket, ApiError> {
    match bucket {
        Some(b) if b.public => Ok(b),
        _ => Err(ApiError::Unauthorized("credentials required")),
    }
}
