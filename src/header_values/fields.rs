//! A request's header fields as its readers see them ([`Fields`]): either an `http::HeaderMap` (what axum hands
//! the handlers of S3 requests, writes and the admin listener) or the head as the driver parsed it
//! ([`HeadFields`]: the head's bytes and where each field is in them), which the data listener's native reads use
//! without building a map. Readers that serve both (preconditions, content negotiation, ranges, credentials,
//! classification) take `&dyn Fields`.
//!
//! Field names compare case-insensitively (RFC 9110 §5.1); `HeaderName`s are lowercase.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue, ValueIter};
use smallvec::SmallVec;

use super::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};

/// What a reader of a request's header fields asks of them.
pub trait Fields: Sync {
    /// Every value of the field `name`, in the order the request sent them.
    fn values<'a>(&'a self, name: &'a FieldName) -> Values<'a>;

    /// Whether the request has a field named in `names`.
    fn has_any(&self, names: &[&FieldName]) -> bool;

    /// The first value of `name`.
    fn get<'a>(&'a self, name: &'a FieldName) -> Option<&'a [u8]> {
        self.values(name).next()
    }

    fn contains(&self, name: &FieldName) -> bool {
        self.get(name).is_some()
    }

    /// The first value of `name` as a `HeaderValue` (for a response that echoes it, such as CORS's `Origin`).
    fn header_value(&self, name: &FieldName) -> Option<HeaderValue>;
}

/// A field name as readers ask for it: the `HeaderName`, and for the names the data listener reads on every
/// request ([`READ`]) their place in that list, so that a parsed head answers with one table read rather than by
/// comparing names. The read names are the statics below; any other is [`FieldName::other`].
#[derive(Debug, Clone)]
pub struct FieldName {
    name: HeaderName,
    /// The index in [`READ`], or [`NOT_READ`].
    read: u8,
}

const NOT_READ: u8 = u8::MAX;

impl FieldName {
    /// One of [`READ`], at `index` (the test `every_read_name_is_at_its_index` holds the two together).
    const fn read(name: HeaderName, index: usize) -> Self {
        assert!(index < READ.len());
        Self { name, read: index as u8 }
    }

    /// A name outside [`READ`]: a parsed head looks for it by comparing names.
    pub const fn other(name: HeaderName) -> Self {
        Self { name, read: NOT_READ }
    }

    pub fn name(&self) -> &HeaderName {
        &self.name
    }

    fn read_index(&self) -> Option<usize> {
        (self.read != NOT_READ).then_some(usize::from(self.read))
    }
}

pub static AUTHORIZATION: FieldName = FieldName::read(header::AUTHORIZATION, 0);
pub static HOST: FieldName = FieldName::read(header::HOST, 1);
pub static RANGE: FieldName = FieldName::read(header::RANGE, 2);
pub static ORIGIN: FieldName = FieldName::read(header::ORIGIN, 3);
pub static ACCEPT_ENCODING: FieldName = FieldName::read(header::ACCEPT_ENCODING, 4);
pub static IF_MATCH: FieldName = FieldName::read(header::IF_MATCH, 5);
pub static IF_NONE_MATCH: FieldName = FieldName::read(header::IF_NONE_MATCH, 6);
pub static IF_MODIFIED_SINCE: FieldName = FieldName::read(header::IF_MODIFIED_SINCE, 7);
pub static IF_UNMODIFIED_SINCE: FieldName = FieldName::read(header::IF_UNMODIFIED_SINCE, 8);
pub static IF_RANGE: FieldName = FieldName::read(header::IF_RANGE, 9);
pub static COOKIE: FieldName = FieldName::read(header::COOKIE, 10);
pub static ACCESS_CONTROL_REQUEST_METHOD: FieldName = FieldName::read(header::ACCESS_CONTROL_REQUEST_METHOD, 11);
pub static EXPECT: FieldName = FieldName::read(header::EXPECT, 12);
pub static CONTENT_LENGTH: FieldName = FieldName::read(header::CONTENT_LENGTH, 13);
pub static TRANSFER_ENCODING: FieldName = FieldName::read(header::TRANSFER_ENCODING, 14);
pub static CONNECTION: FieldName = FieldName::read(header::CONNECTION, 15);

/// The values of one field name, from either kind of [`Fields`].
pub enum Values<'a> {
    Map(ValueIter<'a, HeaderValue>),
    /// A name the head has at most once (noted as it was parsed): its value, until taken.
    One(Option<&'a [u8]>),
    /// Every field from `fields` on whose name is `name` (lowercase), compared.
    Scan {
        fields: std::slice::Iter<'a, Field>,
        head: &'a [u8],
        name: &'a str,
    },
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match self {
            Values::Map(values) => values.next().map(HeaderValue::as_bytes),
            Values::One(value) => value.take(),
            Values::Scan { fields, head, name } => {
                fields.find(|field| field.is_named(head, name)).map(|field| field.value(head))
            }
        }
    }
}

