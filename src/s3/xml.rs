//! The XML documents S3 answers with, written from plain values (serde structs, serialized by quick-xml, which
//! escapes text). Each function returns the whole body, with the XML declaration.
//!
//! `encoding-type=url` URL-encodes exactly the elements S3 does: in ListObjectsV2 `Key`, `Prefix` (also inside
//! `CommonPrefixes`), `Delimiter` and `StartAfter`; in ListObjects V1 `Key`, `CommonPrefixes`' `Prefix`,
//! `Delimiter`, `Marker` and `NextMarker` (its own `Prefix` is echoed as given, as S3 and botocore have it); in ListMultipartUploads `Key`, `Prefix`, `Delimiter`, `KeyMarker` and `NextKeyMarker`. The V2
//! `ContinuationToken` and `NextContinuationToken` are opaque (base64url, nothing to encode).

use serde::Serialize;

use crate::header_values::checksum::{ChecksumAlgorithm, ChecksumType, ObjectChecksum};

use super::listing::{Entry, Keyed, Listed, Page, UploadMarker};
use super::request::{ListParams, continuation_token};
use super::{STORAGE_CLASS, XMLNS, iso8601_millis, url_encode};

/// The owner S3 names in listings (we have one per gateway: the caller chooses what to show).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    #[serde(rename = "ID")]
    pub id: String,
    #[serde(rename = "DisplayName")]
    pub display_name: String,
}

/// An object as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    pub key: String,
    /// Unix seconds.
    pub last_modified: i64,
    /// Quoted, as the object's GET sends it.
    pub etag: String,
    pub size: u64,
}

impl Keyed for ListedObject {
    fn key(&self) -> &str {
        &self.key
    }
}

impl Listed for ListedObject {
    type Marker = String;
    fn marker(&self) -> String {
        self.key.clone()
    }
}

/// A bucket as ListBuckets shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedBucket {
    pub name: String,
    /// Unix seconds.
    pub created_at: i64,
}

const XML_DECLARATION: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

fn document<T: Serialize>(root: &str, value: &T) -> String {
    let mut out = String::from(XML_DECLARATION);
    let mut serializer = quick_xml::se::Serializer::with_root(&mut out, Some(root)).expect("a valid root name");
    // `<Prefix></Prefix>` rather than `<Prefix/>`, as S3 writes it.
    serializer.expand_empty_elements(true);
    value.serialize(serializer).expect("plain structs serialize");
    out
}

/// `value`, URL-encoded when the request asked for `encoding-type=url`.
fn encoded(value: &str, url_encoded: bool) -> String {
    if url_encoded { url_encode(value) } else { value.to_owned() }
}

#[derive(Serialize)]
struct ListAllMyBucketsResult<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Owner")]
    owner: &'a Owner,
    #[serde(rename = "Buckets")]
    buckets: BucketList,
    /// The next page's token, when more buckets follow.
    #[serde(rename = "ContinuationToken", skip_serializing_if = "Option::is_none")]
    continuation_token: Option<&'a str>,
    #[serde(rename = "Prefix", skip_serializing_if = "Option::is_none")]
    prefix: Option<&'a str>,
}

#[derive(Serialize)]
struct BucketList {
    #[serde(rename = "Bucket")]
    bucket: Vec<BucketXml>,
}

#[derive(Serialize)]
struct BucketXml {
    #[serde(rename = "Name")]
    name: String,
    #[serde(rename = "CreationDate")]
    creation_date: String,
}

/// ListBuckets: `ListAllMyBucketsResult`, with the next page's `ContinuationToken` and the `Prefix` asked for.
#[must_use]
pub fn list_buckets(
    owner: &Owner,
    buckets: &[ListedBucket],
    continuation_token: Option<&str>,
    prefix: Option<&str>,
) -> String {
    let bucket = buckets
        .iter()
        .map(|b| BucketXml { name: b.name.clone(), creation_date: iso8601_millis(b.created_at) })
        .collect();
    let result =
        ListAllMyBucketsResult { xmlns: XMLNS, owner, buckets: BucketList { bucket }, continuation_token, prefix };
    document("ListAllMyBucketsResult", &result)
}

#[derive(Serialize)]
struct ContentsXml<'a> {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "LastModified")]
    last_modified: String,
    #[serde(rename = "ETag")]
    etag: &'a str,
    #[serde(rename = "Size")]
    size: u64,
    #[serde(rename = "Owner", skip_serializing_if = "Option::is_none")]
    owner: Option<&'a Owner>,
    #[serde(rename = "StorageClass")]
    storage_class: &'static str,
}

#[derive(Serialize)]
struct CommonPrefixXml {
    #[serde(rename = "Prefix")]
    prefix: String,
}

/// The `Contents` and `CommonPrefixes` of a page.
fn entries<'a>(
    page: &'a Page<ListedObject>,
    owner: Option<&'a Owner>,
    url_encoded: bool,
) -> (Vec<ContentsXml<'a>>, Vec<CommonPrefixXml>) {
    let (mut contents, mut prefixes) = (Vec::new(), Vec::new());
    for entry in &page.entries {
        match entry {
            Entry::Object(o) => contents.push(ContentsXml {
                key: encoded(&o.key, url_encoded),
                last_modified: iso8601_millis(o.last_modified),
                etag: &o.etag,
                size: o.size,
                owner,
                storage_class: STORAGE_CLASS,
            }),
            Entry::CommonPrefix(p) => prefixes.push(CommonPrefixXml { prefix: encoded(p, url_encoded) }),
        }
    }
    (contents, prefixes)
}

