//! `Content-Disposition` (RFC 6266, RFC 8187) and `Repr-Digest` (RFC 9530) header values.
//!
//! Decisions:
//! - Control characters (Unicode `Cc`, so also DEL and C1) and bidi controls (U+200E/F,
//!   U+202A–U+202E, U+2066–U+2069, which can disguise an extension) become `_`, in both forms.
//! - A name that is printable ASCII after that gets only `filename="..."` with `"` and `\` escaped
//!   as quoted-pairs (RFC 9110 §5.6.4).
//! - Any other name gets an ASCII fallback (each non-ASCII char → `_`) plus
//!   `filename*=UTF-8''<pct>` (RFC 8187 §3.2, attr-char kept, everything else percent-encoded);
//!   RFC 6266 §4.3 says recipients prefer `filename*`, and the fallback comes first for old agents.
//! - An empty name gives the bare disposition type (`attachment`), since `filename=""` helps no one.
//! - Path separators are kept: RFC 6266 §4.3 makes stripping them the recipient's job.
//! - Validation accepts visible ASCII plus SP/HTAB only, then `type *(OWS ";" OWS token OWS "="
//!   OWS (token / quoted-string)) OWS`. It also refuses empty or duplicate parameters (RFC 6266
//!   §4.1 calls duplicates invalid) and a `name*` parameter that is not an RFC 8187 ext-value.
//! - `repr_digest_sha256` accepts upper- or lowercase hex and refuses anything that is not
//!   exactly 32 bytes.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// The disposition type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispositionKind {
    /// Render in the browser where possible.
    Inline,
    /// Download as a file.
    Attachment,
}

impl DispositionKind {
    /// The token as it appears in the header.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            DispositionKind::Inline => "inline",
            DispositionKind::Attachment => "attachment",
        }
    }
}

/// Everything but RFC 8187 attr-char (ALPHA, DIGIT and ``!#$&+-.^_`|~``).
const NOT_ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// Builds a Content-Disposition value. `kind` is "attachment" or "inline". ASCII-safe names go in a quoted
/// `filename="..."` (escape `"` and `\`, replace controls); non-ASCII names get an ASCII fallback `filename="..."`
/// (non-ASCII replaced by `_`) plus `filename*=UTF-8''<percent-encoded>` per RFC 8187 (attr-char set).
#[must_use]
pub fn content_disposition(kind: DispositionKind, filename: &str) -> String {
    let mut out = String::from(kind.as_str());
    if filename.is_empty() {
        return out;
    }
    let cleaned: String = filename.chars().map(|c| if is_unsafe_char(c) { '_' } else { c }).collect();
    out.push_str("; filename=\"");
    for c in cleaned.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii() => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
    if !cleaned.is_ascii() {
        out.push_str("; filename*=UTF-8''");
        out.extend(utf8_percent_encode(&cleaned, NOT_ATTR_CHAR));
    }
    out
}

/// Controls could split or corrupt the header; bidi controls can make `gpj.exe` look like `exe.jpg`.
fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Validates a stored/user-supplied Content-Disposition value well enough to refuse header injection:
/// returns Err(reason) for CR/LF/NUL/controls or non-visible-ASCII, or if it does not start with a
/// disposition-type token (`inline`, `attachment`, or another token) optionally followed by `;` parameters.
///
/// # Errors
/// A short static reason naming the first problem found.
pub fn validate_content_disposition(value: &str) -> Result<(), &'static str> {
    if value.is_empty() {
        return Err("empty value");
    }
    for &b in value.as_bytes() {
        match b {
            b'\r' | b'\n' => return Err("contains CR or LF"),
            0 => return Err("contains NUL"),
            b'\t' | 0x20..=0x7E => {}
            0x01..=0x1F | 0x7F => return Err("contains a control character"),
            _ => return Err("contains non-ASCII bytes"),
        }
    }
    let mut p = Cursor { s: value.as_bytes() };
    p.token().ok_or("does not start with a disposition-type token")?;
    let mut seen: Vec<&[u8]> = Vec::new();
    loop {
        p.skip_ows();
        if p.s.is_empty() {
            return Ok(());
        }
        if !p.eat(b';') {
            return Err("expected ';' before a parameter");
        }
        p.skip_ows();
        if p.s.is_empty() || p.s.first() == Some(&b';') {
            return Err("empty parameter");
        }
        let name = p.token().ok_or("parameter name is not a token")?;
        p.skip_ows();
        if !p.eat(b'=') {
            return Err("parameter without '='");
        }
        p.skip_ows();
        if name.ends_with(b"*") {
            // RFC 8187 ext-value; syntactically a token, so it cannot be quoted.
            let ext = p.token().ok_or("extended parameter value is not a token")?;
            if !is_ext_value(ext) {
                return Err("extended parameter value is not charset'lang'pct-encoded");
            }
        } else if p.s.first() == Some(&b'"') {
            p.quoted_string().ok_or("unterminated or invalid quoted-string")?;
        } else {
            p.token().ok_or("parameter value is not a token or quoted-string")?;
        }
        if seen.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            return Err("duplicate parameter");
        }
        seen.push(name);
    }
}

