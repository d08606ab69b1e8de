//! Conditional requests for immutable blobs: RFC 9110 §13 preconditions and If-Range; and a write's own
//! preconditions (`If-None-Match: *`, `If-Match`) for both front ends, [`write_condition`].
//!
//! Call [`evaluate`] after authorisation and the existence check (so 404 wins over 412), and before
//! building the response. The object always exists here, which is why `If-Match: *` is true and
//! `If-None-Match: *` matches.
//!
//! Decisions (RFC 9110 unless noted):
//! - Order is §13.2.2: If-Match, else If-Unmodified-Since; If-None-Match, else If-Modified-Since;
//!   then If-Range.
//! - Entity-tag lists (§8.8.3, §5.6.1) are tokenised, not split on commas, because `","` is a valid
//!   etagc. OWS and empty elements are tolerated; several field lines form one list; `W/` is
//!   case-sensitive; `*` is valid only as the sole element.
//! - A malformed element in If-Match makes the whole header false (412): it guards against lost
//!   updates, so it fails closed. A malformed element in If-None-Match (including `*` next to other
//!   elements) only fails to match: the cost is a 200 instead of a 304.
//! - A present but empty If-Match is an empty list, so it never matches (412); a present but empty
//!   If-None-Match still counts as present, so If-Modified-Since is ignored (§13.1.3).
//! - Dates: all three §5.6.7 formats via `httpdate`. A date header with more than one field line,
//!   an invalid date, or a wrong weekday is ignored. RFC 850 two-digit years use the `httpdate`
//!   pivot (00-69 → 20xx, 70-99 → 19xx) rather than the "50 years" rule, which would need a clock.
//! - If-Modified-Since later than `now` is ignored, as RFC 2616 §14.25 required and Apache still
//!   does: RFC 9110 dropped the rule, but a client clock that runs fast must not turn a replaced
//!   object into a 304. If-Unmodified-Since has no such check (a future date just passes).
//! - `last_modified` is truncated to whole seconds before every comparison, because the
//!   Last-Modified header we send is.
//! - If-Range (§13.1.5) is evaluated for GET and HEAD (HEAD mirrors GET, §9.3.2) whether or not a
//!   Range is present: without a Range, `honor_range` has nothing to act on. It is one value, so
//!   several field lines or a list never match. An etag needs a strong match, so `W/"..."` never
//!   matches; a date must equal Last-Modified exactly, and Last-Modified must be strong (§8.8.2.2):
//!   `now` is at least one second after it, so the object cannot have changed twice in that second.
//! - The stored etag is parsed too; a malformed or weak stored etag never matches strongly.
//! - ETag format: see [`etag_from_sha256`].

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Method, header};

use crate::header_values::fields::{self, FieldName, Fields};

use super::range::trim_ows;
#[cfg(test)]
use crate::header_values::{MAX_HTTP_DATE_SECS, etag_from_sha256, format_http_date};
use crate::store::WriteCondition;

/// Validators of the selected representation.
#[derive(Debug, Clone, Copy)]
pub struct Validators<'a> {
    /// Strong entity tag, including the quotes, e.g. "\"abc\"".
    pub etag: &'a str,
    /// Last-Modified, whole seconds.
    pub last_modified: SystemTime,
}

/// Result of the precondition evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// Go on and send the representation. `honor_range` is false when an If-Range is present and does not match
    /// (then the whole representation is sent with 200, RFC 9110 §13.1.5), true otherwise.
    Proceed { honor_range: bool },
    /// 304 Not Modified (GET/HEAD only).
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

impl Precondition {
    /// Status of the response to a request that also carries a satisfiable `Range` (e.g. `bytes=0-0`):
    /// 206 when the range is honoured, 200 when If-Range sends the whole representation, 304, 412.
    #[must_use]
    pub const fn status_with_range(self) -> u16 {
        match self {
            Precondition::Proceed { honor_range: true } => 206,
            Precondition::Proceed { honor_range: false } => 200,
            Precondition::NotModified => 304,
            Precondition::Failed => 412,
        }
    }
}

