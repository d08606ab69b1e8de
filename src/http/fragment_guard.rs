//! The admin listener's refusal of a `#` in a request target.
//!
//! hyper turns the target into an `http::Uri`, which drops a fragment silently (`PUT /b/k#/../x` stores `b/k`),
//! so no service or layer can see it. Instead, [`FragmentGuard`] watches the bytes hyper reads from the socket:
//! [`TargetScanner`] follows HTTP/1.1 message framing (Content-Length, chunked) to know where each request line
//! starts, and replaces a `#` in a target with DEL (0x7f), a byte no request target may contain. hyper's parser
//! then refuses the head: 400, and the connection closes. Body bytes are never changed: on anything the scanner
//! does not fully understand it stops scanning the connection (hyper refuses such framing anyway).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Replaces `#` in a request target: httparse refuses it there, so hyper answers 400.
const REFUSED_TARGET_BYTE: u8 = 0x7f;
/// A request head longer than this is past hyper's own limit; the scanner stops rather than buffer more.
const MAX_HEAD_BYTES: usize = 512 * 1024;
/// Header fields parsed to find the framing; hyper refuses more than 100.
const MAX_HEADERS: usize = 128;
/// A chunk-size line (with extensions) longer than this is refused by hyper; the scanner stops.
const MAX_CHUNK_LINE: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request line, where empty lines are skipped (RFC 9112 §2.2).
    LineStart,
    Method,
    Target,
    /// The rest of the head, gathered to read its framing.
    Head,
    /// This many Content-Length body bytes to pass.
    Body(u64),
    ChunkSize,
    ChunkData(u64),
    /// The CRLF after a chunk's data.
    ChunkEnd,
    /// Trailer fields after the last chunk, up to an empty line; `true` while the current line is empty.
    Trailers(bool),
    /// Scanning stopped for this connection: a refused target, or framing hyper will refuse.
    Off,
}

/// Finds request targets in the bytes of one HTTP/1.1 connection, in order, and neutralises a `#` in them.
/// Pure: it sees only the bytes it is given.
#[derive(Debug)]
pub struct TargetScanner {
    state: State,
    /// The current request head, or the current chunk-size line.
    line: Vec<u8>,
}

impl Default for TargetScanner {
    fn default() -> Self {
        Self { state: State::LineStart, line: Vec::new() }
    }
}

impl TargetScanner {
    /// Takes the next bytes read from the connection, rewriting a `#` in a request target in place.
    pub fn scan(&mut self, bytes: &mut [u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Off => return,
                State::Body(left) | State::ChunkData(left) => {
                    let take = left.min((bytes.len() - i) as u64);
                    i += take as usize;
                    self.state = match (self.state, left - take) {
                        (State::Body(_), 0) => State::LineStart,
                        (State::Body(_), rest) => State::Body(rest),
                        (_, 0) => State::ChunkEnd,
                        (_, rest) => State::ChunkData(rest),
                    };
                }
                _ => {
                    self.byte(&mut bytes[i]);
                    i += 1;
                }
            }
        }
    }

    /// Whether scanning has stopped for this connection.
    pub fn is_off(&self) -> bool {
        self.state == State::Off
    }

    fn byte(&mut self, b: &mut u8) {
        match self.state {
            State::LineStart => {
                if *b != b'\r' && *b != b'\n' {
                    self.line.clear();
                    self.line.push(*b);
                    self.state = State::Method;
                }
            }
            State::Method => {
                self.line.push(*b);
                match *b {
                    b' ' => self.state = State::Target,
                    b'\r' | b'\n' => self.state = State::Off,
                    _ => {}
                }
            }
            State::Target => match *b {
                b'#' => {
                    *b = REFUSED_TARGET_BYTE;
                    self.state = State::Off;
                }
                b'\r' | b'\n' => self.state = State::Off,
                b' ' => {
                    self.line.push(*b);
                    self.state = State::Head;
                }
                _ => self.line.push(*b),
            },
            State::Head => {
                self.line.push(*b);
                if *b == b'\n' && (self.line.ends_with(b"\n\r\n") || self.line.ends_with(b"\n\n")) {
                    self.state = framing(&self.line);
                    self.line.clear();
                } else if self.line.len() > MAX_HEAD_BYTES {
                    self.state = State::Off;
                }
            }
            State::ChunkSize => {
                self.line.push(*b);
                if *b == b'\n' {
                    self.state = match httparse::parse_chunk_size(&self.line) {
                        Ok(httparse::Status::Complete((_, 0))) => State::Trailers(true),
                        Ok(httparse::Status::Complete((_, size))) => State::ChunkData(size),
                        _ => State::Off,
                    };
                    self.line.clear();
                } else if self.line.len() > MAX_CHUNK_LINE {
                    self.state = State::Off;
                }
            }
            State::ChunkEnd => match *b {
                b'\r' => {}
                b'\n' => self.state = State::ChunkSize,
                _ => self.state = State::Off,
            },
            State::Trailers(empty) => match *b {
                b'\r' => {}
                b'\n' if empty => self.state = State::LineStart,
                b'\n' => self.state = State::Trailers(true),
                _ => self.state = State::Trailers(false),
            },
            State::Body(_) | State::ChunkData(_) | State::Off => unreachable!("handled in bulk by scan"),
        }
    }
}