#[derive(Serialize)]
struct ListBucketResultV2<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Prefix")]
    prefix: String,
    #[serde(rename = "Delimiter", skip_serializing_if = "Option::is_none")]
    delimiter: Option<String>,
    #[serde(rename = "MaxKeys")]
    max_keys: u32,
    #[serde(rename = "EncodingType", skip_serializing_if = "Option::is_none")]
    encoding_type: Option<&'static str>,
    #[serde(rename = "KeyCount")]
    key_count: usize,
    #[serde(rename = "IsTruncated")]
    is_truncated: bool,
    #[serde(rename = "ContinuationToken", skip_serializing_if = "Option::is_none")]
    continuation_token: Option<&'a str>,
    #[serde(rename = "NextContinuationToken", skip_serializing_if = "Option::is_none")]
    next_continuation_token: Option<String>,
    #[serde(rename = "StartAfter", skip_serializing_if = "Option::is_none")]
    start_after: Option<String>,
    #[serde(rename = "Contents")]
    contents: Vec<ContentsXml<'a>>,
    #[serde(rename = "CommonPrefixes")]
    common_prefixes: Vec<CommonPrefixXml>,
}

/// ListObjectsV2: `ListBucketResult`. `KeyCount` counts objects and common prefixes, as S3 does; `owner` is
/// listed with each object only for `fetch-owner=true`.
#[must_use]
pub fn list_objects_v2(bucket: &str, params: &ListParams, page: &Page<ListedObject>, owner: &Owner) -> String {
    let url = params.url_encoded;
    let (contents, common_prefixes) = entries(page, params.fetch_owner.then_some(owner), url);
    document(
        "ListBucketResult",
        &ListBucketResultV2 {
            xmlns: XMLNS,
            name: bucket,
            prefix: encoded(&params.prefix, url),
            delimiter: params.delimiter.as_deref().map(|d| encoded(d, url)),
            max_keys: params.max_keys,
            encoding_type: url.then_some("url"),
            key_count: page.entries.len(),
            is_truncated: page.is_truncated,
            continuation_token: params.continuation_token.as_deref(),
            next_continuation_token: page.next_marker().map(continuation_token),
            start_after: params.start_after.as_deref().map(|s| encoded(s, url)),
            contents,
            common_prefixes,
        },
    )
}

#[derive(Serialize)]
struct ListBucketResultV1<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Name")]
    name: &'a str,
    #[serde(rename = "Prefix")]
    prefix: String,
    #[serde(rename = "Marker")]
    marker: String,
    #[serde(rename = "MaxKeys")]
    max_keys: u32,
    #[serde(rename = "Delimiter", skip_serializing_if = "Option::is_none")]
    delimiter: Option<String>,
    #[serde(rename = "EncodingType", skip_serializing_if = "Option::is_none")]
    encoding_type: Option<&'static str>,
    #[serde(rename = "IsTruncated")]
    is_truncated: bool,
    #[serde(rename = "NextMarker", skip_serializing_if = "Option::is_none")]
    next_marker: Option<String>,
    #[serde(rename = "Contents")]
    contents: Vec<ContentsXml<'a>>,
    #[serde(rename = "CommonPrefixes")]
    common_prefixes: Vec<CommonPrefixXml>,
}

/// ListObjects V1: `ListBucketResult` with `Marker`, and `NextMarker` only when a delimiter was given (as S3
/// does: without one, clients continue after the last key). V1 lists every object's owner.
#[must_use]
pub fn list_objects_v1(bucket: &str, params: &ListParams, page: &Page<ListedObject>, owner: &Owner) -> String {
    let url = params.url_encoded;
    let (contents, common_prefixes) = entries(page, Some(owner), url);
    let next_marker = page.next_marker().filter(|_| params.delimiter.is_some()).map(|m| encoded(m, url));
    document(
        "ListBucketResult",
        &ListBucketResultV1 {
            xmlns: XMLNS,
            name: bucket,
            // As given, whatever `encoding-type` (S3 does so; botocore, which adds `encoding-type=url` to every
            // list call, decodes V1's other elements but not this one).
            prefix: params.prefix.clone(),
            marker: encoded(params.marker.as_deref().unwrap_or_default(), url),
            max_keys: params.max_keys,
            delimiter: params.delimiter.as_deref().map(|d| encoded(d, url)),
            encoding_type: url.then_some("url"),
            is_truncated: page.is_truncated,
            next_marker,
            contents,
            common_prefixes,
        },
    )
}

#[derive(Serialize)]
struct LocationConstraint<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "$text")]
    region: &'a str,
}

/// GetBucketLocation: `LocationConstraint`, empty for `us-east-1` (as S3 answers for that region).
#[must_use]
pub fn location_constraint(region: &str) -> String {
    let region = if region == "us-east-1" { "" } else { region };
    document("LocationConstraint", &LocationConstraint { xmlns: XMLNS, region })
}

#[derive(Serialize)]
struct ErrorXml<'a> {
    #[serde(rename = "Code")]
    code: &'a str,
    #[serde(rename = "Message")]
    message: &'a str,
    #[serde(rename = "Resource")]
    resource: &'a str,
    #[serde(rename = "RequestId")]
    request_id: &'a str,
}

/// An S3 error document: `<Error><Code/><Message/><Resource/><RequestId/></Error>` (no namespace, as S3 sends).
#[must_use]
pub fn error(code: &str, message: &str, resource: &str, request_id: &str) -> String {
    document("Error", &ErrorXml { code, message, resource, request_id })
}

#[derive(Serialize)]
struct InitiateXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Bucket")]
    bucket: &'a str,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "UploadId")]
    upload_id: &'a str,
}

/// CreateMultipartUpload: `InitiateMultipartUploadResult`.
#[must_use]
pub fn initiate_multipart_upload(bucket: &str, key: &str, upload_id: &str) -> String {
    document("InitiateMultipartUploadResult", &InitiateXml { xmlns: XMLNS, bucket, key, upload_id })
}

