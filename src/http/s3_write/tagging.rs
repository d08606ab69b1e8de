//! PutObjectTagging and DeleteObjectTagging (GetObjectTagging is a read, in `http::s3`).

use super::*;

/// PutObjectTagging (`PUT ?tagging`, the body's tag set replaces the object's) and DeleteObjectTagging (`DELETE
/// ?tagging`). The object's content, ETag and Last-Modified stay; an absent object is `NoSuchKey`.
pub(super) async fn object_tagging(
    app: &AdminState,
    target: ObjectName<'_>,
    method: &Method,
    upload_id: Option<&str>,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    if upload_id.is_some() || headers.contains_key(COPY_SOURCE) {
        return Err(S3Error::new(StatusCode::BAD_REQUEST, "InvalidRequest", "?tagging names no upload and no copy"));
    }
    let (tags, status) = match *method {
        Method::PUT => {
            let body = small_body(app, allowed, headers, body, MAX_TAGGING_BODY).await?;
            (parse_tagging(&body)?, StatusCode::OK)
        }
        Method::DELETE => (Tags::new(), StatusCode::NO_CONTENT),
        _ => return Err(ApiError::MethodNotAllowed.into()),
    };
    if !app.store.set_tags(target.bucket, target.key, &tags).await.map_err(ApiError::from)? {
        return Err(ApiError::NotFound.into());
    }
    Ok(status.into_response())
}
