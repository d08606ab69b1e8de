//! What a stored object looks like on the wire, computed once per object version and cached with it: the
//! representation headers (RFC 9110 §8) that go on 200, 206 and 304 alike, and the values the handler needs
//! per request. Pure: no IO.

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::file_body::{ObjectRef, SharedFields};
use crate::header_values::checksum::ObjectChecksum;
use crate::header_values::content_coding::{ContentCoding, Variants};
use crate::header_values::disposition::{DispositionKind, content_disposition, repr_digest_sha256};
use crate::header_values::{etag_from_sha256, format_http_date};
use crate::names::{ObjectAttrs, Tags};
use crate::store::{ObjectRecord, VariantRecord, guessed_content_type};

pub static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
static BYTES: HeaderValue = HeaderValue::from_static("bytes");
/// How many tags an object has, on S3 GetObject and HeadObject (boto3 reads it as `TagCount`).
static TAGGING_COUNT: HeaderName = HeaderName::from_static("x-amz-tagging-count");
/// What the allocator adds to an allocation, on average: glibc's 8-byte header and the rounding of a chunk to 16
/// bytes (32 at least), with room for the fragmentation a cache's churn leaves. Calibrated: 10^6 distinct keys read
/// through a 128 MiB cache (`scripts/bench/scale.py`) left the process's anonymous memory within the bound.
const PER_ALLOCATION: usize = 32;
pub static REPR_DIGEST: HeaderName = HeaderName::from_static("repr-digest");

/// A cached object: what its responses need, kept compactly (a few hundred bytes with its prepared fields), since
/// a catalog may hold a million of them. What most objects lack (stored Cache-Control and Content-Disposition,
/// user metadata, tags, parts, an S3 checksum, variants) lives behind one pointer, allocated only when present.
#[derive(Debug)]
pub struct ObjectEntry {
    /// Bucket and key: shared with the cache's key and with every response's download record, so the key is
    /// neither copied per request nor held twice.
    pub object_ref: ObjectRef,
    /// The SHA-256 of the content in hex, as its row holds it: what its blob is named by, looked up per response
    /// (so kept as text, not made again each time); the ETag and Repr-Digest are made from it.
    sha256: Box<str>,
    /// The object's size by its row.
    pub size: u64,
    /// Unix seconds of the object's last change: its Last-Modified.
    updated_at: i64,
    /// The stored S3 ETag (quoted): an MD5, or a multipart upload's; `None` for an object stored before S3 ETags
    /// were recorded, which S3 requests then see with the native one.
    s3_etag: Option<Box<str>>,
    /// The effective type: stored, else guessed from the key (a static name), else application/octet-stream.
    content_type: Cow<'static, str>,
    /// Content-Type, ETag, Last-Modified, Accept-Ranges, nosniff, Cache-Control, Content-Disposition, Repr-Digest,
    /// made at the first response that needs them ([`ObjectEntry::fields`]) and shared by the responses that add
    /// nothing to them (`FileBody::shared_fields`): by [`FieldSet`], a public or a private bucket's Cache-Control,
    /// and the native API's ETag or S3's (with the `x-amz-*` fields S3 reads answer). An object is in one bucket,
    /// so an entry makes one or two of the four (the weight counts one).
    prepared: [OnceLock<SharedFields>; 4],
    rare: Option<Box<Rare>>,
    /// [`ObjectEntry::heap_bytes`] when made: what the catalog's bound in bytes counts for it.
    pub weight: u32,
}

/// What few objects have, kept apart so that an object without any costs one null pointer.
#[derive(Debug, Default)]
struct Rare {
    /// The Cache-Control the object's responses start from: its own, else its bucket's default.
    cache_control: Option<Box<str>>,
    content_disposition: Option<Box<str>>,
    tags: Tags,
    /// The `x-amz-*` fields S3 reads answer: the stored user metadata (`x-amz-meta-*`) and, when the object has
    /// tags, `x-amz-tagging-count`.
    s3_headers: Vec<(HeaderName, HeaderValue)>,
    part_sizes: Option<Box<[u64]>>,
    checksum: Option<ObjectChecksum>,
    /// The precompressed variants, each with its own strong ETag and Repr-Digest (over its encoded bytes).
    variants: Vec<VariantEntry>,
    available: Variants,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.cache_control.is_none()
            && self.content_disposition.is_none()
            && self.tags.is_empty()
            && self.s3_headers.is_empty()
            && self.part_sizes.is_none()
            && self.checksum.is_none()
            && self.variants.is_empty()
    }
}