#[derive(Serialize)]
struct CompleteXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Location")]
    location: &'a str,
    #[serde(rename = "Bucket")]
    bucket: &'a str,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "ETag")]
    etag: &'a str,
    #[serde(flatten)]
    checksums: Checksums,
}

/// CompleteMultipartUpload: `CompleteMultipartUploadResult`; `location` is the object's URL, `etag` quoted, and
/// the object's checksum when its upload asked for one.
#[must_use]
pub fn complete_multipart_upload(
    location: &str,
    bucket: &str,
    key: &str,
    etag: &str,
    checksum: Option<&ObjectChecksum>,
) -> String {
    let checksums = Checksums::of(checksum.into_iter());
    let xml = CompleteXml { xmlns: XMLNS, location, bucket, key, etag, checksums };
    document("CompleteMultipartUploadResult", &xml)
}

/// S3's checksum elements (`ChecksumCRC32`, …, `ChecksumType`): GetObjectAttributes' `Checksum`, and the fields of
/// Complete's result and of a listed part.
#[derive(Debug, Default, Serialize)]
pub struct Checksums {
    #[serde(rename = "ChecksumCRC32", skip_serializing_if = "Option::is_none")]
    crc32: Option<String>,
    #[serde(rename = "ChecksumCRC32C", skip_serializing_if = "Option::is_none")]
    crc32c: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME", skip_serializing_if = "Option::is_none")]
    crc64nvme: Option<String>,
    #[serde(rename = "ChecksumSHA1", skip_serializing_if = "Option::is_none")]
    sha1: Option<String>,
    #[serde(rename = "ChecksumSHA256", skip_serializing_if = "Option::is_none")]
    sha256: Option<String>,
    #[serde(rename = "ChecksumType", skip_serializing_if = "Option::is_none")]
    checksum_type: Option<&'static str>,
}

impl Checksums {
    /// One element per algorithm (the first checksum of each), typed by the first.
    pub fn of<'c>(checksums: impl Iterator<Item = &'c ObjectChecksum>) -> Self {
        let mut out = Checksums::default();
        for c in checksums {
            out.checksum_type.get_or_insert(c.kind.name());
            let slot = match c.algorithm {
                ChecksumAlgorithm::Crc32 => &mut out.crc32,
                ChecksumAlgorithm::Crc32c => &mut out.crc32c,
                ChecksumAlgorithm::Crc64Nvme => &mut out.crc64nvme,
                ChecksumAlgorithm::Sha1 => &mut out.sha1,
                ChecksumAlgorithm::Sha256 => &mut out.sha256,
            };
            slot.get_or_insert_with(|| c.value());
        }
        out
    }
}

/// GetObjectAttributes: what the request's `x-amz-object-attributes` asked for.
#[derive(Debug, Default)]
pub struct ObjectAttributes {
    /// Unquoted, as S3 writes it here.
    pub etag: Option<String>,
    pub checksum: Option<Checksums>,
    /// (the number of parts, the listed parts' numbers and sizes).
    pub parts: Option<(u32, Vec<(u32, u64)>)>,
    pub storage_class: bool,
    pub size: Option<u64>,
}

#[derive(Serialize)]
struct AttributesXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "ETag", skip_serializing_if = "Option::is_none")]
    etag: Option<&'a str>,
    #[serde(rename = "Checksum", skip_serializing_if = "Option::is_none")]
    checksum: Option<&'a Checksums>,
    #[serde(rename = "ObjectParts", skip_serializing_if = "Option::is_none")]
    parts: Option<ObjectPartsXml>,
    #[serde(rename = "StorageClass", skip_serializing_if = "Option::is_none")]
    storage_class: Option<&'static str>,
    #[serde(rename = "ObjectSize", skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
}

#[derive(Serialize)]
struct ObjectPartsXml {
    /// botocore's `TotalPartsCount`.
    #[serde(rename = "PartsCount")]
    total: u32,
    #[serde(rename = "PartNumberMarker")]
    marker: u32,
    #[serde(rename = "MaxParts")]
    max_parts: u32,
    #[serde(rename = "IsTruncated")]
    is_truncated: bool,
    #[serde(rename = "Part")]
    parts: Vec<ObjectPartXml>,
}

#[derive(Serialize)]
struct ObjectPartXml {
    #[serde(rename = "PartNumber")]
    number: u32,
    #[serde(rename = "Size")]
    size: u64,
}

/// GetObjectAttributes: `GetObjectAttributesResponse` with the elements asked for.
#[must_use]
pub fn object_attributes(attributes: &ObjectAttributes) -> String {
    let parts = attributes.parts.as_ref().map(|(total, parts)| ObjectPartsXml {
        total: *total,
        marker: 0,
        max_parts: 1000,
        is_truncated: false,
        parts: parts.iter().map(|&(number, size)| ObjectPartXml { number, size }).collect(),
    });
    let xml = AttributesXml {
        xmlns: XMLNS,
        etag: attributes.etag.as_deref(),
        checksum: attributes.checksum.as_ref(),
        parts,
        storage_class: attributes.storage_class.then_some(STORAGE_CLASS),
        size: attributes.size,
    };
    document("GetObjectAttributesResponse", &xml)
}

#[derive(Serialize)]
struct TaggingXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "TagSet")]
    tag_set: TagSetXml<'a>,
}

#[derive(Serialize)]
struct TagSetXml<'a> {
    #[serde(rename = "Tag")]
    tags: Vec<TagXml<'a>>,
}

#[derive(Serialize)]
struct TagXml<'a> {
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "Value")]
    value: &'a str,
}

/// GetObjectTagging: `Tagging` with the object's `TagSet` (empty when it has no tags).
#[must_use]
pub fn tagging(tags: &crate::names::Tags) -> String {
    let tags = tags.iter().map(|(key, value)| TagXml { key, value }).collect();
    document("Tagging", &TaggingXml { xmlns: XMLNS, tag_set: TagSetXml { tags } })
}

