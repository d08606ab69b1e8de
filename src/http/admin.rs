//! The admin listener's routes: liveness (`/healthz`), readiness (`/readyz`), Prometheus metrics, uploads and
//! deletes, and the S3 API (reads and writes). Served by the driver in its admin mode, which streams request
//! bodies to these handlers and sends a GetObject's file regions by sendfile, as on the data listener.

use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use http::{StatusCode, header};

use super::error::ApiError;
use super::{AdminState, Classified};
use crate::metrics::downloads::stats_json;
use crate::s3::operation::{Api, carries_aws_credentials};
use crate::store::StatsOrder;

pub fn admin_router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        // Any other path is a native object path: uploads and deletes (the handlers parse and validate it).
        .fallback(put(native_put).delete(native_delete).get(not_native).head(not_native).post(not_native))
        // Every request is classified once; an S3 one goes to the S3 dispatcher before any route.
        .layer(axum::middleware::from_fn_with_state(state.clone(), s3_first))
        // The driver streams bodies; this only lifts axum's default 2 MB cap so the limit is ours.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(tower::util::MapResponseLayer::new(super::error::log_server_error))
        // No failure log here: `log_server_error` logs a 5xx once, with its cause, and load shedding not at all.
        .layer(tower_http::trace::TraceLayer::new_for_http().make_span_with(request_span).on_failure(()))
        .with_state(state)
}

/// The trace span of an admin request: method, path and the query without credentials (a presigned PUT's
/// signature is valid for days), never the whole URI or any header.
fn request_span(request: &http::Request<Body>) -> tracing::Span {
    let query = request.uri().query().and_then(crate::access_log::redacted_query);
    tracing::debug_span!("request", method = %request.method(), path = request.uri().path(), query)
}

/// The admin listener's dispatch: an S3 request (`s3::operation::classify`) is served here, its reads from the
/// catalog (`s3::serve`, as on the data listener) and its writes by `s3_write`; a native one goes on to the routes.
/// The fixed routes stay the listener's own unless the request carries AWS credentials: a bucket may be named
/// `healthz`, `readyz`, `metrics` or `stats`, and `/stats?prefix=…` is not a listing.
async fn s3_first(
    State(app): State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Classified { api, request } = Classified::new(request, app.data.s3_domain.as_deref());
    let fixed_route = matches!(request.uri().path(), "/healthz" | "/readyz" | "/metrics" | "/stats")
        && !carries_aws_credentials(request.headers(), request.uri().query());
    match api {
        Api::Native => next.run(request).await,
        Api::S3(_) if fixed_route => next.run(request).await,
        Api::S3(call) => super::dispatch_s3(app, call, request).await,
    }
}

async fn native_put(State(app): State<AdminState>, request: axum::extract::Request) -> axum::response::Response {
    let (parts, body) = request.into_parts();
    super::upload::put_object(State(app), parts.uri, parts.headers, Body::new(body)).await
}

async fn native_delete(State(app): State<AdminState>, request: axum::extract::Request) -> axum::response::Response {
    let (parts, _body) = request.into_parts();
    super::upload::delete_object(State(app), parts.uri, parts.headers).await.into_response()
}

/// A native GET, HEAD or POST here: objects are read on the data listener (S3 reads are served above).
async fn not_native() -> axum::response::Response {
    (StatusCode::METHOD_NOT_ALLOWED, [(header::ALLOW, "PUT,DELETE")]).into_response()
}

async fn healthz(State(app): State<AdminState>) -> Result<&'static str, ApiError> {
    if app.ready.load(Ordering::Acquire) { Ok("ok\n") } else { Err(ApiError::NotReady) }
}

/// Readiness, for a load balancer: serving (started, not draining), the database and the object store (if any)
/// answered their last probes, and the caches are within `database.max_staleness` (a replica cut off from the
/// database refuses credentials). It reads flags only, so it answers at once even while either hangs.
async fn readyz(State(app): State<AdminState>) -> Result<&'static str, ApiError> {
    if !app.ready.load(Ordering::Acquire) {
        return Err(ApiError::NotReady);
    }
    if !app.database.is_reachable() || app.data.catalog.freshness() != crate::catalog::Freshness::Fresh {
        return Err(ApiError::DatabaseUnavailable);
    }
    if let Some(cache) = app.data.catalog.blob_cache()
        && !cache.remote().is_reachable()
    {
        let remote = cache.remote();
        return Err(ApiError::BlobStoreUnavailable(format!("{} did not answer the last probe", remote.location())));
    }
    Ok("ok\n")
}

#[derive(Debug, serde::Deserialize)]
struct StatsQuery {
    top: Option<u32>,
    by: Option<String>,
    prefix: Option<String>,
    bucket: Option<String>,
}

/// Per-object download stats for the admin token's bucket (and prefix), as `blobgate stats --json` prints them.
async fn stats(
    State(app): State<AdminState>,
    headers: http::HeaderMap,
    query: Result<axum::extract::Query<StatsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<impl IntoResponse, ApiError> {
    let token = app.data.auth.admin(crate::auth::credentials(&headers, None)?).await?;
    let axum::extract::Query(query) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    let order = match query.by.as_deref() {
        None => StatsOrder::default(),
        Some(by) => StatsOrder::parse(by).ok_or_else(|| ApiError::BadRequest("by must be bytes or requests".into()))?,
    };
    // One of the token's admin grants: the one naming `?bucket=`, or its only one. A prefix only narrows it.
    let mut admin = token.rights.grants.iter().filter(|g| g.scope == crate::store::Scope::Admin);
    let grant = match query.bucket.as_deref() {
        Some(name) => admin.find(|g| g.bucket.as_ref().is_none_or(|b| b.name == name)).ok_or(ApiError::Forbidden)?,
        None => match (admin.next(), admin.next()) {
            (Some(only), None) => only,
            _ => {
                return Err(ApiError::BadRequest(
                    "this token is admin of several buckets: name one with ?bucket=".into(),
                ));
            }
        },
    };
    let prefix = match query.prefix {
        Some(p) if p.starts_with(&grant.prefix) => p,
        Some(_) => return Err(ApiError::Forbidden),
        None => grant.prefix.clone(),
    };
    let bucket_id = match (&grant.bucket, query.bucket.as_deref()) {
        (Some(b), _) => Some(b.id),
        // A grant of every bucket: the bucket asked for, or all of them.
        (None, Some(name)) => Some(app.data.catalog.bucket(name).await?.ok_or(ApiError::NoSuchBucket)?.id),
        (None, None) => None,
    };
    let rows = app.store.meta.object_stats(bucket_id, &prefix, order, query.top).await?;
    Ok(axum::Json(rows.iter().map(stats_json).collect::<Vec<_>>()))
}

async fn metrics(State(app): State<AdminState>) -> impl IntoResponse {
    if let Some(cache) = app.data.catalog.blob_cache() {
        crate::metrics::blob_cache_snapshot(cache);
    }
    crate::metrics::paced_snapshot();
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.prometheus.render())
}
