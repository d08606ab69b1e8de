//! The contract between handlers and the data driver: a response whose body is regions of one open file,
//! optionally interleaved with literal bytes (multipart boundaries). A native read hands it to the driver as it is
//! (`driver::FileAnswer`); through axum (S3 reads, the admin listener) it travels as a response *extension* beside
//! an empty body, because axum boxes bodies but leaves extensions intact through every middleware.
//!
//! Beside the regions, a [`FileBody`] carries the header fields its response shares with every other of its
//! object ([`SharedFields`], the catalog entry's, written once), and, for a file still filling from an object
//! store, the [`FillGate`] the driver sends through. [`SentByTheDriver`] is the in-memory body such a response
//! has through axum: none, of unknown length.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

/// What a file response carries as its in-memory body: nothing, of unknown length. An empty body would say its
/// length is exactly 0, and axum's router (the admin listener's) then adds `Content-Length: 0` to a response that
/// has none of its own; the driver writes the [`FileBody`]'s length instead. A unit struct, so boxing it into a
/// body allocates nothing.
#[derive(Debug, Clone, Copy)]
pub struct SentByTheDriver;

impl http_body::Body for SentByTheDriver {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(None)
    }
}

/// A body's pieces, in order.
pub type Segments = smallvec::SmallVec<[Segment; 1]>;

/// One piece of a file response body, sent in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Bytes written from memory: multipart boundaries and part headers only, never object bytes.
    Literal(Bytes),
    /// `len` bytes of the file from `offset`, sent by sendfile from that explicit offset.
    Region { offset: u64, len: u64 },
}

