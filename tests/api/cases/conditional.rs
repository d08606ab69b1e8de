//! The precondition table (RFC 9110 §13): conditional header fields a row, and the status they must give.
//!
//! Test code only: the unit tests of `src/http/conditional.rs` include this file (`#[path]`) and check it
//! against `evaluate`; `tests/api/downloads.rs` replays it over the wire. It uses nothing from the crate so
//! that both can; the dates are formatted with `httpdate`, as the gateway formats them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// One row of the precondition table, replayable over the wire.
///
/// A replayer uploads (or picks) an object with strong etag ETAG and Last-Modified LM, at least a
/// few seconds old, and for each row sends `method` with the rendered `headers` (see
/// [`render_wire_value`]) plus `Range: bytes=0-0`, then expects `status`.
/// Tokens in header values:
/// - `{ETAG}`: the strong etag with its quotes; `{WEAK_ETAG}`: `W/` + ETAG; `{OPAQUE}`: ETAG without quotes.
/// - `{LM}`, `{LM+1}`, `{LM-1}`: IMF-fixdate of LM, one second later, one second earlier.
/// - `{LM_RFC850}`, `{LM_ASCTIME}`: LM in the obsolete RFC 850 and asctime formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CondCase {
    /// Short unique name.
    pub name: &'static str,
    /// Request method. Rows with other methods than GET/HEAD state what `evaluate` decides; a
    /// gateway that rejects the method first answers 405 instead.
    pub method: &'static str,
    /// Conditional header fields in order; a repeated name is sent as several field lines.
    pub headers: &'static [(&'static str, &'static str)],
    /// Evaluated with `now == LM` (Last-Modified not yet strong). Only replayable within the second
    /// the object was written; replayers using an older object skip these rows.
    pub fresh: bool,
    /// Expected status given `Range: bytes=0-0`: 206, 200 (If-Range mismatch), 304 or 412.
    /// For HEAD a server that ignores Range on HEAD (allowed by §14.2) answers 200 instead of 206.
    pub status: u16,
}

const fn case(
    name: &'static str,
    method: &'static str,
    headers: &'static [(&'static str, &'static str)],
    status: u16,
) -> CondCase {
    CondCase { name, method, headers, fresh: false, status }
}

const fn fresh(mut c: CondCase) -> CondCase {
    c.fresh = true;
    c
}

const IM: &str = "if-match";
const INM: &str = "if-none-match";
const IMS: &str = "if-modified-since";
const IUS: &str = "if-unmodified-since";
const IR: &str = "if-range";

