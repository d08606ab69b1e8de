//! The contract between handlers and the data driver: a response whose body is regions of one open file,
//! optionally interleaved with literal bytes (multipart boundaries). It travels as a response *extension* beside
//! an empty body, because axum boxes bodies but leaves extensions intact through every middleware.

use std::fs::File;
use std::sync::Arc;

use bytes::Bytes;

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

/// A file response body. The handler computed Content-Length from `fstat` of this same `file`, so a file that
/// shrinks later shows up as a short sendfile, never as a wrong length.
#[derive(Debug, Clone)]
pub struct FileBody {
    pub file: Arc<File>,
    /// Size of the file when it was opened (fstat), which every region lies within.
    pub file_size: u64,
    pub segments: Vec<Segment>,
    pub kind: DownloadKind,
    pub object: ObjectRef,
    /// The content coding of the file's bytes: `identity`, or the precompressed variant (`br`, `gzip`) it is. The
    /// driver allows a matching Content-Encoding and no other; stats and the access log can say what was sent.
    pub encoding: &'static str,
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