/// An ETag an entry answers: stored, or made from the digest (on the stack for 64 lower-case hex digits).
#[derive(Debug, Clone)]
pub enum Text<'a> {
    Stored(&'a str),
    QuotedHex([u8; 66]),
    Made(String),
}

impl std::ops::Deref for Text<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Text::Stored(text) => text,
            Text::QuotedHex(tag) => std::str::from_utf8(tag).expect("quoted hex digits are ASCII"),
            Text::Made(text) => text,
        }
    }
}

impl PartialEq<&str> for Text<'_> {
    fn eq(&self, other: &&str) -> bool {
        **self == **other
    }
}

/// One precompressed variant as the handler sends it.
#[derive(Debug)]
pub struct VariantEntry {
    pub coding: ContentCoding,
    pub sha256: String,
    /// The variant blob's size by its row.
    pub size: u64,
    /// The variant blob's own strong ETag: its sha256, so no two representations share one.
    pub etag: String,
    pub etag_value: HeaderValue,
    pub repr_digest: Option<HeaderValue>,
    pub content_encoding: HeaderValue,
}

static NO_TAGS: Tags = Tags::new();

impl ObjectEntry {
    /// `bucket_cache_control`: the bucket's default, for an object that stores no Cache-Control.
    pub fn new(record: ObjectRecord, bucket_cache_control: Option<&str>) -> Self {
        let ObjectRecord {
            bucket_id,
            key,
            sha256,
            size,
            attrs,
            created_at: _,
            updated_at,
            s3_etag,
            part_sizes,
            checksum,
        } = record;
        let ObjectAttrs { content_type, cache_control, content_disposition, user_metadata, tags } = attrs;
        let content_type = match content_type {
            Some(stored) => Cow::Owned(stored),
            None => Cow::Borrowed(guessed_content_type(&key)),
        };
        // Names and values were checked on the way in; one that is not a valid field any more is skipped.
        let mut s3_headers: Vec<(HeaderName, HeaderValue)> = user_metadata
            .iter()
            .filter_map(|(name, value)| {
                let name = HeaderName::try_from(format!("x-amz-meta-{name}")).ok()?;
                Some((name, HeaderValue::from_str(value).ok()?))
            })
            .collect();
        if !tags.is_empty() {
            s3_headers.push((TAGGING_COUNT.clone(), HeaderValue::from(tags.len())));
        }
        let rare = Rare {
            cache_control: cache_control.as_deref().or(bucket_cache_control).map(Box::from),
            content_disposition: content_disposition.map(String::into_boxed_str),
            tags,
            s3_headers,
            part_sizes: part_sizes.map(Vec::into_boxed_slice),
            checksum,
            variants: Vec::new(),
            available: Variants::default(),
        };
        Self {
            object_ref: ObjectRef { bucket_id, key: Arc::from(key) },
            sha256: sha256.into_boxed_str(),
            size,
            updated_at,
            s3_etag: s3_etag.map(String::into_boxed_str),
            content_type,
            prepared: Default::default(),
            rare: (!rare.is_empty()).then(|| Box::new(rare)),
            weight: 0,
        }
        .weighed()
    }

    fn weighed(mut self) -> Self {
        self.weight = u32::try_from(self.heap_bytes()).unwrap_or(u32::MAX);
        self
    }

    /// Adds the object's stored variants; a row with an encoding this binary does not know is skipped.
    pub fn with_variants(mut self, records: Vec<VariantRecord>) -> Self {
        for v in records {
            let Some(coding) = ContentCoding::from_token(v.encoding.as_bytes()) else { continue };
            if coding == ContentCoding::Identity {
                continue;
            }
            let etag = etag_from_sha256(&v.sha256);
            let Ok(etag_value) = HeaderValue::from_str(&etag) else { continue };
            let repr_digest = repr_digest_sha256(&v.sha256).and_then(|d| HeaderValue::from_str(&d).ok());
            let rare = self.rare.get_or_insert_with(Box::default);
            match coding {
                ContentCoding::Br => rare.available.br = true,
                _ => rare.available.gzip = true,
            }
            let content_encoding = HeaderValue::from_static(coding.token());
            rare.variants.push(VariantEntry {
                coding,
                size: u64::try_from(v.size).unwrap_or_default(),
                sha256: v.sha256,
                etag,
                etag_value,
                repr_digest,
                content_encoding,
            });
        }
        self.weighed()
    }