impl Fields for HeaderMap {
    fn values<'a>(&'a self, name: &'a FieldName) -> Values<'a> {
        Values::Map(self.get_all(&name.name).iter())
    }

    fn has_any(&self, names: &[&FieldName]) -> bool {
        self.keys().any(|key| names.iter().any(|name| name.name == *key))
    }

    fn header_value(&self, name: &FieldName) -> Option<HeaderValue> {
        self.get(&name.name).cloned()
    }
}

/// Where one field is in the head: name and value as byte ranges.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    name_start: u32,
    name_len: u32,
    value_start: u32,
    value_len: u32,
}

impl Field {
    fn name<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.name_start as usize..][..self.name_len as usize]
    }

    fn value<'h>(&self, head: &'h [u8]) -> &'h [u8] {
        &head[self.value_start as usize..][..self.value_len as usize]
    }

    fn is_named(&self, head: &[u8], name: &str) -> bool {
        self.name_len as usize == name.len() && self.name(head).eq_ignore_ascii_case(name.as_bytes())
    }
}

/// The names the data listener's readers look up on every request, lowercase: [`HeadFields`] notes where each
/// one's first field is, and whether it has another, as it parses, so that reading one (or learning that it is
/// absent, the usual case for Range, Origin and the preconditions) takes no pass over the fields. Each has its
/// [`FieldName`] static above.
const READ: [&str; 16] = [
    "authorization",
    "host",
    "range",
    "origin",
    "accept-encoding",
    "if-match",
    "if-none-match",
    "if-modified-since",
    "if-unmodified-since",
    "if-range",
    "cookie",
    "access-control-request-method",
    "expect",
    "content-length",
    "transfer-encoding",
    "connection",
];

/// The index in [`READ`] of the request's field name `raw`, in any case: by its length first, then its bytes.
fn read_index(raw: &[u8]) -> Option<usize> {
    let is = |i: usize| raw.eq_ignore_ascii_case(READ[i].as_bytes()).then_some(i);
    match raw.len() {
        4 => is(1),
        5 => is(2),
        6 => is(3).or_else(|| is(10)).or_else(|| is(12)),
        8 => is(5).or_else(|| is(9)),
        10 => is(15),
        13 => is(0).or_else(|| is(6)),
        14 => is(13),
        15 => is(4),
        17 => is(7).or_else(|| is(14)),
        19 => is(8),
        29 => is(11),
        _ => None,
    }
}

/// A request head's fields as parsed: the head's bytes (one copy of them, shared) and each field's place in it.
/// Names and values were validated by the parser (`httparse` accepts exactly the `tchar` names and the visible,
/// tab and obs-text value bytes that `HeaderName` and `HeaderValue` accept), so [`HeadFields::to_header_map`]
/// cannot fail.
#[derive(Debug, Clone, Default)]
pub struct HeadFields {
    head: Bytes,
    // Browsers send about a dozen fields, curl three, SDKs about eight.
    fields: SmallVec<[Field; 16]>,
    /// For each of [`READ`], 1 + the index of its first field; 0 when the head has none.
    first: [u16; READ.len()],
    /// Bit `i` set when the head has more than one field named [`READ`]`[i]`.
    repeated: u16,
}

impl HeadFields {
    /// Fields of `head`, added with [`push_at`](Self::push_at).
    pub fn new(head: Bytes, count: usize) -> Self {
        let mut fields = SmallVec::new();
        // Nothing to do for a head with up to the inline count (written so, the inline array is built in place).
        fields.reserve(count);
        Self { head, fields, first: [0; READ.len()], repeated: 0 }
    }

    /// Adds the field whose name `name` is at `name_start` in the head and whose value is `value_len` bytes at
    /// `value_start`; `None` when that is not inside the head, or past 65,535 fields.
    pub fn push_at(&mut self, name_start: usize, name: &[u8], value_start: usize, value_len: usize) -> Option<()> {
        let inside = |start: usize, len: usize| start.checked_add(len).is_some_and(|end| end <= self.head.len());
        if !inside(name_start, name.len()) || !inside(value_start, value_len) {
            return None;
        }
        let field = Field {
            name_start: u32::try_from(name_start).ok()?,
            name_len: u32::try_from(name.len()).ok()?,
            value_start: u32::try_from(value_start).ok()?,
            value_len: u32::try_from(value_len).ok()?,
        };
        let position = u16::try_from(self.fields.len() + 1).ok()?;
        if let Some(i) = read_index(name) {
            if self.first[i] == 0 {
                self.first[i] = position;
            } else {
                self.repeated |= 1 << i;
            }
        }
        self.fields.push(field);
        Some(())
    }

