//! The admin listener's routes: health, Prometheus metrics, uploads and deletes. Served by hyper (through
//! hyper-util), not by the sendfile driver, so request bodies never touch the hand-written parser.

use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, put};
use http::{StatusCode, header};

use super::AppState;
use super::error::ApiError;

pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        // Any other path is an object path; the handlers parse and validate it.
        .fallback(put(super::upload::put_object).delete(super::upload::delete_object))
        // hyper would buffer nothing anyway; this only lifts axum's default 2 MB cap so the limit is ours.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

async fn healthz(State(app): State<AppState>) -> Result<&'static str, ApiError> {
    if app.ready.load(Ordering::Acquire) { Ok("ok\n") } else { Err(ApiError::NotReady) }
}

async fn metrics(State(app): State<AppState>) -> impl IntoResponse {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.prometheus.render())
}