/// Whether a request has any precondition field. Most have none: they are answered without parsing anything, or
/// reading the clock.
pub fn has_any(headers: &dyn Fields) -> bool {
    // A static: a `const` array of names would be built and dropped on every call.
    static FIELDS: [&FieldName; 5] = [
        &fields::IF_MATCH,
        &fields::IF_NONE_MATCH,
        &fields::IF_MODIFIED_SINCE,
        &fields::IF_UNMODIFIED_SINCE,
        &fields::IF_RANGE,
    ];
    // A parsed head answers each of the five from its table of read names; a `HeaderMap` in one pass over its names.
    headers.has_any(&FIELDS)
}

/// `now` is the server's current time (for the "Last-Modified is strong" test of §8.8.2.2 used by If-Range).
#[must_use]
pub fn evaluate(method: &Method, headers: &dyn Fields, v: &Validators<'_>, now: SystemTime) -> Precondition {
    if !has_any(headers) {
        return Precondition::Proceed { honor_range: true };
    }
    let current = parse_entity_tag(v.etag.as_bytes());
    let last_modified = truncate_to_secs(v.last_modified);
    let get_or_head = *method == Method::GET || *method == Method::HEAD;

    // §13.2.2 step 1; step 2 only when If-Match is absent.
    if headers.contains(&fields::IF_MATCH) {
        if !if_match_passes(headers, current) {
            return Precondition::Failed;
        }
    } else if let Some(date) = single_date(headers, &fields::IF_UNMODIFIED_SINCE) {
        // §13.1.4: false when the representation changed after the date.
        if last_modified > date {
            return Precondition::Failed;
        }
    }

    // §13.2.2 step 3; step 4 only when If-None-Match is absent (§13.1.3).
    if headers.contains(&fields::IF_NONE_MATCH) {
        if if_none_match_matches(headers, current) {
            // §13.1.2: 304 is only for GET/HEAD; other methods get 412.
            return if get_or_head { Precondition::NotModified } else { Precondition::Failed };
        }
    } else if get_or_head {
        // §13.1.3: only GET/HEAD; future dates ignored (see module docs).
        if let Some(date) = single_date(headers, &fields::IF_MODIFIED_SINCE)
            && date <= now
            && last_modified <= date
        {
            return Precondition::NotModified;
        }
    }

    // §13.2.2 step 5: ranges only exist for GET (and HEAD mirrors it).
    let honor_range =
        !get_or_head || !headers.contains(&fields::IF_RANGE) || if_range_matches(headers, current, last_modified, now);
    Precondition::Proceed { honor_range }
}

/// Parses an HTTP-date in any of the three formats of RFC 9110 §5.6.7, after trimming OWS.
/// Anything other than visible ASCII and SP (so also non-UTF-8) is rejected.
#[must_use]
pub fn parse_http_date(value: &[u8]) -> Option<SystemTime> {
    let value = trim_ows(value);
    // httpdate trims more than OWS (e.g. VT, FF); refuse such bytes up front.
    if !value.iter().all(|b| (0x20..=0x7E).contains(b)) {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    httpdate::parse_http_date(text).ok()
}

/// An entity-tag; `opaque` excludes the quotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EntityTag<'a> {
    weak: bool,
    opaque: &'a [u8],
}

/// §8.8.3.2: strong comparison needs both tags strong.
fn strong_eq(a: EntityTag<'_>, b: EntityTag<'_>) -> bool {
    !a.weak && !b.weak && a.opaque == b.opaque
}

/// §8.8.3.2: weak comparison ignores the weakness indicators.
fn weak_eq(a: EntityTag<'_>, b: EntityTag<'_>) -> bool {
    a.opaque == b.opaque
}

/// etagc = %x21 / %x23-7E / obs-text (§8.8.3).
fn is_etagc(b: u8) -> bool {
    b == 0x21 || (0x23..=0x7E).contains(&b) || b >= 0x80
}

