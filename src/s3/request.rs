//! What S3 requests carry that is ours to parse: the list parameters (ListObjects V1 and V2), the XML bodies
//! of CompleteMultipartUpload, DeleteObjects and PutObjectTagging, the copy headers, and tag sets (`x-amz-tagging`,
//! checked by S3's rules). Each refusal is a [`RequestError`] with S3's error code.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Deserialize;

use super::MAX_KEYS;
use super::listing::ListQuery;
use crate::names::{BucketName, ObjectKey, Tags};

/// A request S3 would refuse with 400, and the code it would name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("The XML you provided was not well-formed or did not validate against our published schema: {0}")]
    MalformedXml(String),
    #[error("Your request was too big: the body may have at most {limit} bytes")]
    TooLarge { limit: usize },
    #[error("The list of parts was not in ascending order. The parts list must be specified in order by part number.")]
    InvalidPartOrder,
    /// A tag set S3 would refuse: too many tags, a repeated key, a key or value too long or with a character
    /// outside S3's set.
    #[error("{0}")]
    InvalidTag(String),
}

impl RequestError {
    /// The `<Code>` of the S3 error document (the status is 400 for all of them).
    pub fn code(&self) -> &'static str {
        match self {
            RequestError::InvalidArgument(_) => "InvalidArgument",
            RequestError::MalformedXml(_) => "MalformedXML",
            RequestError::TooLarge { .. } => "MaxMessageLengthExceeded",
            RequestError::InvalidPartOrder => "InvalidPartOrder",
            RequestError::InvalidTag(_) => "InvalidTag",
        }
    }
}

/// Which list call: `GET /{bucket}?list-type=2` or plain `GET /{bucket}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListVersion {
    V1,
    V2,
}

/// The parameters of a ListObjects call, parsed once.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListParams {
    pub prefix: String,
    /// `None` when absent or empty.
    pub delimiter: Option<String>,
    /// At most [`MAX_KEYS`] (larger values are capped, as S3 does); 1000 when absent.
    pub max_keys: u32,
    /// `encoding-type=url`: keys and the other key-like elements are URL-encoded in the response.
    pub url_encoded: bool,
    /// V2 `fetch-owner=true`: each object carries its Owner (V1 always does).
    pub fetch_owner: bool,
    /// V2 `start-after`, echoed as `StartAfter`.
    pub start_after: Option<String>,
    /// V2 `continuation-token` as sent, echoed as `ContinuationToken`; its key is `continue_after`.
    pub continuation_token: Option<String>,
    continue_after: Option<String>,
    /// V1 `marker`, echoed as `Marker`.
    pub marker: Option<String>,
}

impl ListParams {
    /// Parses the query string of a list request (without the `?`). Unknown parameters are ignored.
    pub fn from_query(version: ListVersion, query: &str) -> Result<Self, RequestError> {
        let mut params = ListParams { max_keys: MAX_KEYS, ..ListParams::default() };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = value.into_owned();
            match (&*name, version) {
                ("prefix", _) => params.prefix = value,
                ("delimiter", _) => params.delimiter = Some(value).filter(|d| !d.is_empty()),
                ("max-keys", _) => params.max_keys = parse_count("max-keys", &value)?,
                ("encoding-type", _) if value == "url" => params.url_encoded = true,
                ("encoding-type", _) => {
                    return Err(RequestError::InvalidArgument("Invalid Encoding Method specified in Request".into()));
                }
                ("fetch-owner", ListVersion::V2) => params.fetch_owner = value == "true",
                ("start-after", ListVersion::V2) => params.start_after = Some(value).filter(|v| !v.is_empty()),
                ("continuation-token", ListVersion::V2) => {
                    params.continue_after = Some(decode_continuation_token(&value)?);
                    params.continuation_token = Some(value);
                }
                ("marker", ListVersion::V1) => params.marker = Some(value).filter(|v| !v.is_empty()),
                _ => {}
            }
        }
        // Keys hold no control characters, and XML 1.0 cannot carry most of them even escaped: refuse them in
        // what the response would echo, unless it is URL-encoded.
        // V1's Prefix is echoed as given even then: XML cannot carry it with a control character but tab or LF.
        if params.url_encoded
            && version == ListVersion::V1
            && params.prefix.chars().any(|c| c.is_control() && c != '\t' && c != '\n')
        {
            return Err(RequestError::InvalidArgument("the prefix holds a control character".into()));
        }
        if !params.url_encoded {
            let echoed =
                [Some(&params.prefix), params.delimiter.as_ref(), params.start_after.as_ref(), params.marker.as_ref()];
            if echoed.into_iter().flatten().any(|v| v.chars().any(char::is_control)) {
                return Err(RequestError::InvalidArgument(
                    "a list parameter holds a control character; use encoding-type=url".into(),
                ));
            }
        }
        Ok(params)
    }

    /// What to list: a continuation token wins over `start-after` (as in S3), and V1 lists after its marker.
    pub fn query(&self) -> ListQuery {
        let after = self.continue_after.clone().or_else(|| self.start_after.clone()).or_else(|| self.marker.clone());
        ListQuery { prefix: self.prefix.clone(), delimiter: self.delimiter.clone(), after, max_keys: self.max_keys }
    }
}

