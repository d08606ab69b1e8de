//! The only module that touches raw file descriptors: writing response heads and boundaries with `send(2)`
//! (`MSG_MORE`), and object bytes with `sendfile(2)` from explicit offsets. Readiness comes from tokio
//! (`writable()` + `try_io`), so a slow client parks the task, never a thread.
//!
//! **Readiness rule:** tokio's write readiness is cleared only by `try_io`, and only when the closure's own
//! syscall, made on this thread inside that `try_io`, said EAGAIN. Clearing it on any other evidence (a pool
//! thread's EAGAIN, say) can erase a writable edge that arrived in between, and no other edge may come.
//!
//! **Architecture invariant:** object bytes are only ever handed to the kernel by `sendfile` here. There is no
//! code path that reads a blob into memory.
//!
//! **Cold page cache.** sendfile on a non-blocking socket still blocks the calling thread while it reads the disk,
//! which would stall every connection on that worker. So before a large chunk we ask the kernel whether it is in
//! the page cache (`cachestat(2)`, Linux ≥ 6.5; `mincore(2)` on a mapping otherwise). Resident chunks are sent
//! inline; a cold chunk's sendfile runs on the bounded blocking pool once the socket is writable, so the disk
//! wait blocks a pool thread instead of the event loop (nginx's `aio threads`, but only for chunks that need it).
//! Bulk chunks (≥ 512 KiB) always go to that pool, whose threads run at the lowest priority: see `OFFLOAD_MIN`.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::Duration;

use nix::sys::socket::{MsgFlags, send};
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

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
    /// Bounds concurrent pool sends (cold and bulk chunks) across all connections.
    pub pool_sends: Arc<Semaphore>,
    /// `faults.pool_wouldblock_hold`: zero except in tests.
    pub pool_wouldblock_hold: Duration,
}

/// Chunks smaller than this are sent inline without a residency probe: a cold small read costs about one disk
/// access, less than the probe would cost every hot request.
const PROBE_MIN: u64 = 64 * 1024;
/// Chunks at least this large go to the low-priority pool, cached or not, while the worker has other connections
/// to serve: pushing half a megabyte or more through the TCP stack is itself long enough to delay every small
/// response waiting on the event loop. A lone download stays inline, where it costs less CPU. The figures behind
/// this choice are in docs/measurements.md.
const OFFLOAD_MIN: u64 = 512 * 1024;

/// Observes every sendfile return value as it happens (the Prometheus byte counter), so bytes are counted even
/// when the response later aborts.
pub trait SendObserver {
    fn sent(&self, object_bytes: u64);
    /// A chunk was not in the page cache, so its sendfile ran on the blocking pool.
    fn cold_chunk(&self);
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
    let corked = body.total_len() >= CORK_MIN && set_cork(stream, true);
    send_segments(stream, head, body, options, observer, &mut report).await;
    if corked {
        set_cork(stream, false);
    }
    report
}

/// Whether a chunk of `len` bytes at `offset` is large enough to probe and is not in the page cache, so that reading
/// it would block on the disk (what sends it to the blocking pool).
pub(super) fn chunk_is_cold(file: &File, offset: u64, len: u64) -> bool {
    len >= PROBE_MIN && residency(file, offset, len) == Residency::Cold
}

/// Bodies at least this large are sent under TCP_CORK.
const CORK_MIN: u64 = 256 * 1024;

