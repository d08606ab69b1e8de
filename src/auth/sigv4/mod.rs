//! AWS Signature Version 4 for S3: the third credential kind, beside bearer tokens and our own signed URLs. Pure:
//! no IO, no clock (callers pass `now`), no lookup.
//!
//! The flow a caller follows:
//! 1. [`parse`] finds SigV4 on a request (`Authorization: AWS4-HMAC-SHA256 …` or the `X-Amz-*` query) and checks
//!    everything that needs no secret: syntax, the credential scope against our region and service `s3`, the
//!    clock skew (±15 minutes), a presign's lifetime (at most 7 days) and expiry. Its [`SigV4Auth`] names the
//!    access key id.
//! 2. The caller authorises what it can before any object lookup and finds the secret of that access key
//!    (an unknown key is its `InvalidAccessKeyId`).
//! 3. [`SigV4Auth::verify`] rebuilds the canonical request, derives the signing key (cached per
//!    (access key, date, region) in a [`SigningKeyCache`]) and compares signatures in constant time. Its
//!    [`Verified`] says what the body is: [`PayloadHash`], and for the streaming forms what
//!    [`chunked::ChunkedDecoder`] needs to check each chunk.
//!
//! Spec: "Authenticating Requests (AWS Signature Version 4)" in the S3 API reference: header auth, query auth,
//! chunked upload (seed and chunk signatures) and trailing headers.

pub mod canonical;
/// The checksum algorithms, below `store` so that objects keep theirs (`header_values::checksum`).
pub use crate::header_values::checksum;
pub mod chunked;

use std::borrow::Cow;
use std::sync::Arc;

use super::ct_eq;
use hmac::{Hmac, Mac};
use http::{HeaderMap, StatusCode};
use quick_cache::Equivalent;
use quick_cache::sync::Cache;
use sha2::{Digest, Sha256};

use canonical::{AmzDate, Sink};

/// The only signing algorithm accepted (SigV4a, `AWS4-ECDSA-P256-SHA256`, is not).
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
/// The service of every credential scope we accept.
pub const SERVICE: &str = "s3";
/// The last element of a credential scope.
pub const TERMINATOR: &str = "aws4_request";
/// How far a header-signed request's `x-amz-date` may be from our clock, either way (S3's 15 minutes).
pub const MAX_CLOCK_SKEW_SECS: i64 = 15 * 60;
/// The longest `X-Amz-Expires` S3 accepts: 7 days.
pub const MAX_PRESIGN_EXPIRES_SECS: i64 = 604_800;

/// `x-amz-content-sha256` values (S3's names).
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
pub const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
pub const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
pub const STREAMING_UNSIGNED_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";

