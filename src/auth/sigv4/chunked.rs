//! `Content-Encoding: aws-chunked` bodies, decoded incrementally: feed byte slices as they arrive, get the object
//! bytes back as sub-slices of what was fed (never copied, never buffered whole), and a verdict at the end.
//!
//! ```text
//! signed:    <hex size>;chunk-signature=<sig>\r\n<data>\r\n … 0;chunk-signature=<sig>\r\n[<trailer>]\r\n
//! unsigned:  <hex size>\r\n<data>\r\n … 0\r\n<trailer>\r\n
//! trailer:   x-amz-checksum-crc32:<base64>\r\n [x-amz-trailer-signature:<sig>\r\n]
//! ```
//!
//! Chunk signatures chain from the request's seed signature: each is the HMAC, under the request's signing key,
//! of `AWS4-HMAC-SHA256-PAYLOAD\n<timestamp>\n<scope>\n<previous signature>\n<SHA-256 of "">\n<SHA-256 of the
//! chunk>`; the trailer's is that of `AWS4-HMAC-SHA256-TRAILER\n<timestamp>\n<scope>\n<last chunk
//! signature>\n<SHA-256 of the trailer lines>`.
//!
//! **Data is yielded before its chunk is verified** (a chunk's signature covers all of its bytes, which are not
//! held back). The caller stages what it gets and makes it visible only when [`ChunkedDecoder::finish`] returns
//! a [`Verdict`]; any error means the whole body is discarded.
//!
//! Memory is bounded: a chunk header or trailer line longer than [`MAX_LINE`] bytes, or more than
//! [`MAX_TRAILER_LINES`] trailer lines, is refused.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::checksum::{Checksum, ChecksumAlgorithm, Checksummer};
use super::{PayloadHash, SigV4Error, StreamingSeed, Verified};

/// The longest chunk header or trailer line accepted, CRLF excluded. A signed chunk header is under 100 bytes.
pub const MAX_LINE: usize = 1024;
/// The most trailer lines accepted (a checksum and a signature are sent).
pub const MAX_TRAILER_LINES: usize = 8;
pub const DECODED_LENGTH_HEADER: &str = "x-amz-decoded-content-length";
pub const TRAILER_HEADER: &str = "x-amz-trailer";
pub const TRAILER_SIGNATURE: &str = "x-amz-trailer-signature";

