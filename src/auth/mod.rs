//! Who may read or write what. Decisions happen *before* an object is looked up, so that callers without
//! access get the same answer for present and absent keys (and absent buckets).
//!
//! - no credentials on a private (or absent) bucket → 401 with `WWW-Authenticate: Bearer`;
//! - malformed, unknown, expired or revoked credentials → 401;
//! - valid credentials that do not cover this bucket, prefix or operation → 403;
//! - public buckets are readable by anyone; credentials presented there must still be valid (401 otherwise);
//! - writes always need a `write` or `admin` token.
//!
//! `token` and `presign` are pure; this module adds the lookups and the ordering.

pub mod presign;
pub mod sealing;
pub mod token;

use http::Uri;
use std::sync::Arc;

use http::header::{self, HeaderMap};

use crate::http::AppState;
use crate::http::error::ApiError;
use crate::names::ObjectKey;
use crate::store::{Bucket, TokenRecord, unix_now};
use presign::{PresignParams, QueryError};
use token::Scope;

/// The operation being authorised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Credentials found on a request, before they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    Anonymous,
    Bearer(String),
    Presigned(PresignParams),
}

/// What a successful read authorisation allows beyond the object itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadGrant {
    pub bucket: Arc<Bucket>,
    /// A `response-content-disposition` that a valid signature covered.
    pub content_disposition: Option<String>,
}

/// Finds the credentials of a request. RFC 9110 §11.6.2 allows one Authorization field; several are refused
/// (400), as is a request that carries both a bearer token and a signature.
pub fn credentials(headers: &HeaderMap, uri: &Uri) -> Result<Credentials, ApiError> {
    let mut fields = headers.get_all(header::AUTHORIZATION).iter();
    let bearer = match (fields.next(), fields.next()) {
        (None, _) => None,
        (Some(_), Some(_)) => return Err(ApiError::BadRequest("repeated Authorization header".into())),
        (Some(value), None) => Some(parse_bearer(value.as_bytes()).ok_or_else(|| {
            crate::metrics::auth_failure("malformed");
            ApiError::Unauthorized("malformed Authorization header; expected 'Bearer <token>'")
        })?),
    };
    let signed = presign::parse_query(uri.query()).map_err(|e| match e {
        QueryError::Credentials(why) => {
            crate::metrics::auth_failure("malformed");
            ApiError::Unauthorized(why)
        }
        QueryError::Override(why) => ApiError::BadRequest(why.into()),
    })?;
    match (bearer, signed) {
        (Some(_), Some(_)) => Err(ApiError::BadRequest("send a bearer token or a signed URL, not both".into())),
        (Some(token), None) => Ok(Credentials::Bearer(token)),
        (None, Some(params)) => Ok(Credentials::Presigned(params)),
        (None, None) => Ok(Credentials::Anonymous),
    }
}

/// RFC 9110 §11.1: the scheme is case-insensitive; RFC 6750 §2.1: `Bearer 1*SP b64token`.
fn parse_bearer(value: &[u8]) -> Option<String> {
    let value = std::str::from_utf8(value).ok()?;
    let (scheme, rest) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = rest.trim_start_matches(' ');
    let b64token = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/".contains(&b);
    let body = token.trim_end_matches('=');
    (!body.is_empty() && body.bytes().all(b64token)).then(|| token.to_owned())
}

/// Why a token does not grant an access. Pure, so the whole matrix is unit-tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denial {
    Revoked,
    Expired,
    /// Valid token, but not for this bucket, prefix or operation.
    Forbidden,
}

/// Whether a token may be used at all at `now`: not revoked, not expired.
pub fn check_liveness(token: &TokenRecord, now: i64) -> Result<(), Denial> {
    if token.revoked_at.is_some() {
        return Err(Denial::Revoked);
    }
    if token.expires_at.is_some_and(|at| now >= at) {
        return Err(Denial::Expired);
    }
    Ok(())
}

pub fn check_token(
    token: &TokenRecord,
    bucket_id: Option<i64>,
    key: &str,
    access: Access,
    now: i64,
) -> Result<(), Denial> {
    check_liveness(token, now)?;
    if bucket_id != Some(token.bucket_id) || !key.starts_with(&token.prefix) {
        return Err(Denial::Forbidden);
    }
    let needed = match access {
        Access::Read => Scope::Read,
        Access::Write => Scope::Write,
    };
    if token.scope >= needed { Ok(()) } else { Err(Denial::Forbidden) }
}

