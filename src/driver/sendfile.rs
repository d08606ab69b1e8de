//! The only module that touches raw file descriptors: writing response heads and boundaries with `send(2)`
//! (`MSG_MORE`), and object bytes with `sendfile(2)` from explicit offsets. Readiness comes from tokio
//! (`writable()` + `try_io`), so a slow client parks the task, never a thread.
//!
//! **Architecture invariant:** object bytes are only ever handed to the kernel by `sendfile` here. There is no
//! code path that reads a blob into memory.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{MsgFlags, send};
use tokio::io::Interest;
use tokio::net::TcpStream;

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

#[derive(Debug, Clone, Copy)]
pub struct SendOptions {
    /// Most bytes per sendfile call; the task yields after each chunk so one fast reader cannot starve others.
    pub chunk: usize,
    pub progress_timeout: Duration,
}

/// Observes every sendfile return value as it happens (the Prometheus byte counter), so bytes are counted even
/// when the response later aborts.
pub trait SendObserver {
    fn sent(&self, object_bytes: u64);
}

/// Sends `head`, then every segment of `body`, as one response. Heads and literal segments go with `MSG_MORE`
/// when more follows, so the head leaves in the same TCP segment as the first file bytes.
pub async fn send_file_response(
    stream: &TcpStream,
    head: &[u8],
    body: &FileBody,
    options: SendOptions,
    observer: &impl SendObserver,
) -> SendReport {
    let mut report = SendReport { object_bytes: 0, sendfile_calls: 0, outcome: SendOutcome::Completed };
    let more_follows = !body.segments.is_empty();
    if let Err(outcome) = send_bytes(stream, head, more_follows, options.progress_timeout).await {
        report.outcome = outcome;
        return report;
    }
    let last = body.segments.len().saturating_sub(1);
    for (i, segment) in body.segments.iter().enumerate() {
        let result = match segment {
            Segment::Literal(bytes) => send_bytes(stream, bytes, i < last, options.progress_timeout).await,
            Segment::Region { offset, len } => {
                send_region(stream, &body.file, *offset, *len, options, &mut report, observer).await
            }
        };
        if let Err(outcome) = result {
            report.outcome = outcome;
            return report;
        }
    }
    report
}

/// Writes a buffer completely, from memory. Used only for heads and multipart boundaries.
pub async fn send_bytes(stream: &TcpStream, mut buf: &[u8], more: bool, timeout: Duration) -> Result<(), SendOutcome> {
    let flags = if more { MsgFlags::from_bits_retain(libc::MSG_MORE) } else { MsgFlags::empty() };
    while !buf.is_empty() {
        wait_writable(stream, timeout).await?;
        match stream.try_io(Interest::WRITABLE, || {
            send(raw(stream).as_raw_fd(), buf, flags | MsgFlags::MSG_NOSIGNAL).map_err(io::Error::from)
        }) {
            Ok(n) => buf = &buf[n..],
            Err(e) if retryable(&e) => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
}

async fn send_region(
    stream: &TcpStream,
    file: &File,
    offset: u64,
    len: u64,
    options: SendOptions,
    report: &mut SendReport,
    observer: &impl SendObserver,
) -> Result<(), SendOutcome> {
    let mut position = offset as libc::off_t;
    let end = offset + len;
    while (position as u64) < end {
        let want = (end - position as u64).min(options.chunk as u64) as usize;
        wait_writable(stream, options.progress_timeout).await?;
        // sendfile advances `position` by what it sent; the file's own offset is never used, so one open file
        // can serve many concurrent ranges.
        let result = stream.try_io(Interest::WRITABLE, || {
            nix::sys::sendfile::sendfile(raw(stream), file, Some(&mut position), want).map_err(io::Error::from)
        });
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
            Err(e) if retryable(&e) => continue,
            Err(e) => return Err(SendOutcome::Aborted(e)),
        }
    }
    Ok(())
}

/// WouldBlock clears tokio's readiness inside `try_io`; EINTR just means "again".
fn retryable(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted)
}

async fn wait_writable(stream: &TcpStream, timeout: Duration) -> Result<(), SendOutcome> {
    match tokio::time::timeout(timeout, stream.writable()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SendOutcome::Aborted(e)),
        Err(_) => Err(SendOutcome::Stalled),
    }
}

fn raw(stream: &TcpStream) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsFd;
    stream.as_fd()
}
