//! `multipart/byteranges` bodies (RFC 9110 §14.6) laid out as segments: boundaries and part headers from memory,
//! part bytes as file regions. The layout is computed up front, so Content-Length is exact before anything is sent.

use bytes::Bytes;

use super::range::ByteRange;
use crate::file_body::{Segment, Segments};

/// Lays out the body for `ranges` of a `size`-byte representation of type `content_type`.
///
/// Format (RFC 2046 §5.1.1, as Go's net/http writes it): the first delimiter has no leading CRLF, every later one
/// does, and the close-delimiter ends with CRLF.
pub fn layout(ranges: &[ByteRange], size: u64, content_type: &str, boundary: &str) -> Segments {
    let mut segments = Segments::with_capacity(ranges.len() * 2 + 1);
    for (i, range) in ranges.iter().enumerate() {
        let lead = if i == 0 { "" } else { "\r\n" };
        let part_head = format!(
            "{lead}--{boundary}\r\ncontent-type: {content_type}\r\ncontent-range: bytes {}-{}/{size}\r\n\r\n",
            range.start,
            range.last()
        );
        segments.push(Segment::Literal(Bytes::from(part_head)));
        segments.push(Segment::Region { offset: range.start, len: range.len() });
    }
    segments.push(Segment::Literal(Bytes::from(format!("\r\n--{boundary}--\r\n"))));
    segments
}

/// A fresh boundary: 1–70 characters from RFC 2046's bchars, random so that no stored object can be crafted to
/// contain it.
pub fn new_boundary() -> String {
    format!("blobgate-{:016x}", getrandom::u64().unwrap_or(0x5eed_b10b_6a7e_0001))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_rfc_example_shape() {
        let ranges = [ByteRange { start: 0, end: 2 }, ByteRange { start: 8, end: 10 }];
        let segments = layout(&ranges, 10, "text/plain", "B");
        let text: String = segments
            .iter()
            .map(|s| match s {
                Segment::Literal(b) => String::from_utf8(b.to_vec()).unwrap(),
                Segment::Region { offset, len } => format!("<{offset}+{len}>"),
            })
            .collect();
        assert_eq!(
            text,
            "--B\r\ncontent-type: text/plain\r\ncontent-range: bytes 0-1/10\r\n\r\n<0+2>\r\n--B\r\n\
             content-type: text/plain\r\ncontent-range: bytes 8-9/10\r\n\r\n<8+2>\r\n--B--\r\n"
        );
    }

    #[test]
    fn boundaries_are_valid_and_differ() {
        let (a, b) = (new_boundary(), new_boundary());
        assert_ne!(a, b);
        assert!(a.len() <= 70 && a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-'));
    }
}
