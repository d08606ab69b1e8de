//! The digests an upload may declare for its body, checked against what was staged before anything commits:
//! `Content-MD5` (RFC 1864, what S3 clients send) and a `sha-256` member of `Repr-Digest` or `Content-Digest`
//! (RFC 9530). Pure: the native PUT and S3's PutObject and UploadPart share it, and only map its errors.
//!
//! RFC 9530 fields are structured-field dictionaries (RFC 8941) of byte sequences, `sha-256=:<base64>:`. Only
//! that subset is parsed here (a member's key, `=`, a byte sequence, optional parameters), which needs no
//! structured-field crate: other members (`sha-512`, deprecated `md5`) are ignored, as RFC 9530 §5 allows a
//! recipient to, and a malformed field is refused rather than ignored. An upload body is stored as sent
//! (identity), so its content digest and its representation digest are the same bytes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::header::{HeaderMap, HeaderName};

pub static REPR_DIGEST: HeaderName = HeaderName::from_static("repr-digest");
pub static CONTENT_DIGEST: HeaderName = HeaderName::from_static("content-digest");
pub static CONTENT_MD5: HeaderName = HeaderName::from_static("content-md5");

/// Why a declared digest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// The field is not a digest of the right shape (S3's `InvalidDigest`).
    #[error("{0} is not a valid digest: {1}")]
    Invalid(&'static str, &'static str),
    /// The body's digest differs from the declared one (S3's `BadDigest`).
    #[error("the body does not match its {0}")]
    Mismatch(&'static str),
}

/// What a request declared about its body, parsed before the body is read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredDigests {
    md5: Option<[u8; 16]>,
    /// The `sha-256` of `Repr-Digest` and of `Content-Digest`, each when sent (they must both match).
    sha256: Vec<(&'static str, [u8; 32])>,
}

impl DeclaredDigests {
    /// The digests in `headers`; a malformed one is an error now, before any body byte is read.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, DigestError> {
        let mut declared = DeclaredDigests::default();
        if let Some(value) = single(headers, &CONTENT_MD5, "Content-MD5")? {
            let bytes = STANDARD.decode(value.trim()).ok().and_then(|b| <[u8; 16]>::try_from(b).ok());
            declared.md5 = Some(bytes.ok_or(DigestError::Invalid("Content-MD5", "expected the base64 of 16 bytes"))?);
        }
        for (name, label) in [(&REPR_DIGEST, "Repr-Digest"), (&CONTENT_DIGEST, "Content-Digest")] {
            if let Some(value) = single(headers, name, label)? {
                if let Some(sha256) = sha256_member(value).map_err(|why| DigestError::Invalid(label, why))? {
                    declared.sha256.push((label, sha256));
                }
            }
        }
        Ok(declared)
    }

    /// Whether anything was declared.
    pub fn is_empty(&self) -> bool {
        self.md5.is_none() && self.sha256.is_empty()
    }

    /// Checks the staged body's digests (lowercase hex, as the blob writer computes them).
    pub fn check(&self, md5_hex: Option<&str>, sha256_hex: &str) -> Result<(), DigestError> {
        if let Some(md5) = self.md5
            && md5_hex != Some(hex::encode(md5).as_str())
        {
            return Err(DigestError::Mismatch("Content-MD5"));
        }
        for (label, sha256) in &self.sha256 {
            if hex::encode(sha256) != sha256_hex {
                return Err(DigestError::Mismatch(label));
            }
        }
        Ok(())
    }
}

/// The one value of `name`, as text; a repeated field is refused (several digests of one body are one field).
fn single<'h>(headers: &'h HeaderMap, name: &HeaderName, label: &'static str) -> Result<Option<&'h str>, DigestError> {
    let mut values = headers.get_all(name).iter();
    let Some(first) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(DigestError::Invalid(label, "the field is repeated"));
    }
    first.to_str().map(Some).map_err(|_| DigestError::Invalid(label, "not ASCII"))
}

