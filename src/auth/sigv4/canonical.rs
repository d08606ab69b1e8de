//! The canonical request of SigV4 for S3, piece by piece, and the `x-amz-date` timestamp. Pure; every piece is
//! unit- and property-tested on its own.
//!
//! ```text
//! <method>\n<canonical URI>\n<canonical query>\n<canonical headers>\n<signed headers>\n<payload hash>
//! ```
//!
//! Each piece is written into a [`Sink`]: a buffer when the text itself is wanted (tests), and on the request path
//! straight into the SHA-256 that the string to sign needs, so a verification builds no string at all. A request
//! without a query (a GetObject) allocates nothing here; a query's parameters are sorted by reference, and only a
//! parameter not already in canonical form is re-encoded.

use std::borrow::Cow;

use http::{HeaderMap, HeaderValue};
use percent_encoding::{percent_decode, percent_encode};

use super::{AuthKind, SigV4Auth, SigV4Error, UNSIGNED_PAYLOAD};
use crate::header_values::calendar::{days_from_civil, days_in_month};
use crate::header_values::uri::{self, is_unreserved};

/// The query parameter that carries a presigned URL's signature: the one parameter it does not sign.
pub const SIGNATURE_PARAM: &str = "X-Amz-Signature";

/// Where canonical text goes: a buffer, or a hash or MAC fed as it is written.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for sha2::Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        sha2::Digest::update(self, bytes);
    }
}

impl Sink for hmac::Hmac<sha2::Sha256> {
    fn put(&mut self, bytes: &[u8]) {
        hmac::Mac::update(self, bytes);
    }
}

/// Gathers small pieces on the stack and passes them on in large updates: a hash fed piece by piece pays a call
/// and a partial-block copy for each of the ~30 pieces of a canonical request. Call [`Gather::finish`] last.
pub struct Gather<'s, S: Sink> {
    inner: &'s mut S,
    buf: [u8; GATHER_BYTES],
    len: usize,
}

const GATHER_BYTES: usize = 512;

impl<'s, S: Sink> Gather<'s, S> {
    pub fn new(inner: &'s mut S) -> Self {
        Self { inner, buf: [0; GATHER_BYTES], len: 0 }
    }

    /// Passes on what is still gathered.
    pub fn finish(mut self) {
        self.flush();
    }

    fn flush(&mut self) {
        if self.len > 0 {
            self.inner.put(&self.buf[..self.len]);
            self.len = 0;
        }
    }
}

impl<S: Sink> Sink for Gather<'_, S> {
    // Out of line: inlined at each of a canonical request's ~30 pieces, its copy and bounds checks were a kilobyte
    // of code that a request fetches once, which costs more than the calls.
    #[inline(never)]
    fn put(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > GATHER_BYTES {
            self.flush();
            if bytes.len() > GATHER_BYTES {
                self.inner.put(bytes);
                return;
            }
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

/// The whole canonical request of `auth` over `request`, as the bytes that are hashed.
pub fn canonical_request(request: &super::RequestParts<'_>, auth: &SigV4Auth<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical_request(&mut out, request, auth);
    out
}

/// [`canonical_request`], written into `out` piece by piece. `auth` came from parsing this same `request`: its
/// payload line is the `x-amz-content-sha256` that parsing read.
pub fn write_canonical_request(out: &mut impl Sink, request: &super::RequestParts<'_>, auth: &SigV4Auth<'_>) {
    let exclude = (auth.kind == AuthKind::Query).then_some(SIGNATURE_PARAM);
    out.put(request.method.as_bytes());
    out.put(b"\n");
    out.put(canonical_uri(request.path).as_bytes());
    out.put(b"\n");
    write_canonical_query(out, request.query.unwrap_or(""), exclude);
    out.put(b"\n");
    write_canonical_headers(out, request.headers, auth.signed_headers());
    out.put(b"\n");
    out.put(auth.signed_headers.as_bytes());
    out.put(b"\n");
    out.put(auth.payload_text.as_bytes());
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
    let mut out = Vec::with_capacity(raw_query.len() + 16);
    write_canonical_query(&mut out, raw_query, exclude);
    String::from_utf8(out).expect("the canonical query is ASCII")
}

fn write_canonical_query(out: &mut impl Sink, raw_query: &str, exclude: Option<&str>) {
    if !raw_query.is_empty() {
        write_query_pairs(out, raw_query, exclude);
    }
}

/// Out of line: a GetObject has no query, and its check should not step over this code.
#[inline(never)]
fn write_query_pairs(out: &mut impl Sink, raw_query: &str, exclude: Option<&str>) {
    let mut pairs: Vec<(Cow<'_, str>, Cow<'_, str>)> = raw_query
        .split('&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| {
            let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
            (canonical_component(name), canonical_component(value))
        })
        .filter(|(name, _)| exclude.is_none_or(|excluded| name != excluded))
        .collect();
    pairs.sort_unstable();
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.put(b"&");
        }
        out.put(name.as_bytes());
        out.put(b"=");
        out.put(value.as_bytes());
    }
}

