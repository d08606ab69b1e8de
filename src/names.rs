//! Bucket names and object keys: parsed once at the edge ("parse, don't validate"), shared by the CLI, the data
//! listener and the admin listener so that every entry point applies the same rules.
//!
//! [`BucketName`], [`ObjectKey`] (and what a data path names, [`RequestedKey`]: a key or a bucket's root), the
//! attributes an object is stored with ([`ObjectAttrs`]), and a bucket's static-site settings ([`Website`]). Pure.

use std::collections::BTreeMap;
use std::fmt;

use compact_str::CompactString;

/// Longest key we accept, in bytes (the contract: 1 to 1024 bytes of UTF-8).
pub const MAX_KEY_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("invalid bucket name {name:?}: {reason}")]
    Bucket { name: String, reason: &'static str },
    #[error("invalid object key: {0}")]
    Key(&'static str),
    #[error("invalid {field}: {reason}")]
    Attr { field: &'static str, reason: &'static str },
}

/// Longest stored header value we accept for an object attribute.
const MAX_ATTR_BYTES: usize = 1024;

/// What the caller chooses about an object besides its bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectAttrs {
    pub content_type: Option<String>,
    pub cache_control: Option<String>,
    pub content_disposition: Option<String>,
    /// S3 user metadata (`x-amz-meta-<name>: <value>`), by lower-case name without the prefix; empty for none.
    pub user_metadata: BTreeMap<String, String>,
    /// S3 object tags, by key; empty for none.
    pub tags: Tags,
}

/// An object's S3 tag set (`x-amz-tagging`, PutObjectTagging): key to value, keys unique.
pub type Tags = BTreeMap<String, String>;

/// S3's bound on user metadata: the bytes of every name and value together.
pub const MAX_USER_METADATA_BYTES: usize = 2048;

/// Checks the attributes a caller may set on an object (CLI flags or upload headers), so that every stored
/// value is a well-formed header value when it is served later.
pub fn parse_attrs(
    content_type: Option<String>,
    cache_control: Option<String>,
    content_disposition: Option<String>,
) -> Result<ObjectAttrs, NameError> {
    let header_text = |field: &'static str, v: &str| {
        if v.is_empty() || v.len() > MAX_ATTR_BYTES {
            return Err(NameError::Attr { field, reason: "must be 1 to 1024 characters" });
        }
        if !v.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
            return Err(NameError::Attr { field, reason: "must be printable ASCII" });
        }
        Ok(())
    };
    if let Some(ct) = &content_type {
        header_text("content type", ct)?;
        // RFC 9110 §8.3.1: type "/" subtype, both non-empty tokens (mime alone accepts `text/`).
        let parsed = ct.parse::<mime::Mime>().ok();
        if !parsed.is_some_and(|m| !m.type_().as_str().is_empty() && !m.subtype().as_str().is_empty()) {
            return Err(NameError::Attr { field: "content type", reason: "is not a media type like text/plain" });
        }
    }
    if let Some(cc) = &cache_control {
        header_text("cache control", cc)?;
    }
    if let Some(cd) = &content_disposition {
        header_text("content disposition", cd)?;
        crate::header_values::disposition::validate_content_disposition(cd)
            .map_err(|reason| NameError::Attr { field: "content disposition", reason })?;
    }
    Ok(ObjectAttrs { content_type, cache_control, content_disposition, ..ObjectAttrs::default() })
}

/// An S3-style bucket name: 3 to 63 characters of `a-z`, `0-9`, `.` and `-`, starting and ending with a letter or
/// digit, without `..`, and not shaped like an IPv4 address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BucketName(CompactString);

