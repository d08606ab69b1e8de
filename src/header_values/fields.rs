//! A request's header fields as its readers see them ([`Fields`]): either an `http::HeaderMap` (what axum hands
//! the handlers of S3 requests, writes and the admin listener) or the head as the driver parsed it
//! ([`HeadFields`]: the head's bytes and where each field is in them), which the data listener's native reads use
//! without building a map. Readers that serve both (preconditions, content negotiation, ranges, credentials,
//! classification) take `&dyn Fields`.
//!
//! Field names compare case-insensitively (RFC 9110 §5.1); `HeaderName`s are lowercase.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, ValueIter};
use smallvec::SmallVec;

use super::{X_AMZ_CONTENT_SHA256, X_AMZ_DATE};

/// What a reader of a request's header fields asks of them.
pub trait Fields: Sync {
    /// Every value of the field `name`, in the order the request sent them.
    fn values(&self, name: &HeaderName) -> Values<'_>;

    /// Whether the request has a field named in `names`.
    fn has_any(&self, names: &[HeaderName]) -> bool;

    /// The first value of `name`.
    fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        self.values(name).next()
    }

    fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// The first value of `name` as a `HeaderValue` (for a response that echoes it, such as CORS's `Origin`).
    fn header_value(&self, name: &HeaderName) -> Option<HeaderValue>;
}

/// The values of one field name, from either kind of [`Fields`].
pub enum Values<'a> {
    /// A field the request does not have.
    None,
    Map(ValueIter<'a, HeaderValue>),
    /// One of [`READ`], from its first field on.
    Read {
        fields: std::slice::Iter<'a, Field>,
        head: &'a [u8],
        name: &'static str,
    },
    /// Another name: every field is compared.
    Other {
        fields: std::slice::Iter<'a, Field>,
        head: &'a [u8],
        name: HeaderName,
    },
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let (fields, head, name) = match self {
            Values::None => return None,
            Values::Map(values) => return values.next().map(HeaderValue::as_bytes),
            Values::Read { fields, head, name } => (fields, *head, *name),
            Values::Other { fields, head, name } => (fields, *head, name.as_str()),
        };
        fields.find(|field| field.is_named(head, name)).map(|field| field.value(head))
    }
}

