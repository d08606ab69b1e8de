//! Our own HTTP/1.1 server, because hyper cannot hand a file to `sendfile(2)`. It serves both listeners: the data
//! listener (one worker thread and runtime per CPU, each with its own `SO_REUSEPORT` socket, the first bound
//! exclusively; request bodies on PUT and POST only) and the admin listener (on the main runtime, bodies on any
//! method), so an S3 GetObject leaves by sendfile on either ([`Listener`]). Request bodies are streamed to the
//! service. What the driver calls is a [`RequestService`], which may answer a bodiless request from its parsed
//! head ([`Answer`], [`FileAnswer`]: no `http::Request` built).
//!
//! - `mod.rs`: the accept loops (connection cap, accept back-off, shutdown) and the shared context.
//! - `admission.rs`: the connection caps (total and per address) and the keep-alive timeout under pressure.
//! - `idle.rs`: each worker's idle connections, oldest first, closed at the cap to admit new clients.
//! - `conn.rs`: the per-connection loop; calls the application (any axum-compatible tower `Service`).
//! - `head.rs`: pure request-head parsing and response-head writing.
//! - `body.rs`: pure request-body framing (Content-Length, chunked).
//! - `budget.rs`: the one budget of request-body bytes in memory, both listeners' (`limits.upload_buffer_bytes`).
//! - `send.rs`: the send loop of plain HTTP and kernel TLS: heads by `send(MSG_MORE)`, bodies by `sendfile`.
//! - `sys.rs`: the driver's raw syscalls, its only code that touches raw fds.
//! - `tls.rs`: HTTPS: the certificate pair, the handshake, and user-space TLS (the one path that copies bodies).
//! - `ktls.rs`: kernel TLS: the handshake whose session goes to the kernel, control records, key updates.

mod admission;
pub mod body;
mod budget;
mod conn;
mod fair;
pub mod head;
mod idle;
mod ktls;
pub mod send;
mod sys;
pub mod tls;

use std::cell::Cell;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::response::Response;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access_log::Principal;
use crate::config::Settings;
use crate::file_body::FileBody;
use crate::header_values::fields::Fields;
use crate::metrics::DriverMetrics;
use crate::metrics::downloads::DownloadRecorder;
use admission::Admission;
use head::HeadLimits;
pub use head::RequestHead;

/// The client's address, on every `http::Request` the driver hands a service (as `RequestHead::peer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub std::net::IpAddr);
use send::{SendObserver, SendOptions};

/// Concurrent pool sends (cold or bulk chunks) across all workers: enough to keep a disk busy, few enough that
/// cold downloads cannot take every blocking thread.
const POOL_SENDS: usize = 16;

/// What the driver calls for each request, on either listener: a tower `Service` from
/// `http::Request<axum::body::Body>` to an axum `Response`. An axum `Router` is one (the admin listener's); the
/// data listener's is `http::data_service` (native reads from the head, the rest through one routing decision).
pub trait RequestService:
    tower::Service<http::Request<Body>, Response = Response, Error = Infallible, Future: Send>
    + Clone
    + Send
    + Sync
    + 'static
{
    /// The answer to a request without a body that the application reads from its parsed head, without an
    /// `http::Request` (no `HeaderMap` built, no layers walked): the data listener's native reads. A head handed
    /// the service answers (`None`) goes through the service.
    fn answer_head<'a>(&'a self, head: &'a RequestHead) -> Option<impl Future<Output = Answer> + Send + 'a>;
}

/// What the application answers a request read from its head with: a file response as it is (no
/// `http::Response`, no extensions map), or any other response.
pub enum Answer {
    File(FileAnswer),
    Response(Response),
}

/// A response whose body is a file's regions, sent by sendfile.
pub struct FileAnswer {
    pub status: http::StatusCode,
    /// The response's own fields (besides `body.shared_fields`).
    pub headers: http::HeaderMap,
    pub body: FileBody,
    /// Who asked, for the access log (only when it is on).
    pub principal: Option<Principal>,
}