fn set_cork(stream: &TcpStream, on: bool) -> bool {
    socket2::SockRef::from(stream).set_tcp_cork(on).is_ok()
}

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
    let flags = if more { MsgFlags::from_bits_retain(libc::MSG_MORE) } else { MsgFlags::empty() };
    while !buf.is_empty() {
        // Tried before waiting: a socket tokio knows to be writable takes the bytes at once (no readiness future
        // made and polled), and for one it does not, `try_io` makes no syscall and says WouldBlock.
        match stream.try_io(Interest::WRITABLE, || {
            send(raw(stream).as_raw_fd(), buf, flags | MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
        }) {
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, timeout).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
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
    let mut position = offset as libc::off_t;
    let end = offset + len;
    while (position as u64) < end {
        let mut want = (end - position as u64).min(options.chunk as u64) as usize;
        if let Some(fill) = &body.fill {
            // A cache file filling from the object store: only what has arrived goes out.
            match fill.ready(position as u64, end - position as u64) {
                0 => {
                    fill.wait(position as u64).await.map_err(SendOutcome::Aborted)?;
                    continue;
                }
                ready => want = want.min(ready as usize),
            }
        }
        let chunk = want as u64;
        let offload = (chunk >= OFFLOAD_MIN && super::worker_is_shared())
            || (chunk_is_cold(file, position as u64, chunk) && {
                observer.cold_chunk();
                true
            });
        // sendfile advances `position` by what it sent; the file's own offset is never used, so one open file
        // can serve many concurrent ranges. A pool job goes only to a writable socket; on the event loop the call
        // is tried first, as in `send_bytes`.
        let result = if offload {
            wait_writable(stream, options.progress_timeout).await?;
            send_from_pool(stream, file, &mut position, want, options).await
        } else {
            stream.try_io(Interest::WRITABLE, || {
                nix::sys::sendfile::sendfile(raw(stream), &**file, Some(&mut position), want).map_err(io::Error::from)
            })
        };
        match result {
            Ok(0) => {
                return Err(SendOutcome::Truncated { missing: end - position as u64 });
            }
            Ok(n) => {
                report.object_bytes += n as u64;
                report.sendfile_calls += 1;
                observer.sent(n as u64);
                if n == want && (position as u64) < end {
                    // A full chunk went out and more follows: let other connections run before the next one.
                    tokio::task::yield_now().await;
                }
            }
            // WouldBlock cleared tokio's readiness inside `try_io` (or the pool's probe found the socket full).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_writable(stream, options.progress_timeout).await?,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
}

/// Waits until the socket takes more bytes. It gives up (`Stalled`) only when the peer has acknowledged no bytes
/// for a whole `timeout`, not when the socket merely stayed unwritable that long: Linux reports writability only
/// once about a third of the send buffer has drained, which a steady slow reader can take longer than `timeout`
/// to free while it is still reading.
pub(super) async fn wait_writable(stream: &TcpStream, timeout: Duration) -> Result<(), SendOutcome> {
    let mut writable = std::pin::pin!(stream.writable());
    // Writable at once in the common case: no clock and no syscall.
    if let Poll::Ready(result) = std::future::poll_fn(|cx| Poll::Ready(writable.as_mut().poll(cx))).await {
        return result.map_err(SendOutcome::Aborted);
    }
    let mut acked = bytes_acked(stream);
    loop {
        match tokio::time::timeout(timeout, writable.as_mut()).await {
            Ok(result) => return result.map_err(SendOutcome::Aborted),
            Err(_elapsed) => {
                let now = bytes_acked(stream);
                if now.is_none() || now == acked {
                    return Err(SendOutcome::Stalled);
                }
                acked = now;
            }
        }
    }
}

/// Bytes the peer has acknowledged on this connection (`TCP_INFO`'s `tcpi_bytes_acked`); `None` if the kernel
/// would not say.
fn bytes_acked(stream: &TcpStream) -> Option<u64> {
    // SAFETY: tcp_info is plain integers, so all-zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are live for the call, `len` holds the buffer's size (the kernel writes at most that
    // and stores how much it wrote), and the fd is open while `stream` is borrowed.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    // Kernels before 4.1 have no tcpi_bytes_acked and return a shorter struct.
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + std::mem::size_of::<u64>();
    (rc == 0 && len as usize >= needed).then_some(info.tcpi_bytes_acked)
}

/// Whether the socket has room for more bytes right now, asked of the kernel (`poll(2)` with a zero timeout). An
/// error or hang-up counts as room, so that the next send reports it.
fn socket_has_room(stream: &TcpStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(raw(stream), PollFlags::POLLOUT)];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(_) => fds[0].revents().is_some_and(|r| !r.is_empty()),
        Err(_) => true,
    }
}

/// Whether a byte range of a file is in the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    Resident,
    Cold,
    /// The kernel could not tell us; treated as resident (sent inline, as before there was a probe).
    Unknown,
}

