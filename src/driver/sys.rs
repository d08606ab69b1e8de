//! The driver's raw syscalls: the one file of the driver that touches raw file descriptors or holds `unsafe`
//! (`store/metadata/generation.rs` is the crate's other). Each function is one call, or a few, on a borrowed
//! `TcpStream` or `File`; when to make them, and what they mean for readiness, their callers decide (`send.rs`,
//! `ktls.rs`, `tls.rs`).
//!
//! - `send(2)` with `MSG_MORE` for heads and boundaries, `sendfile(2)` from an explicit offset for object bytes, on
//!   the connection's socket or on a pool thread's own descriptor of it ([`PoolSocket`]);
//! - TCP_CORK, `TCP_INFO`'s acknowledged bytes, a zero-timeout `poll` for room in the socket;
//! - page-cache residency: `cachestat(2)`, else `mincore(2)` on a mapping;
//! - `sched_setscheduler(2)` (`SCHED_IDLE`, else `setpriority(2)`) for the blocking pool's threads;
//! - kernel TLS: `TCP_ULP` and the keys (`TLS_TX`, `TLS_RX`), the start-up cipher probe, `recvmsg(2)` with the
//!   record type, `sendmsg(2)` of a control record.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::socket::MsgFlags;
use tokio::net::TcpStream;

/// `send(2)` of `buf` (`MSG_MORE`: more follows at once), never raising SIGPIPE; the bytes the socket took.
pub fn send(stream: &TcpStream, buf: &[u8], more: bool) -> io::Result<usize> {
    let flags = if more { MsgFlags::from_bits_retain(libc::MSG_MORE) } else { MsgFlags::empty() };
    nix::sys::socket::send(raw(stream).as_raw_fd(), buf, flags | MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
}

/// `sendfile(2)` of at most `len` bytes of `file` from `offset` (the file's own offset is neither used nor moved);
/// the bytes the socket took.
pub fn sendfile(stream: &TcpStream, file: &File, offset: u64, len: usize) -> io::Result<usize> {
    sendfile_at(raw(stream), file, offset, len)
}

fn sendfile_at(socket: impl AsFd, file: &File, offset: u64, len: usize) -> io::Result<usize> {
    let mut offset = offset as libc::off_t;
    nix::sys::sendfile::sendfile(socket, file, Some(&mut offset), len).map_err(io::Error::from)
}

/// The connection's socket under a descriptor of its own (a `dup`), for a blocking-pool thread: if the
/// connection's future is dropped while the call runs, a borrowed fd number could by then name another
/// connection's socket.
pub struct PoolSocket(OwnedFd);

impl PoolSocket {
    pub fn of(stream: &TcpStream) -> io::Result<Self> {
        Ok(Self(raw(stream).try_clone_to_owned()?))
    }

    /// [`sendfile`] through this descriptor.
    pub fn sendfile(&self, file: &File, offset: u64, len: usize) -> io::Result<usize> {
        sendfile_at(&self.0, file, offset, len)
    }

    /// Blocks until the socket is writable, at most `max`.
    pub fn wait_writable(&self, max: Duration) {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLOUT)];
        let millis = u16::try_from(max.as_millis()).unwrap_or(u16::MAX);
        let _ = poll(&mut fds, PollTimeout::from(millis));
    }
}

/// Sets or clears TCP_CORK; whether the socket took it.
pub fn set_cork(stream: &TcpStream, on: bool) -> bool {
    socket2::SockRef::from(stream).set_tcp_cork(on).is_ok()
}