/// The table; see [`CondCase`]. One row per line reads better as a table.
#[rustfmt::skip]
pub fn wire_cases() -> &'static [CondCase] {
    const CASES: &[CondCase] = &[
        case("none", "GET", &[], 206),
        // If-Match: strong comparison (§13.1.1).
        case("im_exact", "GET", &[(IM, "{ETAG}")], 206),
        case("im_star", "GET", &[(IM, "*")], 206),
        case("im_other", "GET", &[(IM, "\"other\"")], 412),
        case("im_weak_same", "GET", &[(IM, "{WEAK_ETAG}")], 412),
        case("im_weak_then_strong", "GET", &[(IM, "{WEAK_ETAG}, {ETAG}")], 206),
        case("im_list_ows", "GET", &[(IM, "\"a\" ,\t{ETAG} , \"b\"")], 206),
        case("im_empty_elems", "GET", &[(IM, ", ,{ETAG},,")], 206),
        case("im_two_lines", "GET", &[(IM, "\"a\""), (IM, "{ETAG}")], 206),
        case("im_comma_in_tag", "GET", &[(IM, "\"a,b\", {ETAG}")], 206),
        case("im_malformed_elem", "GET", &[(IM, "\"a\", bogus, {ETAG}")], 412),
        case("im_star_and_tag", "GET", &[(IM, "*, {ETAG}")], 412),
        case("im_lowercase_w", "GET", &[(IM, "w/{ETAG}")], 412),
        case("im_unquoted", "GET", &[(IM, "{OPAQUE}")], 412),
        case("im_empty_value", "GET", &[(IM, "")], 412),
        case("im_head_other", "HEAD", &[(IM, "\"other\"")], 412),
        // If-Unmodified-Since (§13.1.4), only without If-Match.
        case("ius_equal", "GET", &[(IUS, "{LM}")], 206),
        case("ius_after", "GET", &[(IUS, "{LM+1}")], 206),
        case("ius_before", "GET", &[(IUS, "{LM-1}")], 412),
        case("ius_rfc850_before", "GET", &[(IUS, "Sunday, 06-Nov-94 08:49:37 GMT")], 412),
        case("ius_invalid", "GET", &[(IUS, "not a date")], 206),
        case("ius_two_lines", "GET", &[(IUS, "{LM-1}"), (IUS, "{LM-1}")], 206),
        case("im_beats_ius", "GET", &[(IM, "{ETAG}"), (IUS, "{LM-1}")], 206),
        case("ius_fail_beats_inm", "GET", &[(IUS, "{LM-1}"), (INM, "{ETAG}")], 412),
        // If-None-Match: weak comparison (§13.1.2).
        case("inm_exact", "GET", &[(INM, "{ETAG}")], 304),
        case("inm_weak", "GET", &[(INM, "{WEAK_ETAG}")], 304),
        case("inm_star", "GET", &[(INM, "*")], 304),
        case("inm_other", "GET", &[(INM, "\"other\"")], 206),
        case("inm_list_ows", "GET", &[(INM, "\"a\" ,  {WEAK_ETAG}\t,")], 304),
        case("inm_two_lines", "GET", &[(INM, "\"a\""), (INM, "{ETAG}")], 304),
        case("inm_obs_text", "GET", &[(INM, "\"\u{e9}\", {ETAG}")], 304),
        case("inm_malformed_skip", "GET", &[(INM, "bogus, {ETAG}")], 304),
        case("inm_malformed_only", "GET", &[(INM, "bogus")], 206),
        case("inm_star_and_tag", "GET", &[(INM, "*, \"other\"")], 206),
        case("inm_head", "HEAD", &[(INM, "{ETAG}")], 304),
        case("inm_post", "POST", &[(INM, "{ETAG}")], 412),
        case("inm_put_star", "PUT", &[(INM, "*")], 412),
        case("im_fail_beats_inm", "GET", &[(IM, "\"other\""), (INM, "{ETAG}")], 412),
        case("im_pass_inm_304", "GET", &[(IM, "{ETAG}"), (INM, "{ETAG}")], 304),
        // If-Modified-Since (§13.1.3), only without If-None-Match and only for GET/HEAD.
        case("ims_equal", "GET", &[(IMS, "{LM}")], 304),
        case("ims_later", "GET", &[(IMS, "{LM+1}")], 304),
        case("ims_earlier", "GET", &[(IMS, "{LM-1}")], 206),
        case("ims_rfc850", "GET", &[(IMS, "{LM_RFC850}")], 304),
        case("ims_asctime", "GET", &[(IMS, "{LM_ASCTIME}")], 304),
        case("ims_ows", "GET", &[(IMS, "  {LM}\t")], 304),
        case("ims_invalid", "GET", &[(IMS, "yesterday")], 206),
        case("ims_lower_gmt", "GET", &[(IMS, "Fri, 31 Dec 1999 23:59:59 gmt")], 206),
        case("ims_two_lines", "GET", &[(IMS, "{LM}"), (IMS, "{LM}")], 206),
        case("ims_future", "GET", &[(IMS, "Fri, 31 Dec 9999 23:59:59 GMT")], 206),
        case("ims_head", "HEAD", &[(IMS, "{LM}")], 304),
        case("ims_post_ignored", "POST", &[(IMS, "{LM}")], 206),
        case("inm_miss_ims_ignored", "GET", &[(INM, "\"other\""), (IMS, "{LM}")], 206),
        case("inm_empty_ims_ignored", "GET", &[(INM, ""), (IMS, "{LM}")], 206),
        fresh(case("ims_fresh", "GET", &[(IMS, "{LM}")], 304)),
        // If-Range (§13.1.5).
        case("ir_etag", "GET", &[(IR, "{ETAG}")], 206),
        case("ir_etag_other", "GET", &[(IR, "\"other\"")], 200),
        case("ir_weak", "GET", &[(IR, "{WEAK_ETAG}")], 200),
        case("ir_star", "GET", &[(IR, "*")], 200),
        case("ir_list", "GET", &[(IR, "{ETAG}, {ETAG}")], 200),
        case("ir_two_lines", "GET", &[(IR, "{ETAG}"), (IR, "{ETAG}")], 200),
        case("ir_garbage", "GET", &[(IR, "garbage")], 200),
        case("ir_date_exact", "GET", &[(IR, "{LM}")], 206),
        case("ir_date_rfc850", "GET", &[(IR, "{LM_RFC850}")], 206),
        case("ir_date_plus1", "GET", &[(IR, "{LM+1}")], 200),
        case("ir_date_minus1", "GET", &[(IR, "{LM-1}")], 200),
        fresh(case("ir_date_not_strong", "GET", &[(IR, "{LM}")], 200)),
        fresh(case("ir_etag_fresh", "GET", &[(IR, "{ETAG}")], 206)),
        case("ir_head_other", "HEAD", &[(IR, "\"other\"")], 200),
        case("ir_after_inm_miss", "GET", &[(INM, "\"other\""), (IR, "{ETAG}")], 206),
        case("ims_304_beats_ir", "GET", &[(IMS, "{LM}"), (IR, "\"other\"")], 304),
        case("im_412_beats_ir", "GET", &[(IM, "\"other\""), (IR, "{ETAG}")], 412),
    ];
    CASES
}

