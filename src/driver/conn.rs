//! One connection, on either listener: read a head, call the application service, write the response, repeat
//! (keep-alive and pipelining, strictly in order). Timeouts: `header_read` from accept (an HTTPS handshake
//! included) or from the first byte of a request until its head is complete, `keep_alive_idle` between requests,
//! and `send_progress` while a response is being written.
//!
//! While a data connection waits for a head with zero bytes of it read, it is in its worker's idle list
//! (`idle.rs`): at the connection cap the worker may close it then, and only then, to admit a new client.
//!
//! A request may have a body where its listener takes one (PUT and POST on the data listener, any method on the
//! admin listener; `body.rs` follows its framing). The service gets it as a stream the connection feeds while it
//! awaits the response ([`BodyPump`]): nothing is read before the service first polls the body (then
//! `100 Continue` goes out if the client asked for it), at most [`BODY_READ_BYTES`] per read, and one chunk waits
//! in the channel at most, so a slow handler slows the client down instead of filling memory. Every read first
//! takes its share of the body budget (`budget.rs`), once the socket is readable (a client that sends nothing
//! holds none), and the decoded chunks carry that share until the handler drops them: however many bodies arrive
//! at once, the bytes they hold in memory stay within `limits.upload_buffer_bytes`. A response given before the
//! body was read to its end closes the connection: the rest is never parsed as a next request.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::response::Response;
use bytes::{Buf, Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{Method, Request, StatusCode, Version};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::admission::Admission;
use super::body::{BodyDecoder, BodyFraming, Decoded};
use super::budget::{BodyBudget, budgeted};
use super::head::{Parsed, Persistence, RequestHead, parse_request_head, write_response_head};
use super::idle::IdleEntry;
use super::send::{SendOutcome, SendReport, send_bytes, send_file_response};
use super::tls::{HandshakeFailure, Session};
use super::{Answer, ClientAddr, DriverContext, FileAnswer, Listener, Refusal, RequestService};
use crate::access_log::{Entry, REQUEST_ID_HEADER, RequestId};
use crate::file_body::{DownloadKind, FileBody, ObjectRef};
use crate::header_values::fields::{self, FieldName, Fields};
use crate::stats::{DownloadRecord, Outcome, RecordKind};

/// Largest buffered (non-file) response body we accept from a data handler: errors and small JSON only. The
/// admin listener takes any size (listings, `/stats`, `/metrics`): its handlers build their bodies in memory
/// anyway. Bodies up to this size go out in one send with their head, larger ones in a second.
const MAX_BUFFERED_BODY: usize = 1 << 20;

/// The largest response-head buffer a connection keeps between responses (a head is a few hundred bytes).
const KEPT_OUT_BYTES: usize = 2 * 1024;

/// The most one read of a request body takes from the socket, and the share of the body budget it waits for.
pub const BODY_READ_BYTES: usize = 64 * 1024;

/// Sent when the service first polls the body of a request that asked for it (RFC 9110 §10.1.1).
const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// The answer to a plain-HTTP request on an HTTPS listener.
const PLAIN_HTTP_ON_HTTPS: &str = "400 Bad Request: this port speaks HTTPS only; use an https:// URL.\n";

/// Noted in the access log only.
static USER_AGENT: FieldName = FieldName::other(header::USER_AGENT);

enum NextHead {
    Head(Box<RequestHead>),
    /// Clean end: EOF between requests, idle timeout, or shutdown while idle.
    Closed,
    /// A malformed or over-limit head (or a timeout mid-head): answer this, then close.
    Refuse(StatusCode, &'static str),
}

/// Outcome of one read into the scratch buffer.
enum Read {
    Head(Box<RequestHead>),
    /// Bytes read, but no complete head yet: wait for more.
    More,
    Closed,
    Refuse(StatusCode, &'static str),
}

/// Bytes per read into the scratch buffer: a whole typical request head, and the default head limit.
const SCRATCH_BYTES: usize = 16 * 1024;

thread_local! {
    /// One read buffer per data worker thread, shared by all of its connections: a read and the parse of a
    /// head happen without an await in between, so no two connections ever use it at once.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0u8; SCRATCH_BYTES].into_boxed_slice());
}

/// What a connection waits on between requests, made once per connection rather than once per request: the
/// timer keeps its place in tokio's timer wheel and a later deadline only moves it (one compare-and-swap, where a
/// new timer per request entered the wheel and left it again under its lock), and the shutdown signal keeps its one
/// place in the token's list of waiters. The timer is reset before each wait; while a response is sent, a deadline
/// that passes only wakes the connection once for nothing.
struct Waits<'a, 't> {
    timer: Pin<&'a mut tokio::time::Sleep>,
    shutdown: Pin<&'a mut tokio_util::sync::WaitForCancellationFuture<'t>>,
}

/// The connection's socket and, on HTTPS, its TLS session: every byte in and out goes through here. A kernel
/// session sends as plain HTTP does (the kernel encrypts); only its reads differ.
struct Link {
    stream: TcpStream,
    tls: Option<Session>,
}

impl Link {
    /// Reads into `dst` (decrypted on HTTPS); `Ok(0)` at the end.
    ///
    /// On plain HTTP this goes through `AsyncRead::poll_read` rather than `readable()` + `try_read`: a read that
    /// leaves the buffer part-empty has drained the socket, and tokio then clears the readiness itself. With
    /// `try_read`, the next request would start with a `recvfrom` that can only fail with EAGAIN.
    fn poll_read(&mut self, cx: &mut Context<'_>, dst: &mut [u8]) -> Poll<io::Result<usize>> {
        use tokio::io::AsyncRead;
        match &mut self.tls {
            None => {
                let mut read_buf = tokio::io::ReadBuf::new(dst);
                std::task::ready!(Pin::new(&mut self.stream).poll_read(cx, &mut read_buf))?;
                Poll::Ready(Ok(read_buf.filled().len()))
            }
            Some(tls) => tls.poll_read(cx, &self.stream, dst),
        }
    }

    /// Waits until a read would find bytes (or the end).
    async fn readable(&mut self) -> io::Result<()> {
        match &mut self.tls {
            None => self.stream.readable().await,
            Some(tls) => std::future::poll_fn(|cx| tls.poll_readable(cx, &self.stream)).await,
        }
    }

    /// Appends what can be read now to `buf` (up to its spare capacity): `WouldBlock` when nothing can.
    fn try_read_buf(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match &mut self.tls {
            None => self.stream.try_read_buf(buf),
            Some(tls) => {
                let filled = buf.len();
                buf.resize(buf.capacity(), 0);
                let read = tls.try_read(&self.stream, &mut buf[filled..]);
                buf.truncate(filled + *read.as_ref().unwrap_or(&0));
                read
            }
        }
    }

    /// Writes `bytes` (heads, boundaries, small bodies); `more`: the next send follows at once.
    async fn send(&mut self, bytes: &[u8], more: bool, timeout: Duration) -> Result<(), SendOutcome> {
        match self.tls.as_mut().and_then(Session::user) {
            None => send_bytes(&self.stream, bytes, more, timeout).await,
            // Boxed, so that plain connections' futures stay the size they were.
            Some(tls) => Box::pin(tls.send(&self.stream, bytes, more, timeout)).await,
        }
    }

    /// A file response: by sendfile, or read and encrypted in user space on HTTPS.
    async fn send_file(&mut self, head: &[u8], body: &FileBody, ctx: &DriverContextSend<'_>) -> SendReport {
        match self.tls.as_mut().and_then(Session::user) {
            None => send_file_response(&self.stream, head, body, ctx.options, ctx.metrics).await,
            Some(tls) => Box::pin(tls.send_file_response(&self.stream, head, body, ctx.options, ctx.metrics)).await,
        }
    }

    /// The access log's `tls`.
    fn tls_mode(&self) -> Option<&'static str> {
        self.tls.as_ref().map(Session::mode)
    }

    /// Sends close_notify on HTTPS, if the socket takes it now.
    fn close(&mut self) {
        if let Some(tls) = &mut self.tls {
            tls.close(&self.stream);
        }
    }
}

/// What a file send needs of the context.
struct DriverContextSend<'a> {
    options: &'a super::send::SendOptions,
    metrics: &'a crate::metrics::DriverMetrics,
}

pub(crate) struct Connection<S> {
    link: Link,
    peer: SocketAddr,
    /// When the connection was accepted (given its slot): `timeouts.header_read` runs from here to the first
    /// request's complete head, the TLS handshake included.
    accepted: Instant,
    /// Bytes read but not yet parsed; may hold the start of the next pipelined request.
    buf: BytesMut,
    /// Response heads are serialised here; reused for every response on the connection.
    out: Vec<u8>,
    ctx: Arc<DriverContext<S>>,
    admission: Arc<Admission>,
    /// Whether this connection joins the idle list while it waits (it holds a slot under the cap that closing
    /// it would free).
    reclaimable: bool,
    /// Requests answered on this connection so far (the access log's `connection_requests`).
    served: u32,
    /// Status and body bytes of the last response written, for the access log.
    last_sent: (StatusCode, u64),
}

impl<S: RequestService> Connection<S> {
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        ctx: Arc<DriverContext<S>>,
        admission: Arc<Admission>,
    ) -> Self {
        Self {
            link: Link { stream, tls: None },
            peer,
            accepted: Instant::now(),
            buf: BytesMut::new(),
            out: Vec::new(),
            // Only data workers keep idle lists; an admin connection is never reclaimed.
            reclaimable: matches!(ctx.listener, Listener::Data),
            ctx,
            admission,
            served: 0,
            last_sent: (StatusCode::OK, 0),
        }
    }

    /// For a client over `limits.max_connections_per_ip`: reads its request head (so that closing does not
    /// reset the connection under an unread request) and answers 503 with `Connection: close`.
    pub(crate) async fn refuse_over_address_limit(mut self, shutdown: &CancellationToken) {
        self.reclaimable = false;
        if !self.start_tls(shutdown).await {
            return;
        }
        let (timer, cancelled) = (tokio::time::sleep_until(Instant::now()), shutdown.cancelled());
        tokio::pin!(timer, cancelled);
        let error = match self.next_head(true, Waits { timer, shutdown: cancelled }).await {
            NextHead::Head(_) => Refusal::TooManyConnectionsFromAddress,
            NextHead::Closed => return,
            NextHead::Refuse(status, message) => Refusal::BadHead { status, message },
        };
        let response = (self.ctx.render_refusal)(error);
        let _ = self.send_buffered(response, false, Persistence::Close).await;
    }

    pub(crate) async fn run(mut self, shutdown: CancellationToken) {
        if !self.start_tls(&shutdown).await {
            return;
        }
        self.serve(&shutdown).await;
        self.link.close();
    }

    /// On HTTPS, the handshake, within `timeouts.header_read` of accept (the same deadline then bounds the first
    /// head: the handshake and the head share one budget); whether the connection goes on. A client that spoke
    /// plain HTTP to the port gets its plain-text 400 here.
    async fn start_tls(&mut self, shutdown: &CancellationToken) -> bool {
        let Some(server) = self.ctx.tls.clone() else { return true };
        let handshake = server.accept(&self.link.stream, self.ctx.send.progress_timeout);
        let deadline = self.accepted + self.ctx.timeouts.header_read;
        let result = tokio::select! {
            result = tokio::time::timeout_at(deadline, handshake) => {
                result.unwrap_or(Err(HandshakeFailure::Timeout))
            }
            () = shutdown.cancelled() => return false,
        };
        match result {
            Ok(session) => {
                crate::metrics::tls_connection(session.mode());
                self.link.tls = Some(session);
                true
            }
            Err(failure) => {
                crate::metrics::tls_handshake_failure(failure.label());
                tracing::debug!(peer = %self.peer, reason = failure.label(), "TLS handshake did not finish");
                if failure == HandshakeFailure::PlainHttp {
                    self.refuse_plain_http(shutdown).await;
                }
                false
            }
        }
    }

    /// Reads the head of a plain-HTTP request sent to the HTTPS port (so that the close does not reset it unread)
    /// and answers it, unencrypted, with a plain-text 400 and a close.
    async fn refuse_plain_http(&mut self, shutdown: &CancellationToken) {
        self.reclaimable = false;
        let (timer, cancelled) = (tokio::time::sleep_until(Instant::now()), shutdown.cancelled());
        tokio::pin!(timer, cancelled);
        if let NextHead::Closed = self.next_head(true, Waits { timer, shutdown: cancelled }).await {
            return;
        }
        let mut response = Response::new(Body::from(PLAIN_HTTP_ON_HTTPS));
        *response.status_mut() = StatusCode::BAD_REQUEST;
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        let _ = self.send_buffered(response, false, Persistence::Close).await;
    }

    /// The request loop, once the connection is ready for heads.
    async fn serve(&mut self, shutdown: &CancellationToken) {
        let mut first = true;
        let (timer, cancelled) = (tokio::time::sleep_until(Instant::now()), shutdown.cancelled());
        tokio::pin!(timer, cancelled);
        loop {
            let waits = Waits { timer: timer.as_mut(), shutdown: cancelled.as_mut() };
            let head = match self.next_head(first, waits).await {
                NextHead::Head(head) => head,
                NextHead::Closed => return,
                NextHead::Refuse(status, message) => {
                    if status == StatusCode::HTTP_VERSION_NOT_SUPPORTED {
                        // A client's choice (an HTTP/2 preface, say), not our failure: info, not error.
                        tracing::info!(peer = %self.peer, reason = message, "refused a request in another HTTP version");
                    }
                    let response = (self.ctx.render_refusal)(Refusal::BadHead { status, message });
                    let _ = self.send_buffered(response, false, Persistence::Close).await;
                    return;
                }
            };
            first = false;
            if !self.respond(head, shutdown).await {
                return;
            }
        }
    }

    async fn next_head(&mut self, first: bool, mut waits: Waits<'_, '_>) -> NextHead {
        let (header_read, keep_alive_idle) = (self.ctx.timeouts.header_read, self.ctx.timeouts.keep_alive_idle);
        // The header clock starts at accept for the first request (an HTTPS handshake used part of it) and at its
        // first byte for later ones.
        let started = Instant::now();
        let mut head_deadline = first.then(|| self.accepted + header_read);
        let idle_deadline = started + self.admission.keep_alive_idle(keep_alive_idle);
        // Our place in the idle list while nothing of the next head has arrived; leaves it when dropped.
        let mut idle: Option<IdleEntry> = None;
        if self.buf.is_empty() && self.buf.capacity() > 0 {
            // Leftovers are consumed: give the memory back, so idle connections hold no buffer.
            self.buf = BytesMut::new();
        }
        loop {
            if !self.buf.is_empty() {
                head_deadline.get_or_insert_with(|| Instant::now() + header_read);
                match parse_request_head(&self.buf, &self.ctx.head_limits) {
                    Ok(Parsed::Complete(head)) => {
                        self.buf.advance(head.len);
                        return NextHead::Head(head);
                    }
                    Ok(Parsed::Partial) => {}
                    Err(e) => return NextHead::Refuse(e.status, e.message),
                }
            }
            // Usually later than the last one: the timer's place in the wheel stays, only its deadline moves.
            waits.timer.as_mut().reset(head_deadline.unwrap_or(idle_deadline));
            // Biased: a head that has arrived wins over a deadline that passed meanwhile, as with `timeout_at`, and
            // over a shutdown that began meanwhile (the response then closes the connection). The read goes first
            // so that the poll that finds the head polls nothing else: the shutdown's future takes its list's lock
            // on every poll.
            let read = tokio::select! {
                biased;
                read = std::future::poll_fn(|cx| self.poll_read_or_reclaim(cx, &mut idle, started)) => Some(read),
                () = waits.shutdown.as_mut(), if self.buf.is_empty() => return NextHead::Closed,
                () = waits.timer.as_mut() => None,
            };
            match read {
                Some(Read::Head(head)) => return NextHead::Head(head),
                Some(Read::More) => {}
                Some(Read::Closed) => return NextHead::Closed,
                Some(Read::Refuse(status, message)) => return NextHead::Refuse(status, message),
                None if self.buf.is_empty() => return NextHead::Closed,
                None => {
                    return NextHead::Refuse(StatusCode::REQUEST_TIMEOUT, "request head not received in time");
                }
            }
        }
    }

    /// Reads as `poll_read_into_scratch` does, keeping the connection in the idle list while it has read nothing
    /// of the next head (idle since `since`); `Closed` once the worker chose it for closing (it then ends without
    /// writing a byte).
    fn poll_read_or_reclaim(
        &mut self,
        cx: &mut Context<'_>,
        idle: &mut Option<IdleEntry>,
        since: Instant,
    ) -> Poll<Read> {
        if idle.as_ref().is_some_and(IdleEntry::evicted) {
            tracing::debug!(peer = %self.peer, "closing an idle connection to admit a new one at the connection cap");
            return Poll::Ready(Read::Closed);
        }
        match self.poll_read_into_scratch(cx) {
            Poll::Pending => {
                if self.reclaimable && self.buf.is_empty() {
                    IdleEntry::mark(idle, cx.waker(), since.into_std());
                }
                Poll::Pending
            }
            Poll::Ready(read) => {
                *idle = None;
                Poll::Ready(read)
            }
        }
    }

    /// Reads what the socket has into this worker's scratch buffer and, when nothing was buffered before, parses
    /// the head right there. Only an incomplete head or pipelined bytes after a complete one are copied into the
    /// connection's own buffer, so most connections never hold one.
    fn poll_read_into_scratch(&mut self, cx: &mut Context<'_>) -> Poll<Read> {
        SCRATCH.with_borrow_mut(|scratch| {
            let n = match self.link.poll_read(cx, &mut scratch[..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Read::Closed),
                Poll::Ready(Ok(n)) => n,
            };
            Poll::Ready(self.take_read(&scratch[..n]))
        })
    }

    /// Takes `read` (fresh bytes, empty at EOF): parses it in place when nothing was buffered, else appends it.
    fn take_read(&mut self, read: &[u8]) -> Read {
        match read.len() {
            0 => Read::Closed,
            n if self.buf.is_empty() => match parse_request_head(read, &self.ctx.head_limits) {
                Ok(Parsed::Complete(head)) => {
                    self.buf.extend_from_slice(&read[head.len..n]);
                    Read::Head(head)
                }
                Ok(Parsed::Partial) => {
                    self.buf.extend_from_slice(read);
                    Read::More
                }
                Err(e) => Read::Refuse(e.status, e.message),
            },
            _ => {
                self.buf.extend_from_slice(read);
                Read::More
            }
        }
    }

    /// Serves one request; returns whether the connection may carry another.
    async fn respond(&mut self, mut head: Box<RequestHead>, shutdown: &CancellationToken) -> bool {
        head.peer = self.peer.ip().to_canonical();
        let is_head = head.method == Method::HEAD;
        let mut persistence = match (head.keep_alive && !shutdown.is_cancelled(), head.version) {
            (false, _) => Persistence::Close,
            (true, Version::HTTP_10) => Persistence::KeepAliveHttp10,
            (true, _) => Persistence::KeepAlive,
        };
        // Kept for the log line below only when debug logging is on.
        let logged = tracing::enabled!(tracing::Level::DEBUG).then(|| (head.method.clone(), head.uri()));
        // Only with the access log on: reference-counted clones of what the head holds, no formatting.
        let logs = self.ctx.access_log.is_some() && !self.ctx.unlogged_paths.contains(&head.path());
        let mut access = logs.then(|| (self.access_entry(&head), Instant::now()));
        let claimed = match (&access, self.ctx.listener) {
            (Some(_), Listener::Admin { principal_of }) => principal_of(&head.fields),
            _ => None,
        };
        // A request without a body that the application reads from its head (the data listener's native reads).
        // The context is the connection's, which `call_service` borrows mutably: a reference count per request, as
        // the service's clone for `oneshot` was.
        let ctx = Arc::clone(&self.ctx);
        let from_head = match head.body {
            BodyFraming::None => match ctx.service.answer_head(&head) {
                Some(answer) => Some(answer.await),
                None => None,
            },
            _ => None,
        };
        let (mut answer, mut pump) = match from_head {
            Some(answer) => (answer, None),
            None => {
                let (response, pump) = self.call_service(head).await;
                (Answer::Response(response), pump)
            }
        };
        match pump.take() {
            // What followed the body (a pipelined request) is read from the connection's buffer again.
            Some(pump) if pump.consumed() => self.buf.extend_from_slice(&pump.pending),
            // Answered before the body ended (or the body broke off): its rest must not be read as a request.
            Some(_) => persistence = Persistence::Close,
            None => {}
        }
        if let Some((method, uri)) = logged {
            tracing::debug!(peer = %self.peer, %method, path = uri.path(), status = answer.status().as_u16(), "response");
        }
        if let Some((entry, _)) = &mut access {
            let refused = matches!(answer.status(), StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN);
            // A handler that authorised the request names its principal; else the admin credentials claimed.
            entry.principal = answer.take_principal().or(claimed.filter(|_| !refused));
            entry.throttled = answer.take_throttled();
            answer.headers_mut().insert(REQUEST_ID_HEADER, entry.request_id.header_value());
        }
        let keep = match answer.into_file() {
            Ok(file) => {
                if let Some((entry, _)) = &mut access {
                    entry.encoding = Some(file.body.encoding);
                }
                self.send_file(&file, is_head, persistence).await
            }
            Err(response) => self.send_buffered(response, is_head, persistence).await,
        };
        if let Some((mut entry, started)) = access
            && let Some(log) = &self.ctx.access_log
        {
            (entry.status, entry.bytes) = (self.last_sent.0.as_u16(), self.last_sent.1);
            entry.duration = started.elapsed();
            log.log(entry);
        }
        self.served = self.served.saturating_add(1);
        keep
    }

    /// Calls the service with `head` as an `http::Request`, feeding it the body (if any) while it answers.
    async fn call_service(&mut self, mut head: Box<RequestHead>) -> (Response, Option<BodyPump>) {
        let (body, mut pump) = match head.body {
            BodyFraming::None => (Body::empty(), None),
            framing => {
                let expect_continue = head.version == Version::HTTP_11
                    && head.fields.get(&fields::EXPECT).is_some_and(|v| v.eq_ignore_ascii_case(b"100-continue"));
                let (pump, body) = BodyPump::new(framing, expect_continue, self.ctx.body_budget.clone());
                (body, Some(pump))
            }
        };
        let mut request = Request::new(body);
        *request.uri_mut() = head.uri();
        *request.method_mut() = std::mem::replace(&mut head.method, Method::GET);
        *request.version_mut() = head.version;
        *request.headers_mut() = head.fields.to_header_map();
        request.extensions_mut().insert(ClientAddr(head.peer));
        drop(head);
        let call = self.ctx.service.clone().oneshot(request);
        let Ok(response) = match pump.as_mut() {
            None => call.await,
            // Boxed: the data listener's connection futures (and so its per-connection memory) stay as they were.
            Some(pump) => Box::pin(self.call_with_body(call, pump)).await,
        };
        (response, pump)
    }

    /// Awaits the service's response while feeding it the request body from the socket.
    async fn call_with_body<F: std::future::Future>(&mut self, call: F, pump: &mut BodyPump) -> F::Output {
        tokio::pin!(call);
        loop {
            tokio::select! {
                biased;
                response = &mut call => return response,
                () = pump.run(&mut self.link, &mut self.buf, self.ctx.send.progress_timeout), if !pump.stopped => {}
            }
        }
    }

    /// The access-log entry for `head`, before its response exists.
    fn access_entry(&self, head: &RequestHead) -> Entry {
        Entry {
            time: SystemTime::now(),
            listener: self.ctx.listener.name(),
            remote: self.peer,
            method: head.method.clone(),
            uri: head.uri(),
            status: 0,
            bytes: 0,
            duration: Duration::ZERO,
            principal: None,
            range: head.fields.header_value(&fields::RANGE),
            user_agent: head.fields.header_value(&USER_AGENT),
            request_id: RequestId::next(),
            connection_requests: self.served,
            encoding: None,
            tls: self.link.tls_mode(),
            throttled: None,
        }
    }

    /// Sends a file answer; by reference, as the rest of its way: it stays where `respond` holds it (a move
    /// copies its few hundred bytes).
    async fn send_file(&mut self, file: &FileAnswer, is_head: bool, persistence: Persistence) -> bool {
        let FileAnswer { status, headers, body, .. } = file;
        let status = *status;
        if let Err(why) = check_file_response(status, headers, body) {
            // A handler bug: refuse rather than fall back to copying or send a body that contradicts its head.
            tracing::error!(peer = %self.peer, why, "inconsistent file response");
            let response = (self.ctx.render_refusal)(Refusal::InconsistentFileResponse(why));
            let _ = self.send_buffered(response, is_head, Persistence::Close).await;
            return false;
        }
        let mut head = std::mem::take(&mut self.out);
        head.clear();
        write_response_head(
            &mut head,
            status,
            headers,
            body.shared_fields.as_ref(),
            Some(body.total_len()),
            &super::http_date(),
            persistence,
        );
        let keep = self.send_file_head_and_body(&head, status, body, is_head, persistence).await;
        if head.capacity() <= KEPT_OUT_BYTES {
            self.out = head;
        }
        keep
    }

    async fn send_file_head_and_body(
        &mut self,
        head: &[u8],
        status: StatusCode,
        body: &FileBody,
        is_head: bool,
        persistence: Persistence,
    ) -> bool {
        if is_head {
            self.last_sent = (status, 0);
            let sent = self.link.send(head, false, self.ctx.send.progress_timeout).await;
            // An error document answers for a missing key: a response, never the document's download or HEAD.
            if body.kind == DownloadKind::ErrorDocument {
                self.ctx.metrics.error_document_sent(status, 0);
            } else {
                self.observe(DownloadRecord::now(body.object.clone(), status.as_u16(), RecordKind::Head), 0);
            }
            return sent.is_ok() && persistence != Persistence::Close;
        }
        let started = Instant::now();
        let _active = self.ctx.metrics.download_started();
        let send = DriverContextSend { options: &self.ctx.send, metrics: &self.ctx.metrics };
        let report = self.link.send_file(head, body, &send).await;
        self.last_sent = (status, report.object_bytes);
        let kind = match body.kind {
            DownloadKind::Full => Some(RecordKind::Full),
            DownloadKind::Range => Some(RecordKind::Range),
            DownloadKind::Multipart => Some(RecordKind::Multipart),
            DownloadKind::ErrorDocument => None,
        };
        if let Some(kind) = kind {
            let mut record = DownloadRecord::now(body.object.clone(), status.as_u16(), kind);
            record.planned_bytes = body.object_len();
            record.sent_bytes = report.object_bytes;
            record.duration = started.elapsed();
            record.outcome = match &report.outcome {
                SendOutcome::Completed => Outcome::Completed,
                SendOutcome::Truncated { .. } => Outcome::Truncated,
                SendOutcome::Stalled | SendOutcome::Aborted(_) => Outcome::Aborted,
            };
            self.observe(record, report.sendfile_calls);
        } else {
            self.ctx.metrics.error_document_sent(status, report.sendfile_calls);
        }
        self.after_file_send(&report.outcome, body, persistence)
    }

    /// Whether the connection goes on after a file body was sent with `outcome`; logs what cut it short.
    fn after_file_send(&self, outcome: &SendOutcome, body: &FileBody, persistence: Persistence) -> bool {
        match outcome {
            SendOutcome::Completed => persistence != Persistence::Close,
            SendOutcome::Truncated { missing } => {
                tracing::error!(peer = %self.peer, key = %body.object.key, missing,
                    "sendfile reported that the blob was truncated; closing the connection");
                false
            }
            SendOutcome::Stalled => {
                self.ctx.metrics.stalled();
                tracing::info!(peer = %self.peer, key = %body.object.key, "client made no progress (it read nothing, or its slice never came from the object store); closing");
                false
            }
            SendOutcome::Aborted(e) => {
                tracing::debug!(peer = %self.peer, key = %body.object.key, error = %e, "client went away mid-response");
                false
            }
        }
    }

    /// Counts a finished object response in Prometheus and hands its record to the stats batcher.
    fn observe(&self, record: DownloadRecord, sendfile_calls: u64) {
        self.ctx.metrics.finished(&record, sendfile_calls);
        self.ctx.recorder.record(record);
    }

    /// Writes a response whose (small) body is in memory: errors, JSON, redirects, 304s.
    async fn send_buffered(&mut self, response: Response, is_head: bool, persistence: Persistence) -> bool {
        let (mut parts, body) = response.into_parts();
        let limit = match self.ctx.listener {
            Listener::Data => MAX_BUFFERED_BODY,
            Listener::Admin { .. } => usize::MAX,
        };
        let Ok(bytes) = axum::body::to_bytes(body, limit).await else {
            tracing::error!("handler produced an unreadable or oversized in-memory body");
            return false;
        };
        let status = parts.status;
        let bodiless =
            status.is_informational() || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED;
        if bodiless {
            parts.headers.remove(header::CONTENT_LENGTH);
        } else if !(is_head && parts.headers.contains_key(header::CONTENT_LENGTH)) {
            parts.headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
        }
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        write_response_head(&mut out, status, &parts.headers, None, None, &super::http_date(), persistence);
        let with_body = !is_head && !bodiless;
        let separate = with_body && bytes.len() > MAX_BUFFERED_BODY;
        if with_body && !separate {
            out.extend_from_slice(&bytes);
        }
        match parts.extensions.remove::<ObjectRef>() {
            Some(object) if status == StatusCode::NOT_MODIFIED => {
                self.observe(DownloadRecord::now(object, status.as_u16(), RecordKind::NotModified), 0)
            }
            // The responses series counts the data listener's answers and every listener's downloads.
            _ if matches!(self.ctx.listener, Listener::Data) => self.ctx.metrics.other_response(status),
            _ => {}
        }
        let timeout = self.ctx.send.progress_timeout;
        let mut sent = self.link.send(&out, separate, timeout).await;
        if separate && sent.is_ok() {
            sent = self.link.send(&bytes, false, timeout).await;
        }
        let body_bytes = if is_head || bodiless || sent.is_err() { 0 } else { bytes.len() as u64 };
        self.last_sent = (status, body_bytes);
        // Kept for the next response while it holds a head's worth; one an in-memory body grew is freed, so that
        // an idle keep-alive connection holds no more than that.
        if out.capacity() <= KEPT_OUT_BYTES {
            self.out = out;
        }
        sent.is_ok() && persistence != Persistence::Close
    }
}