    /// The object's key.
    pub fn key(&self) -> &str {
        &self.object_ref.key
    }

    /// The SHA-256 of the object's content, in hex: what its blob is named by.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The native API's ETag: the content's SHA-256, quoted (its hex digits, lower-case, whatever the row held).
    pub fn etag(&self) -> Text<'_> {
        let digits = self.sha256.as_bytes();
        if digits.len() == 64 && digits.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b)) {
            let mut tag = [b'"'; 66];
            tag[1..65].copy_from_slice(digits);
            return Text::QuotedHex(tag);
        }
        Text::Made(etag_from_sha256(&self.sha256))
    }

    /// The ETag S3 requests see: the stored S3 ETag (an MD5, or a multipart upload's), else the native one (an
    /// object stored before S3 ETags were recorded).
    pub fn s3_etag(&self) -> Text<'_> {
        match &self.s3_etag {
            Some(tag) => Text::Stored(tag),
            None => self.etag(),
        }
    }

    pub fn last_modified(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.updated_at.max(0) as u64)
    }

    /// The effective type: stored, else guessed from the key, else application/octet-stream.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The stored Content-Disposition, as uploaded.
    pub fn content_disposition(&self) -> Option<&str> {
        self.rare.as_ref()?.content_disposition.as_deref()
    }

    pub fn tags(&self) -> &Tags {
        self.rare.as_ref().map_or(&NO_TAGS, |rare| &rare.tags)
    }

    /// The sizes of the parts of the multipart upload that stored this content, in order; `None` for a single
    /// upload or when not recorded.
    pub fn part_sizes(&self) -> Option<&[u64]> {
        self.rare.as_ref()?.part_sizes.as_deref()
    }

    /// Part `number` (from 1) as (offset, length) and the number of parts, or `None` past the last part. An
    /// object without recorded parts is one part.
    pub fn part(&self, number: u32) -> (Option<(u64, u64)>, u32) {
        crate::store::part_region(self.part_sizes(), self.size, number)
    }

    /// The S3 checksum an upload gave or Complete made, if any.
    pub fn checksum(&self) -> Option<ObjectChecksum> {
        self.rare.as_ref()?.checksum
    }

    /// The precompressed variants the object has.
    pub fn available(&self) -> Variants {
        self.rare.as_ref().map_or_else(Variants::default, |rare| rare.available)
    }

    pub fn variants(&self) -> &[VariantEntry] {
        self.rare.as_ref().map_or(&[], |rare| &rare.variants)
    }

    /// The prepared fields of a response from a public (`public`) or private bucket, to the native API or S3 (`s3`),
    /// made at the first.
    pub fn fields(&self, public: bool, s3: bool) -> &SharedFields {
        self.prepared[usize::from(public) | usize::from(s3) << 1].get_or_init(|| self.make_fields(public, s3))
    }

    fn make_fields(&self, public: bool, s3: bool) -> SharedFields {
        let mut h = HeaderMap::with_capacity(8);
        let content_type =
            HeaderValue::from_str(self.content_type()).unwrap_or(HeaderValue::from_static("application/octet-stream"));
        h.insert(header::CONTENT_TYPE, content_type);
        let etag = if s3 { self.s3_etag() } else { self.etag() };
        // A stored S3 ETag was checked on the way in; one that is no field value any more is answered natively.
        let etag = HeaderValue::from_str(&etag)
            .or_else(|_| HeaderValue::from_str(&self.etag()))
            .expect("a quoted hex digest is a valid header value");
        h.insert(header::ETAG, etag);
        h.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_str(&format_http_date(self.last_modified()))
                .expect("an HTTP date is a valid header value"),
        );
        h.insert(header::ACCEPT_RANGES, BYTES.clone());
        h.insert(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
        let cache_control = self.rare.as_ref().and_then(|rare| rare.cache_control.as_deref());
        if !public {
            h.insert(header::CACHE_CONTROL, private_cache_control(cache_control));
        } else if let Some(v) = cache_control.and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(header::CACHE_CONTROL, v);
        }
        if let Some(v) = self.content_disposition().and_then(|v| disposition_value(v, self.key())) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
        if let Some(digest) = repr_digest_sha256(self.sha256()).and_then(|d| HeaderValue::from_str(&d).ok()) {
            h.insert(REPR_DIGEST.clone(), digest);
        }
        if s3 && let Some(rare) = &self.rare {
            for (name, value) in &rare.s3_headers {
                h.insert(name.clone(), value.clone());
            }
        }
        SharedFields::new(&h).expect("an object's prepared fields say nothing of a body")
    }

    /// The heap bytes the entry holds (with the one set of prepared fields a response makes), for the catalog's
    /// bound in bytes: every allocation's length plus what glibc's malloc adds to one (its header and the rounding
    /// to 16 bytes, 32 at least: [`PER_ALLOCATION`]). The entry's own allocation counts its `Arc`'s two counts.
    pub fn heap_bytes(&self) -> usize {
        let string = |s: &str| if s.is_empty() { 0 } else { s.len() + PER_ALLOCATION };
        let value = |v: &HeaderValue| v.len() + 2 * PER_ALLOCATION;
        let counts = 2 * std::mem::size_of::<usize>();
        let rare = self.rare.as_deref().map_or(0, |rare| {
            let map = |m: &Tags| {
                m.iter().map(|(k, v)| string(k) + string(v) + 3 * std::mem::size_of::<usize>()).sum::<usize>()
            };
            let variants = rare
                .variants
                .iter()
                .map(|v| {
                    std::mem::size_of::<VariantEntry>()
                        + string(&v.sha256)
                        + string(&v.etag)
                        + value(&v.etag_value)
                        + v.repr_digest.as_ref().map_or(0, value)
                })
                .sum::<usize>();
            std::mem::size_of::<Rare>()
                + PER_ALLOCATION
                + rare.cache_control.as_deref().map_or(0, string)
                + rare.content_disposition.as_deref().map_or(0, string)
                + map(&rare.tags)
                + rare.s3_headers.iter().map(|(n, v)| n.as_str().len() + value(v) + 64).sum::<usize>()
                + rare.part_sizes.as_ref().map_or(0, |p| p.len() * 8 + PER_ALLOCATION)
                + variants
        });
        let content_type = match &self.content_type {
            Cow::Owned(stored) => string(stored),
            Cow::Borrowed(_) => 0,
        };
        std::mem::size_of::<Self>()
            + counts
            + PER_ALLOCATION
            + self.object_ref.key.len()
            + counts
            + PER_ALLOCATION
            + string(&self.sha256)
            + self.s3_etag.as_deref().map_or(0, string)
            + content_type
            + rare
            + self.fields_estimate()
    }

    /// The prepared fields are made after the entry is weighed (at its first response): what they will take.
    /// Their lines without the variable values (names, `: `, `\r\n`, and the date, `bytes`, `nosniff` and the
    /// digest) in one `Arc`'d allocation; then the variable values (a Content-Disposition at most doubles its
    /// value and adds the key twice as filename and filename*; S3's fields add the `x-amz-*` lines).
    fn fields_estimate(&self) -> usize {
        const FIXED_LINES: usize = 194;
        let rare = self.rare.as_deref();
        let cache_control = rare.and_then(|rare| rare.cache_control.as_deref());
        let etag = 66.max(self.s3_etag.as_deref().map_or(0, str::len));
        PER_ALLOCATION
            + 2 * std::mem::size_of::<usize>()
            + FIXED_LINES
            + etag
            + self.content_type.len()
            + cache_control.map_or(0, |c| 17 + "private, ".len() + c.len())
            + self.content_disposition().map_or(0, |d| 23 + 2 * d.len() + 3 * self.key().len())
            + rare.map_or(0, |rare| rare.s3_headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum())
    }

    /// The stored variant in `coding`; `None` for identity (the object itself) or a coding it lacks.
    pub fn variant(&self, coding: ContentCoding) -> Option<&VariantEntry> {
        self.variants().iter().find(|v| v.coding == coding)
    }
}

