//! What a stored object looks like on the wire, computed once per object version and cached with it: the
//! representation headers (RFC 9110 §8) that go on 200, 206 and 304 alike, and the values the handler needs
//! per request. Pure: no IO.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::file_body::{ObjectRef, SharedFields};
use crate::header_values::content_coding::{ContentCoding, Variants};
use crate::header_values::disposition::{DispositionKind, content_disposition, repr_digest_sha256};
use crate::header_values::{etag_from_sha256, format_http_date};
use crate::store::{ObjectRecord, VariantRecord, effective_content_type};

pub static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
static BYTES: HeaderValue = HeaderValue::from_static("bytes");
/// How many tags an object has, on S3 GetObject and HeadObject (boto3 reads it as `TagCount`).
static TAGGING_COUNT: HeaderName = HeaderName::from_static("x-amz-tagging-count");
/// What the allocator adds to an allocation, on average: glibc's 8-byte header and the rounding of a chunk to 16
/// bytes (32 at least), with room for the fragmentation a cache's churn leaves. Calibrated: 10^6 distinct keys read
/// through a 128 MiB cache (`scripts/bench/scale.py`) left the process's anonymous memory within the bound.
const PER_ALLOCATION: usize = 32;
pub static REPR_DIGEST: HeaderName = HeaderName::from_static("repr-digest");