/// Authorises a GET/HEAD of `bucket/key`. `bucket` is `None` when no such bucket exists; that case answers
/// exactly like a private bucket the caller may not read.
pub async fn authorize_read(
    app: &AppState,
    bucket: Option<&Arc<Bucket>>,
    key: &ObjectKey,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<ReadGrant, ApiError> {
    let credentials = credentials(headers, uri)?;
    if let Some(b) = bucket.filter(|b| b.public) {
        // Public buckets need no credentials, but credentials that are presented must be valid (as in S3): a
        // revoked token or a tampered link is refused rather than silently treated as anonymous.
        let content_disposition = match credentials {
            Credentials::Anonymous => None,
            Credentials::Bearer(token) => {
                live_token(app, &token).await?;
                None
            }
            Credentials::Presigned(params) => {
                verify_presigned(app, &params, b.name.as_str(), key).await?;
                params.response_disposition
            }
        };
        return Ok(ReadGrant { bucket: b.clone(), content_disposition });
    }
    match credentials {
        Credentials::Anonymous => {
            crate::metrics::auth_failure("missing");
            Err(ApiError::Unauthorized("credentials required"))
        }
        Credentials::Bearer(token) => {
            authorize_token(app, &token, bucket.as_ref().map(|b| b.id), key, Access::Read).await?;
            let bucket = bucket.expect("a token only passes for an existing bucket").clone();
            Ok(ReadGrant { bucket, content_disposition: None })
        }
        Credentials::Presigned(params) => {
            let bucket_name = uri.path().trim_start_matches('/').split('/').next().unwrap_or_default();
            verify_presigned(app, &params, bucket_name, key).await?;
            // A valid signature for a bucket that does not exist (any more) is simply a missing object.
            let bucket = bucket.ok_or(ApiError::NotFound)?.clone();
            Ok(ReadGrant { bucket, content_disposition: params.response_disposition })
        }
    }
}

/// Authorises an upload or delete on the admin listener: a bearer token with `write` or `admin` scope.
pub async fn authorize_write(
    app: &AppState,
    bucket: Option<&Bucket>,
    key: &ObjectKey,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    match credentials(headers, &Uri::from_static("/"))? {
        Credentials::Bearer(token) => authorize_token(app, &token, bucket.map(|b| b.id), key, Access::Write).await,
        _ => {
            crate::metrics::auth_failure("missing");
            Err(ApiError::Unauthorized("a bearer token with write scope is required"))
        }
    }
}

async fn authorize_token(
    app: &AppState,
    presented: &str,
    bucket_id: Option<i64>,
    key: &ObjectKey,
    access: Access,
) -> Result<(), ApiError> {
    let record = known_token(app, presented).await?;
    check_token(&record, bucket_id, key.as_str(), access, unix_now()).map_err(denied)
}

/// The token presented as `Authorization: Bearer`, if it exists and is neither revoked nor expired.
async fn live_token(app: &AppState, presented: &str) -> Result<Arc<TokenRecord>, ApiError> {
    let record = known_token(app, presented).await?;
    check_liveness(&record, unix_now()).map_err(denied)?;
    Ok(record)
}

/// The stored token whose hash matches the presented one, whatever its state.
async fn known_token(app: &AppState, presented: &str) -> Result<Arc<TokenRecord>, ApiError> {
    let record = match token::token_id(presented) {
        Some(id) => app.catalog.token(id).await?,
        None => None,
    };
    // Hash even when nothing was found, so unknown ids and wrong secrets take the same time.
    let unknown = [0u8; 32];
    let hash_matches = token::matches(presented, record.as_ref().map_or(&unknown[..], |r| &r.secret_hash));
    let Some(record) = record.filter(|_| hash_matches) else {
        crate::metrics::auth_failure("unknown_token");
        return Err(ApiError::Unauthorized("invalid token"));
    };
    Ok(record)
}

fn denied(denial: Denial) -> ApiError {
    match denial {
        Denial::Revoked => {
            crate::metrics::auth_failure("revoked");
            ApiError::Unauthorized("token revoked")
        }
        Denial::Expired => {
            crate::metrics::auth_failure("expired");
            ApiError::Unauthorized("token expired")
        }
        Denial::Forbidden => {
            crate::metrics::auth_failure("forbidden");
            ApiError::Forbidden
        }
    }
}

/// An `admin`-scope bearer token, for management endpoints; callers limit what they show to its bucket and prefix.
pub async fn admin_token(app: &AppState, headers: &HeaderMap) -> Result<Arc<TokenRecord>, ApiError> {
    let Credentials::Bearer(presented) = credentials(headers, &Uri::from_static("/"))? else {
        crate::metrics::auth_failure("missing");
        return Err(ApiError::Unauthorized("a bearer token with admin scope is required"));
    };
    let record = live_token(app, &presented).await?;
    if record.scope != Scope::Admin {
        return Err(denied(Denial::Forbidden));
    }
    Ok(record)
}

async fn verify_presigned(
    app: &AppState,
    params: &PresignParams,
    bucket: &str,
    key: &ObjectKey,
) -> Result<(), ApiError> {
    let now = unix_now();
    let max_lifetime = app.settings.auth.presign_max_lifetime.as_secs() as i64;
    let fail = |reason: &'static str, message: &'static str| {
        crate::metrics::auth_failure(reason);
        Err(ApiError::Unauthorized(message))
    };
    if now >= params.expires {
        return fail("signature_expired", "signed URL expired");
    }
    // Allow a minute of clock skew between the signing host and this one.
    if params.expires > now.saturating_add(max_lifetime).saturating_add(60) {
        return fail("bad_signature", "signed URL lives longer than the configured maximum");
    }
    let Some(signing_key) = app.catalog.signing_key(&params.key_id).await? else {
        return fail("bad_signature", "invalid signed URL");
    };
    if signing_key.retired_at.is_some() {
        return fail("bad_signature", "signed URL's key has been retired");
    }
    if !params.verify(&signing_key.secret, bucket, key.as_str()) {
        return fail("bad_signature", "invalid signed URL");
    }
    if app.catalog.signature_revoked(&params.signature).await? {
        return fail("signature_revoked", "signed URL revoked");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use presign::SignedFields;

    fn token(scope: &str, prefix: &str) -> TokenRecord {
        TokenRecord {
            id: "0123456789ab".into(),
            secret_hash: vec![0; 32],
            bucket_id: 1,
            bucket_name: "bkt".into(),
            prefix: prefix.into(),
            scope: Scope::parse(scope).expect("a known scope"),
            created_at: 0,
            expires_at: Some(100),
            revoked_at: None,
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
            ("read", "", Some(1), "a", Read, 100, Err(Denial::Expired)),
            ("read", "", Some(2), "a", Read, 100, Err(Denial::Expired)),
        ];
        for (scope, prefix, bucket, key, access, now, want) in cases {
            let got = check_token(&token(scope, prefix), *bucket, key, *access, *now);
            assert_eq!(&got, want, "{scope} {prefix:?} {bucket:?} {key} {access:?} {now}");
        }
        let mut revoked = token("admin", "");
        revoked.revoked_at = Some(1);
        assert_eq!(check_token(&revoked, Some(1), "a", Access::Read, 0), Err(Denial::Revoked));
        let mut forever = token("read", "");
        forever.expires_at = None;
        assert_eq!(check_token(&forever, Some(1), "a", Access::Read, i64::MAX), Ok(()));
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(parse_bearer(b"Bearer abc"), Some("abc".into()));
        assert_eq!(parse_bearer(b"bEaReR  abc=="), Some("abc==".into()));
        for bad in [&b"Basic abc"[..], b"Bearer", b"Bearer ", b"Bearer a b", b"Bearerabc", b"Bearer \xff", b"Bearer ="]
        {
            assert_eq!(parse_bearer(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn credentials_are_single_and_unambiguous() {
        let uri: Uri = "/b/k".parse().unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(credentials(&h, &uri).unwrap(), Credentials::Anonymous);
        h.append(header::AUTHORIZATION, "Bearer x".parse().unwrap());
        assert_eq!(credentials(&h, &uri).unwrap(), Credentials::Bearer("x".into()));
        let signed: Uri = "/b/k?bg-expires=1&bg-key=k&bg-sig=s".parse().unwrap();
        assert!(matches!(credentials(&h, &signed), Err(ApiError::BadRequest(_))));
        h.append(header::AUTHORIZATION, "Bearer y".parse().unwrap());
        assert!(matches!(credentials(&h, &uri), Err(ApiError::BadRequest(_))));
        let h = HeaderMap::new();
        assert!(matches!(credentials(&h, &signed).unwrap(), Credentials::Presigned(_)));
    }

    /// What the server's chain (head parser, one percent-decode, query parsing, HMAC verification) makes of a
    /// request target: `Ok` with the signed fields it verified, or the error it answers.
    fn verified(target: &[u8], secret: &[u8]) -> Result<(String, String, PresignParams), &'static str> {
        use crate::driver::head::{HeadLimits, Parsed, parse_request_head};
        let limits = HeadLimits { max_head_bytes: 8192, max_headers: 16, max_uri_bytes: 4096 };
        let mut raw = b"GET ".to_vec();
        raw.extend_from_slice(target);
        raw.extend_from_slice(b" HTTP/1.1\r\nHost: h\r\n\r\n");
        let Ok(Parsed::Complete(head)) = parse_request_head(&raw, &limits) else { return Err("bad head") };
        let (bucket, key) = crate::names::parse_object_path(head.uri.path()).map_err(|_| "bad path")?;
        match credentials(&head.headers, &head.uri) {
            Ok(Credentials::Presigned(p)) if p.verify(secret, bucket.as_str(), key.as_str()) => {
                Ok((bucket.to_string(), key.to_string(), p))
            }
            Ok(Credentials::Presigned(_)) => Err("signature does not verify"),
            Ok(_) => Err("not signed"),
            Err(ApiError::BadRequest(_)) => Err("400"),
            Err(_) => Err("401"),
        }
    }

    fn signed_target(secret: &[u8], disposition: Option<&str>) -> String {
        let fields = SignedFields {
            method: "GET",
            bucket: "bkt",
            key: "dir/file name+ü.bin",
            expires: 2_000_000_000,
            key_id: "k0a1b2c3d",
            response_disposition: disposition,
        };
        let url = presign::build_url("http://h", &fields, &presign::sign(secret, &fields));
        url.strip_prefix("http://h").unwrap().to_owned()
    }

    /// Every single-byte mutation of a signed URL's request target, with and without a signed override, is
    /// refused by the chain the server runs, unless it is the same request spelled differently (e.g. `%2F` as
    /// `%2f`), which the check confirms by comparing every signed field.
    #[test]
    fn every_single_byte_mutation_of_a_signed_url_is_rejected() {
        let secret = [7u8; 32];
        for disposition in [Some("attachment"), None] {
            let target = signed_target(&secret, disposition);
            let original = verified(target.as_bytes(), &secret).expect("the untouched URL verifies");
            let (mut tried, mut equivalent) = (0, 0);
            for i in 0..target.len() {
                for b in 0..=255u8 {
                    if b == target.as_bytes()[i] {
                        continue;
                    }
                    let mut mutated = target.clone().into_bytes();
                    mutated[i] = b;
                    tried += 1;
                    if let Ok(got) = verified(&mutated, &secret) {
                        let same = got.0 == original.0
                            && got.1 == original.1
                            && got.2.expires == original.2.expires
                            && got.2.key_id == original.2.key_id
                            && got.2.response_disposition == original.2.response_disposition;
                        assert!(same, "mutation at {i} to {b:#04x} was accepted with different fields: {got:?}");
                        equivalent += 1;
                    }
                }
            }
            assert!(tried > 20_000);
            // Only re-spellings of percent-escapes (hex digit case) may pass, and they are the same request.
            let escapes = target.matches('%').count();
            assert!(equivalent <= 2 * escapes, "{equivalent} equivalent mutations for {escapes} escapes");
        }
    }

    /// Whole parameters appended, duplicated, emptied or dropped: none is accepted, and an empty override is a
    /// 400 whether or not the link signed one (the stripped-`attachment` attack of issue 12).
    #[test]
    fn appended_duplicated_and_empty_parameters_of_a_signed_url_are_rejected() {
        let secret = [7u8; 32];
        for disposition in [Some("attachment"), None] {
            let target = signed_target(&secret, disposition);
            assert!(verified(target.as_bytes(), &secret).is_ok());
            let (path, query) = target.split_once('?').unwrap();
            let params: Vec<&str> = query.split('&').collect();
            let mut cases: Vec<(String, Option<&str>)> = Vec::new();
            for name in ["response-content-disposition", "response-content-type", "response-cache-control"] {
                cases.push((format!("{target}&{name}="), Some("400")));
                cases.push((format!("{target}&{name}"), Some("400")));
                cases.push((format!("{path}?{name}=&{query}"), Some("400")));
            }
            for value in ["inline", "attachment", "attachment;%20filename%3D%22x.html%22"] {
                cases.push((format!("{target}&response-content-disposition={value}"), None));
            }
            // Invalid (400), or repeated when the link signed one (401).
            cases.push((format!("{target}&response-content-disposition=attachment;"), None));
            for (i, param) in params.iter().enumerate() {
                let (name, _) = param.split_once('=').unwrap();
                let others = |replacement: Option<String>| {
                    let mut q: Vec<String> = params.iter().map(|p| p.to_string()).collect();
                    match replacement {
                        Some(r) => q[i] = r,
                        None => drop(q.remove(i)),
                    }
                    format!("{path}?{}", q.join("&"))
                };
                cases.push((format!("{target}&{param}"), None));
                cases.push((format!("{path}?{param}&{query}"), None));
                let emptied = if name.starts_with("response-") { Some("400") } else { None };
                cases.push((others(Some(format!("{name}="))), emptied));
                cases.push((others(None), None));
            }
            for (case, want) in &cases {
                let got = verified(case.as_bytes(), &secret);
                assert!(got.is_err(), "{case} was accepted: {got:?}");
                if let Some(want) = want {
                    assert_eq!(got.unwrap_err(), *want, "{case}");
                }
            }
            assert!(cases.len() > 20);
        }
    }
}
