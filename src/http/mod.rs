//! The axum side of both listeners: routes, handlers and the one error type.
//!
//! [`DataState`] and [`AdminState`] are what each listener's handlers need. [`data_service`] is the data
//! listener's application: native reads answered from the parsed head, everything else classified once and sent
//! by one routing decision to the upload handlers or the S3 dispatcher ([`dispatch_s3`], shared with the admin
//! router). [`refusal_response`] renders the driver's own refusals as the handlers' JSON errors.

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
pub mod throttling;
pub mod upload;
pub mod website;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt as _;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::auth::Authorizer;
use crate::catalog::Catalog;
use crate::config::Settings;
use crate::driver::{Answer, Refusal, RequestHead as DriverHead};
use crate::s3::operation::{self, Api, RequestHead, S3Call};
use crate::store::{DatabaseHealth, Store};
use error::ApiError;

/// The admin listener's probes: what a load balancer and a scraper ask all day (left out of the access log unless
/// `access_log_probes`).
pub const PROBE_PATHS: &[&str] = &["/healthz", "/readyz", "/metrics"];

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
    /// `s3.domain` (validated): virtual-hosted-style S3 addressing under it.
    pub s3_domain: Option<String>,
    /// The replica's counters for limits on principals (`throttling`).
    pub throttle: crate::throttle::state::Throttle,
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

/// The data listener's application. Native reads (every request without a body that `s3::operation::classify`
/// calls native, except PUT and DELETE) are answered from the head as the driver parsed it
/// ([`DataService::answer_head`]): CORS, then the object handler, under the handler deadline, with no
/// `http::Request`, `HeaderMap` or layer per download. Everything else is an `http::Request` through the service:
/// classified once, under the handler deadline (which reads the same answer: S3 XML or JSON, and no deadline for a
/// write, whose body has its own timeouts), then the one routing decision ([`route`]): native writes to the
/// upload handlers, S3 requests to the S3 dispatcher. With `read_only` (`listen_read_only`), every write is refused
/// with 405 before its body is read.
///
/// There is no `Router` in front: with one decision it has nothing to route, and its per-request work (a path
/// match, boxing and cloning the route, extension inserts) allocates on every download. No TraceLayer either: its
/// per-request span is paid by every small download (docs/measurements.md); the driver logs every response itself
/// (`blobgate::driver` at debug), which costs nothing when that level is off. Server errors are logged once, by
/// [`error::log_server_error`], which only reads the status of a success.
pub fn data_service(app: AdminState, handler_timeout: Duration, read_only: bool) -> DataService<impl Routed> {
    let domain = app.data.s3_domain.clone().map(Arc::<str>::from);
    let classify_domain = domain.clone();
    let routed = tower::ServiceBuilder::new()
        .map_response(error::log_server_error)
        .map_request(move |request| Classified::new(request, classify_domain.as_deref()))
        .layer(deadline::DeadlineLayer::new(handler_timeout))
        .service_fn({
            let app = app.clone();
            move |classified: Classified| route(app.clone(), read_only, classified)
        });
    DataService { routed, data: app.data.clone(), s3_domain: domain, handler_timeout, read_only }
}

/// The service behind [`DataService`] for what is not answered from the head.
pub trait Routed:
    tower::Service<axum::extract::Request, Response = Response, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> Routed for S where
    S: tower::Service<axum::extract::Request, Response = Response, Error = Infallible, Future: Send>
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// See [`data_service`].
#[derive(Clone)]
pub struct DataService<S> {
    routed: S,
    data: DataState,
    s3_domain: Option<Arc<str>>,
    handler_timeout: Duration,
    read_only: bool,
}

impl<S: Routed> tower::Service<axum::extract::Request> for DataService<S> {
    type Response = Response;
    type Error = Infallible;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        self.routed.poll_ready(cx)
    }

    fn call(&mut self, request: axum::extract::Request) -> S::Future {
        self.routed.call(request)
    }
}