impl Fields for HeaderMap {
    fn values(&self, name: &HeaderName) -> Values<'_> {
        Values::Map(self.get_all(name).iter())
    }

    fn has_any(&self, names: &[HeaderName]) -> bool {
        self.keys().any(|name| names.contains(name))
    }

    fn header_value(&self, name: &HeaderName) -> Option<HeaderValue> {
        self.get(name).cloned()
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
/// one's first field is as it parses, so that reading one (or learning that it is absent, the usual case for
/// Range, Origin and the preconditions) takes no pass over the fields.
const READ: [&str; 13] = [
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
];

/// The index in [`READ`] of a field name for which `same` holds: by its length first, then its bytes.
fn read_index_by(name: &[u8], same: impl Fn(&[u8], &[u8]) -> bool) -> Option<usize> {
    let is = |i: usize| same(name, READ[i].as_bytes()).then_some(i);
    match name.len() {
        4 => is(1),
        5 => is(2),
        6 => is(3).or_else(|| is(10)).or_else(|| is(12)),
        8 => is(5).or_else(|| is(9)),
        13 => is(0).or_else(|| is(6)),
        15 => is(4),
        17 => is(7),
        19 => is(8),
        29 => is(11),
        _ => None,
    }
}

/// The index in [`READ`] of the request's field name `raw`, in any case.
fn read_index(raw: &[u8]) -> Option<usize> {
    read_index_by(raw, <[u8]>::eq_ignore_ascii_case)
}

/// The index in [`READ`] of `name` (lowercase already, so compared exactly).
fn read_index_of(name: &HeaderName) -> Option<usize> {
    read_index_by(name.as_str().as_bytes(), |a, b| a == b)
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
}

impl HeadFields {
    /// Fields of `head`, added with [`push_at`](Self::push_at).
    pub fn new(head: Bytes, count: usize) -> Self {
        Self { head, fields: SmallVec::with_capacity(count), first: [0; READ.len()] }
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
        if let Some(i) = read_index(name)
            && self.first[i] == 0
        {
            self.first[i] = position;
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
    fn first(&self, name: &HeaderName) -> Option<&Field> {
        match read_index_of(name) {
            Some(i) => self.fields.get(usize::from(self.first[i]).checked_sub(1)?),
            None => self.fields.iter().find(|field| field.is_named(&self.head, name.as_str())),
        }
    }
}

impl Fields for HeadFields {
    fn values(&self, name: &HeaderName) -> Values<'_> {
        match read_index_of(name) {
            Some(i) => match usize::from(self.first[i]).checked_sub(1) {
                Some(first) => Values::Read { fields: self.fields[first..].iter(), head: &self.head, name: READ[i] },
                None => Values::None,
            },
            None => Values::Other { fields: self.fields.iter(), head: &self.head, name: name.clone() },
        }
    }

    fn has_any(&self, names: &[HeaderName]) -> bool {
        names.iter().any(|name| self.first(name).is_some())
    }

    fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        self.first(name).map(|field| field.value(&self.head))
    }

    fn contains(&self, name: &HeaderName) -> bool {
        self.first(name).is_some()
    }

    // Shares the head's bytes.
    fn header_value(&self, name: &HeaderName) -> Option<HeaderValue> {
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
        for fields in [&head as &dyn Fields, &map] {
            assert_eq!(fields.values(&header::ACCEPT_ENCODING).collect::<Vec<_>>(), [&b"gzip"[..], b"br"]);
            assert_eq!(fields.get(&header::HOST), Some(&b"h"[..]));
            assert_eq!(fields.get(&X_AMZ_DATE), Some(&b"d"[..]));
            assert_eq!(fields.values(&X_AMZ_DATE).collect::<Vec<_>>(), [&b"d"[..]]);
            assert_eq!(fields.values(&header::RANGE).count(), 0);
            assert_eq!(fields.header_value(&header::HOST).unwrap(), "h");
            assert!(fields.contains(&header::HOST));
            assert!(!fields.contains(&header::RANGE));
            assert!(fields.has_any(&[header::RANGE, header::HOST]));
            assert!(!fields.has_any(&[header::RANGE, header::IF_MATCH]));
        }
        assert_eq!(head.header_value(&header::ACCEPT_ENCODING).unwrap(), "gzip");
        assert_eq!(map.len(), 4);
    }

    #[test]
    fn every_read_name_is_found_in_any_case_and_no_other() {
        for (i, name) in READ.iter().enumerate() {
            assert_eq!(HeaderName::from_static(name).as_str(), *name, "a lowercase header name");
            assert_eq!(read_index(name.as_bytes()), Some(i), "{name}");
            assert_eq!(read_index(name.to_ascii_uppercase().as_bytes()), Some(i), "{name}");
            assert_eq!(read_index_of(&HeaderName::from_static(name)), Some(i), "{name}");
        }
        for other in ["user-agent", "hosts", "if-matcH!", "content-length", ""] {
            assert_eq!(read_index(other.as_bytes()), None, "{other}");
            if let Ok(other) = HeaderName::from_bytes(other.as_bytes()) {
                assert_eq!(read_index_of(&other), None);
            }
        }
    }

    #[test]
    fn a_field_outside_the_head_is_not_taken() {
        let mut head = HeadFields::new(Bytes::copy_from_slice(b"Host: h"), 1);
        assert!(head.push_at(0, b"Host", 6, 2).is_none());
        assert!(head.push_at(usize::MAX, b"Host", 6, 1).is_none());
        assert!(head.is_empty());
        assert!(head.push_at(0, b"Host", 6, 1).is_some());
        assert_eq!(head.get(&http::header::HOST), Some(&b"h"[..]));
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