/// The parameters of ListParts: `max-parts` (capped at 1000, the default) and `part-number-marker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListPartsParams {
    pub max_parts: u32,
    /// List parts after this number (0: from the first).
    pub part_number_marker: u32,
}

impl ListPartsParams {
    pub fn from_query(query: &str) -> Result<Self, RequestError> {
        let mut params = ListPartsParams { max_parts: MAX_KEYS, part_number_marker: 0 };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*name {
                "max-parts" => params.max_parts = parse_count("max-parts", &value)?,
                "part-number-marker" => {
                    params.part_number_marker = value.trim().parse::<u32>().map_err(|_| {
                        RequestError::InvalidArgument("part-number-marker must be a non-negative integer".into())
                    })?;
                }
                _ => {}
            }
        }
        Ok(params)
    }
}

/// The parameters of ListMultipartUploads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListUploadsParams {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub key_marker: Option<String>,
    /// Meaningful only with `key_marker` (ignored without it, as S3 does).
    pub upload_id_marker: Option<String>,
    pub max_uploads: u32,
    pub url_encoded: bool,
}

impl ListUploadsParams {
    pub fn from_query(query: &str) -> Result<Self, RequestError> {
        let mut params = ListUploadsParams { max_uploads: MAX_KEYS, ..ListUploadsParams::default() };
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            let value = value.into_owned();
            match &*name {
                "prefix" => params.prefix = value,
                "delimiter" => params.delimiter = Some(value).filter(|d| !d.is_empty()),
                "key-marker" => params.key_marker = Some(value).filter(|v| !v.is_empty()),
                "upload-id-marker" => params.upload_id_marker = Some(value).filter(|v| !v.is_empty()),
                "max-uploads" => params.max_uploads = parse_count("max-uploads", &value)?,
                "encoding-type" if value == "url" => params.url_encoded = true,
                "encoding-type" => {
                    return Err(RequestError::InvalidArgument("Invalid Encoding Method specified in Request".into()));
                }
                _ => {}
            }
        }
        if params.key_marker.is_none() {
            params.upload_id_marker = None;
        }
        Ok(params)
    }
}

/// A `max-*` count: non-negative, capped at [`MAX_KEYS`].
fn parse_count(name: &str, value: &str) -> Result<u32, RequestError> {
    match value.trim().parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n.min(i64::from(MAX_KEYS)) as u32),
        _ => Err(RequestError::InvalidArgument(format!("{name} must be an integer between 0 and 2147483647"))),
    }
}

/// The opaque V2 continuation token for a listing that goes on after `key`: the key, base64url.
#[must_use]
pub fn continuation_token(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

/// The key a continuation token carries.
pub fn decode_continuation_token(token: &str) -> Result<String, RequestError> {
    let invalid = || RequestError::InvalidArgument("The continuation token provided is incorrect".into());
    let bytes = URL_SAFE_NO_PAD.decode(token).map_err(|_| invalid())?;
    let key = String::from_utf8(bytes).map_err(|_| invalid())?;
    if key.is_empty() || key.len() > crate::names::MAX_KEY_BYTES {
        return Err(invalid());
    }
    Ok(key)
}

/// Largest CompleteMultipartUpload body accepted: 10,000 parts of about 100 bytes, with room for checksums.
pub const MAX_COMPLETE_BODY: usize = 2 << 20;
/// Largest Delete body accepted: 1000 keys of up to 1024 bytes each, escaped, with their element tags.
pub const MAX_DELETE_BODY: usize = 2 << 20;
/// Most parts an upload may have, and the highest part number.
pub const MAX_PARTS: u32 = 10_000;
/// Most keys one DeleteObjects request may name.
pub const MAX_DELETE_KEYS: usize = 1000;

/// One part of a CompleteMultipartUpload body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletedPart {
    /// 1 to [`MAX_PARTS`].
    pub part_number: u32,
    /// The part's ETag, quoted (clients send it with or without the quotes).
    pub etag: String,
}

#[derive(Deserialize)]
struct CompleteBody {
    #[serde(rename = "Part", default)]
    parts: Vec<PartBody>,
}

#[derive(Deserialize)]
struct PartBody {
    #[serde(rename = "PartNumber")]
    part_number: String,
    #[serde(rename = "ETag")]
    etag: String,
}

