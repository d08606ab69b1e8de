//! RFC 9110 §14 byte-range evaluation for a static representation of known size.
//!
//! [`evaluate`] is a pure function: it takes the raw `Range` field value (if any), the length of the
//! selected representation and a [`RangePolicy`], and says whether to answer 200 with the whole
//! representation ([`RangeDecision::Full`]), 206 with some ranges ([`RangeDecision::Partial`]) or
//! 416 ([`RangeDecision::Unsatisfiable`]). It does no IO and allocates nothing but the result `Vec`.
//!
//! What stays with the caller: only apply this to GET (§14.2: range handling is only defined for
//! GET), evaluate preconditions and `If-Range` first (§13.2.2, §13.1.5), treat more than one `Range`
//! field line as an invalid specifier (joined with ", " as §5.3 combines them, they already parse
//! as invalid here, since `bytes=` inside a range-spec is junk), and format
//! `Content-Range: bytes {start}-{last}/{size}` (§14.4) or `bytes */{size}` for 416 (§15.5.17).
//!
//! # Decisions
//!
//! * **Invalid is ignored, not rejected.** §14.2 lets a server "ignore or reject" a `Range` field
//!   with an invalid ranges-specifier. We ignore it ([`RangeDecision::Full`]): a 200 is something
//!   every client recovers from, and a 416 would claim the file cannot supply what was asked when
//!   in fact nothing coherent was asked. Invalid means: no `=`, an empty range-set, any range-spec
//!   that is not exactly `1*DIGIT "-" [1*DIGIT]` or `"-" 1*DIGIT`, signs, hex, non-ASCII, whitespace
//!   inside a range-spec or between the unit and `=`, or an int-range whose last-pos is less than
//!   its first-pos (§14.1.1 makes one invalid range-spec poison the whole specifier). An unknown
//!   range unit is likewise ignored (§14.2). The unit is compared case-insensitively (§14.1).
//! * **List syntax is lenient** (§5.6.1.2): OWS around commas and empty list elements are accepted
//!   (`bytes=0-1,,2-3`, `bytes=0-1 , 2-3`), as is OWS right after `=` and at either end of the field
//!   value (§5.5 excludes that whitespace from the value anyway). A range-set of only empty
//!   elements is still empty, hence invalid.
//! * **Numerals of any length** (§14.1.2: "recipients MUST anticipate potentially large decimal
//!   numerals"): digits are accumulated with saturating arithmetic and compared exactly as digit
//!   strings, so a first-pos beyond `u64` is unsatisfiable, a last-pos beyond `u64` means "to the
//!   end", a suffix-length beyond `u64` means "the whole representation", and `first > last` is
//!   detected even when both overflow. Nothing panics on any input.
//! * **Zero-length representation**: an int-range is never satisfiable (§14.1.2), so a valid
//!   specifier made only of int-ranges and `-0` suffixes is [`RangeDecision::Unsatisfiable`]
//!   (416 with `bytes */0` tells a resuming client it already has everything). A non-zero
//!   suffix-range *is* satisfiable on zero length (§14.1.2), but §14.4 has no `Content-Range` for an
//!   empty range, so we take §14.2's permission to ignore `Range` for an empty representation and
//!   answer [`RangeDecision::Full`] (an empty 200).
//! * **Abuse caps → Full** (§14.2 names "more than two overlapping ranges or a set of many small
//!   ranges that are not listed in ascending order" as attack signs and allows ignoring them):
//!   more than [`RangePolicy::max_parts`] range-specs (satisfiable or not; empty list elements do
//!   not count), more than [`RangePolicy::max_overlaps`] overlapping ranges, more than
//!   [`RangePolicy::max_reversals`] descending steps, or satisfiable ranges whose lengths add up to
//!   more than the representation (counting overlaps every time: the CVE-2011-3192 "Apache killer"
//!   defence). So a 206 body never exceeds `size` plus `max_parts` part headers.
//! * **Coalescing** (§15.3.7.2 allows it "regardless of the order"): after dropping unsatisfiable
//!   members, ranges that overlap, touch, or are separated by fewer than
//!   [`RangePolicy::part_overhead`] bytes are merged, because sending the gap is cheaper than
//!   another part.
//! * **Ordering**: when nothing merges, parts keep request order (§15.3.7.2 SHOULD). When anything
//!   merges, a merged part has no single position in the request, so the whole result is sent in
//!   ascending order, which every client handles.
//! * **A range of everything is still a 206**: if the result is one range covering `0..size`
//!   (`bytes=0-`, `bytes=0-99999`, or parts that coalesce into the whole), the answer is a
//!   single-part [`RangeDecision::Partial`] with `Content-Range`, as nginx, Apache, Caddy and S3
//!   answer. Media players and download managers send `bytes=0-` to learn whether ranges work; a
//!   200 made Chrome reset the connection and ask again.

/// A satisfiable byte range, half-open: `start..end`, with `start < end <= size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    /// Number of bytes in the range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Never true for a range produced by [`evaluate`].
    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }

    /// Last byte position, inclusive, as written in `Content-Range` (§14.4).
    pub fn last(&self) -> u64 {
        self.end.saturating_sub(1)
    }
}

/// Default for [`RangePolicy::max_parts`].
pub const DEFAULT_MAX_PARTS: usize = 64;
/// Default for [`RangePolicy::part_overhead`].
pub const DEFAULT_PART_OVERHEAD: u64 = 80;
/// Default for [`RangePolicy::max_overlaps`]: §14.2's "more than two overlapping ranges".
pub const DEFAULT_MAX_OVERLAPS: usize = 2;
/// Default for [`RangePolicy::max_reversals`].
pub const DEFAULT_MAX_REVERSALS: usize = 8;