    /// The head's bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.head
    }

    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The same fields in an `http::HeaderMap`, for the handlers that take one; values share the head's bytes.
    pub fn to_header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(self.fields.len());
        for field in &self.fields {
            if let (Some(name), Ok(value)) = (header_name(field.name(&self.head)), self.value_bytes(field)) {
                map.append(name, value);
            }
        }
        map
    }

    fn value_bytes(&self, field: &Field) -> Result<HeaderValue, http::header::InvalidHeaderValue> {
        let start = field.value_start as usize;
        HeaderValue::from_maybe_shared(self.head.slice(start..start + field.value_len as usize))
    }

    /// The first field named `name`: at once for one of [`READ`], else by a pass over the fields.
    fn first(&self, name: &FieldName) -> Option<&Field> {
        match name.read_index() {
            Some(i) => self.fields.get(usize::from(self.first[i]).checked_sub(1)?),
            None => self.fields.iter().find(|field| field.is_named(&self.head, name.name.as_str())),
        }
    }
}

impl Fields for HeadFields {
    fn values<'a>(&'a self, name: &'a FieldName) -> Values<'a> {
        let Some(i) = name.read_index() else {
            return Values::Scan { fields: self.fields.iter(), head: &self.head, name: name.name.as_str() };
        };
        let Some(first) = usize::from(self.first[i]).checked_sub(1) else {
            return Values::One(None);
        };
        if self.repeated & (1 << i) == 0 {
            Values::One(self.fields.get(first).map(|field| field.value(&self.head)))
        } else {
            Values::Scan { fields: self.fields[first..].iter(), head: &self.head, name: READ[i] }
        }
    }

    fn has_any(&self, names: &[&FieldName]) -> bool {
        names.iter().any(|name| self.first(name).is_some())
    }

    fn get<'a>(&'a self, name: &'a FieldName) -> Option<&'a [u8]> {
        self.first(name).map(|field| field.value(&self.head))
    }

    fn contains(&self, name: &FieldName) -> bool {
        self.first(name).is_some()
    }

    // Shares the head's bytes.
    fn header_value(&self, name: &FieldName) -> Option<HeaderValue> {
        self.value_bytes(self.first(name)?).ok()
    }
}

/// A request header name. `http` knows the standard names without allocating; the names S3 clients send on
/// every request are not among them, so they are matched here (by length, then bytes) against static copies
/// rather than lowercased into an allocation each.
pub fn header_name(raw: &[u8]) -> Option<HeaderName> {
    let known = match raw.len() {
        10 => &X_AMZ_DATE,
        15 => &AMZ_SDK_REQUEST,
        20 => &X_AMZ_CONTENT_SHA256,
        21 => &AMZ_SDK_INVOCATION_ID,
        _ => return HeaderName::from_bytes(raw).ok(),
    };
    if known.as_str().as_bytes().eq_ignore_ascii_case(raw) {
        Some(known.clone())
    } else {
        HeaderName::from_bytes(raw).ok()
    }
}

// What botocore and aws-cli send on every request beyond `http`'s standard names.
static AMZ_SDK_REQUEST: HeaderName = HeaderName::from_static("amz-sdk-request");
static AMZ_SDK_INVOCATION_ID: HeaderName = HeaderName::from_static("amz-sdk-invocation-id");

/// The same two names as readers ask for them: an AWS SDK's marks (`s3::operation::from_aws_sdk`).
pub static SDK_REQUEST: FieldName = FieldName::other(HeaderName::from_static("amz-sdk-request"));
pub static SDK_INVOCATION_ID: FieldName = FieldName::other(HeaderName::from_static("amz-sdk-invocation-id"));

#[cfg(test)]
mod tests {
    use super::*;
    use http::header;

    fn head_fields(raw: &'static [u8], fields: &[(&str, &str)]) -> HeadFields {
        let mut parsed = HeadFields::new(Bytes::from_static(raw), fields.len());
        let mut from = 0;
        for (name, value) in fields {
            let mut at = |part: &str| {
                let start = from + raw[from..].windows(part.len()).position(|w| w == part.as_bytes()).unwrap();
                from = start + part.len();
                start
            };
            let (name_start, value_start) = (at(name), at(value));
            parsed.push_at(name_start, name.as_bytes(), value_start, value.len()).unwrap();
        }
        parsed
    }