/// Why a SigV4 request (or its aws-chunked body) is refused. Each variant is one S3 error code; [`Self::code`]
/// and [`Self::status`] give what the S3 XML error carries, the `Display` text is its `<Message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigV4Error {
    /// A wrong secret, a tampered field, or a bad chunk or trailer signature (403).
    #[error(
        "The request signature we calculated does not match the signature you provided. Check your key and signing method."
    )]
    SignatureDoesNotMatch,
    /// The `Authorization` header does not parse, or its scope names another region, service or terminator
    /// (400).
    #[error("{0}")]
    AuthorizationHeaderMalformed(String),
    /// The presign query parameters do not parse, are incomplete, or ask for more than 7 days (400).
    #[error("{0}")]
    AuthorizationQueryParametersError(String),
    /// `x-amz-date` is more than 15 minutes from our clock (403).
    #[error("The difference between the request time and the server's time is too large.")]
    RequestTimeTooSkewed,
    /// An expired or not yet valid presign, a missing date, or `x-amz-*` headers sent but not signed (403).
    #[error("{0}")]
    AccessDenied(&'static str),
    /// A header or parameter with a value S3 does not accept, such as a bad `x-amz-content-sha256` (400).
    #[error("{0}")]
    InvalidArgument(String),
    /// A request S3 refuses as a whole: an unsupported algorithm, two kinds of authentication, a malformed
    /// aws-chunked body or trailer (400).
    #[error("{0}")]
    InvalidRequest(String),
    /// A header the request needs is missing, such as `x-amz-decoded-content-length` on a streaming upload (400).
    #[error("{0}")]
    MissingSecurityHeader(String),
    /// The body's SHA-256 is not the signed `x-amz-content-sha256` (400, `XAmzContentSHA256Mismatch`).
    #[error("The provided 'x-amz-content-sha256' header does not match what was computed.")]
    ContentSha256Mismatch,
    /// A trailing (or header) checksum that does not match the data (400); the message names the algorithm.
    #[error("The {0} you specified did not match the calculated checksum.")]
    BadDigest(&'static str),
    /// The body ended before `x-amz-decoded-content-length` bytes, or before its final chunk (400).
    #[error("You did not provide the number of bytes specified by the Content-Length HTTP header.")]
    IncompleteBody,
}

impl SigV4Error {
    /// The S3 error code, for `<Code>`.
    pub fn code(&self) -> &'static str {
        match self {
            SigV4Error::SignatureDoesNotMatch => "SignatureDoesNotMatch",
            SigV4Error::AuthorizationHeaderMalformed(_) => "AuthorizationHeaderMalformed",
            SigV4Error::AuthorizationQueryParametersError(_) => "AuthorizationQueryParametersError",
            SigV4Error::RequestTimeTooSkewed => "RequestTimeTooSkewed",
            SigV4Error::AccessDenied(_) => "AccessDenied",
            SigV4Error::InvalidArgument(_) => "InvalidArgument",
            SigV4Error::InvalidRequest(_) => "InvalidRequest",
            SigV4Error::MissingSecurityHeader(_) => "MissingSecurityHeader",
            SigV4Error::ContentSha256Mismatch => "XAmzContentSHA256Mismatch",
            SigV4Error::BadDigest(_) => "BadDigest",
            SigV4Error::IncompleteBody => "IncompleteBody",
        }
    }

    /// The HTTP status S3 answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            SigV4Error::SignatureDoesNotMatch | SigV4Error::RequestTimeTooSkewed | SigV4Error::AccessDenied(_) => {
                StatusCode::FORBIDDEN
            }
            _ => StatusCode::BAD_REQUEST,
        }
    }

    fn header(message: impl Into<String>) -> Self {
        SigV4Error::AuthorizationHeaderMalformed(message.into())
    }

    fn query(message: impl Into<String>) -> Self {
        SigV4Error::AuthorizationQueryParametersError(message.into())
    }
}

/// The parts of a request that SigV4 covers, as they arrived on the wire.
#[derive(Debug, Clone, Copy)]
pub struct RequestParts<'a> {
    /// `GET`, `PUT`, …
    pub method: &'a str,
    /// The path exactly as received, still percent-encoded: S3 signs it as sent and never normalises or
    /// re-encodes it.
    pub path: &'a str,
    /// The raw query string without the `?`, if any.
    pub query: Option<&'a str>,
    pub headers: &'a HeaderMap,
}

/// How the credentials were presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthKind {
    /// `Authorization: AWS4-HMAC-SHA256 …`
    Header,
    /// A presigned URL (`X-Amz-Algorithm=AWS4-HMAC-SHA256&…`).
    Query,
}

