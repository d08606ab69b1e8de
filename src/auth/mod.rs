//! Who may read or write what. Decisions happen *before* an object is looked up, so that callers without
//! access get the same answer for present and absent keys (and absent buckets).
//!
//! - no credentials on a private (or absent) bucket → 401 with `WWW-Authenticate: Bearer`;
//! - malformed, unknown, expired or revoked credentials → 401;
//! - valid credentials that do not cover this bucket, prefix or operation → 403;
//! - public buckets are readable by anyone; credentials presented there must still be valid (401 otherwise);
//! - writes always need a `write` or `admin` token.
//!
//! `token`, `presign`, `sigv4` and `access_key` are pure. This module adds the ordering: credential extraction (one
//! function per kind: [`bearer`], [`presigned`]; [`credentials`] combines them; SigV4, the third kind, is found by
//! `sigv4::parse` inside [`Authorizer::s3`], since verifying it needs the whole request) and the [`Authorizer`],
//! which decides over a
//! [`CredentialLookup`] (the catalog in the server, a map in tests). It knows nothing of HTTP responses or of the
//! application's state: refusals are [`AuthError`]s, which `http::error` turns into responses and metric labels.

pub mod access_key;
pub mod presign;
pub mod sigv4;
pub mod token;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::header_values::fields::{self, Fields};
use crate::names::{BucketName, ObjectKey};
use crate::store::{Bucket, Grant, MetadataError, Rights, S3KeyRecord, SigningKey, TokenRecord, unix_now};
use presign::{PresignParams, QueryError};
use sigv4::{AuthKind, RequestParts, SigV4Error, SigningKeyCache};
use token::Scope;

/// The operation being authorised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Credentials found on a request, before they are checked. A bearer token is borrowed from its header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials<'a> {
    Anonymous,
    Bearer(&'a str),
    Presigned(PresignParams),
}

/// The decision that allowed a native read (GET/HEAD of an object), and what it allows beyond the object itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedRead {
    pub bucket: Arc<Bucket>,
    /// A `response-content-disposition` that a valid signature covered.
    pub content_disposition: Option<String>,
}

/// Why credentials were refused: the label of `blobgate_auth_failures_total` (a fixed set, so it stays bounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    Missing,
    Malformed,
    UnknownToken,
    Revoked,
    Expired,
    Forbidden,
    BadSignature,
    SignatureExpired,
    SignatureRevoked,
}

impl FailureReason {
    /// Every reason, so the metric's series exist (at 0) from start-up.
    pub const ALL: [FailureReason; 9] = [
        FailureReason::Missing,
        FailureReason::Malformed,
        FailureReason::UnknownToken,
        FailureReason::Revoked,
        FailureReason::Expired,
        FailureReason::Forbidden,
        FailureReason::BadSignature,
        FailureReason::SignatureExpired,
        FailureReason::SignatureRevoked,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Missing => "missing",
            FailureReason::Malformed => "malformed",
            FailureReason::UnknownToken => "unknown_token",
            FailureReason::Revoked => "revoked",
            FailureReason::Expired => "expired",
            FailureReason::Forbidden => "forbidden",
            FailureReason::BadSignature => "bad_signature",
            FailureReason::SignatureExpired => "signature_expired",
            FailureReason::SignatureRevoked => "signature_revoked",
        }
    }
}

/// Every way an authorisation can fail. `http::error` maps it to a response in one place.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The request is ambiguous or carries an invalid override (400, not counted as a refusal).
    #[error("{0}")]
    BadRequest(&'static str),
    /// Missing, malformed, unknown, expired or revoked credentials (401).
    #[error("{message}")]
    Unauthorized { reason: FailureReason, message: &'static str },
    /// Valid credentials that do not grant this access (403).
    #[error("access denied")]
    Forbidden,
    /// A valid signature for a bucket that does not exist (any more): simply a missing object (404).
    #[error("no such object")]
    NoSuchBucket,
    /// A refused SigV4 request, with the S3 error it answers with.
    #[error("{error}")]
    SigV4 { reason: FailureReason, error: SigV4Error },
    /// An access key id we do not know, or one that was revoked: S3's `InvalidAccessKeyId` (403).
    #[error("The AWS Access Key Id you provided does not exist in our records.")]
    InvalidAccessKeyId { reason: FailureReason },
    /// The lookup itself failed (the database).
    #[error(transparent)]
    Lookup(#[from] MetadataError),
}

impl AuthError {
    fn unauthorized(reason: FailureReason, message: &'static str) -> Self {
        AuthError::Unauthorized { reason, message }
    }

    /// The metric label for a refusal of credentials; `None` for errors that are not refusals.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            AuthError::Unauthorized { reason, .. } => Some(reason.label()),
            AuthError::Forbidden => Some(FailureReason::Forbidden.label()),
            AuthError::SigV4 { reason, .. } | AuthError::InvalidAccessKeyId { reason } => Some(reason.label()),
            AuthError::BadRequest(_) | AuthError::NoSuchBucket | AuthError::Lookup(_) => None,
        }
    }
}

/// Finds the credentials of a request: at most one kind. The admin listener passes no query, since it takes no
/// signed URLs.
pub fn credentials<'a>(headers: &'a dyn Fields, query: Option<&str>) -> Result<Credentials<'a>, AuthError> {
    match (bearer(headers)?, presigned(query)?) {
        (Some(_), Some(_)) => Err(AuthError::BadRequest("send a bearer token or a signed URL, not both")),
        (Some(token), None) => Ok(Credentials::Bearer(token)),
        (None, Some(params)) => Ok(Credentials::Presigned(params)),
        (None, None) => Ok(Credentials::Anonymous),
    }
}

/// The `Authorization: Bearer` token, if any. RFC 9110 §11.6.2 allows one Authorization field; several are
/// refused (400).
pub fn bearer(headers: &dyn Fields) -> Result<Option<&str>, AuthError> {
    let mut fields = headers.values(&fields::AUTHORIZATION);
    match (fields.next(), fields.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(AuthError::BadRequest("repeated Authorization header")),
        (Some(value), None) => parse_bearer(value).map(Some).ok_or(AuthError::unauthorized(
            FailureReason::Malformed,
            "malformed Authorization header; expected 'Bearer <token>'",
        )),
    }
}

/// The signed-URL parameters of a query, if any.
pub fn presigned(query: Option<&str>) -> Result<Option<PresignParams>, AuthError> {
    presign::parse_query(query).map_err(|e| match e {
        QueryError::Credentials(why) => AuthError::unauthorized(FailureReason::Malformed, why),
        QueryError::Override(why) => AuthError::BadRequest(why),
    })
}

/// RFC 9110 §11.1: the scheme is case-insensitive; RFC 6750 §2.1: `Bearer 1*SP b64token`.
fn parse_bearer(value: &[u8]) -> Option<&str> {
    let (scheme, rest) = value.split_at_checked(b"bearer ".len())?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = &rest[rest.iter().position(|&b| b != b' ')?..];
    // One of ours, checked by its layout alone: what nearly every request presents.
    if token::well_formed(token) {
        return std::str::from_utf8(token).ok();
    }
    let body = &token[..=token.iter().rposition(|&b| b != b'=')?];
    // Only ASCII passes the check, so the token is UTF-8.
    all_alphanumeric_or(body, b"-._~+/").then(|| std::str::from_utf8(token).ok())?
}

