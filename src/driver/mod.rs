//! The data listener: our own HTTP/1.1 server, because hyper cannot hand a file to `sendfile(2)`.
//!
//! - `mod.rs`: the accept loop (connection cap, accept back-off, shutdown) and the shared context.
//! - `conn.rs`: the per-connection loop; calls the axum `Router` as a tower `Service`.
//! - `head.rs`: pure request-head parsing and response-head writing.
//! - `sendfile.rs`: the only code that touches raw fds: `send(MSG_MORE)` for heads, `sendfile` for bodies.

mod conn;
pub mod head;
pub mod sendfile;

use std::cell::Cell;
use std::io;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Settings;
use crate::metrics::DriverMetrics;
use crate::metrics::downloads::DownloadRecorder;
use head::HeadLimits;
use sendfile::SendOptions;

/// Everything a connection needs, shared by all of them.
pub struct DriverContext {
    pub router: Router,
    pub head_limits: HeadLimits,
    pub timeouts: crate::config::Timeouts,
    pub send: SendOptions,
    pub metrics: DriverMetrics,
    /// Per-object download records go here; never blocks.
    pub recorder: DownloadRecorder,
}

impl DriverContext {
    pub fn new(router: Router, settings: &Settings, recorder: DownloadRecorder) -> Self {
        Self {
            router,
            head_limits: HeadLimits {
                max_head_bytes: settings.limits.max_head_bytes,
                max_headers: settings.limits.max_headers,
                max_uri_bytes: settings.limits.max_uri_bytes,
            },
            timeouts: settings.timeouts.clone(),
            send: SendOptions {
                chunk: settings.limits.sendfile_chunk_bytes,
                progress_timeout: settings.timeouts.send_progress,
            },
            metrics: DriverMetrics::new(),
            recorder,
        }
    }
}

/// Accepts connections until `shutdown` fires, then returns (dropping the listener, so new connections are
/// refused). Connection tasks are spawned on `tracker` so the caller can wait for in-flight responses.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<DriverContext>,
    max_connections: usize,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    // A permit per open connection: at the cap we stop accepting and let the kernel backlog hold the rest.
    let slots = Arc::new(Semaphore::new(max_connections));
    let mut backoff = Duration::from_millis(5);
    loop {
        let permit = tokio::select! {
            permit = slots.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            _ = shutdown.cancelled() => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => {
                backoff = Duration::from_millis(5);
                pair
            }
            Err(e) if is_resource_exhaustion(&e) => {
                // EMFILE and friends: keep serving the connections we have and retry later, instead of spinning.
                tracing::warn!(error = %e, backoff_ms = backoff.as_millis() as u64, "accept failed; backing off");
                ctx.metrics.accept_error();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = shutdown.cancelled() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
            Err(e) => {
                // ECONNABORTED and similar concern one connection only.
                tracing::debug!(error = %e, "accept failed");
                continue;
            }
        };
        // Heads and small responses must not wait for Nagle + delayed ACK (40 ms).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _open = ctx.metrics.connection_opened();
            conn::Connection::new(stream, peer, ctx.clone()).run(shutdown).await;
            drop(permit);
        });
    }
}

fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// An IMF-fixdate is always 29 bytes ("Sun, 06 Nov 1994 08:49:37 GMT").
pub type HttpDate = [u8; 29];

/// The Date header value, formatted at most once per second per thread, returned by value (no allocation).
pub fn http_date() -> HttpDate {
    thread_local! {
        static CACHE: Cell<(u64, HttpDate)> = const { Cell::new((u64::MAX, [b' '; 29])) };
    }
    let now = SystemTime::now();
    let second = now.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    CACHE.with(|cache| {
        let (cached_second, value) = cache.get();
        if cached_second == second {
            return value;
        }
        let mut value = [b' '; 29];
        let text = crate::http::conditional::format_http_date(now);
        let n = text.len().min(29);
        value[..n].copy_from_slice(&text.as_bytes()[..n]);
        cache.set((second, value));
        value
    })
}