/// What the signature says about the body: the `x-amz-content-sha256` value (or `UNSIGNED-PAYLOAD` for a
/// presigned URL that sends none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadHash {
    /// `UNSIGNED-PAYLOAD`: the body is not covered.
    Unsigned,
    /// The SHA-256 of the whole body; the caller hashes what it receives and refuses a mismatch with
    /// [`SigV4Error::ContentSha256Mismatch`] (see [`check_payload_sha256`]).
    Sha256([u8; 32]),
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`: aws-chunked with chained chunk signatures.
    StreamingSigned,
    /// `STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER`: signed chunks, then a signed trailer.
    StreamingSignedTrailer,
    /// `STREAMING-UNSIGNED-PAYLOAD-TRAILER`: aws-chunked without signatures, then a trailer (a checksum).
    StreamingUnsignedTrailer,
}

impl PayloadHash {
    /// Parses an `x-amz-content-sha256` value (a SHA-256 in lowercase or uppercase hex, or one of the names).
    pub fn parse(value: &str) -> Result<Self, SigV4Error> {
        Ok(match value {
            UNSIGNED_PAYLOAD => PayloadHash::Unsigned,
            STREAMING_SIGNED => PayloadHash::StreamingSigned,
            STREAMING_SIGNED_TRAILER => PayloadHash::StreamingSignedTrailer,
            STREAMING_UNSIGNED_TRAILER => PayloadHash::StreamingUnsignedTrailer,
            hex_value => {
                let Some(digest) = canonical::hex_32(hex_value, false) else {
                    return Err(SigV4Error::InvalidArgument(
                        "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, \
                         STREAMING-AWS4-HMAC-SHA256-PAYLOAD, STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER or a valid \
                         sha256 value."
                            .into(),
                    ));
                };
                PayloadHash::Sha256(digest)
            }
        })
    }

    /// Whether the body is aws-chunked (one of the `STREAMING-*` forms).
    pub fn is_streaming(self) -> bool {
        matches!(
            self,
            PayloadHash::StreamingSigned | PayloadHash::StreamingSignedTrailer | PayloadHash::StreamingUnsignedTrailer
        )
    }
}

/// A SigV4 request that parsed and passed every check that needs no secret. Look up the secret of
/// [`Self::access_key_id`], then call [`Self::verify`]. It borrows from the request (header auth copies
/// nothing; a presign's decoded parameters are owned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigV4Auth<'a> {
    pub kind: AuthKind,
    pub access_key_id: Cow<'a, str>,
    /// The credential scope's region: ours, since `parse` refuses any other. The scope's date is
    /// [`AmzDate::date`] of [`Self::timestamp`] (checked equal too), so the scope is
    /// `<timestamp date>/<region>/s3/aws4_request`.
    pub region: &'a str,
    /// The request's `x-amz-date` (or `X-Amz-Date`), as sent and as parsed.
    pub timestamp: AmzDate,
    /// `SignedHeaders` as sent, checked: lowercase names, sorted, unique, `;`-separated, `host` among them.
    pub signed_headers: Cow<'a, str>,
    /// The presented signature (32 bytes, sent as 64 lowercase hex digits).
    pub signature: [u8; 32],
    pub payload: PayloadHash,
    /// [`Self::payload`] as sent (the canonical request's last line): `x-amz-content-sha256`, or
    /// `UNSIGNED-PAYLOAD` for a presigned URL that sends none.
    pub payload_text: &'a str,
    /// `X-Amz-Expires` of a presigned URL, in seconds.
    pub expires_in: Option<i64>,
}

/// What a verified request allows the caller to go on with (the access key is the caller's already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub kind: AuthKind,
    pub payload: PayloadHash,
    /// For the signed streaming forms: what the chunk signatures chain from.
    pub streaming: Option<StreamingSeed>,
}

/// What an aws-chunked decoder needs to verify chunk and trailer signatures.
#[derive(Clone, PartialEq, Eq)]
pub struct StreamingSeed {
    /// The request's own signature: the first chunk's "previous signature".
    pub seed_signature: [u8; 32],
    pub signing_key: SigningKey,
    /// `date/region/s3/aws4_request`.
    pub scope: String,
    /// `x-amz-date` as sent (`YYYYMMDDTHHMMSSZ`).
    pub timestamp: String,
}

impl std::fmt::Debug for StreamingSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingSeed")
            .field("seed_signature", &hex::encode(self.seed_signature))
            .field("scope", &self.scope)
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

/// A derived SigV4 signing key: `HMAC(HMAC(HMAC(HMAC("AWS4" + secret, date), region), "s3"), "aws4_request")`.
/// Never printed. It keeps the HMAC already keyed with it (its inner and outer pads absorbed), so a signature
/// costs the message's blocks only: the two pad blocks are hashed once per derivation, not once per request.
#[derive(Clone)]
pub struct SigningKey {
    bytes: [u8; 32],
    keyed: Hmac<Sha256>,
}

impl PartialEq for SigningKey {
    fn eq(&self, other: &Self) -> bool {
        ct_eq(&self.bytes, &other.bytes)
    }
}

impl Eq for SigningKey {}

impl SigningKey {
    /// Derives the key (four HMACs): what [`SigningKeyCache`] saves on every request after the first of a day.
    pub fn derive(secret: &[u8], date: &str, region: &str) -> Self {
        let mut k_secret = Vec::with_capacity(4 + secret.len());
        k_secret.extend_from_slice(b"AWS4");
        k_secret.extend_from_slice(secret);
        let k_date = hmac_sha256(&k_secret, date.as_bytes());
        let k_region = hmac_sha256(&k_date, region.as_bytes());
        let k_service = hmac_sha256(&k_region, SERVICE.as_bytes());
        Self::from_bytes(hmac_sha256(&k_service, TERMINATOR.as_bytes()))
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        Self { bytes, keyed: Hmac::<Sha256>::new_from_slice(&bytes).expect("HMAC takes keys of any length") }
    }

    /// The HMAC-SHA256 of `message` under this key: a signature.
    pub fn sign(&self, message: &[u8]) -> [u8; 32] {
        self.sign_written(|mac| mac.update(message))
    }

    /// The same, of a message that `write` feeds to the MAC piece by piece (no buffer for it).
    pub fn sign_written(&self, write: impl FnOnce(&mut Hmac<Sha256>)) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        write(&mut mac);
        mac.finalize().into_bytes().into()
    }
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(..)")
    }
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().into()
}

/// Signing keys by (access key id, date, region), so the four-HMAC derivation runs once a day per key rather
/// than on every request. Bounded; the server holds one. Each entry remembers the secret it was derived from
/// (compared in constant time), so a key whose secret changed is derived again, never served stale.
pub struct SigningKeyCache {
    keys: Cache<(String, String, String), Arc<CachedKey>>,
}

struct CachedKey {
    secret: Box<[u8]>,
    key: SigningKey,
}

impl SigningKeyCache {
    /// A cache of at most `capacity` keys.
    pub fn new(capacity: usize) -> Self {
        Self { keys: Cache::new(capacity.max(1)) }
    }

    /// The signing key of `access_key_id` with `secret` for `date` (`YYYYMMDD`) and `region`.
    pub fn signing_key(&self, access_key_id: &str, secret: &[u8], date: &str, region: &str) -> SigningKey {
        self.cached(access_key_id, secret, date, region).key.clone()
    }

    /// The same, shared rather than copied (the key holds two hash states).
    fn cached(&self, access_key_id: &str, secret: &[u8], date: &str, region: &str) -> Arc<CachedKey> {
        if let Some(hit) = self.keys.get(&KeyLookup(access_key_id, date, region))
            && ct_eq(&hit.secret, secret)
        {
            return hit;
        }
        cold(|| self.derive(access_key_id, secret, date, region))
    }

    /// A miss: once a day per key.
    fn derive(&self, access_key_id: &str, secret: &[u8], date: &str, region: &str) -> Arc<CachedKey> {
        let key = Arc::new(CachedKey { secret: secret.into(), key: SigningKey::derive(secret, date, region) });
        let id = (access_key_id.to_owned(), date.to_owned(), region.to_owned());
        self.keys.insert(id, key.clone());
        key
    }
}

/// Borrowed form of a cache key, so a hit allocates nothing. Hashes exactly like `(String, String, String)`.
#[derive(Hash)]
struct KeyLookup<'a>(&'a str, &'a str, &'a str);

impl Equivalent<(String, String, String)> for KeyLookup<'_> {
    fn equivalent(&self, key: &(String, String, String)) -> bool {
        self.0 == key.0 && self.1 == key.1 && self.2 == key.2
    }
}

impl Default for SigningKeyCache {
    fn default() -> Self {
        Self::new(1024)
    }
}

/// Finds SigV4 credentials on a request and checks all that needs no secret (see the module doc). `Ok(None)`
/// when the request carries no SigV4 at all (no `AWS4-HMAC-SHA256` Authorization header, no `X-Amz-Algorithm`
/// or `X-Amz-Credential` query parameter): it may still be a bearer token or one of our own signed URLs.
/// `region` is ours (`s3.region`), `now` unix seconds.
pub fn parse<'a>(request: &RequestParts<'a>, region: &'a str, now: i64) -> Result<Option<SigV4Auth<'a>>, SigV4Error> {
    parsing::parse(request, region, now)
}

impl SigV4Auth<'_> {
    /// Checks the signature with the secret of [`Self::access_key_id`]: hashes the canonical request as it is
    /// written, feeds the string to sign to the HMAC under the signing key from `keys`, compares in constant
    /// time. A header-signed request without a query allocates nothing.
    pub fn verify(
        &self,
        request: &RequestParts<'_>,
        secret: &[u8],
        keys: &SigningKeyCache,
    ) -> Result<Verified, SigV4Error> {
        let mut canonical = Sha256::new();
        let mut gathered = canonical::Gather::new(&mut canonical);
        canonical::write_canonical_request(&mut gathered, request, self);
        gathered.finish();
        let canonical: [u8; 32] = canonical.finalize().into();
        let date = self.timestamp.date();
        let cached = keys.cached(&self.access_key_id, secret, date, self.region);
        let key = &cached.key;
        let scope = [date, "/", self.region, "/", SERVICE, "/", TERMINATOR];
        let expected = key.sign_written(|mac| {
            let mut gathered = canonical::Gather::new(mac);
            write_string_to_sign(&mut gathered, self.timestamp.text(), &scope, &canonical);
            gathered.finish();
        });
        if !ct_eq(&expected, &self.signature) {
            return Err(SigV4Error::SignatureDoesNotMatch);
        }
        let streaming = matches!(self.payload, PayloadHash::StreamingSigned | PayloadHash::StreamingSignedTrailer)
            .then(|| {
                cold(|| StreamingSeed {
                    seed_signature: self.signature,
                    signing_key: key.clone(),
                    scope: scope.concat(),
                    timestamp: self.timestamp.text().to_owned(),
                })
            });
        Ok(Verified { kind: self.kind, payload: self.payload, streaming })
    }

    /// The signed header names, in their (sorted) order.
    pub fn signed_headers(&self) -> impl Iterator<Item = &str> + Clone {
        canonical::split_ascii(&self.signed_headers, b';')
    }
}

/// `AWS4-HMAC-SHA256\n<timestamp>\n<scope>\n<hex SHA-256 of the canonical request>`.
pub fn string_to_sign(timestamp: &str, scope: &str, canonical_request: &[u8]) -> String {
    let mut out = Vec::with_capacity(128);
    write_string_to_sign(&mut out, timestamp, &[scope], &Sha256::digest(canonical_request).into());
    String::from_utf8(out).expect("the string to sign is ASCII when its parts are")
}

/// [`string_to_sign`] written into `out`, the scope given in pieces and the canonical request by its SHA-256.
fn write_string_to_sign(out: &mut impl Sink, timestamp: &str, scope: &[&str], canonical_sha256: &[u8; 32]) {
    let mut hex = [0u8; 64];
    hex::encode_to_slice(canonical_sha256, &mut hex).expect("64 hex digits for 32 bytes");
    out.put(ALGORITHM.as_bytes());
    out.put(b"\n");
    out.put(timestamp.as_bytes());
    out.put(b"\n");
    for piece in scope {
        out.put(piece.as_bytes());
    }
    out.put(b"\n");
    out.put(&hex);
}

/// Compares the SHA-256 of a received body with a signed [`PayloadHash::Sha256`].
pub fn check_payload_sha256(signed: &[u8; 32], received: &[u8; 32]) -> Result<(), SigV4Error> {
    if ct_eq(signed, received) { Ok(()) } else { Err(SigV4Error::ContentSha256Mismatch) }
}

/// Runs `make` out of line, on a path the compiler treats as unlikely. Refusals build their messages here, so
/// that the code a valid request runs sits in fewer cache lines: the check runs once per request, after the
/// kernel's network path has evicted it, and pays for every line it touches.
#[cold]
#[inline(never)]
pub(crate) fn cold<T>(make: impl FnOnce() -> T) -> T {
    make()
}

mod parsing;

pub use parsing::sigv2_refused;

#[cfg(test)]
mod botocore_tests;
#[cfg(test)]
mod tests;
