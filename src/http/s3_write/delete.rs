//! DeleteObjects: one bounded XML body, each key authorised and deleted under its own condition.

use super::*;

pub(super) async fn delete_objects(
    app: &AdminState,
    (bucket, bucket_id): (&BucketName, i64),
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    // S3 requires an integrity header on DeleteObjects (botocore, the Go SDK and s3cmd all send one).
    let has_digest = headers.contains_key("content-md5")
        || headers.contains_key("x-amz-trailer")
        || headers.keys().any(|name| name.as_str().starts_with("x-amz-checksum-"));
    if !has_digest {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "Missing required header for this request: Content-MD5 (or an x-amz-checksum-* header)",
        ));
    }
    let body = small_body(app, allowed, headers, body, MAX_DELETE_BODY).await?;
    let request = parse_delete(&body)?;
    let mut outcomes = Vec::with_capacity(request.objects.len());
    for DeleteTarget { key: raw, etag } in request.objects {
        let failed =
            |code: &str, message: String| DeleteOutcome::Failed { key: raw.clone(), code: code.into(), message };
        // An `<ETag>` makes the entry a conditional delete, as `If-Match` makes a DeleteObject one.
        let condition = etag.as_deref().map(parse_if_match).transpose();
        let outcome = match (ObjectKey::parse(&raw), condition) {
            (Err(e), _) => failed("InvalidArgument", e.to_string()),
            // The key's grants bound each key, as they bound a single DeleteObject.
            (Ok(key), _)
                if !allowed
                    .key
                    .rights
                    .grants
                    .iter()
                    .any(|g| g.covers(Some(bucket_id), key.as_str(), Access::Write)) =>
            {
                failed("AccessDenied", "Access Denied".into())
            }
            (Ok(_), Err(e)) => failed(e.code(), e.to_string()),
            (Ok(key), Ok(tag)) => match app
                .store
                .delete_if(bucket, &key, &tag.map_or(WriteCondition::Always, WriteCondition::IfMatch))
                .await
            {
                Ok(_) => DeleteOutcome::Deleted { key: raw.clone() },
                // The entry says what a DeleteObject of the key would answer.
                Err(e) => {
                    let e = ApiError::from(e);
                    let (status, code, message) = crate::http::s3::api_error_parts(&e);
                    if status.is_server_error() {
                        tracing::error!(error = ?e, "DeleteObjects: cannot delete a key");
                    }
                    failed(code, message.into_owned())
                }
            },
        };
        outcomes.push(outcome);
    }
    Ok(xml_response(xml::delete_result(outcomes, request.quiet)))
}