impl Answer {
    pub fn status(&self) -> http::StatusCode {
        match self {
            Answer::File(file) => file.status,
            Answer::Response(response) => response.status(),
        }
    }

    pub fn headers_mut(&mut self) -> &mut http::HeaderMap {
        match self {
            Answer::File(file) => &mut file.headers,
            Answer::Response(response) => response.headers_mut(),
        }
    }

    /// The principal the handler named (a response carries it as an extension).
    pub fn take_principal(&mut self) -> Option<Principal> {
        match self {
            Answer::File(file) => file.principal.take(),
            Answer::Response(response) => response.extensions_mut().remove::<Principal>(),
        }
    }

    /// The limit that refused the request, if one did (a refusal is never a file response).
    pub fn take_throttled(&mut self) -> Option<crate::access_log::ThrottledBy> {
        match self {
            Answer::File(_) => None,
            Answer::Response(response) => response.extensions_mut().remove::<crate::access_log::ThrottledBy>(),
        }
    }

    pub fn set_principal(&mut self, principal: Option<Principal>) {
        match self {
            Answer::File(file) => file.principal = principal,
            Answer::Response(response) => {
                if let Some(principal) = principal {
                    response.extensions_mut().insert(principal);
                }
            }
        }
    }

    /// The file response, if this is one (a `Response` carries its `FileBody` as an extension); else the
    /// response.
    // Once per request, consumed at once: boxing would only add an allocation.
    #[allow(clippy::result_large_err)]
    fn into_file(self) -> Result<FileAnswer, Response> {
        match self {
            Answer::File(file) => Ok(file),
            Answer::Response(mut response) => match response.extensions_mut().remove::<FileBody>() {
                Some(body) => {
                    let (parts, _sent_by_the_driver) = response.into_parts();
                    let principal = None;
                    Ok(FileAnswer { status: parts.status, headers: parts.headers, body, principal })
                }
                None => Err(response),
            },
        }
    }

    /// As an `http::Response`: a file response's body as an extension (what a `tower` service answers).
    pub fn into_response(self) -> Response {
        match self {
            Answer::Response(response) => response,
            Answer::File(FileAnswer { status, headers, body, principal }) => {
                let mut response = Response::new(Body::new(crate::file_body::SentByTheDriver));
                *response.status_mut() = status;
                *response.headers_mut() = headers;
                response.extensions_mut().insert(body);
                if let Some(principal) = principal {
                    response.extensions_mut().insert(principal);
                }
                response
            }
        }
    }
}

impl From<Response> for Answer {
    fn from(response: Response) -> Self {
        Answer::Response(response)
    }
}

/// The admin listener's: every request through the router.
impl RequestService for axum::Router {
    fn answer_head<'a>(&'a self, _: &'a RequestHead) -> Option<impl Future<Output = Answer> + Send + 'a> {
        None::<std::future::Ready<Answer>>
    }
}

/// A response the driver gives by itself, without calling the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// A request head it cannot take: malformed, over a limit, timed out, another HTTP version.
    BadHead { status: http::StatusCode, message: &'static str },
    /// Beyond `limits.max_connections_per_ip`.
    TooManyConnectionsFromAddress,
    /// The application answered a file response that contradicts its own head: a bug, refused before a byte.
    InconsistentFileResponse(&'static str),
}

/// Renders a [`Refusal`]. The application supplies it (`http::refusal_response`), so refusals look like every other
/// error it answers while the driver stays below `http`.
pub type RenderRefusal = fn(Refusal) -> Response;

impl SendObserver for DriverMetrics {
    fn sent(&self, object_bytes: u64) {
        self.add_sent_bytes(object_bytes);
    }

    fn cold_chunk(&self) {
        self.add_cold_chunk();
    }

    fn paced(&self, scope: &'static str, object_bytes: u64) {
        crate::metrics::paced_bytes("read", scope, object_bytes);
    }
}

/// Which listener a context serves.
#[derive(Debug, Clone, Copy)]
pub enum Listener {
    /// Bodies on PUT and POST only; connections live on data workers (idle lists, per-worker counts).
    Data,
    /// Request bodies streamed to the service; connections live on the main runtime. `principal_of` names the
    /// access log's principal from a request's credentials when the handler names none (and did not refuse them).
    Admin { principal_of: fn(&dyn Fields) -> Option<crate::access_log::Principal> },
}

impl Listener {
    /// The access log's `listener` field.
    pub fn name(&self) -> &'static str {
        match self {
            Listener::Data => "data",
            Listener::Admin { .. } => "admin",
        }
    }
}