/// Parses an entity-tag at the start of `s`, returning it and the unparsed rest.
fn parse_tag_prefix(s: &[u8]) -> Option<(EntityTag<'_>, &[u8])> {
    // `W/` is a case-sensitive literal in the ABNF (%s"W/").
    let (weak, s) = match s.strip_prefix(b"W/") {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let s = s.strip_prefix(b"\"")?;
    let end = s.iter().position(|&b| b == b'"')?;
    let opaque = s.get(..end)?;
    if !opaque.iter().all(|&b| is_etagc(b)) {
        return None;
    }
    Some((EntityTag { weak, opaque }, s.get(end + 1..)?))
}

/// Parses a whole value (after OWS trimming) as exactly one entity-tag.
fn parse_entity_tag(s: &[u8]) -> Option<EntityTag<'_>> {
    match parse_tag_prefix(trim_ows(s))? {
        (tag, []) => Some(tag),
        _ => None,
    }
}

/// One element of an `If-Match` / `If-None-Match` list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Element<'a> {
    Star,
    Tag(EntityTag<'a>),
    Malformed,
}

/// Iterates the non-empty elements of one field line (§5.6.1: empty elements are skipped).
struct ListIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for ListIter<'a> {
    type Item = Element<'a>;

    fn next(&mut self) -> Option<Element<'a>> {
        let s = skip_while(self.rest, |b| is_ows(b) || b == b',');
        if s.is_empty() {
            self.rest = s;
            return None;
        }
        let (element, after) = if let Some(after) = s.strip_prefix(b"*") {
            (Element::Star, after)
        } else if let Some((tag, after)) = parse_tag_prefix(s) {
            (Element::Tag(tag), after)
        } else {
            (Element::Malformed, s)
        };
        let after = skip_while(after, is_ows);
        match after.split_first() {
            None => {
                self.rest = after;
                Some(element)
            }
            Some((b',', tail)) => {
                self.rest = tail;
                Some(element)
            }
            // Junk after (or instead of) an element: resynchronise at the next comma.
            Some(_) => {
                self.rest = after.iter().position(|&b| b == b',').and_then(|i| after.get(i + 1..)).unwrap_or(&[]);
                Some(Element::Malformed)
            }
        }
    }
}

/// All elements of all field lines of `name`, in order.
fn list_elements<'h>(headers: &'h dyn Fields, name: &'h FieldName) -> impl Iterator<Item = Element<'h>> {
    headers.values(name).flat_map(|v| ListIter { rest: v })
}

/// §13.1.1: true for `*` alone (the representation exists) or a strong match in the list.
fn if_match_passes(headers: &dyn Fields, current: Option<EntityTag<'_>>) -> bool {
    let (mut count, mut star, mut matched) = (0usize, false, false);
    for element in list_elements(headers, &fields::IF_MATCH) {
        count += 1;
        match element {
            Element::Star => star = true,
            Element::Tag(tag) => matched |= current.is_some_and(|c| strong_eq(tag, c)),
            // Fail closed: a list we cannot read cannot vouch for the representation.
            Element::Malformed => return false,
        }
    }
    if star { count == 1 } else { matched }
}

/// §13.1.2: true for `*` alone or a weak match; malformed elements just don't match.
fn if_none_match_matches(headers: &dyn Fields, current: Option<EntityTag<'_>>) -> bool {
    let (mut count, mut star, mut matched) = (0usize, false, false);
    for element in list_elements(headers, &fields::IF_NONE_MATCH) {
        count += 1;
        match element {
            Element::Star => star = true,
            Element::Tag(tag) => matched |= current.is_some_and(|c| weak_eq(tag, c)),
            Element::Malformed => {}
        }
    }
    (star && count == 1) || matched
}

/// §13.1.5: strong etag match, or an exact date match with a strong Last-Modified (§8.8.2.2).
fn if_range_matches(
    headers: &dyn Fields,
    current: Option<EntityTag<'_>>,
    last_modified: SystemTime,
    now: SystemTime,
) -> bool {
    let mut values = headers.values(&fields::IF_RANGE);
    // If-Range holds one validator, not a list.
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let raw = trim_ows(value);
    if raw.starts_with(b"\"") || raw.starts_with(b"W/") {
        return match (parse_entity_tag(raw), current) {
            (Some(tag), Some(current)) => strong_eq(tag, current),
            _ => false,
        };
    }
    let strong = now.duration_since(last_modified).is_ok_and(|age| age >= Duration::from_secs(1));
    strong && parse_http_date(raw) == Some(last_modified)
}