/// Substitutes the [`CondCase`] tokens in `template`; unknown `{...}` text is copied as is.
pub fn render_wire_value(template: &str, etag: &str, lm: SystemTime) -> String {
    let second = Duration::from_secs(1);
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let Some(end) = tail.find('}') else {
            rest = tail;
            break;
        };
        let token = &tail[..=end];
        match token {
            "{ETAG}" => out.push_str(etag),
            "{WEAK_ETAG}" => {
                out.push_str("W/");
                out.push_str(etag);
            }
            "{OPAQUE}" => out.push_str(etag.trim_matches('"')),
            "{LM}" => out.push_str(&format_http_date(lm)),
            "{LM+1}" => out.push_str(&format_http_date(lm.checked_add(second).unwrap_or(lm))),
            "{LM-1}" => out.push_str(&format_http_date(lm.checked_sub(second).unwrap_or(lm))),
            "{LM_RFC850}" => out.push_str(&format_rfc850_date(lm)),
            "{LM_ASCTIME}" => out.push_str(&format_asctime_date(lm)),
            other => out.push_str(other),
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Obsolete RFC 850 form (`Wednesday, 01-May-24 12:00:00 GMT`); only for replaying obsolete formats.
fn format_rfc850_date(t: SystemTime) -> String {
    let imf = format_http_date(t);
    let parts = (|| {
        let day_name = match imf.get(0..3)? {
            "Mon" => "Monday",
            "Tue" => "Tuesday",
            "Wed" => "Wednesday",
            "Thu" => "Thursday",
            "Fri" => "Friday",
            "Sat" => "Saturday",
            _ => "Sunday",
        };
        let (day, month, year2, time) = (imf.get(5..7)?, imf.get(8..11)?, imf.get(14..16)?, imf.get(17..25)?);
        Some(format!("{day_name}, {day}-{month}-{year2} {time} GMT"))
    })();
    parts.unwrap_or(imf)
}

/// Obsolete asctime form (`Wed May  1 12:00:00 2024`); only for replaying obsolete formats.
fn format_asctime_date(t: SystemTime) -> String {
    let imf = format_http_date(t);
    let parts = (|| {
        let (day_name, day, month, year, time) =
            (imf.get(0..3)?, imf.get(5..7)?, imf.get(8..11)?, imf.get(12..16)?, imf.get(17..25)?);
        let day = day.strip_prefix('0').map_or(day.to_owned(), |d| format!(" {d}"));
        Some(format!("{day_name} {month} {day} {time} {year}"))
    })();
    parts.unwrap_or(imf)
}

/// IMF-fixdate of `t` (`httpdate` drops sub-seconds, as the gateway's Last-Modified does), clamped to what `httpdate` can format (it panics outside).
fn format_http_date(t: SystemTime) -> String {
    let max = UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    httpdate::fmt_http_date(t.clamp(UNIX_EPOCH, max))
}
