//! Pure request-body framing (RFC 9112 §6 and §7.1), on both listeners: a `Content-Length` body or the
//! `chunked` transfer coding, decoded incrementally from the front of the connection's read buffer. No IO.
//!
//! Data comes out as views of the buffer (`split_to`), never copied; whatever follows the body stays in the
//! buffer, from which the connection takes the next (pipelined) request head. Chunk extensions and trailer fields are
//! read past and dropped (the S3 trailers our handlers check are inside the aws-chunked payload, not HTTP ones).

use bytes::{Buf, Bytes};

/// How a request says its body is framed (decided from the head by `head::check_framing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    /// No body: no `Content-Length` (or 0) and no `Transfer-Encoding`.
    None,
    Length(u64),
    Chunked,
}

/// A chunk-size line (with extensions) longer than this is refused.
const MAX_CHUNK_LINE: usize = 4096;
/// All trailer fields of one body together, at most.
const MAX_TRAILER_BYTES: usize = 16 * 1024;

/// Why a body's framing cannot be followed: the connection is closed after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FramingError(pub &'static str);

/// One step of decoding.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded {
    /// Body bytes, taken from the front of the buffer.
    Data(Bytes),
    /// The buffer holds no complete next piece: read more.
    NeedMore,
    /// The body has ended; the buffer now starts with whatever follows it.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Content-Length bytes still to come.
    Length(u64),
    /// At a chunk-size line.
    Size,
    /// Chunk data bytes still to come.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer fields after the last chunk, up to an empty line.
    Trailers,
    Done,
}

/// Follows one request body's framing.
#[derive(Debug)]
pub struct BodyDecoder {
    state: State,
    trailer_bytes: usize,
}

impl BodyDecoder {
    pub fn new(framing: BodyFraming) -> Self {
        let state = match framing {
            BodyFraming::None | BodyFraming::Length(0) => State::Done,
            BodyFraming::Length(n) => State::Length(n),
            BodyFraming::Chunked => State::Size,
        };
        Self { state, trailer_bytes: 0 }
    }

    /// Whether every byte of the body's framing has been taken from the buffer (so the next request may follow).
    /// True as soon as a `Content-Length` body's last data is taken, before the `Done` step.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Takes the next piece of the body from the front of `buf`.
    pub fn decode(&mut self, buf: &mut Bytes) -> Result<Decoded, FramingError> {
        loop {
            match self.state {
                State::Done => return Ok(Decoded::Done),
                State::Length(left) | State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Decoded::NeedMore);
                    }
                    let take = left.min(buf.len() as u64);
                    let data = buf.split_to(take as usize);
                    self.state = match (self.state, left - take) {
                        (State::Length(_), 0) => State::Done,
                        (State::Length(_), rest) => State::Length(rest),
                        (_, 0) => State::DataEnd,
                        (_, rest) => State::Data(rest),
                    };
                    return Ok(Decoded::Data(data));
                }
                State::Size => {
                    let Some((line, size)) = chunk_size_line(buf)? else { return Ok(Decoded::NeedMore) };
                    buf.advance(line);
                    self.state = if size == 0 { State::Trailers } else { State::Data(size) };
                }
                State::DataEnd => {
                    if buf.len() < 2 {
                        return Ok(Decoded::NeedMore);
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(FramingError("chunk data not followed by CRLF"));
                    }
                    buf.advance(2);
                    self.state = State::Size;
                }
                State::Trailers => {
                    let Some(lf) = memchr::memchr(b'\n', buf) else {
                        if self.trailer_bytes + buf.len() > MAX_TRAILER_BYTES {
                            return Err(FramingError("trailer section too large"));
                        }
                        return Ok(Decoded::NeedMore);
                    };
                    if lf == 0 || buf[lf - 1] != b'\r' {
                        return Err(FramingError("bare LF in the trailer section"));
                    }
                    let line = lf + 1;
                    if line == 2 {
                        buf.advance(2);
                        self.state = State::Done;
                        continue;
                    }
                    self.trailer_bytes += line;
                    if self.trailer_bytes > MAX_TRAILER_BYTES {
                        return Err(FramingError("trailer section too large"));
                    }
                    if !buf[..line].contains(&b':') || buf[0] == b' ' || buf[0] == b'\t' {
                        return Err(FramingError("malformed trailer field"));
                    }
                    buf.advance(line);
                }
            }
        }
    }
}