/// A tiny byte cursor for the validator.
struct Cursor<'a> {
    s: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn skip_ows(&mut self) {
        let n = self.s.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
        self.s = self.s.get(n..).unwrap_or(&[]);
    }

    fn eat(&mut self, want: u8) -> bool {
        match self.s.split_first() {
            Some((&b, rest)) if b == want => {
                self.s = rest;
                true
            }
            _ => false,
        }
    }

    /// token = 1*tchar (RFC 9110 §5.6.2).
    fn token(&mut self) -> Option<&'a [u8]> {
        let n = self.s.iter().take_while(|&&b| is_tchar(b)).count();
        if n == 0 {
            return None;
        }
        let (token, rest) = self.s.split_at(n);
        self.s = rest;
        Some(token)
    }

    /// quoted-string (RFC 9110 §5.6.4), ASCII only since the caller already refused other bytes.
    fn quoted_string(&mut self) -> Option<()> {
        let mut rest = self.s.strip_prefix(b"\"")?;
        loop {
            let (&b, tail) = rest.split_first()?;
            rest = match b {
                b'"' => {
                    self.s = tail;
                    return Some(());
                }
                // quoted-pair = "\" ( HTAB / SP / VCHAR )
                b'\\' => match tail.split_first()? {
                    (b'\t' | 0x20..=0x7E, after) => after,
                    _ => return None,
                },
                b'\t' | 0x20..=0x7E => tail,
                _ => return None,
            };
        }
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// ext-value = charset "'" [ language ] "'" value-chars (RFC 8187 §3.2.1).
fn is_ext_value(v: &[u8]) -> bool {
    let mut parts = v.splitn(3, |&b| b == b'\'');
    let (Some(charset), Some(language), Some(chars)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let charset_ok =
        !charset.is_empty() && charset.iter().all(|&b| b.is_ascii_alphanumeric() || b"!#$%&+-^_`{}~".contains(&b));
    let language_ok = language.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-');
    charset_ok && language_ok && is_value_chars(chars)
}

/// attr-char (RFC 8187 §3.2.1); must agree with [`NOT_ATTR_CHAR`].
fn is_attr_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b)
}

/// value-chars = *( pct-encoded / attr-char ).
fn is_value_chars(mut v: &[u8]) -> bool {
    while let Some((&b, rest)) = v.split_first() {
        v = if b == b'%' {
            match rest {
                [h, l, tail @ ..] if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => tail,
                _ => return false,
            }
        } else if is_attr_char(b) {
            rest
        } else {
            return false;
        };
    }
    true
}