/// Everything a connection needs, shared by all of them.
pub struct DriverContext<S> {
    /// Cloned per request (a reference count) because `oneshot` takes the service by value.
    pub service: S,
    pub render_refusal: RenderRefusal,
    pub head_limits: HeadLimits,
    pub timeouts: crate::config::Timeouts,
    pub send: SendOptions,
    pub metrics: DriverMetrics,
    /// Per-object download records go here; never blocks.
    pub recorder: DownloadRecorder,
    /// One line per response when the access log is on; never blocks.
    pub access_log: Option<crate::access_log::AccessLog>,
    /// Request paths the access log leaves out (the admin listener's probes, unless `access_log_probes`).
    pub unlogged_paths: &'static [&'static str],
    pub listener: Listener,
    /// Request-body bytes in memory, across both listeners' connections (one budget, shared).
    pub body_budget: budget::BodyBudget,
    /// HTTPS: every connection starts with a handshake. `None`: plain HTTP.
    pub tls: Option<Arc<tls::TlsServer>>,
}

impl<S: RequestService> DriverContext<S> {
    pub fn new(service: S, render_refusal: RenderRefusal, settings: &Settings, recorder: DownloadRecorder) -> Self {
        Self {
            service,
            render_refusal,
            head_limits: HeadLimits {
                max_head_bytes: settings.limits.max_head_bytes,
                max_headers: settings.limits.max_headers,
                max_uri_bytes: settings.limits.max_uri_bytes,
                bodies: head::Bodies::OnWrites,
            },
            timeouts: settings.timeouts.clone(),
            send: SendOptions {
                chunk: settings.limits.sendfile_chunk_bytes,
                progress_timeout: settings.timeouts.send_progress,
                min_download_rate: settings.limits.min_download_rate,
                pool_sends: Arc::new(Semaphore::new(POOL_SENDS)),
                pool_wouldblock_hold: settings.faults.pool_wouldblock_hold,
            },
            metrics: DriverMetrics::new(),
            recorder,
            access_log: None,
            unlogged_paths: &[],
            listener: Listener::Data,
            body_budget: budget::BodyBudget::new(settings.limits.upload_buffer_bytes),
            tls: None,
        }
    }

    /// The same for the admin listener: request bodies are taken and streamed to the service.
    pub fn for_admin(mut self, principal_of: fn(&dyn Fields) -> Option<crate::access_log::Principal>) -> Self {
        self.listener = Listener::Admin { principal_of };
        self.head_limits.bodies = head::Bodies::Any;
        self
    }
}

/// Binds `count` listening sockets to `addr` with SO_REUSEPORT, one per data worker, so the kernel spreads new
/// connections over the workers. With port 0 the first socket picks the port and the others join it.
///
/// Only one gateway may hold an address: a second one joining the group would silently get half the connections.
/// So the first socket binds and listens *without* SO_REUSEPORT (`listen_exclusive`), which fails while any socket
/// holds the address (a reuseport group included, and a socket that is bound but not yet listening); only once it
/// listens alone does it turn SO_REUSEPORT on, and the others join it. Turning it on before `listen` left a race:
/// two gateways starting at once could both bind (SO_REUSEADDR allows that until one listens), both turn
/// SO_REUSEPORT on, and both listen as one group.
pub fn bind_data_listeners(addr: SocketAddr, count: usize) -> io::Result<Vec<std::net::TcpListener>> {
    let mut listeners: Vec<std::net::TcpListener> = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let socket = match listeners.first() {
            None => {
                let socket = listen_exclusive(addr, 4096)?;
                socket.set_reuse_port(true)?;
                listeners.push(socket.into());
                continue;
            }
            Some(first) => {
                let target = first.local_addr()?;
                let socket = Socket::new(Domain::for_address(target), Type::STREAM, Some(Protocol::TCP))?;
                socket.set_reuse_address(true)?;
                socket.set_reuse_port(true)?;
                socket.set_nonblocking(true)?;
                socket.bind(&target.into())?;
                socket
            }
        };
        socket.listen(4096)?;
        listeners.push(socket.into());
    }
    Ok(listeners)
}