/// A complete chunk-size line at the front of `buf`: its length and the chunk size. `None` when it is not all
/// there yet. httparse reads the size and skips extensions; a line must start with a hex digit, and a bare LF
/// inside it (which httparse lets through in an extension) is refused, since a proxy in front may end the line
/// there.
fn chunk_size_line(buf: &[u8]) -> Result<Option<(usize, u64)>, FramingError> {
    let bad = || FramingError("malformed chunk size line");
    match httparse::parse_chunk_size(buf) {
        Ok(httparse::Status::Complete((line, _))) if line > MAX_CHUNK_LINE => {
            Err(FramingError("chunk size line too long"))
        }
        Ok(httparse::Status::Complete((line, size))) => {
            if !buf[0].is_ascii_hexdigit() || memchr::memchr(b'\n', &buf[..line - 1]).is_some() {
                return Err(bad());
            }
            Ok(Some((line, size)))
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_CHUNK_LINE => Err(FramingError("chunk size line too long")),
        Ok(httparse::Status::Partial) => {
            if memchr::memchr(b'\n', buf).is_some() {
                return Err(bad());
            }
            Ok(None)
        }
        Err(httparse::InvalidChunkSize) => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Feeds `stream` to a decoder in the pieces cut at `cuts`; returns the body and what is left after it.
    fn decode_all(framing: BodyFraming, stream: &[u8], cuts: &[usize]) -> Result<(Vec<u8>, Vec<u8>), FramingError> {
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (stream.len() + 1)).collect();
        points.push(stream.len());
        points.sort_unstable();
        let mut decoder = BodyDecoder::new(framing);
        let mut buf = Bytes::new();
        let mut body = Vec::new();
        let mut fed = 0;
        let mut next = points.into_iter();
        loop {
            match decoder.decode(&mut buf)? {
                Decoded::Data(d) => body.extend_from_slice(&d),
                Decoded::Done => {
                    let mut rest = buf.to_vec();
                    rest.extend_from_slice(&stream[fed..]);
                    return Ok((body, rest));
                }
                Decoded::NeedMore => {
                    let Some(upto) = next.next() else { return Err(FramingError("stream ended")) };
                    buf = [&buf[..], &stream[fed..upto]].concat().into();
                    fed = upto;
                }
            }
        }
    }

    fn chunked(body: &[u8], sizes: &[usize], trailers: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let mut rest = body;
        let mut sizes = sizes.iter().cycle();
        while !rest.is_empty() {
            let n = (*sizes.next().unwrap_or(&7)).clamp(1, rest.len());
            out.extend_from_slice(format!("{n:X};name=\"v\"\r\n").as_bytes());
            out.extend_from_slice(&rest[..n]);
            out.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        out.extend_from_slice(b"0\r\n");
        out.extend_from_slice(trailers.as_bytes());
        out.extend_from_slice(b"\r\n");
        out
    }

    #[test]
    fn a_chunked_body_is_decoded_and_what_follows_is_left() {
        let mut stream = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\n".to_vec();
        stream.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let (body, rest) = decode_all(BodyFraming::Chunked, &stream, &[]).unwrap();
        assert_eq!(body, b"hello world");
        assert_eq!(rest, b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn a_content_length_body_is_done_with_its_last_byte() {
        let mut decoder = BodyDecoder::new(BodyFraming::Length(5));
        let mut buf = Bytes::from_static(b"helloGET");
        assert_eq!(decoder.decode(&mut buf), Ok(Decoded::Data(Bytes::from_static(b"hello"))));
        assert!(decoder.is_done(), "done before the next call, so the connection may continue");
        assert_eq!(decoder.decode(&mut buf), Ok(Decoded::Done));
        assert_eq!(&buf[..], b"GET");
        assert!(BodyDecoder::new(BodyFraming::Length(0)).is_done());
        assert!(BodyDecoder::new(BodyFraming::None).is_done());
    }

    #[test]
    fn bad_chunk_framing_is_refused() {
        for stream in [
            &b"x\r\nhello\r\n0\r\n\r\n"[..],
            b"\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5;a\nb\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nX-T: 1\n\r\n",
            b"5\r\nhello\r\n0\r\nno colon\r\n\r\n",
            b"5\r\nhello\r\n0\r\n folded: x\r\n\r\n",
            b"10000000000000000\r\n",
        ] {
            let got = decode_all(BodyFraming::Chunked, stream, &[]);
            assert!(got.is_err(), "{:?} gave {got:?}", String::from_utf8_lossy(stream));
        }
        let long = format!("1;{}\r\n", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            decode_all(BodyFraming::Chunked, long.as_bytes(), &[]),
            Err(FramingError("chunk size line too long"))
        );
        let many = format!("0\r\n{}", "X-T: 1\r\n".repeat(MAX_TRAILER_BYTES / 8 + 1));
        assert_eq!(
            decode_all(BodyFraming::Chunked, many.as_bytes(), &[]),
            Err(FramingError("trailer section too large"))
        );
    }

    proptest! {
        /// However the bytes arrive, a chunked body decodes to exactly what was encoded, and the bytes after it
        /// (the next request) are left untouched.
        #[test]
        fn chunked_bodies_round_trip_under_any_split(
            body in proptest::collection::vec(prop_oneof![Just(b'\r'), Just(b'\n'), Just(b'0'), any::<u8>()], 0..300),
            sizes in proptest::collection::vec(1usize..70, 1..5),
            trailers in prop_oneof![Just(String::new()), Just("X-Checksum: abc\r\n".to_owned()), Just("A: 1\r\nB: 2\r\n".to_owned())],
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let mut stream = chunked(&body, &sizes, &trailers);
            stream.extend_from_slice(&tail);
            let (got, rest) = decode_all(BodyFraming::Chunked, &stream, &cuts).expect("valid framing");
            prop_assert_eq!(got, body);
            prop_assert_eq!(rest, tail);
        }

        /// The same for a Content-Length body.
        #[test]
        fn length_bodies_round_trip_under_any_split(
            body in proptest::collection::vec(any::<u8>(), 0..300),
            tail in proptest::collection::vec(any::<u8>(), 0..40),
            cuts in proptest::collection::vec(any::<usize>(), 0..10),
        ) {
            let mut stream = body.clone();
            stream.extend_from_slice(&tail);
            let (got, rest) = decode_all(BodyFraming::Length(body.len() as u64), &stream, &cuts).unwrap();
            prop_assert_eq!(got, body);
            prop_assert_eq!(rest, tail);
        }

        /// The decoder never panics and never takes more than it was given, whatever the bytes.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), cuts in proptest::collection::vec(any::<usize>(), 0..6)) {
            if let Ok((body, rest)) = decode_all(BodyFraming::Chunked, &bytes, &cuts) {
                prop_assert!(body.len() + rest.len() <= bytes.len());
            }
        }
    }
}