/// One query name or value in canonical form: borrowed when it already is (what SDKs send), re-encoded when not.
fn canonical_component(raw: &str) -> Cow<'_, str> {
    if is_canonical(raw.as_bytes()) { Cow::Borrowed(raw) } else { Cow::Owned(uri_encode(&query_decode(raw), true)) }
}

/// Whether `uri_encode(query_decode(raw))` is `raw` itself: only unreserved bytes, and `%XY` (uppercase hex)
/// for bytes that are not unreserved.
fn is_canonical(raw: &[u8]) -> bool {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if is_unreserved(b) {
            i += 1;
            continue;
        }
        let upper_hex = |b: u8| b.is_ascii_digit() || (b'A'..=b'F').contains(&b);
        if b != b'%' || i + 2 >= raw.len() {
            return false;
        }
        let (hi, lo) = (raw[i + 1], raw[i + 2]);
        if !upper_hex(hi) || !upper_hex(lo) || is_unreserved(hex_value(hi) << 4 | hex_value(lo)) {
            return false;
        }
        i += 3;
    }
    true
}

fn hex_value(digit: u8) -> u8 {
    match digit {
        b'0'..=b'9' => digit - b'0',
        _ => digit - b'A' + 10,
    }
}

/// `text.split(sep)` for an ASCII separator, by [`find_ascii`]: `str::split`'s general searcher costs more than the
/// search on SigV4's fields.
pub fn split_ascii(text: &str, sep: u8) -> impl Iterator<Item = &str> + Clone {
    debug_assert!(sep.is_ascii());
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match find_ascii(t.as_bytes(), sep) {
            Some(i) => {
                rest = Some(&t[i + 1..]);
                Some(&t[..i])
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

/// `text.split_once(sep)` for an ASCII separator (see [`split_ascii`]).
pub fn split_once_ascii(text: &str, sep: u8) -> Option<(&str, &str)> {
    let i = find_ascii(text.as_bytes(), sep)?;
    Some((&text[..i], &text[i + 1..]))
}

/// The first `sep` in `bytes`. `memchr` pays a call through its CPU-dispatch pointer, which only a long text
/// (such as the `Authorization` value) repays; SigV4's short fields are scanned byte by byte.
fn find_ascii(bytes: &[u8], sep: u8) -> Option<usize> {
    if bytes.len() >= 64 { memchr::memchr(sep, bytes) } else { bytes.iter().position(|&b| b == sep) }
}

/// 64 hex digits as 32 bytes, in one pass; `None` for any other text. `lowercase_only` refuses `A-F`.
pub fn hex_32(text: &str, lowercase_only: bool) -> Option<[u8; 32]> {
    let digits: &[u8; 64] = text.as_bytes().try_into().ok()?;
    let table = if lowercase_only { &HEX_LOWER } else { &HEX_ANY };
    let mut out = [0u8; 32];
    // No branch per digit: a non-digit reads as 0xFF, whose high bits survive the OR and refuse the whole text.
    let mut bad = 0u8;
    for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let (hi, lo) = (table[usize::from(pair[0])], table[usize::from(pair[1])]);
        bad |= hi | lo;
        *byte = hi << 4 | lo;
    }
    (bad < 16).then_some(out)
}

/// The value of each hex digit byte, 0xFF for any other byte.
static HEX_ANY: [u8; 256] = hex_table(true);
/// The same without `A-F`.
static HEX_LOWER: [u8; 256] = hex_table(false);

const fn hex_table(uppercase: bool) -> [u8; 256] {
    let mut table = [0xFF; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        if uppercase {
            table[b'A' as usize + i] = 10 + i as u8;
        }
        i += 1;
    }
    table
}

/// One query name or value as bytes: `+` is a space, `%XY` a byte; a `%` not followed by two hex digits stays.
pub fn query_decode(raw: &str) -> Vec<u8> {
    let plus_as_space: Vec<u8> = raw.bytes().map(|b| if b == b'+' { b' ' } else { b }).collect();
    percent_decode(&plus_as_space).collect()
}

/// SigV4's URI encoding: RFC 3986 unreserved bytes (`A-Z a-z 0-9 - . _ ~`) as they are, every other byte as
/// `%XY` with uppercase hex; `/` too when `encode_slash`.
pub fn uri_encode(bytes: &[u8], encode_slash: bool) -> String {
    percent_encode(bytes, if encode_slash { uri::COMPONENT } else { uri::PATH }).to_string()
}

/// `name:value\n` for each signed header, in the signed order. The value is every field of that name joined
/// with `,`, each trimmed and with runs of whitespace inside collapsed to one space (as botocore does). A
/// signed header that is absent has an empty value, which then fails the signature like any other change.
pub fn canonical_headers<'n>(headers: &HeaderMap, signed: impl IntoIterator<Item = &'n str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_canonical_headers(&mut out, headers, signed);
    out
}

fn write_canonical_headers<'n>(out: &mut impl Sink, headers: &HeaderMap, signed: impl IntoIterator<Item = &'n str>) {
    for name in signed {
        out.put(name.as_bytes());
        out.put(b":");
        // A scan of the request's few headers rather than a lookup: a lookup by text parses and hashes the name
        // first. The map yields each name's fields together and in the order they came.
        let fields = headers.iter().filter(|(n, _)| n.as_str() == name);
        for (i, (_, value)) in fields.enumerate() {
            if i > 0 {
                out.put(b",");
            }
            put_trimmed(out, value.as_bytes());
        }
        out.put(b"\n");
    }
}