#[derive(Serialize)]
struct VersioningXml {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
}

/// GetBucketVersioning of a bucket that has never had versioning: an empty `VersioningConfiguration`.
#[must_use]
pub fn versioning_never_enabled() -> String {
    document("VersioningConfiguration", &VersioningXml { xmlns: XMLNS })
}

#[derive(Serialize)]
struct AccessControlPolicyXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Owner")]
    owner: &'a Owner,
    #[serde(rename = "AccessControlList")]
    list: AccessControlListXml<'a>,
}

#[derive(Serialize)]
struct AccessControlListXml<'a> {
    #[serde(rename = "Grant")]
    grant: GrantXml<'a>,
}

#[derive(Serialize)]
struct GrantXml<'a> {
    #[serde(rename = "Grantee")]
    grantee: GranteeXml<'a>,
    #[serde(rename = "Permission")]
    permission: &'static str,
}

#[derive(Serialize)]
struct GranteeXml<'a> {
    #[serde(rename = "@xmlns:xsi")]
    xmlns_xsi: &'static str,
    #[serde(rename = "@xsi:type")]
    kind: &'static str,
    #[serde(rename = "ID")]
    id: &'a str,
    #[serde(rename = "DisplayName")]
    display_name: &'a str,
}

/// GetBucketAcl and GetObjectAcl: the owner, with FULL_CONTROL. Access is decided by credentials' grants, not
/// ACLs; this is what S3 answers for a bucket or object with ACLs disabled (BucketOwnerEnforced).
#[must_use]
pub fn owner_full_control(owner: &Owner) -> String {
    let grantee = GranteeXml {
        xmlns_xsi: "http://www.w3.org/2001/XMLSchema-instance",
        kind: "CanonicalUser",
        id: &owner.id,
        display_name: &owner.display_name,
    };
    let list = AccessControlListXml { grant: GrantXml { grantee, permission: "FULL_CONTROL" } };
    document("AccessControlPolicy", &AccessControlPolicyXml { xmlns: XMLNS, owner, list })
}

/// One CORS rule as GetBucketCors shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorsRuleView<'a> {
    pub origins: &'a [String],
    pub methods: &'a [&'a str],
    pub allowed_headers: &'a [&'a str],
    pub expose_headers: Vec<&'a str>,
    pub max_age: Option<u32>,
}

#[derive(Serialize)]
struct CorsConfigurationXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "CORSRule")]
    rule: CorsRuleXml<'a>,
}

#[derive(Serialize)]
struct CorsRuleXml<'a> {
    #[serde(rename = "AllowedHeader")]
    allowed_headers: &'a [&'a str],
    #[serde(rename = "AllowedMethod")]
    methods: &'a [&'a str],
    #[serde(rename = "AllowedOrigin")]
    origins: &'a [String],
    #[serde(rename = "ExposeHeader")]
    expose_headers: &'a [&'a str],
    #[serde(rename = "MaxAgeSeconds", skip_serializing_if = "Option::is_none")]
    max_age: Option<u32>,
}

/// GetBucketCors: the bucket's one rule as a `CORSConfiguration`.
#[must_use]
pub fn cors_configuration(rule: &CorsRuleView<'_>) -> String {
    let rule = CorsRuleXml {
        allowed_headers: rule.allowed_headers,
        methods: rule.methods,
        origins: rule.origins,
        expose_headers: &rule.expose_headers,
        max_age: rule.max_age,
    };
    document("CORSConfiguration", &CorsConfigurationXml { xmlns: XMLNS, rule })
}

#[derive(Serialize)]
struct CopyResultXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "LastModified")]
    last_modified: String,
    #[serde(rename = "ETag")]
    etag: &'a str,
}

/// CopyObject's `CopyObjectResult` and UploadPartCopy's `CopyPartResult` (`root`): the new object's or part's
/// ETag (quoted) and Last-Modified (unix seconds).
#[must_use]
pub fn copy_result(root: CopyResult, etag: &str, last_modified: i64) -> String {
    let root = match root {
        CopyResult::Object => "CopyObjectResult",
        CopyResult::Part => "CopyPartResult",
    };
    document(root, &CopyResultXml { xmlns: XMLNS, last_modified: iso8601_millis(last_modified), etag })
}

/// Which copy answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyResult {
    Object,
    Part,
}

/// A part as ListParts shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedPart {
    pub part_number: u32,
    /// Unix seconds.
    pub last_modified: i64,
    /// Quoted.
    pub etag: String,
    pub size: u64,
    pub checksum: Option<ObjectChecksum>,
}

/// One page of ListParts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartsPage {
    pub bucket: String,
    pub key: String,
    pub upload_id: String,
    /// The request's `part-number-marker` (0 when absent).
    pub part_number_marker: u32,
    pub max_parts: u32,
    pub is_truncated: bool,
    pub parts: Vec<ListedPart>,
    /// The upload's checksum algorithm and type, if it asked for one.
    pub checksum: Option<(ChecksumAlgorithm, ChecksumType)>,
}

#[derive(Serialize)]
struct ListPartsXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Bucket")]
    bucket: &'a str,
    #[serde(rename = "Key")]
    key: &'a str,
    #[serde(rename = "UploadId")]
    upload_id: &'a str,
    #[serde(rename = "Initiator")]
    initiator: &'a Owner,
    #[serde(rename = "Owner")]
    owner: &'a Owner,
    #[serde(rename = "StorageClass")]
    storage_class: &'static str,
    #[serde(rename = "PartNumberMarker")]
    part_number_marker: u32,
    #[serde(rename = "NextPartNumberMarker", skip_serializing_if = "Option::is_none")]
    next_part_number_marker: Option<u32>,
    #[serde(rename = "MaxParts")]
    max_parts: u32,
    #[serde(rename = "IsTruncated")]
    is_truncated: bool,
    #[serde(rename = "ChecksumAlgorithm", skip_serializing_if = "Option::is_none")]
    checksum_algorithm: Option<&'static str>,
    #[serde(rename = "ChecksumType", skip_serializing_if = "Option::is_none")]
    checksum_type: Option<&'static str>,
    #[serde(rename = "Part")]
    parts: Vec<PartXml<'a>>,
}

