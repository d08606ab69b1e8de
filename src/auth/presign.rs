//! Signed URLs: HMAC-SHA256 over everything that decides what the link serves. Pure: no IO.
//!
//! Query parameters: `bg-expires` (unix seconds), `bg-key` (signing key id), `bg-sig` (unpadded base64url MAC),
//! and optionally `response-content-disposition`, which changes the response and so is signed too.
//!
//! A response override can only replace a stored header, never remove it: a present `response-*` parameter
//! must have a valid, non-empty value (400 otherwise), and the signed string tells an absent override from any
//! present one, so a signature made without an override never covers one.
//!
//! Compared with nginx's `secure_link` (MD5, no key id) and S3 presigned URLs (revocable only by rotating the
//! key): the MAC is SHA-256 based, every link names its key so keys rotate without breaking live links, and one
//! leaked link can be revoked on its own by its signature.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use percent_encoding::utf8_percent_encode;
use sha2::Sha256;

use crate::header_values::uri;

pub const EXPIRES: &str = "bg-expires";
pub const KEY_ID: &str = "bg-key";
pub const SIGNATURE: &str = "bg-sig";
pub const RESPONSE_DISPOSITION: &str = "response-content-disposition";

/// Versioned so that the canonical form can change without old links verifying under new rules. V2 (this one)
/// length-prefixes the override; V1 signed an absent one as `""`, so an empty value verified like no value.
const ALGORITHM: &str = "BLOBGATE-HMAC-SHA256-V2";

/// Prefix of the query parameters that change the response (S3's names).
const OVERRIDE_PREFIX: &str = "response-";

/// Everything the MAC covers. Fields are joined with `\n`, which none of them can contain (bucket names are
/// `[a-z0-9.-]`, keys reject control characters, the disposition is printable ASCII).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedFields<'a> {
    pub method: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub expires: i64,
    pub key_id: &'a str,
    pub response_disposition: Option<&'a str>,
}

impl SignedFields<'_> {
    fn string_to_sign(&self) -> String {
        format!(
            "{ALGORITHM}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.method,
            self.bucket,
            self.key,
            self.expires,
            self.key_id,
            override_field(self.response_disposition)
        )
    }
}

/// An override in the signed string: `-` when absent, `=<byte length>:<value>` when present, so no present
/// value (not even an empty one) signs like an absent one.
fn override_field(value: Option<&str>) -> String {
    match value {
        None => "-".to_owned(),
        Some(v) => format!("={}:{v}", v.len()),
    }
}