impl<S: Routed> crate::driver::RequestService for DataService<S> {
    fn answer_head<'a>(&'a self, head: &'a DriverHead) -> Option<impl Future<Output = Answer> + Send + 'a> {
        if matches!(head.method, http::Method::PUT | http::Method::DELETE) {
            return None;
        }
        let (path, query) = head.path_and_query();
        let native = crate::s3::operation::is_native(RequestHead {
            method: &head.method,
            path,
            query,
            headers: &head.fields,
            s3_domain: self.s3_domain.as_deref(),
        });
        // Not native: classified into its operation once, by the service (`Classified::new`). Combinators rather
        // than an `async` block around the handler: each async layer moves the whole handler's state once more.
        let read_only = self.read_only;
        native.then(|| {
            let read = cors::serve(&self.data, NativeRead { head, path, query }).map(Ok::<_, Infallible>);
            deadline::bound(read, self.handler_timeout).map(move |Ok(answer)| match answer {
                Answer::Response(response) => {
                    Answer::Response(error::log_server_error(allowing_writes(response, read_only)))
                }
                // 200, 206, or an error document's 404.
                file @ Answer::File(_) => file,
            })
        })
    }
}

/// A native read as its handlers take it: the parsed head, and its target's path and query.
#[derive(Clone, Copy)]
pub struct NativeRead<'a> {
    pub head: &'a DriverHead,
    pub path: &'a str,
    pub query: Option<&'a str>,
}

/// A request and what [`classify`](crate::s3::operation::classify) made of it, decided once.
pub struct Classified {
    pub api: Api,
    pub request: axum::extract::Request,
}

impl Classified {
    pub fn new(request: axum::extract::Request, s3_domain: Option<&str>) -> Self {
        let api = crate::s3::operation::classify(RequestHead {
            method: request.method(),
            path: request.uri().path(),
            query: request.uri().query(),
            headers: request.headers(),
            s3_domain,
        });
        Self { api, request }
    }
}

/// The data listener's one routing decision for what is not answered from the head.
///
/// The writes' futures are boxed: a future is as large as its largest state, and the driver moves the service's
/// future into its connection's once per request.
async fn route(
    app: AdminState,
    read_only: bool,
    Classified { api, request }: Classified,
) -> Result<Response, Infallible> {
    if read_only && api.is_write(request.method()) {
        return Ok(match api {
            Api::S3(_) => s3::refuse(&request, ApiError::MethodNotAllowed.into()),
            Api::Native => ApiError::MethodNotAllowed.into_response(),
        });
    }
    Ok(match api {
        Api::Native => match *request.method() {
            http::Method::PUT => {
                let (parts, body) = request.into_parts();
                Box::pin(upload::put_object(State(app), parts.uri, parts.headers, body)).await
            }
            http::Method::DELETE => {
                let (parts, _no_body) = request.into_parts();
                Box::pin(upload::delete_object(State(app), parts.uri, parts.headers)).await.into_response()
            }
            // A native request with a body that is not an upload (`answer_head` took those without one).
            _ => allowing_writes(ApiError::MethodNotAllowed.into_response(), read_only),
        },
        Api::S3(call) => dispatch_s3(app, call, request).await,
    })
}

/// A 405 from the object handler (which answers GET and HEAD) on a listener that also takes PUT and DELETE (not
/// `read_only`) names them too.
fn allowing_writes(mut response: Response, read_only: bool) -> Response {
    if !read_only && response.status() == http::StatusCode::METHOD_NOT_ALLOWED {
        response.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static("GET, HEAD, PUT, DELETE"));
    }
    response
}

/// An S3 request, on either listener: its reads are answered from the catalog (`s3`), its writes and multipart
/// listings by `s3_write` (boxed, as the writes in [`route`]), its refusal in S3's words.
pub async fn dispatch_s3(
    app: AdminState,
    call: Result<S3Call, operation::Refusal>,
    request: axum::extract::Request,
) -> Response {
    // A browser's S3 request (a presigned URL, or an SDK in a page): its bucket's CORS rule, as on native answers.
    let cors = match (&call, request.headers().get(http::header::ORIGIN)) {
        (Ok(call), Some(origin)) if call.operation != operation::Operation::CorsPreflight => {
            let credentialed = cors::is_credentialed(request.headers());
            call.resource.bucket().cloned().map(|bucket| (app.data.clone(), bucket, origin.clone(), credentialed))
        }
        _ => None,
    };
    let mut response = match call {
        Ok(call) if s3::answered_from_catalog(call.operation) => s3::serve(app.data.clone(), call, request).await,
        Ok(call) => Box::pin(s3_write::serve(app, call, request)).await,
        Err(refusal) => s3::refuse(&request, refusal.into()),
    };
    if let Some((data, bucket, origin, credentialed)) = cors {
        cors::add_to_s3_answer(&data, &bucket, &origin, credentialed, &mut response).await;
    }
    response
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
