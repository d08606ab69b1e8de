//! The canonical request of SigV4 for S3, piece by piece, and the `x-amz-date` timestamp. Pure; every piece is
//! unit- and property-tested on its own.
//!
//! ```text
//! <method>\n<canonical URI>\n<canonical query>\n<canonical headers>\n<signed headers>\n<payload hash>
//! ```

use http::HeaderMap;
use percent_encoding::percent_decode;

use super::{AuthKind, SigV4Auth, SigV4Error, UNSIGNED_PAYLOAD};

/// The query parameter that carries a presigned URL's signature: the one parameter it does not sign.
pub const SIGNATURE_PARAM: &str = "X-Amz-Signature";
pub const CONTENT_SHA256: &str = "x-amz-content-sha256";

/// The whole canonical request of `auth` over `request`, as the bytes that are hashed.
pub fn canonical_request(request: &super::RequestParts<'_>, auth: &SigV4Auth) -> Result<Vec<u8>, SigV4Error> {
    let exclude = (auth.kind == AuthKind::Query).then_some(SIGNATURE_PARAM);
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(request.method.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(canonical_uri(request.path).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(canonical_query(request.query.unwrap_or(""), exclude).as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&canonical_headers(request.headers, &auth.signed_headers));
    out.push(b'\n');
    out.extend_from_slice(auth.signed_headers.join(";").as_bytes());
    out.push(b'\n');
    out.extend_from_slice(payload_text(request.headers, auth.kind)?.as_bytes());
    Ok(out)
}

/// The canonical URI: S3 signs the path exactly as it was sent (the client encoded each key segment once) and,
/// unlike other services, neither normalises `.`/`..` nor encodes it a second time. An empty path is `/`.
pub fn canonical_uri(raw_path: &str) -> &str {
    if raw_path.is_empty() { "/" } else { raw_path }
}

/// The canonical query: every parameter decoded (`+` is a space, as in forms) and encoded again the SigV4 way
/// ([`uri_encode`]), a missing `=` as an empty value, sorted by encoded name then value, joined with `&`.
/// `exclude` drops one parameter by name (a presign's `X-Amz-Signature`).
pub fn canonical_query(raw_query: &str, exclude: Option<&str>) -> String {
    let mut pairs: Vec<(String, String)> = raw_query
        .split('&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            (uri_encode(&query_decode(name), true), uri_encode(&query_decode(value), true))
        })
        .filter(|(name, _)| exclude.is_none_or(|excluded| name != excluded))
        .collect();
    pairs.sort_unstable();
    let mut out = String::with_capacity(raw_query.len() + 16);
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
    }
    out
}

/// One query name or value as bytes: `+` is a space, `%XY` a byte; a `%` not followed by two hex digits stays.
pub fn query_decode(raw: &str) -> Vec<u8> {
    let plus_as_space: Vec<u8> = raw.bytes().map(|b| if b == b'+' { b' ' } else { b }).collect();
    percent_decode(&plus_as_space).collect()
}

/// SigV4's URI encoding: RFC 3986 unreserved bytes (`A-Z a-z 0-9 - . _ ~`) as they are, every other byte as
/// `%XY` with uppercase hex; `/` too when `encode_slash`.
pub fn uri_encode(bytes: &[u8], encode_slash: bool) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || (b == b'/' && !encode_slash) {
            out.push(b as char);
        } else {
            out.push('%');
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        }
    }
    out
}

/// `name:value\n` for each signed header, in the signed order. The value is every field of that name joined
/// with `,`, each trimmed and with runs of whitespace inside collapsed to one space (as botocore does). A
/// signed header that is absent has an empty value, which then fails the signature like any other change.
pub fn canonical_headers(headers: &HeaderMap, signed: &[String]) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 * signed.len());
    for name in signed {
        out.extend_from_slice(name.as_bytes());
        out.push(b':');
        for (i, value) in headers.get_all(name.as_str()).iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            push_trimmed(&mut out, value.as_bytes());
        }
        out.push(b'\n');
    }
    out
}

/// Trims `value` and collapses each inner run of whitespace into one space.
fn push_trimmed(out: &mut Vec<u8>, value: &[u8]) {
    let is_space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0b;
    for (i, word) in value.split(is_space).filter(|w| !w.is_empty()).enumerate() {
        if i > 0 {
            out.push(b' ');
        }
        out.extend_from_slice(word);
    }
}

/// The last line of the canonical request: `x-amz-content-sha256` as sent. A presigned URL that sends none
/// signs `UNSIGNED-PAYLOAD`; header auth must send one.
pub fn payload_text(headers: &HeaderMap, kind: AuthKind) -> Result<&str, SigV4Error> {
    match headers.get(CONTENT_SHA256) {
        Some(value) => value.to_str().map_err(|_| {
            SigV4Error::InvalidArgument("x-amz-content-sha256 must be a sha256 value or one of the named forms.".into())
        }),
        None if kind == AuthKind::Query => Ok(UNSIGNED_PAYLOAD),
        None => {
            Err(SigV4Error::InvalidRequest("Missing required header for this request: x-amz-content-sha256".into()))
        }
    }
}

/// An ISO 8601 basic timestamp, `YYYYMMDDTHHMMSSZ` (UTC), as SigV4 sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmzDate {
    /// As sent: it goes into the string to sign verbatim.
    pub text: String,
    /// The same instant in unix seconds.
    pub unix: i64,
}

impl AmzDate {
    /// `None` unless `text` is exactly `YYYYMMDDTHHMMSSZ` with a real calendar date and time.
    pub fn parse(text: &str) -> Option<Self> {
        let b = text.as_bytes();
        if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
            return None;
        }
        let number = |range: std::ops::Range<usize>| -> Option<i64> {
            let digits = &b[range];
            digits.iter().all(u8::is_ascii_digit).then(|| digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
        let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
        let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        if !(1..=12).contains(&month) || day < 1 || day > month_days[(month - 1) as usize] {
            return None;
        }
        if hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        let unix = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
        Some(AmzDate { text: text.to_owned(), unix })
    }

    /// `YYYYMMDD`: what the credential scope must name.
    pub fn date(&self) -> &str {
        &self.text[..8]
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`): ten lines, so no
/// date crate for one conversion.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
