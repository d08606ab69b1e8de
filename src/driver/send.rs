//! The send loop both plain HTTP and kernel TLS use: a response head and literal segments by `send(2)` with
//! `MSG_MORE`, object bytes by `sendfile(2)` from explicit offsets, a chunk at a time. Readiness comes from tokio
//! (`writable()` + `try_io`), so a slow client parks the task, never a thread. The syscalls themselves are in
//! `sys.rs`; nothing here touches a raw fd.
//!
//! **Readiness rule:** tokio's write readiness is cleared only by `try_io`, and only when the closure's own
//! syscall, made on this thread inside that `try_io`, said EAGAIN. Clearing it on any other evidence (a pool
//! thread's EAGAIN, say) can erase a writable edge that arrived in between, and no other edge may come.
//!
//! **Architecture invariant:** the object bytes of a *response* leave only by `sendfile` here, from the page cache
//! to the socket without entering our memory, except under user-space TLS (`tls.rs`), which must encrypt them
//! itself: the one declared exception. Other code does hold blob bytes, none of it to send a response: the blob
//! cache hashes a filled file before its last slice is served (`store/blob_cache.rs`: verification); slices
//! fetched from the object store pass through memory into the cache file, and an upload to the store reads the
//! blob it puts (`store/remote.rs`); writes hash what they store (`store/blobs.rs`: multipart assembly,
//! UploadPartCopy), and precompression reads a text blob to compress it (`store/precompress.rs`).
//!
//! **Cold page cache.** sendfile on a non-blocking socket still blocks the calling thread while it reads the disk,
//! which would stall every connection on that worker. So before a large chunk we ask the kernel whether it is in
//! the page cache (`sys::residency`: `cachestat(2)`, or `mincore(2)` before Linux 6.5). Resident chunks are sent
//! inline; a cold chunk's sendfile runs on the bounded blocking pool once the socket is writable, so the disk
//! wait blocks a pool thread instead of the event loop (nginx's `aio threads`, but only for chunks that need it).
//! Bulk chunks (≥ 512 KiB) always go to that pool, whose threads run at the lowest priority: see `OFFLOAD_MIN`.

use std::fs::File;
use std::io;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use super::fair;
use super::sys::{self, Residency};
use crate::file_body::{FileBody, Segment};

/// How one response's send ended.
#[derive(Debug)]
pub enum SendOutcome {
    Completed,
    /// The client went away or the socket failed (EPIPE, ECONNRESET, ...).
    Aborted(io::Error),
    /// The client read nothing for the whole send-progress timeout.
    Stalled,
    /// sendfile returned 0 with bytes still owed: the file shrank under us. Never padded.
    Truncated {
        missing: u64,
    },
}

#[derive(Debug)]
pub struct SendReport {
    /// Object bytes accepted by the kernel, summed from sendfile's return values.
    pub object_bytes: u64,
    /// sendfile calls that moved bytes (for the Prometheus counter).
    pub sendfile_calls: u64,
    pub outcome: SendOutcome,
}

#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Most bytes per sendfile call; the task yields after each chunk so one fast reader cannot starve others.
    pub chunk: usize,
    pub progress_timeout: Duration,
    /// `limits.min_download_rate`: how long a paused reader's bytes excuse its pause (`wait_writable_paced`).
    pub min_download_rate: u64,
    /// Bounds concurrent pool sends (cold and bulk chunks) across all connections.
    pub pool_sends: Arc<Semaphore>,
    /// `faults.pool_wouldblock_hold`: zero except in tests.
    pub pool_wouldblock_hold: Duration,
}