/// Whether every byte of `bytes` is an ASCII letter or digit or one of `extra`. A credential's bytes are checked
/// on every request: compared by ranges and folded without an early exit, the check is compiled to take many
/// bytes at a time (where a lookup table, or a loop that stops at the first bad byte, takes one).
#[inline(always)]
pub(crate) fn all_alphanumeric_or(bytes: &[u8], extra: &[u8]) -> bool {
    bytes.iter().fold(true, |all, &b| {
        let letter = (b | 0x20).wrapping_sub(b'a') < 26;
        let digit = b.wrapping_sub(b'0') < 10;
        all & (letter | digit | extra.iter().fold(false, |any, &e| any | (b == e)))
    })
}

/// Whether `a` and `b` are equal, in time that depends on their lengths only. Eight bytes at a time: `subtle`
/// keeps each comparison branch-free with a barrier, and one barrier per word rather than per byte is a quarter
/// of the cost on a signature.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    if a.len() != b.len() {
        return false;
    }
    let (a_words, b_words) = (a.chunks_exact(8), b.chunks_exact(8));
    let tails = a_words.remainder().ct_eq(b_words.remainder());
    let word = |w: &[u8]| u64::from_ne_bytes(w.try_into().expect("chunks of eight"));
    bool::from(a_words.zip(b_words).fold(tails, |equal, (x, y)| equal & word(x).ct_eq(&word(y))))
}

/// Why a token does not grant an access. Pure, so the whole matrix is unit-tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    Revoked,
    Expired,
    /// Valid token, but not for this bucket, prefix or operation.
    Forbidden,
}

impl From<Denial> for AuthError {
    fn from(denial: Denial) -> Self {
        match denial {
            Denial::Revoked => AuthError::unauthorized(FailureReason::Revoked, "token revoked"),
            Denial::Expired => AuthError::unauthorized(FailureReason::Expired, "token expired"),
            Denial::Forbidden => AuthError::Forbidden,
        }
    }
}

impl Access {
    /// The least scope that grants it.
    fn scope(self) -> Scope {
        match self {
            Access::Read => Scope::Read,
            Access::Write => Scope::Write,
        }
    }
}

/// The token rules for one grant. `Grant` is the store's (its columns); the rules are `auth`'s, so they live here.
impl Grant {
    /// Whether the grant names the bucket `bucket_id` (`None`: no such bucket, which only a grant of every bucket
    /// names: its holder may learn that a bucket does not exist).
    pub fn names_bucket(&self, bucket_id: Option<i64>) -> bool {
        match &self.bucket {
            None => true,
            Some(b) => bucket_id == Some(b.id),
        }
    }

    /// Whether the grant gives `access` to `key` (or, for a listing, to every key under the prefix `key`) in the
    /// bucket `bucket_id`.
    pub fn covers(&self, bucket_id: Option<i64>, key: &str, access: Access) -> bool {
        self.scope >= access.scope() && self.names_bucket(bucket_id) && key.starts_with(&self.prefix)
    }
}

/// The token rules over what a stored credential (a token or an S3 access key) grants: a request is allowed by
/// one grant that covers its bucket and key with the scope it needs.
impl Rights {
    /// Whether the credential may be used at all at `now`: not revoked, not expired.
    pub fn check_liveness(&self, now: i64) -> Result<(), Denial> {
        if self.revoked_at.is_some() {
            return Err(Denial::Revoked);
        }
        if self.expires_at.is_some_and(|at| now >= at) {
            return Err(Denial::Expired);
        }
        Ok(())
    }

    /// Whether the credential grants `access` to `key` in the bucket `bucket_id` (`None`: no such bucket).
    pub fn check(&self, bucket_id: Option<i64>, key: &str, access: Access, now: i64) -> Result<(), Denial> {
        self.check_liveness(now)?;
        if self.grants.iter().any(|g| g.covers(bucket_id, key, access)) { Ok(()) } else { Err(Denial::Forbidden) }
    }

    /// Whether the credential grants `access` to some key of the bucket `bucket_id`: the bucket-level requests
    /// (HeadBucket, listings, which then narrow to [`Rights::may_list`]).
    pub fn check_bucket(&self, bucket_id: Option<i64>, access: Access, now: i64) -> Result<(), Denial> {
        self.check_liveness(now)?;
        let any = self.grants.iter().any(|g| g.scope >= access.scope() && g.names_bucket(bucket_id));
        if any { Ok(()) } else { Err(Denial::Forbidden) }
    }

    /// Whether one grant lets the credential read every key under `prefix` of the bucket `bucket_id` (a listing
    /// shows keys, so it must stay inside what the credential may read).
    pub fn may_list(&self, bucket_id: i64, prefix: &str) -> bool {
        self.grants.iter().any(|g| g.covers(Some(bucket_id), prefix, Access::Read))
    }

    /// What a listing asked for under `prefix` may show: `prefix` itself when a grant covers it, else the prefix
    /// of the first grant that reads a part of it (a shorter prefix narrowed to what the credential may read);
    /// `None` when no grant reads anything under it.
    pub fn readable_prefix<'a>(&'a self, bucket_id: i64, prefix: &'a str) -> Option<&'a str> {
        if self.may_list(bucket_id, prefix) {
            return Some(prefix);
        }
        self.grants
            .iter()
            .find(|g| g.covers(Some(bucket_id), &g.prefix, Access::Read) && g.prefix.starts_with(prefix))
            .map(|g| g.prefix.as_str())
    }

    /// Whether a grant gives `admin` on every bucket: bucket creation and deletion, the full ListBuckets.
    pub fn admin_of_every_bucket(&self) -> bool {
        self.grants.iter().any(|g| g.bucket.is_none() && g.scope == Scope::Admin)
    }

    /// Whether a grant gives `admin` on the whole bucket `bucket_id` (`None`: no such bucket, which only a grant
    /// of every bucket names): its configuration.
    pub fn admin_of_bucket(&self, bucket_id: Option<i64>) -> bool {
        self.grants.iter().any(|g| g.scope == Scope::Admin && g.prefix.is_empty() && g.names_bucket(bucket_id))
    }

    /// Whether some grant has `admin` scope (on one bucket or all): the admin listener's management endpoints.
    pub fn has_admin(&self) -> bool {
        self.grants.iter().any(|g| g.scope == Scope::Admin)
    }
}

/// What the authoriser looks up: tokens by id, signing keys by id, revoked signatures, S3 access keys by id.
/// The catalog implements it from its coherent caches.
pub trait CredentialLookup: Send + Sync {
    fn token<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<TokenRecord>>, MetadataError>> + Send + 'a;
    fn signing_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<SigningKey>>, MetadataError>> + Send + 'a;
    fn signature_revoked<'a>(
        &'a self,
        signature: &'a str,
    ) -> impl Future<Output = Result<bool, MetadataError>> + Send + 'a;
    fn s3_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<S3KeyRecord>>, MetadataError>> + Send + 'a;
}