/// A non-blocking TCP socket listening on `addr` without SO_REUSEPORT: `AddrInUse` while any other socket holds
/// the address, whether it listens already or is only bound (then our `listen` is the call that fails).
/// SO_REUSEADDR only lets it take over TIME_WAIT connections of an earlier run, never a listening socket.
pub fn listen_exclusive(addr: SocketAddr, backlog: i32) -> io::Result<Socket> {
    let in_use = |e: io::Error| match e.kind() {
        io::ErrorKind::AddrInUse => {
            io::Error::new(e.kind(), "address already in use: only one gateway may listen on an address")
        }
        _ => e,
    };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into()).map_err(in_use)?;
    socket.listen(backlog).map_err(in_use)?;
    Ok(socket)
}

/// Runs one data worker per listener, each a thread with its own single-threaded tokio runtime: a connection
/// lives its whole life on one thread, with no work-stealing or cross-thread wake-ups on the request path.
/// Each worker returns after `shutdown` once its connections have finished, or after `grace`.
pub fn spawn_workers<S: RequestService>(
    listeners: Vec<std::net::TcpListener>,
    ctx: Arc<DriverContext<S>>,
    limits: &crate::config::Limits,
    shutdown: CancellationToken,
    grace: Duration,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    // One cap for all workers: at the cap a worker closes an idle connection to admit the client it holds.
    let admission = Arc::new(Admission::new(limits.max_connections, limits.max_connections_per_ip, listeners.len()));
    let mut workers = Vec::with_capacity(listeners.len());
    for (n, listener) in listeners.into_iter().enumerate() {
        // The blocking pool serves blob opens and cold-chunk readaheads; bounded so a cold storm stays contained.
        // Blocking-pool threads run at the lowest priority: when one wakes from a disk read with megabytes to push
        // through the TCP stack, the event-loop thread still preempts it at once, so hot requests keep their
        // latency beside cold downloads.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(64)
            .on_thread_start(|| {
                if std::thread::current().name().is_some_and(|n| n.starts_with("data-")) {
                    return;
                }
                sys::lower_this_thread_priority();
            })
            .build()?;
        let (ctx, admission, shutdown) = (ctx.clone(), admission.clone(), shutdown.clone());
        let worker = std::thread::Builder::new().name(format!("data-{n}")).spawn(move || {
            runtime.block_on(async move {
                let listener = match TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!(error = %e, "data worker cannot use its listener"),
                };
                let tracker = TaskTracker::new();
                let anchor = tokio::spawn(anchor_timer_wheel());
                let idle = admission.worker(n);
                idle::attach_worker(idle.clone());
                fair::attach_worker();
                let close_requests = tokio::spawn(idle.serve_close_requests());
                serve(listener, ctx, admission, n, shutdown, tracker.clone()).await;
                anchor.abort();
                close_requests.abort();
                tracker.close();
                if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
                    tracing::warn!(open = tracker.len(), "shutdown grace period over; dropping remaining connections");
                }
            })
        })?;
        workers.push(worker);
    }
    Ok(workers)
}