/// The parts of a CompleteMultipartUpload body, in the order given: at least one, numbers 1 to 10,000 in
/// strictly ascending order (else `InvalidPartOrder`), each with an ETag.
pub fn parse_complete_multipart_upload(body: &[u8]) -> Result<Vec<CompletedPart>, RequestError> {
    let parsed: CompleteBody = parse_body(body, MAX_COMPLETE_BODY)?;
    if parsed.parts.is_empty() {
        return Err(RequestError::MalformedXml("a CompleteMultipartUpload needs at least one Part".into()));
    }
    let mut parts = Vec::with_capacity(parsed.parts.len());
    for part in parsed.parts {
        let part_number =
            part.part_number.trim().parse::<u32>().ok().filter(|n| (1..=MAX_PARTS).contains(n)).ok_or_else(|| {
                RequestError::InvalidArgument("Part number must be an integer between 1 and 10000".into())
            })?;
        if parts.last().is_some_and(|p: &CompletedPart| p.part_number >= part_number) {
            return Err(RequestError::InvalidPartOrder);
        }
        let etag = part.etag.trim().trim_matches('"');
        if etag.is_empty() {
            return Err(RequestError::MalformedXml(format!("part {part_number} has an empty ETag")));
        }
        parts.push(CompletedPart { part_number, etag: format!("\"{etag}\"") });
    }
    Ok(parts)
}

/// What a DeleteObjects body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteRequest {
    /// Report only the keys that failed.
    pub quiet: bool,
    /// 1 to [`MAX_DELETE_KEYS`] objects, in the order given (not validated here: a bad key is one failed entry).
    pub objects: Vec<DeleteTarget>,
}

/// One object of a DeleteObjects body (`<Object>`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeleteTarget {
    #[serde(rename = "Key")]
    pub key: String,
    /// `<ETag>`: delete only if the object's ETag is this one (a conditional delete, as `If-Match`), as sent.
    #[serde(rename = "ETag", default)]
    pub etag: Option<String>,
}

#[derive(Deserialize)]
struct DeleteBody {
    #[serde(rename = "Quiet", default)]
    quiet: Option<String>,
    #[serde(rename = "Object", default)]
    objects: Vec<DeleteTarget>,
}

/// Parses a DeleteObjects body (`<Delete><Quiet/>?<Object><Key/><ETag/>?</Object>+</Delete>`).
pub fn parse_delete(body: &[u8]) -> Result<DeleteRequest, RequestError> {
    let parsed: DeleteBody = parse_body(body, MAX_DELETE_BODY)?;
    let quiet = match parsed.quiet.as_deref().map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => return Err(RequestError::MalformedXml(format!("Quiet must be true or false, not {other:?}"))),
    };
    if parsed.objects.is_empty() || parsed.objects.len() > MAX_DELETE_KEYS {
        return Err(RequestError::MalformedXml(format!("a Delete names 1 to {MAX_DELETE_KEYS} objects")));
    }
    Ok(DeleteRequest { quiet, objects: parsed.objects })
}

/// The entity tag of an `If-Match` on a write or delete (or a DeleteObjects `<ETag>`), as the store compares it:
/// `*`, a weak tag as sent (it never matches strongly, RFC 9110 §13.1.1), or a strong tag quoted whether or not
/// the client quoted it (S3 accepts both).
pub fn parse_if_match(value: &str) -> Result<String, RequestError> {
    let tag = value.trim();
    if tag == "*" || tag.starts_with("W/") {
        return Ok(tag.to_owned());
    }
    let bare = tag.trim_matches('"');
    if bare.is_empty() || bare.contains('"') {
        return Err(RequestError::InvalidArgument(format!("If-Match is not an entity tag: {tag}")));
    }
    Ok(format!("\"{bare}\""))
}

/// CopyObject's and UploadPartCopy's source, `x-amz-copy-source`: `[/]bucket/key`, the key URL-encoded, with an
/// optional `?versionId=`. Buckets have no versions here, so only the `null` version (the current object, as
/// S3 names it in an unversioned bucket) is accepted.
pub fn parse_copy_source(value: &str) -> Result<(BucketName, ObjectKey), RequestError> {
    let invalid = |why: &str| {
        RequestError::InvalidArgument(format!(
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey ({why})"
        ))
    };
    let (path, query) = value.split_once('?').unwrap_or((value, ""));
    for (name, version) in form_urlencoded::parse(query.as_bytes()) {
        if name != "versionId" {
            return Err(invalid("only versionId may follow the key"));
        }
        if version != "null" {
            return Err(RequestError::InvalidArgument("Invalid version id specified".into()));
        }
    }
    let path = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = path.split_once('/').ok_or_else(|| invalid("no key"))?;
    let bucket = BucketName::parse(bucket).map_err(|e| invalid(&e.to_string()))?;
    let key = ObjectKey::from_url_path(key).map_err(|e| invalid(&e.to_string()))?;
    Ok((bucket, key))
}