/// Abuse caps and the multipart overhead used when coalescing.
#[derive(Debug, Clone)]
pub struct RangePolicy {
    /// More range-specs than this in one header: the Range header is ignored (serve 200 full).
    /// Counts every non-empty list element, satisfiable or not. Default 64.
    pub max_parts: usize,
    /// Approximate bytes a multipart part costs (boundary line + part headers). Ranges separated
    /// by a gap smaller than this are coalesced, because sending the gap is cheaper than another
    /// part. Default 80.
    pub part_overhead: u64,
    /// More overlapping satisfiable ranges than this: the Range header is ignored. Sorted by start,
    /// a range "overlaps" when it shares at least one byte with a range before it; equivalently,
    /// the number of ranges minus the number of clusters that merging only overlaps would leave.
    /// Default 2 (§14.2).
    pub max_overlaps: usize,
    /// More "reversals" than this: the Range header is ignored. A reversal is a satisfiable range
    /// that starts before the satisfiable range preceding it in the request. Default 8: legitimate
    /// multi-range clients ask in ascending order (§14.2).
    pub max_reversals: usize,
}

impl Default for RangePolicy {
    fn default() -> Self {
        RangePolicy {
            max_parts: DEFAULT_MAX_PARTS,
            part_overhead: DEFAULT_PART_OVERHEAD,
            max_overlaps: DEFAULT_MAX_OVERLAPS,
            max_reversals: DEFAULT_MAX_REVERSALS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeDecision {
    /// Send the whole representation with 200: no Range header, an ignored one (unknown unit,
    /// invalid syntax, over a cap), or ranges that add up to more than the representation. A
    /// valid range that covers the whole representation is `Partial`, not this.
    Full,
    /// Send 206 with these non-empty, pairwise non-overlapping, non-adjacent ranges, in response
    /// order. One element means a single-part 206 with Content-Range; more means
    /// multipart/byteranges.
    Partial(Vec<ByteRange>),
    /// 416 with `Content-Range: bytes */size`: a valid bytes ranges-specifier none of whose ranges
    /// is satisfiable.
    Unsatisfiable,
}

/// `header` is the raw value of the (single) Range header field; None when absent.
pub fn evaluate(header: Option<&[u8]>, size: u64, policy: &RangePolicy) -> RangeDecision {
    let Some(header) = header else {
        return RangeDecision::Full;
    };
    let mut ranges = Vec::new();
    // Unknown unit, invalid syntax or too many specs: ignore the field (§14.2).
    let Some(scan) = scan(header, size, policy.max_parts, &mut ranges) else {
        return RangeDecision::Full;
    };
    if size == 0 {
        // §14.1.2: only a non-zero suffix-range is satisfiable, and it selects nothing that
        // §14.4 could describe; §14.2 lets us ignore Range for a zero-length representation.
        return if scan.nonzero_suffix { RangeDecision::Full } else { RangeDecision::Unsatisfiable };
    }
    if ranges.is_empty() {
        // §14.2 / §15.5.17: valid, but nothing satisfiable.
        return RangeDecision::Unsatisfiable;
    }
    // CVE-2011-3192: overlapping specs must not multiply the body; count overlaps every time.
    let mut total: u64 = 0;
    for r in &ranges {
        match total.checked_add(r.len()) {
            Some(t) if t <= size => total = t,
            _ => return RangeDecision::Full,
        }
    }
    // §14.2: many ranges not in ascending order signal a broken client or an attack.
    if scan.reversals > policy.max_reversals {
        return RangeDecision::Full;
    }
    coalesce(ranges, policy)
}

/// What [`scan`] learned about a valid bytes ranges-specifier besides its satisfiable ranges.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Scan {
    /// Non-empty list elements (range-specs).
    specs: usize,
    /// Some range-spec was a suffix-range with a non-zero suffix-length.
    nonzero_suffix: bool,
    /// Satisfiable ranges starting before the preceding satisfiable range.
    reversals: usize,
}

/// Parses `header` as a bytes ranges-specifier and pushes its satisfiable ranges, resolved
/// against `size`, onto `out` in request order. `None` means "ignore the field": not the bytes
/// unit, invalid, or more than `max_parts` range-specs (then `out` may hold a prefix).
fn scan(header: &[u8], size: u64, max_parts: usize, out: &mut Vec<ByteRange>) -> Option<Scan> {
    // §5.5: a field value carries no leading or trailing whitespace.
    let value = trim_ows(header);
    // §14.1.1: ranges-specifier = range-unit "=" range-set. A token cannot contain "=", so the
    // first one separates; whitespace before it makes the unit something other than "bytes".
    let eq = value.iter().position(|&b| b == b'=')?;
    let (unit, set) = (&value[..eq], &value[eq + 1..]);
    // §14.1: range unit names are case-insensitive. Any other unit is ignored (§14.2).
    if !unit.eq_ignore_ascii_case(b"bytes") {
        return None;
    }
    let mut scan = Scan::default();
    let mut prev_start: Option<u64> = None;
    // §5.6.1.2: accept OWS around commas and ignore empty list elements.
    for element in set.split(|&b| b == b',') {
        let element = trim_ows(element);
        if element.is_empty() {
            continue;
        }
        scan.specs += 1;
        if scan.specs > max_parts {
            return None;
        }
        // §14.1.1: one invalid range-spec makes the whole ranges-specifier invalid.
        let spec = parse_spec(element)?;
        if matches!(spec, Spec::Suffix(n) if n > 0) {
            scan.nonzero_suffix = true;
        }
        if let Some(r) = resolve(spec, size) {
            if prev_start.is_some_and(|p| r.start < p) {
                scan.reversals += 1;
            }
            prev_start = Some(r.start);
            out.push(r);
        }
    }
    // §14.1.1: range-set = 1#range-spec, so at least one element is required.
    if scan.specs == 0 {
        return None;
    }
    Some(scan)
}

/// Merges ranges closer than `part_overhead` (§15.3.7.2) and applies the overlap cap.
fn coalesce(mut ranges: Vec<ByteRange>, policy: &RangePolicy) -> RangeDecision {
    let n = ranges.len();
    // Sort a copy in the second half of the same allocation, so request order survives when
    // nothing merges.
    ranges.extend_from_within(..);
    let sorted = &mut ranges[n..];
    sorted.sort_unstable_by_key(|r| (r.start, r.end));
    // Adjacent ranges must always merge (the result is promised non-adjacent), hence at least 1.
    let min_gap = policy.part_overhead.max(1);
    let mut overlaps = 0usize;
    let mut kept = 0usize;
    for i in 0..sorted.len() {
        let next = sorted[i];
        if kept > 0 {
            // `last.end` is the furthest end seen so far: a kept range starts past it.
            let last = &mut sorted[kept - 1];
            if next.start < last.end {
                overlaps += 1;
            }
            if next.start.saturating_sub(last.end) < min_gap {
                last.end = last.end.max(next.end);
                continue;
            }
        }
        sorted[kept] = next;
        kept += 1;
    }
    // §14.2: "more than two overlapping ranges" is an attack sign.
    if overlaps > policy.max_overlaps {
        return RangeDecision::Full;
    }
    if kept == n {
        // Nothing merged: keep request order (§15.3.7.2 SHOULD).
        ranges.truncate(n);
    } else {
        // Something merged: ascending order.
        ranges.copy_within(n..n + kept, 0);
        ranges.truncate(kept);
    }
    RangeDecision::Partial(ranges)
}

/// One syntactically valid range-spec, numerals saturated to `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spec {
    /// `first-pos "-" [ last-pos ]`, with `first <= last` checked exactly.
    Int { first: u64, last: Option<u64> },
    /// `"-" suffix-length`.
    Suffix(u64),
}

/// Parses one trimmed, non-empty list element as a bytes range-spec (§14.1.1, §14.1.2).
fn parse_spec(element: &[u8]) -> Option<Spec> {
    let dash = element.iter().position(|&b| b == b'-')?;
    let (first, rest) = (&element[..dash], &element[dash + 1..]);
    if first.is_empty() {
        return Some(Spec::Suffix(Numeral::parse(rest)?.value));
    }
    let first = Numeral::parse(first)?;
    if rest.is_empty() {
        return Some(Spec::Int { first: first.value, last: None });
    }
    let last = Numeral::parse(rest)?;
    // §14.1.1: "An int-range is invalid if the last-pos value is present and less than the
    // first-pos." Compared exactly, so it holds for numerals beyond u64 too.
    if last.less_than(&first) {
        return None;
    }
    Some(Spec::Int { first: first.value, last: Some(last.value) })
}

/// Resolves a range-spec against the representation length; `None` when unsatisfiable (§14.1.2).
fn resolve(spec: Spec, size: u64) -> Option<ByteRange> {
    match spec {
        // §14.1.2: satisfiable iff first-pos < length; a last-pos at or past the end (or absent)
        // means "the remainder". A saturated first-pos is >= every u64 length, as the real one is.
        Spec::Int { first, last } => {
            if first >= size {
                return None;
            }
            let end = last.map_or(size, |l| l.saturating_add(1).min(size));
            Some(ByteRange { start: first, end })
        }
        // §14.1.2: satisfiable iff suffix-length > 0; longer than the representation means all
        // of it. Zero length is handled by the caller (nothing can be described).
        Spec::Suffix(n) => {
            if n == 0 || size == 0 {
                return None;
            }
            Some(ByteRange { start: size - n.min(size), end: size })
        }
    }
}

/// A `1*DIGIT` numeral: its value saturated to `u64`, and its significant digits for exact
/// comparison (§14.1.2: "prevent parsing errors due to integer conversion overflows").
#[derive(Debug, Clone, Copy)]
struct Numeral<'a> {
    value: u64,
    /// The digits without leading zeros.
    digits: &'a [u8],
}

