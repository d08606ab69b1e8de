//! CORS on the data listener, around the object handler: preflight `OPTIONS` answers, and the CORS headers of
//! actual responses (every status, errors included). The rule is the bucket's (`header_values::cors`), read from
//! the catalog, so a `bucket cors set` is live at the next request. S3 answers get the same headers, on either
//! listener ([`add_to_s3_answer`], called by `http::dispatch_s3`).
//!
//! - A request without `Origin` goes straight to the object handler: no lookup, no header, no allocation here.
//! - A preflight (`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered from the bucket's rule
//!   alone, before and without any object lookup, so it never tells whether an object exists; nor does it need
//!   credentials (browsers send none on a preflight). Allowed: 204 with the `Access-Control-*` headers. Not
//!   allowed (origin, method, no rule, unknown bucket): the same 204 without CORS headers, which a browser refuses;
//!   a 403 would say no more and would differ between a known and an unknown bucket.
//! - An actual request that passed authorisation gets the handler's response plus the rule's headers, which
//!   depend on the bucket and the origin only, never on the object: a 404 and a 200 differ to a script only as
//!   they do to anyone with the same credentials. A request refused before authorisation (401, 403, a bad path,
//!   a stale replica's 503) gets none, nor `Vary: Origin`: otherwise a private bucket with a rule would answer
//!   differently from an absent one, and tell an unauthenticated caller that it exists.
//! - What a preflight reveals is by design: the Fetch standard sends no credentials with it, so it can only be
//!   answered from the bucket's rule, and an allowed origin learns that a bucket by that name has a rule for it.

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::header::{self, HeaderValue};
use http::{Method, StatusCode};

use super::DataState;
use super::NativeRead;
use super::object;
use crate::driver::Answer;
use crate::header_values::cors::CorsPolicy;
use crate::header_values::fields::{self, FieldName, Fields};
use crate::names::parse_data_path;

const ALLOW: HeaderValue = HeaderValue::from_static("GET, HEAD, OPTIONS");
static ACCESS_CONTROL_REQUEST_HEADERS: FieldName = FieldName::other(header::ACCESS_CONTROL_REQUEST_HEADERS);

pub async fn serve(app: &DataState, read: NativeRead<'_>) -> Answer {
    let head = read.head;
    let Some(origin) = head.fields.header_value(&fields::ORIGIN) else {
        return match object::authorise_and_serve(app, read).await {
            Ok(answer) => answer.unwrap_or_else(|e| e.into_response().into()),
            Err(refusal) => object::refusal(refusal, &head.fields, read.path).into(),
        };
    };
    let policy = bucket_policy(app, read.path).await;
    if head.method == Method::OPTIONS && head.fields.contains(&fields::ACCESS_CONTROL_REQUEST_METHOD) {
        return preflight(policy.as_deref(), &origin, &head.fields).into();
    }
    let credentialed = is_credentialed(&head.fields);
    match object::authorise_and_serve(app, read).await {
        // Refused before authorisation: no CORS headers and no `Vary: Origin`, which only a bucket with a rule
        // would get, so an existing private bucket answers exactly as an absent one.
        Err(refusal) => object::refusal(refusal, &head.fields, read.path).into(),
        Ok(answer) => {
            let mut answer = answer.unwrap_or_else(|e| e.into_response().into());
            if let Some(policy) = policy {
                policy.add_actual_headers(&origin, credentialed, answer.headers_mut());
            }
            answer
        }
    }
}

/// The answer to a preflight, native or S3 ("OPTIONS object"): 204, with the `Access-Control-*` headers when the
/// bucket's rule allows the origin, the method and every requested header, and without them otherwise (no rule,
/// no bucket), which a browser refuses.
pub fn preflight(policy: Option<&CorsPolicy>, origin: &HeaderValue, headers: &dyn Fields) -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response.headers_mut().insert(header::ALLOW, ALLOW);
    if let Some(policy) = policy {
        policy.add_preflight_headers(
            origin,
            headers.header_value(&fields::ACCESS_CONTROL_REQUEST_METHOD).as_ref(),
            headers.header_value(&ACCESS_CONTROL_REQUEST_HEADERS).as_ref(),
            response.headers_mut(),
        );
    }
    response
}

/// The rule's headers on an S3 answer to a request with `Origin` for `bucket`, as on a native one: only on answers
/// given after authorisation (success, 304, and the refusals only a reader of the bucket gets: 404, 409, 412,
/// 416), so that a bucket with a rule answers an unauthorised caller exactly as an absent one.
pub async fn add_to_s3_answer(
    app: &DataState,
    bucket: &crate::names::BucketName,
    origin: &HeaderValue,
    credentialed: bool,
    response: &mut Response,
) {
    let status = response.status().as_u16();
    if !(status < 400 || matches!(status, 404 | 409 | 412 | 416)) {
        return;
    }
    let Some(policy) = policy_of(app, bucket).await else { return };
    policy.add_actual_headers(origin, credentialed, response.headers_mut());
}

/// Whether a request carries credentials a browser would call so: then `*` is never the answer.
pub fn is_credentialed(headers: &dyn Fields) -> bool {
    headers.contains(&fields::AUTHORIZATION) || headers.contains(&fields::COOKIE)
}

/// `Vary: Origin` on a bucket's 200, 206 and 304 whether or not the request had an `Origin`, when the bucket has a
/// rule: a shared cache that stored an answer without CORS headers must not hand it to a browser's request. Called
/// by the object handler, which has the bucket already; a bucket without a rule costs one branch.
pub fn vary_on_origin(bucket: &crate::store::Bucket, headers: &mut http::HeaderMap) {
    if bucket.cors.is_some() {
        crate::header_values::add_vary(headers, "Origin");
    }
}

/// The rule of the bucket the path names (its root included: a static site's home); none for a bad path or an
/// unknown bucket (which then look alike).
async fn bucket_policy(app: &DataState, path: &str) -> Option<std::sync::Arc<CorsPolicy>> {
    let (bucket, _key) = parse_data_path(path).ok()?;
    policy_of(app, &bucket).await
}

/// The rule of `bucket`; none for an unknown bucket (or a failed lookup, which then looks alike).
pub async fn policy_of(app: &DataState, bucket: &crate::names::BucketName) -> Option<std::sync::Arc<CorsPolicy>> {
    app.catalog.bucket(bucket.as_str()).await.ok().flatten()?.cors.clone()
}