/// Asks the kernel how much of `offset..offset+len` is cached: `cachestat(2)` where the kernel has it, else
/// `mincore(2)` on a temporary read-only mapping of the range.
pub fn residency(file: &File, offset: u64, len: u64) -> Residency {
    cachestat(file, offset, len).unwrap_or_else(|| mincore(file, offset, len))
}

fn pages_in(offset: u64, len: u64, page: u64) -> u64 {
    (offset + len).div_ceil(page) - offset / page
}

fn page_size() -> u64 {
    use nix::unistd::{SysconfVar, sysconf};
    match sysconf(SysconfVar::PAGE_SIZE) {
        Ok(Some(page)) if page > 0 => page as u64,
        _ => 4096,
    }
}

/// `cachestat(2)` (Linux ≥ 6.5). `None` when the kernel lacks it; that answer is remembered.
fn cachestat(file: &File, offset: u64, len: u64) -> Option<Residency> {
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Ordering::Relaxed) {
        return None;
    }
    // The kernel's `struct cachestat_range` and `struct cachestat` (include/uapi/linux/mman.h).
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    const SYS_CACHESTAT: libc::c_long = 451; // the unified syscall table's number (all but alpha)
    let range = Range { off: offset, len };
    let mut stat = Stat::default();
    // SAFETY: `range` and `stat` are live, properly laid out (#[repr(C)], matching the kernel ABI) for the whole
    // call, the fd is open for as long as `file` is borrowed, and flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            &range as *const Range,
            &mut stat as *mut Stat,
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            MISSING.store(true, Ordering::Relaxed);
        }
        return None;
    }
    let pages = pages_in(offset, len, page_size());
    Some(if stat.nr_cache >= pages { Residency::Resident } else { Residency::Cold })
}

/// `mincore(2)` over a read-only mapping of the range: the pre-6.5 probe.
fn mincore(file: &File, offset: u64, len: u64) -> Residency {
    let page = page_size();
    let start = offset / page * page;
    let map_len = (offset + len - start) as usize;
    // A read-only `MAP_SHARED` mapping that hands out raw pointers only (`MmapRaw`): we never read its bytes, so no
    // reference to them exists, and it is unmapped when `map` drops at the end of this function.
    let map = match memmap2::MmapOptions::new().offset(start).len(map_len).map_raw_read_only(file) {
        Ok(m) => m,
        Err(_) => return Residency::Unknown,
    };
    let mut pages = vec![0u8; pages_in(offset, len, page) as usize];
    // SAFETY: `map` is a live mapping of `map_len` bytes starting at a page boundary, and `pages` has one byte per
    // page of it, as mincore requires; mincore reads page tables, not the mapped bytes, and writes only `pages`.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map_len, pages.as_mut_ptr()) };
    match rc {
        0 if pages.iter().all(|p| p & 1 == 1) => Residency::Resident,
        0 => Residency::Cold,
        _ => Residency::Unknown,
    }
}

/// Runs one sendfile call on the low-priority blocking pool (at most `permits` at a time), for a chunk that must
/// come from disk or is bulk. The socket is still non-blocking, so the call sends what fits and returns; only a
/// disk read blocks, and the pool thread yields the CPU to the event loop whenever it wants it.
async fn send_from_pool(
    stream: &TcpStream,
    file: &Arc<File>,
    position: &mut libc::off_t,
    want: usize,
    options: &SendOptions,
) -> io::Result<usize> {
    let _permit = options.pool_sends.clone().acquire_owned().await.map_err(io::Error::other)?;
    // The pool thread sends through its own descriptor of the socket: if this connection's future is dropped while
    // the call runs, a borrowed fd number could by then name another connection's socket.
    let socket = raw(stream).try_clone_to_owned()?;
    let (file, mut offset, hold) = (file.clone(), *position, options.pool_wouldblock_hold);
    let (result, offset) = tokio::task::spawn_blocking(move || {
        let result = nix::sys::sendfile::sendfile(&socket, &*file, Some(&mut offset), want).map_err(io::Error::from);
        if !hold.is_zero() && matches!(&result, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
            hold_until_writable(&socket, hold);
        }
        (result, offset)
    })
    .await
    .map_err(io::Error::other)?;
    *position = offset;
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
            if socket_has_room(stream) { Ok(()) } else { Err(io::Error::from(io::ErrorKind::WouldBlock)) }
        });
    }
    result
}

