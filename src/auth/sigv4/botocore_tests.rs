//! botocore's own signers against our verifier: `tests/sigv4/botocore_vectors.py` makes signed requests with
//! boto3 (captured before sending), `generate_presigned_url` and `S3SigV4Auth`/`S3SigV4QueryAuth`, each with
//! botocore's Python signer and with the AWS CRT's (aws-cli v2's); every one must
//! verify, and flipping any character of its signature, or changing any signed part, must be refused. Nothing here
//! signs with our own code. python3 with boto3, and awscrt in `target/botocore-crt`, are required (scripts/test
//! installs them): without them this fails, naming what is missing.

use std::process::Command;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::checksum::{ChecksumAlgorithm, Checksummer};
use super::chunked::ChunkedDecoder;
use super::{PayloadHash, RequestParts, SigV4Error, SigningKeyCache, Verified, parse};

#[derive(Deserialize)]
struct Vectors {
    now: i64,
    region: String,
    cases: Vec<Case>,
}

#[derive(Deserialize, Clone, Debug)]
struct Case {
    name: String,
    secret: String,
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
    body_b64: Option<String>,
    data_sha256: Option<String>,
    /// `[trailer header name, null]` for an aws-chunked upload with a checksum trailer.
    checksum: Option<(String, Option<String>)>,
}

fn vectors() -> Vectors {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sigv4/botocore_vectors.py");
    // botocore's optional CRT (CRC32C, CRC64NVME, the CRT signer) lives here only, so that no other boto3 user
    // changes signer: scripts/test installs it.
    let crt = concat!(env!("CARGO_MANIFEST_DIR"), "/target/botocore-crt");
    let python_path = match std::env::var("PYTHONPATH") {
        Ok(path) if !path.is_empty() => format!("{crt}:{path}"),
        _ => crt.to_owned(),
    };
    let output = Command::new("python3").arg(script).env("PYTHONPATH", python_path).output().unwrap_or_else(|e| {
        panic!("python3 is needed to run botocore's SigV4 signer (scripts/test installs python3 and boto3): {e}")
    });
    assert!(
        output.status.success(),
        "the botocore signer failed; boto3 and awscrt (in target/botocore-crt) must be installed, as scripts/test \
         does:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the script prints one JSON document")
}

/// A request as it would arrive: what the verifier sees.
#[derive(Clone)]
struct Wire {
    method: String,
    path: String,
    query: Option<String>,
    headers: Vec<(String, String)>,
}

impl Wire {
    fn of(case: &Case) -> Self {
        Wire {
            method: case.method.clone(),
            path: case.path.clone(),
            query: case.query.clone(),
            headers: case.headers.clone(),
        }
    }

    fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes()).expect("botocore sends valid header names");
            map.append(name, HeaderValue::from_bytes(value.as_bytes()).expect("and valid values"));
        }
        map
    }

    fn verify(&self, secret: &[u8], region: &str, now: i64, keys: &SigningKeyCache) -> Result<Verified, SigV4Error> {
        let headers = self.header_map();
        let request =
            RequestParts { method: &self.method, path: &self.path, query: self.query.as_deref(), headers: &headers };
        let auth = parse(&request, region, now)?.ok_or(SigV4Error::AccessDenied("not a SigV4 request"))?;
        auth.verify(&request, secret, keys)
    }

    /// Where the signature is: (header index or none for the query, byte offset, 64 bytes long).
    fn signature_position(&self) -> (Option<usize>, usize) {
        for (i, (name, value)) in self.headers.iter().enumerate() {
            if name.eq_ignore_ascii_case("authorization") {
                return (Some(i), value.find("Signature=").expect("a signature") + "Signature=".len());
            }
        }
        let query = self.query.as_deref().expect("a presigned query");
        (None, query.find("X-Amz-Signature=").expect("a presign signature") + "X-Amz-Signature=".len())
    }

    fn signature(&self) -> String {
        let (header, start) = self.signature_position();
        let text = match header {
            Some(i) => &self.headers[i].1,
            None => self.query.as_ref().expect("a query"),
        };
        text[start..start + 64].to_owned()
    }

    fn with_signature_char(&self, at: usize, c: char) -> Self {
        let mut w = self.clone();
        let (header, start) = self.signature_position();
        let text = match header {
            Some(i) => &mut w.headers[i].1,
            None => w.query.as_mut().expect("a query"),
        };
        text.replace_range(start + at..start + at + 1, &c.to_string());
        w
    }

    fn signed_headers(&self) -> Vec<String> {
        if let Some((_, value)) = self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("authorization")) {
            let list = value.split("SignedHeaders=").nth(1).expect("a list").split(',').next().expect("a value");
            return list.split(';').map(str::to_owned).collect();
        }
        let query = self.query.as_deref().expect("a presign");
        let list = query.split("X-Amz-SignedHeaders=").nth(1).expect("a list").split('&').next().expect("a value");
        list.replace("%3B", ";").split(';').map(str::to_owned).collect()
    }

    /// Every request that differs from this one in one signed part.
    fn tampered(&self) -> Vec<(String, Wire)> {
        let mut out = Vec::new();
        for method in ["GET", "PUT", "POST", "HEAD", "DELETE"].into_iter().filter(|m| *m != self.method) {
            out.push((format!("method {method}"), Wire { method: method.into(), ..self.clone() }));
        }
        out.push(("path + x".into(), Wire { path: format!("{}x", self.path), ..self.clone() }));
        if self.path.len() > 1 {
            let mut path = self.path.clone();
            let last = if path.ends_with('a') { "b" } else { "a" };
            path.replace_range(path.len() - 1.., last);
            out.push((format!("path {path}"), Wire { path, ..self.clone() }));
        }
        let pieces: Vec<String> = self.query.as_deref().unwrap_or("").split('&').map(str::to_owned).collect();
        for (i, piece) in pieces.iter().enumerate() {
            if piece.is_empty() || piece.starts_with("X-Amz-Signature=") {
                continue;
            }
            for change in [Some(format!("{piece}x")), None] {
                let mut changed = pieces.clone();
                let label = match change {
                    Some(c) => {
                        changed[i] = c;
                        format!("query {piece} + x")
                    }
                    None => {
                        changed.remove(i);
                        format!("query without {piece}")
                    }
                };
                out.push((label, Wire { query: Some(changed.join("&")), ..self.clone() }));
            }
        }
        let added = match &self.query {
            Some(q) => format!("{q}&extra=1"),
            None => "extra=1".into(),
        };
        out.push(("query + extra=1".into(), Wire { query: Some(added), ..self.clone() }));
        for signed in self.signed_headers() {
            let Some(i) = self.headers.iter().position(|(n, _)| n.eq_ignore_ascii_case(&signed)) else {
                panic!("{signed} is signed but not sent")
            };
            let mut changed = self.clone();
            changed.headers[i].1.push('x');
            out.push((format!("header {signed} + x"), changed));
            let mut removed = self.clone();
            removed.headers.remove(i);
            out.push((format!("without header {signed}"), removed));
        }
        let mut unsigned = self.clone();
        unsigned.headers.push(("x-amz-meta-added".into(), "1".into()));
        out.push(("an unsigned x-amz header".into(), unsigned));
        out
    }
}

fn decode(decoder: &mut ChunkedDecoder, body: &[u8], feed: usize) -> Result<Vec<u8>, SigV4Error> {
    let mut out = Vec::new();
    for piece in body.chunks(feed.max(1)) {
        decoder.feed_all(piece, |d| out.extend_from_slice(d))?;
    }
    decoder.finish()?;
    Ok(out)
}