/// `Repr-Digest: sha-256=:<base64 of the 32 raw bytes>:` (RFC 9530 §3, structured-field byte sequence).
/// Takes the lowercase hex SHA-256 (uppercase is accepted too); `None` unless it is 64 hex digits.
#[must_use]
pub fn repr_digest_sha256(hex_sha256: &str) -> Option<String> {
    let mut raw = [0u8; 32];
    hex::decode_to_slice(hex_sha256, &mut raw).ok()?;
    Some(format!("sha-256=:{}:", STANDARD.encode(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use percent_encoding::percent_decode_str;
    use proptest::prelude::*;

    use DispositionKind::{Attachment, Inline};

    #[test]
    fn plain_ascii() {
        assert_eq!(content_disposition(Attachment, "report.pdf"), "attachment; filename=\"report.pdf\"");
        assert_eq!(content_disposition(Inline, "a b;c=d.txt"), "inline; filename=\"a b;c=d.txt\"");
    }

    #[test]
    fn quotes_and_backslashes_escaped() {
        assert_eq!(
            content_disposition(Attachment, "say \"hi\"\\now.txt"),
            "attachment; filename=\"say \\\"hi\\\"\\\\now.txt\""
        );
    }

    #[test]
    fn non_ascii_gets_fallback_and_ext_value() {
        assert_eq!(
            content_disposition(Attachment, "résumé.pdf"),
            "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf"
        );
        assert_eq!(
            content_disposition(Inline, "報告.txt"),
            "inline; filename=\"__.txt\"; filename*=UTF-8''%E5%A0%B1%E5%91%8A.txt"
        );
        // attr-char survives, the rest (space, quote, %, ', *) is encoded.
        assert_eq!(
            content_disposition(Attachment, "ü a\"%'*!#$&+-.^_`|~"),
            "attachment; filename=\"_ a\\\"%'*!#$&+-.^_`|~\"; \
             filename*=UTF-8''%C3%BC%20a%22%25%27%2A!#$&+-.^_`|~"
        );
    }

    #[test]
    fn controls_replaced() {
        assert_eq!(
            content_disposition(Attachment, "a\r\nSet-Cookie: x\0\t\u{7f}.txt"),
            "attachment; filename=\"a__Set-Cookie: x___.txt\""
        );
        assert_eq!(
            content_disposition(Attachment, "é\u{85}\u{202e}gpj.exe"),
            "attachment; filename=\"___gpj.exe\"; filename*=UTF-8''%C3%A9__gpj.exe"
        );
    }

    #[test]
    fn attr_char_set_agrees() {
        for b in 0u8..=0x7F {
            let c = [b];
            let s = std::str::from_utf8(&c).expect("ascii");
            let kept = utf8_percent_encode(s, NOT_ATTR_CHAR).to_string() == s;
            assert_eq!(kept, is_attr_char(b), "{b:#x}");
        }
    }

    #[test]
    fn empty_name() {
        assert_eq!(content_disposition(Attachment, ""), "attachment");
        assert_eq!(content_disposition(Inline, ""), "inline");
    }

    #[test]
    fn validate_accepts() {
        for ok in [
            "inline",
            "attachment",
            "x-custom-type",
            "attachment; filename=\"a.txt\"",
            "attachment;filename=a.txt",
            "attachment ; filename = \"a\\\"b\" ;\tsize=12 ",
            "attachment; filename=\"r_sum_.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9.pdf",
            "attachment; filename*=utf-8'en'%E2%82%AC%20rates",
        ] {
            assert_eq!(validate_content_disposition(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn validate_rejects() {
        for (bad, reason) in [
            ("", "empty value"),
            ("attachment\r\nSet-Cookie: a=b", "contains CR or LF"),
            ("attachment\n", "contains CR or LF"),
            ("attachment\0", "contains NUL"),
            ("attachment\x0b", "contains a control character"),
            ("attachment\x7f", "contains a control character"),
            ("attachment; filename=\"é\"", "contains non-ASCII bytes"),
            (" attachment", "does not start with a disposition-type token"),
            ("; filename=a", "does not start with a disposition-type token"),
            ("\"attachment\"", "does not start with a disposition-type token"),
            ("attachment filename=a", "expected ';' before a parameter"),
            ("attachment;", "empty parameter"),
            ("attachment;; filename=a", "empty parameter"),
            ("attachment; filename", "parameter without '='"),
            ("attachment; =a", "parameter name is not a token"),
            ("attachment; filename=\"a", "unterminated or invalid quoted-string"),
            ("attachment; filename=\"a\\", "unterminated or invalid quoted-string"),
            ("attachment; filename=", "parameter value is not a token or quoted-string"),
            ("attachment; filename=a b", "expected ';' before a parameter"),
            ("attachment; filename=a; FILENAME=b", "duplicate parameter"),
            ("attachment; filename*=\"UTF-8''a\"", "extended parameter value is not a token"),
            ("attachment; filename*=UTF-8''%E", "extended parameter value is not charset'lang'pct-encoded"),
            ("attachment; filename*=a.txt", "extended parameter value is not charset'lang'pct-encoded"),
        ] {
            assert_eq!(validate_content_disposition(bad), Err(reason), "{bad:?}");
        }
    }

    #[test]
    fn repr_digest_known_vectors() {
        assert_eq!(
            repr_digest_sha256("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855").as_deref(),
            Some("sha-256=:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=:")
        );
        // SHA-256("abc").
        assert_eq!(
            repr_digest_sha256("BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD").as_deref(),
            Some("sha-256=:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=:")
        );
    }

    #[test]
    fn repr_digest_rejects_bad_input() {
        for bad in [
            "",
            "e3b0",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b8555",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85g",
            "é3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
        ] {
            assert_eq!(repr_digest_sha256(bad), None, "{bad}");
        }
    }

    proptest! {
        #[test]
        fn output_always_validates(name in any::<String>(), inline in any::<bool>()) {
            let kind = if inline { Inline } else { Attachment };
            let value = content_disposition(kind, &name);
            prop_assert_eq!(validate_content_disposition(&value), Ok(()));
            prop_assert!(http::HeaderValue::from_str(&value).is_ok());
        }

        #[test]
        fn ext_value_decodes_to_cleaned_name(name in "\\PC{1,24}") {
            let value = content_disposition(Attachment, &name);
            let cleaned: String =
                name.chars().map(|c| if is_unsafe_char(c) { '_' } else { c }).collect();
            match value.split_once("; filename*=UTF-8''") {
                Some((_, encoded)) => {
                    let decoded = percent_decode_str(encoded).decode_utf8().ok();
                    prop_assert_eq!(decoded.as_deref(), Some(cleaned.as_str()));
                }
                None => prop_assert!(cleaned.is_ascii()),
            }
        }

        #[test]
        fn validate_never_panics(value in any::<String>()) {
            let _ = validate_content_disposition(&value);
        }

        #[test]
        fn repr_digest_roundtrips(raw in any::<[u8; 32]>()) {
            let value = repr_digest_sha256(&hex::encode(raw)).expect("valid hex");
            let b64 = value.strip_prefix("sha-256=:").and_then(|v| v.strip_suffix(':'));
            prop_assert_eq!(b64.and_then(|b| STANDARD.decode(b).ok()), Some(raw.to_vec()));
        }
    }
}