impl BucketName {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        let fail = |reason| Err(NameError::Bucket { name: name.chars().take(80).collect(), reason });
        if !(3..=63).contains(&name.len()) {
            return fail("must be 3 to 63 characters long");
        }
        if !name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-') {
            return fail("only lower-case letters, digits, '.' and '-' are allowed");
        }
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let bytes = name.as_bytes();
        if !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
            return fail("must start and end with a letter or digit");
        }
        // Byte-wise: `str::contains` sets up a substring search, and only digits and dots can make an address.
        if bytes.windows(2).any(|pair| pair == b"..") {
            return fail("must not contain '..'");
        }
        if bytes.iter().all(|&b| b.is_ascii_digit() || b == b'.') && name.parse::<std::net::Ipv4Addr>().is_ok() {
            return fail("must not be formatted as an IP address");
        }
        Ok(Self(CompactString::from(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for BucketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An object key: 1 to 1024 bytes of UTF-8 that may contain `/`, but no NUL or other control characters (they
/// would end up in logs and headers) and no `.` or `..` segments (they mean something else to every path-aware
/// client and proxy). Keys are never turned into file paths; blobs are addressed by content hash.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKey(CompactString);

impl ObjectKey {
    pub fn parse(key: &str) -> Result<Self, NameError> {
        if key.is_empty() {
            return Err(NameError::Key("key is empty"));
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(NameError::Key("key is longer than 1024 bytes"));
        }
        // Byte-wise where the key is ASCII (the usual case): a char-by-char walk decodes UTF-8 it need not.
        let bytes = key.as_bytes();
        if bytes.contains(&0) {
            return Err(NameError::Key("key contains NUL"));
        }
        let ascii_control = |b: &u8| b.is_ascii_control();
        if bytes.iter().any(ascii_control) || (!key.is_ascii() && key.chars().any(char::is_control)) {
            return Err(NameError::Key("key contains a control character"));
        }
        if bytes.split(|&b| b == b'/').any(|segment| segment == b"." || segment == b"..") {
            return Err(NameError::Key("key contains a '.' or '..' segment"));
        }
        Ok(Self(CompactString::from(key)))
    }

    /// Decodes a key taken from a request path: percent-decoded exactly once, then parsed. A `%2F` becomes `/`
    /// and `%252F` becomes the three characters `%2F`.
    pub fn from_url_path(raw: &str) -> Result<Self, NameError> {
        // Most keys have nothing escaped: then the path is the key, and already a `str`.
        if !raw.as_bytes().contains(&b'%') {
            return Self::parse(raw);
        }
        let decoded = percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map_err(|_| NameError::Key("key is not UTF-8 after percent-decoding"))?;
        Self::parse(&decoded)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Splits a request path (`/{bucket}/{key}`, still percent-encoded) into its parsed parts.
pub fn parse_object_path(path: &str) -> Result<(BucketName, ObjectKey), NameError> {
    match parse_data_path(path)? {
        (bucket, RequestedKey::Key(key)) => Ok((bucket, key)),
        (_, RequestedKey::Root { .. }) => Err(NameError::Key("key is empty")),
    }
}

/// What a GET or HEAD on the data listener names: an object key, or its bucket's root (a static site's home).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestedKey {
    /// `/{bucket}/{key}`.
    Key(ObjectKey),
    /// `/{bucket}/` (`slash`) or `/{bucket}`.
    Root { slash: bool },
}

/// Splits a data-listener path (still percent-encoded) into its bucket and what it names in it.
pub fn parse_data_path(path: &str) -> Result<(BucketName, RequestedKey), NameError> {
    let rest = path.strip_prefix('/').unwrap_or(path);
    let (bucket, key) = match rest.split_once('/') {
        Some((bucket, key)) => (bucket, Some(key)),
        None => (rest, None),
    };
    // A bucket name has no characters that need escaping, so it is never decoded.
    let bucket = BucketName::parse(bucket)?;
    let requested = match key {
        Some(key) if !key.is_empty() => RequestedKey::Key(ObjectKey::from_url_path(key)?),
        _ => RequestedKey::Root { slash: key.is_some() },
    };
    Ok((bucket, requested))
}

/// A bucket's static-site settings (`bucket set --index-document/--error-document`; migration 0017).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Website {
    /// What a directory path (`/{bucket}/`, `/{bucket}/dir/`) serves: that directory's key plus this suffix.
    pub index_document: Option<IndexDocument>,
    /// What a missing key's GET serves, with 404.
    pub error_document: Option<ObjectKey>,
}

impl Website {
    /// No static-site settings: what a bucket without them, and an absent bucket, plans with.
    pub const NONE: Website = Website { index_document: None, error_document: None };

    /// An error document as `bucket set --error-document` takes it: a valid key.
    pub fn parse_error_document(document: &str) -> Result<ObjectKey, NameError> {
        ObjectKey::parse(document).map_err(|e| e.into_attr("error document"))
    }
}

/// An index document: a relative key suffix such as `index.html` or `_site/home.html`, a valid key with no
/// leading `/` and no empty segment, so that added to a directory's key (empty, or ending in `/`) it names a key
/// inside that directory, and a valid one whenever the sum is no longer than a key may be.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IndexDocument(String);

impl IndexDocument {
    pub fn parse(document: &str) -> Result<Self, NameError> {
        let key = ObjectKey::parse(document).map_err(|e| e.into_attr("index document"))?;
        let fail = |reason| Err(NameError::Attr { field: "index document", reason });
        if document.starts_with('/') {
            return fail("must be relative (no leading '/'), like index.html");
        }
        if document.split('/').any(str::is_empty) {
            return fail("must not have an empty segment (no '//', no trailing '/')");
        }
        Ok(Self(key.0.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The bucket root's index document: the suffix itself, as a key.
    pub fn at_root(&self) -> ObjectKey {
        ObjectKey(CompactString::from(self.0.as_str()))
    }

    /// The index document of `directory` (a key ending in `/`), or `None` when the sum is longer than a key
    /// may be. Both parts are valid and the suffix adds no empty, `.` or `..` segment, so the sum is a valid key.
    pub fn in_directory(&self, directory: &str) -> Option<ObjectKey> {
        debug_assert!(directory.ends_with('/'), "{directory:?} is not a directory");
        (directory.len() + self.0.len() <= MAX_KEY_BYTES)
            .then(|| ObjectKey(compact_str::format_compact!("{directory}{}", self.0)))
    }
}

impl NameError {
    /// A key's refusal as the refusal of the setting that names one (`invalid index document: ...`).
    fn into_attr(self, field: &'static str) -> NameError {
        match self {
            NameError::Key(reason) => NameError::Attr { field, reason },
            other => other,
        }
    }
}

/// The least string above every string that starts with `prefix` (`None`: no such bound, for `""`). Keys compare
/// as UTF-8 bytes (SQLite's BINARY collation; PostgreSQL's keys are `COLLATE "C"`), which orders like code points,
/// so this turns "starts with" into a range an index on keys can answer (the store's listing, the S3 listing's skip
/// past a common prefix): bump the last character that can be bumped and drop what follows.
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match last {
            '\u{D7FF}' => Some('\u{E000}'),
            c => char::from_u32(u32::from(c) + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_prefix_bound_is_exactly_starts_with() {
        assert_eq!(prefix_upper_bound(""), None);
        assert_eq!(prefix_upper_bound("a/").as_deref(), Some("a0"));
        assert_eq!(prefix_upper_bound("\u{D7FF}").as_deref(), Some("\u{E000}"), "surrogates are skipped");
        assert_eq!(prefix_upper_bound("x\u{10FFFF}").as_deref(), Some("y"), "a maximal last character is dropped");
        assert_eq!(prefix_upper_bound("\u{10FFFF}"), None);
        let keys =
            ["a", "a/", "a/b", "a/\u{10FFFF}z", "a0", "a.", "ab", "é", "é/x", "ê", "\u{10FFFF}", "z", "x\u{10FFFF}"];
        for prefix in ["", "a", "a/", "é", "x\u{10FFFF}", "\u{10FFFF}", "zz"] {
            let upper = prefix_upper_bound(prefix);
            for key in keys {
                // Byte order, as SQLite's BINARY collation compares.
                let in_range = key.as_bytes() >= prefix.as_bytes()
                    && upper.as_deref().is_none_or(|u| key.as_bytes() < u.as_bytes());
                assert_eq!(in_range, key.starts_with(prefix), "prefix {prefix:?}, key {key:?}");
            }
        }
    }

    #[test]
    fn bucket_names_follow_s3_rules() {
        for ok in ["abc", "my-bucket.v2", "a1b", &"a".repeat(63), "123"] {
            assert!(BucketName::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "BAD_NAME",
            "Abc",
            "-abc",
            "abc-",
            ".abc",
            "a..b",
            "192.168.1.1",
            "a b",
            "ab/c",
            "äbc",
        ] {
            assert!(BucketName::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_reject_empty_long_nul_controls_and_dot_segments() {
        for ok in ["a", "dir/obj.bin", "a//b", "/lead", "trail/", ".hidden", "a/..b/c", "résumé.pdf", "%41"] {
            assert!(ObjectKey::parse(ok).is_ok(), "{ok}");
        }
        assert!(ObjectKey::parse(&"k".repeat(1024)).is_ok());
        for bad in ["", "a\0b", "a\nb", ".", "..", "a/./b", "a/../b", "../x", "x/..", "x/."] {
            assert!(ObjectKey::parse(bad).is_err(), "{bad:?}");
        }
        assert!(ObjectKey::parse(&"k".repeat(1025)).is_err());
    }

    #[test]
    fn url_paths_are_decoded_exactly_once() {
        let (b, k) = parse_object_path("/bkt/dir%2Fa%20b").unwrap();
        assert_eq!((b.as_str(), k.as_str()), ("bkt", "dir/a b"));
        let (_, k) = parse_object_path("/bkt/%252E%252E").unwrap();
        assert_eq!(k.as_str(), "%2E%2E");
        assert!(parse_object_path("/bkt/%2E%2E").is_err());
        assert!(parse_object_path("/bkt/a/%2e/b").is_err());
        assert!(parse_object_path("/bkt/%00").is_err());
        assert!(parse_object_path("/bkt/%ff").is_err());
        assert!(parse_object_path("/bkt/").is_err());
        assert!(parse_object_path("/bkt").is_err());
        assert!(parse_object_path("/").is_err());
        assert!(parse_object_path("/BKT/x").is_err());
    }

    #[test]
    fn data_paths_name_a_key_or_the_bucket_root() {
        let key = |k: &str| RequestedKey::Key(ObjectKey::parse(k).unwrap());
        for (path, want) in [
            ("/bkt/", RequestedKey::Root { slash: true }),
            ("/bkt", RequestedKey::Root { slash: false }),
            ("/bkt/css/", key("css/")),
            ("/bkt//", key("/")),
            ("/bkt/a%2Fb", key("a/b")),
        ] {
            let (bucket, requested) = parse_data_path(path).unwrap();
            assert_eq!((bucket.as_str(), requested), ("bkt", want), "{path}");
        }
        for bad in ["/", "", "/BKT/", "/bkt/%2E%2E", "/bkt/a/../b"] {
            assert!(parse_data_path(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_object_path("/bkt/"), Err(NameError::Key("key is empty")));
    }

    #[test]
    fn index_documents_are_relative_suffixes_and_error_documents_keys() {
        for ok in ["index.html", "_site/home.html", "a.b/c", ".hidden", "é.html"] {
            assert_eq!(IndexDocument::parse(ok).map(|i| i.as_str().to_owned()), Ok(ok.to_owned()));
        }
        for bad in
            ["", "/index.html", "a//b", "dir/", "/", "..", "a/../b", "./index.html", "a\u{7}b", &"k".repeat(1025)]
        {
            let err = IndexDocument::parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid index document: "), "{bad:?}: {err}");
        }
        assert!(Website::parse_error_document("errors/404.html").is_ok());
        for bad in ["", "../404.html", "a/./b", "x\u{1}"] {
            let err = Website::parse_error_document(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid error document: "), "{bad:?}: {err}");
        }
        let index = IndexDocument::parse("index.html").unwrap();
        assert_eq!(index.at_root().as_str(), "index.html");
        assert_eq!(index.in_directory("a/").map(|k| k.0), Some("a/index.html".into()));
        assert_eq!(index.in_directory(&format!("{}/", "d".repeat(1014))), None, "1025 bytes");
        assert!(index.in_directory(&format!("{}/", "d".repeat(1013))).is_some(), "1024 bytes");
    }

    #[test]
    fn attrs_must_be_well_formed_header_values() {
        let ok =
            parse_attrs(Some("text/plain; charset=utf-8".into()), Some("max-age=60".into()), Some("attachment".into()));
        assert!(ok.is_ok());
        assert!(parse_attrs(Some("nonsense".into()), None, None).is_err());
        assert!(parse_attrs(Some("text/".into()), None, None).is_err());
        assert!(parse_attrs(Some("/plain".into()), None, None).is_err());
        assert!(parse_attrs(None, Some("a\r\nb".into()), None).is_err());
        assert!(parse_attrs(None, Some(String::new()), None).is_err());
        assert!(parse_attrs(None, None, Some("attachment; filename=\"a\nb\"".into())).is_err());
        assert!(parse_attrs(None, None, Some("résumé".into())).is_err());
    }

    proptest! {
        /// The byte-wise checks judge a key as its characters do: no control character (C0, DEL or C1), no
        /// `.`/`..` segment.
        #[test]
        fn keys_are_judged_as_by_their_characters(key in "[a./\\x00-\\x7f\u{80}-\u{a0}é]{0,12}") {
            let by_chars = !key.is_empty()
                && !key.chars().any(char::is_control)
                && !key.split('/').any(|segment| segment == "." || segment == "..");
            prop_assert_eq!(ObjectKey::parse(&key).is_ok(), by_chars, "{:?}", key);
        }

        /// A bucket name is refused for `..` and for an IPv4 address's shape exactly as before the byte-wise checks.
        #[test]
        fn bucket_names_are_judged_as_by_their_strings(name in "[a-z0-9.-]{3,15}") {
            let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
            let expected = alnum(name.as_bytes()[0])
                && alnum(name.as_bytes()[name.len() - 1])
                && !name.contains("..")
                && name.parse::<std::net::Ipv4Addr>().is_err();
            prop_assert_eq!(BucketName::parse(&name).is_ok(), expected, "{:?}", name);
        }

        /// An accepted key never holds NUL or a `.`/`..` segment, whatever the raw path.
        #[test]
        fn accepted_keys_are_safe(raw in "[a-z%./0-9A-F\\x00]{0,40}") {
            if let Ok(key) = ObjectKey::from_url_path(&raw) {
                let k = key.as_str();
                prop_assert!(!k.contains('\0'));
                prop_assert!(!k.split('/').any(|s| s == "." || s == ".."));
                prop_assert!(!k.is_empty() && k.len() <= MAX_KEY_BYTES);
            }
        }

        /// An index document added to any directory key is a key that parses, whenever it is short enough.
        #[test]
        fn an_index_document_in_a_directory_is_a_valid_key(
            directory in "([a-z.%]{0,4}/){1,4}",
            index in "[a-z.]{1,4}(/[a-z.]{1,4}){0,2}",
        ) {
            if let (Ok(dir), Ok(index)) = (ObjectKey::parse(&directory), IndexDocument::parse(&index)) {
                let joined = index.in_directory(dir.as_str()).unwrap();
                prop_assert_eq!(ObjectKey::parse(joined.as_str()), Ok(joined.clone()));
                prop_assert!(joined.as_str().starts_with(dir.as_str()));
            }
        }

        /// A path with nothing escaped is taken as it stands, with the same answer decoding it gives.
        #[test]
        fn an_unescaped_path_is_judged_as_its_decoding(raw in "[a-z%./0-9A-F\\x00é ]{0,40}") {
            let decoded = percent_encoding::percent_decode_str(&raw).decode_utf8().map(|d| ObjectKey::parse(&d));
            match (ObjectKey::from_url_path(&raw), decoded) {
                (Ok(key), Ok(Ok(expected))) => prop_assert_eq!(key, expected),
                (Err(_), Err(_) | Ok(Err(_))) => {}
                (got, expected) => prop_assert!(false, "{:?}: {:?} against {:?}", raw, got, expected),
            }
        }

        /// Decoding happens once: encoding an accepted key and decoding it gives the key back.
        #[test]
        fn decoding_inverts_encoding(key in "[a-zA-Z0-9 %/._~é-]{1,60}") {
            if let Ok(parsed) = ObjectKey::parse(&key) {
                let encoded = percent_encoding::utf8_percent_encode(&key, percent_encoding::NON_ALPHANUMERIC).to_string();
                prop_assert_eq!(ObjectKey::from_url_path(&encoded).unwrap(), parsed);
            }
        }
    }
}