/// Keeps a timer on this worker's wheel that is never more than `ANCHOR_PERIOD` away.
///
/// Registering a tokio timer earlier than every other one on the wheel "unparks" the driver: a `write(2)` to its
/// eventfd, even on a current-thread runtime whose only thread is the one registering. With few connections, every
/// new header or idle deadline is the earliest, so each request paid for that write and for the extra
/// `epoll_wait` it causes. With this anchor, the request timers (seconds away) are never the earliest; the anchor
/// itself costs one such write per period.
async fn anchor_timer_wheel() {
    const ANCHOR_PERIOD: Duration = Duration::from_millis(500);
    let mut tick = tokio::time::interval(ANCHOR_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Accepts connections until `shutdown` fires, then returns (dropping the listener, so new connections are
/// refused). Connection tasks are spawned on `tracker` so the caller can wait for in-flight responses. `worker`
/// is this worker's index in `admission`.
async fn serve<S: RequestService>(
    listener: TcpListener,
    ctx: Arc<DriverContext<S>>,
    admission: Arc<Admission>,
    worker: usize,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let mut accepting = Acceptor::new(&listener, "data");
    loop {
        let Some((stream, peer)) = accepting.next(&shutdown, || ctx.metrics.accept_error()).await else { break };
        let Some(address) = admission.admit_address(peer.ip()) else {
            // Over limits.max_connections_per_ip: read its request and answer 503, without taking a slot.
            crate::metrics::per_ip_refused();
            let (ctx, admission, shutdown) = (ctx.clone(), admission.clone(), shutdown.clone());
            tracker.spawn(async move {
                conn::Connection::new(stream, peer, ctx, admission).refuse_over_address_limit(&shutdown).await;
            });
            continue;
        };
        // Accept first, then wait for a slot: with several workers, a freed slot must go to a worker that holds a
        // waiting client, not to one whose own queue is empty. So each worker holds at most one connection
        // beyond the cap, accepted but not yet read from, and at the cap it closes an idle connection for it.
        let Some(permit) = admission.slot(worker, &shutdown).await else { break };
        // Heads and small responses must not wait for Nagle + delayed ACK (40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let (ctx, admission, shutdown) = (ctx.clone(), admission.clone(), shutdown.clone());
        tracker.spawn(async move {
            let _open = ctx.metrics.connection_opened();
            let _on_this_worker = WorkerConnection::open();
            conn::Connection::new(stream, peer, ctx.clone(), admission).run(shutdown).await;
            drop((permit, address));
        });
    }
}

/// The admin listener's accept loop, on the caller's (multi-threaded) runtime: the handlers behind it hash, fsync
/// and query the database, which a data worker's single thread must not wait for. Its cap is
/// `limits.max_connections` of its own (no per-address cap, no idle reclaiming: operators and S3 writers are few),
/// counted apart from the data listener's so neither can lock the other out. Returns after `shutdown` (dropping
/// the listener); connection tasks go on `tracker`, so the caller can wait for in-flight requests.
pub async fn serve_admin<S: RequestService>(
    listener: TcpListener,
    ctx: Arc<DriverContext<S>>,
    limits: &crate::config::Limits,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let admission = Arc::new(Admission::new(limits.max_connections, 0, 0));
    let mut accepting = Acceptor::new(&listener, "admin");
    loop {
        let Some((stream, peer)) = accepting.next(&shutdown, || {}).await else { break };
        let Some(permit) = admission.slot(0, &shutdown).await else { break };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let (ctx, admission, shutdown) = (ctx.clone(), admission.clone(), shutdown.clone());
        tracker.spawn(async move {
            conn::Connection::new(stream, peer, ctx, admission).run(shutdown).await;
            drop(permit);
        });
    }
}

/// One listener's `accept`, shared by both accept loops: it retries a failure that concerns one connection only
/// (ECONNABORTED and similar) at once, and backs off (5 ms doubling to 1 s) on resource exhaustion (EMFILE and
/// friends), so the connections already open go on being served instead of the loop spinning.
struct Acceptor<'l> {
    listener: &'l TcpListener,
    /// `data` or `admin`, for the log.
    name: &'static str,
    backoff: Duration,
}

impl<'l> Acceptor<'l> {
    const FIRST_BACKOFF: Duration = Duration::from_millis(5);

    fn new(listener: &'l TcpListener, name: &'static str) -> Self {
        Self { listener, name, backoff: Self::FIRST_BACKOFF }
    }

    /// The next connection; `None` once `shutdown` fires. `exhausted` is called at each back-off (a metric).
    async fn next(
        &mut self,
        shutdown: &CancellationToken,
        exhausted: impl Fn(),
    ) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
        loop {
            let accepted = tokio::select! {
                accepted = self.listener.accept() => accepted,
                _ = shutdown.cancelled() => return None,
            };
            match accepted {
                Ok(pair) => {
                    self.backoff = Self::FIRST_BACKOFF;
                    return Some(pair);
                }
                Err(e) if is_resource_exhaustion(&e) => {
                    let backoff_ms = self.backoff.as_millis() as u64;
                    tracing::warn!(listener = self.name, error = %e, backoff_ms, "accept failed; backing off");
                    exhausted();
                    tokio::select! {
                        _ = tokio::time::sleep(self.backoff) => {},
                        _ = shutdown.cancelled() => return None,
                    }
                    self.backoff = (self.backoff * 2).min(Duration::from_secs(1));
                }
                Err(e) => tracing::debug!(listener = self.name, error = %e, "accept failed"),
            }
        }
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

thread_local! {
    /// Connections open on this data worker (each worker is one thread with its own runtime).
    static WORKER_CONNECTIONS: Cell<usize> = const { Cell::new(0) };
}

/// Counts a connection on the current worker for as long as it lives.
struct WorkerConnection;

impl WorkerConnection {
    fn open() -> Self {
        WORKER_CONNECTIONS.with(|n| n.set(n.get() + 1));
        WorkerConnection
    }
}

impl Drop for WorkerConnection {
    fn drop(&mut self) {
        WORKER_CONNECTIONS.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// Tunes the process's allocator to return freed memory promptly (see `sys::return_freed_memory_promptly`).
pub fn return_freed_memory_promptly() {
    sys::return_freed_memory_promptly();
}

/// Whether other connections share this worker's event loop (so a bulk send would make them wait).
pub fn worker_is_shared() -> bool {
    WORKER_CONNECTIONS.with(Cell::get) > 1
}

/// An IMF-fixdate is always 29 bytes ("Sun, 06 Nov 1994 08:49:37 GMT").
pub type HttpDate = [u8; 29];

/// The Date header value, formatted at most once per second per thread, returned by value (no allocation).
pub fn http_date() -> HttpDate {
    thread_local! {
        static CACHE: Cell<(u64, HttpDate)> = const { Cell::new((u64::MAX, [b' '; 29])) };
    }
    let second = crate::stats::unix_now().unsigned_abs();
    CACHE.with(|cache| {
        let (cached_second, value) = cache.get();
        if cached_second == second {
            return value;
        }
        let mut value = [b' '; 29];
        let text = crate::header_values::format_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(second));
        let n = text.len().min(29);
        value[..n].copy_from_slice(&text.as_bytes()[..n]);
        cache.set((second, value));
        value
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_gateway_cannot_join_the_workers_reuseport_group() {
        let workers = bind_data_listeners("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let addr = workers[0].local_addr().unwrap();
        assert!(workers.iter().all(|l| l.local_addr().unwrap() == addr), "the workers share one address");
        // Another gateway's first socket binds exclusively, so it fails although every worker socket is reuseport.
        let err = bind_data_listeners(addr, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("only one gateway"), "{err}");
        assert_eq!(listen_exclusive(addr, 16).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        // Two gateways starting at once: one is bound but not yet listening when the other listens. The one that
        // listens first holds the address alone; the other's `listen` then fails (before, both had turned
        // SO_REUSEPORT on before listening, and both listened as one group).
        let late = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        late.set_reuse_address(true).unwrap();
        late.bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into()).unwrap();
        let contested = late.local_addr().unwrap().as_socket().unwrap();
        let first = listen_exclusive(contested, 16).unwrap();
        first.set_reuse_port(true).unwrap();
        assert_eq!(late.listen(16).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        // Once the first gateway is gone, the address is free again at once (a restart).
        drop(workers);
        assert_eq!(bind_data_listeners(addr, 2).unwrap().len(), 2);
    }
}
