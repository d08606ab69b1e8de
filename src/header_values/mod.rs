//! Header values that more than one layer writes: the ETag of a blob, HTTP dates, Content-Disposition
//! (`disposition`), and the SigV4 header names that the driver parses and `auth` reads. Pure and below `store`, `auth` and `http`, so the store can record an ETag, the driver can
//! write a `Date`, and names and signed URLs can validate a disposition without reaching up into `http`.

pub mod content_coding;
pub mod cors;
pub mod disposition;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderName;

/// SigV4's request timestamp and body hash: not among `http`'s standard names, so shared as static values that
/// the driver hands out without allocating and `auth` compares without parsing.
pub static X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
pub static X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");

/// Formats `t` as an IMF-fixdate (`Wed, 01 May 2024 12:00:00 GMT`), dropping sub-seconds.
/// Times outside 1970-01-01..=9999-12-31T23:59:59 are clamped, since `httpdate` panics on them.
#[must_use]
pub fn format_http_date(t: SystemTime) -> String {
    let max = UNIX_EPOCH + Duration::from_secs(MAX_HTTP_DATE_SECS);
    httpdate::fmt_http_date(t.clamp(UNIX_EPOCH, max))
}

/// 9999-12-31T23:59:59Z, the last second `httpdate` can format.
pub const MAX_HTTP_DATE_SECS: u64 = 253_402_300_799;

/// Strong ETag for a blob: the full lowercase SHA-256 hex, quoted (`"e3b0…b855"`, 66 bytes).
///
/// The whole digest rather than a prefix: the tag then *is* the content address (it can be checked
/// against the stored digest or `Repr-Digest`), and a strong validator never has to rely on a
/// truncated hash being unique; 32 extra header bytes are negligible. Characters that are not ASCII
/// hex digits are dropped so the result is always a syntactically valid strong entity-tag.
#[must_use]
pub fn etag_from_sha256(hex: &str) -> String {
    let mut tag = String::with_capacity(hex.len() + 2);
    tag.push('"');
    tag.extend(hex.chars().filter(char::is_ascii_hexdigit).map(|c| c.to_ascii_lowercase()));
    tag.push('"');
    tag
}