static PRIVATE: HeaderValue = HeaderValue::from_static("private");

/// Cache-Control for a response from a private bucket: `private` first, then the stored directives except those
/// that let a shared cache store it (RFC 9111 §3.5: an authorised response may be stored by a shared cache when it
/// says `public` or `s-maxage`). `public`, `s-maxage` and any stored `private` (a qualified `private="field"`
/// would leave the rest storable) are dropped; `max-age`, `immutable`, `no-store` and the rest are kept, so
/// browsers still cache as the uploader asked.
pub fn private_cache_control(stored: Option<&str>) -> HeaderValue {
    let kept: Vec<&str> = stored
        .map(cache_directives)
        .unwrap_or_default()
        .into_iter()
        .filter(|directive| !is_one_of(directive, &["public", "private", "s-maxage"]))
        .collect();
    if kept.is_empty() {
        return PRIVATE.clone();
    }
    // Directives come from a valid header value, so joining them gives one too; should it not, `private` alone.
    HeaderValue::from_str(&format!("private, {}", kept.join(", "))).unwrap_or_else(|_| PRIVATE.clone())
}

/// Whether a Cache-Control value lets a shared cache store an authorised response (RFC 9111 §3.5): it has a
/// `public` or `s-maxage` directive.
pub fn allows_shared_caching(value: &str) -> bool {
    cache_directives(value).iter().any(|directive| is_one_of(directive, &["public", "s-maxage"]))
}