#[test]
fn botocore_signed_requests_verify_and_every_change_is_refused() {
    let vectors = vectors();
    assert!(vectors.cases.len() > 300, "{} cases", vectors.cases.len());
    for implementation in ["[python]", "[crt]"] {
        assert!(vectors.cases.iter().any(|c| c.name.starts_with(implementation)), "{implementation}");
    }
    let keys = SigningKeyCache::new(16);
    let (mut flips, mut changes, mut chunked) = (0, 0, 0);
    for case in &vectors.cases {
        let wire = Wire::of(case);
        let secret = case.secret.as_bytes();
        let verify = |w: &Wire| w.verify(secret, &vectors.region, vectors.now, &keys);
        let verified =
            verify(&wire).unwrap_or_else(|e| panic!("{}: botocore's signature is refused: {e:?}", case.name));
        assert!(
            wire.verify(b"another secret", &vectors.region, vectors.now, &keys).is_err(),
            "{}: a wrong secret",
            case.name
        );

        // Every position, to another hex digit and to its uppercase spelling (one spelling per signature); the
        // first case also to every hex digit.
        let signature = wire.signature();
        for (at, old) in signature.char_indices() {
            let mut replacements =
                vec![if old == 'f' { '0' } else { char::from_digit(old.to_digit(16).unwrap() + 1, 16).unwrap() }];
            replacements.extend(old.is_ascii_lowercase().then(|| old.to_ascii_uppercase()));
            if flips < 64 * 16 {
                replacements.extend("0123456789abcdef".chars().filter(|&c| c != old));
            }
            for c in replacements {
                let flipped = wire.with_signature_char(at, c);
                assert!(verify(&flipped).is_err(), "{}: signature char {at} -> {c} accepted", case.name);
                flips += 1;
            }
        }
        for (label, tampered) in wire.tampered() {
            assert!(verify(&tampered).is_err(), "{}: {label} accepted", case.name);
            changes += 1;
        }

        let body = case.body_b64.as_ref().map(|b| STANDARD.decode(b).expect("base64")).unwrap_or_default();
        match verified.payload {
            PayloadHash::Sha256(signed) => assert_eq!(signed, <[u8; 32]>::from(Sha256::digest(&body)), "{}", case.name),
            PayloadHash::Unsigned => {}
            PayloadHash::StreamingUnsignedTrailer => {
                chunked += 1;
                check_chunked(case, &wire, &verified, &body);
            }
            other => panic!("{}: botocore sent {other:?}", case.name),
        }
        // A checksum botocore sent as a header (DeleteObjects) is botocore's CRC32 of the body: ours must agree.
        for algorithm in ChecksumAlgorithm::ALL {
            if let Some((_, value)) = case.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(algorithm.header_name()))
            {
                let mut ours = Checksummer::new(algorithm);
                ours.update(&body);
                assert_eq!(&ours.finish().base64, value, "{}", case.name);
            }
        }
    }
    assert!(flips > 64 * 300 && changes > 3000 && chunked > 60, "{flips} flips, {changes} changes, {chunked} chunked");
}

/// An aws-chunked body from botocore decodes (in any feed size) to the data it sent, with its checksum; a changed
/// byte, a changed checksum and a truncated body are refused.
fn check_chunked(case: &Case, wire: &Wire, verified: &Verified, body: &[u8]) {
    let headers = wire.header_map();
    let new_decoder = || ChunkedDecoder::for_request(verified, &headers).expect("headers").expect("streaming");
    let want_sha256 = case.data_sha256.as_deref().unwrap_or_else(|| panic!("{}: the data's digest", case.name));
    for feed in [1, 7, 4096, body.len()] {
        // Tiny feeds of a large body cost seconds in a debug build and find nothing the small bodies do not.
        if feed < 100 && body.len() > 100_000 {
            continue;
        }
        let data =
            decode(&mut new_decoder(), body, feed).unwrap_or_else(|e| panic!("{} (feed {feed}): {e:?}", case.name));
        assert_eq!(hex::encode(Sha256::digest(&data)), want_sha256, "{} (feed {feed})", case.name);
    }
    let mut decoder = new_decoder();
    decode(&mut decoder, body, body.len()).expect("decodes");
    let (trailer, _) = case.checksum.as_ref().expect("botocore always sends a checksum trailer");
    let needle = format!("{trailer}:");
    let at = memchr::memmem::rfind(body, needle.as_bytes()).expect("the trailer is in the body") + needle.len();

    let data_len: usize = headers["x-amz-decoded-content-length"].to_str().unwrap().parse().unwrap();
    if data_len > 0 {
        let mut changed = body.to_vec();
        let first_data = body.iter().position(|&b| b == b'\n').expect("a chunk header") + 1;
        changed[first_data] ^= 1;
        let err = decode(&mut new_decoder(), &changed, changed.len()).unwrap_err();
        assert_eq!(err.code(), "BadDigest", "{}", case.name);
    }
    let mut changed = body.to_vec();
    changed[at] = if changed[at] == b'A' { b'B' } else { b'A' };
    let err = decode(&mut new_decoder(), &changed, changed.len()).unwrap_err();
    assert!(matches!(err.code(), "BadDigest" | "InvalidRequest"), "{}: {err:?}", case.name);
    for cut in [1, body.len() / 2, body.len() - at + 2] {
        let truncated = &body[..body.len().saturating_sub(cut).max(1)];
        assert!(decode(&mut new_decoder(), truncated, truncated.len()).is_err(), "{}: cut {cut}", case.name);
    }
}
