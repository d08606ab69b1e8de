//! CopyObject and UploadPartCopy over `store::server_copy`: the source authorised for reading by the same signed
//! request before it is looked up, its `x-amz-copy-source-if-*` evaluated as RFC 9110 `If-*`.

use super::*;

/// The source a copy names, authorised for reading by the same signed request (before it is looked up, so an
/// answer never tells a key that may not read it whether the source exists), and the empty body checked.
async fn copy_source(
    app: &AdminState,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<(BucketName, ObjectKey), S3Error> {
    let value = headers.get(COPY_SOURCE).map(|v| v.to_str()).transpose();
    let value = value.map_err(|_| bad_request(format!("{COPY_SOURCE} is not ASCII")))?.unwrap_or_default();
    let (bucket, key) = parse_copy_source(value)?;
    let found = app.data.catalog.bucket(bucket.as_str()).await?;
    app.data.auth.s3_also(allowed, S3Target::Object(found.as_ref(), &key), Access::Read)?;
    // A copy carries no body: one that does is refused, and a signed payload hash is checked as for any body.
    small_body(app, allowed, headers, body, 0).await?;
    Ok((bucket, key))
}

/// Whether the copy's source passes its `x-amz-copy-source-if-*` preconditions, evaluated as RFC 9110's
/// `If-*` on the source (S3's rules are the RFC's order: If-Match wins over If-Unmodified-Since, If-None-Match
/// over If-Modified-Since), against the ETag and Last-Modified S3 reads of it answer.
fn copy_source_passes(headers: &HeaderMap, source: &ObjectRecord) -> bool {
    let mut fields = HeaderMap::new();
    for (name, field) in &COPY_SOURCE_PRECONDITIONS {
        for value in headers.get_all(*name) {
            fields.append(field.clone(), value.clone());
        }
    }
    if fields.is_empty() {
        return true;
    }
    let etag = source.s3_etag_or_native();
    let last_modified = std::time::UNIX_EPOCH + std::time::Duration::from_secs(source.updated_at.max(0) as u64);
    let validators = Validators { etag: &etag, last_modified };
    matches!(evaluate(&Method::GET, &fields, &validators, std::time::SystemTime::now()), Precondition::Proceed { .. })
}

pub(super) async fn copy_object(
    app: &AdminState,
    target: ObjectName<'_>,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    let (bucket, key) = copy_source(app, allowed, headers, body).await?;
    let directive = |name: &str| headers.get(name).map(|v| v.to_str().unwrap_or("?"));
    let replace_metadata = parse_metadata_directive(directive(METADATA_DIRECTIVE))?;
    let replace_tags = parse_tagging_directive(directive(TAGGING_DIRECTIVE))?;
    let attrs = CopiedAttrs {
        metadata: if replace_metadata { Directive::Replace(object_attrs(headers)?) } else { Directive::FromSource },
        tags: if replace_tags { Directive::Replace(request_tags(headers)?) } else { Directive::FromSource },
    };
    // S3 refuses a copy onto itself that changes nothing; new tags alone do not make it legal.
    if !replace_metadata && bucket == *target.bucket && key == *target.key {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "InvalidRequest",
            "This copy request is illegal because it is trying to copy an object to itself without changing the \
             object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    let source = ObjectName { bucket: &bucket, key: &key };
    let copied = app.store.copy_object(source, target, attrs, |record| copy_source_passes(headers, record)).await;
    match copied.map_err(ApiError::from)? {
        CopyOutcome::Copied(report) => {
            Ok(xml_response(xml::copy_result(CopyResult::Object, &report.s3_etag, report.last_modified)))
        }
        CopyOutcome::NoSuchKey => Err(ApiError::NotFound.into()),
        CopyOutcome::PreconditionFailed => Err(ApiError::PreconditionFailed.into()),
    }
}

pub(super) async fn upload_part_copy(
    app: &AdminState,
    target: ObjectName<'_>,
    upload_id: &str,
    part_number: u32,
    allowed: &AllowedS3Request,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, S3Error> {
    check_part_number(part_number)?;
    let (bucket, key) = copy_source(app, allowed, headers, body).await?;
    let source = app.store.object(&bucket, &key).await.map_err(ApiError::from)?.ok_or(ApiError::NotFound)?;
    if !copy_source_passes(headers, &source) {
        return Err(ApiError::PreconditionFailed.into());
    }
    let range = match headers.get(COPY_SOURCE_RANGE) {
        Some(value) => {
            let value = value.to_str().map_err(|_| bad_request(format!("{COPY_SOURCE_RANGE} is not ASCII")))?;
            parse_copy_source_range(value, source.size)?
        }
        None => (0, source.size),
    };
    // The copy writes a part file: it takes an upload place like an uploaded part, and is bounded like one.
    let _place = crate::http::upload::upload_place(app).await?;
    let limits = UploadLimits::of(&app.settings.limits);
    let copied = app.store.copy_part(&source, range, target, upload_id, part_number, &limits).await;
    let part = copied.map_err(part_error)?.ok_or(ApiError::NotFound)?;
    Ok(xml_response(xml::copy_result(CopyResult::Part, &part.etag(), part.created_at)))
}