/// Feeds one request body from the socket to the service (see the module doc). Lives beside the service's
/// response future for one request; its state survives the `select!` that drops its `run` future.
struct BodyPump {
    decoder: BodyDecoder,
    /// Read but not yet decoded: the bytes that came with the head, then each budgeted read in turn. Between
    /// reads only part of a framing line is left here; after the body, whatever followed it.
    pending: Bytes,
    budget: BodyBudget,
    /// To the service's body; dropped at the body's end, which the service reads as the end of the stream.
    chunks: Option<mpsc::Sender<io::Result<Bytes>>>,
    /// Notified by the service's first poll of the body.
    demand: Arc<Notify>,
    expect_continue: bool,
    /// The pump has nothing more to do: the body ended, broke off, or the service dropped it.
    stopped: bool,
}

impl BodyPump {
    fn new(framing: BodyFraming, expect_continue: bool, budget: BodyBudget) -> (Self, Body) {
        let (tx, rx) = mpsc::channel(1);
        let demand = Arc::new(Notify::new());
        let body = Body::from_stream(PumpedBody { chunks: rx, demand: Some(demand.clone()) });
        let pump = Self {
            decoder: BodyDecoder::new(framing),
            pending: Bytes::new(),
            budget,
            chunks: Some(tx),
            demand,
            expect_continue,
            stopped: false,
        };
        (pump, body)
    }