const CHUNK_ALGORITHM: &str = "AWS4-HMAC-SHA256-PAYLOAD";
const TRAILER_ALGORITHM: &str = "AWS4-HMAC-SHA256-TRAILER";
/// SHA-256 of the empty string, in hex.
const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Which aws-chunked form a body has, with what its signatures need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framing {
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`: signed chunks, no trailer.
    Signed(StreamingSeed),
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER`: signed chunks and a signed trailer.
    SignedTrailer(StreamingSeed),
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER`: plain chunks and an unsigned trailer.
    UnsignedTrailer,
}

impl Framing {
    fn seed(&self) -> Option<&StreamingSeed> {
        match self {
            Framing::Signed(seed) | Framing::SignedTrailer(seed) => Some(seed),
            Framing::UnsignedTrailer => None,
        }
    }

    fn has_trailer(&self) -> bool {
        !matches!(self, Framing::Signed(_))
    }
}

/// What one [`ChunkedDecoder::feed`] did: it used the first `consumed` bytes of the input, and `data` (a
/// sub-slice of them, possibly empty) is object bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step<'a> {
    pub consumed: usize,
    pub data: &'a [u8],
}

/// A body that decoded and verified completely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Equal to `x-amz-decoded-content-length`.
    pub decoded_length: u64,
    /// The checksum that was presented (trailer or header) and matched, so the store may keep it.
    pub checksum: Option<Checksum>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a chunk header line into `line`.
    ChunkHeader,
    /// Passing chunk data through.
    Data { remaining: u64 },
    /// The CRLF after a chunk's data; `seen` of its two bytes so far.
    DataEnd { seen: u8 },
    /// After the final (empty) chunk's header: trailer lines until an empty line.
    Trailer,
    /// The empty line after the trailer was read: the body is complete.
    Done,
    /// A feed or `finish` failed: the body is refused, and stays refused.
    Failed,
}

/// The incremental aws-chunked decoder (see the module doc).
pub struct ChunkedDecoder {
    framing: Framing,
    decoded_length: u64,
    state: State,
    /// The partial header or trailer line, bounded by `MAX_LINE`.
    line: Vec<u8>,
    /// Object bytes yielded so far.
    decoded: u64,
    /// The signature the next chunk (or the trailer) chains from.
    previous_signature: [u8; 32],
    /// The signature the current chunk's header presented.
    chunk_signature: [u8; 32],
    /// SHA-256 of the current chunk's data (signed forms only).
    chunk_hash: Option<Sha256>,
    /// The trailer checksum `x-amz-trailer` announced, or a header checksum to check at the end.
    expected: Expected,
    checksummer: Option<Checksummer>,
    /// Trailer lines as received (except the signature), for the trailer signature.
    trailer_lines: Vec<(String, String)>,
    trailer_signature_seen: bool,
    /// Whether an empty line came straight after the final chunk, before any trailer line (some SDKs send one).
    blank_before_trailer: bool,
}

/// Which checksum the body must carry, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    None,
    /// Announced by `x-amz-trailer`; the value comes in the trailer.
    Trailer(ChecksumAlgorithm),
    /// Sent as a request header (`x-amz-checksum-*`).
    Header(Checksum),
}

impl ChunkedDecoder {
    /// A decoder for `framing`, expecting exactly `decoded_length` object bytes and, when `trailer` names one,
    /// that checksum in the trailer.
    pub fn new(framing: Framing, decoded_length: u64, trailer: Option<ChecksumAlgorithm>) -> Result<Self, SigV4Error> {
        if trailer.is_some() && !framing.has_trailer() {
            return Err(SigV4Error::InvalidRequest(
                "x-amz-trailer needs a STREAMING-*-TRAILER x-amz-content-sha256".into(),
            ));
        }
        let expected = trailer.map_or(Expected::None, Expected::Trailer);
        Ok(Self::build(framing, decoded_length, expected))
    }

    /// Like [`Self::new`], but checks the body against a checksum sent as a request header instead.
    pub fn with_header_checksum(framing: Framing, decoded_length: u64, checksum: Checksum) -> Self {
        Self::build(framing, decoded_length, Expected::Header(checksum))
    }

    fn build(framing: Framing, decoded_length: u64, expected: Expected) -> Self {
        let checksummer = match &expected {
            Expected::None => None,
            Expected::Trailer(algorithm) => Some(Checksummer::new(*algorithm)),
            Expected::Header(checksum) => Some(Checksummer::new(checksum.algorithm)),
        };
        let previous_signature = framing.seed().map_or([0; 32], |s| s.seed_signature);
        let chunk_hash = framing.seed().map(|_| Sha256::new());
        ChunkedDecoder {
            framing,
            decoded_length,
            state: State::ChunkHeader,
            line: Vec::new(),
            decoded: 0,
            previous_signature,
            chunk_signature: [0; 32],
            chunk_hash,
            expected,
            checksummer,
            trailer_lines: Vec::new(),
            trailer_signature_seen: false,
            blank_before_trailer: false,
        }
    }

    /// The decoder a verified streaming request needs, from its headers: `x-amz-decoded-content-length`
    /// (required), `x-amz-trailer` (the trailing checksum), or an `x-amz-checksum-*` header. `Ok(None)` when
    /// the payload is not one of the streaming forms.
    pub fn for_request(verified: &Verified, headers: &HeaderMap) -> Result<Option<Self>, SigV4Error> {
        let framing = match (verified.payload, &verified.streaming) {
            (PayloadHash::StreamingSigned, Some(seed)) => Framing::Signed(seed.clone()),
            (PayloadHash::StreamingSignedTrailer, Some(seed)) => Framing::SignedTrailer(seed.clone()),
            (PayloadHash::StreamingUnsignedTrailer, _) => Framing::UnsignedTrailer,
            (PayloadHash::StreamingSigned | PayloadHash::StreamingSignedTrailer, None) => {
                return Err(SigV4Error::InvalidRequest(
                    "a signed streaming payload needs header authentication".into(),
                ));
            }
            _ => return Ok(None),
        };
        let decoded_length = decoded_content_length(headers)?;
        let trailer = trailer_algorithm(headers)?;
        let header_checksum = header_checksum(headers)?;
        match (trailer, header_checksum) {
            (Some(_), Some(_)) => {
                Err(SigV4Error::InvalidRequest("send a checksum either as a header or in the trailer, not both".into()))
            }
            (None, Some(checksum)) => Ok(Some(Self::with_header_checksum(framing, decoded_length, checksum))),
            (trailer, None) => Self::new(framing, decoded_length, trailer).map(Some),
        }
    }

    /// Decodes a prefix of `input`. Every call with a non-empty input consumes at least one byte or fails;
    /// call it again with the rest (see [`Self::feed_all`]).
    pub fn feed<'a>(&mut self, input: &'a [u8]) -> Result<Step<'a>, SigV4Error> {
        let step = self.decode(input);
        if step.is_err() {
            self.state = State::Failed;
        }
        step
    }

    fn decode<'a>(&mut self, input: &'a [u8]) -> Result<Step<'a>, SigV4Error> {
        if self.state == State::Failed {
            return Err(refused());
        }
        let mut consumed = 0;
        while consumed < input.len() {
            let rest = &input[consumed..];
            match self.state {
                State::Data { remaining } => {
                    let n = usize::try_from(remaining).unwrap_or(usize::MAX).min(rest.len());
                    let data = &rest[..n];
                    self.take_data(data)?;
                    return Ok(Step { consumed: consumed + n, data });
                }
                State::DataEnd { seen } => {
                    let expected = b"\r\n"[usize::from(seen)];
                    if rest[0] != expected {
                        return Err(malformed("a chunk's data is not followed by CRLF"));
                    }
                    consumed += 1;
                    self.state = if seen == 0 { State::DataEnd { seen: 1 } } else { State::ChunkHeader };
                }
                State::ChunkHeader | State::Trailer => {
                    let (used, complete) = self.take_line(rest)?;
                    consumed += used;
                    if complete {
                        let line = std::mem::take(&mut self.line);
                        if self.state == State::ChunkHeader {
                            self.chunk_header(&line)?;
                        } else {
                            self.trailer_line(&line)?;
                        }
                        self.line = line;
                        self.line.clear();
                    }
                }
                State::Done => return Err(malformed("data after the end of the aws-chunked body")),
                State::Failed => return Err(refused()),
            }
        }
        Ok(Step { consumed, data: &[] })
    }

    /// Feeds all of `input`, handing each piece of object data to `sink` in order.
    pub fn feed_all(&mut self, mut input: &[u8], mut sink: impl FnMut(&[u8])) -> Result<(), SigV4Error> {
        while !input.is_empty() {
            let step = self.feed(input)?;
            if !step.data.is_empty() {
                sink(step.data);
            }
            input = &input[step.consumed..];
        }
        Ok(())
    }

    /// Whether the whole body (final chunk and trailer) has been read.
    pub fn is_complete(&self) -> bool {
        self.state == State::Done
    }

    /// The verdict once the input has ended: the body must be complete, of `x-amz-decoded-content-length`
    /// bytes, and its checksum must match.
    pub fn finish(&mut self) -> Result<Verdict, SigV4Error> {
        let verdict = self.verdict();
        if verdict.is_err() {
            self.state = State::Failed;
        }
        verdict
    }

    fn verdict(&mut self) -> Result<Verdict, SigV4Error> {
        if self.state == State::Failed {
            return Err(refused());
        }
        // Some clients end the body right after the trailer lines, without the empty line (or even without the
        // last CRLF).
        if self.state == State::Trailer {
            if !self.line.is_empty() {
                let line = std::mem::take(&mut self.line);
                if line.ends_with(b"\r") {
                    return Err(malformed("an aws-chunked line does not end with CRLF"));
                }
                self.trailer_line(&line)?;
            }
            let started = self.blank_before_trailer || self.trailer_signature_seen || !self.trailer_lines.is_empty();
            if self.state == State::Trailer && started {
                self.end_of_trailer()?;
            }
        }
        if self.state != State::Done {
            return Err(SigV4Error::IncompleteBody);
        }
        if self.decoded != self.decoded_length {
            return Err(SigV4Error::IncompleteBody);
        }
        let presented = match &self.expected {
            Expected::None => return Ok(Verdict { decoded_length: self.decoded, checksum: None }),
            Expected::Header(checksum) => checksum.clone(),
            Expected::Trailer(algorithm) => {
                let name = algorithm.header_name();
                let value = self.trailer_lines.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
                let value = value.ok_or_else(|| malformed(format!("the trailer has no {name}")))?;
                Checksum::parse(*algorithm, value)
                    .ok_or_else(|| malformed(format!("{name} is not a base64 {} value", algorithm.name())))?
            }
        };
        // A clone, so that `finish` may be asked again and answers the same.
        let computed = self.checksummer.clone().expect("a checksummer for every expected checksum").finish();
        if computed != presented {
            return Err(SigV4Error::BadDigest(presented.algorithm.name()));
        }
        Ok(Verdict { decoded_length: self.decoded, checksum: Some(presented) })
    }

    fn take_data(&mut self, data: &[u8]) -> Result<(), SigV4Error> {
        if let Some(hash) = &mut self.chunk_hash {
            hash.update(data);
        }
        if let Some(checksummer) = &mut self.checksummer {
            checksummer.update(data);
        }
        self.decoded += data.len() as u64;
        let State::Data { remaining } = self.state else { unreachable!("take_data only in the data state") };
        let remaining = remaining - data.len() as u64;
        self.state = State::Data { remaining };
        if remaining == 0 {
            let digest = self.chunk_hash.as_mut().map(|hash| std::mem::take(hash).finalize());
            if let Some(digest) = digest {
                self.check_chunk_signature(&hex::encode(digest))?;
            }
            self.state = State::DataEnd { seen: 0 };
        }
        Ok(())
    }

    /// Moves bytes of a CRLF-terminated line into `self.line`: how many were used, and whether the line ended.
    fn take_line(&mut self, input: &[u8]) -> Result<(usize, bool), SigV4Error> {
        let room = MAX_LINE + 2 - self.line.len();
        let window = &input[..input.len().min(room)];
        let (used, complete) = match memchr::memchr(b'\n', window) {
            Some(at) => (at + 1, true),
            None => (window.len(), false),
        };
        self.line.extend_from_slice(&window[..used]);
        if complete {
            if self.line.len() < 2 || self.line[self.line.len() - 2] != b'\r' {
                return Err(malformed("an aws-chunked line does not end with CRLF"));
            }
            self.line.truncate(self.line.len() - 2);
        } else if self.line.len() >= MAX_LINE + 2 {
            return Err(malformed("an aws-chunked header or trailer line is too long"));
        }
        Ok((used, complete))
    }

    fn chunk_header(&mut self, line: &[u8]) -> Result<(), SigV4Error> {
        let line = std::str::from_utf8(line).map_err(|_| malformed("a chunk header is not ASCII"))?;
        let (size, extension) = match line.split_once(';') {
            Some((size, extension)) => (size, Some(extension)),
            None => (line, None),
        };
        let size = parse_chunk_size(size)?;
        match (self.framing.seed(), extension) {
            (Some(_), Some(extension)) => {
                let signature = extension
                    .strip_prefix("chunk-signature=")
                    .and_then(parse_signature)
                    .ok_or_else(|| malformed("a chunk header has no valid chunk-signature"))?;
                self.chunk_signature = signature;
            }
            (Some(_), None) => return Err(malformed("a signed chunk has no chunk-signature")),
            (None, Some(_)) => return Err(malformed("an unsigned chunk carries an extension")),
            (None, None) => {}
        }
        if size > self.decoded_length - self.decoded {
            return Err(malformed("the chunks hold more than x-amz-decoded-content-length bytes"));
        }
        if size > 0 {
            self.state = State::Data { remaining: size };
            return Ok(());
        }
        // The final chunk: its (empty) data is signed like any other.
        if self.framing.seed().is_some() {
            self.check_chunk_signature(EMPTY_SHA256)?;
        }
        self.state = State::Trailer;
        Ok(())
    }

    fn check_chunk_signature(&mut self, data_sha256_hex: &str) -> Result<(), SigV4Error> {
        let seed = self.framing.seed().expect("only signed framings check chunk signatures");
        let string_to_sign = format!(
            "{CHUNK_ALGORITHM}\n{}\n{}\n{}\n{EMPTY_SHA256}\n{data_sha256_hex}",
            seed.timestamp,
            seed.scope,
            hex::encode(self.previous_signature)
        );
        let expected = seed.signing_key.sign(string_to_sign.as_bytes());
        if !super::ct_eq(&expected, &self.chunk_signature) {
            return Err(SigV4Error::SignatureDoesNotMatch);
        }
        self.previous_signature = expected;
        Ok(())
    }

    fn trailer_line(&mut self, line: &[u8]) -> Result<(), SigV4Error> {
        let nothing_yet = self.trailer_lines.is_empty() && !self.trailer_signature_seen && !self.blank_before_trailer;
        if line.is_empty() && self.framing.has_trailer() && nothing_yet {
            self.blank_before_trailer = true;
            return Ok(());
        }
        if line.is_empty() {
            return self.end_of_trailer();
        }
        if !self.framing.has_trailer() {
            return Err(malformed("the final chunk is not followed by an empty line"));
        }
        if self.trailer_signature_seen {
            return Err(malformed("a trailer line follows the trailer signature"));
        }
        if self.trailer_lines.len() >= MAX_TRAILER_LINES {
            return Err(malformed("too many trailer lines"));
        }
        let line = std::str::from_utf8(line).map_err(|_| malformed("a trailer line is not ASCII"))?;
        let (name, value) = line.split_once(':').ok_or_else(|| malformed("a trailer line has no ':'"))?;
        let name = name.trim().to_ascii_lowercase();
        let value = value.trim();
        if name == TRAILER_SIGNATURE {
            let Some(seed) = self.framing.seed() else {
                return Err(malformed("an unsigned trailer carries a signature"));
            };
            let presented = parse_signature(value).ok_or_else(|| malformed("x-amz-trailer-signature is not hex"))?;
            let mut canonical = String::new();
            for (name, value) in &self.trailer_lines {
                canonical.push_str(&format!("{name}:{value}\n"));
            }
            let string_to_sign = format!(
                "{TRAILER_ALGORITHM}\n{}\n{}\n{}\n{}",
                seed.timestamp,
                seed.scope,
                hex::encode(self.previous_signature),
                hex::encode(Sha256::digest(canonical.as_bytes()))
            );
            let expected = seed.signing_key.sign(string_to_sign.as_bytes());
            if !super::ct_eq(&expected, &presented) {
                return Err(SigV4Error::SignatureDoesNotMatch);
            }
            self.trailer_signature_seen = true;
            return Ok(());
        }
        let announced = matches!(&self.expected, Expected::Trailer(a) if a.header_name() == name);
        if !announced {
            return Err(malformed(format!("the trailer carries {name}, which x-amz-trailer did not announce")));
        }
        if self.trailer_lines.iter().any(|(n, _)| *n == name) {
            return Err(malformed(format!("the trailer repeats {name}")));
        }
        self.trailer_lines.push((name, value.to_owned()));
        Ok(())
    }

    fn end_of_trailer(&mut self) -> Result<(), SigV4Error> {
        if matches!(self.framing, Framing::SignedTrailer(_)) && !self.trailer_signature_seen {
            return Err(malformed("the trailer has no x-amz-trailer-signature"));
        }
        self.state = State::Done;
        Ok(())
    }
}

/// What a decoder answers once it has refused the body.
fn refused() -> SigV4Error {
    malformed("the aws-chunked body was already refused")
}

fn malformed(message: impl Into<String>) -> SigV4Error {
    SigV4Error::InvalidRequest(message.into())
}

/// A chunk size: 1 to 16 hex digits.
fn parse_chunk_size(text: &str) -> Result<u64, SigV4Error> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(malformed("a chunk size is not a hex number"));
    }
    u64::from_str_radix(text, 16).map_err(|_| malformed("a chunk size is not a hex number"))
}

/// 64 lowercase hex digits (one spelling per signature).
fn parse_signature(text: &str) -> Option<[u8; 32]> {
    let mut signature = [0u8; 32];
    let lowercase_hex = text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    (lowercase_hex && hex::decode_to_slice(text, &mut signature).is_ok()).then_some(signature)
}

/// `x-amz-decoded-content-length`: required on every streaming upload.
pub fn decoded_content_length(headers: &HeaderMap) -> Result<u64, SigV4Error> {
    let value = headers.get(DECODED_LENGTH_HEADER).ok_or_else(|| {
        SigV4Error::MissingSecurityHeader(format!(
            "Your request was missing a required header: {DECODED_LENGTH_HEADER}"
        ))
    })?;
    let text = value.to_str().ok().filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()));
    text.and_then(|t| t.parse().ok())
        .ok_or_else(|| SigV4Error::InvalidArgument(format!("{DECODED_LENGTH_HEADER} is not a number")))
}

/// The checksum `x-amz-trailer` announces, if any; another trailer is refused.
pub fn trailer_algorithm(headers: &HeaderMap) -> Result<Option<ChecksumAlgorithm>, SigV4Error> {
    let mut found = None;
    for value in headers.get_all(TRAILER_HEADER) {
        let text = value.to_str().map_err(|_| SigV4Error::InvalidArgument("x-amz-trailer is not ASCII".into()))?;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let algorithm = ChecksumAlgorithm::from_header_name(name).ok_or_else(|| {
                SigV4Error::InvalidArgument(format!("x-amz-trailer names an unknown trailer: {name}"))
            })?;
            if found.replace(algorithm).is_some() {
                return Err(SigV4Error::InvalidArgument("x-amz-trailer names more than one checksum".into()));
            }
        }
    }
    Ok(found)
}

/// The `Content-Encoding` to store for an upload: the request's codings without `aws-chunked` (S3 drops it, as it
/// only describes the transfer), `None` when nothing is left.
pub fn stored_content_encoding(headers: &HeaderMap) -> Option<String> {
    let codings: Vec<&str> = headers
        .get_all(http::header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
        .collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

/// A checksum sent as an `x-amz-checksum-*` request header, if any (at most one).
pub fn header_checksum(headers: &HeaderMap) -> Result<Option<Checksum>, SigV4Error> {
    let mut found = None;
    for algorithm in ChecksumAlgorithm::ALL {
        let Some(value) = headers.get(algorithm.header_name()) else { continue };
        let checksum = value.to_str().ok().and_then(|v| Checksum::parse(algorithm, v)).ok_or_else(|| {
            SigV4Error::InvalidRequest(format!("Value for {} header is invalid.", algorithm.header_name()))
        })?;
        if found.replace(checksum).is_some() {
            return Err(SigV4Error::InvalidRequest("Expecting a single x-amz-checksum- header".into()));
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::auth::sigv4::tests::{CHUNK_SIGNATURES, REGION, SECRET, decode_all, example_chunked_body, headers};
    use crate::auth::sigv4::{AuthKind, SigningKey};

    /// The seed of the documentation's chunked PUT.
    fn example_seed() -> StreamingSeed {
        StreamingSeed {
            seed_signature: hex::decode("4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
                .unwrap()
                .try_into()
                .unwrap(),
            signing_key: SigningKey::derive(SECRET, "20130524", REGION),
            scope: "20130524/us-east-1/s3/aws4_request".into(),
            timestamp: "20130524T000000Z".into(),
        }
    }

    fn crc32(data: &[u8]) -> String {
        let mut c = Checksummer::new(ChecksumAlgorithm::Crc32);
        c.update(data);
        c.finish().base64
    }

    /// An unsigned aws-chunked body (as botocore writes it) of `data` in chunks of `sizes` (cycled).
    fn unsigned_body(data: &[u8], sizes: &[usize], trailer: &str) -> Vec<u8> {
        let mut body = Vec::new();
        let mut rest = data;
        let mut i = 0;
        while !rest.is_empty() {
            let n = sizes[i % sizes.len()].clamp(1, rest.len());
            body.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            body.extend_from_slice(&rest[..n]);
            body.extend_from_slice(b"\r\n");
            rest = &rest[n..];
            i += 1;
        }
        body.extend_from_slice(b"0\r\n");
        body.extend_from_slice(trailer.as_bytes());
        body
    }

    fn unsigned(len: u64) -> ChunkedDecoder {
        ChunkedDecoder::new(Framing::UnsignedTrailer, len, Some(ChecksumAlgorithm::Crc32)).unwrap()
    }

    #[test]
    fn unsigned_trailer_bodies_decode_and_check_their_checksum() {
        let data = b"hello, aws-chunked world";
        let good = format!("x-amz-checksum-crc32:{}\r\n\r\n", crc32(data));
        let mut decoder = unsigned(24);
        let (out, verdict) = decode_all(&mut decoder, &unsigned_body(data, &[5, 100], &good)).unwrap();
        assert_eq!(out, data);
        assert_eq!(decoder.finish(), Ok(verdict.clone()), "asked again, the same verdict");
        let checksum = Checksum { algorithm: ChecksumAlgorithm::Crc32, base64: crc32(data) };
        assert_eq!(verdict, Verdict { decoded_length: 24, checksum: Some(checksum) });

        let cases: Vec<(Vec<u8>, u64, SigV4Error)> = vec![
            (unsigned_body(data, &[5], "x-amz-checksum-crc32:AAAAAA==\r\n\r\n"), 24, SigV4Error::BadDigest("CRC32")),
            (unsigned_body(b"hello, aws-chunked World", &[5], &good), 24, SigV4Error::BadDigest("CRC32")),
            (unsigned_body(data, &[5], "\r\n"), 24, malformed("the trailer has no x-amz-checksum-crc32")),
            (
                unsigned_body(data, &[5], "x-amz-checksum-crc32:????\r\n\r\n"),
                24,
                malformed("x-amz-checksum-crc32 is not a base64 CRC32 value"),
            ),
            (unsigned_body(data, &[5], &good), 25, SigV4Error::IncompleteBody),
            (
                unsigned_body(data, &[5], &good),
                23,
                malformed("the chunks hold more than x-amz-decoded-content-length bytes"),
            ),
            (unsigned_body(data, &[5], &good)[..20].to_vec(), 24, SigV4Error::IncompleteBody),
            (
                unsigned_body(data, &[5], &format!("{good}x")),
                24,
                malformed("data after the end of the aws-chunked body"),
            ),
            (b"5;chunk-signature=00\r\nhello\r\n".to_vec(), 5, malformed("an unsigned chunk carries an extension")),
            (b"zz\r\n".to_vec(), 5, malformed("a chunk size is not a hex number")),
            (b"10000000000000000\r\n".to_vec(), 5, malformed("a chunk size is not a hex number")),
            (b"5\nhello\r\n".to_vec(), 5, malformed("an aws-chunked line does not end with CRLF")),
            (b"5\r\nhelloXY0\r\n".to_vec(), 5, malformed("a chunk's data is not followed by CRLF")),
            (
                unsigned_body(data, &[5], &format!("x-amz-checksum-crc32c:{}\r\n\r\n", crc32(data))),
                24,
                malformed("the trailer carries x-amz-checksum-crc32c, which x-amz-trailer did not announce"),
            ),
            (
                unsigned_body(data, &[5], &good.replace("\r\n\r\n", "\r\nx-amz-trailer-signature:00\r\n\r\n")),
                24,
                malformed("an unsigned trailer carries a signature"),
            ),
        ];
        for (body, len, want) in cases {
            assert_eq!(decode_all(&mut unsigned(len), &body).unwrap_err(), want, "{}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn a_refused_body_stays_refused() {
        let mut decoder = ChunkedDecoder::new(Framing::Signed(example_seed()), 66_560, None).unwrap();
        let mut body = example_chunked_body(CHUNK_SIGNATURES, "\r\n");
        body[100] = b'b';
        assert_eq!(decoder.feed_all(&body, |_| {}), Err(SigV4Error::SignatureDoesNotMatch));
        assert_eq!(decoder.feed(b"0\r\n"), Err(refused()));
        assert_eq!(decoder.finish(), Err(refused()));
        let mut decoder = unsigned(5);
        assert_eq!(decoder.finish(), Err(SigV4Error::IncompleteBody));
        assert_eq!(decoder.feed(b"5\r\n"), Err(refused()));
    }

    #[test]
    fn lines_are_bounded() {
        let mut decoder = unsigned(10);
        let long = vec![b'0'; MAX_LINE + 3];
        let err = decoder.feed_all(&long, |_| {}).unwrap_err();
        assert_eq!(err, malformed("an aws-chunked header or trailer line is too long"));
        assert!(decoder.line.capacity() <= 2 * (MAX_LINE + 2), "{}", decoder.line.capacity());
        // Byte by byte, the same.
        let mut decoder = unsigned(10);
        let err = long.iter().find_map(|b| decoder.feed_all(std::slice::from_ref(b), |_| {}).err()).unwrap();
        assert_eq!(err, malformed("an aws-chunked header or trailer line is too long"));
        let mut decoder = unsigned(0);
        let mut body = b"0\r\n".to_vec();
        for i in 0..MAX_TRAILER_LINES + 1 {
            body.extend_from_slice(format!("x-amz-meta-{i}:1\r\n").as_bytes());
        }
        assert!(decoder.feed_all(&body, |_| {}).is_err());
    }

    #[test]
    fn a_checksum_header_is_checked_like_a_trailer() {
        let data = b"abc";
        let body = unsigned_body(data, &[2], "\r\n");
        let checksum = Checksum { algorithm: ChecksumAlgorithm::Crc32, base64: crc32(data) };
        let mut decoder = ChunkedDecoder::with_header_checksum(Framing::UnsignedTrailer, 3, checksum.clone());
        assert_eq!(decode_all(&mut decoder, &body).unwrap().1.checksum, Some(checksum));
        let wrong = Checksum { algorithm: ChecksumAlgorithm::Crc32, base64: crc32(b"abd") };
        let mut decoder = ChunkedDecoder::with_header_checksum(Framing::UnsignedTrailer, 3, wrong);
        assert_eq!(decode_all(&mut decoder, &body).unwrap_err(), SigV4Error::BadDigest("CRC32"));
        // No checksum at all: only the framing and the length are checked.
        let mut decoder = ChunkedDecoder::new(Framing::UnsignedTrailer, 3, None).unwrap();
        assert_eq!(decode_all(&mut decoder, &body).unwrap().1, Verdict { decoded_length: 3, checksum: None });
        assert!(ChunkedDecoder::new(Framing::Signed(example_seed()), 3, Some(ChecksumAlgorithm::Crc32)).is_err());
    }

    #[test]
    fn decoders_come_from_the_request_headers() {
        let verified = |payload| Verified { kind: AuthKind::Header, payload, streaming: Some(example_seed()) };
        let unsigned_trailer = verified(PayloadHash::StreamingUnsignedTrailer);
        let h = headers(&[("x-amz-decoded-content-length", "3"), ("x-amz-trailer", "x-amz-checksum-crc32")]);
        assert!(ChunkedDecoder::for_request(&unsigned_trailer, &h).unwrap().is_some());
        assert!(ChunkedDecoder::for_request(&verified(PayloadHash::Unsigned), &h).unwrap().is_none());
        let code = |v: &Verified, pairs: &[(&str, &str)]| {
            ChunkedDecoder::for_request(v, &headers(pairs)).err().map(|e| e.code())
        };
        assert_eq!(code(&unsigned_trailer, &[]), Some("MissingSecurityHeader"));
        assert_eq!(code(&unsigned_trailer, &[("x-amz-decoded-content-length", "-1")]), Some("InvalidArgument"));
        assert_eq!(
            code(&unsigned_trailer, &[("x-amz-decoded-content-length", "1"), ("x-amz-trailer", "x-amz-checksum-md5")]),
            Some("InvalidArgument")
        );
        assert_eq!(
            code(
                &unsigned_trailer,
                &[("x-amz-decoded-content-length", "1"), ("x-amz-trailer", "x-amz-checksum-crc32,x-amz-checksum-sha1")]
            ),
            Some("InvalidArgument")
        );
        assert_eq!(
            code(
                &unsigned_trailer,
                &[
                    ("x-amz-decoded-content-length", "1"),
                    ("x-amz-trailer", "x-amz-checksum-crc32"),
                    ("x-amz-checksum-crc32", "AAAAAA==")
                ]
            ),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(&unsigned_trailer, &[("x-amz-decoded-content-length", "1"), ("x-amz-checksum-crc32", "AAAA")]),
            Some("InvalidRequest")
        );
        assert_eq!(
            code(
                &verified(PayloadHash::StreamingSigned),
                &[("x-amz-decoded-content-length", "1"), ("x-amz-trailer", "x-amz-checksum-crc32")]
            ),
            Some("InvalidRequest")
        );
        let presigned = Verified { streaming: None, ..verified(PayloadHash::StreamingSigned) };
        assert_eq!(code(&presigned, &[("x-amz-decoded-content-length", "1")]), Some("InvalidRequest"));
    }

    #[test]
    fn aws_chunked_is_not_a_stored_content_encoding() {
        let encoding = |pairs: &[(&str, &str)]| stored_content_encoding(&headers(pairs));
        assert_eq!(encoding(&[]), None);
        assert_eq!(encoding(&[("content-encoding", "aws-chunked")]), None);
        assert_eq!(encoding(&[("content-encoding", "AWS-Chunked, gzip")]), Some("gzip".into()));
        assert_eq!(encoding(&[("content-encoding", "aws-chunked"), ("content-encoding", "br")]), Some("br".into()));
        assert_eq!(encoding(&[("content-encoding", "gzip")]), Some("gzip".into()));
    }

    #[test]
    fn every_feed_makes_progress() {
        let body = example_chunked_body(CHUNK_SIGNATURES, "\r\n");
        let mut decoder = ChunkedDecoder::new(Framing::Signed(example_seed()), 66_560, None).unwrap();
        let mut rest = &body[..];
        while !rest.is_empty() {
            let step = decoder.feed(rest).unwrap();
            assert!(step.consumed > 0 && step.consumed <= rest.len());
            rest = &rest[step.consumed..];
        }
        assert!(decoder.is_complete());
        assert_eq!(decoder.feed(b"").unwrap(), Step { consumed: 0, data: b"" });
    }

    /// Feeds `body` cut at `cuts` (positions, any order); the decoded bytes and the verdict.
    fn decode_in_pieces(
        mut decoder: ChunkedDecoder,
        body: &[u8],
        cuts: &[usize],
    ) -> Result<(Vec<u8>, Verdict), SigV4Error> {
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        cuts.sort_unstable();
        let mut out = Vec::new();
        let mut from = 0;
        for cut in cuts.into_iter().chain([body.len()]) {
            decoder.feed_all(&body[from..cut], |d| out.extend_from_slice(d))?;
            from = cut;
        }
        Ok((out, decoder.finish()?))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        /// The documentation's signed body gives the same result however it is split into feeds.
        #[test]
        fn any_split_of_a_signed_body_decodes_alike(cuts in proptest::collection::vec(any::<usize>(), 0..12)) {
            let body = example_chunked_body(CHUNK_SIGNATURES, "\r\n");
            let decoder = ChunkedDecoder::new(Framing::Signed(example_seed()), 66_560, None).unwrap();
            let (out, verdict) = decode_in_pieces(decoder, &body, &cuts).unwrap();
            prop_assert_eq!(out, vec![b'a'; 66_560]);
            prop_assert_eq!(verdict.decoded_length, 66_560);
        }

        /// Any data in any chunking, fed in any split: the same data and verdict as in one feed; and a body that
        /// is cut short or has one byte changed is never accepted with other data.
        #[test]
        fn any_split_of_an_unsigned_body_decodes_alike(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            sizes in proptest::collection::vec(1usize..700, 1..5),
            cuts in proptest::collection::vec(any::<usize>(), 0..16),
            flip in any::<usize>(),
        ) {
            let trailer = format!("x-amz-checksum-crc32:{}\r\n\r\n", crc32(&data));
            let body = unsigned_body(&data, &sizes, &trailer);
            let whole = decode_all(&mut unsigned(data.len() as u64), &body).unwrap();
            prop_assert_eq!(&whole.0, &data);
            let split = decode_in_pieces(unsigned(data.len() as u64), &body, &cuts).unwrap();
            prop_assert_eq!(&split, &whole);

            let mut changed = body.clone();
            let at = flip % changed.len();
            changed[at] ^= 0x20;
            if let Ok((out, _)) = decode_in_pieces(unsigned(data.len() as u64), &changed, &cuts) {
                // Only a change the format cannot see (the case of a hex digit or of the trailer's name) may pass.
                prop_assert_eq!(out, data.clone());
            }
            // A cut-short body is refused, except one that lacks only the trailer's closing CRLFs (some clients end
            // the body right after the trailer line, or its CRLF): the checksum was received whole and is checked.
            let cut = flip % body.len();
            let lacks_only_terminators = cut + 4 == body.len() || cut + 2 >= body.len();
            prop_assert!(decode_in_pieces(unsigned(data.len() as u64), &body[..cut], &cuts).is_err() || lacks_only_terminators);
        }
    }
}