/// The `sha-256` member of an RFC 9530 dictionary, if any.
fn sha256_member(field: &str) -> Result<Option<[u8; 32]>, &'static str> {
    let mut found = None;
    // Byte sequences are base64 (no commas), and keys and parameters have none either: a comma ends a member.
    for member in field.split(',').map(|m| m.trim_matches([' ', '\t'])) {
        if member.is_empty() {
            return Err("an empty dictionary member");
        }
        let (key, rest) = member.split_once('=').ok_or("a member without a value")?;
        let valid_key = key.starts_with(|c: char| c.is_ascii_lowercase() || c == '*')
            && key.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_-.*".contains(&b));
        if !valid_key {
            return Err("a member key is not a structured-field key");
        }
        // The value, then any `;param` (ignored).
        let value = rest.split(';').next().unwrap_or_default();
        let bytes = value
            .strip_prefix(':')
            .and_then(|v| v.strip_suffix(':'))
            .ok_or("a digest must be a byte sequence (:base64:)")?;
        let decoded = STANDARD.decode(bytes).map_err(|_| "a byte sequence is not base64")?;
        if key == "sha-256" {
            // RFC 8941: the last of a repeated key wins.
            found = Some(<[u8; 32]>::try_from(decoded).map_err(|_| "sha-256 must be 32 bytes")?);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;
    use proptest::prelude::*;

    use super::*;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    const HELLO_MD5: &str = "5d41402abc4b2a76b9719d911017c592";

    fn headers(fields: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in fields {
            h.append(*name, HeaderValue::from_str(value).unwrap());
        }
        h
    }

    fn b64(hex_digest: &str) -> String {
        STANDARD.encode(hex::decode(hex_digest).unwrap())
    }

    #[test]
    fn declared_digests_are_checked_against_the_body() {
        let sha = format!("sha-256=:{}:", b64(HELLO_SHA256));
        let md5 = b64(HELLO_MD5);
        for fields in [
            vec![],
            vec![("content-md5", md5.as_str())],
            vec![("repr-digest", sha.as_str())],
            vec![("content-digest", sha.as_str()), ("content-md5", md5.as_str())],
            vec![("repr-digest", &*format!("sha-512=:{}:, {sha}", STANDARD.encode([1u8; 64])))],
            vec![("repr-digest", &*format!("{sha};x=1"))],
        ] {
            let declared = DeclaredDigests::from_headers(&headers(&fields)).unwrap();
            assert_eq!(declared.check(Some(HELLO_MD5), HELLO_SHA256), Ok(()), "{fields:?}");
            let other = "0".repeat(64);
            if fields.iter().any(|(n, _)| n.ends_with("digest")) {
                assert!(matches!(declared.check(Some(HELLO_MD5), &other), Err(DigestError::Mismatch(_))));
            }
            if fields.iter().any(|(n, _)| *n == "content-md5") {
                let wrong = declared.check(Some("00000000000000000000000000000000"), HELLO_SHA256);
                assert_eq!(wrong, Err(DigestError::Mismatch("Content-MD5")));
            }
        }
        // Only algorithms we do not check: nothing declared.
        let sha512 = format!("sha-512=:{}:", STANDARD.encode([1u8; 64]));
        assert!(DeclaredDigests::from_headers(&headers(&[("repr-digest", &sha512)])).unwrap().is_empty());
    }

    #[test]
    fn malformed_digests_are_refused_before_the_body() {
        for (name, value) in [
            ("content-md5", "not base64!"),
            ("content-md5", "AAAA"),
            ("repr-digest", "sha-256=abc"),
            ("repr-digest", "sha-256=:AAAA:"),
            ("repr-digest", "sha-256"),
            ("repr-digest", "sha-256=:@@@@:"),
            ("repr-digest", ", sha-256=:AAAA:"),
            ("content-digest", "SHA-256=:AAAA:"),
        ] {
            let err = DeclaredDigests::from_headers(&headers(&[(name, value)])).unwrap_err();
            assert!(matches!(err, DigestError::Invalid(..)), "{name}: {value}: {err:?}");
        }
        let twice = headers(&[("content-md5", &b64(HELLO_MD5)), ("content-md5", &b64(HELLO_MD5))]);
        assert!(matches!(DeclaredDigests::from_headers(&twice), Err(DigestError::Invalid(_, "the field is repeated"))));
    }

    proptest! {
        #[test]
        fn a_sha256_member_round_trips_among_others(digest in any::<[u8; 32]>(), before in any::<bool>()) {
            let member = format!("sha-256=:{}:", STANDARD.encode(digest));
            let other = format!("sha-512=:{}:", STANDARD.encode([7u8; 64]));
            let field = if before { format!("{member}, {other}") } else { format!("{other},{member}") };
            prop_assert_eq!(sha256_member(&field), Ok(Some(digest)));
        }
    }
}