#[derive(Serialize)]
struct PartXml<'a> {
    #[serde(rename = "PartNumber")]
    part_number: u32,
    #[serde(rename = "LastModified")]
    last_modified: String,
    #[serde(rename = "ETag")]
    etag: &'a str,
    #[serde(rename = "Size")]
    size: u64,
    /// A part's checksums, without a type (the upload's is in the result).
    #[serde(flatten)]
    checksums: Checksums,
}

/// ListParts: `ListPartsResult`, with `NextPartNumberMarker` (the last part listed) when truncated.
#[must_use]
pub fn list_parts(page: &PartsPage, owner: &Owner) -> String {
    let parts = page
        .parts
        .iter()
        .map(|p| PartXml {
            part_number: p.part_number,
            last_modified: iso8601_millis(p.last_modified),
            etag: &p.etag,
            size: p.size,
            checksums: Checksums { checksum_type: None, ..Checksums::of(p.checksum.iter()) },
        })
        .collect();
    document(
        "ListPartsResult",
        &ListPartsXml {
            xmlns: XMLNS,
            bucket: &page.bucket,
            key: &page.key,
            upload_id: &page.upload_id,
            initiator: owner,
            owner,
            storage_class: STORAGE_CLASS,
            part_number_marker: page.part_number_marker,
            next_part_number_marker: page.parts.last().map(|p| p.part_number).filter(|_| page.is_truncated),
            max_parts: page.max_parts,
            is_truncated: page.is_truncated,
            checksum_algorithm: page.checksum.map(|(algorithm, _)| algorithm.name()),
            checksum_type: page.checksum.map(|(_, kind)| kind.name()),
            parts,
        },
    )
}

/// An upload in progress as ListMultipartUploads shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedUpload {
    pub key: String,
    pub upload_id: String,
    /// Unix seconds.
    pub initiated: i64,
}

impl Keyed for ListedUpload {
    fn key(&self) -> &str {
        &self.key
    }
}

impl Listed for ListedUpload {
    type Marker = UploadMarker;
    fn marker(&self) -> UploadMarker {
        UploadMarker { key: self.key.clone(), upload_id: Some(self.upload_id.clone()) }
    }
}

/// One page of ListMultipartUploads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UploadsPage {
    pub bucket: String,
    pub prefix: String,
    pub delimiter: Option<String>,
    pub key_marker: Option<String>,
    pub upload_id_marker: Option<String>,
    pub max_uploads: u32,
    pub is_truncated: bool,
    /// When truncated: where the next page starts (`listing::Page::next_marker` and `next_upload_id_marker`).
    pub next_key_marker: Option<String>,
    pub next_upload_id_marker: Option<String>,
    pub uploads: Vec<ListedUpload>,
    pub common_prefixes: Vec<String>,
    pub url_encoded: bool,
}

#[derive(Serialize)]
struct ListUploadsXml<'a> {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Bucket")]
    bucket: &'a str,
    #[serde(rename = "KeyMarker")]
    key_marker: String,
    #[serde(rename = "UploadIdMarker")]
    upload_id_marker: &'a str,
    #[serde(rename = "NextKeyMarker", skip_serializing_if = "Option::is_none")]
    next_key_marker: Option<String>,
    #[serde(rename = "NextUploadIdMarker", skip_serializing_if = "Option::is_none")]
    next_upload_id_marker: Option<&'a str>,
    #[serde(rename = "Prefix")]
    prefix: String,
    #[serde(rename = "Delimiter", skip_serializing_if = "Option::is_none")]
    delimiter: Option<String>,
    #[serde(rename = "MaxUploads")]
    max_uploads: u32,
    #[serde(rename = "EncodingType", skip_serializing_if = "Option::is_none")]
    encoding_type: Option<&'static str>,
    #[serde(rename = "IsTruncated")]
    is_truncated: bool,
    #[serde(rename = "Upload")]
    uploads: Vec<UploadXml<'a>>,
    #[serde(rename = "CommonPrefixes")]
    common_prefixes: Vec<CommonPrefixXml>,
}

#[derive(Serialize)]
struct UploadXml<'a> {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "UploadId")]
    upload_id: &'a str,
    #[serde(rename = "Initiator")]
    initiator: &'a Owner,
    #[serde(rename = "Owner")]
    owner: &'a Owner,
    #[serde(rename = "StorageClass")]
    storage_class: &'static str,
    #[serde(rename = "Initiated")]
    initiated: String,
}

/// ListMultipartUploads: `ListMultipartUploadsResult`, with the next markers when truncated.
#[must_use]
pub fn list_multipart_uploads(page: &UploadsPage, owner: &Owner) -> String {
    let url = page.url_encoded;
    let uploads = page
        .uploads
        .iter()
        .map(|u| UploadXml {
            key: encoded(&u.key, url),
            upload_id: &u.upload_id,
            initiator: owner,
            owner,
            storage_class: STORAGE_CLASS,
            initiated: iso8601_millis(u.initiated),
        })
        .collect();
    document(
        "ListMultipartUploadsResult",
        &ListUploadsXml {
            xmlns: XMLNS,
            bucket: &page.bucket,
            key_marker: encoded(page.key_marker.as_deref().unwrap_or_default(), url),
            upload_id_marker: page.upload_id_marker.as_deref().unwrap_or_default(),
            next_key_marker: page.next_key_marker.as_deref().map(|k| encoded(k, url)),
            next_upload_id_marker: page.next_upload_id_marker.as_deref(),
            prefix: encoded(&page.prefix, url),
            delimiter: page.delimiter.as_deref().map(|d| encoded(d, url)),
            max_uploads: page.max_uploads,
            encoding_type: url.then_some("url"),
            is_truncated: page.is_truncated,
            uploads,
            common_prefixes: page.common_prefixes.iter().map(|p| CommonPrefixXml { prefix: encoded(p, url) }).collect(),
        },
    )
}