/// The `faults.pool_wouldblock_hold` hook: waits until the socket is writable (at most `hold`), then a little
/// longer, so that the writable edge reaches the event loop before the connection task learns of the EAGAIN.
fn hold_until_writable(socket: &std::os::fd::OwnedFd, hold: Duration) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let mut fds = [PollFd::new(socket.as_fd(), PollFlags::POLLOUT)];
    let millis = u16::try_from(hold.as_millis()).unwrap_or(u16::MAX);
    let _ = poll(&mut fds, PollTimeout::from(millis));
    std::thread::sleep(Duration::from_millis(100));
}

/// Sets the calling thread's nice value to 19 (Linux nice values are per thread).
pub fn lower_this_thread_priority() {
    // SAFETY: setpriority on the calling thread (who = 0 means "this thread" for PRIO_PROCESS on Linux threads)
    // takes no pointers; failure only leaves the priority as it was.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
}

/// The record keys of one direction of a TLS session, as the kernel takes them (`TLS_TX`, `TLS_RX`).
pub use nix::sys::socket::sockopt::TlsCryptoInfo;

/// Hands a TLS session to the kernel: the `tls` upper-layer protocol, then the keys for each direction. From here
/// on `send` and `sendfile` write plaintext that the kernel encrypts, and reads return decrypted bytes.
pub fn install_kernel_tls(stream: &TcpStream, tx: &TlsCryptoInfo, rx: &TlsCryptoInfo) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(&raw(stream), sockopt::TcpUlp::default(), b"tls")?;
    setsockopt(&raw(stream), sockopt::TcpTlsTx, tx)?;
    setsockopt(&raw(stream), sockopt::TcpTlsRx, rx)?;
    Ok(())
}

/// New receive keys after a TLS 1.3 KeyUpdate (kernels from 6.13 take them; older ones refuse).
pub fn rekey_kernel_tls_rx(stream: &TcpStream, rx: &TlsCryptoInfo) -> io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    Ok(setsockopt(&raw(stream), sockopt::TcpTlsRx, rx)?)
}

/// What one read from a kernel-TLS socket returned.
#[derive(Debug, PartialEq, Eq)]
pub enum KernelTlsRead {
    /// Decrypted application data (`0`: the peer closed the TCP connection).
    Data(usize),
    /// A record of another type (alert, handshake), decrypted: its type and length. Always alone in a read.
    Control { record_type: u8, len: usize },
}

/// The TLS content type of application data.
const APPLICATION_DATA: u8 = 23;

/// One `recvmsg` from a kernel-TLS socket into `buf`, with room for the record-type message the kernel adds for
/// records that are not application data (a plain `read` fails with EIO on those).
pub fn recv_kernel_tls(stream: &TcpStream, buf: &mut [u8]) -> io::Result<KernelTlsRead> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
    let mut cmsg = nix::cmsg_space!(u8);
    let mut iov = [io::IoSliceMut::new(buf)];
    let msg = recvmsg::<SockaddrStorage>(raw(stream).as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty())?;
    let len = msg.bytes;
    let mut record_type = APPLICATION_DATA;
    for message in msg.cmsgs()? {
        if let ControlMessageOwned::TlsGetRecordType(kind) = message {
            record_type = tls_record_type_byte(kind);
        }
    }
    Ok(if record_type == APPLICATION_DATA {
        KernelTlsRead::Data(len)
    } else {
        KernelTlsRead::Control { record_type, len }
    })
}