    /// Whether the whole body's framing was read from the socket, so the connection may carry another request.
    fn consumed(&self) -> bool {
        self.decoder.is_done()
    }

    /// Waits for the service to ask for the body, then moves it from `buf` and the socket into the channel until
    /// it ends; a read error, EOF or broken framing reaches the service as a body error. `buf`'s bytes (what came
    /// with the head) take their share of the budget too.
    async fn run(&mut self, link: &mut Link, buf: &mut BytesMut, send_timeout: Duration) {
        self.demand.notified().await;
        // Only if nothing of the body came yet: a client that did not wait needs no invitation.
        if std::mem::take(&mut self.expect_continue)
            && buf.is_empty()
            && link.send(CONTINUE, false, send_timeout).await.is_err()
        {
            self.chunks = None;
            self.stopped = true;
            return;
        }
        if !buf.is_empty() {
            let share = self.budget.acquire(buf.len()).await;
            self.pending = budgeted(buf.split().freeze(), share);
        }
        loop {
            let step = self.decoder.decode(&mut self.pending);
            let Some(chunks) = self.chunks.as_ref() else { break };
            let failure = match step {
                Ok(Decoded::Data(data)) => match chunks.send(Ok(data)).await {
                    Ok(()) => continue,
                    Err(_) => break, // the service dropped the body
                },
                Ok(Decoded::Done) => {
                    self.chunks = None;
                    break;
                }
                Ok(Decoded::NeedMore) => match read_budgeted(link, &self.budget, &mut self.pending).await {
                    Ok(0) => io::Error::new(io::ErrorKind::UnexpectedEof, "the client closed the connection mid-body"),
                    Ok(_) => continue,
                    Err(e) => e,
                },
                Err(e) => io::Error::new(io::ErrorKind::InvalidData, e),
            };
            let _ = chunks.send(Err(failure)).await;
            break;
        }
        self.chunks = None;
        self.stopped = true;
    }
}

