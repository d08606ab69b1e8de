//! Header values that more than one layer writes: the ETag of a blob, HTTP dates, `Vary` ([`add_vary`]),
//! Content-Disposition and Repr-Digest (`disposition`), and the SigV4 header names that the driver parses and
//! `auth` reads; and what `auth` and `s3` both encode with: the calendar of their timestamps (`calendar`) and
//! RFC 3986 percent-encoding (`uri`). Also a bucket's CORS rule (`cors`), the stored content codings
//! (`content_coding`), a request's fields as every reader sees them (`fields`), an upload's declared digests
//! (`upload_digest`) and S3's checksums (`checksum`: verified by `auth`, stored by `store`). Pure and below
//! `store`, `auth` and `http`, so the store can record an ETag or a checksum, the driver can write a `Date`, and
//! names and signed URLs can validate a disposition without reaching up into `http`.

pub mod calendar;
pub mod checksum;
pub mod content_coding;
pub mod cors;
pub mod disposition;
pub mod fields;
pub mod upload_digest;
pub mod uri;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// SigV4's request timestamp and body hash: not among `http`'s standard names, so shared as static values that
/// the driver hands out without allocating and `auth` compares without parsing.
pub static X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
pub static X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");

/// Adds `field` (a header name as `Vary` lists it) to a response's one `Vary` line, unless it is listed already.
/// RFC 9110 §12.5.5 lets `Vary` be several lines, but caches key on one (nginx 1.22's `proxy_cache` kept only
/// one of `Vary: Origin` and `Vary: Accept-Encoding`, and served browsers copies without CORS headers), so blobgate
/// always sends one. The two fields it varies on, in either order, cost no allocation.
pub fn add_vary(headers: &mut HeaderMap, field: &'static str) {
    let mut lines = headers.get_all(header::VARY).iter();
    let value = match (lines.next(), lines.next()) {
        (None, _) => HeaderValue::from_static(field),
        (Some(one), None) => match (one.as_bytes(), field) {
            (b"Origin", "Accept-Encoding") => HeaderValue::from_static("Origin, Accept-Encoding"),
            (b"Accept-Encoding", "Origin") => HeaderValue::from_static("Accept-Encoding, Origin"),
            _ => vary_with(std::iter::once(one), field),
        },
        // Several lines (none of ours writes them): folded into one.
        (Some(_), Some(_)) => vary_with(headers.get_all(header::VARY).iter(), field),
    };
    headers.insert(header::VARY, value);
}

/// One `Vary` value listing every field of `lines` and `field`, each once (`*` alone covers all).
fn vary_with<'a>(lines: impl Iterator<Item = &'a HeaderValue>, field: &str) -> HeaderValue {
    let mut fields: Vec<&str> = Vec::new();
    for f in lines.filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).map(str::trim).chain([field]) {
        if !f.is_empty() && !fields.iter().any(|g| g.eq_ignore_ascii_case(f)) {
            fields.push(f);
        }
    }
    if fields.contains(&"*") {
        return HeaderValue::from_static("*");
    }
    // Visible ASCII from header values and a header name, joined by ", ": always a valid value.
    HeaderValue::from_str(&fields.join(", ")).unwrap_or(HeaderValue::from_static("*"))
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn vary_after(lines: &[&'static str], field: &'static str) -> Vec<String> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(header::VARY, HeaderValue::from_static(line));
        }
        add_vary(&mut headers, field);
        headers.get_all(header::VARY).iter().map(|v| v.to_str().unwrap().to_owned()).collect()
    }

    #[test]
    fn vary_is_always_one_line_listing_each_field_once() {
        let cases: &[(&[&'static str], &'static str, &str)] = &[
            (&[], "Origin", "Origin"),
            (&["Origin"], "Accept-Encoding", "Origin, Accept-Encoding"),
            (&["Accept-Encoding"], "Origin", "Accept-Encoding, Origin"),
            (&["Origin"], "Origin", "Origin"),
            (&["origin"], "Origin", "origin"),
            (&["Origin, Accept-Encoding"], "Accept-Encoding", "Origin, Accept-Encoding"),
            (&["Range"], "Origin", "Range, Origin"),
            (&["*"], "Origin", "*"),
            (&["Origin", "Accept-Encoding"], "Origin", "Origin, Accept-Encoding"),
            (&["Range", "Origin"], "Accept-Encoding", "Range, Origin, Accept-Encoding"),
            (&["Range", "*"], "Origin", "*"),
        ];
        for (lines, field, want) in cases {
            assert_eq!(vary_after(lines, field), vec![want.to_string()], "{lines:?} + {field}");
        }
    }
}