/// What follows a complete request head (RFC 9112 §6.3): a chunked body, a Content-Length body, or nothing.
/// Anything ambiguous stops scanning: hyper refuses such a head and closes the connection.
fn framing(head: &[u8]) -> State {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut fields);
    if !matches!(request.parse(head), Ok(httparse::Status::Complete(_))) {
        return State::Off;
    }
    let headers: &[httparse::Header<'_>] = request.headers;
    let named = |name: &'static str| headers.iter().filter(move |h| h.name.eq_ignore_ascii_case(name));
    let mut lengths = named("content-length").map(|h| std::str::from_utf8(h.value).ok()?.trim().parse::<u64>().ok());
    let length = match lengths.next() {
        None => None,
        Some(Some(n)) if lengths.all(|other| other == Some(n)) => Some(n),
        Some(_) => return State::Off,
    };
    match (named("transfer-encoding").next_back(), length) {
        (None, None | Some(0)) => State::LineStart,
        (None, Some(n)) => State::Body(n),
        (Some(te), None) => {
            let last = te.value.rsplit(|&b| b == b',').next().unwrap_or_default();
            if last.trim_ascii().eq_ignore_ascii_case(b"chunked") { State::ChunkSize } else { State::Off }
        }
        (Some(_), Some(_)) => State::Off,
    }
}

/// An admin connection's socket with a [`TargetScanner`] over everything read from it.
pub struct FragmentGuard<T> {
    inner: T,
    scanner: TargetScanner,
}

