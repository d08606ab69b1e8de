//! What S3 write headers carry: Content-Type and the other stored fields, user metadata, tags.

use super::*;

pub(super) fn object_attrs(headers: &HeaderMap) -> Result<crate::names::ObjectAttrs, S3Error> {
    let text = |name: header::HeaderName| -> Result<Option<String>, S3Error> {
        headers
            .get(&name)
            .map(|v| v.to_str().map(str::to_owned).map_err(|_| bad_request(format!("{name} is not ASCII"))))
            .transpose()
    };
    let mut attrs =
        parse_attrs(text(header::CONTENT_TYPE)?, text(header::CACHE_CONTROL)?, text(header::CONTENT_DISPOSITION)?)
            .map_err(ApiError::from)?;
    attrs.user_metadata = user_metadata(headers)?;
    attrs.tags = request_tags(headers)?;
    Ok(attrs)
}

/// The request's `x-amz-tagging` (none: no tags), checked as S3 checks a tag set (`InvalidTag`).
pub(super) fn request_tags(headers: &HeaderMap) -> Result<Tags, S3Error> {
    match headers.get(TAGGING) {
        None => Ok(Tags::new()),
        Some(value) => {
            let text = value.to_str().map_err(|_| bad_request(format!("{TAGGING} is not URL-encoded ASCII")))?;
            parse_tagging_header(text).map_err(S3Error::from)
        }
    }
}

/// The request's `x-amz-meta-*` fields, by name without the prefix (field names are lower case already); several
/// lines of one name are joined with commas, as HTTP combines them. S3's bound holds: names and values together
/// at most 2 KB, else `MetadataTooLarge`.
fn user_metadata(headers: &HeaderMap) -> Result<std::collections::BTreeMap<String, String>, S3Error> {
    let mut metadata = std::collections::BTreeMap::<String, String>::new();
    for (name, value) in headers {
        let Some(short) = name.as_str().strip_prefix(USER_METADATA_PREFIX) else { continue };
        if short.is_empty() {
            return Err(bad_request(format!("{name} names no metadata")));
        }
        let value = value.to_str().map_err(|_| bad_request(format!("{name} is not printable ASCII")))?;
        metadata
            .entry(short.to_owned())
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(value);
            })
            .or_insert_with(|| value.to_owned());
    }
    let size: usize = metadata.iter().map(|(name, value)| name.len() + value.len()).sum();
    if size > MAX_USER_METADATA_BYTES {
        return Err(S3Error::new(
            StatusCode::BAD_REQUEST,
            "MetadataTooLarge",
            format!(
                "Your metadata headers exceed the maximum allowed metadata size: {size} bytes of names and values, \
                 at most {MAX_USER_METADATA_BYTES}"
            ),
        ));
    }
    Ok(metadata)
}