/// Trims `value` and collapses each inner run of whitespace into one space.
fn put_trimmed(out: &mut impl Sink, value: &[u8]) {
    // Most signed values (hosts, dates, hashes, ranges) have no byte at or below a space at all: one scan with no
    // early exit, which the compiler turns into wide compares.
    if !value.iter().fold(false, |any, &b| any | (b <= b' ')) {
        return out.put(value);
    }
    let is_space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0b;
    // What clients send otherwise: no space at either end and single spaces inside, so the value goes as it is.
    let plain = value.first().is_none_or(|b| !is_space(b))
        && value.last().is_none_or(|b| !is_space(b))
        && !value.windows(2).any(|w| is_space(&w[0]) && (w[0] != b' ' || is_space(&w[1])));
    if plain { out.put(value) } else { put_collapsed(out, value) }
}

fn put_collapsed(out: &mut impl Sink, value: &[u8]) {
    let is_space = |b: &u8| b.is_ascii_whitespace() || *b == 0x0b;
    for (i, word) in value.split(is_space).filter(|w| !w.is_empty()).enumerate() {
        if i > 0 {
            out.put(b" ");
        }
        out.put(word);
    }
}

/// The last line of the canonical request: `x-amz-content-sha256` as sent (`value`). A presigned URL that sends
/// none signs `UNSIGNED-PAYLOAD`; header auth must send one.
pub fn payload_text(value: Option<&HeaderValue>, kind: AuthKind) -> Result<&str, SigV4Error> {
    match value {
        Some(value) => value.to_str().map_err(|_| {
            SigV4Error::InvalidArgument("x-amz-content-sha256 must be a sha256 value or one of the named forms.".into())
        }),
        None if kind == AuthKind::Query => Ok(UNSIGNED_PAYLOAD),
        None => {
            Err(SigV4Error::InvalidRequest("Missing required header for this request: x-amz-content-sha256".into()))
        }
    }
}