/// Bytes the peer has acknowledged on this connection (`TCP_INFO`'s `tcpi_bytes_acked`); `None` if the kernel
/// would not say.
pub fn bytes_acked(stream: &TcpStream) -> Option<u64> {
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
pub fn socket_has_room(stream: &TcpStream) -> bool {
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

/// Makes glibc's malloc, which C code in the process uses (SQLite's page cache and statements; Rust's allocations
/// go to jemalloc, see [`JEMALLOC_OPTIONS`]), give freed memory back to the kernel promptly: blocks of 128 KiB and
/// more get mappings of their own, unmapped when freed, and a heap's free top beyond 128 KiB is trimmed. By default
/// glibc raises both thresholds after the first large free, and keeps a burst's peak.
pub fn return_freed_memory_promptly() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (param, value) in [(libc::M_MMAP_THRESHOLD, 128 * 1024), (libc::M_TRIM_THRESHOLD, 128 * 1024)] {
        // SAFETY: mallopt takes two integers and only changes the allocator's tuning; a value it refuses leaves
        // the default.
        unsafe { libc::mallopt(param, value) };
    }
}

/// jemalloc's options, read once as it starts (before `main`), from this symbol (its name, `malloc_conf`, carries
/// the `_rjem_` prefix of tikv-jemalloc-sys):
/// - `thp:always`: its mappings are asked for transparent huge pages (`madvise(MADV_HUGEPAGE)`: a kernel set to
///   `madvise`, as many are, gives them only where asked). A metadata cache of a gigabyte read at random otherwise
///   costs a page walk per entry touched (docs/measurements.md, "jemalloc with huge pages").
/// - `background_thread:true` (one), `dirty_decay_ms:1000`, `muzzy_decay_ms:0`: freed memory goes back to the kernel
///   (`MADV_DONTNEED`, so it leaves RSS) within about a second, from a thread of jemalloc's, whether or not the
///   process allocates meanwhile.
///
/// `MALLOC_CONF`'s counterpart for this build, `_RJEM_MALLOC_CONF`, overrides them at run time.
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static JEMALLOC_OPTIONS: JemallocOptions = JemallocOptions(
    c"thp:always,metadata_thp:auto,background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0".as_ptr(),
);

/// A C string pointer, as jemalloc declares `malloc_conf` (`const char *`).
#[repr(transparent)]
pub struct JemallocOptions(*const libc::c_char);

// SAFETY: the pointer is to a string literal, immutable and alive for the whole program; nothing writes through it.
unsafe impl Sync for JemallocOptions {}

/// Puts the calling thread under `SCHED_IDLE` (Linux scheduling policies are per thread), else at nice 19. Under
/// `SCHED_IDLE` a thread that wakes with the normal policy preempts it at once; at nice 19 alone, the scheduler
/// (EEVDF) lets it finish its time slice first, which is milliseconds of an event loop's wait.
pub fn lower_this_thread_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) reads `param`, which lives across the call; failure
    // leaves the policy as it was.
    let idle = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } == 0;
    if !idle {
        // SAFETY: setpriority on the calling thread (who = 0 means "this thread" for PRIO_PROCESS on Linux
        // threads) takes no pointers; failure only leaves the priority as it was.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    }
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

/// `CMSG_SPACE(1)`: room for one control message with one byte of data (a TLS record's type).
const RECORD_TYPE_SPACE: usize = {
    // SAFETY: CMSG_SPACE only computes a size from its argument.
    unsafe { libc::CMSG_SPACE(1) as usize }
};

/// The control buffer of a record-type message: its bytes, aligned as the `cmsghdr` written at their start must be
/// (a `Vec<u8>` is only byte-aligned by its type; it was aligned enough only because malloc aligns more).
#[repr(C)]
union RecordTypeControl {
    bytes: [u8; RECORD_TYPE_SPACE],
    _header: libc::cmsghdr,
}

/// Sends one record of `record_type` (an alert: close_notify) through the kernel's TLS session, if the socket
/// takes it now; the connection is closing either way.
pub fn send_kernel_tls_record(stream: &TcpStream, record_type: u8, payload: &[u8]) -> io::Result<()> {
    let mut control = RecordTypeControl { bytes: [0; RECORD_TYPE_SPACE] };
    let mut iov = libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() };
    // SAFETY: msghdr is plain integers and pointers, for which all-zero is valid (null name, no flags).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = (&raw mut control).cast();
    msg.msg_controllen = RECORD_TYPE_SPACE as _;
    // SAFETY: `msg` points at `control`, which outlives these calls, is CMSG_SPACE(1) bytes long and, being a
    // `#[repr(C)]` union with a `cmsghdr`, aligned as one. So CMSG_FIRSTHDR returns its start (the buffer holds at
    // least one header), a properly aligned `cmsghdr` we may write through, and CMSG_DATA the byte after the header,
    // which CMSG_SPACE(1) includes.
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