/// Regions at least this large take turns with other principals' (`fair.rs`); smaller ones are a chunk or two,
/// which cannot crowd anyone out, and skip the bookkeeping.
pub(super) const FAIR_MIN: u64 = 256 * 1024;
/// Chunks smaller than this are sent inline without a residency probe: a cold small read costs about one disk
/// access, less than the probe would cost every hot request.
const PROBE_MIN: u64 = 64 * 1024;
/// Chunks at least this large go to the low-priority pool, cached or not, while the worker has other connections
/// to serve: pushing half a megabyte or more through the TCP stack is itself long enough to delay every small
/// response waiting on the event loop. A lone download stays inline, where it costs less CPU. The figures behind
/// this choice are in docs/measurements.md.
const OFFLOAD_MIN: u64 = 512 * 1024;
/// The most one sendfile call sends while other connections share the worker. Such a call runs on the pool, and
/// the event loop, woken meanwhile by a small request, can wait for the CPU for much of it (the kernel preempts a
/// sendfile only at points of its own): calls this size keep that wait a fraction of a millisecond. The figures are
/// in docs/measurements.md.
const SHARED_CHUNK_MAX: usize = OFFLOAD_MIN as usize;

/// Observes every sendfile return value as it happens (the Prometheus byte counter), so bytes are counted even
/// when the response later aborts.
pub trait SendObserver {
    fn sent(&self, object_bytes: u64);
    /// A chunk was not in the page cache, so its sendfile ran on the blocking pool.
    fn cold_chunk(&self);
    /// Object bytes sent under a bandwidth limit set on `scope`.
    fn paced(&self, scope: &'static str, object_bytes: u64);
}

/// Sends `head`, then every segment of `body`, as one response. Heads and literal segments go with `MSG_MORE`
/// when more follows, so the head leaves in the same TCP segment as the first file bytes.
pub async fn send_file_response(
    stream: &TcpStream,
    head: &[u8],
    body: &FileBody,
    options: &SendOptions,
    observer: &impl SendObserver,
) -> SendReport {
    let mut report = SendReport { object_bytes: 0, sendfile_calls: 0, outcome: SendOutcome::Completed };
    // Large bodies go corked (nginx's tcp_nopush): only full segments leave until the end, instead of a push
    // (and a wake-up of the reader) for every bit of freed socket space. Small bodies rely on MSG_MORE alone,
    // which costs no extra syscalls.
    let corked = body.total_len() >= CORK_MIN && sys::set_cork(stream, true);
    send_segments(stream, head, body, options, observer, &mut report).await;
    if corked {
        sys::set_cork(stream, false);
    }
    report
}

/// Whether a chunk of `len` bytes at `offset` is large enough to probe and is not in the page cache, so that reading
/// it would block on the disk (what sends it to the blocking pool).
pub(super) fn chunk_is_cold(file: &File, offset: u64, len: u64) -> bool {
    len >= PROBE_MIN && sys::residency(file, offset, len) == Residency::Cold
}

/// Bodies at least this large are sent under TCP_CORK.
const CORK_MIN: u64 = 256 * 1024;

async fn send_segments(
    stream: &TcpStream,
    head: &[u8],
    body: &FileBody,
    options: &SendOptions,
    observer: &impl SendObserver,
    report: &mut SendReport,
) {
    // MSG_MORE only when bytes really follow: a head with MSG_MORE and nothing after it waits in the kernel for
    // the cork timer (200 ms) before it leaves.
    let more_follows = body.total_len() > 0;
    if let Err(outcome) = send_bytes(stream, head, more_follows, options.progress_timeout).await {
        report.outcome = outcome;
        return;
    }
    let last = body.segments.len().saturating_sub(1);
    for (i, segment) in body.segments.iter().enumerate() {
        let result = match segment {
            Segment::Literal(bytes) => send_bytes(stream, bytes, i < last, options.progress_timeout).await,
            Segment::Region { offset, len } => {
                send_region(stream, body, *offset, *len, options, report, observer).await
            }
        };
        if let Err(outcome) = result {
            report.outcome = outcome;
            return;
        }
    }
}

/// Writes a buffer completely, from memory. Used only for heads and multipart boundaries.
pub async fn send_bytes(stream: &TcpStream, mut buf: &[u8], more: bool, timeout: Duration) -> Result<(), SendOutcome> {
    while !buf.is_empty() {
        // Tried before waiting: a socket tokio knows to be writable takes the bytes at once (no readiness future
        // made and polled), and for one it does not, `try_io` makes no syscall and says WouldBlock.
        match stream.try_io(Interest::WRITABLE, || sys::send(stream, buf, more)) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, timeout).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
}

/// Where a send is in one region of its file, and how much of the rest can go now: everything for a file whole on
/// disk; for one still filling from an object store (the body's `FillGate`), only bytes that have arrived, the
/// cursor waiting on the gate for the next. The plain and the user-space TLS sends both walk regions with it.
pub(super) struct RegionCursor<'a> {
    /// The body, not its gate: one word where the gate's pointer takes two, in every future that holds a cursor.
    body: &'a FileBody,
    position: u64,
    end: u64,
}