pub fn sign(secret: &[u8], fields: &SignedFields<'_>) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(fields.string_to_sign().as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

/// Constant-time verification (`Mac::verify_slice`). Any malformed signature is simply "not valid".
pub fn verify(secret: &[u8], fields: &SignedFields<'_>, signature: &str) -> bool {
    let Ok(raw) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    // Re-encoding must give the same text: otherwise two spellings of one MAC would both verify.
    if URL_SAFE_NO_PAD.encode(&raw) != signature {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(fields.string_to_sign().as_bytes());
    mac.verify_slice(&raw).is_ok()
}

/// The signed-URL parameters of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresignParams {
    pub expires: i64,
    pub key_id: String,
    pub signature: String,
    /// Non-empty and valid RFC 6266 when present (`parse_query` refuses anything else).
    pub response_disposition: Option<String>,
}

impl PresignParams {
    /// Whether `signature` is the MAC, under `secret`, of a GET of `bucket/key` with these parameters. The one
    /// check that both the server and `signing revoke-url` run.
    pub fn verify(&self, secret: &[u8], bucket: &str, key: &str) -> bool {
        let fields = SignedFields {
            method: "GET",
            bucket,
            key,
            expires: self.expires,
            key_id: &self.key_id,
            response_disposition: self.response_disposition.as_deref(),
        };
        verify(secret, &fields, &self.signature)
    }
}

/// Why a query's signed-URL parameters were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Incomplete, repeated or malformed signed-URL parameters: the credentials are invalid (401).
    #[error("{0}")]
    Credentials(&'static str),
    /// A `response-*` override that is empty or not a valid header value: a bad request (400), refused whoever
    /// asks, since an override may replace a stored header but never remove or corrupt it.
    #[error("{0}")]
    Override(&'static str),
}

/// `Ok(None)` when the query has no signed-URL parameters; an error when they are incomplete, repeated or
/// malformed (an attacker must not be able to make us pick one of two values), or when an override is empty
/// or invalid.
pub fn parse_query(query: Option<&str>) -> Result<Option<PresignParams>, QueryError> {
    let Some(query) = query else { return Ok(None) };
    let (mut expires, mut key_id, mut signature, mut disposition) = (None, None, None, None);
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if name.starts_with(OVERRIDE_PREFIX) && value.is_empty() {
            return Err(QueryError::Override("an empty response-* parameter would remove a header; omit it"));
        }
        let slot = match name.as_ref() {
            EXPIRES => &mut expires,
            KEY_ID => &mut key_id,
            SIGNATURE => &mut signature,
            RESPONSE_DISPOSITION => &mut disposition,
            _ => continue,
        };
        if slot.replace(value.into_owned()).is_some() {
            return Err(QueryError::Credentials("a signed-URL parameter is repeated"));
        }
    }
    if let Some(d) = &disposition {
        crate::header_values::disposition::validate_content_disposition(d)
            .map_err(|_| QueryError::Override("response-content-disposition is not a valid RFC 6266 value"))?;
    }
    match (expires, key_id, signature) {
        (None, None, None) if disposition.is_none() => Ok(None),
        (Some(expires), Some(key_id), Some(signature)) => {
            let expires = expires.parse::<i64>().map_err(|_| QueryError::Credentials("bg-expires is not a number"))?;
            Ok(Some(PresignParams { expires, key_id, signature, response_disposition: disposition }))
        }
        _ => Err(QueryError::Credentials("incomplete signed-URL parameters")),
    }
}

/// Builds the link. The key is percent-encoded with its `/` kept, so the server's single decode gives the exact
/// key back.
pub fn build_url(base_url: &str, fields: &SignedFields<'_>, signature: &str) -> String {
    let mut url = format!(
        "{}/{}/{}?{EXPIRES}={}&{KEY_ID}={}",
        base_url.trim_end_matches('/'),
        fields.bucket,
        utf8_percent_encode(fields.key, uri::PATH),
        fields.expires,
        utf8_percent_encode(fields.key_id, uri::COMPONENT)
    );
    if let Some(d) = fields.response_disposition {
        url.push_str(&format!("&{RESPONSE_DISPOSITION}={}", utf8_percent_encode(d, uri::COMPONENT)));
    }
    url.push_str(&format!("&{SIGNATURE}={signature}"));
    url
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    fn fields() -> SignedFields<'static> {
        SignedFields {
            method: "GET",
            bucket: "bkt",
            key: "dir/a b.bin",
            expires: 2_000_000_000,
            key_id: "k1",
            response_disposition: None,
        }
    }

    #[test]
    fn signatures_verify_and_bind_every_field() {
        let f = fields();
        let sig = sign(SECRET, &f);
        assert!(verify(SECRET, &f, &sig));
        assert!(!verify(b"another secret", &f, &sig));
        let changed = [
            SignedFields { method: "PUT", ..f.clone() },
            SignedFields { bucket: "bkt2", ..f.clone() },
            SignedFields { key: "dir/a b.bin2", ..f.clone() },
            SignedFields { key: "dir/a%20b.bin", ..f.clone() },
            SignedFields { expires: f.expires + 1, ..f.clone() },
            SignedFields { key_id: "k2", ..f.clone() },
            SignedFields { response_disposition: Some("attachment"), ..f.clone() },
        ];
        for c in &changed {
            assert!(!verify(SECRET, c, &sig), "{c:?}");
        }
    }

    #[test]
    fn every_single_character_change_of_the_signature_is_rejected() {
        let f = fields();
        let sig = sign(SECRET, &f);
        for i in 0..sig.len() {
            for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=+/".chars() {
                let mut bytes: Vec<char> = sig.chars().collect();
                if bytes[i] == c {
                    continue;
                }
                bytes[i] = c;
                let tampered: String = bytes.into_iter().collect();
                assert!(!verify(SECRET, &f, &tampered), "{tampered}");
            }
        }
        assert!(!verify(SECRET, &f, ""));
        assert!(!verify(SECRET, &f, &sig[..sig.len() - 1]));
        assert!(!verify(SECRET, &f, &format!("{sig}A")));
    }

    #[test]
    fn query_parsing_is_strict_about_repeats_and_completeness() {
        assert_eq!(parse_query(None), Ok(None));
        assert_eq!(parse_query(Some("x=1")), Ok(None));
        let p = parse_query(Some("bg-expires=5&bg-key=k1&bg-sig=abc")).unwrap().unwrap();
        assert_eq!((p.expires, p.key_id.as_str(), p.signature.as_str()), (5, "k1", "abc"));
        assert!(parse_query(Some("bg-expires=5&bg-key=k1")).is_err());
        assert!(parse_query(Some("bg-expires=5&bg-expires=6&bg-key=k1&bg-sig=a")).is_err());
        assert!(parse_query(Some("bg-expires=soon&bg-key=k1&bg-sig=a")).is_err());
        assert!(parse_query(Some("response-content-disposition=attachment")).is_err());
    }

    #[test]
    fn overrides_are_never_empty_and_always_valid() {
        let signed = "bg-expires=5&bg-key=k1&bg-sig=abc";
        for bad in [
            "response-content-disposition=",
            "response-content-disposition",
            "response-content-type=",
            "response-cache-control=",
            "response-content-disposition=attachment;",
            "response-content-disposition=attachment%0d%0aX:%201",
            "response-content-disposition=%22quoted%22",
        ] {
            for query in [format!("{signed}&{bad}"), format!("{bad}&{signed}"), bad.to_owned()] {
                assert!(matches!(parse_query(Some(&query)), Err(QueryError::Override(_))), "{query}");
            }
        }
        let p = parse_query(Some(&format!("{signed}&response-content-disposition=inline"))).unwrap().unwrap();
        assert_eq!(p.response_disposition.as_deref(), Some("inline"));
    }

    #[test]
    fn an_absent_override_never_signs_like_a_present_one() {
        let absent = sign(SECRET, &fields());
        for present in ["", "-", "=0:", "attachment"] {
            let f = SignedFields { response_disposition: Some(present), ..fields() };
            assert_ne!(sign(SECRET, &f), absent, "{present:?}");
            assert!(!verify(SECRET, &f, &absent), "{present:?}");
        }
        // Lengths keep values apart that a plain separator could confuse.
        let a = SignedFields { key_id: "k1", response_disposition: Some("x"), ..fields() };
        assert_ne!(
            a.string_to_sign(),
            SignedFields { response_disposition: Some("x\n"), ..a.clone() }.string_to_sign()
        );
        assert!(fields().string_to_sign().starts_with("BLOBGATE-HMAC-SHA256-V2\n"));
    }

    #[test]
    fn built_urls_carry_an_exactly_decodable_key() {
        let f = fields();
        let url = build_url("http://h:1/", &f, "SIG");
        assert_eq!(url, "http://h:1/bkt/dir/a%20b.bin?bg-expires=2000000000&bg-key=k1&bg-sig=SIG");
        let path = url.trim_start_matches("http://h:1").split('?').next().unwrap();
        let (_, key) = crate::names::parse_object_path(path).unwrap();
        assert_eq!(key.as_str(), f.key);
    }

    proptest! {
        /// Verification never panics and never accepts a signature made for other fields.
        #[test]
        fn verify_rejects_arbitrary_signatures(sig in "\\PC{0,60}", key in "[a-z/]{1,20}") {
            let f = SignedFields { key: &key, ..fields() };
            let real = sign(SECRET, &f);
            prop_assume!(sig != real);
            prop_assert!(!verify(SECRET, &f, &sig));
        }
    }
}