impl<T> FragmentGuard<T> {
    pub fn new(inner: T) -> Self {
        Self { inner, scanner: TargetScanner::default() }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for FragmentGuard<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if !this.scanner.is_off() {
            this.scanner.scan(&mut buf.filled_mut()[before..]);
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for FragmentGuard<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Scans `stream` in pieces cut at `cuts`, and returns what hyper would read.
    fn scanned(stream: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut out = stream.to_vec();
        let mut scanner = TargetScanner::default();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (out.len() + 1)).collect();
        points.push(0);
        points.push(out.len());
        points.sort_unstable();
        for w in points.windows(2) {
            scanner.scan(&mut out[w[0]..w[1]]);
        }
        out
    }

    const BODY_WITH_REQUEST_LINES: &[u8] = b"PUT /b/x#y HTTP/1.1\r\n\r\n#\n\n# GET /#/ HTTP/1.1\r\n";

    fn put(target: &str, body: &[u8]) -> Vec<u8> {
        let mut raw =
            format!("PUT {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
        raw.extend_from_slice(body);
        raw
    }

    fn chunked(target: &str, body: &[u8]) -> Vec<u8> {
        let mut raw = format!("PUT {target} HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
        for piece in body.chunks(7) {
            raw.extend_from_slice(format!("{:x};ext=\"#\"\r\n", piece.len()).as_bytes());
            raw.extend_from_slice(piece);
            raw.extend_from_slice(b"\r\n");
        }
        raw.extend_from_slice(b"0\r\nX-Trailer: #\r\n\r\n");
        raw
    }

    #[test]
    fn a_fragment_in_a_target_is_neutralised_and_scanning_stops() {
        let raw = b"GET /b/k#/../x HTTP/1.1\r\nHost: t\r\n\r\n";
        let out = scanned(raw, &[]);
        assert_eq!(&out[..], &b"GET /b/k\x7f/../x HTTP/1.1\r\nHost: t\r\n\r\n"[..]);
        let mut scanner = TargetScanner::default();
        scanner.scan(&mut raw.to_vec());
        assert!(scanner.is_off());
        // `#` elsewhere in a head is no target.
        let raw = b"GET /b/k HTTP/1.1\r\nHost: t\r\nX-A: #\r\n\r\n";
        assert_eq!(scanned(raw, &[]), raw);
    }

    #[test]
    fn bodies_are_never_changed_and_later_targets_are_still_found() {
        let second = b"DELETE /b/z#x HTTP/1.1\r\nHost: t\r\n\r\n";
        for first in [put("/b/ok", BODY_WITH_REQUEST_LINES), chunked("/b/ok", BODY_WITH_REQUEST_LINES)] {
            let mut stream = b"\r\n".to_vec();
            stream.extend_from_slice(&first);
            stream.extend_from_slice(&put("/b/ok2", b""));
            stream.extend_from_slice(second);
            let out = scanned(&stream, &[]);
            assert_eq!(&out[..stream.len() - second.len()], &stream[..stream.len() - second.len()]);
            assert_eq!(&out[stream.len() - second.len()..], &b"DELETE /b/z\x7fx HTTP/1.1\r\nHost: t\r\n\r\n"[..]);
        }
    }

    #[test]
    fn framing_it_cannot_follow_stops_scanning() {
        for head in [
            &b"PUT /b/k HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
            b"PUT /b/k HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
            b"PUT /b/k HTTP/1.1\r\nContent-Length: x\r\n\r\n",
            b"PUT /b/k HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"PUT /b/k HTTP/1.1\r\nBad Header\r\n\r\n",
            b"GET /b/k\r\n",
        ] {
            let mut scanner = TargetScanner::default();
            scanner.scan(&mut head.to_vec());
            assert!(scanner.is_off(), "{:?}", String::from_utf8_lossy(head));
        }
        let mut scanner = TargetScanner::default();
        scanner.scan(&mut b"PUT /b/k HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc".to_vec());
        assert!(!scanner.is_off());
    }

    proptest! {
        /// However the stream is cut into reads, bodies (full of `#` and request lines) come through unchanged,
        /// and the one request whose target has a `#` is neutralised.
        #[test]
        fn any_split_gives_the_same_result(
            bodies in proptest::collection::vec(proptest::collection::vec(
                prop_oneof![Just(b'#'), Just(b'\r'), Just(b'\n'), Just(b' '), any::<u8>()], 0..60), 1..4),
            use_chunked in proptest::collection::vec(any::<bool>(), 4),
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let mut stream = Vec::new();
            for (i, body) in bodies.iter().enumerate() {
                let target = format!("/b/k{i}");
                stream.extend(if use_chunked[i] { chunked(&target, body) } else { put(&target, body) });
            }
            let clean = stream.len();
            stream.extend_from_slice(b"GET /b/#k HTTP/1.1\r\nHost: t\r\n\r\n");
            let out = scanned(&stream, &cuts);
            prop_assert_eq!(&out[..clean], &stream[..clean]);
            prop_assert_eq!(&out[clean..], &b"GET /b/\x7fk HTTP/1.1\r\nHost: t\r\n\r\n"[..]);
        }
    }
}