impl<'a> RegionCursor<'a> {
    /// At the start of `len` bytes of `body`'s file from `offset`.
    pub(super) fn new(body: &'a FileBody, offset: u64, len: u64) -> Self {
        Self { body, position: offset, end: offset + len }
    }

    /// The file offset of the next byte to send.
    pub(super) fn position(&self) -> u64 {
        self.position
    }

    /// Bytes of the region not yet sent.
    pub(super) fn remaining(&self) -> u64 {
        self.end - self.position
    }

    /// The length of the next chunk, from [`position`](Self::position): at most `max` bytes, every one of them in
    /// the file now (waiting on the fill gate until the first is); `None` once the region is sent. A wait for the
    /// store counts as the send's progress: after `patience` (the send-progress timeout) with no byte arriving the
    /// send is `Stalled`, as one whose peer reads nothing.
    pub(super) async fn next_chunk(&mut self, max: usize, patience: Duration) -> Result<Option<usize>, SendOutcome> {
        let remaining = self.remaining();
        if remaining == 0 {
            return Ok(None);
        }
        let want = remaining.min(max as u64) as usize;
        let Some(fill) = self.body.fill.as_deref() else { return Ok(Some(want)) };
        loop {
            match fill.ready(self.position, remaining) {
                0 => match tokio::time::timeout(patience, fill.wait(self.position)).await {
                    Ok(waited) => waited.map_err(SendOutcome::Aborted)?,
                    Err(_) => return Err(SendOutcome::Stalled),
                },
                ready => return Ok(Some(want.min(ready as usize))),
            }
        }
    }

    /// The next chunk's length when it can go without a wait (a file whole on disk, bytes left): what
    /// [`next_chunk`](Self::next_chunk) would give, without polling a future for it. `None`: ask `next_chunk`.
    pub(super) fn chunk_now(&self, max: usize) -> Option<usize> {
        (self.body.fill.is_none() && self.position < self.end).then(|| self.remaining().min(max as u64) as usize)
    }

    /// `n` more bytes went out.
    pub(super) fn advance(&mut self, n: usize) {
        self.position += n as u64;
    }
}