/// An ISO 8601 basic timestamp, `YYYYMMDDTHHMMSSZ` (UTC), as SigV4 sends it. Kept inline (16 bytes), so parsing
/// one allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AmzDate {
    /// As sent (checked to be ASCII digits, `T` and `Z`): it goes into the string to sign verbatim.
    text: [u8; 16],
    /// The same instant in unix seconds.
    pub unix: i64,
}

impl std::fmt::Debug for AmzDate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmzDate").field("text", &self.text()).field("unix", &self.unix).finish()
    }
}

impl AmzDate {
    /// `None` unless `text` is exactly `YYYYMMDDTHHMMSSZ` with a real calendar date and time.
    pub fn parse(text: &str) -> Option<Self> {
        let b: [u8; 16] = text.as_bytes().try_into().ok()?;
        if b[8] != b'T' || b[15] != b'Z' {
            return None;
        }
        let number = |range: std::ops::Range<usize>| -> Option<i64> {
            let digits = &b[range];
            digits.iter().all(u8::is_ascii_digit).then(|| digits.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
        };
        let (year, month, day) = (number(0..4)?, number(4..6)?, number(6..8)?);
        let (hour, minute, second) = (number(9..11)?, number(11..13)?, number(13..15)?);
        if day < 1 || day > days_in_month(year, month)? {
            return None;
        }
        if hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        let unix = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
        Some(AmzDate { text: b, unix })
    }

    /// A request dated by its `Date` header (no `x-amz-date`), as AWS takes it: an HTTP-date (RFC 9110 §5.6.7:
    /// IMF-fixdate, RFC 850 or asctime), or RFC 5322's form with a UTC offset of zero (`-0000`, what botocore and
    /// Python's `email.utils.formatdate` write). The string to sign carries it as `YYYYMMDDTHHMMSSZ`.
    pub fn from_http_date(text: &str) -> Option<Self> {
        let text = text.trim();
        let gmt;
        let text = match text.strip_suffix(" -0000").or_else(|| text.strip_suffix(" +0000")) {
            Some(rest) => {
                gmt = format!("{rest} GMT");
                gmt.as_str()
            }
            None => text,
        };
        let time = httpdate::parse_http_date(text).ok()?;
        let unix = i64::try_from(time.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs()).ok()?;
        let (year, month, day) = crate::header_values::calendar::civil_from_days(unix.div_euclid(86_400));
        let secs = unix.rem_euclid(86_400);
        let formatted =
            format!("{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60);
        Self::parse(&formatted)
    }

    /// The timestamp as sent: what the string to sign carries.
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.text).expect("parse accepted ASCII only")
    }

