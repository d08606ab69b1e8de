//! The axum side of both listeners: routes, handlers and the one error type.

pub mod admin;
pub mod conditional;
pub mod deadline;
pub mod disposition;
pub mod error;
pub mod multipart;
pub mod object;
pub mod range;
pub mod representation;
pub mod upload;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use axum::Router;
use axum::routing::get;
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
}

/// The data listener's routes. Anything that is not `/{bucket}/{key}` still goes to the object handler, which
/// answers 400 for a malformed path rather than a bare 404.
pub fn data_router(state: AppState) -> Router {
    let handler_timeout = state.settings.timeouts.handler;
    Router::new()
        .fallback(get(object::get_object).head(object::get_object).fallback(object::get_object))
        .layer(deadline::DeadlineLayer::new(handler_timeout))
        // No TraceLayer here: its per-request span cost a few percent of a small download's CPU. The driver logs
        // every response itself (`blobgate::driver` at debug), which costs nothing when that level is off.
        .with_state(state)
}