async fn send_region(
    stream: &TcpStream,
    body: &FileBody,
    offset: u64,
    len: u64,
    options: &SendOptions,
    report: &mut SendReport,
    observer: &impl SendObserver,
) -> Result<(), SendOutcome> {
    let file = &body.file;
    let mut region = RegionCursor::new(body, offset, len);
    // A large region takes its turns with the other principals' on this worker; a small one goes at once.
    let mut ready = fair::Ready::new(body.share.filter(|_| len >= FAIR_MIN));
    loop {
        // The first arm is every chunk of a data-dir blob: no future polled. Not `while let`: its scrutinee's
        // temporary would take room in this future for the whole loop body.
        let max = if super::worker_is_shared() { options.chunk.min(SHARED_CHUNK_MAX) } else { options.chunk };
        let want = match region.chunk_now(max) {
            Some(want) => want,
            None => match region.next_chunk(max, options.progress_timeout).await? {
                Some(want) => want,
                None => return Ok(()),
            },
        };
        // A paced body sends what its bandwidth grants: the wait is a timer, never a blocked thread, and it is not
        // a stall (the reader is not behind).
        let want = match body.pace.as_deref() {
            Some(pace) => paced(pace, want, &mut ready).await,
            None => want,
        };
        ready.turn().await;
        let (position, chunk) = (region.position(), want as u64);
        let offload = (chunk >= OFFLOAD_MIN && super::worker_is_shared())
            || (chunk_is_cold(file, position, chunk) && {
                observer.cold_chunk();
                true
            });
        // sendfile reads from `position`; the file's own offset is never used, so one open file can serve many
        // concurrent ranges. A pool job goes only to a writable socket; on the event loop the call is tried first,
        // as in `send_bytes`.
        let result = if offload {
            ready.pause();
            wait_writable_paced(stream, options.progress_timeout, options.min_download_rate).await?;
            ready.resume();
            send_from_pool(stream, file, position, want, options).await
        } else {
            stream.try_io(Interest::WRITABLE, move || sys::sendfile(stream, file, position, want))
        };
        let unsent = want - *result.as_ref().unwrap_or(&0);
        if let (Some(pace), 1..) = (body.pace.as_deref(), unsent) {
            pace.refund(unsent as u64);
        }
        match result {
            Ok(0) => {
                return Err(SendOutcome::Truncated { missing: region.remaining() });
            }
            Ok(n) => {
                ready.sent(n as u64);
                if let Some(pace) = body.pace.as_deref() {
                    observer.paced(pace.scope(), n as u64);
                }
                region.advance(n);
                report.object_bytes += n as u64;
                report.sendfile_calls += 1;
                observer.sent(n as u64);
                if n == want && region.remaining() > 0 {
                    // A full chunk went out and more follows: let other connections run before the next one.
                    tokio::task::yield_now().await;
                }
            }
            // WouldBlock cleared tokio's readiness inside `try_io` (or the pool's probe found the socket full).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                ready.pause();
                wait_writable_paced(stream, options.progress_timeout, options.min_download_rate).await?;
                ready.resume();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
}

/// Waits until `pace` grants bytes of a `want`-byte chunk; returns how many. While it waits, the region is not
/// ready for a fair turn (a paced principal holds no one back).
pub(super) async fn paced(pace: &dyn crate::file_body::Pace, want: usize, turns: &mut fair::Ready) -> usize {
    loop {
        match pace.grant(want as u64) {
            Ok(granted) => {
                turns.resume();
                return (granted as usize).clamp(1, want);
            }
            Err(wait) => {
                turns.pause();
                tokio::time::sleep(wait).await
            }
        }
    }
}

/// Waits until the socket takes more bytes. It gives up (`Stalled`) only when the peer has acknowledged no bytes
/// for a whole `timeout`, not when the socket merely stayed unwritable that long: Linux reports writability only
/// once about a third of the send buffer has drained, which a steady slow reader can take longer than `timeout`
/// to free while it is still reading.
pub(super) async fn wait_writable(stream: &TcpStream, timeout: Duration) -> Result<(), SendOutcome> {
    wait_writable_paced(stream, timeout, 0).await
}

/// The longest pause the bytes a connection took can excuse (`wait_writable_paced`): a reader that took a lot
/// and then stopped for good is cut within this, whatever it took.
const MAX_PAUSE_CREDIT: Duration = Duration::from_secs(60);
/// Acknowledged bytes that earn no credit: what a client's receive buffers take without it reading a byte.
const UNEXCUSED_BYTES: u64 = 1 << 20;

/// [`wait_writable`] for an object body: a period in which the peer acknowledged nothing is a stall only once the
/// connection's acknowledged bytes, read at `min_rate` bytes per second, no longer cover the pause (at most
/// [`MAX_PAUSE_CREDIT`]). A reader that takes its whole buffer at once and then sleeps to keep its average rate
/// (curl's `--limit-rate` does) is reading; one that never read (a window shut from the start) took too little to
/// be excused past `timeout`.
pub(super) async fn wait_writable_paced(
    stream: &TcpStream,
    timeout: Duration,
    min_rate: u64,
) -> Result<(), SendOutcome> {
    let mut writable = std::pin::pin!(stream.writable());
    // Writable at once in the common case: no clock and no syscall.
    if let Poll::Ready(result) = std::future::poll_fn(|cx| Poll::Ready(writable.as_mut().poll(cx))).await {
        return result.map_err(SendOutcome::Aborted);
    }
    let mut acked = sys::bytes_acked(stream);
    let mut paused = Duration::ZERO;
    loop {
        match tokio::time::timeout(timeout, writable.as_mut()).await {
            Ok(result) => return result.map_err(SendOutcome::Aborted),
            Err(_elapsed) => {
                let now = sys::bytes_acked(stream);
                if now.is_some() && now != acked {
                    (acked, paused) = (now, Duration::ZERO);
                    continue;
                }
                paused += timeout;
                if paused >= pause_credit(acked, min_rate) {
                    return Err(SendOutcome::Stalled);
                }
            }
        }
    }
}

/// How long a pause `acked` bytes excuse at `min_rate` (never less than none, never more than the cap).
fn pause_credit(acked: Option<u64>, min_rate: u64) -> Duration {
    match acked {
        Some(acked) if min_rate > 0 => {
            let earned = acked.saturating_sub(UNEXCUSED_BYTES);
            Duration::from_secs_f64(earned as f64 / min_rate as f64).min(MAX_PAUSE_CREDIT)
        }
        _ => Duration::ZERO,
    }
}

/// Runs one sendfile call on the low-priority blocking pool (at most `permits` at a time), for a chunk that must
/// come from disk or is bulk. The socket is still non-blocking, so the call sends what fits and returns; only a
/// disk read blocks, and the pool thread yields the CPU to the event loop whenever it wants it.
async fn send_from_pool(
    stream: &TcpStream,
    file: &Arc<File>,
    position: u64,
    want: usize,
    options: &SendOptions,
) -> io::Result<usize> {
    let _permit = options.pool_sends.clone().acquire_owned().await.map_err(io::Error::other)?;
    // The pool thread sends through its own descriptor of the socket: if this connection's future is dropped while
    // the call runs, a borrowed fd number could by then name another connection's socket.
    let socket = sys::PoolSocket::of(stream)?;
    let (file, hold) = (file.clone(), options.pool_wouldblock_hold);
    let result = tokio::task::spawn_blocking(move || {
        let result = socket.sendfile(&file, position, want);
        if !hold.is_zero() && matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            hold_until_writable(&socket, hold);
        }
        result
    })
    .await
    .map_err(io::Error::other)?;
    let short = match &result {
        Ok(n) => *n < want,
        Err(e) => e.kind() == io::ErrorKind::WouldBlock,
    };
    if short {
        // The socket may be full. Never clear tokio's readiness on the pool's word: a writable edge that arrived
        // while the pool ran would be erased with it, and with a client whose window opened once, that edge was
        // the only one coming. Ask the socket now, inside try_io, so that tokio clears only the readiness it
        // observed before this probe, and only if the socket really is full.
        let _ = stream.try_io(Interest::WRITABLE, || {
            if sys::socket_has_room(stream) { Ok(()) } else { Err(io::Error::from(io::ErrorKind::WouldBlock)) }
        });
    }
    result
}

/// The `faults.pool_wouldblock_hold` hook: waits until the socket is writable (at most `hold`), then a little
/// longer, so that the writable edge reaches the event loop before the connection task learns of the EAGAIN.
fn hold_until_writable(socket: &sys::PoolSocket, hold: Duration) {
    socket.wait_writable(hold);
    std::thread::sleep(Duration::from_millis(100));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_body::{DownloadKind, FillGate, ObjectRef};
    use tokio::sync::watch;

    /// The send-progress timeout of these tests.
    const PATIENCE: Duration = Duration::from_secs(30);

    /// A file whose first `n` bytes have arrived, `n` being what the test last sent.
    #[derive(Debug)]
    struct Arrivals(watch::Receiver<u64>);

    impl FillGate for Arrivals {
        fn ready(&self, offset: u64, len: u64) -> u64 {
            self.0.borrow().saturating_sub(offset).min(len)
        }

        fn wait(&self, offset: u64) -> std::pin::Pin<Box<dyn Future<Output = io::Result<()>> + Send>> {
            let mut arrivals = self.0.clone();
            Box::pin(async move {
                arrivals.wait_for(|&n| n > offset).await.map(|_| ()).map_err(|_| io::Error::other("the fill failed"))
            })
        }
    }

    fn body(fill: Option<Arc<dyn FillGate>>) -> FileBody {
        FileBody {
            file: Arc::new(tempfile::tempfile().unwrap()),
            file_size: 2000,
            segments: smallvec::smallvec![Segment::Region { offset: 100, len: 1000 }],
            kind: DownloadKind::Range,
            object: ObjectRef { bucket_id: 1, key: "k".into() },
            encoding: "identity",
            shared_fields: None,
            fill,
            held: None,
            pace: None,
            share: None,
        }
    }

    /// Whether `future` is still waiting after one poll.
    async fn waits<F: Future>(future: std::pin::Pin<&mut F>) -> bool {
        let mut future = future;
        std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx).is_pending())).await
    }

    #[tokio::test]
    async fn a_whole_file_goes_in_chunks_of_at_most_the_maximum() {
        let body = body(None);
        let mut region = RegionCursor::new(&body, 100, 1000);
        let mut chunks = Vec::new();
        while let Some(n) = region.next_chunk(400, PATIENCE).await.unwrap() {
            assert_eq!(region.chunk_now(400), Some(n), "no wait, so the same chunk at once");
            chunks.push((region.position(), n));
            region.advance(n);
        }
        assert_eq!(chunks, [(100, 400), (500, 400), (900, 200)]);
        assert_eq!(region.remaining(), 0);
        assert_eq!(region.chunk_now(400), None);
    }

    #[tokio::test]
    async fn a_filling_file_goes_as_it_arrives_and_the_cursor_waits_for_the_rest() {
        let (arrive, arrivals) = watch::channel(600);
        let body = body(Some(Arc::new(Arrivals(arrivals))));
        let mut region = RegionCursor::new(&body, 100, 1000);
        assert_eq!(region.chunk_now(256), None, "a filling file's chunks are the gate's to give");
        assert_eq!(region.next_chunk(256, PATIENCE).await.unwrap(), Some(256));
        region.advance(256);
        assert_eq!(region.next_chunk(4096, PATIENCE).await.unwrap(), Some(244), "only what has arrived");
        region.advance(244);
        {
            let mut next = std::pin::pin!(region.next_chunk(4096, PATIENCE));
            assert!(waits(next.as_mut()).await, "nothing more has arrived");
            arrive.send(2000).unwrap();
            assert_eq!(next.await.unwrap(), Some(500), "the rest of the region, not the file");
        }
        region.advance(500);
        assert_eq!(region.next_chunk(4096, PATIENCE).await.unwrap(), None);
    }

    #[test]
    fn a_pause_is_excused_by_what_the_connection_took_at_the_floor_rate_up_to_a_minute() {
        assert_eq!(pause_credit(Some(4 << 20), 32 * 1024), Duration::from_secs(60), "4 MiB at 32 KiB/s: capped");
        assert_eq!(pause_credit(Some((1 << 20) + 320 * 1024), 32 * 1024), Duration::from_secs(10));
        assert_eq!(pause_credit(Some(900 * 1024), 32 * 1024), Duration::ZERO, "what a buffer takes unread earns none");
        assert_eq!(pause_credit(Some(64 * 1024), 0), Duration::ZERO, "0: the period alone decides");
        assert_eq!(pause_credit(None, 32 * 1024), Duration::ZERO, "no TCP_INFO: no credit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slice_that_never_arrives_stalls_the_send_after_the_progress_timeout() {
        let (_arrive, arrivals) = watch::channel(100);
        let body = body(Some(Arc::new(Arrivals(arrivals))));
        let mut region = RegionCursor::new(&body, 100, 1000);
        let started = tokio::time::Instant::now();
        assert!(matches!(region.next_chunk(4096, PATIENCE).await, Err(SendOutcome::Stalled)));
        assert!(started.elapsed() >= PATIENCE, "not before the timeout");
    }

    #[tokio::test]
    async fn a_fill_that_fails_aborts_the_send() {
        let (arrive, arrivals) = watch::channel(100);
        let body = body(Some(Arc::new(Arrivals(arrivals))));
        let mut region = RegionCursor::new(&body, 100, 1000);
        drop(arrive);
        assert!(matches!(region.next_chunk(4096, PATIENCE).await, Err(SendOutcome::Aborted(_))));
    }
}