#[derive(Debug)]
pub struct ObjectEntry {
    pub record: ObjectRecord,
    /// Shared with every response's download record, so the key is not copied per request.
    pub object_ref: ObjectRef,
    pub etag: String,
    /// The ETag S3 requests see, with its header value: the stored S3 ETag (an MD5, or a multipart upload's),
    /// else the native one (an object stored before S3 ETags were recorded).
    pub s3_etag: String,
    pub s3_etag_value: HeaderValue,
    pub last_modified: SystemTime,
    /// The effective type: stored, else guessed from the key, else application/octet-stream.
    pub content_type: String,
    pub content_type_value: HeaderValue,
    /// The Cache-Control the object's responses start from: its own, else its bucket's default.
    cache_control: Option<Box<str>>,
    /// Content-Type, ETag, Last-Modified, Accept-Ranges, nosniff, Cache-Control, Content-Disposition, Repr-Digest,
    /// made at the first response that needs them ([`ObjectEntry::fields`]) and shared by the responses that add
    /// nothing to them (`FileBody::shared_fields`): by [`FieldSet`], a public or a private bucket's Cache-Control,
    /// and the native API's ETag or S3's (with the `x-amz-*` fields S3 reads answer). An object is in one bucket,
    /// so an entry makes one or two of the four (the weight counts one).
    prepared: [OnceLock<SharedFields>; 4],
    /// The precompressed variants, each with its own strong ETag and Repr-Digest (over its encoded bytes).
    pub variants: Vec<VariantEntry>,
    pub available: Variants,
    /// The `x-amz-*` fields S3 reads answer: the stored user metadata (`x-amz-meta-*`) and, when the object has
    /// tags, `x-amz-tagging-count`.
    pub s3_headers: Vec<(HeaderName, HeaderValue)>,
    /// [`ObjectEntry::heap_bytes`] when made: what the catalog's bound in bytes counts for it.
    pub weight: u32,
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

impl ObjectEntry {
    /// `bucket_cache_control`: the bucket's default, for an object that stores no Cache-Control.
    pub fn new(record: ObjectRecord, bucket_cache_control: Option<&str>) -> Self {
        let etag = etag_from_sha256(&record.sha256);
        let last_modified = UNIX_EPOCH + Duration::from_secs(record.updated_at.max(0) as u64);
        let content_type = effective_content_type(record.attrs.content_type.as_deref(), &record.key);
        // Stored values were validated on the way in; an unrepresentable one is skipped rather than failing reads.
        let content_type_value =
            HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/octet-stream"));
        let etag_value = HeaderValue::from_str(&etag).expect("hex digits in quotes are a valid header value");
        let (s3_etag, s3_etag_value) = record
            .s3_etag
            .as_deref()
            .and_then(|tag| Some((tag.to_owned(), HeaderValue::from_str(tag).ok()?)))
            .unwrap_or_else(|| (etag.clone(), etag_value.clone()));
        let cache_control = record.attrs.cache_control.as_deref().or(bucket_cache_control).map(Box::from);
        // Names and values were checked on the way in; one that is not a valid field any more is skipped.
        let mut s3_headers: Vec<(HeaderName, HeaderValue)> = record
            .attrs
            .user_metadata
            .iter()
            .filter_map(|(name, value)| {
                let name = HeaderName::try_from(format!("x-amz-meta-{name}")).ok()?;
                Some((name, HeaderValue::from_str(value).ok()?))
            })
            .collect();
        if !record.attrs.tags.is_empty() {
            s3_headers.push((TAGGING_COUNT.clone(), HeaderValue::from(record.attrs.tags.len())));
        }
        let object_ref = ObjectRef { bucket_id: record.bucket_id, key: Arc::from(record.key.as_str()) };
        Self {
            record,
            object_ref,
            etag,
            s3_etag,
            s3_etag_value,
            last_modified,
            content_type,
            content_type_value,
            cache_control,
            prepared: Default::default(),
            variants: Vec::new(),
            available: Variants::default(),
            s3_headers,
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
            match coding {
                ContentCoding::Br => self.available.br = true,
                _ => self.available.gzip = true,
            }
            let content_encoding = HeaderValue::from_static(coding.token());
            self.variants.push(VariantEntry {
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

    /// The prepared fields of a response from a public (`public`) or private bucket, to the native API or S3 (`s3`),
    /// made at the first.
    pub fn fields(&self, public: bool, s3: bool) -> &SharedFields {
        self.prepared[usize::from(public) | usize::from(s3) << 1].get_or_init(|| self.make_fields(public, s3))
    }

    fn make_fields(&self, public: bool, s3: bool) -> SharedFields {
        let mut h = HeaderMap::with_capacity(8);
        h.insert(header::CONTENT_TYPE, self.content_type_value.clone());
        let etag = if s3 {
            self.s3_etag_value.clone()
        } else {
            HeaderValue::from_str(&self.etag).expect("a quoted hex digest")
        };
        h.insert(header::ETAG, etag);
        h.insert(
            header::LAST_MODIFIED,
            HeaderValue::from_str(&format_http_date(self.last_modified)).expect("an HTTP date is a valid header value"),
        );
        h.insert(header::ACCEPT_RANGES, BYTES.clone());
        h.insert(header::X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
        if !public {
            h.insert(header::CACHE_CONTROL, private_cache_control(self.cache_control.as_deref()));
        } else if let Some(v) = self.cache_control.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(header::CACHE_CONTROL, v);
        }
        if let Some(v) =
            self.record.attrs.content_disposition.as_deref().and_then(|v| disposition_value(v, &self.record.key))
        {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
        if let Some(digest) = repr_digest_sha256(&self.record.sha256).and_then(|d| HeaderValue::from_str(&d).ok()) {
            h.insert(REPR_DIGEST.clone(), digest);
        }
        if s3 {
            for (name, value) in &self.s3_headers {
                h.insert(name.clone(), value.clone());
            }
        }
        SharedFields::new(&h).expect("an object's prepared fields say nothing of a body")
    }

    /// The heap bytes the entry holds (with the one set of prepared fields a response makes), for the catalog's
    /// bound in bytes: every allocation's length plus what glibc's malloc adds to one (its header and the rounding
    /// to 16 bytes, 32 at least: [`PER_ALLOCATION`]).
    pub fn heap_bytes(&self) -> usize {
        let string = |s: &str| if s.is_empty() { 0 } else { s.len() + PER_ALLOCATION };
        let value = |v: &HeaderValue| v.len() + 2 * PER_ALLOCATION;
        let attrs = &self.record.attrs;
        let map = |m: &std::collections::BTreeMap<String, String>| {
            m.iter().map(|(k, v)| string(k) + string(v) + 3 * std::mem::size_of::<usize>()).sum::<usize>()
        };
        let record = string(&self.record.key)
            + string(&self.record.sha256)
            + attrs.content_type.as_deref().map_or(0, string)
            + attrs.cache_control.as_deref().map_or(0, string)
            + attrs.content_disposition.as_deref().map_or(0, string)
            + map(&attrs.user_metadata)
            + map(&attrs.tags)
            + self.record.s3_etag.as_deref().map_or(0, string)
            + self.record.part_sizes.as_ref().map_or(0, |p| p.len() * 8 + PER_ALLOCATION)
            + self.record.checksum.as_ref().map_or(0, |_| PER_ALLOCATION * 4);
        let variants = self
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
        let s3_headers = self.s3_headers.iter().map(|(n, v)| n.as_str().len() + value(v) + 64).sum::<usize>();
        std::mem::size_of::<Self>()
            + PER_ALLOCATION
            + record
            + string(&self.object_ref.key)
            + PER_ALLOCATION
            + string(&self.etag)
            + string(&self.s3_etag)
            + value(&self.s3_etag_value)
            + string(&self.content_type)
            + value(&self.content_type_value)
            + self.cache_control.as_deref().map_or(0, string)
            + variants
            + s3_headers
            + self.fields_estimate()
    }

    /// The prepared fields are made after the entry is weighed (at its first response): what they will take.
    /// Their lines without the variable values (names, `: `, `\r\n`, and the date, `bytes`, `nosniff` and the
    /// digest), a span of 12 bytes per line, the `Arc`'d pair of boxes; then the variable values (a
    /// Content-Disposition at most doubles its value and adds the key twice as filename and filename*).
    fn fields_estimate(&self) -> usize {
        let attrs = &self.record.attrs;
        const FIXED_LINES: usize = 194;
        3 * PER_ALLOCATION
            + 48
            + 8 * 12
            + FIXED_LINES
            + self.etag.len()
            + self.content_type.len()
            + self.cache_control.as_deref().map_or(0, |c| 17 + "private, ".len() + c.len())
            + attrs.content_disposition.as_deref().map_or(0, |d| 23 + 2 * d.len() + 3 * self.record.key.len())
    }

    /// The stored variant in `coding`; `None` for identity (the object itself) or a coding it lacks.
    pub fn variant(&self, coding: ContentCoding) -> Option<&VariantEntry> {
        self.variants.iter().find(|v| v.coding == coding)
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
        assert_eq!(e.content_type, "application/pdf");
        assert_eq!(field(e.fields(true, false), &header::ETAG), format!("\"{}\"", e.record.sha256).as_str());
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
        assert_eq!(native.s3_etag, native.etag);
        assert_eq!(native.s3_etag_value, field(native.fields(true, false), &header::ETAG));
        let md5 = "\"d41d8cd98f00b204e9800998ecf8427e\"";
        let stored =
            ObjectEntry::new(ObjectRecord { s3_etag: Some(md5.into()), ..record(ObjectAttrs::default()) }, None);
        assert_eq!((stored.s3_etag.as_str(), stored.s3_etag_value.to_str().unwrap()), (md5, md5));
        assert_eq!(
            field(stored.fields(true, false), &header::ETAG),
            stored.etag.as_str(),
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
    fn an_entry_is_weighed_at_least_as_its_prepared_fields_take_and_a_plain_one_below_two_kilobytes() {
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
                assert!(made <= e.fields_estimate(), "{made} > {} for {:?}", e.fields_estimate(), e.record.attrs);
            }
        }
        // Two prebuilt header maps took some 5 KB.
        assert!(plain.heap_bytes() < 2048, "{}", plain.heap_bytes());
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