impl<'a> Numeral<'a> {
    fn parse(s: &'a [u8]) -> Option<Self> {
        if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let significant = s.iter().position(|&b| b != b'0').unwrap_or(s.len());
        let digits = &s[significant..];
        let value = digits.iter().fold(0u64, |acc, &d| acc.saturating_mul(10).saturating_add(u64::from(d - b'0')));
        Some(Numeral { value, digits })
    }

    /// Exact numeric comparison: more significant digits is larger; equal counts compare
    /// lexicographically.
    fn less_than(&self, other: &Numeral<'_>) -> bool {
        (self.digits.len(), self.digits) < (other.digits.len(), other.digits)
    }
}

/// Strips OWS (SP / HTAB, §5.6.3) from both ends. The one copy: conditional requests use it too.
pub(crate) fn trim_ows(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// The Range table, shared with the wire replay in tests/api/downloads.rs.
#[cfg(test)]
#[path = "../../tests/api/cases/range.rs"]
mod cases;

#[cfg(test)]
mod tests {
    use super::cases::{Expect, wire_cases};
    use super::*;
    use num_bigint::BigUint;
    use proptest::prelude::*;

    fn eval(header: &[u8], size: u64) -> RangeDecision {
        evaluate(Some(header), size, &RangePolicy::default())
    }

    fn br(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    /// The [`RangeDecision`] a table row expects.
    fn decision(expect: &Expect) -> RangeDecision {
        match expect {
            Expect::Full => RangeDecision::Full,
            Expect::Unsatisfiable => RangeDecision::Unsatisfiable,
            Expect::Partial(parts) => {
                RangeDecision::Partial(parts.iter().map(|&(first, last)| br(first, last.saturating_add(1))).collect())
            }
        }
    }

    fn unbounded_policy(part_overhead: u64) -> RangePolicy {
        RangePolicy { max_parts: usize::MAX, part_overhead, max_overlaps: usize::MAX, max_reversals: usize::MAX }
    }

    /// The caller's invariant: in bounds, non-empty, disjoint, non-adjacent, capped, and not
    /// more bytes than the representation.
    fn check_invariants(decision: &RangeDecision, size: u64, policy: &RangePolicy) {
        let RangeDecision::Partial(v) = decision else {
            return;
        };
        assert!(!v.is_empty(), "empty Partial");
        assert!(v.len() <= policy.max_parts, "{} parts > max_parts", v.len());
        let mut total: u128 = 0;
        for r in v {
            assert!(r.start < r.end && r.end <= size, "{r:?} out of bounds for {size}");
            total += u128::from(r.len());
        }
        assert!(total <= u128::from(size), "sum {total} > size {size}");
        let mut sorted = v.clone();
        sorted.sort_by_key(|r| r.start);
        for w in sorted.windows(2) {
            assert!(w[0].end < w[1].start, "overlapping or adjacent: {w:?}");
        }
    }

    #[test]
    fn wire_cases_match_evaluate() {
        let cases = wire_cases();
        assert!(cases.len() >= 50, "only {} cases", cases.len());
        let policy = RangePolicy::default();
        let mut failures = Vec::new();
        for c in cases {
            let got = evaluate(Some(c.header.as_bytes()), c.size, &policy);
            check_invariants(&got, c.size, &policy);
            if got != decision(&c.expect) {
                failures.push(format!(
                    "{}: {:?} (size {}) => {:?}, expected {:?}",
                    c.name, c.header, c.size, got, c.expect
                ));
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn wire_case_names_are_unique() {
        let cases = wire_cases();
        for (i, a) in cases.iter().enumerate() {
            for b in &cases[i + 1..] {
                assert_ne!(a.name, b.name, "duplicate case name");
            }
        }
    }

    #[test]
    fn expect_status_codes() {
        assert_eq!(Expect::Full.status(), 200);
        assert_eq!(Expect::Unsatisfiable.status(), 416);
        assert_eq!(Expect::Partial(vec![(0, 0)]).status(), 206);
        assert_eq!(decision(&Expect::Partial(vec![(3, 7)])), RangeDecision::Partial(vec![br(3, 8)]));
    }

    #[test]
    fn absent_header_is_full() {
        assert_eq!(evaluate(None, 10, &RangePolicy::default()), RangeDecision::Full);
        assert_eq!(evaluate(None, 0, &RangePolicy::default()), RangeDecision::Full);
    }

    #[test]
    fn defaults() {
        let p = RangePolicy::default();
        assert_eq!(p.max_parts, 64);
        assert_eq!(p.part_overhead, 80);
        assert_eq!(p.max_overlaps, 2);
        assert_eq!(p.max_reversals, 8);
    }

    #[test]
    fn byte_range_accessors() {
        let r = br(500, 1000);
        assert_eq!(r.len(), 500);
        assert_eq!(r.last(), 999);
        assert!(!r.is_empty());
        // Out-of-contract values do not panic.
        assert_eq!(br(5, 0).len(), 0);
        assert!(br(5, 0).is_empty());
        assert_eq!(br(0, 0).last(), 0);
    }

    #[test]
    fn non_utf8_and_control_bytes_are_ignored() {
        for h in [
            &b"bytes=0-1\xff"[..],
            b"\xffbytes=0-1",
            b"bytes=\x000-1",
            b"bytes=0-1\r\n",
            b"bytes=0-1,\x0b2-3",
            b"bytes=\xd9\xa3-5",
        ] {
            assert_eq!(eval(h, 100), RangeDecision::Full, "{h:?}");
        }
    }

    #[test]
    fn extreme_sizes() {
        let max = u64::MAX;
        assert_eq!(eval(b"bytes=0-", max), RangeDecision::Partial(vec![br(0, max)]));
        assert_eq!(eval(b"bytes=-1", max), RangeDecision::Partial(vec![br(max - 1, max)]));
        assert_eq!(eval(b"bytes=18446744073709551614-", max), RangeDecision::Partial(vec![br(max - 1, max)]));
        assert_eq!(eval(b"bytes=18446744073709551615-", max), RangeDecision::Unsatisfiable);
        assert_eq!(eval(b"bytes=1-18446744073709551615", max), RangeDecision::Partial(vec![br(1, max)]));
        assert_eq!(eval(b"bytes=1-99999999999999999999999", max), RangeDecision::Partial(vec![br(1, max)]));
        // Two halves of u64::MAX bytes: lengths add up without overflow, then merge to whole (still a 206).
        assert_eq!(
            eval(b"bytes=0-9223372036854775806,9223372036854775807-", max),
            RangeDecision::Partial(vec![br(0, max)])
        );
        // Sum of lengths would overflow u64: must be Full, not a panic.
        assert_eq!(eval(b"bytes=0-,1-,2-", max), RangeDecision::Full);
        assert_eq!(eval(b"bytes=-99999999999999999999,-99999999999999999999", max), RangeDecision::Full);
    }

    #[test]
    fn policy_max_parts_zero_ignores_every_range() {
        let p = RangePolicy { max_parts: 0, ..RangePolicy::default() };
        assert_eq!(evaluate(Some(b"bytes=0-0"), 10, &p), RangeDecision::Full);
        // Caps apply before satisfiability: ignored, not 416.
        assert_eq!(evaluate(Some(b"bytes=100-"), 10, &p), RangeDecision::Full);
        // An empty range-set is invalid regardless.
        assert_eq!(evaluate(Some(b"bytes=,"), 10, &p), RangeDecision::Full);
    }

    #[test]
    fn max_parts_counts_unsatisfiable_specs_but_not_empty_elements() {
        let p = RangePolicy { max_parts: 2, ..RangePolicy::default() };
        assert_eq!(
            evaluate(Some(b"bytes=0-0,,,,500-500,,"), 1000, &p),
            RangeDecision::Partial(vec![br(0, 1), br(500, 501)])
        );
        assert_eq!(evaluate(Some(b"bytes=0-0,500-500,5000-"), 1000, &p), RangeDecision::Full);
    }

    #[test]
    fn zero_overhead_still_merges_adjacent_but_not_gaps() {
        let p = RangePolicy { part_overhead: 0, ..RangePolicy::default() };
        assert_eq!(evaluate(Some(b"bytes=0-1,2-3,5-6"), 100, &p), RangeDecision::Partial(vec![br(0, 4), br(5, 7)]));
        assert_eq!(evaluate(Some(b"bytes=5-6,0-1"), 100, &p), RangeDecision::Partial(vec![br(5, 7), br(0, 2)]));
        // Go's multipart cases, without coalescing over gaps.
        assert_eq!(evaluate(Some(b"bytes=0-0,-2"), 11, &p), RangeDecision::Partial(vec![br(0, 1), br(9, 11)]));
        assert_eq!(evaluate(Some(b"bytes=0-1,5-8"), 11, &p), RangeDecision::Partial(vec![br(0, 2), br(5, 9)]));
    }

    #[test]
    fn overlap_and_reversal_caps_are_configurable() {
        let strict = RangePolicy { max_overlaps: 0, max_reversals: 0, ..RangePolicy::default() };
        assert_eq!(evaluate(Some(b"bytes=0-9,5-14"), 1000, &strict), RangeDecision::Full);
        assert_eq!(evaluate(Some(b"bytes=500-509,0-9"), 1000, &strict), RangeDecision::Full);
        // Unsatisfiable members neither overlap nor reverse.
        assert_eq!(evaluate(Some(b"bytes=0-9,5000-,10000-"), 1000, &strict), RangeDecision::Partial(vec![br(0, 10)]));
        // Adjacent is not overlapping.
        assert_eq!(evaluate(Some(b"bytes=0-9,10-19"), 1000, &strict), RangeDecision::Partial(vec![br(0, 20)]));
    }

    #[test]
    fn equal_starts_are_overlaps_not_reversals() {
        let no_reversals = RangePolicy { max_reversals: 0, ..RangePolicy::default() };
        assert_eq!(evaluate(Some(b"bytes=0-9,0-19"), 1000, &no_reversals), RangeDecision::Partial(vec![br(0, 20)]));
        let no_overlaps = RangePolicy { max_overlaps: 0, ..RangePolicy::default() };
        assert_eq!(evaluate(Some(b"bytes=0-9,0-19"), 1000, &no_overlaps), RangeDecision::Full);
    }

    #[test]
    fn scan_reports_specs_and_keeps_request_order() {
        let mut out = Vec::new();
        let s = scan(b"bytes=9-9, ,-2,100-,3-", 10, usize::MAX, &mut out);
        assert_eq!(s, Some(Scan { specs: 4, nonzero_suffix: true, reversals: 2 }));
        assert_eq!(out, vec![br(9, 10), br(8, 10), br(3, 10)]);
    }

    // ------------------------------------------------------------------------------------------
    // Big-integer reference model: parses with arbitrary precision and decides naively.
    // ------------------------------------------------------------------------------------------

    struct ModelParse {
        /// Satisfiable members, half-open, request order.
        ranges: Vec<(u64, u64)>,
        specs: usize,
        nonzero_suffix: bool,
    }

    fn model_trim(mut s: &[u8]) -> &[u8] {
        while !s.is_empty() && (s[0] == b' ' || s[0] == b'\t') {
            s = &s[1..];
        }
        while !s.is_empty() && (s[s.len() - 1] == b' ' || s[s.len() - 1] == b'\t') {
            s = &s[..s.len() - 1];
        }
        s
    }

    fn model_num(s: &[u8]) -> Option<BigUint> {
        if s.is_empty() || !s.iter().all(|b| b.is_ascii_digit()) {
            return None;
        }
        BigUint::parse_bytes(s, 10)
    }

    fn to_u64(n: &BigUint) -> u64 {
        u64::try_from(n).expect("model value exceeds u64")
    }

    /// `None` when the field is not a valid bytes ranges-specifier.
    fn model_parse(header: &[u8], size: u64) -> Option<ModelParse> {
        let value = model_trim(header);
        let eq = value.iter().position(|&b| b == b'=')?;
        if !value[..eq].eq_ignore_ascii_case(b"bytes") {
            return None;
        }
        let big_size = BigUint::from(size);
        let mut out = ModelParse { ranges: Vec::new(), specs: 0, nonzero_suffix: false };
        for element in value[eq + 1..].split(|&b| b == b',') {
            let element = model_trim(element);
            if element.is_empty() {
                continue;
            }
            out.specs += 1;
            let dash = element.iter().position(|&b| b == b'-')?;
            let (a, b) = (&element[..dash], &element[dash + 1..]);
            if a.is_empty() {
                let n = model_num(b)?;
                if n > BigUint::from(0u8) {
                    out.nonzero_suffix = true;
                    if size > 0 {
                        let len = n.min(big_size.clone());
                        out.ranges.push((to_u64(&(&big_size - len)), size));
                    }
                }
            } else {
                let first = model_num(a)?;
                let last = if b.is_empty() { None } else { Some(model_num(b)?) };
                if last.as_ref().is_some_and(|l| *l < first) {
                    return None;
                }
                if first < big_size {
                    let end = match last {
                        Some(l) => (l + 1u8).min(big_size.clone()),
                        None => big_size.clone(),
                    };
                    out.ranges.push((to_u64(&first), to_u64(&end)));
                }
            }
        }
        if out.specs == 0 {
            return None;
        }
        Some(out)
    }

    fn model_decide(header: &[u8], size: u64, policy: &RangePolicy) -> RangeDecision {
        let Some(p) = model_parse(header, size) else {
            return RangeDecision::Full;
        };
        if p.specs > policy.max_parts {
            return RangeDecision::Full;
        }
        if size == 0 {
            return if p.nonzero_suffix { RangeDecision::Full } else { RangeDecision::Unsatisfiable };
        }
        if p.ranges.is_empty() {
            return RangeDecision::Unsatisfiable;
        }
        let sum: BigUint = p.ranges.iter().map(|&(s, e)| BigUint::from(e - s)).sum();
        if sum > BigUint::from(size) {
            return RangeDecision::Full;
        }
        let reversals = p.ranges.windows(2).filter(|w| w[1].0 < w[0].0).count();
        if reversals > policy.max_reversals {
            return RangeDecision::Full;
        }
        let mut sorted = p.ranges.clone();
        sorted.sort();
        let overlaps = (0..sorted.len()).filter(|&i| (0..i).any(|j| sorted[j].1 > sorted[i].0)).count();
        if overlaps > policy.max_overlaps {
            return RangeDecision::Full;
        }
        // Merge any two ranges closer than max(overhead, 1) until nothing changes.
        let min_gap = policy.part_overhead.max(1);
        let mut set = p.ranges.clone();
        'again: loop {
            for i in 0..set.len() {
                for j in i + 1..set.len() {
                    let (a, b) = (set[i], set[j]);
                    let distance = a.0.max(b.0).saturating_sub(a.1.min(b.1));
                    if distance < min_gap {
                        set[i] = (a.0.min(b.0), a.1.max(b.1));
                        set.remove(j);
                        continue 'again;
                    }
                }
            }
            break;
        }
        if set.len() != p.ranges.len() {
            set.sort();
        }
        RangeDecision::Partial(set.into_iter().map(|(s, e)| br(s, e)).collect())
    }

    #[test]
    fn model_agrees_with_wire_cases() {
        for c in wire_cases() {
            assert_eq!(
                model_decide(c.header.as_bytes(), c.size, &RangePolicy::default()),
                decision(&c.expect),
                "{}",
                c.name
            );
        }
    }

    // ------------------------------------------------------------------------------------------
    // Generators.
    // ------------------------------------------------------------------------------------------

    /// A numeral, rendered relative to the representation size.
    #[derive(Debug, Clone)]
    enum Num {
        Small(u16),
        /// Somewhere in 0..=size+2.
        Rel(u64),
        /// u64::MAX - 2 ..= u64::MAX + 2.
        NearMax(u8),
        /// 20 to 45 digits.
        Huge(u64, u8),
    }

    fn num() -> impl Strategy<Value = (Num, u8)> {
        let n = prop_oneof![
            3 => any::<u16>().prop_map(Num::Small),
            5 => any::<u64>().prop_map(Num::Rel),
            2 => any::<u8>().prop_map(Num::NearMax),
            2 => (any::<u64>(), 20u8..46).prop_map(|(s, l)| Num::Huge(s, l)),
        ];
        // Mostly no leading zeros, sometimes a few.
        (n, prop_oneof![6 => Just(0u8), 1 => 1u8..4])
    }

    fn render_num((n, zeros): &(Num, u8), size: u64) -> String {
        let digits = match n {
            Num::Small(v) => v.to_string(),
            Num::Rel(r) => match size.checked_add(3) {
                Some(m) => (r % m).to_string(),
                None => r.to_string(),
            },
            Num::NearMax(k) => (u128::from(u64::MAX) - 2 + u128::from(k % 5)).to_string(),
            Num::Huge(seed, len) => {
                let base = format!("{}{:020}", 1 + seed % 9, seed);
                base.repeat(3)[..usize::from(*len)].to_string()
            }
        };
        format!("{}{}", "0".repeat(usize::from(*zeros)), digits)
    }

    #[derive(Debug, Clone)]
    enum SpecGen {
        /// first, last, and whether to put them in order (last >= first).
        Int((Num, u8), Option<(Num, u8)>, bool),
        /// `first-(first+span)`: short ranges, so multi-part answers are common.
        Span((Num, u8), u16),
        Suffix((Num, u8)),
        Junk(&'static str),
        Empty,
        /// The previous non-empty element again (duplicates, equal starts).
        Repeat,
        /// An int-range starting right after the previous one ends (adjacency).
        Next(u16),
    }

    const JUNK: &[&str] = &["abc", "-", "1-2-3", "+1-2", "0x1-2", "1 -2", "-+1", "1.5-2", "--3", "1-a", "\u{e9}"];

    fn spec() -> impl Strategy<Value = SpecGen> {
        prop_oneof![
            30 => (num(), proptest::option::of(num()), prop::bool::weighted(0.95))
                .prop_map(|(a, b, ordered)| SpecGen::Int(a, b, ordered)),
            20 => (num(), 0u16..300).prop_map(|(a, span)| SpecGen::Span(a, span)),
            12 => num().prop_map(SpecGen::Suffix),
            1 => proptest::sample::select(JUNK).prop_map(SpecGen::Junk),
            2 => Just(SpecGen::Empty),
            6 => Just(SpecGen::Repeat),
            8 => (0u16..50).prop_map(SpecGen::Next),
        ]
    }

    #[derive(Debug, Clone)]
    struct HeaderGen {
        unit: &'static str,
        after_eq: &'static str,
        specs: Vec<SpecGen>,
        seps: Vec<&'static str>,
    }

    fn header_gen() -> impl Strategy<Value = HeaderGen> {
        (
            proptest::sample::select(
                &[
                    "bytes", "bytes", "bytes", "bytes", "bytes", "bytes", "bytes", "bytes", "bytes", "bytes", "bytes",
                    "bytes", "BYTES", "Bytes", "items", "bytes ",
                ][..],
            ),
            proptest::sample::select(&["", "", "", " "][..]),
            prop_oneof![1 => proptest::collection::vec(spec(), 0..10), 4 => proptest::collection::vec(spec(), 1..6)],
            proptest::collection::vec(
                proptest::sample::select(&[",", ",", ",", ", ", " ,", " , ", ",\t", ",,"][..]),
                10,
            ),
        )
            .prop_map(|(unit, after_eq, specs, seps)| HeaderGen { unit, after_eq, specs, seps })
    }

    fn render_header(h: &HeaderGen, size: u64) -> String {
        let mut s = format!("{}={}", h.unit, h.after_eq);
        let mut prev = String::from("0-0");
        for (i, spec) in h.specs.iter().enumerate() {
            if i > 0 {
                s.push_str(h.seps[i % h.seps.len()]);
            }
            let element = match spec {
                SpecGen::Int(a, b, ordered) => {
                    let mut first = render_num(a, size);
                    let mut last = b.as_ref().map(|b| render_num(b, size));
                    if let Some(l) = last.as_mut().filter(|_| *ordered) {
                        if model_num(l.as_bytes()) < model_num(first.as_bytes()) {
                            std::mem::swap(&mut first, l);
                        }
                    }
                    format!("{first}-{}", last.unwrap_or_default())
                }
                SpecGen::Span(a, span) => {
                    let first = render_num(a, size);
                    let last = match first.parse::<u128>() {
                        Ok(v) => (v + u128::from(*span)).to_string(),
                        Err(_) => first.clone(),
                    };
                    format!("{first}-{last}")
                }
                SpecGen::Suffix(n) => format!("-{}", render_num(n, size)),
                SpecGen::Junk(j) => j.to_string(),
                SpecGen::Empty => String::new(),
                SpecGen::Repeat => prev.clone(),
                SpecGen::Next(span) => {
                    // Starts right after the previous int-range: adjacent, or overlapping it.
                    let last = prev.split('-').nth(1).and_then(|l| l.parse::<u128>().ok());
                    match last {
                        Some(l) => format!("{}-{}", l + 1, l + 1 + u128::from(*span)),
                        None => prev.clone(),
                    }
                }
            };
            s.push_str(&element);
            if !element.is_empty() {
                prev = element;
            }
        }
        s
    }

    fn size_gen() -> impl Strategy<Value = u64> {
        prop_oneof![
            1 => Just(0u64),
            3 => 1u64..=20,
            3 => 0u64..=20_000,
            2 => any::<u64>(),
            1 => (u64::MAX - 3)..=u64::MAX,
        ]
    }

    fn policy_gen() -> impl Strategy<Value = RangePolicy> {
        let random = (
            prop_oneof![0usize..12, Just(64usize), Just(usize::MAX)],
            prop_oneof![Just(0u64), 0u64..200, Just(80u64), any::<u64>()],
            prop_oneof![3 => 0usize..3, 1 => Just(usize::MAX)],
            prop_oneof![3 => 0usize..3, 1 => Just(usize::MAX)],
        )
            .prop_map(|(max_parts, part_overhead, max_overlaps, max_reversals)| RangePolicy {
                max_parts,
                part_overhead,
                max_overlaps,
                max_reversals,
            });
        prop_oneof![
            2 => Just(RangePolicy::default()),
            2 => prop_oneof![Just(0u64), 0u64..200, any::<u64>()].prop_map(unbounded_policy),
            3 => random,
        ]
    }

    const PREFIXES: &[&[u8]] = &[b"", b"bytes=", b"BYTES=", b"bytes= "];

    /// Bytes biased towards the range grammar, so fuzzing reaches past the unit check.
    fn rangeish_bytes() -> impl Strategy<Value = Vec<u8>> {
        let byte = prop_oneof![
            4 => proptest::sample::select(&b"0123456789-, \t="[..]),
            1 => any::<u8>(),
        ];
        (proptest::sample::select(PREFIXES), proptest::collection::vec(byte, 0..80))
            .prop_map(|(prefix, rest)| [prefix, &rest[..]].concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// evaluate never panics on arbitrary bytes (and whatever it returns keeps the invariants).
        #[test]
        fn evaluate_never_panics_on_arbitrary_bytes(
            header in proptest::collection::vec(any::<u8>(), 0..200),
            size in size_gen(),
            policy in policy_gen(),
        ) {
            let d = evaluate(Some(&header), size, &policy);
            check_invariants(&d, size, &policy);
        }

        /// evaluate never panics on range-like bytes, and agrees with the model on them.
        #[test]
        fn evaluate_never_panics_on_rangeish_bytes(
            header in rangeish_bytes(),
            size in size_gen(),
            policy in policy_gen(),
        ) {
            let d = evaluate(Some(&header), size, &policy);
            check_invariants(&d, size, &policy);
            prop_assert_eq!(d, model_decide(&header, size, &policy));
        }

        /// Every Partial range is in bounds, disjoint, non-adjacent, and sums to at most size.
        #[test]
        fn every_partial_range_is_in_bounds_disjoint_non_adjacent_and_sums_to_at_most_size(
            h in header_gen(),
            size in size_gen(),
            policy in policy_gen(),
        ) {
            let header = render_header(&h, size);
            let d = evaluate(Some(header.as_bytes()), size, &policy);
            check_invariants(&d, size, &policy);
        }

        /// A single int-range a-b with a < size gives exactly a..min(b+1, size), the whole
        /// representation included.
        #[test]
        fn a_single_int_range_a_b_with_a_below_size_gives_exactly_a_to_min_b_plus_1_size(
            size in 1u64..=u64::MAX,
            a_raw in any::<u64>(),
            b_off in prop_oneof![0u64..100, any::<u64>()],
            zeros in 0usize..3,
        ) {
            let a = a_raw % size;
            let b = a.saturating_add(b_off);
            let header = format!("bytes={}{a}-{b}", "0".repeat(zeros));
            let end = (u128::from(b) + 1).min(u128::from(size)) as u64;
            prop_assert_eq!(
                evaluate(Some(header.as_bytes()), size, &RangePolicy::default()),
                RangeDecision::Partial(vec![br(a, end)])
            );
        }

        /// The decision agrees with a big-integer (num-bigint) reference model for random
        /// specifiers whose numerals may exceed u64, and so does the satisfiable set before
        /// coalescing.
        #[test]
        fn the_decision_agrees_with_a_big_integer_reference_model(
            h in header_gen(),
            size in size_gen(),
            policy in policy_gen(),
        ) {
            let header = render_header(&h, size);
            let bytes = header.as_bytes();
            // Satisfiable set before coalescing, in request order.
            let mut members = Vec::new();
            let scanned = scan(bytes, size, usize::MAX, &mut members);
            let model = model_parse(bytes, size);
            prop_assert_eq!(scanned.is_some(), model.is_some(), "validity of {:?}", header);
            if let (Some(s), Some(m)) = (scanned, model) {
                let model_members: Vec<ByteRange> = m.ranges.iter().map(|&(a, b)| br(a, b)).collect();
                prop_assert_eq!(&members, &model_members, "members of {:?}", header);
                prop_assert_eq!(s.specs, m.specs);
                prop_assert_eq!(s.nonzero_suffix, m.nonzero_suffix);
            }
            // The whole decision, caps and coalescing included.
            prop_assert_eq!(
                evaluate(Some(bytes), size, &policy),
                model_decide(bytes, size, &policy),
                "decision for {:?} size {}", header, size
            );
        }

        /// Coalescing preserves the covered byte set up to gaps < part_overhead: the output covers
        /// every requested byte, every output byte is within part_overhead of a requested byte,
        /// and no two output parts are closer than part_overhead (nothing left unmerged).
        #[test]
        fn coalescing_preserves_the_covered_byte_set_up_to_gaps_below_part_overhead(
            (size, members) in (1u64..3000).prop_flat_map(|size| {
                (Just(size), proptest::collection::vec((0..size, 0..size), 1..12))
            }),
            part_overhead in prop_oneof![Just(0u64), 0u64..300],
        ) {
            let members: Vec<(u64, u64)> = members.iter().map(|&(x, y)| (x.min(y), x.max(y))).collect();
            let header = format!(
                "bytes={}",
                members.iter().map(|(a, b)| format!("{a}-{b}")).collect::<Vec<_>>().join(",")
            );
            let policy = RangePolicy { max_parts: 64, ..unbounded_policy(part_overhead) };
            let d = evaluate(Some(header.as_bytes()), size, &policy);
            check_invariants(&d, size, &policy);

            let n = size as usize;
            let mut requested = vec![false; n];
            for &(a, b) in &members {
                for byte in &mut requested[a as usize..=b as usize] {
                    *byte = true;
                }
            }
            // Distance from each byte to the nearest requested byte.
            let mut dist = vec![u64::MAX; n];
            let mut last_seen: Option<usize> = None;
            for i in 0..n {
                if requested[i] { last_seen = Some(i); }
                if let Some(j) = last_seen { dist[i] = (i - j) as u64; }
            }
            last_seen = None;
            for i in (0..n).rev() {
                if requested[i] { last_seen = Some(i); }
                if let Some(j) = last_seen { dist[i] = dist[i].min((j - i) as u64); }
            }
            let min_gap = part_overhead.max(1);
            let requested_total: u64 = members.iter().map(|(a, b)| b - a + 1).sum();

            match d {
                RangeDecision::Partial(parts) => {
                    let mut covered = vec![false; n];
                    for p in &parts {
                        for byte in &mut covered[p.start as usize..p.end as usize] {
                            *byte = true;
                        }
                    }
                    for i in 0..n {
                        prop_assert!(!requested[i] || covered[i], "byte {} requested but not sent", i);
                        prop_assert!(!covered[i] || dist[i] < min_gap, "byte {} sent, {} from any request", i, dist[i]);
                    }
                    let mut sorted = parts.clone();
                    sorted.sort_by_key(|r| r.start);
                    for w in sorted.windows(2) {
                        prop_assert!(w[1].start - w[0].end >= min_gap, "unmerged small gap {:?}", w);
                    }
                }
                RangeDecision::Full => {
                    // Only when the lengths add up to more than the size (a merge into the whole is a 206).
                    prop_assert!(requested_total > size, "Full without cause");
                }
                RangeDecision::Unsatisfiable => prop_assert!(false, "in-bounds members are satisfiable"),
            }
        }
    }
}