/// A date header counts only with exactly one field line holding a valid date (§13.1.3, §13.1.4).
fn single_date(headers: &dyn Fields, name: &FieldName) -> Option<SystemTime> {
    let mut values = headers.values(name);
    match (values.next(), values.next()) {
        (Some(value), None) => parse_http_date(value),
        _ => None,
    }
}

/// Rounds down to a whole second (also before the epoch); returns `t` if that cannot be represented.
fn truncate_to_secs(t: SystemTime) -> SystemTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => UNIX_EPOCH + Duration::from_secs(d.as_secs()),
        Err(e) => {
            let d = e.duration();
            let secs = d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0));
            UNIX_EPOCH.checked_sub(Duration::from_secs(secs)).unwrap_or(t)
        }
    }
}

fn is_ows(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn skip_while(s: &[u8], pred: impl Fn(u8) -> bool) -> &[u8] {
    let start = s.iter().position(|&b| !pred(b)).unwrap_or(s.len());
    s.get(start..).unwrap_or(&[])
}

/// The precondition table, shared with the wire replay in tests/api/downloads.rs.
#[cfg(test)]
#[path = "../../tests/api/cases/conditional.rs"]
mod cases;

/// Why a write's preconditions cannot be honoured as sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteConditionError {
    #[error("{0} is not ASCII")]
    NotAscii(header::HeaderName),
    /// Several field lines or a list: one entity tag, or `*`, is what a write can be conditioned on.
    #[error("{0} with more than one value")]
    SeveralValues(header::HeaderName),
    #[error("If-Match and If-None-Match cannot both be given on a write")]
    Both,
    /// `If-None-Match: "tag"` on a write (only `*`, "create only", is meaningful there).
    #[error("If-None-Match with a value other than *")]
    IfNoneMatchTag,
    #[error("If-Match is not an entity tag: {0}")]
    NotAnEntityTag(String),
}

/// The precondition of a write (a native PUT, S3's PutObject and CompleteMultipartUpload): `If-None-Match: *`
/// (create only) or `If-Match` with `*` or one entity tag, which the store checks under its write lock in the
/// committing transaction, so of racing writers on any replicas one wins. The tag may be either validator the
/// object has (its content ETag, or its S3 ETag). Pure; each front end maps the errors to its own words.
pub fn write_condition(headers: &HeaderMap) -> Result<WriteCondition, WriteConditionError> {
    let one = |name: header::HeaderName| -> Result<Option<String>, WriteConditionError> {
        let mut values = headers.get_all(&name).iter();
        let Some(value) = values.next() else { return Ok(None) };
        let value = value.to_str().map_err(|_| WriteConditionError::NotAscii(name.clone()))?.trim();
        if values.next().is_some() || value.contains(',') {
            return Err(WriteConditionError::SeveralValues(name));
        }
        Ok(Some(value.to_owned()))
    };
    match (one(header::IF_NONE_MATCH)?, one(header::IF_MATCH)?) {
        (None, None) => Ok(WriteCondition::Always),
        (Some(_), Some(_)) => Err(WriteConditionError::Both),
        (Some(star), None) if star == "*" => Ok(WriteCondition::IfAbsent),
        (Some(_), None) => Err(WriteConditionError::IfNoneMatchTag),
        (None, Some(tag)) => crate::s3::request::parse_if_match(&tag)
            .map(WriteCondition::IfMatch)
            .map_err(|_| WriteConditionError::NotAnEntityTag(tag)),
    }
}

#[cfg(test)]
mod tests {
    use super::cases::{render_wire_value, wire_cases};
    use super::*;
    use http::{HeaderName, HeaderValue};
    use proptest::prelude::*;