impl Segment {
    pub fn len(&self) -> u64 {
        match self {
            Segment::Literal(b) => b.len() as u64,
            Segment::Region { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the response is, for metrics and logs. Never used to decide what bytes to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownloadKind {
    Full,
    Range,
    Multipart,
    /// A static-site bucket's error document, whole, as the 404 of a missing key: no download of the document.
    ErrorDocument,
}

/// Identifies the object a file response serves, so the driver can attribute what it sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub bucket_id: i64,
    pub key: Arc<str>,
}

/// A file response body. Its regions lie within `file_size`, so a file that shrinks later shows up as a short
/// sendfile, never as a wrong length. The driver writes Content-Length from the body
/// ([`FileBody::total_len`]) when the response's own fields have none.
#[derive(Debug, Clone)]
pub struct FileBody {
    pub file: Arc<File>,
    /// The size every region lies within: `fstat` of this same `file` when it was opened from the data dir, the object
    /// row's for a file still filling from an object store (`catalog::ResponseBlob`).
    pub file_size: u64,
    /// One region for a whole object or a range, kept inline: most responses allocate no list.
    pub segments: Segments,
    pub kind: DownloadKind,
    pub object: ObjectRef,
    /// The content coding of the file's bytes: `identity`, or the precompressed variant (`br`, `gzip`) it is. The
    /// driver allows a matching Content-Encoding and no other; stats and the access log can say what was sent.
    pub encoding: &'static str,
    /// Header fields the response shares with every other response of its object (the catalog's prepared ones),
    /// by reference instead of copied into each response: the driver writes them before the response's own
    /// fields, except a name the response sets itself, which replaces them.
    pub shared_fields: Option<SharedFields>,
    /// Set when the file is filled while it is sent (a blob cached from an object store): the driver sends only
    /// bytes the gate says are there, and waits on it for the rest. `None` for a blob that is whole on disk.
    pub fill: Option<Arc<dyn FillGate>>,
    /// Whatever must live until the last byte is sent: a place among a principal's requests in progress (a
    /// concurrency limit), given back when the driver drops the body.
    pub held: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Set when a bandwidth limit covers the response: the driver sends each chunk of a region only once the pace
    /// grants its bytes, and gives back what sendfile did not take.
    pub pace: Option<Arc<dyn Pace>>,
    /// Who the response is for, as the worker shares its sends between principals (`None`: it takes no part).
    pub share: Option<Share>,
}

/// A principal as a worker's fair sharing of sends knows it: a key (a hash of who it is) and its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub key: u64,
    pub weight: u32,
}

/// Bytes per second shared by every response it is given to (a principal's bandwidth limit, on every worker).
pub trait Pace: Send + Sync + std::fmt::Debug {
    /// Up to `want` bytes that may be sent now (at least one), or how long to wait before asking again.
    fn grant(&self, want: u64) -> Result<u64, std::time::Duration>;
    /// Granted bytes that were not sent after all.
    fn refund(&self, unsent: u64);
    /// The scope of the limit that paces (`token`, `bucket`, …), a metric label.
    fn scope(&self) -> &'static str;
}

/// A file that fills while it is sent: a cache of an object store's blob, whose slices arrive from the store.
pub trait FillGate: Send + Sync + std::fmt::Debug {
    /// How many bytes from `offset`, at most `len`, the file holds now. `len` is what the response still has to
    /// send of this region: the gate fetches a little of it ahead, and nothing beyond it.
    fn ready(&self, offset: u64, len: u64) -> u64;
    /// Resolves once the byte at `offset` is in the file, or with the error that keeps it from coming.
    fn wait(&self, offset: u64) -> std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;
}

/// Header fields that many file responses share (a catalog entry's prepared ones), kept in their wire form alone
/// (a catalog holds one per cached object: one allocation of a few hundred bytes, not a `HeaderMap`'s kilobyte),
/// made once. Checked when made: none of them frames the body or is the driver's (Connection, Date), so the
/// driver's checks of a response's own fields still cover its framing.
#[derive(Debug, Clone)]
pub struct SharedFields(Arc<[u8]>);

/// Fields only a response itself may carry: how its own fields frame its body, and the driver's.
const NOT_SHARED: [http::HeaderName; 6] = [
    http::header::CONTENT_LENGTH,
    http::header::CONTENT_ENCODING,
    http::header::CONTENT_RANGE,
    http::header::TRANSFER_ENCODING,
    http::header::CONNECTION,
    http::header::DATE,
];

impl SharedFields {
    /// `fields`, or the first name among them that only a response's own fields may carry.
    pub fn new(fields: &http::HeaderMap) -> Result<Self, http::HeaderName> {
        if let Some(name) = NOT_SHARED.into_iter().find(|name| fields.contains_key(name)) {
            return Err(name);
        }
        let mut wire = Vec::new();
        write_fields(&mut wire, fields);
        Ok(Self(Arc::from(wire)))
    }

    /// The fields as the head carries them.
    pub fn wire(&self) -> &[u8] {
        &self.0
    }

    /// Each field as (name, value, its whole line), in order. Read back from the wire, which only
    /// [`write_fields`] wrote: a name has no `:`, a value no CR or LF (neither `HeaderName` nor `HeaderValue`
    /// holds one), so the first `:` ends the name and the first CR its line (with the LF after it).
    fn lines(&self) -> impl Iterator<Item = (&[u8], &[u8], &[u8])> {
        let mut rest = &self.0[..];
        std::iter::from_fn(move || {
            let end = memchr::memchr(b'\r', rest)? + 2;
            let (line, after) = rest.split_at(end);
            rest = after;
            let name_end = memchr::memchr(b':', line)?;
            Some((&line[..name_end], &line[name_end + 2..end - 2], line))
        })
    }

    /// The first value of `name`, as the head carries it.
    pub fn get(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.lines().find(|(n, _, _)| *n == name.as_str().as_bytes()).map(|(_, value, _)| value)
    }

    /// Whether a response's `own` fields name one of these (which they then replace). The names no shared field
    /// has are not looked up: a file response's own fields are mostly those.
    pub fn overlap(&self, own: &http::HeaderMap) -> bool {
        own.keys().any(|name| !NOT_SHARED.contains(name) && self.get(name).is_some())
    }

    /// Writes the lines of the fields `own` does not name (it replaces those).
    pub fn write_except(&self, out: &mut Vec<u8>, own: &http::HeaderMap) {
        for (name, _, line) in self.lines() {
            let replaced = std::str::from_utf8(name).is_ok_and(|name| own.contains_key(name));
            if !replaced {
                out.extend_from_slice(line);
            }
        }
    }

    /// The fields as a map, for a response that changes some of them.
    pub fn to_header_map(&self) -> http::HeaderMap {
        let mut map = http::HeaderMap::with_capacity(8);
        for (name, value, _) in self.lines() {
            // Both were a valid name and value when written.
            if let (Ok(name), Ok(value)) = (http::HeaderName::from_bytes(name), http::HeaderValue::from_bytes(value)) {
                map.append(name, value);
            }
        }
        map
    }

    /// The heap bytes these fields hold, for a cache that bounds its memory: the wire and the `Arc`'s two counts.
    pub fn heap_bytes(&self) -> usize {
        2 * std::mem::size_of::<usize>() + self.0.len()
    }
}

/// Writes `fields` as a response head carries them (`name: value\r\n` each), except Connection and Date, which
/// the driver owns. The one field writer: the driver's heads and [`SharedFields`]' wire form.
pub fn write_fields<'a>(
    out: &mut Vec<u8>,
    fields: impl IntoIterator<Item = (&'a http::HeaderName, &'a http::HeaderValue)>,
) {
    for (name, value) in fields {
        if name == http::header::CONNECTION || name == http::header::DATE {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

impl FileBody {
    /// Bytes the body will have on the wire: what Content-Length must say.
    pub fn total_len(&self) -> u64 {
        self.segments.iter().map(Segment::len).sum()
    }

    /// Object bytes the body carries (the regions only).
    pub fn object_len(&self) -> u64 {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Region { len, .. } => *len,
                Segment::Literal(_) => 0,
            })
            .sum()
    }

    /// Every region lies inside the file as it was when opened.
    pub fn regions_in_bounds(&self) -> bool {
        self.segments.iter().all(|s| match s {
            Segment::Region { offset, len } => offset.checked_add(*len).is_some_and(|end| end <= self.file_size),
            Segment::Literal(_) => true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_memory_body_of_a_file_response_has_no_exact_length() {
        // Else axum's router adds `Content-Length: 0` to a file response that leaves its length to the driver.
        assert_eq!(http_body::Body::size_hint(&SentByTheDriver).exact(), None);
    }

    #[test]
    fn shared_fields_never_describe_a_body_and_are_written_once() {
        let mut fields = http::HeaderMap::new();
        fields.insert(http::header::ETAG, http::HeaderValue::from_static("\"a\""));
        fields.append(http::header::CACHE_CONTROL, http::HeaderValue::from_static("max-age=1"));
        fields.append(http::header::CACHE_CONTROL, http::HeaderValue::from_static("immutable"));
        let shared = SharedFields::new(&fields).unwrap();
        assert_eq!(shared.wire(), b"etag: \"a\"\r\ncache-control: max-age=1\r\ncache-control: immutable\r\n");
        assert_eq!(shared.get(&http::header::ETAG), Some(&b"\"a\""[..]));
        assert_eq!(shared.get(&http::header::CACHE_CONTROL), Some(&b"max-age=1"[..]), "the first value");
        assert_eq!(shared.get(&http::header::EXPIRES), None);
        assert_eq!(shared.to_header_map(), fields, "the map back, every value in order");
        let mut out = Vec::new();
        shared.write_except(&mut out, &http::HeaderMap::from_iter([(http::header::ETAG, "\"b\"".parse().unwrap())]));
        assert_eq!(out, b"cache-control: max-age=1\r\ncache-control: immutable\r\n");
        for name in NOT_SHARED {
            let mut with = fields.clone();
            with.insert(name.clone(), http::HeaderValue::from_static("1"));
            assert_eq!(SharedFields::new(&with).unwrap_err(), name);
        }
    }
}