/// What DeleteObjects did to one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// Deleted, or there was nothing to delete (S3 reports both as deleted).
    Deleted {
        key: String,
    },
    Failed {
        key: String,
        code: String,
        message: String,
    },
}

#[derive(Serialize)]
struct DeleteResultXml {
    #[serde(rename = "@xmlns")]
    xmlns: &'static str,
    #[serde(rename = "Deleted")]
    deleted: Vec<DeletedXml>,
    #[serde(rename = "Error")]
    errors: Vec<DeleteErrorXml>,
}

#[derive(Serialize)]
struct DeletedXml {
    #[serde(rename = "Key")]
    key: String,
}

#[derive(Serialize)]
struct DeleteErrorXml {
    #[serde(rename = "Key")]
    key: String,
    #[serde(rename = "Code")]
    code: String,
    #[serde(rename = "Message")]
    message: String,
}

/// DeleteObjects: `DeleteResult`. `quiet` leaves out the keys that were deleted.
#[must_use]
pub fn delete_result(outcomes: Vec<DeleteOutcome>, quiet: bool) -> String {
    let (mut deleted, mut errors) = (Vec::new(), Vec::new());
    for outcome in outcomes {
        match outcome {
            DeleteOutcome::Deleted { key } if !quiet => deleted.push(DeletedXml { key }),
            DeleteOutcome::Deleted { .. } => {}
            DeleteOutcome::Failed { key, code, message } => errors.push(DeleteErrorXml { key, code, message }),
        }
    }
    document("DeleteResult", &DeleteResultXml { xmlns: XMLNS, deleted, errors })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::request::ListVersion;

    fn owner() -> Owner {
        Owner { id: "blobgate".into(), display_name: "blobgate".into() }
    }

    fn object(key: &str) -> ListedObject {
        ListedObject { key: key.into(), last_modified: 1_714_564_800, etag: "\"abc\"".into(), size: 42 }
    }

    fn body(xml: &str) -> &str {
        xml.strip_prefix(XML_DECLARATION).expect("every document starts with the XML declaration")
    }

    #[test]
    fn tagging_document_reads_back_as_the_same_tags() {
        let tags: crate::names::Tags =
            [("a b".to_owned(), "x&y<z>".to_owned()), ("empty".to_owned(), String::new())].into();
        let xml = tagging(&tags);
        assert_eq!(
            body(&xml),
            "<Tagging xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><TagSet>\
             <Tag><Key>a b</Key><Value>x&amp;y&lt;z&gt;</Value></Tag><Tag><Key>empty</Key><Value></Value></Tag>\
             </TagSet></Tagging>"
        );
        assert_eq!(crate::s3::request::parse_tagging(xml.as_bytes()).map_err(|e| e.code()), Err("InvalidTag"));
        let plain: crate::names::Tags = [("k".to_owned(), "v 1".to_owned())].into();
        assert_eq!(crate::s3::request::parse_tagging(tagging(&plain).as_bytes()), Ok(plain));
        assert!(body(&tagging(&Default::default())).contains("<TagSet></TagSet>"));
    }

    #[test]
    fn list_buckets_document() {
        let xml = list_buckets(&owner(), &[ListedBucket { name: "b1".into(), created_at: 0 }], None, None);
        assert_eq!(
            body(&xml),
            "<ListAllMyBucketsResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Owner><ID>blobgate</ID><DisplayName>blobgate</DisplayName></Owner>\
             <Buckets><Bucket><Name>b1</Name><CreationDate>1970-01-01T00:00:00.000Z</CreationDate></Bucket></Buckets>\
             </ListAllMyBucketsResult>"
        );
        let empty = list_buckets(&owner(), &[], None, None);
        assert!(body(&empty).contains("<Buckets></Buckets>"), "{empty}");
        let paged = list_buckets(&owner(), &[], Some("YjE"), Some("b"));
        assert!(
            body(&paged)
                .ends_with("<ContinuationToken>YjE</ContinuationToken><Prefix>b</Prefix></ListAllMyBucketsResult>"),
            "{paged}"
        );
    }

    #[test]
    fn list_v2_document_with_every_element() {
        let params = ListParams::from_query(
            ListVersion::V2,
            &format!(
                "list-type=2&prefix=d%2F&delimiter=%2F&max-keys=2&encoding-type=url&fetch-owner=true\
                 &continuation-token={}&start-after=d%2Fa+b",
                continuation_token("d/0")
            ),
        )
        .unwrap();
        let page = Page {
            entries: vec![Entry::Object(object("d/a b&c.txt")), Entry::CommonPrefix("d/sub dir/".into())],
            is_truncated: true,
        };
        let xml = list_objects_v2("bkt", &params, &page, &owner());
        let want = format!(
            "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>bkt</Name>\
             <Prefix>d/</Prefix><Delimiter>/</Delimiter><MaxKeys>2</MaxKeys><EncodingType>url</EncodingType>\
             <KeyCount>2</KeyCount><IsTruncated>true</IsTruncated><ContinuationToken>{}</ContinuationToken>\
             <NextContinuationToken>{}</NextContinuationToken><StartAfter>d/a%20b</StartAfter>\
             <Contents><Key>d/a%20b%26c.txt</Key><LastModified>2024-05-01T12:00:00.000Z</LastModified>\
             <ETag>\"abc\"</ETag><Size>42</Size>\
             <Owner><ID>blobgate</ID><DisplayName>blobgate</DisplayName></Owner>\
             <StorageClass>STANDARD</StorageClass></Contents>\
             <CommonPrefixes><Prefix>d/sub%20dir/</Prefix></CommonPrefixes></ListBucketResult>",
            continuation_token("d/0"),
            continuation_token("d/sub dir/"),
        );
        assert_eq!(body(&xml), want);
    }

    #[test]
    fn list_v2_plain_escapes_xml_and_omits_what_was_not_asked() {
        let params = ListParams::from_query(ListVersion::V2, "list-type=2").unwrap();
        let page = Page { entries: vec![Entry::Object(object("a<&>'\"é"))], is_truncated: false };
        let xml = list_objects_v2("bkt", &params, &page, &owner());
        let b = body(&xml);
        for absent in ["Delimiter", "EncodingType", "ContinuationToken", "StartAfter", "Owner", "CommonPrefixes"] {
            assert!(!b.contains(&format!("<{absent}>")), "{absent} in {b}");
        }
        assert!(b.contains("<Prefix></Prefix>") && b.contains("<KeyCount>1</KeyCount>"), "{b}");
        assert!(b.contains("<IsTruncated>false</IsTruncated>"), "{b}");
        // Read back by an XML parser, the key is the key.
        let mut reader = quick_xml::Reader::from_str(b);
        let mut in_key = false;
        let mut key = String::new();
        loop {
            match reader.read_event().unwrap() {
                quick_xml::events::Event::Start(e) => in_key = e.name().as_ref() == b"Key",
                quick_xml::events::Event::Text(t) if in_key => key.push_str(&t.decode().unwrap()),
                quick_xml::events::Event::GeneralRef(r) if in_key => {
                    let name = r.decode().unwrap();
                    let c = quick_xml::escape::resolve_predefined_entity(&name).unwrap();
                    key.push_str(c);
                }
                quick_xml::events::Event::End(_) => in_key = false,
                quick_xml::events::Event::Eof => break,
                _ => {}
            }
        }
        assert_eq!(key, "a<&>'\"é");
    }

    #[test]
    fn list_v1_next_marker_only_with_a_delimiter() {
        let page = Page { entries: vec![Entry::Object(object("a+b"))], is_truncated: true };
        let plain = ListParams::from_query(ListVersion::V1, "marker=a").unwrap();
        let xml = list_objects_v1("bkt", &plain, &page, &owner());
        let b = body(&xml);
        assert!(b.contains("<Marker>a</Marker>") && b.contains("<IsTruncated>true</IsTruncated>"), "{b}");
        assert!(!b.contains("NextMarker"), "{b}");
        assert!(b.contains("<Owner><ID>blobgate</ID>"), "V1 lists owners: {b}");
        assert!(b.contains("<Key>a+b</Key>"), "not encoded without encoding-type: {b}");

        let with_delimiter = ListParams::from_query(ListVersion::V1, "delimiter=%2F&encoding-type=url").unwrap();
        let xml = list_objects_v1("bkt", &with_delimiter, &page, &owner());
        let b = body(&xml);
        assert!(b.contains("<NextMarker>a%2Bb</NextMarker>") && b.contains("<Marker></Marker>"), "{b}");
        let prefixed = ListParams::from_query(ListVersion::V1, "prefix=a%20b%2B&encoding-type=url").unwrap();
        let b = list_objects_v1("bkt", &prefixed, &page, &owner());
        assert!(body(&b).contains("<Prefix>a b+</Prefix>"), "V1's Prefix is echoed as given: {b}");
        assert!(b.contains("<Key>a%2Bb</Key>") && b.contains("<EncodingType>url</EncodingType>"), "{b}");
    }

    #[test]
    fn location_error_and_multipart_documents() {
        assert_eq!(
            body(&location_constraint("us-east-1")),
            "<LocationConstraint xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"></LocationConstraint>"
        );
        assert!(body(&location_constraint("eu-west-1")).contains(">eu-west-1</LocationConstraint>"));
        assert_eq!(
            body(&error("NoSuchKey", "The specified key does not exist.", "/b/k<1>", "req1")),
            "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message>\
             <Resource>/b/k&lt;1&gt;</Resource><RequestId>req1</RequestId></Error>"
        );
        assert_eq!(
            body(&initiate_multipart_upload("b", "k", "u1")),
            "<InitiateMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Bucket>b</Bucket><Key>k</Key><UploadId>u1</UploadId></InitiateMultipartUploadResult>"
        );
        assert_eq!(
            body(&complete_multipart_upload("http://h/b/k", "b", "k", "\"ab-2\"", None)),
            "<CompleteMultipartUploadResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <Location>http://h/b/k</Location><Bucket>b</Bucket><Key>k</Key><ETag>\"ab-2\"</ETag>\
             </CompleteMultipartUploadResult>"
        );
        let crc = ObjectChecksum::from_column("CRC32 COMPOSITE o8hrCg==-2").unwrap();
        assert!(body(&complete_multipart_upload("http://h/b/k", "b", "k", "\"ab-2\"", Some(&crc))).ends_with(
            "<ETag>\"ab-2\"</ETag><ChecksumCRC32>o8hrCg==-2</ChecksumCRC32><ChecksumType>COMPOSITE</ChecksumType>\
                 </CompleteMultipartUploadResult>"
        ));
        let sha = ObjectChecksum::sha256_hex(&"ab".repeat(32)).unwrap();
        let attributes = ObjectAttributes {
            etag: Some("e".into()),
            checksum: Some(Checksums::of([sha].iter())),
            parts: None,
            storage_class: true,
            size: Some(3),
        };
        assert_eq!(
            body(&object_attributes(&attributes)),
            "<GetObjectAttributesResponse xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><ETag>e</ETag>\
             <Checksum><ChecksumSHA256>q6urq6urq6urq6urq6urq6urq6urq6urq6urq6urq6s=</ChecksumSHA256>\
             <ChecksumType>FULL_OBJECT</ChecksumType></Checksum><StorageClass>STANDARD</StorageClass>\
             <ObjectSize>3</ObjectSize></GetObjectAttributesResponse>"
        );
        assert_eq!(
            body(&copy_result(CopyResult::Object, "\"abc\"", 1_714_564_800)),
            "<CopyObjectResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">\
             <LastModified>2024-05-01T12:00:00.000Z</LastModified><ETag>\"abc\"</ETag></CopyObjectResult>"
        );
        assert!(body(&copy_result(CopyResult::Part, "\"e\"", 0)).starts_with("<CopyPartResult xmlns="));
    }

    #[test]
    fn list_parts_and_uploads_documents() {
        let page = PartsPage {
            bucket: "b".into(),
            key: "k".into(),
            upload_id: "u".into(),
            part_number_marker: 0,
            max_parts: 1,
            is_truncated: true,
            parts: vec![ListedPart { part_number: 3, last_modified: 0, etag: "\"e\"".into(), size: 5, checksum: None }],
            checksum: None,
        };
        let b = list_parts(&page, &owner());
        assert!(b.contains("<PartNumberMarker>0</PartNumberMarker><NextPartNumberMarker>3</NextPartNumberMarker>"));
        assert!(b.contains(
            "<Part><PartNumber>3</PartNumber><LastModified>1970-01-01T00:00:00.000Z</LastModified>\
             <ETag>\"e\"</ETag><Size>5</Size></Part>"
        ));
        let done = list_parts(&PartsPage { is_truncated: false, ..page }, &owner());
        assert!(!done.contains("NextPartNumberMarker"), "{done}");

        let uploads = UploadsPage {
            bucket: "b".into(),
            prefix: "p ".into(),
            max_uploads: 1000,
            is_truncated: true,
            next_key_marker: Some("p k".into()),
            next_upload_id_marker: Some("u1".into()),
            uploads: vec![ListedUpload { key: "p k".into(), upload_id: "u1".into(), initiated: 0 }],
            common_prefixes: vec!["p d/".into()],
            url_encoded: true,
            ..UploadsPage::default()
        };
        let b = list_multipart_uploads(&uploads, &owner());
        for want in [
            "<KeyMarker></KeyMarker><UploadIdMarker></UploadIdMarker>",
            "<NextKeyMarker>p%20k</NextKeyMarker><NextUploadIdMarker>u1</NextUploadIdMarker><Prefix>p%20</Prefix>",
            "<Upload><Key>p%20k</Key><UploadId>u1</UploadId><Initiator>",
            "<Initiated>1970-01-01T00:00:00.000Z</Initiated></Upload><CommonPrefixes><Prefix>p%20d/</Prefix>",
        ] {
            assert!(b.contains(want), "{want} in {b}");
        }
    }

    #[test]
    fn delete_result_document() {
        let outcomes = vec![
            DeleteOutcome::Deleted { key: "a".into() },
            DeleteOutcome::Failed { key: "b".into(), code: "AccessDenied".into(), message: "Access Denied".into() },
        ];
        assert_eq!(
            body(&delete_result(outcomes.clone(), false)),
            "<DeleteResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Deleted><Key>a</Key></Deleted>\
             <Error><Key>b</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error></DeleteResult>"
        );
        let quiet = delete_result(outcomes, true);
        assert!(!quiet.contains("<Deleted>") && quiet.contains("<Error>"), "{quiet}");
    }

    #[test]
    fn probe_answers_are_s3_documents() {
        let owner = Owner { id: "blobgate".into(), display_name: "blobgate".into() };
        assert_eq!(
            versioning_never_enabled(),
            format!("{XML_DECLARATION}<VersioningConfiguration xmlns=\"{XMLNS}\"></VersioningConfiguration>")
        );
        let acl = owner_full_control(&owner);
        assert!(
            acl.contains(
                "<AccessControlList><Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" \
                 xsi:type=\"CanonicalUser\"><ID>blobgate</ID><DisplayName>blobgate</DisplayName></Grantee>\
                 <Permission>FULL_CONTROL</Permission></Grant></AccessControlList>"
            ),
            "{acl}"
        );
        assert!(acl.contains("<Owner><ID>blobgate</ID><DisplayName>blobgate</DisplayName></Owner>"), "{acl}");
        let origins = vec!["https://a.example".to_owned(), "https://b&c.example".to_owned()];
        let rule = CorsRuleView {
            origins: &origins,
            methods: &["GET", "HEAD"],
            allowed_headers: &["range"],
            expose_headers: vec!["ETag"],
            max_age: Some(600),
        };
        assert_eq!(
            cors_configuration(&rule),
            format!(
                "{XML_DECLARATION}<CORSConfiguration xmlns=\"{XMLNS}\"><CORSRule><AllowedHeader>range</AllowedHeader>\
                 <AllowedMethod>GET</AllowedMethod><AllowedMethod>HEAD</AllowedMethod>\
                 <AllowedOrigin>https://a.example</AllowedOrigin><AllowedOrigin>https://b&amp;c.example</AllowedOrigin>\
                 <ExposeHeader>ETag</ExposeHeader><MaxAgeSeconds>600</MaxAgeSeconds></CORSRule></CORSConfiguration>"
            )
        );
        let no_age = CorsRuleView { max_age: None, ..rule };
        assert!(!cors_configuration(&no_age).contains("MaxAgeSeconds"));
    }
}