/// UploadPartCopy's `x-amz-copy-source-range: bytes=first-last` (both offsets given, inclusive, within the
/// source's `size` bytes), as (offset, length).
pub fn parse_copy_source_range(value: &str, size: u64) -> Result<(u64, u64), RequestError> {
    let (first, last) = value
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((parse_offset(a)?, parse_offset(b)?)))
        .ok_or_else(|| {
            RequestError::InvalidArgument(
                "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are \
                 the zero-based offsets of the first and last bytes to copy"
                    .into(),
            )
        })?;
    if first > last || last >= size {
        return Err(RequestError::InvalidArgument(format!(
            "Range specified is not valid for source object of size: {size}"
        )));
    }
    Ok((first, last - first + 1))
}

/// A byte offset: ASCII digits only (no sign, no space), as `u64`.
fn parse_offset(digits: &str) -> Option<u64> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `x-amz-metadata-directive`: whether the copy takes the request's attributes (`REPLACE`) rather than the
/// source's (`COPY`, the default).
pub fn parse_metadata_directive(value: Option<&str>) -> Result<bool, RequestError> {
    match value {
        None | Some("COPY") => Ok(false),
        Some("REPLACE") => Ok(true),
        Some(other) => Err(RequestError::InvalidArgument(format!("Unknown metadata directive: {other}"))),
    }
}

/// Most tags an object may have (S3's bound).
pub const MAX_TAGS: usize = 10;
/// Longest tag key and value, in characters (S3's bounds).
pub const MAX_TAG_KEY_CHARS: usize = 128;
pub const MAX_TAG_VALUE_CHARS: usize = 256;
/// Largest PutObjectTagging body accepted: ten tags at their longest, each character escaped, with the elements.
pub const MAX_TAGGING_BODY: usize = 64 << 10;

/// A tag set as S3 checks it, in the order given: at most [`MAX_TAGS`], keys unique, 1 to 128 characters, not
/// starting with the reserved `aws:`, values up to 256; both made of letters, digits, spaces and `+ - = . _ : /
/// @` only.
pub fn check_tags(pairs: Vec<(String, String)>) -> Result<Tags, RequestError> {
    if pairs.len() > MAX_TAGS {
        return Err(RequestError::InvalidTag(format!("Object tags cannot be greater than {MAX_TAGS}")));
    }
    let allowed = |c: char| c.is_alphanumeric() || c == ' ' || "+-=._:/@".contains(c);
    let mut tags = Tags::new();
    for (key, value) in pairs {
        let key_chars = key.chars().count();
        if key_chars == 0 || key_chars > MAX_TAG_KEY_CHARS || !key.chars().all(allowed) {
            return Err(RequestError::InvalidTag(format!(
                "The TagKey you have provided is invalid: 1 to {MAX_TAG_KEY_CHARS} letters, digits, spaces and + - = . _ : / @"
            )));
        }
        if key.starts_with("aws:") {
            return Err(RequestError::InvalidTag("Your TagKey cannot be prefixed with aws:".into()));
        }
        if value.chars().count() > MAX_TAG_VALUE_CHARS || !value.chars().all(allowed) {
            return Err(RequestError::InvalidTag(format!(
                "The TagValue you have provided is invalid: up to {MAX_TAG_VALUE_CHARS} letters, digits, spaces and + - = . _ : / @"
            )));
        }
        if tags.insert(key, value).is_some() {
            return Err(RequestError::InvalidTag("Cannot provide multiple Tags with the same key".into()));
        }
    }
    Ok(tags)
}

/// `x-amz-tagging` (PutObject, CreateMultipartUpload, a copy with `REPLACE`): the tag set as a URL query,
/// `k1=v1&k2=v2`, checked by [`check_tags`]. A key without `=` has an empty value.
pub fn parse_tagging_header(value: &str) -> Result<Tags, RequestError> {
    check_tags(form_urlencoded::parse(value.as_bytes()).map(|(k, v)| (k.into_owned(), v.into_owned())).collect())
}

#[derive(Deserialize)]
struct TaggingBody {
    #[serde(rename = "TagSet")]
    tag_set: TagSetBody,
}

#[derive(Deserialize)]
struct TagSetBody {
    #[serde(rename = "Tag", default)]
    tags: Vec<TagBody>,
}

#[derive(Deserialize)]
struct TagBody {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Value", default)]
    value: String,
}

