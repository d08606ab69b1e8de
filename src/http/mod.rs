//! The axum side of both listeners: routes, handlers and the one error type.

pub mod admin;
pub mod conditional;
pub mod deadline;
pub mod disposition;
pub mod error;
pub mod fragment_guard;
pub mod multipart;
pub mod object;
pub mod range;
pub mod representation;
pub mod upload;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::handler::Handler;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::catalog::Catalog;
use crate::config::Settings;
use crate::store::Store;

/// Shared by every handler on both listeners. Cloning it (axum does, per request) is one reference count.
#[derive(Clone)]
pub struct AppState(Arc<AppParts>);

impl AppState {
    pub fn new(parts: AppParts) -> Self {
        Self(Arc::new(parts))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppParts;

    fn deref(&self) -> &AppParts {
        &self.0
    }
}

pub struct AppParts {
    pub store: Store,
    /// Cached metadata and open blobs for the data path, coherent with the database.
    pub catalog: Arc<Catalog>,
    pub settings: Arc<Settings>,
    pub range_policy: range::RangePolicy,
    pub prometheus: PrometheusHandle,
    /// Set once migrations have run and both listeners are bound: `/healthz` reports it.
    pub ready: AtomicBool,
    /// One permit per upload in progress (`limits.max_concurrent_uploads`).
    pub uploads: tokio::sync::Semaphore,
}

/// The data listener's application: the object handler (an ordinary axum handler with extractors) as a tower
/// `Service`, under tower layers. Every request goes to the handler, which answers 400 for a malformed path
/// and 405 for a method other than GET/HEAD.
///
/// There is no `Router` in front: with a single handler it has nothing to route, and its per-request work (a
/// path match, boxing and cloning the route, extension inserts) allocates on every download. The driver accepts
/// any such `Service`, so a `Router` or further layers can go back on without touching it. No TraceLayer either:
/// its per-request span is paid by every small download (README, "Measurements"); the driver logs every response
/// itself (`blobgate::driver` at debug), which costs nothing when that level is off.
/// Server errors are logged once, by [`error::log_server_error`], which only reads the status of a success.
pub fn data_service(state: AppState) -> impl crate::driver::DataService {
    let handler_timeout = state.settings.timeouts.handler;
    tower::ServiceBuilder::new()
        .map_response(error::log_server_error)
        .layer(deadline::DeadlineLayer::new(handler_timeout))
        .service(object::get_object.with_state(state))
}