impl<T: CredentialLookup> CredentialLookup for Arc<T> {
    fn token<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<TokenRecord>>, MetadataError>> + Send + 'a {
        (**self).token(id)
    }

    fn signing_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<SigningKey>>, MetadataError>> + Send + 'a {
        (**self).signing_key(id)
    }

    fn signature_revoked<'a>(
        &'a self,
        signature: &'a str,
    ) -> impl Future<Output = Result<bool, MetadataError>> + Send + 'a {
        (**self).signature_revoked(signature)
    }

    fn s3_key<'a>(
        &'a self,
        id: &'a str,
    ) -> impl Future<Output = Result<Option<Arc<S3KeyRecord>>, MetadataError>> + Send + 'a {
        (**self).s3_key(id)
    }
}

/// Makes every authorisation decision, over a [`CredentialLookup`].
pub struct Authorizer<L> {
    lookup: L,
    /// `auth.presign_max_lifetime`, in seconds.
    presign_max_lifetime: i64,
    /// Unix seconds now; a fixed clock in tests.
    clock: fn() -> i64,
    /// `s3.region`: the region SigV4 credential scopes must name.
    s3_region: String,
    /// Derived SigV4 signing keys, per (access key, date, region).
    s3_signing_keys: SigningKeyCache,
}

/// What an S3 request asks for, with its bucket as looked up (`None`: no such bucket).
#[derive(Debug, Clone, Copy)]
pub enum S3Target<'a> {
    /// ListBuckets: any live key.
    Service,
    /// HeadBucket, GetBucketLocation, the listings (which narrow to the key's prefixes themselves): a grant on
    /// the bucket with the scope asked for.
    Bucket(Option<&'a Arc<Bucket>>),
    /// CreateBucket, DeleteBucket: `admin` on every bucket (`--grant '*:admin'`).
    EveryBucket,
    /// The bucket's configuration (PutBucketCors, DeleteBucketCors): `admin` on the whole bucket.
    BucketAdmin(Option<&'a Arc<Bucket>>),
    /// GetObject, HeadObject.
    Object(Option<&'a Arc<Bucket>>, &'a ObjectKey),
}

/// The decision that allowed an S3 request: its verified access key (whose `rights` bound what else it may do),
/// and how it was signed.
#[derive(Debug, Clone)]
pub struct AllowedS3Request {
    pub key: Arc<S3KeyRecord>,
    /// A presigned URL (query auth): only then do `response-*` overrides apply.
    pub presigned: bool,
    /// What the signature covers of the body (an upload's payload hash, its aws-chunked seed).
    pub verified: sigv4::Verified,
}

/// The key's rights to `target` with `access` at `now`, as an S3 refusal.
fn check_s3_target(key: &S3KeyRecord, target: S3Target<'_>, access: Access, now: i64) -> Result<(), AuthError> {
    let rights = &key.rights;
    let checked = match target {
        S3Target::Service => rights.check_liveness(now),
        S3Target::Bucket(bucket) => rights.check_bucket(bucket.map(|b| b.id), access, now),
        S3Target::EveryBucket => rights
            .check_liveness(now)
            .and_then(|()| if rights.admin_of_every_bucket() { Ok(()) } else { Err(Denial::Forbidden) }),
        S3Target::BucketAdmin(bucket) => rights
            .check_liveness(now)
            .and_then(|()| if rights.admin_of_bucket(bucket.map(|b| b.id)) { Ok(()) } else { Err(Denial::Forbidden) }),
        // A public bucket is readable by any live key, as by anyone.
        S3Target::Object(Some(bucket), _) if bucket.public && access == Access::Read => rights.check_liveness(now),
        S3Target::Object(bucket, object) => rights.check(bucket.map(|b| b.id), object.as_str(), access, now),
    };
    match checked {
        Ok(()) => Ok(()),
        Err(Denial::Revoked) => Err(AuthError::InvalidAccessKeyId { reason: FailureReason::Revoked }),
        Err(Denial::Expired) => {
            let error = SigV4Error::AccessDenied("The access key has expired.");
            Err(AuthError::SigV4 { reason: FailureReason::Expired, error })
        }
        Err(Denial::Forbidden) => Err(AuthError::Forbidden),
    }
}

/// The failure-metric label of a SigV4 refusal.
fn sigv4_reason(error: &SigV4Error) -> FailureReason {
    match error {
        SigV4Error::SignatureDoesNotMatch => FailureReason::BadSignature,
        SigV4Error::RequestTimeTooSkewed | SigV4Error::AccessDenied(_) => FailureReason::SignatureExpired,
        _ => FailureReason::Malformed,
    }
}

fn sigv4_refusal(error: SigV4Error) -> AuthError {
    AuthError::SigV4 { reason: sigv4_reason(&error), error }
}

impl<L: CredentialLookup> Authorizer<L> {
    pub fn new(lookup: L, presign_max_lifetime: Duration) -> Self {
        Self {
            lookup,
            presign_max_lifetime: presign_max_lifetime.as_secs() as i64,
            clock: unix_now,
            s3_region: crate::config::S3Settings::default().region,
            s3_signing_keys: SigningKeyCache::default(),
        }
    }

    /// The same authoriser for another S3 region (`s3.region`).
    pub fn with_s3_region(self, region: &str) -> Self {
        Self { s3_region: region.to_owned(), ..self }
    }

    pub fn s3_region(&self) -> &str {
        &self.s3_region
    }

    /// Authorises an S3 request: SigV4 in the header or the query, verified with the access key's secret, then
    /// the token rules for `target` and `access`. The bucket was looked up, the object not yet: every refusal
    /// here answers alike for present and absent buckets and keys. Order: what needs no secret (syntax, scope,
    /// clock skew, presign lifetime), then the key (unknown: `InvalidAccessKeyId`), then the signature, and only
    /// for a valid signature whether the key is revoked or expired, so only the key's holder learns that.
    pub async fn s3(
        &self,
        request: &RequestParts<'_>,
        target: S3Target<'_>,
        access: Access,
    ) -> Result<AllowedS3Request, AuthError> {
        let now = (self.clock)();
        let Some(signed) = sigv4::parse(request, &self.s3_region, now).map_err(sigv4_refusal)? else {
            return Err(AuthError::unauthorized(FailureReason::Missing, "Access Denied"));
        };
        // Presigned SigV4 is bounded by S3's 7 days (`parse`) and by our own maximum for signed URLs.
        if signed.expires_in.is_some_and(|secs| secs > self.presign_max_lifetime) {
            return Err(sigv4_refusal(SigV4Error::AuthorizationQueryParametersError(
                "X-Amz-Expires is longer than this server's auth.presign_max_lifetime".into(),
            )));
        }
        let Some(key) = self.lookup.s3_key(&signed.access_key_id).await? else {
            return Err(AuthError::InvalidAccessKeyId { reason: FailureReason::UnknownToken });
        };
        let verified = signed.verify(request, key.secret.as_bytes(), &self.s3_signing_keys).map_err(sigv4_refusal)?;
        check_s3_target(&key, target, access, now)?;
        Ok(AllowedS3Request { key, presigned: verified.kind == AuthKind::Query, verified })
    }

    /// Authorises an S3 GetObject or HeadObject. Signed, it is [`Authorizer::s3`]'s decision. Unsigned (no
    /// `Authorization`, no presign parameters) on a public bucket it is allowed to anyone, as S3 serves a
    /// public-read bucket: `None`. Unsigned on a private or absent bucket, it is refused as `s3` refuses it, so
    /// the two answer alike.
    pub async fn s3_object_read(
        &self,
        request: &RequestParts<'_>,
        bucket: Option<&Arc<Bucket>>,
        key: &ObjectKey,
    ) -> Result<Option<AllowedS3Request>, AuthError> {
        if bucket.is_some_and(|b| b.public)
            && !request.headers.contains_key("authorization")
            && sigv4::parse(request, &self.s3_region, (self.clock)()).map_err(sigv4_refusal)?.is_none()
        {
            return Ok(None);
        }
        self.s3(request, S3Target::Object(bucket, key), Access::Read).await.map(Some)
    }

    /// Whether a request already verified by [`Authorizer::s3`] may also have `access` to a second target: the
    /// source of a server-side copy, which the signed request names in a header.
    pub fn s3_also(&self, allowed: &AllowedS3Request, target: S3Target<'_>, access: Access) -> Result<(), AuthError> {
        check_s3_target(&allowed.key, target, access, (self.clock)())
    }

    /// The same authoriser with another clock (tests).
    pub fn with_clock(self, clock: fn() -> i64) -> Self {
        Self { clock, ..self }
    }

    /// Authorises a GET/HEAD of `name/key`: an object's key, or `""` for the bucket's root (`/{bucket}/`, which
    /// only credentials for the whole bucket may read). `bucket` is `None` when no such bucket exists; that case
    /// answers exactly like a private bucket the caller may not read.
    pub async fn read(
        &self,
        name: &BucketName,
        bucket: Option<&Arc<Bucket>>,
        key: &str,
        credentials: Credentials<'_>,
    ) -> Result<AllowedRead, AuthError> {
        if let Some(b) = bucket.filter(|b| b.public) {
            // Public buckets need no credentials, but credentials that are presented must be valid (as in S3): a
            // revoked token or a tampered link is refused rather than silently treated as anonymous.
            let content_disposition = match credentials {
                Credentials::Anonymous => None,
                Credentials::Bearer(token) => {
                    self.live_token(token).await?;
                    None
                }
                Credentials::Presigned(params) => {
                    // Boxed here and below: unboxed, a signed URL's checks would size every read's future.
                    Box::pin(self.verify_presigned(&params, name, key)).await?;
                    params.response_disposition
                }
            };
            return Ok(AllowedRead { bucket: b.clone(), content_disposition });
        }
        match credentials {
            Credentials::Anonymous => Err(AuthError::unauthorized(FailureReason::Missing, "credentials required")),
            Credentials::Bearer(token) => {
                self.authorize_token(token, bucket.as_ref().map(|b| b.id), key, Access::Read).await?;
                // Only a grant of every bucket passes for a missing one.
                let bucket = bucket.ok_or(AuthError::NoSuchBucket)?.clone();
                Ok(AllowedRead { bucket, content_disposition: None })
            }
            Credentials::Presigned(params) => {
                Box::pin(self.verify_presigned(&params, name, key)).await?;
                let bucket = bucket.ok_or(AuthError::NoSuchBucket)?.clone();
                Ok(AllowedRead { bucket, content_disposition: params.response_disposition })
            }
        }
    }

    /// Authorises an upload or delete on the admin listener: a bearer token with `write` or `admin` scope.
    pub async fn write(
        &self,
        bucket: Option<&Bucket>,
        key: &ObjectKey,
        credentials: Credentials<'_>,
    ) -> Result<(), AuthError> {
        match credentials {
            Credentials::Bearer(token) => {
                self.authorize_token(token, bucket.map(|b| b.id), key.as_str(), Access::Write).await
            }
            _ => Err(AuthError::unauthorized(FailureReason::Missing, "a bearer token with write scope is required")),
        }
    }

    /// An `admin`-scope bearer token, for management endpoints; callers limit what they show to its bucket and
    /// prefix.
    pub async fn admin(&self, credentials: Credentials<'_>) -> Result<Arc<TokenRecord>, AuthError> {
        let Credentials::Bearer(presented) = credentials else {
            return Err(AuthError::unauthorized(FailureReason::Missing, "a bearer token with admin scope is required"));
        };
        let record = self.live_token(presented).await?;
        if !record.rights.has_admin() {
            return Err(AuthError::Forbidden);
        }
        Ok(record)
    }

    async fn authorize_token(
        &self,
        presented: &str,
        bucket_id: Option<i64>,
        key: &str,
        access: Access,
    ) -> Result<(), AuthError> {
        let record = self.known_token(presented).await?;
        Ok(record.rights.check(bucket_id, key, access, (self.clock)())?)
    }

    /// The token presented as `Authorization: Bearer`, if it exists and is neither revoked nor expired.
    async fn live_token(&self, presented: &str) -> Result<Arc<TokenRecord>, AuthError> {
        let record = self.known_token(presented).await?;
        record.rights.check_liveness((self.clock)())?;
        Ok(record)
    }

    /// The stored token whose hash matches the presented one, whatever its state.
    async fn known_token(&self, presented: &str) -> Result<Arc<TokenRecord>, AuthError> {
        let id = token::claimed_id(presented);
        let record = match id {
            Some(id) => self.lookup.token(id).await?,
            None => None,
        };
        // Hash even when nothing was found, so unknown ids and wrong secrets take the same time.
        let unknown = [0u8; 32];
        let hash_matches = token::matches(presented, id, record.as_ref().map_or(&unknown[..], |r| &r.secret_hash));
        record.filter(|_| hash_matches).ok_or(AuthError::unauthorized(FailureReason::UnknownToken, "invalid token"))
    }

    async fn verify_presigned(&self, params: &PresignParams, bucket: &BucketName, key: &str) -> Result<(), AuthError> {
        let now = (self.clock)();
        let fail = |reason, message| Err(AuthError::unauthorized(reason, message));
        if now >= params.expires {
            return fail(FailureReason::SignatureExpired, "signed URL expired");
        }
        // Allow a minute of clock skew between the signing host and this one.
        if params.expires > now.saturating_add(self.presign_max_lifetime).saturating_add(60) {
            return fail(FailureReason::BadSignature, "signed URL lives longer than the configured maximum");
        }
        let Some(signing_key) = self.lookup.signing_key(&params.key_id).await? else {
            return fail(FailureReason::BadSignature, "invalid signed URL");
        };
        if signing_key.retired_at.is_some() {
            return fail(FailureReason::BadSignature, "signed URL's key has been retired");
        }
        if !params.verify(&signing_key.secret, bucket.as_str(), key) {
            return fail(FailureReason::BadSignature, "invalid signed URL");
        }
        if self.lookup.signature_revoked(&params.signature).await? {
            return fail(FailureReason::SignatureRevoked, "signed URL revoked");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use http::HeaderMap;
    use http::header;

    fn token(scope: &str, prefix: &str) -> TokenRecord {
        TokenRecord {
            id: "0123456789ab".into(),
            secret_hash: vec![0; 32],
            rights: Rights {
                expires_at: Some(100),
                ..Rights::prefixed(1, "bkt", Scope::parse(scope).expect("a known scope"), prefix.into())
            },
        }
    }

    fn grant(bucket: Option<i64>, prefix: &str, scope: Scope) -> Grant {
        let bucket = bucket.map(|id| crate::store::GrantedBucket { id, name: format!("b{id}") });
        Grant { bucket, prefix: prefix.into(), scope }
    }

    fn rights(grants: Vec<Grant>) -> Rights {
        Rights { grants, created_at: 0, expires_at: None, revoked_at: None }
    }

    #[test]
    fn several_grants_each_allow_what_they_cover() {
        use Access::*;
        let r = rights(vec![
            grant(Some(1), "pub/", Scope::Read),
            grant(Some(2), "", Scope::Write),
            grant(Some(1), "up/", Scope::Write),
        ]);
        let forbidden = Err(Denial::Forbidden);
        assert_eq!(r.check(Some(1), "pub/a", Read, 0), Ok(()));
        assert_eq!(r.check(Some(1), "pub/a", Write, 0), forbidden, "read only under pub/");
        assert_eq!(r.check(Some(1), "up/a", Write, 0), Ok(()));
        assert_eq!(r.check(Some(1), "up/a", Read, 0), Ok(()), "write includes read");
        assert_eq!(r.check(Some(1), "other", Read, 0), forbidden);
        assert_eq!(r.check(Some(2), "anything", Write, 0), Ok(()));
        assert_eq!(r.check(Some(3), "a", Read, 0), forbidden);
        assert_eq!(r.check(None, "a", Read, 0), forbidden, "a missing bucket is no bucket a grant names");
        // Bucket-level requests: some grant on the bucket with the scope.
        assert_eq!(r.check_bucket(Some(1), Write, 0), Ok(()));
        assert_eq!(r.check_bucket(Some(3), Read, 0), forbidden);
        // Listings stay inside a grant, or narrow to one.
        assert!(r.may_list(1, "pub/x") && r.may_list(1, "up/") && !r.may_list(1, "") && !r.may_list(3, ""));
        assert_eq!(r.readable_prefix(1, "pub/"), Some("pub/"));
        assert_eq!(r.readable_prefix(1, ""), Some("pub/"), "the first grant under the prefix asked for");
        assert_eq!(r.readable_prefix(1, "zzz"), None);
        assert!(!r.admin_of_every_bucket() && !r.has_admin());

        let admin = rights(vec![grant(None, "", Scope::Admin)]);
        assert!(admin.admin_of_every_bucket() && admin.has_admin());
        assert!(admin.admin_of_bucket(Some(4)) && admin.admin_of_bucket(None));
        assert_eq!(admin.check(Some(7), "k", Write, 0), Ok(()));
        assert_eq!(admin.check(None, "k", Read, 0), Ok(()), "may learn that a bucket does not exist");
        let every_read = rights(vec![grant(None, "", Scope::Read), grant(Some(4), "", Scope::Admin)]);
        assert!(!every_read.admin_of_every_bucket() && every_read.has_admin());
        assert!(every_read.admin_of_bucket(Some(4)) && !every_read.admin_of_bucket(Some(1)));
        assert!(!every_read.admin_of_bucket(None), "only an admin of every bucket learns one is missing");
        assert_eq!(every_read.check(Some(9), "k", Write, 0), forbidden);
        assert_eq!(every_read.check(Some(4), "k", Write, 0), Ok(()));
        assert_eq!(rights(vec![]).check(Some(1), "k", Read, 0), forbidden, "no grant, no access");
    }

    proptest::proptest! {
        /// A credential's rights are the union of its grants': a request passes exactly when one grant alone
        /// would pass it, whatever their number and order.
        #[test]
        fn rights_are_the_union_of_their_grants(
            grants in proptest::collection::vec(
                (proptest::option::of(1i64..4), "(a/|b/|a/b/)?", 0usize..3), 0..5),
            bucket in proptest::option::of(1i64..4),
            key in "(a/|b/)(b/|c)?",
            write: bool,
        ) {
            let scopes = [Scope::Read, Scope::Write, Scope::Admin];
            let grants: Vec<Grant> = grants.into_iter().map(|(b, p, s)| grant(b, &p, scopes[s])).collect();
            let access = if write { Access::Write } else { Access::Read };
            let alone = grants.iter().any(|g| rights(vec![g.clone()]).check(bucket, &key, access, 0).is_ok());
            let mut reversed = grants.clone();
            reversed.reverse();
            proptest::prop_assert_eq!(rights(grants).check(bucket, &key, access, 0).is_ok(), alone);
            proptest::prop_assert_eq!(rights(reversed).check(bucket, &key, access, 0).is_ok(), alone);
        }
    }

    #[test]
    fn token_matrix() {
        use Access::*;
        let ok = Ok(());
        let forbidden = Err(Denial::Forbidden);
        // (scope, prefix, bucket asked for, key, access, now, expected)
        type Case = (&'static str, &'static str, Option<i64>, &'static str, Access, i64, Result<(), Denial>);
        let cases: &[Case] = &[
            ("read", "", Some(1), "a", Read, 50, ok),
            ("read", "", Some(1), "a", Write, 50, forbidden),
            ("write", "", Some(1), "a", Write, 50, ok),
            ("write", "", Some(1), "a", Read, 50, ok),
            ("admin", "", Some(1), "a", Write, 50, ok),
            ("read", "", Some(2), "a", Read, 50, forbidden),
            ("read", "", None, "a", Read, 50, forbidden),
            ("read", "pub/", Some(1), "pub/x", Read, 50, ok),
            ("read", "pub/", Some(1), "pubx", Read, 50, forbidden),
            ("read", "pub/", Some(1), "other/pub/x", Read, 50, forbidden),
            // The bucket's root (`/{bucket}/` without an index document) is read with the whole bucket only.
            ("read", "", Some(1), "", Read, 50, ok),
            ("read", "pub/", Some(1), "", Read, 50, forbidden),
            ("read", "", Some(1), "a", Read, 100, Err(Denial::Expired)),
            ("read", "", Some(2), "a", Read, 100, Err(Denial::Expired)),
        ];
        for (scope, prefix, bucket, key, access, now, want) in cases {
            let got = token(scope, prefix).rights.check(*bucket, key, *access, *now);
            assert_eq!(&got, want, "{scope} {prefix:?} {bucket:?} {key} {access:?} {now}");
        }
        let mut revoked = token("admin", "");
        revoked.rights.revoked_at = Some(1);
        assert_eq!(revoked.rights.check(Some(1), "a", Access::Read, 0), Err(Denial::Revoked));
        let mut forever = token("read", "");
        forever.rights.expires_at = None;
        assert_eq!(forever.rights.check(Some(1), "a", Access::Read, i64::MAX), Ok(()));
    }

    proptest::proptest! {
        /// The range-wise check accepts exactly the bytes the plain definition does.
        #[test]
        fn the_set_check_is_letters_digits_and_the_extras(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..80),
            extra in proptest::collection::vec(proptest::num::u8::ANY, 0..4),
        ) {
            let plain = bytes.iter().all(|b| b.is_ascii_alphanumeric() || extra.contains(b));
            proptest::prop_assert_eq!(all_alphanumeric_or(&bytes, &extra), plain);
        }
    }

    #[test]
    fn every_byte_is_checked_by_the_set_check() {
        for b in 0..=u8::MAX {
            let one = [b'a', b, b'Z'];
            assert_eq!(all_alphanumeric_or(&one, b"-._~+/"), b.is_ascii_alphanumeric() || b"-._~+/".contains(&b));
        }
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(parse_bearer(b"Bearer abc"), Some("abc"));
        assert_eq!(parse_bearer(b"bEaReR  abc=="), Some("abc=="));
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer ", b"Bearer a b", b"Bearerabc", b"Bearer \xff", b"Bearer ="]
        {
            assert_eq!(parse_bearer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
        // A token of ours takes the layout check alone: it must accept only what the b64token check accepts.
        let ours = token::generate().token;
        assert_eq!(parse_bearer(format!("Bearer {ours}").as_bytes()), Some(ours.as_str()));
        for b in 0..=255u8 {
            let mut one = ours.clone().into_bytes();
            *one.last_mut().unwrap() = b;
            if token::well_formed(&one) {
                assert!(all_alphanumeric_or(&one, b"-._~+/"), "{b:#x}");
            }
        }
    }

    #[test]
    fn credentials_are_single_and_unambiguous() {
        let mut h = HeaderMap::new();
        assert_eq!(credentials(&h, None).unwrap(), Credentials::Anonymous);
        h.append(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(credentials(&h, None).unwrap(), Credentials::Bearer("x"));
        let signed = Some("bg-expires=1&bg-key=k&bg-sig=s");
        assert!(matches!(credentials(&h, signed), Err(AuthError::BadRequest(_))));
        h.append(header::AUTHORIZATION, "Bearer y".parse().unwrap());
        assert!(matches!(credentials(&h, None), Err(AuthError::BadRequest(_))));
        let h = HeaderMap::new();
        assert!(matches!(credentials(&h, signed).unwrap(), Credentials::Presigned(_)));
        let mut malformed = HeaderMap::new();
        malformed.append(header::AUTHORIZATION, "Basic x".parse().unwrap());
        assert_eq!(credentials(&malformed, None).unwrap_err().reason(), Some("malformed"));
        assert_eq!(presigned(Some("bg-expires=1&bg-expires=2")).unwrap_err().reason(), Some("malformed"));
        assert!(matches!(presigned(Some("response-content-type=")), Err(AuthError::BadRequest(_))));
    }

    /// The lookup, in memory: the decisions are tested without a database or a server.
    #[derive(Default)]
    struct MemoryLookup {
        tokens: HashMap<String, Arc<TokenRecord>>,
        keys: HashMap<String, Arc<SigningKey>>,
        revoked: HashSet<String>,
        s3_keys: HashMap<String, Arc<S3KeyRecord>>,
    }

    impl CredentialLookup for MemoryLookup {
        fn token<'a>(
            &'a self,
            id: &'a str,
        ) -> impl Future<Output = Result<Option<Arc<TokenRecord>>, MetadataError>> + Send + 'a {
            std::future::ready(Ok(self.tokens.get(id).cloned()))
        }

        fn signing_key<'a>(
            &'a self,
            id: &'a str,
        ) -> impl Future<Output = Result<Option<Arc<SigningKey>>, MetadataError>> + Send + 'a {
            std::future::ready(Ok(self.keys.get(id).cloned()))
        }

        fn signature_revoked<'a>(
            &'a self,
            signature: &'a str,
        ) -> impl Future<Output = Result<bool, MetadataError>> + Send + 'a {
            std::future::ready(Ok(self.revoked.contains(signature)))
        }

        fn s3_key<'a>(
            &'a self,
            id: &'a str,
        ) -> impl Future<Output = Result<Option<Arc<S3KeyRecord>>, MetadataError>> + Send + 'a {
            std::future::ready(Ok(self.s3_keys.get(id).cloned()))
        }
    }

    const NOW: i64 = 1_000_000;
    const SECRET: [u8; 32] = [7; 32];

    struct World {
        auth: Authorizer<MemoryLookup>,
        /// Presented tokens by name: read, write, admin, revoked, expired (all for bucket 1, `priv`).
        tokens: HashMap<&'static str, String>,
        private: Arc<Bucket>,
        public: Arc<Bucket>,
    }

    fn world() -> World {
        let mut lookup = MemoryLookup::default();
        let mut tokens = HashMap::new();
        for (name, scope, revoked_at, expires_at) in [
            ("read", "read", None, None),
            ("write", "write", None, None),
            ("admin", "admin", None, Some(NOW + 10)),
            ("revoked", "admin", Some(NOW - 1), None),
            ("expired", "admin", None, Some(NOW)),
        ] {
            let new = token::generate();
            let record = TokenRecord {
                id: new.id.clone(),
                secret_hash: new.secret_hash.to_vec(),
                rights: Rights {
                    expires_at,
                    revoked_at,
                    ..Rights::whole_bucket(1, "priv", Scope::parse(scope).expect("a known scope"))
                },
            };
            lookup.tokens.insert(new.id, Arc::new(record));
            tokens.insert(name, new.token);
        }
        for (id, retired_at) in [("k1", None), ("k2", Some(NOW - 1))] {
            let key = SigningKey { id: id.into(), secret: SECRET.to_vec(), created_at: 0, retired_at };
            lookup.keys.insert(id.into(), Arc::new(key));
        }
        lookup.revoked.insert(sign("priv", "a", NOW + 60, "k1", Some("inline")).signature);
        let bucket = |id, name: &str, public| {
            let (default_cache_control, cors, website) = (None, None, crate::names::Website::NONE);
            Arc::new(Bucket { id, name: name.into(), public, created_at: 0, default_cache_control, cors, website })
        };
        World {
            auth: Authorizer::new(lookup, Duration::from_secs(3600)).with_clock(|| NOW),
            tokens,
            private: bucket(1, "priv", false),
            public: bucket(2, "pub", true),
        }
    }

    fn sign(bucket: &str, key: &str, expires: i64, key_id: &str, disposition: Option<&str>) -> PresignParams {
        let fields = SignedFields { method: "GET", bucket, key, expires, key_id, response_disposition: disposition };
        let signature = presign::sign(&SECRET, &fields);
        PresignParams {
            expires,
            key_id: key_id.into(),
            signature,
            response_disposition: disposition.map(str::to_owned),
        }
    }

    use presign::SignedFields;

    fn name(s: &str) -> BucketName {
        BucketName::parse(s).unwrap()
    }

    fn key(s: &str) -> ObjectKey {
        ObjectKey::parse(s).unwrap()
    }

    /// What a refusal looks like from outside: its metric label, or the kind of non-refusal.
    fn outcome<T>(r: Result<T, AuthError>) -> Result<T, String> {
        r.map_err(|e| match e.reason() {
            Some(reason) => reason.to_owned(),
            None => format!("{e:?}"),
        })
    }

    #[tokio::test]
    async fn read_decisions_over_an_in_memory_lookup() {
        let w = world();
        let bearer = |name: &str| Credentials::Bearer(&w.tokens[name]);
        let (private, public) = (Some(&w.private), Some(&w.public));
        let read = async |bucket: &str, b: Option<&Arc<Bucket>>, credentials: Credentials| {
            outcome(w.auth.read(&name(bucket), b, "a", credentials).await)
        };
        let bucket_of = |r: Result<AllowedRead, String>| r.map(|g| (g.bucket.id, g.content_disposition));

        // Anonymous: public is readable, private and absent buckets answer alike.
        assert_eq!(bucket_of(read("pub", public, Credentials::Anonymous).await), Ok((2, None)));
        assert_eq!(bucket_of(read("priv", private, Credentials::Anonymous).await), Err("missing".into()));
        assert_eq!(bucket_of(read("gone", None, Credentials::Anonymous).await), Err("missing".into()));

        // Tokens.
        assert_eq!(bucket_of(read("priv", private, bearer("read")).await), Ok((1, None)));
        assert_eq!(bucket_of(read("gone", None, bearer("read")).await), Err("forbidden".into()));
        assert_eq!(bucket_of(read("priv", private, bearer("revoked")).await), Err("revoked".into()));
        assert_eq!(bucket_of(read("priv", private, bearer("expired")).await), Err("expired".into()));
        // Presented on a public bucket, credentials must still be valid; any live token will do.
        assert_eq!(bucket_of(read("pub", public, bearer("read")).await), Ok((2, None)));
        assert_eq!(bucket_of(read("pub", public, bearer("revoked")).await), Err("revoked".into()));
        let mut wrong_secret = w.tokens["read"].clone();
        let last = wrong_secret.pop().unwrap();
        wrong_secret.push(if last == 'A' { 'B' } else { 'A' });
        let wrong = Credentials::Bearer(&wrong_secret);
        assert_eq!(bucket_of(read("priv", private, wrong).await), Err("unknown_token".into()));
        let unknown_token = token::generate().token;
        let unknown = Credentials::Bearer(&unknown_token);
        assert_eq!(bucket_of(read("priv", private, unknown).await), Err("unknown_token".into()));

        // Signed URLs.
        let signed = |bucket, expires, key_id, d| Credentials::Presigned(sign(bucket, "a", expires, key_id, d));
        let attachment = Some("attachment");
        let grant = read("priv", private, signed("priv", NOW + 60, "k1", attachment)).await;
        assert_eq!(bucket_of(grant), Ok((1, Some("attachment".into()))));
        let grant = read("pub", public, signed("pub", NOW + 60, "k1", attachment)).await;
        assert_eq!(bucket_of(grant), Ok((2, Some("attachment".into()))));
        let cases = [
            ("priv", private, signed("priv", NOW, "k1", None), "signature_expired"),
            ("priv", private, signed("priv", NOW + 3600 + 61, "k1", None), "bad_signature"),
            ("priv", private, signed("priv", NOW + 60, "k9", None), "bad_signature"),
            ("priv", private, signed("priv", NOW + 60, "k2", None), "bad_signature"),
            ("priv", private, signed("pub", NOW + 60, "k1", None), "bad_signature"),
            ("pub", public, signed("priv", NOW + 60, "k1", None), "bad_signature"),
            ("priv", private, signed("priv", NOW + 60, "k1", Some("inline")), "signature_revoked"),
        ];
        for (bucket, b, credentials, want) in cases {
            assert_eq!(bucket_of(read(bucket, b, credentials.clone()).await), Err(want.into()), "{credentials:?}");
        }
        // Within the minute of clock skew allowed beyond the maximum lifetime.
        assert!(read("priv", private, signed("priv", NOW + 3600 + 60, "k1", None)).await.is_ok());
        // A valid signature for a bucket that is gone is a missing object, not a refusal.
        let gone = read("gone", None, signed("gone", NOW + 60, "k1", None)).await;
        assert!(matches!(gone, Err(ref e) if e == "NoSuchBucket"), "{gone:?}");
    }

    #[tokio::test]
    async fn write_and_admin_decisions_over_an_in_memory_lookup() {
        let w = world();
        let bearer = |name: &str| Credentials::Bearer(&w.tokens[name]);
        let b = Some(&*w.private);
        let write = async |b: Option<&Bucket>, credentials| outcome(w.auth.write(b, &key("a"), credentials).await);
        assert_eq!(write(b, bearer("write")).await, Ok(()));
        assert_eq!(write(b, bearer("admin")).await, Ok(()));
        assert_eq!(write(b, bearer("read")).await, Err("forbidden".into()));
        assert_eq!(write(None, bearer("write")).await, Err("forbidden".into()));
        assert_eq!(write(b, bearer("revoked")).await, Err("revoked".into()));
        assert_eq!(write(b, Credentials::Anonymous).await, Err("missing".into()));
        let signed = Credentials::Presigned(sign("priv", "a", NOW + 60, "k1", None));
        assert_eq!(write(b, signed).await, Err("missing".into()), "a signed URL never writes");

        let admin = async |credentials| outcome(w.auth.admin(credentials).await).map(|t| t.rights.grants[0].scope);
        assert_eq!(admin(bearer("admin")).await, Ok(Scope::Admin));
        assert_eq!(admin(bearer("write")).await, Err("forbidden".into()));
        assert_eq!(admin(bearer("expired")).await, Err("expired".into()));
        assert_eq!(admin(Credentials::Anonymous).await, Err("missing".into()));
    }

    /// The example requests of AWS's SigV4 documentation for S3 ("Examples: Signature calculations",
    /// "Authenticating requests: using query parameters"), signed by AWS: our code does not sign its own tests.
    const AWS_ID: &str = "AKIAIOSFODNN7EXAMPLE";
    const AWS_SECRET: &str = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
    /// 2013-05-24T00:00:00Z, the examples' time.
    const AWS_NOW: i64 = 1_369_353_600;
    const DAY: i64 = 24 * 3600;

    fn aws_header_request() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "examplebucket.s3.amazonaws.com".parse().unwrap());
        h.insert(header::RANGE, "bytes=0-9".parse().unwrap());
        h.insert(
            "x-amz-content-sha256",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".parse().unwrap(),
        );
        h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        h.insert(
            header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request,\
             SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,\
             Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
                .parse()
                .unwrap(),
        );
        h
    }

    const AWS_PRESIGNED_QUERY: &str = "X-Amz-Algorithm=AWS4-HMAC-SHA256\
        &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20130524T000000Z\
        &X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
        &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404";

    fn s3_key_record(bucket_id: i64, prefix: &str, scope: Scope, secret: &str) -> S3KeyRecord {
        S3KeyRecord {
            id: AWS_ID.into(),
            secret: secret.into(),
            rights: Rights::prefixed(bucket_id, "priv", scope, prefix.into()),
        }
    }

    fn s3_authorizer(key: Option<S3KeyRecord>, clock: fn() -> i64, max_lifetime: u64) -> Authorizer<MemoryLookup> {
        let mut lookup = MemoryLookup::default();
        if let Some(key) = key {
            lookup.s3_keys.insert(key.id.clone(), Arc::new(key));
        }
        Authorizer::new(lookup, Duration::from_secs(max_lifetime)).with_clock(clock)
    }

    #[tokio::test]
    async fn s3_decisions_over_an_in_memory_lookup() {
        let w = world();
        let (private, public) = (Some(&w.private), Some(&w.public));
        let headers = aws_header_request();
        let header_signed = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &headers };
        let host_only = {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, "examplebucket.s3.amazonaws.com".parse().unwrap());
            h
        };
        let presigned =
            RequestParts { method: "GET", path: "/test.txt", query: Some(AWS_PRESIGNED_QUERY), headers: &host_only };
        let unsigned = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &host_only };
        let object = key("test.txt");
        let good = || Some(s3_key_record(1, "", Scope::Read, AWS_SECRET));
        let s3 = async |auth: &Authorizer<MemoryLookup>, request, target, access| {
            auth.s3(request, target, access).await.map(|g| g.presigned).map_err(|e| match e {
                AuthError::SigV4 { error, .. } => error.code().to_owned(),
                AuthError::InvalidAccessKeyId { reason } => format!("InvalidAccessKeyId:{}", reason.label()),
                other => format!("{other:?}"),
            })
        };
        let auth = s3_authorizer(good(), || AWS_NOW, 7 * DAY as u64);
        let target = S3Target::Object(private, &object);
        assert_eq!(s3(&auth, &header_signed, target, Access::Read).await, Ok(false));
        assert_eq!(s3(&auth, &presigned, target, Access::Read).await, Ok(true));
        assert_eq!(
            s3(&auth, &unsigned, target, Access::Read).await,
            Err("Unauthorized { reason: Missing, message: \"Access Denied\" }".into())
        );
        assert_eq!(s3(&auth, &header_signed, S3Target::Service, Access::Read).await, Ok(false));
        assert_eq!(s3(&auth, &header_signed, S3Target::Bucket(private), Access::Read).await, Ok(false));
        // Token rules: scope, bucket (absent or another), prefix; a public bucket is readable by any live key.
        assert_eq!(s3(&auth, &header_signed, target, Access::Write).await, Err("Forbidden".into()));
        assert_eq!(
            s3(&auth, &header_signed, S3Target::Object(None, &object), Access::Read).await,
            Err("Forbidden".into())
        );
        assert_eq!(s3(&auth, &header_signed, S3Target::Bucket(public), Access::Read).await, Err("Forbidden".into()));
        assert_eq!(s3(&auth, &header_signed, S3Target::Object(public, &object), Access::Read).await, Ok(false));
        let prefixed =
            s3_authorizer(Some(s3_key_record(1, "dir/", Scope::Read, AWS_SECRET)), || AWS_NOW, 7 * DAY as u64);
        assert_eq!(s3(&prefixed, &header_signed, target, Access::Read).await, Err("Forbidden".into()));
        assert_eq!(s3(&prefixed, &header_signed, S3Target::Bucket(private), Access::Read).await, Ok(false));
        // Credentials: unknown key, wrong secret, revoked or expired (told only with a valid signature).
        let unknown = s3_authorizer(None, || AWS_NOW, 7 * DAY as u64);
        assert_eq!(
            s3(&unknown, &header_signed, target, Access::Read).await,
            Err("InvalidAccessKeyId:unknown_token".into())
        );
        let wrong =
            s3_authorizer(Some(s3_key_record(1, "", Scope::Read, "not the secret")), || AWS_NOW, 7 * DAY as u64);
        assert_eq!(s3(&wrong, &header_signed, target, Access::Read).await, Err("SignatureDoesNotMatch".into()));
        assert_eq!(s3(&wrong, &presigned, target, Access::Read).await, Err("SignatureDoesNotMatch".into()));
        let mut revoked = s3_key_record(1, "", Scope::Read, AWS_SECRET);
        revoked.rights.revoked_at = Some(1);
        let revoked = s3_authorizer(Some(revoked), || AWS_NOW, 7 * DAY as u64);
        assert_eq!(
            s3(&revoked, &header_signed, S3Target::Service, Access::Read).await,
            Err("InvalidAccessKeyId:revoked".into())
        );
        let mut expired = s3_key_record(1, "", Scope::Read, AWS_SECRET);
        expired.rights.expires_at = Some(AWS_NOW);
        let expired = s3_authorizer(Some(expired), || AWS_NOW, 7 * DAY as u64);
        assert_eq!(s3(&expired, &header_signed, target, Access::Read).await, Err("AccessDenied".into()));
        // Time: skew beyond 15 minutes, a presign past its expiry or beyond our maximum lifetime.
        let late = s3_authorizer(good(), || AWS_NOW + 16 * 60, 7 * DAY as u64);
        assert_eq!(s3(&late, &header_signed, target, Access::Read).await, Err("RequestTimeTooSkewed".into()));
        assert_eq!(s3(&late, &presigned, target, Access::Read).await, Ok(true), "a presign lives its X-Amz-Expires");
        let next_day = s3_authorizer(good(), || AWS_NOW + DAY + 1, 7 * DAY as u64);
        assert_eq!(s3(&next_day, &presigned, target, Access::Read).await, Err("AccessDenied".into()));
        let short_max = s3_authorizer(good(), || AWS_NOW, 3600);
        assert_eq!(
            s3(&short_max, &presigned, target, Access::Read).await,
            Err("AuthorizationQueryParametersError".into())
        );
        // Another region than ours.
        let elsewhere = s3_authorizer(good(), || AWS_NOW, 7 * DAY as u64).with_s3_region("eu-west-1");
        assert_eq!(
            s3(&elsewhere, &header_signed, target, Access::Read).await,
            Err("AuthorizationHeaderMalformed".into())
        );
    }

    /// An S3 GetObject/HeadObject: unsigned is anonymous on a public bucket only; private and absent buckets
    /// refuse it alike; credentials presented on a public bucket are still checked.
    #[tokio::test]
    async fn unsigned_s3_object_reads_are_anonymous_on_public_buckets_only() {
        let w = world();
        let (private, public) = (Some(&w.private), Some(&w.public));
        let host_only = HeaderMap::from_iter([(header::HOST, "h".parse().unwrap())]);
        let unsigned = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &host_only };
        let headers = aws_header_request();
        let signed = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &headers };
        let mut bearer = host_only.clone();
        bearer.insert(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        let bearer = RequestParts { method: "GET", path: "/test.txt", query: None, headers: &bearer };
        let object = key("test.txt");
        let auth = s3_authorizer(Some(s3_key_record(1, "", Scope::Read, AWS_SECRET)), || AWS_NOW, 7 * DAY as u64);
        let read = async |request, bucket| match auth.s3_object_read(request, bucket, &object).await {
            Ok(allowed) => Ok(allowed.map(|a| a.key.id.clone())),
            Err(e) => Err(format!("{e:?}")),
        };
        assert_eq!(read(&unsigned, public).await, Ok(None));
        let refused = Err("Unauthorized { reason: Missing, message: \"Access Denied\" }".to_owned());
        assert_eq!(read(&unsigned, private).await, refused);
        assert_eq!(read(&unsigned, None).await, refused);
        assert_eq!(read(&bearer, public).await, refused, "another scheme is not anonymous");
        assert_eq!(read(&signed, public).await, Ok(Some(AWS_ID.into())));
        let presigned_badly = RequestParts { query: Some("X-Amz-Algorithm=AWS4-HMAC-SHA256"), ..unsigned };
        assert!(read(&presigned_badly, public).await.is_err(), "a broken presign is not anonymous");
    }

    /// The labels of `blobgate_auth_failures_total` are exactly the ones before `AuthError` existed.
    #[test]
    fn failure_labels_are_the_metric_labels() {
        use FailureReason::*;
        let all = [Missing, Malformed, UnknownToken, Revoked, Expired, Forbidden, BadSignature, SignatureExpired];
        let labels: Vec<_> = all.iter().chain([&SignatureRevoked]).map(|r| r.label()).collect();
        assert_eq!(
            labels,
            [
                "missing",
                "malformed",
                "unknown_token",
                "revoked",
                "expired",
                "forbidden",
                "bad_signature",
                "signature_expired",
                "signature_revoked"
            ]
        );
        assert_eq!(AuthError::Forbidden.reason(), Some("forbidden"));
        assert_eq!(AuthError::BadRequest("x").reason(), None);
        assert_eq!(AuthError::NoSuchBucket.reason(), None);
    }
}