fn tls_record_type_byte(kind: nix::sys::socket::TlsGetRecordType) -> u8 {
    use nix::sys::socket::TlsGetRecordType as T;
    match kind {
        T::ChangeCipherSpec => 20,
        T::Alert => 21,
        T::Handshake => 22,
        T::ApplicationData => APPLICATION_DATA,
        T::Unknown(byte) => byte,
        // The enum is non-exhaustive: a type nix learns later is not application data.
        _ => 0,
    }
}

/// Sends one record of `record_type` (an alert: close_notify) through the kernel's TLS session, if the socket
/// takes it now; the connection is closing either way.
pub fn send_kernel_tls_record(stream: &TcpStream, record_type: u8, payload: &[u8]) -> io::Result<()> {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    let space = unsafe { libc::CMSG_SPACE(1) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: msghdr is plain integers and pointers, for which all-zero is valid (null name, no flags).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which is CMSG_SPACE(1) bytes long and outlives these calls, so
    // CMSG_FIRSTHDR returns a header inside it with room for one data byte after it, which CMSG_DATA addresses.
    unsafe {
        let header = libc::CMSG_FIRSTHDR(&msg);
        (*header).cmsg_level = libc::SOL_TLS;
        (*header).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*header).cmsg_len = libc::CMSG_LEN(1) as _;
        *libc::CMSG_DATA(header) = record_type;
    }
    // SAFETY: `msg`, its iovec (pointing at `payload`, only read) and its control buffer are live for the call, and
    // the fd is open while `stream` is borrowed.
    let rc = unsafe { libc::sendmsg(raw(stream).as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if rc < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Which of the probed kTLS cipher types the kernel can take a session for, each tried with its `probe` keys on a
/// loopback connection of our own; `Err` says why the kernel takes none (no `tls` module, say).
pub fn kernel_tls_ciphers(probes: impl IntoIterator<Item = (u16, TlsCryptoInfo)>) -> Result<Vec<u16>, String> {
    use nix::sys::socket::{setsockopt, sockopt};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot probe kernel TLS: {e}"))?;
    let addr = listener.local_addr().map_err(|e| format!("cannot probe kernel TLS: {e}"))?;
    let mut supported = Vec::new();
    for (cipher, probe) in probes {
        let client = std::net::TcpStream::connect(addr).map_err(|e| format!("cannot probe kernel TLS: {e}"))?;
        let _server = listener.accept().map_err(|e| format!("cannot probe kernel TLS: {e}"))?;
        if let Err(e) = setsockopt(&client, sockopt::TcpUlp::default(), b"tls") {
            return Err(format!(
                "the kernel has no TLS support (setsockopt TCP_ULP \"tls\": {e}; load the `tls` module)"
            ));
        }
        if setsockopt(&client, sockopt::TcpTlsTx, &probe).is_ok() {
            supported.push(cipher);
        }
    }
    Ok(supported)
}

fn raw(stream: &TcpStream) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsFd;
    stream.as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn page_counting() {
        assert_eq!(pages_in(0, 4096, 4096), 1);
        assert_eq!(pages_in(1, 4096, 4096), 2);
        assert_eq!(pages_in(4095, 2, 4096), 2);
        assert_eq!(pages_in(8192, 1, 4096), 1);
    }

    #[test]
    fn residency_follows_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        f.sync_all().unwrap();
        let file = File::open(&path).unwrap();
        // Freshly written pages are cached.
        assert_eq!(residency(&file, 0, 1 << 20), Residency::Resident);
        // SAFETY: posix_fadvise takes an open fd and numbers only.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(residency(&file, 0, 1 << 20), Residency::Cold);
        assert_eq!(mincore(&file, 4096, 8192), Residency::Cold, "the fallback agrees");
        // Reading it (here, in the test) brings it back.
        std::io::Read::read_to_end(&mut File::open(&path).unwrap(), &mut Vec::new()).unwrap();
        assert_eq!(residency(&file, 0, 1 << 20), Residency::Resident);
        assert_eq!(mincore(&file, 100, 5000), Residency::Resident);
    }
}