/// Reads once from the socket into a fresh buffer of [`BODY_READ_BYTES`] that holds its share of `budget`, after
/// what is left of `pending` (part of a framing line, copied). The share is taken once the socket is readable,
/// so a client that sends nothing holds none; a short read gives back what it did not fill.
async fn read_budgeted(link: &mut Link, budget: &BodyBudget, pending: &mut Bytes) -> io::Result<usize> {
    // Copied out first: the old buffer's share must not be held while this read waits for budget.
    let carry = pending.to_vec();
    *pending = Bytes::new();
    let capacity = BODY_READ_BYTES.max(2 * carry.len());
    loop {
        link.readable().await?;
        let mut share = budget.acquire(capacity).await;
        let mut fresh = Vec::with_capacity(capacity);
        fresh.extend_from_slice(&carry);
        match link.try_read_buf(&mut fresh) {
            Ok(0) => return Ok(0),
            Ok(n) => {
                if fresh.len() < capacity / 2 {
                    // In place with glibc: no copy, and the unused share serves other reads.
                    fresh.shrink_to_fit();
                    drop(share.split(share.num_permits().saturating_sub(fresh.len())));
                }
                *pending = budgeted(fresh, share);
                return Ok(n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The request body as the service sees it: the pump's chunks. Its first poll is the pump's signal to start.
struct PumpedBody {
    chunks: mpsc::Receiver<io::Result<Bytes>>,
    demand: Option<Arc<Notify>>,
}

impl futures_util::Stream for PumpedBody {
    type Item = io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(demand) = self.demand.take() {
            demand.notify_one();
        }
        self.chunks.poll_recv(cx)
    }
}

/// RFC 9112 framing checks before a single file byte goes out: the head must describe exactly the bytes the
/// regions will produce, with no transfer or content coding in between.
fn check_file_response(status: StatusCode, headers: &http::HeaderMap, body: &FileBody) -> Result<(), &'static str> {
    match (body.kind, status) {
        (DownloadKind::ErrorDocument, StatusCode::NOT_FOUND) => {}
        (DownloadKind::ErrorDocument, _) => return Err("an error document goes with 404 only"),
        (_, StatusCode::OK | StatusCode::PARTIAL_CONTENT) => {}
        _ => return Err("file bodies go with 200 or 206 only"),
    }
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return Err("a file response must not carry Transfer-Encoding");
    }
    // The file is the bytes in the coding it says it is (a stored variant): the header may name that coding, and
    // only that one; identity bytes carry none (or `identity`). Several Content-Encoding lines are refused.
    let mut codings = headers.get_all(header::CONTENT_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) if body.encoding.eq_ignore_ascii_case("identity") => {}
        (Some(ce), None) if ce.as_bytes().eq_ignore_ascii_case(body.encoding.as_bytes()) => {}
        (None, _) => return Err("a variant's file response needs its Content-Encoding"),
        _ => return Err("Content-Encoding differs from the file's coding"),
    }
    // Without one, the driver writes the body's own length.
    if let Some(declared) = headers.get(header::CONTENT_LENGTH) {
        let declared = declared.to_str().ok().and_then(|v| v.parse::<u64>().ok());
        if declared != Some(body.total_len()) {
            return Err("Content-Length differs from the body's length");
        }
    }
    if !body.regions_in_bounds() {
        return Err("a region lies outside the file");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_body::Segment;

    fn response(headers: &[(&'static str, &'static str)]) -> Response {
        let mut r = Response::new(Body::empty());
        for (name, value) in headers {
            r.headers_mut().append(*name, HeaderValue::from_static(value));
        }
        r
    }

    fn body(encoding: &'static str) -> FileBody {
        let file = tempfile::tempfile().unwrap();
        file.set_len(10).unwrap();
        FileBody {
            file: Arc::new(file),
            file_size: 10,
            segments: smallvec::smallvec![Segment::Region { offset: 0, len: 10 }],
            kind: DownloadKind::Full,
            object: ObjectRef { bucket_id: 1, key: Arc::from("k") },
            encoding,
            shared_fields: None,
            fill: None,
            held: None,
            pace: None,
            share: None,
        }
    }

    #[test]
    fn content_encoding_must_be_the_files_own_coding() {
        let len = ("content-length", "10");
        for (headers, encoding, ok) in [
            (&[len][..], "identity", true),
            (&[len, ("content-encoding", "identity")][..], "identity", true),
            (&[len, ("content-encoding", "br")][..], "identity", false),
            (&[len, ("content-encoding", "br")][..], "br", true),
            (&[len, ("content-encoding", "GZIP")][..], "gzip", true),
            (&[len, ("content-encoding", "gzip")][..], "br", false),
            (&[len][..], "br", false),
            (&[len, ("content-encoding", "br"), ("content-encoding", "br")][..], "br", false),
            (&[("content-length", "9"), ("content-encoding", "br")][..], "br", false),
            (&[("content-length", "ten")][..], "identity", false),
            (&[][..], "identity", true),
            (&[("content-encoding", "br")][..], "br", true),
        ] {
            let response = response(headers);
            let got = check_file_response(response.status(), response.headers(), &body(encoding));
            assert_eq!(got.is_ok(), ok, "{headers:?} for a {encoding} file: {got:?}");
        }
    }

    #[test]
    fn a_file_goes_with_200_or_206_and_an_error_document_with_404_only() {
        let error_document = FileBody { kind: DownloadKind::ErrorDocument, ..body("identity") };
        for (status, file, ok) in [
            (StatusCode::OK, body("identity"), true),
            (StatusCode::PARTIAL_CONTENT, body("identity"), true),
            (StatusCode::NOT_FOUND, body("identity"), false),
            (StatusCode::NOT_FOUND, error_document.clone(), true),
            (StatusCode::OK, error_document.clone(), false),
            (StatusCode::PARTIAL_CONTENT, error_document, false),
        ] {
            let r = response(&[("content-length", "10")]);
            assert_eq!(check_file_response(status, r.headers(), &file).is_ok(), ok, "{status} with {:?}", file.kind);
        }
    }
}