/// Whether a directive's name (before any `=argument`) is one of `names`; names are case-insensitive (§5.2).
fn is_one_of(directive: &str, names: &[&str]) -> bool {
    let name = directive.split('=').next().unwrap_or_default().trim();
    names.iter().any(|n| name.eq_ignore_ascii_case(n))
}

/// Splits a Cache-Control value into its directives (RFC 9111 §5.2: `#cache-directive`), trimmed, empty list
/// elements skipped. A comma inside a quoted-string argument (`no-cache="a, b"`) does not split.
fn cache_directives(value: &str) -> Vec<&str> {
    let mut directives = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in value.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                directives.push(value[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    directives.push(value[start..].trim());
    directives.retain(|d| !d.is_empty());
    directives
}

/// A stored bare `attachment` or `inline` gets the key's last segment as its file name (RFC 6266, with
/// `filename*` for non-ASCII names); any other value is sent as it is.
pub fn disposition_value(stored: &str, key: &str) -> Option<HeaderValue> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ObjectAttrs;

    /// The value of the prepared field `name`, which must be there.
    fn field<'a>(fields: &'a SharedFields, name: &HeaderName) -> &'a str {
        std::str::from_utf8(fields.get(name).unwrap_or_else(|| panic!("no {name}"))).unwrap()
    }

    fn record(attrs: ObjectAttrs) -> ObjectRecord {
        ObjectRecord {
            bucket_id: 1,
            key: "dir/résumé.pdf".into(),
            sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
            size: 0,
            attrs,
            created_at: 0,
            updated_at: 1_700_000_000,
            s3_etag: None,
            part_sizes: None,
            checksum: None,
        }
    }

    #[test]
    fn headers_are_computed_from_the_record() {
        let e = ObjectEntry::new(
            record(ObjectAttrs {
                content_type: None,
                cache_control: Some("max-age=60".into()),
                content_disposition: Some("attachment".into()),
                ..ObjectAttrs::default()
            }),
            Some("no-cache"),
        );
        assert_eq!(e.content_type(), "application/pdf");
        assert_eq!(field(e.fields(true, false), &header::ETAG), format!("\"{}\"", e.sha256()).as_str());
        assert_eq!(field(e.fields(true, false), &header::LAST_MODIFIED), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(
            field(e.fields(true, false), &header::CACHE_CONTROL),
            "max-age=60",
            "the object's own value beats the bucket's"
        );
        assert_eq!(
            field(e.fields(true, false), &REPR_DIGEST),
            "sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:"
        );
        let cd = field(e.fields(true, false), &header::CONTENT_DISPOSITION);
        assert!(cd.starts_with("attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"), "{cd}");
        assert_eq!(&*e.object_ref.key, "dir/résumé.pdf");
    }

    #[test]
    fn s3_requests_see_the_stored_s3_etag_and_else_the_native_one() {
        let native = ObjectEntry::new(record(ObjectAttrs::default()), None);
        assert_eq!(*native.s3_etag(), *native.etag());
        assert_eq!(&*native.s3_etag(), field(native.fields(false, true), &header::ETAG));
        let md5 = "\"d41d8cd98f00b204e9800998ecf8427e\"";
        let stored =
            ObjectEntry::new(ObjectRecord { s3_etag: Some(md5.into()), ..record(ObjectAttrs::default()) }, None);
        assert_eq!(stored.s3_etag(), md5);
        assert_eq!(
            field(stored.fields(true, false), &header::ETAG),
            &*stored.etag(),
            "native responses keep the native ETag"
        );
        assert_eq!(field(stored.fields(false, true), &header::ETAG), md5, "S3 responses' prepared fields: S3's");
        let tagged = ObjectEntry::new(
            ObjectRecord {
                attrs: ObjectAttrs {
                    user_metadata: [("team".to_owned(), "ci".to_owned())].into(),
                    ..ObjectAttrs::default()
                },
                ..record(ObjectAttrs::default())
            },
            None,
        );
        assert_eq!(field(tagged.fields(false, true), &HeaderName::from_static("x-amz-meta-team")), "ci");
        assert_eq!(tagged.fields(false, false).get(&HeaderName::from_static("x-amz-meta-team")), None, "native");
    }

    #[test]
    fn private_cache_control_keeps_browser_caching_and_drops_shared_cache_permission() {
        let cases: &[(Option<&str>, &str)] = &[
            (None, "private"),
            (Some(""), "private"),
            (Some("public, max-age=31536000, immutable"), "private, max-age=31536000, immutable"),
            (Some("max-age=60"), "private, max-age=60"),
            (Some("PUBLIC,S-MAXAGE=600 , max-age=60"), "private, max-age=60"),
            (Some("s-maxage=600"), "private"),
            (Some("private"), "private"),
            (Some("private=\"set-cookie\", max-age=5"), "private, max-age=5"),
            (Some("no-cache=\"a, public\", public"), "private, no-cache=\"a, public\""),
            (Some("no-store"), "private, no-store"),
            (
                Some("max-age=0, must-revalidate,, proxy-revalidate"),
                "private, max-age=0, must-revalidate, proxy-revalidate",
            ),
            (Some("publicity=1"), "private, publicity=1"),
        ];
        for (stored, want) in cases {
            assert_eq!(private_cache_control(*stored), *want, "{stored:?}");
        }
        assert!(allows_shared_caching("max-age=5, Public"));
        assert!(allows_shared_caching("s-maxage=5"));
        assert!(!allows_shared_caching("max-age=5, no-cache=\"public\""));
        assert!(!allows_shared_caching("private, max-age=5"));
    }

    #[test]
    fn entries_carry_their_private_cache_control() {
        let e = ObjectEntry::new(
            record(ObjectAttrs {
                cache_control: Some("public, max-age=31536000, immutable".into()),
                ..ObjectAttrs::default()
            }),
            None,
        );
        assert_eq!(field(e.fields(true, false), &header::CACHE_CONTROL), "public, max-age=31536000, immutable");
        assert_eq!(field(e.fields(false, false), &header::CACHE_CONTROL), "private, max-age=31536000, immutable");
        // A bucket default goes through the same filter, or a private object with no value of its own would leak.
        let e = ObjectEntry::new(record(ObjectAttrs::default()), Some("public, s-maxage=600, max-age=60"));
        assert_eq!(field(e.fields(true, false), &header::CACHE_CONTROL), "public, s-maxage=600, max-age=60");
        assert_eq!(field(e.fields(false, false), &header::CACHE_CONTROL), "private, max-age=60");
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn directive() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("public".to_owned()),
                Just("Public".to_owned()),
                Just("private".to_owned()),
                Just("immutable".to_owned()),
                Just("no-store".to_owned()),
                (0u32..100_000).prop_map(|n| format!("max-age={n}")),
                (0u32..100_000).prop_map(|n| format!("s-maxage={n}")),
                (0u32..100_000).prop_map(|n| format!("S-MaxAge={n}")),
                "[a-z-]{1,12}(=[a-z0-9]{1,5})?",
                "[a-z-]{1,8}=\"[a-z ,=-]{0,10}\"",
            ]
        }

        proptest! {
            /// Whatever is stored, the result says `private` first and nothing that lets a shared cache store
            /// it, and every other stored directive survives in order.
            #[test]
            fn the_result_is_private_and_keeps_everything_else(
                directives in proptest::collection::vec(directive(), 0..6),
                sep in prop_oneof![Just(","), Just(", "), Just(" , ")],
            ) {
                let stored = directives.join(sep);
                let value = private_cache_control(Some(&stored));
                let text = value.to_str().unwrap();
                let got = cache_directives(text);
                prop_assert_eq!(got[0], "private");
                for d in &got[1..] {
                    let name = d.split('=').next().unwrap().to_ascii_lowercase();
                    prop_assert!(name != "public" && name != "s-maxage" && name != "private", "{} in {}", d, text);
                }
                let expected: Vec<&str> = directives
                    .iter()
                    .map(|d| d.as_str())
                    .filter(|d| {
                        let name = d.split('=').next().unwrap().to_ascii_lowercase();
                        name != "public" && name != "s-maxage" && name != "private"
                    })
                    .collect();
                prop_assert_eq!(&got[1..], &expected[..]);
            }
        }
    }

    #[test]
    fn an_entry_is_weighed_at_least_as_its_prepared_fields_take_and_a_plain_one_is_compact() {
        let plain = ObjectEntry::new(record(ObjectAttrs::default()), None);
        let full = ObjectEntry::new(
            record(ObjectAttrs {
                content_type: Some("text/plain; charset=utf-8".into()),
                cache_control: Some("public, max-age=31536000, immutable".into()),
                content_disposition: Some("attachment; filename=\"résumé.pdf\"".into()),
                ..ObjectAttrs::default()
            }),
            Some("max-age=5"),
        );
        for e in [&plain, &full] {
            for public in [true, false] {
                let made = e.fields(public, false).heap_bytes();
                assert!(made <= e.fields_estimate(), "{made} > {} for {:?}", e.fields_estimate(), e);
            }
        }
        // Two prebuilt header maps took some 5 KB; the record, its header values and four-allocation fields beside
        // them some 2 KB. What the entry keeps now: its compact fields, the key once, one allocation of fields.
        assert!(plain.heap_bytes() < 800, "{}", plain.heap_bytes());
        assert!(std::mem::size_of::<ObjectEntry>() <= 224, "{}", std::mem::size_of::<ObjectEntry>());
    }

    #[test]
    fn the_etag_is_made_from_the_digest_as_the_row_held_it() {
        let e = ObjectEntry::new(record(ObjectAttrs::default()), None);
        assert_eq!(e.sha256(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(&*e.etag(), "\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\"");
        assert!(e.rare.is_none(), "nothing rare, nothing allocated for it");
        // A row that does not hold 64 lower-case hex digits: its ETag is its hex digits, lower-cased, as before.
        let odd = ObjectEntry::new(ObjectRecord { sha256: "E3B0".into(), ..record(ObjectAttrs::default()) }, None);
        assert_eq!((odd.sha256(), &*odd.etag()), ("E3B0", "\"e3b0\""));
        assert_eq!(odd.fields(true, false).get(&REPR_DIGEST), None);
    }

    #[test]
    fn s3_fields_with_user_metadata_stay_within_the_weight() {
        let meta = (0..8).map(|i| (format!("name-{i}"), "v".repeat(40))).collect();
        let e = ObjectEntry::new(
            ObjectRecord {
                attrs: ObjectAttrs { user_metadata: meta, ..ObjectAttrs::default() },
                part_sizes: Some(vec![5 << 20; 3]),
                ..record(ObjectAttrs::default())
            },
            None,
        );
        assert!(e.fields(false, true).heap_bytes() <= e.fields_estimate());
        assert_eq!(e.part(2), (Some((5 << 20, 5 << 20)), 3));
        assert_eq!(e.part(4), (None, 3));
    }

    #[test]
    fn absent_attributes_leave_their_headers_out() {
        let e = ObjectEntry::new(record(ObjectAttrs::default()), None);
        assert_eq!(e.fields(true, false).get(&header::CACHE_CONTROL), None);
        let defaulted = ObjectEntry::new(record(ObjectAttrs::default()), Some("public, max-age=300"));
        assert_eq!(
            field(defaulted.fields(true, false), &header::CACHE_CONTROL),
            "public, max-age=300",
            "the bucket's default applies"
        );
        assert_eq!(e.fields(true, false).get(&header::CONTENT_DISPOSITION), None);
        assert_eq!(disposition_value("inline; filename=x", "a/b").unwrap(), "inline; filename=x");
    }
}