    /// Wed, 01 May 2024 12:00:00 GMT.
    const LM_SECS: u64 = 1_714_564_800;
    const SHA: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn lm() -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(LM_SECS)
    }

    fn headers_of(pairs: &[(&str, Vec<u8>)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("test header name");
            let value = HeaderValue::from_bytes(value).expect("test header value");
            map.append(name, value);
        }
        map
    }

    fn eval(method: &Method, pairs: &[(&str, &str)], now: SystemTime) -> Precondition {
        let etag = etag_from_sha256(SHA);
        let owned: Vec<(&str, Vec<u8>)> =
            pairs.iter().map(|(n, v)| (*n, render_wire_value(v, &etag, lm()).into_bytes())).collect();
        let v = Validators { etag: &etag, last_modified: lm() };
        evaluate(method, &headers_of(&owned), &v, now)
    }

    #[test]
    fn wire_table() {
        let etag = etag_from_sha256(SHA);
        let mut failures = Vec::new();
        for c in wire_cases() {
            let mut pairs: Vec<(&str, Vec<u8>)> =
                c.headers.iter().map(|(n, v)| (*n, render_wire_value(v, &etag, lm()).into_bytes())).collect();
            pairs.push(("range", b"bytes=0-0".to_vec()));
            for (_, value) in &pairs {
                assert!(!value.contains(&b'{'), "{}: unrendered token", c.name);
            }
            let method = Method::from_bytes(c.method.as_bytes()).expect("method");
            let now = if c.fresh { lm() } else { lm() + Duration::from_secs(3600) };
            let v = Validators { etag: &etag, last_modified: lm() };
            let got = evaluate(&method, &headers_of(&pairs), &v, now).status_with_range();
            if got != c.status {
                failures.push(format!("{}: expected {}, got {got}", c.name, c.status));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    #[test]
    fn wire_table_shape() {
        let cases = wire_cases();
        assert!(cases.len() >= 35, "only {} cases", cases.len());
        let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cases.len(), "duplicate case names");
        for status in [200, 206, 304, 412] {
            assert!(cases.iter().any(|c| c.status == status), "no {status} case");
        }
    }

    #[test]
    fn render_tokens() {
        let etag = "\"abc\"";
        assert_eq!(render_wire_value("{ETAG}", etag, lm()), "\"abc\"");
        assert_eq!(render_wire_value("{WEAK_ETAG}", etag, lm()), "W/\"abc\"");
        assert_eq!(render_wire_value("x{OPAQUE}y", etag, lm()), "xabcy");
        assert_eq!(render_wire_value("{LM}", etag, lm()), "Wed, 01 May 2024 12:00:00 GMT");
        assert_eq!(
            render_wire_value("{LM+1}|{LM-1}", etag, lm()),
            "Wed, 01 May 2024 12:00:01 GMT|Wed, 01 May 2024 11:59:59 GMT"
        );
        assert_eq!(render_wire_value("{LM_RFC850}", etag, lm()), "Wednesday, 01-May-24 12:00:00 GMT");
        assert_eq!(render_wire_value("{LM_ASCTIME}", etag, lm()), "Wed May  1 12:00:00 2024");
        assert_eq!(render_wire_value("{NOPE} {", etag, lm()), "{NOPE} {");
    }

    #[test]
    fn three_date_formats_agree() {
        let imf = parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(imf.is_some());
        assert_eq!(imf, parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"));
        assert_eq!(imf, parse_http_date(b"Sun Nov  6 08:49:37 1994"));
        assert_eq!(imf, parse_http_date(b" \tSun, 06 Nov 1994 08:49:37 GMT\t "));
    }

    #[test]
    fn invalid_dates_rejected() {
        for bad in [
            &b""[..],
            b"Mon, 06 Nov 1994 08:49:37 GMT", // wrong weekday
            b"Sun, 06 Nov 1994 08:49:37 gmt",
            b"Sun, 06 Nov 1994 08:49:37 UTC",
            b"Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT",
            b"Sun, 06 Nov 1994 08:49:37 GMT\x0c",
            b"Sun, 06 Nov 1994 08:49:37 \xffGMT",
            b"\xc3\xa9",
            b"Thu, 31 Dec 1969 23:59:59 GMT",
            b"Sun, 31 Feb 2024 00:00:00 GMT",
            b"1714564800",
        ] {
            assert_eq!(parse_http_date(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn format_http_date_clamps() {
        assert_eq!(format_http_date(lm()), "Wed, 01 May 2024 12:00:00 GMT");
        assert_eq!(format_http_date(lm() + Duration::from_millis(999)), "Wed, 01 May 2024 12:00:00 GMT");
        let before = UNIX_EPOCH - Duration::from_secs(5);
        assert_eq!(format_http_date(before), "Thu, 01 Jan 1970 00:00:00 GMT");
        let far = UNIX_EPOCH + Duration::from_secs(400_000_000_000);
        assert_eq!(format_http_date(far), "Fri, 31 Dec 9999 23:59:59 GMT");
    }

    #[test]
    fn etag_format() {
        let tag = etag_from_sha256(SHA);
        assert_eq!(tag.len(), 66);
        assert_eq!(tag, format!("\"{SHA}\""));
        assert_eq!(etag_from_sha256("ABcd"), "\"abcd\"");
        assert_eq!(etag_from_sha256("a\"b\r\nc"), "\"abc\"");
        assert_eq!(etag_from_sha256(""), "\"\"");
        assert!(parse_entity_tag(tag.as_bytes()).is_some_and(|t| !t.weak));
    }

    #[test]
    fn list_tokeniser() {
        let elems: Vec<_> = ListIter { rest: b" ,\"a,b\" , W/\"c\",*,x\"y\", \"unterminated, \"d\"" }.collect();
        assert_eq!(
            elems,
            vec![
                Element::Tag(EntityTag { weak: false, opaque: b"a,b" }),
                Element::Tag(EntityTag { weak: true, opaque: b"c" }),
                Element::Star,
                Element::Malformed,
                Element::Malformed,
                Element::Tag(EntityTag { weak: false, opaque: b"d" }),
            ]
        );
        assert_eq!(ListIter { rest: b"" }.count(), 0);
        assert_eq!(ListIter { rest: b" , ,\t" }.count(), 0);
    }

    #[test]
    fn bad_stored_etag_never_matches() {
        let headers = headers_of(&[("if-none-match", b"\"abc\"".to_vec()), ("if-range", b"\"abc\"".to_vec())]);
        for etag in ["abc", "W/\"abc\"", "\"abc", ""] {
            let v = Validators { etag, last_modified: lm() };
            let got = evaluate(&Method::GET, &headers, &v, lm() + Duration::from_secs(60));
            // W/"abc" matches If-None-Match weakly, the rest not at all; none match If-Range strongly.
            let expected = if etag == "W/\"abc\"" {
                Precondition::NotModified
            } else {
                Precondition::Proceed { honor_range: false }
            };
            assert_eq!(got, expected, "{etag}");
        }
        let im = headers_of(&[("if-match", b"W/\"abc\"".to_vec())]);
        let v = Validators { etag: "W/\"abc\"", last_modified: lm() };
        assert_eq!(evaluate(&Method::GET, &im, &v, lm()), Precondition::Failed);
    }

    #[test]
    fn subsecond_last_modified_is_truncated() {
        let etag = etag_from_sha256(SHA);
        let v = Validators { etag: &etag, last_modified: lm() + Duration::from_millis(700) };
        let h = headers_of(&[("if-modified-since", b"Wed, 01 May 2024 12:00:00 GMT".to_vec())]);
        let now = lm() + Duration::from_secs(10);
        assert_eq!(evaluate(&Method::GET, &h, &v, now), Precondition::NotModified);
        let h = headers_of(&[("if-range", b"Wed, 01 May 2024 12:00:00 GMT".to_vec())]);
        assert_eq!(evaluate(&Method::GET, &h, &v, now), Precondition::Proceed { honor_range: true });
        // 0.9 s after the (truncated) second began is not yet a full second: weak.
        let now = lm() + Duration::from_millis(900);
        assert_eq!(evaluate(&Method::GET, &h, &v, now), Precondition::Proceed { honor_range: false });
    }

    #[test]
    fn other_methods() {
        let now = lm() + Duration::from_secs(60);
        for m in [Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            assert_eq!(eval(&m, &[("if-none-match", "{WEAK_ETAG}")], now), Precondition::Failed);
            assert_eq!(eval(&m, &[("if-match", "{ETAG}")], now), Precondition::Proceed { honor_range: true });
            // If-Range has no meaning without GET.
            assert_eq!(eval(&m, &[("if-range", "\"x\"")], now), Precondition::Proceed { honor_range: true });
        }
    }

    #[test]
    fn clock_before_last_modified() {
        // Skewed clock: If-Modified-Since {LM} is "in the future" and ignored; If-Range date weak.
        let now = lm() - Duration::from_secs(5);
        assert_eq!(
            eval(&Method::GET, &[("if-modified-since", "{LM}")], now),
            Precondition::Proceed { honor_range: true }
        );
        assert_eq!(eval(&Method::GET, &[("if-range", "{LM}")], now), Precondition::Proceed { honor_range: false });
    }

    fn fragment() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(b"\"".to_vec()),
            Just(b"W/".to_vec()),
            Just(b"w/".to_vec()),
            Just(b",".to_vec()),
            Just(b"*".to_vec()),
            Just(b" ".to_vec()),
            Just(b"\t".to_vec()),
            Just(format!("\"{SHA}\"").into_bytes()),
            Just(b"Wed, 01 May 2024 12:00:00 GMT".to_vec()),
            Just(b"Wednesday, 01-May-24 12:00:00 GMT".to_vec()),
            Just(b"Wed May  1 12:00:00 2024".to_vec()),
            "[ -~]{0,8}".prop_map(String::into_bytes),
            any::<u8>().prop_map(|b| vec![b]),
        ]
    }

    fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..48),
            proptest::collection::vec(fragment(), 0..10).prop_map(|v| v.concat()),
        ]
    }

    fn time_from(secs: i64, nanos: u32) -> SystemTime {
        let base = if secs >= 0 {
            UNIX_EPOCH.checked_add(Duration::from_secs(secs.unsigned_abs()))
        } else {
            UNIX_EPOCH.checked_sub(Duration::from_secs(secs.unsigned_abs()))
        };
        base.and_then(|t| t.checked_add(Duration::from_nanos(u64::from(nanos)))).unwrap_or(UNIX_EPOCH)
    }

    const NAMES: [&str; 7] =
        ["if-match", "if-none-match", "if-modified-since", "if-unmodified-since", "if-range", "range", "x-other"];
    const METHODS: [&str; 7] = ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "FROB"];

    proptest! {
        #[test]
        fn evaluate_never_panics(
            method in 0..METHODS.len(),
            fields in proptest::collection::vec((0..NAMES.len(), header_bytes()), 0..8),
            etag in prop_oneof![Just(format!("\"{SHA}\"")), ".{0,12}"],
            lm_secs in -20_000_000_000i64..300_000_000_000i64,
            lm_nanos in 0u32..1_000_000_000,
            now_secs in -20_000_000_000i64..300_000_000_000i64,
            now_nanos in 0u32..1_000_000_000,
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &fields {
                if let Ok(value) = HeaderValue::from_bytes(value) {
                    headers.append(HeaderName::from_static(NAMES[*name]), value);
                }
            }
            let method = Method::from_bytes(METHODS[method].as_bytes()).expect("method");
            let v = Validators { etag: &etag, last_modified: time_from(lm_secs, lm_nanos) };
            let _ = evaluate(&method, &headers, &v, time_from(now_secs, now_nanos));
            for (_, value) in &fields {
                let _ = parse_http_date(value);
                let _ = ListIter { rest: value }.count();
            }
            let _ = format_http_date(time_from(lm_secs, lm_nanos));
            let _ = etag_from_sha256(&etag);
            let _ = render_wire_value(&etag, &etag, time_from(lm_secs, lm_nanos));
        }

        #[test]
        fn list_with_exact_etag_is_not_modified(
            opaque in "[!#-~\u{80}-\u{ff}]{0,24}",
            others in proptest::collection::vec((any::<bool>(), "[!#-~]{0,10}"), 0..6),
            position in any::<prop::sample::Index>(),
            weak_copy in any::<bool>(),
            seps in proptest::collection::vec(
                prop_oneof![Just(","), Just(" , "), Just("\t,"), Just(", ,"), Just(",,\t ")], 7),
            lines_at in any::<prop::sample::Index>(),
            lead in prop_oneof![Just(""), Just(" "), Just(", ")],
            ims in header_bytes(),
            if_range in header_bytes(),
        ) {
            let etag = format!("\"{opaque}\"");
            let mut elems: Vec<String> = others
                .iter()
                .map(|(weak, o)| format!("{}\"{o}\"", if *weak { "W/" } else { "" }))
                .collect();
            let own = if weak_copy { format!("W/{etag}") } else { etag.clone() };
            elems.insert(position.index(elems.len() + 1), own);
            // Split the list over two field lines at a random element boundary.
            let split = lines_at.index(elems.len() + 1);
            let join = |part: &[String]| {
                let mut s = lead.to_owned();
                for (i, e) in part.iter().enumerate() {
                    if i > 0 { s.push_str(seps[i % seps.len()]); }
                    s.push_str(e);
                }
                s
            };
            let mut headers = HeaderMap::new();
            for line in [join(&elems[..split]), join(&elems[split..])] {
                let value = HeaderValue::from_bytes(line.as_bytes()).expect("valid line");
                headers.append(header::IF_NONE_MATCH, value);
            }
            for (name, value) in [(header::IF_MODIFIED_SINCE, ims), (header::IF_RANGE, if_range)] {
                if let Ok(value) = HeaderValue::from_bytes(&value) {
                    headers.append(name, value);
                }
            }
            let v = Validators { etag: &etag, last_modified: lm() };
            prop_assert_eq!(
                evaluate(&Method::GET, &headers, &v, lm() + Duration::from_secs(60)),
                Precondition::NotModified
            );
        }

        #[test]
        fn http_date_round_trips(secs in 0u64..=MAX_HTTP_DATE_SECS) {
            let t = UNIX_EPOCH + Duration::from_secs(secs);
            let text = format_http_date(t);
            prop_assert_eq!(parse_http_date(text.as_bytes()), Some(t));
            prop_assert_eq!(parse_http_date(render_wire_value("{LM_ASCTIME}", "", t).as_bytes()), Some(t));
        }
    }

    #[test]
    fn a_write_is_conditioned_on_star_or_one_entity_tag() {
        let with = |fields: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (name, value) in fields {
                h.append(*name, http::HeaderValue::from_static(value));
            }
            write_condition(&h)
        };
        assert_eq!(with(&[]), Ok(WriteCondition::Always));
        assert_eq!(with(&[("if-none-match", "*")]), Ok(WriteCondition::IfAbsent));
        assert_eq!(with(&[("if-match", "*")]), Ok(WriteCondition::IfMatch("*".into())));
        assert_eq!(with(&[("if-match", " \"abc\" ")]), Ok(WriteCondition::IfMatch("\"abc\"".into())));
        assert_eq!(with(&[("if-match", "abc")]), Ok(WriteCondition::IfMatch("\"abc\"".into())), "S3 clients' bare tag");
        assert_eq!(with(&[("if-none-match", "*"), ("if-match", "*")]), Err(WriteConditionError::Both));
        assert_eq!(with(&[("if-none-match", "\"abc\"")]), Err(WriteConditionError::IfNoneMatchTag));
        assert_eq!(with(&[("if-match", "\"a\", \"b\"")]), Err(WriteConditionError::SeveralValues(header::IF_MATCH)));
        assert_eq!(
            with(&[("if-match", "\"a\""), ("if-match", "\"b\"")]),
            Err(WriteConditionError::SeveralValues(header::IF_MATCH))
        );
        assert!(matches!(with(&[("if-match", "\"\"")]), Err(WriteConditionError::NotAnEntityTag(_))));
    }
}
