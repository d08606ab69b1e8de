//! The axum side of both listeners: routes, handlers and the one error type.

pub mod accept_encoding;
pub mod admin;
pub mod conditional;
pub mod cors;
pub mod deadline;
pub mod error;
pub mod multipart;
pub mod object;
pub mod range;
pub mod s3;
mod s3_list;
pub mod s3_write;
#[cfg(test)]
mod signed_url_tests;
pub mod upload;
pub mod website;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::extract::State;
use axum::handler::Handler;
use axum::response::{IntoResponse, Response};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Authorizer;
use crate::catalog::Catalog;
use crate::config::Settings;
use crate::driver::Refusal;
use crate::store::{DatabaseHealth, Store};
use error::ApiError;

/// What the data listener's handler needs. Cloning it (axum does, per request) is one reference count.
#[derive(Clone)]
pub struct DataState(Arc<DataParts>);

pub struct DataParts {
    /// Cached metadata and open blobs for the data path, coherent with the database.
    pub catalog: Arc<Catalog>,
    /// The one authoriser, which the admin listener uses too (through `AdminParts::data`): one SigV4 signing-key
    /// cache for both listeners.
    pub auth: Authorizer<Arc<Catalog>>,
    pub range_policy: range::RangePolicy,
    /// Whether responses carry their `access_log::Principal` (only when the access log is on: it costs an
    /// allocation).
    pub log_principal: bool,
}

impl DataState {
    pub fn new(parts: DataParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for DataState {
    type Target = DataParts;

    fn deref(&self) -> &DataParts {
        &self.0
    }
}

/// What the admin listener's handlers need: the store for uploads and stats, health and metrics.
#[derive(Clone)]
pub struct AdminState(Arc<AdminParts>);

pub struct AdminParts {
    pub store: Store,
    pub settings: Arc<Settings>,
    pub prometheus: PrometheusHandle,
    /// Set once migrations have run and both listeners are bound: `/healthz` reports it.
    pub ready: AtomicBool,
    /// The background probe's last verdict on the database: `/readyz` reports it (with `ready`).
    pub database: Arc<DatabaseHealth>,
    /// One permit per upload in progress (`limits.max_concurrent_uploads`).
    pub uploads: tokio::sync::Semaphore,
    /// The data listener's state: its authoriser (`data.auth`) decides the admin listener's requests too, and
    /// its catalog serves the S3 reads the admin listener answers (`admin::s3_read`).
    pub data: DataState,
}

impl AdminState {
    pub fn new(parts: AdminParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for AdminState {
    type Target = AdminParts;

    fn deref(&self) -> &AdminParts {
        &self.0
    }
}

/// The data listener's application: the object handler (an ordinary axum handler with extractors) as a tower
/// `Service`, under tower layers. Every request goes to the handler, which answers 400 for a malformed path
/// and 405 for a method other than GET/HEAD; a request with `Origin` first passes `cors::serve` (preflights,
/// CORS headers).
///
/// There is no `Router` in front: with a single handler it has nothing to route, and its per-request work (a
/// path match, boxing and cloning the route, extension inserts) allocates on every download. The driver accepts
/// any such `Service`, so a `Router` or further layers can go back on without touching it. No TraceLayer either:
/// its per-request span is paid by every small download (docs/measurements.md); the driver logs every response
/// itself (`blobgate::driver` at debug), which costs nothing when that level is off.
/// Server errors are logged once, by [`error::log_server_error`], which only reads the status of a success.
pub fn data_service(state: DataState, handler_timeout: Duration) -> impl crate::driver::RequestService {
    tower::ServiceBuilder::new()
        .map_response(error::log_server_error)
        .layer(deadline::DeadlineLayer::new(handler_timeout))
        .service(route.with_state(state))
}

/// The data listener's one routing decision: an S3 request (`s3::is_s3_request`: SigV4, or an S3-only path) or
/// a native one, which goes on through CORS to the object handler exactly as before.
async fn route(State(app): State<DataState>, request: axum::extract::Request) -> Response {
    if s3::is_s3_request(&request) { s3::serve(app, request).await } else { cors::serve(State(app), request).await }
}

/// What either listener answers when the driver refuses a request itself: the same JSON errors as the handlers'.
pub fn refusal_response(refusal: Refusal) -> Response {
    let error = match refusal {
        Refusal::BadHead { status, message } => ApiError::BadRequestHead { status, message },
        Refusal::TooManyConnectionsFromAddress => ApiError::TooManyConnectionsFromAddress,
        Refusal::InconsistentFileResponse(why) => {
            ApiError::Internal(anyhow::anyhow!("inconsistent file response: {why}"))
        }
    };
    error.into_response()
}