/// A PutObjectTagging body (`<Tagging><TagSet><Tag><Key/><Value/></Tag>*</TagSet></Tagging>`), checked by
/// [`check_tags`]. An empty `TagSet` removes every tag.
pub fn parse_tagging(body: &[u8]) -> Result<Tags, RequestError> {
    let parsed: TaggingBody = parse_body(body, MAX_TAGGING_BODY)?;
    check_tags(parsed.tag_set.tags.into_iter().map(|t| (t.key, t.value)).collect())
}

/// S3's `x-amz-tagging-directive` on CopyObject: `COPY` (the default, the source's tags) or `REPLACE` (the
/// request's `x-amz-tagging`): whether to replace.
pub fn parse_tagging_directive(value: Option<&str>) -> Result<bool, RequestError> {
    match value {
        None | Some("COPY") => Ok(false),
        Some("REPLACE") => Ok(true),
        Some(other) => Err(RequestError::InvalidArgument(format!("Unknown tagging directive: {other}"))),
    }
}

/// A bounded body as UTF-8 XML into `T`. quick-xml expands only the predefined and character entities (no DTD),
/// so a body cannot grow as it is read.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], limit: usize) -> Result<T, RequestError> {
    if body.len() > limit {
        return Err(RequestError::TooLarge { limit });
    }
    let text = std::str::from_utf8(body).map_err(|_| RequestError::MalformedXml("the body is not UTF-8".into()))?;
    quick_xml::de::from_str(text).map_err(|e| RequestError::MalformedXml(e.to_string()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn copy_sources_name_a_bucket_and_a_decoded_key() {
        let parsed = |v: &str| parse_copy_source(v).map(|(b, k)| (b.as_str().to_owned(), k.as_str().to_owned()));
        let want = |b: &str, k: &str| Ok((b.to_owned(), k.to_owned()));
        assert_eq!(parsed("bkt/a/b.txt"), want("bkt", "a/b.txt"));
        assert_eq!(parsed("/bkt/a/b.txt"), want("bkt", "a/b.txt"));
        assert_eq!(parsed("/bkt/odd/a%20b%2Bc%25d%20%C3%A9.txt"), want("bkt", "odd/a b+c%d é.txt"));
        assert_eq!(parsed("bkt/what%3Fnot"), want("bkt", "what?not"), "an encoded ? is part of the key");
        assert_eq!(parsed("bkt/k?versionId=null"), want("bkt", "k"));
        for bad in ["bkt", "/bkt", "bkt/", "/", "", "Bad_Bucket!/k", "bkt/%FF", "bkt/k?acl", "bkt/k?versionId=null&x=1"]
        {
            assert!(matches!(parse_copy_source(bad), Err(RequestError::InvalidArgument(_))), "{bad:?}");
        }
        let versioned = parse_copy_source("bkt/k?versionId=3HL4kqtJlcpXroDTDmJ").unwrap_err();
        assert_eq!(versioned.to_string(), "Invalid version id specified");
    }

    #[test]
    fn copy_source_ranges_are_inclusive_and_within_the_source() {
        assert_eq!(parse_copy_source_range("bytes=0-9", 10), Ok((0, 10)));
        assert_eq!(parse_copy_source_range("bytes=5-5", 10), Ok((5, 1)));
        assert_eq!(parse_copy_source_range("bytes=3-7", 10), Ok((3, 5)));
        for bad in
            ["bytes=0-10", "bytes=7-3", "bytes=-5", "bytes=5-", "bytes=0-1,3-4", "0-5", "bytes= 0-5", "bytes=+1-2"]
        {
            assert!(parse_copy_source_range(bad, 10).is_err(), "{bad:?}");
        }
        assert!(parse_copy_source_range("bytes=0-0", 0).is_err(), "an empty source has no range");
        assert!(parse_copy_source_range("bytes=0-99999999999999999999999", u64::MAX).is_err());
    }

    #[test]
    fn metadata_directives() {
        assert_eq!(parse_metadata_directive(None), Ok(false));
        assert_eq!(parse_metadata_directive(Some("COPY")), Ok(false));
        assert_eq!(parse_metadata_directive(Some("REPLACE")), Ok(true));
        assert!(parse_metadata_directive(Some("replace")).is_err(), "S3's values are upper case");
    }

    #[test]
    fn tag_sets_follow_s3s_rules() {
        let tags = |pairs: &[(&str, &str)]| {
            check_tags(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
        };
        let ok = tags(&[("project", "blob gate"), ("path", "a/b.c_d-e+f=g:h@i"), ("empty", ""), ("ünï", "çödé")]);
        assert_eq!(ok.unwrap().len(), 4);
        assert_eq!(tags(&[]), Ok(Tags::new()));
        let ten: Vec<(String, String)> = (0..10).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(check_tags(ten.clone()).is_ok());
        let mut eleven = ten;
        eleven.push(("k10".into(), String::new()));
        let code = |r: Result<Tags, RequestError>| r.unwrap_err().code();
        assert_eq!(code(check_tags(eleven)), "InvalidTag");
        assert_eq!(code(tags(&[("a", "1"), ("a", "2")])), "InvalidTag", "a repeated key");
        assert_eq!(code(tags(&[("", "v")])), "InvalidTag", "an empty key");
        assert_eq!(code(tags(&[("aws:createdBy", "v")])), "InvalidTag", "the reserved prefix");
        for bad in ["a*b", "a,b", "a\tb", "a&b", "<x>", "a\"b", "tab\there"] {
            assert_eq!(code(tags(&[(bad, "v")])), "InvalidTag", "key {bad:?}");
            assert_eq!(code(tags(&[("k", bad)])), "InvalidTag", "value {bad:?}");
        }
        assert!(tags(&[(&"k".repeat(128), &"v".repeat(256))]).is_ok());
        assert!(tags(&[(&"é".repeat(128), "v")]).is_ok(), "characters, not bytes");
        assert_eq!(code(tags(&[(&"k".repeat(129), "v")])), "InvalidTag");
        assert_eq!(code(tags(&[("k", &"v".repeat(257))])), "InvalidTag");
    }

    #[test]
    fn tagging_headers_and_bodies() {
        let want: Tags = [("a b".to_owned(), "1+2".to_owned()), ("c".to_owned(), String::new())].into();
        assert_eq!(parse_tagging_header("a%20b=1%2B2&c="), Ok(want.clone()));
        assert_eq!(parse_tagging_header("a+b=1%2B2&c"), Ok(want.clone()), "+ is a space; no = is an empty value");
        assert_eq!(parse_tagging_header(""), Ok(Tags::new()));
        assert_eq!(parse_tagging_header("a=1&a=2").unwrap_err().code(), "InvalidTag");
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
            <Tagging xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><TagSet>
              <Tag><Key>a b</Key><Value>1+2</Value></Tag><Tag><Key>c</Key><Value></Value></Tag>
            </TagSet></Tagging>"#;
        assert_eq!(parse_tagging(body), Ok(want));
        assert_eq!(parse_tagging(b"<Tagging><TagSet/></Tagging>"), Ok(Tags::new()));
        assert_eq!(
            parse_tagging(b"<Tagging><TagSet><Tag><Key>a&amp;b</Key></Tag></TagSet></Tagging>").unwrap_err().code(),
            "InvalidTag"
        );
        assert_eq!(parse_tagging(b"<Tagging>").unwrap_err().code(), "MalformedXML");
        assert_eq!(parse_tagging(b"<Tagging></Tagging>").unwrap_err().code(), "MalformedXML", "no TagSet");
        assert_eq!(parse_tagging(&vec![b' '; MAX_TAGGING_BODY + 1]).unwrap_err().code(), "MaxMessageLengthExceeded");
        assert_eq!(parse_tagging_directive(None), Ok(false));
        assert_eq!(parse_tagging_directive(Some("REPLACE")), Ok(true));
        assert!(parse_tagging_directive(Some("MERGE")).is_err());
    }

    proptest! {
        #[test]
        fn tagging_headers_round_trip(pairs in proptest::collection::btree_map("[a-zA-Z0-9 +=._:/@-]{1,20}", "[a-zA-Z0-9 +=._:/@-]{0,20}", 0..10)) {
            let header: String = form_urlencoded::Serializer::new(String::new()).extend_pairs(&pairs).finish();
            prop_assume!(!pairs.keys().any(|k| k.starts_with("aws:")));
            prop_assert_eq!(parse_tagging_header(&header), Ok(pairs));
        }

        #[test]
        fn copy_source_ranges_agree_with_their_bounds(size in 0u64..1 << 40, a in 0u64..1 << 41, b in 0u64..1 << 41) {
            let parsed = parse_copy_source_range(&format!("bytes={a}-{b}"), size);
            if a <= b && b < size {
                prop_assert_eq!(parsed, Ok((a, b - a + 1)));
            } else {
                prop_assert!(parsed.is_err());
            }
        }

        #[test]
        fn any_valid_key_survives_a_copy_source_round_trip(key in "[a-zA-Z0-9 %+?#&=/é~._-]{1,60}") {
            prop_assume!(crate::names::ObjectKey::parse(&key).is_ok());
            let encoded: String = percent_encoding::utf8_percent_encode(&key, percent_encoding::NON_ALPHANUMERIC)
                .to_string()
                .replace("%2F", "/");
            let (bucket, parsed) = parse_copy_source(&format!("/bkt/{encoded}")).unwrap();
            prop_assert_eq!(bucket.as_str(), "bkt");
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }
    }

    #[test]
    fn v2_parameters() {
        let token = continuation_token("dir/a b+c");
        let q = format!(
            "list-type=2&prefix=dir%2F&delimiter=%2F&max-keys=5000&encoding-type=url&fetch-owner=true\
             &start-after=x&continuation-token={token}&marker=ignored"
        );
        let p = ListParams::from_query(ListVersion::V2, &q).unwrap();
        assert_eq!((p.prefix.as_str(), p.delimiter.as_deref(), p.max_keys), ("dir/", Some("/"), 1000), "capped");
        assert!(p.url_encoded && p.fetch_owner);
        assert_eq!(p.start_after.as_deref(), Some("x"));
        assert_eq!(p.continuation_token.as_deref(), Some(token.as_str()));
        assert_eq!(p.marker, None, "V1's marker means nothing to V2");
        assert_eq!(p.query().after.as_deref(), Some("dir/a b+c"), "the token wins over start-after");

        let p = ListParams::from_query(ListVersion::V2, "list-type=2&start-after=k&max-keys=0&delimiter=").unwrap();
        assert_eq!((p.query().after.as_deref(), p.max_keys, p.delimiter), (Some("k"), 0, None));
        let p = ListParams::from_query(ListVersion::V2, "list-type=2").unwrap();
        assert_eq!(p.max_keys, 1000, "the default");
    }

    #[test]
    fn v1_parameters() {
        let p = ListParams::from_query(ListVersion::V1, "marker=m%2B1&start-after=no&fetch-owner=true").unwrap();
        assert_eq!((p.marker.as_deref(), p.start_after.as_deref(), p.fetch_owner), (Some("m+1"), None, false));
        assert_eq!(p.query().after.as_deref(), Some("m+1"));
    }

    #[test]
    fn bad_list_parameters_are_invalid_arguments() {
        for q in [
            "max-keys=-1",
            "max-keys=ten",
            "encoding-type=base64",
            "continuation-token=%%%",
            "continuation-token=",
            "continuation-token=_w",
            "prefix=%01",
        ] {
            let err = ListParams::from_query(ListVersion::V2, q).unwrap_err();
            assert_eq!(err.code(), "InvalidArgument", "{q}: {err}");
        }
        assert!(ListParams::from_query(ListVersion::V2, "prefix=%01&encoding-type=url").is_ok());
    }

    #[test]
    fn list_parts_and_uploads_parameters() {
        let p = ListPartsParams::from_query("uploadId=u&max-parts=5000&part-number-marker=7").unwrap();
        assert_eq!(p, ListPartsParams { max_parts: 1000, part_number_marker: 7 });
        assert_eq!(ListPartsParams::from_query("uploadId=u").unwrap().max_parts, 1000);
        for q in ["max-parts=-1", "part-number-marker=x", "part-number-marker=-2"] {
            assert_eq!(ListPartsParams::from_query(q).unwrap_err().code(), "InvalidArgument", "{q}");
        }
        let p = ListUploadsParams::from_query(
            "uploads&prefix=a%2F&delimiter=%2F&key-marker=a%2Fk&upload-id-marker=u1&max-uploads=3&encoding-type=url",
        )
        .unwrap();
        assert_eq!(
            (p.prefix.as_str(), p.delimiter.as_deref(), p.key_marker.as_deref(), p.upload_id_marker.as_deref()),
            ("a/", Some("/"), Some("a/k"), Some("u1"))
        );
        assert!(p.url_encoded && p.max_uploads == 3);
        let p = ListUploadsParams::from_query("uploads&upload-id-marker=u1").unwrap();
        assert_eq!((p.upload_id_marker, p.max_uploads), (None, 1000), "an upload id marker needs a key marker");
        assert_eq!(ListUploadsParams::from_query("max-uploads=no").unwrap_err().code(), "InvalidArgument");
    }

    proptest! {
        #[test]
        fn continuation_tokens_round_trip(key in "\\PC{1,100}") {
            let token = continuation_token(&key);
            prop_assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
            prop_assert_eq!(decode_continuation_token(&token).unwrap(), key);
        }
    }

    #[test]
    fn complete_multipart_upload_parts_in_order() {
        let body = br#"<?xml version="1.0" encoding="UTF-8"?>
            <CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
              <Part><ETag>"aa"</ETag><PartNumber>1</PartNumber><ChecksumCRC32>AAAAAA==</ChecksumCRC32></Part>
              <Part><PartNumber>3</PartNumber><ETag>&quot;bb&quot;</ETag></Part>
              <Part><PartNumber> 7 </PartNumber><ETag>cc</ETag></Part>
            </CompleteMultipartUpload>"#;
        let parts = parse_complete_multipart_upload(body).unwrap();
        let want = [(1, "\"aa\""), (3, "\"bb\""), (7, "\"cc\"")];
        assert_eq!(parts.iter().map(|p| (p.part_number, p.etag.as_str())).collect::<Vec<_>>(), want);
    }

    #[test]
    fn bad_complete_multipart_upload_bodies() {
        let part = |n: &str| format!("<Part><PartNumber>{n}</PartNumber><ETag>\"e\"</ETag></Part>");
        let doc = |parts: &str| format!("<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>");
        let cases = [
            (doc(&(part("2") + &part("1"))), "InvalidPartOrder"),
            (doc(&(part("1") + &part("1"))), "InvalidPartOrder"),
            (doc(&part("0")), "InvalidArgument"),
            (doc(&part("10001")), "InvalidArgument"),
            (doc(&part("x")), "InvalidArgument"),
            (doc(""), "MalformedXML"),
            (doc("<Part><PartNumber>1</PartNumber></Part>"), "MalformedXML"),
            (doc("<Part><PartNumber>1</PartNumber><ETag></ETag></Part>"), "MalformedXML"),
            ("<CompleteMultipartUpload><Part>".to_owned(), "MalformedXML"),
            ("not xml at all".to_owned(), "MalformedXML"),
            (doc("<Part><PartNumber>1</PartNumber><ETag>&bomb;</ETag></Part>"), "MalformedXML"),
        ];
        for (body, code) in cases {
            let err = parse_complete_multipart_upload(body.as_bytes()).unwrap_err();
            assert_eq!(err.code(), code, "{body}: {err}");
        }
        let huge = doc(&part("1").repeat(MAX_COMPLETE_BODY / 40));
        let err = parse_complete_multipart_upload(huge.as_bytes()).unwrap_err();
        assert_eq!(err, RequestError::TooLarge { limit: MAX_COMPLETE_BODY });
        assert_eq!(err.code(), "MaxMessageLengthExceeded");
        assert_eq!(parse_complete_multipart_upload(b"\xff\xfe").unwrap_err().code(), "MalformedXML");
    }

    #[test]
    fn delete_bodies() {
        let body = br#"<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Quiet>true</Quiet>
            <Object><Key>a &amp; b</Key></Object><Object><Key>dir/c</Key><VersionId>v</VersionId></Object></Delete>"#;
        let req = parse_delete(body).unwrap();
        let target = |key: &str, etag: Option<&str>| DeleteTarget { key: key.into(), etag: etag.map(Into::into) };
        assert_eq!(req, DeleteRequest { quiet: true, objects: vec![target("a & b", None), target("dir/c", None)] });
        let req = parse_delete(b"<Delete><Object><Key>k</Key><ETag>\"abc\"</ETag></Object></Delete>").unwrap();
        assert_eq!(req.objects, [target("k", Some("\"abc\""))], "a conditional delete's ETag");
        let req = parse_delete(b"<Delete><Object><Key>k</Key></Object></Delete>").unwrap();
        assert!(!req.quiet);
        let req = parse_delete(b"<Delete><Object><Key> spaced\t </Key></Object></Delete>").unwrap();
        assert_eq!(req.objects[0].key, " spaced\t ", "a key is taken as written, spaces and all");

        let object = "<Object><Key>k</Key></Object>";
        for body in [
            "<Delete></Delete>".to_owned(),
            format!("<Delete>{}</Delete>", object.repeat(MAX_DELETE_KEYS + 1)),
            format!("<Delete><Quiet>maybe</Quiet>{object}</Delete>"),
            "<Delete><Object></Object></Delete>".to_owned(),
            "<Delete><Object><Key>k</Key></Object>".to_owned(),
        ] {
            assert_eq!(parse_delete(body.as_bytes()).unwrap_err().code(), "MalformedXML", "{body}");
        }
        let at_cap = format!("<Delete>{}</Delete>", object.repeat(MAX_DELETE_KEYS));
        assert_eq!(parse_delete(at_cap.as_bytes()).unwrap().objects.len(), MAX_DELETE_KEYS);
    }

    #[test]
    fn if_match_tags_are_quoted_for_the_store() {
        assert_eq!(parse_if_match("\"abc\"").as_deref(), Ok("\"abc\""));
        assert_eq!(parse_if_match(" abc ").as_deref(), Ok("\"abc\""), "S3 takes an unquoted ETag too");
        assert_eq!(parse_if_match("*").as_deref(), Ok("*"));
        assert_eq!(parse_if_match("W/\"abc\"").as_deref(), Ok("W/\"abc\""), "weak, kept to fail");
        for bad in ["", "\"\"", "a\"b"] {
            assert_eq!(parse_if_match(bad).unwrap_err().code(), "InvalidArgument", "{bad:?}");
        }
    }
}