    /// `YYYYMMDD`: what the credential scope must name.
    pub fn date(&self) -> &str {
        &self.text()[..8]
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use proptest::prelude::*;

    use super::*;
    use crate::auth::sigv4::tests::headers;

    #[test]
    fn uri_encoding_keeps_only_unreserved_bytes() {
        assert_eq!(uri_encode(b"AZaz09-._~", true), "AZaz09-._~");
        assert_eq!(uri_encode(b"a b+c%d/e", true), "a%20b%2Bc%25d%2Fe");
        assert_eq!(uri_encode(b"a b+c%d/e", false), "a%20b%2Bc%25d/e");
        assert_eq!(uri_encode("é🙂".as_bytes(), true), "%C3%A9%F0%9F%99%82");
        assert_eq!(uri_encode(&[0, 0xff], true), "%00%FF");
    }

    #[test]
    fn the_canonical_query_is_decoded_encoded_and_sorted() {
        let cases = [
            ("", ""),
            ("b=2&a=1&a=0", "a=0&a=1&b=2"),
            ("acl", "acl="),
            ("acl=&uploads", "acl=&uploads="),
            ("a+b=c+d", "a%20b=c%20d"),
            ("x=%7e%7E~", "x=~~~"),
            ("x=%2b%2F", "x=%2B%2F"),
            ("k=%e4%b8%ad", "k=%E4%B8%AD"),
            ("&&x=1&&", "x=1"),
            ("a=1=2", "a=1%3D2"),
            ("bad=%zz", "bad=%25zz"),
            // Byte order: uppercase before lowercase, `-` before letters.
            ("prefix=J&max-keys=2&Z=1", "Z=1&max-keys=2&prefix=J"),
        ];
        for (raw, want) in cases {
            assert_eq!(canonical_query(raw, None), want, "{raw}");
        }
        assert_eq!(canonical_query("X-Amz-Signature=abc&b=1&X-Amz-Date=2", Some(SIGNATURE_PARAM)), "X-Amz-Date=2&b=1");
        assert_eq!(canonical_uri(""), "/");
        assert_eq!(canonical_uri("/a%20b/../c//d"), "/a%20b/../c//d");
    }

    #[test]
    fn canonical_header_values_are_trimmed_collapsed_and_joined() {
        let h = headers(&[("x-amz-meta-a", "  one   two\t\tthree  "), ("x-amz-meta-b", "1"), ("x-amz-meta-b", " 2 ")]);
        let signed = ["host", "x-amz-meta-a", "x-amz-meta-b"];
        assert_eq!(
            String::from_utf8(canonical_headers(&h, signed)).unwrap(),
            "host:\nx-amz-meta-a:one two three\nx-amz-meta-b:1,2\n"
        );
    }

    #[test]
    fn timestamps_parse_exactly() {
        assert_eq!(AmzDate::parse("20130524T000000Z").map(|d| d.unix), Some(1_369_353_600));
        assert_eq!(AmzDate::parse("19700101T000000Z").map(|d| d.unix), Some(0));
        assert_eq!(AmzDate::parse("20240229T235959Z").map(|d| d.unix), Some(1_709_251_199));
        for bad in [
            "20230229T000000Z",
            "20130524T000000",
            "20130524 000000Z",
            "2013052aT000000Z",
            "20131324T000000Z",
            "20130524T006000Z",
            "+0130524T000000Z",
            "",
        ] {
            assert_eq!(AmzDate::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_date_header_reads_as_the_amz_date_it_means() {
        let want = AmzDate::parse("19941106T084937Z").unwrap();
        for text in [
            "Sun, 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49:37 -0000",
            "Sun, 06 Nov 1994 08:49:37 +0000",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun Nov  6 08:49:37 1994",
        ] {
            assert_eq!(AmzDate::from_http_date(text), Some(want), "{text}");
        }
        for bad in ["", "19941106T084937Z", "Sun, 06 Nov 1994 08:49:37 +0100", "Sun, 31 Feb 1994 08:49:37 GMT"] {
            assert_eq!(AmzDate::from_http_date(bad), None, "{bad}");
        }
    }

    /// `YYYYMMDDTHHMMSSZ` of a unix time, through `httpdate`'s formatter (an independent calendar).
    fn amz_text(unix: u64) -> String {
        let http = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(unix));
        // "Fri, 24 May 2013 00:00:00 GMT"
        let parts: Vec<&str> = http.split([' ', ':']).collect();
        let month = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
            .iter()
            .position(|m| *m == parts[2])
            .unwrap()
            + 1;
        format!("{}{month:02}{}T{}{}{}Z", parts[3], parts[1], parts[4], parts[5], parts[6])
    }

    proptest! {
        /// The byte-scan splits are `str::split` and `str::split_once`, for any text and separator.
        #[test]
        fn ascii_splits_are_str_splits(text in "[a-c;,/= é]{0,24}", sep in proptest::sample::select(vec![b';', b',', b'/', b'=', b' '])) {
            let ours: Vec<&str> = split_ascii(&text, sep).collect();
            let theirs: Vec<&str> = text.split(sep as char).collect();
            prop_assert_eq!(ours, theirs);
            prop_assert_eq!(split_once_ascii(&text, sep), text.split_once(sep as char));
        }

        /// A value sent as it is by the shortcut is exactly what trimming and collapsing would give.
        #[test]
        fn trimming_shortcut_changes_nothing(value in proptest::collection::vec(
            prop_oneof![Just(b' '), Just(b'\t'), Just(0x0b), Just(b'\r'), b'a'..=b'c'], 0..16)) {
            let (mut shortcut, mut full) = (Vec::new(), Vec::new());
            put_trimmed(&mut shortcut, &value);
            put_collapsed(&mut full, &value);
            prop_assert_eq!(shortcut, full);
        }

        /// `hex_32` decodes what the hex crate decodes, and refuses uppercase when asked to.
        #[test]
        fn hex_32_is_the_hex_crate(bytes in proptest::array::uniform32(any::<u8>()), upper in any::<bool>(),
                                   noise in proptest::option::of((0usize..64, "[g-zG-Z+ ]"))) {
            let mut text = if upper { hex::encode_upper(bytes) } else { hex::encode(bytes) };
            if let Some((at, c)) = &noise {
                text.replace_range(*at..*at + 1, c);
            }
            let mut expected = [0u8; 32];
            let valid = hex::decode_to_slice(&text, &mut expected).is_ok();
            prop_assert_eq!(hex_32(&text, false), valid.then_some(expected));
            let lowercase = valid && !text.bytes().any(|b| b.is_ascii_uppercase());
            prop_assert_eq!(hex_32(&text, true), lowercase.then_some(expected));
            prop_assert_eq!(hex_32(&text[..63], false), None);
        }

        /// Every instant from 1970 to 9999 reads back as itself.
        #[test]
        fn timestamps_read_back(unix in 0u64..253_402_300_800) {
            let text = amz_text(unix);
            prop_assert_eq!(AmzDate::parse(&text).map(|d| d.unix), Some(unix as i64), "{}", text);
        }

        /// Encoding keeps only unreserved characters and `%XY`, and decodes back to the same bytes.
        #[test]
        fn uri_encoding_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64), slash in any::<bool>()) {
            let encoded = uri_encode(&bytes, slash);
            prop_assert!(encoded.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._~%".contains(&b) || (!slash && b == b'/')));
            prop_assert_eq!(percent_decode(encoded.as_bytes()).collect::<Vec<u8>>(), bytes);
        }

        /// A query component kept as sent is exactly what decoding and re-encoding it gives.
        #[test]
        fn components_kept_as_sent_are_canonical(raw in "([a-zA-Z0-9 +~_.=/-]|%[0-9a-fA-F]{0,2}|é){0,12}") {
            let reencoded = uri_encode(&query_decode(&raw), true);
            let kept = canonical_component(&raw);
            prop_assert_eq!(kept.as_ref(), reencoded.as_str());
        }

        /// The canonical query does not depend on the order of the parameters, and is its own canonical form.
        #[test]
        fn the_canonical_query_ignores_order(
            pairs in proptest::collection::vec(("[a-zA-Z0-9 %+~é_.=-]{0,8}", "[a-zA-Z0-9 %+~é/_.=-]{0,8}"), 0..8),
            seed in any::<u64>(),
        ) {
            let encode = |(n, v): &(String, String)| format!("{}={}", uri_encode(n.as_bytes(), true), uri_encode(v.as_bytes(), true));
            let raw: Vec<String> = pairs.iter().map(encode).collect();
            let mut shuffled = raw.clone();
            let len = shuffled.len();
            if len > 1 {
                shuffled.rotate_left((seed as usize) % len);
                shuffled.swap(0, (seed as usize / 7) % len);
            }
            let canonical = canonical_query(&raw.join("&"), None);
            prop_assert_eq!(&canonical_query(&shuffled.join("&"), None), &canonical);
            prop_assert_eq!(canonical_query(&canonical, None), canonical);
        }

        /// Whitespace around and inside a header value never changes its canonical form.
        #[test]
        fn header_whitespace_is_insignificant(words in proptest::collection::vec("[!-~]{1,6}", 1..5), pads in proptest::collection::vec("[ \t]{1,3}", 6)) {
            let tight = words.join(" ");
            let mut loose = pads[0].clone();
            for (i, w) in words.iter().enumerate() {
                loose.push_str(w);
                loose.push_str(&pads[(i + 1) % pads.len()]);
            }
            let a = canonical_headers(&headers(&[("x-amz-meta-v", &tight)]), ["x-amz-meta-v"]);
            let b = canonical_headers(&headers(&[("x-amz-meta-v", &loose)]), ["x-amz-meta-v"]);
            prop_assert_eq!(a, b);
        }
    }
}
