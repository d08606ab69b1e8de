//! The Range table: one `Range` header value, a representation size and the expected answer under
//! `RangePolicy::default()` a row. RFC 9110 §14.1.2 examples, nginx-tests range.t, Go's net/http ServeFile
//! cases (file of 11 bytes), and the gateway's own decisions (OWS, huge numerals, coalescing, caps).
//!
//! Test code only: the unit tests of `src/http/range.rs` include this file (`#[path]`) and check it against
//! `evaluate` and a model; `tests/api/downloads.rs` replays it over the wire. It uses nothing from the crate
//! so that both can.

/// Expected outcome of one [`RangeCase`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// 200 with the whole representation.
    Full,
    /// 416 with `Content-Range: bytes */size`.
    Unsatisfiable,
    /// 206 with these INCLUSIVE `(first, last)` pairs, in response order.
    Partial(Vec<(u64, u64)>),
}

impl Expect {
    /// The HTTP status the case expects.
    pub fn status(&self) -> u16 {
        match self {
            Expect::Full => 200,
            Expect::Unsatisfiable => 416,
            Expect::Partial(_) => 206,
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone)]
pub struct RangeCase {
    pub name: &'static str,
    pub header: String,
    pub size: u64,
    pub expect: Expect,
}

fn case(name: &'static str, header: &str, size: u64, expect: Expect) -> RangeCase {
    RangeCase { name, header: header.to_owned(), size, expect }
}

fn partial(parts: &[(u64, u64)]) -> Expect {
    Expect::Partial(parts.to_vec())
}

/// `count` one-byte ranges 100 bytes apart (`0-0,100-100,...`): too far apart to coalesce.
fn spaced_singles(count: u64) -> Vec<(u64, u64)> {
    (0..count).map(|i| (i * 100, i * 100)).collect()
}

/// The same ranges from the last to the first: each one after the first is a reversal.
fn reversed_singles(count: u64) -> Vec<(u64, u64)> {
    spaced_singles(count).into_iter().rev().collect()
}

/// The `Range` header that asks for `parts` in this order.
fn header_of(parts: &[(u64, u64)]) -> String {
    let specs: Vec<String> = parts.iter().map(|(first, last)| format!("{first}-{last}")).collect();
    format!("bytes={}", specs.join(","))
}

/// The table, grouped by source as listed above.
pub fn wire_cases() -> Vec<RangeCase> {
    use Expect::{Full, Unsatisfiable};
    vec![
        // RFC 9110 §14.1.2 examples, 10000-byte representation.
        case("rfc: first 500 bytes", "bytes=0-499", 10000, partial(&[(0, 499)])),
        case("rfc: second 500 bytes", "bytes=500-999", 10000, partial(&[(500, 999)])),
        case("rfc: final 500 by suffix", "bytes=-500", 10000, partial(&[(9500, 9999)])),
        case("rfc: final 500 by open range", "bytes=9500-", 10000, partial(&[(9500, 9999)])),
        case("rfc: first and last byte", "bytes=0-0,-1", 10000, partial(&[(0, 0), (9999, 9999)])),
        case("rfc: adjacent ranges coalesce", "bytes=500-600,601-999", 10000, partial(&[(500, 999)])),
        case("rfc: overlapping ranges coalesce", "bytes=500-700,601-999", 10000, partial(&[(500, 999)])),
        // nginx-tests range.t, 1000-byte file.
        case("nginx: range request", "bytes=0-8", 1000, partial(&[(0, 8)])),
        case("nginx: final bytes", "bytes=-10", 1000, partial(&[(990, 999)])),
        case("nginx: final bytes explicit", "bytes=990-", 1000, partial(&[(990, 999)])),
        case("nginx: more than length", "bytes=990-1990", 1000, partial(&[(990, 999)])),
        case(
            "nginx: multipart (adjacent pair coalesced)",
            "bytes=0-9, -10, 10-19",
            1000,
            partial(&[(0, 19), (990, 999)]),
        ),
        case(
            "nginx: multipart with unsatisfiable member",
            "bytes=0-9, -10, 100000-, 10-19",
            1000,
            partial(&[(0, 19), (990, 999)]),
        ),
        case("nginx: too big first byte pos", "bytes=100000-", 1000, Unsatisfiable),
        case("nginx: alpha in first byte pos (ignored, not 416)", "bytes=alpha", 1000, Full),
        case("nginx: alpha in last byte pos (ignored)", "bytes=10-alpha", 1000, Full),
        case("nginx: no hyphen (ignored)", "bytes=10", 1000, Full),
        case("nginx: no comma (ignored)", "bytes=10-11 12-", 1000, Full),
        case("nginx: last byte pos adjusted", "bytes=1-10001", 1000, partial(&[(1, 999)])),
        case("nginx: adjusted to whole representation", "bytes=0-10001", 1000, partial(&[(0, 999)])),
        case("nginx: malicious byte ranges sum over size", "bytes=0-10001, 0-0", 1000, Full),
        case("nginx: open range from zero is everything", "bytes=0-", 1000, partial(&[(0, 999)])),
        case("nginx: last byte", "bytes=-1", 1000, partial(&[(999, 999)])),
        case("nginx: last before first (invalid)", "bytes=1-0", 1000, Full),
        case("nginx: first byte pos equals length", "bytes=1000-", 1000, Unsatisfiable),
        // Go net/http fs_test ServeFileRangeTests, 11-byte file ("0123456789\n").
        case("go: bytes=0-4", "bytes=0-4", 11, partial(&[(0, 4)])),
        case("go: bytes=2-", "bytes=2-", 11, partial(&[(2, 10)])),
        case("go: bytes=-5", "bytes=-5", 11, partial(&[(6, 10)])),
        case("go: bytes=3-7", "bytes=3-7", 11, partial(&[(3, 7)])),
        case("go: bytes=0-0,-2 coalesces to whole", "bytes=0-0,-2", 11, partial(&[(0, 10)])),
        case("go: bytes=0-1,5-8 coalesces over small gap", "bytes=0-1,5-8", 11, partial(&[(0, 8)])),
        case("go: bytes=0-1,5- coalesces to whole", "bytes=0-1,5-", 11, partial(&[(0, 10)])),
        case("go: bytes=5-1000", "bytes=5-1000", 11, partial(&[(5, 10)])),
        case("go: wasteful ranges", "bytes=0-,1-,2-,3-,4-", 11, Full),
        case("go: bytes=0-9", "bytes=0-9", 11, partial(&[(0, 9)])),
        case("go: bytes=0-10 is whole", "bytes=0-10", 11, partial(&[(0, 10)])),
        case("go: bytes=0-11 is whole", "bytes=0-11", 11, partial(&[(0, 10)])),
        case("go: bytes=10-11 last byte", "bytes=10-11", 11, partial(&[(10, 10)])),
        case("go: bytes=10-", "bytes=10-", 11, partial(&[(10, 10)])),
        case("go: bytes=11-", "bytes=11-", 11, Unsatisfiable),
        case("go: bytes=11-12", "bytes=11-12", 11, Unsatisfiable),
        case("go: bytes=12-12", "bytes=12-12", 11, Unsatisfiable),
        case("go: bytes=11-100", "bytes=11-100", 11, Unsatisfiable),
        case("go: bytes=12-100", "bytes=12-100", 11, Unsatisfiable),
        case("go: bytes=100-", "bytes=100-", 11, Unsatisfiable),
        case("go: bytes=100-1000", "bytes=100-1000", 11, Unsatisfiable),
        // Range unit (§14.1, §14.2).
        case("unit: upper case", "BYTES=0-1", 10000, partial(&[(0, 1)])),
        case("unit: mixed case", "Bytes=0-1", 10000, partial(&[(0, 1)])),
        case("unit: unknown", "items=0-1", 10000, Full),
        case("unit: prefix of another token", "bytesx=0-1", 10000, Full),
        case("unit: space before =", "bytes =0-1", 10000, Full),
        case("unit: missing =", "bytes", 10000, Full),
        case("unit: empty", "=0-1", 10000, Full),
        case("unit: empty field value", "", 10000, Full),
        // Invalid syntax is ignored (§14.1.1, §14.2).
        case("syntax: empty range-set", "bytes=", 10000, Full),
        case("syntax: only empty elements", "bytes=, ,", 10000, Full),
        case("syntax: letters", "bytes=abc", 10000, Full),
        case("syntax: first > last", "bytes=5-2", 10000, Full),
        case("syntax: lone dash", "bytes=-", 10000, Full),
        case("syntax: two dashes", "bytes=1-2-3", 10000, Full),
        case("syntax: double dash suffix", "bytes=--1", 10000, Full),
        case("syntax: plus sign on first", "bytes=+1-2", 10000, Full),
        case("syntax: plus sign on last", "bytes=1-+2", 10000, Full),
        case("syntax: hex", "bytes=0x10-0x20", 10000, Full),
        case("syntax: decimal point", "bytes=1.5-2", 10000, Full),
        case("syntax: space inside spec before dash", "bytes=0 -1", 10000, Full),
        case("syntax: space inside spec after dash", "bytes=0- 1", 10000, Full),
        case("syntax: semicolon separator", "bytes=0-1;2-3", 10000, Full),
        case("syntax: double =", "bytes==0-1", 10000, Full),
        case("syntax: non-ASCII", "bytes=0-1\u{e9}", 10000, Full),
        case("syntax: one bad member poisons all", "bytes=0-1,abc", 10000, Full),
        case("syntax: one reversed member poisons all", "bytes=0-1,5-2", 10000, Full),
        case("syntax: two field lines combined per §5.3", "bytes=0-1, bytes=5000-5001", 10000, Full),
        // List rule (§5.6.1.2): OWS around commas, empty elements.
        case("ows: spaces around comma", "bytes=0-1 , 5000-5001", 10000, partial(&[(0, 1), (5000, 5001)])),
        case("ows: tab after comma", "bytes=0-1,\t5000-5001", 10000, partial(&[(0, 1), (5000, 5001)])),
        case("ows: empty element", "bytes=0-1,,5000-5001", 10000, partial(&[(0, 1), (5000, 5001)])),
        case("ows: leading and trailing empty elements", "bytes=,0-1,", 10000, partial(&[(0, 1)])),
        case("ows: space after = and around comma", "bytes= 0-1 , 2-3", 10000, partial(&[(0, 3)])),
        case("ows: surrounding whitespace", " bytes=0-1 ", 10000, partial(&[(0, 1)])),
        // Huge numerals (§14.1.2).
        case("huge: last-pos u64::MAX", "bytes=1-18446744073709551615", 10000, partial(&[(1, 9999)])),
        case("huge: last-pos u64::MAX + 1", "bytes=1-18446744073709551616", 10000, partial(&[(1, 9999)])),
        case(
            "huge: 26-digit last-pos from zero is whole",
            "bytes=0-99999999999999999999999999",
            10000,
            partial(&[(0, 9999)]),
        ),
        case("huge: 26-digit last-pos", "bytes=5-99999999999999999999999999", 10000, partial(&[(5, 9999)])),
        case("huge: first-pos u64::MAX", "bytes=18446744073709551615-", 10000, Unsatisfiable),
        case("huge: 26-digit first-pos", "bytes=99999999999999999999999999-", 10000, Unsatisfiable),
        case("huge: both beyond u64", "bytes=18446744073709551616-18446744073709551617", 10000, Unsatisfiable),
        case(
            "huge: both beyond u64 and reversed",
            "bytes=99999999999999999999999999-99999999999999999999999998",
            10000,
            Full,
        ),
        case("huge: reversed against small last", "bytes=9999999999999999999999999-0", 10000, Full),
        case("huge: 26-digit suffix is whole", "bytes=-99999999999999999999999999", 10000, partial(&[(0, 9999)])),
        case("huge: whole suffix plus one byte exceeds size", "bytes=-18446744073709551616,0-0", 10000, Full),
        case("huge: unsatisfiable member dropped", "bytes=0-0,99999999999999999999999999-", 10000, partial(&[(0, 0)])),
        case(
            "huge: leading zeros",
            "bytes=000000000000000000000000000005-0000000000000000000000000009",
            10000,
            partial(&[(5, 9)]),
        ),
        // Suffix edge cases.
        case("suffix: zero length", "bytes=-0", 10000, Unsatisfiable),
        case("suffix: zero length and past end", "bytes=-0,10000-", 10000, Unsatisfiable),
        case("suffix: zero length dropped", "bytes=-0,0-0", 10000, partial(&[(0, 0)])),
        case("suffix: exactly the size is whole", "bytes=-10000", 10000, partial(&[(0, 9999)])),
        case("suffix: one less than size", "bytes=-9999", 10000, partial(&[(1, 9999)])),
        // Zero-length representation.
        case("empty: open int-range", "bytes=0-", 0, Unsatisfiable),
        case("empty: int-range", "bytes=0-0", 0, Unsatisfiable),
        case("empty: zero suffix", "bytes=-0", 0, Unsatisfiable),
        case("empty: non-zero suffix", "bytes=-1", 0, Full),
        case("empty: non-zero suffix among int-ranges", "bytes=0-0,-5", 0, Full),
        case("empty: invalid", "bytes=abc", 0, Full),
        case("empty: unknown unit", "items=0-0", 0, Full),
        // One-byte representation.
        case("one byte: the byte is whole", "bytes=0-0", 1, partial(&[(0, 0)])),
        case("one byte: past end", "bytes=1-", 1, Unsatisfiable),
        case("one byte: suffix is whole", "bytes=-1", 1, partial(&[(0, 0)])),
        // Coalescing with part_overhead = 80.
        case("coalesce: gap 79 merges", "bytes=0-99,179-199", 10000, partial(&[(0, 199)])),
        case("coalesce: gap 80 stays apart", "bytes=0-99,180-199", 10000, partial(&[(0, 99), (180, 199)])),
        case(
            "coalesce: nothing merges keeps request order",
            "bytes=9000-9099,0-99",
            10000,
            partial(&[(9000, 9099), (0, 99)]),
        ),
        case(
            "coalesce: a merge sorts ascending",
            "bytes=5000-5099,0-99,100-199",
            10000,
            partial(&[(0, 199), (5000, 5099)]),
        ),
        case("coalesce: duplicate", "bytes=0-99,0-99", 10000, partial(&[(0, 99)])),
        case("coalesce: chain out of order", "bytes=200-299,0-99,100-199", 10000, partial(&[(0, 299)])),
        case("coalesce: pieces that make the whole", "bytes=0-4999,5000-", 10000, partial(&[(0, 9999)])),
        // Caps.
        RangeCase {
            name: "cap: 64 parts allowed",
            header: header_of(&spaced_singles(64)),
            size: 10000,
            expect: Expect::Partial(spaced_singles(64)),
        },
        RangeCase { name: "cap: 65 parts ignored", header: header_of(&spaced_singles(65)), size: 10000, expect: Full },
        case("cap: two overlaps allowed", "bytes=0-99,50-149,100-199", 10000, partial(&[(0, 199)])),
        case("cap: three overlaps ignored", "bytes=0-99,50-149,100-199,150-249", 10000, Full),
        RangeCase {
            name: "cap: eight reversals allowed, request order kept",
            header: header_of(&reversed_singles(9)),
            size: 10000,
            expect: Expect::Partial(reversed_singles(9)),
        },
        RangeCase {
            name: "cap: nine reversals ignored",
            header: header_of(&reversed_singles(10)),
            size: 10000,
            expect: Full,
        },
        case("cap: sum over size (twice the whole)", "bytes=0-,0-", 10000, Full),
        case("cap: sum over size by one byte", "bytes=5000-,0-4999,0-0", 10000, Full),
    ]
}