    #[test]
    fn both_kinds_answer_alike() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nAccept-Encoding: gzip\r\nX-Amz-Date: d\r\naccept-encoding: br\r\n\r\n";
        let head = head_fields(
            raw,
            &[("Host", "h"), ("Accept-Encoding", "gzip"), ("X-Amz-Date", "d"), ("accept-encoding", "br")],
        );
        let map = head.to_header_map();
        let amz_date = FieldName::other(X_AMZ_DATE.clone());
        let user_agent = FieldName::other(header::USER_AGENT);
        for fields in [&head as &dyn Fields, &map] {
            assert_eq!(fields.values(&ACCEPT_ENCODING).collect::<Vec<_>>(), [&b"gzip"[..], b"br"]);
            assert_eq!(fields.get(&HOST), Some(&b"h"[..]));
            assert_eq!(fields.values(&HOST).collect::<Vec<_>>(), [&b"h"[..]]);
            assert_eq!(fields.get(&amz_date), Some(&b"d"[..]));
            assert_eq!(fields.values(&amz_date).collect::<Vec<_>>(), [&b"d"[..]]);
            assert_eq!(fields.values(&RANGE).count(), 0);
            assert_eq!(fields.values(&user_agent).count(), 0);
            assert_eq!(fields.header_value(&HOST).unwrap(), "h");
            assert!(fields.contains(&HOST));
            assert!(!fields.contains(&RANGE));
            assert!(fields.has_any(&[&RANGE, &HOST]));
            assert!(!fields.has_any(&[&RANGE, &IF_MATCH]));
            assert!(fields.has_any(&[&amz_date]));
            assert!(!fields.has_any(&[&user_agent]));
        }
        assert_eq!(head.header_value(&ACCEPT_ENCODING).unwrap(), "gzip");
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn every_read_name_is_found_in_any_case_and_no_other() {
        for (i, name) in READ.iter().enumerate() {
            assert_eq!(HeaderName::from_static(name).as_str(), *name, "a lowercase header name");
            assert_eq!(read_index(name.as_bytes()), Some(i), "{name}");
            assert_eq!(read_index(name.to_ascii_uppercase().as_bytes()), Some(i), "{name}");
        }
        for other in ["user-agent", "hosts", "if-matcH!", "content-type", "connections", ""] {
            assert_eq!(read_index(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn every_read_name_is_at_its_index() {
        let statics = [
            &AUTHORIZATION,
            &HOST,
            &RANGE,
            &ORIGIN,
            &ACCEPT_ENCODING,
            &IF_MATCH,
            &IF_NONE_MATCH,
            &IF_MODIFIED_SINCE,
            &IF_UNMODIFIED_SINCE,
            &IF_RANGE,
            &COOKIE,
            &ACCESS_CONTROL_REQUEST_METHOD,
            &EXPECT,
            &CONTENT_LENGTH,
            &TRANSFER_ENCODING,
            &CONNECTION,
        ];
        assert_eq!(statics.len(), READ.len());
        for (i, name) in statics.iter().enumerate() {
            assert_eq!(name.read_index(), Some(i));
            assert_eq!(name.name().as_str(), READ[i]);
        }
        assert_eq!(FieldName::other(header::USER_AGENT).read_index(), None);
    }

    #[test]
    fn a_repeated_read_name_gives_every_value() {
        let raw = b"GET / HTTP/1.1\r\nRange: a\r\nHost: h\r\nrange: b\r\n\r\n";
        let head = head_fields(raw, &[("Range", "a"), ("Host", "h"), ("range", "b")]);
        assert_eq!(head.values(&RANGE).collect::<Vec<_>>(), [&b"a"[..], b"b"]);
        assert_eq!(head.values(&HOST).collect::<Vec<_>>(), [&b"h"[..]]);
        assert_eq!(head.get(&RANGE), Some(&b"a"[..]));
    }

    #[test]
    fn a_field_outside_the_head_is_not_taken() {
        let mut head = HeadFields::new(Bytes::copy_from_slice(b"Host: h"), 1);
        assert!(head.push_at(0, b"Host", 6, 2).is_none());
        assert!(head.push_at(usize::MAX, b"Host", 6, 1).is_none());
        assert!(head.is_empty());
        assert!(head.push_at(0, b"Host", 6, 1).is_some());
        assert_eq!(head.get(&HOST), Some(&b"h"[..]));
    }

    #[test]
    fn s3_client_header_names_are_the_static_ones_in_any_case_and_others_parse_as_before() {
        for raw in ["x-amz-date", "X-Amz-Date", "X-AMZ-CONTENT-SHA256", "amz-sdk-request", "Amz-Sdk-Invocation-Id"] {
            let name = header_name(raw.as_bytes()).expect("a valid name");
            assert_eq!(name.as_str(), raw.to_ascii_lowercase());
            assert_eq!(name, HeaderName::from_bytes(raw.as_bytes()).unwrap());
        }
        // The same lengths as names in the table, and names http knows itself.
        for raw in ["x-amz-dafe", "x-amz-content-sha255", "Content-Length", "Host"] {
            assert_eq!(header_name(raw.as_bytes()), HeaderName::from_bytes(raw.as_bytes()).ok(), "{raw}");
        }
        assert_eq!(header_name(b"x-amz date"), None);
        assert_eq!(header_name(b"bad name here!!"), None);
    }
}
