//! The access log (`access_log`, `--access-log`): one JSON line per response on both listeners.
//!
//! The hot path never waits on it: a connection hands an [`Entry`] (cheap clones of what it already holds, no
//! formatting) to a bounded channel with `try_send`; a full channel drops the line and counts it
//! (`blobgate_access_log_dropped_total`). A writer thread wakes every [`FLUSH_EVERY`], formats what is queued,
//! strips credentials from the query ([`redacted_query`], also used for the admin listener's trace span), and writes the batch through a `BufWriter` with one flush. SIGHUP ([`request_reopen`]) makes
//! it reopen the file, for logrotate. When the log is off there is no [`AccessLog`] and nothing of this runs.

use std::cell::Cell;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use http::{HeaderValue, Method, Uri};
use serde::Serialize;

/// Lines buffered between the listeners and the writer; beyond this they are dropped (and counted).
const CHANNEL_CAPACITY: usize = 16 * 1024;
/// How often the writer wakes to write what is queued: the longest a line waits.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// The response header that carries the id the log line has.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Bumped by SIGHUP; the writer reopens its file when it sees a new value.
static REOPEN_GENERATION: AtomicU64 = AtomicU64::new(0);

/// Asks every access-log writer to reopen its file (SIGHUP, after logrotate moved it).
pub fn request_reopen() {
    REOPEN_GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Who a response was for, as the object handler established it after authorisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Public,
    /// A bearer token's id (never its secret).
    Token(Box<str>),
    /// A signed URL's signing key id.
    Presigned(Box<str>),
    /// An S3 access key id (SigV4, header or presigned).
    S3(Box<str>),
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Public => f.write_str("public"),
            Principal::Token(id) => f.write_str(id),
            Principal::Presigned(id) => write!(f, "presigned:{id}"),
            Principal::S3(id) => f.write_str(id),
        }
    }
}

/// A request id: a per-process prefix, the thread that answered, and that thread's own counter (no shared
/// atomic on the hot path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestId {
    thread: u32,
    n: u64,
}

impl RequestId {
    pub fn next() -> Self {
        static THREADS: AtomicU32 = AtomicU32::new(0);
        thread_local! {
            static THREAD: u32 = THREADS.fetch_add(1, Ordering::Relaxed);
            static COUNTER: Cell<u64> = const { Cell::new(0) };
        }
        let n = COUNTER.with(|c| {
            let n = c.get();
            c.set(n + 1);
            n
        });
        Self { thread: THREAD.with(|t| *t), n }
    }

    pub fn header_value(self) -> HeaderValue {
        // Written on the stack without the formatting machinery (every S3 response carries one): the header
        // value's own copy is the only allocation. The same text as `Display`.
        let mut buf = [0u8; 48];
        let mut len = push_hex(&mut buf, 0, u64::from(process_prefix()), 8);
        buf[len] = b'-';
        len = push_hex(&mut buf, len + 1, u64::from(self.thread), 1);
        buf[len] = b'-';
        len = push_hex(&mut buf, len + 1, self.n, 1);
        HeaderValue::from_bytes(&buf[..len]).expect("a request id is ASCII")
    }
}

/// Writes `n` in lowercase hex, at least `min_digits` long, at `buf[at..]`; returns the end.
fn push_hex(buf: &mut [u8], at: usize, n: u64, min_digits: usize) -> usize {
    let digits = ((64 - n.leading_zeros() as usize).div_ceil(4)).max(min_digits);
    for i in 0..digits {
        buf[at + i] = b"0123456789abcdef"[((n >> (4 * (digits - 1 - i))) & 0xf) as usize];
    }
    at + digits
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}-{:x}-{:x}", process_prefix(), self.thread, self.n)
    }
}

/// Distinguishes this process's ids from a restarted one's: the pid mixed with the start time.
fn process_prefix() -> u32 {
    static PREFIX: OnceLock<u32> = OnceLock::new();
    *PREFIX.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
        std::process::id().rotate_left(16) ^ nanos
    })
}

/// One response, as the listener knew it. Formatting and redaction happen on the writer thread.
#[derive(Debug)]
pub struct Entry {
    pub time: SystemTime,
    pub listener: &'static str,
    pub remote: SocketAddr,
    pub method: Method,
    pub uri: Uri,
    pub status: u16,
    /// Body bytes sent: object bytes from sendfile's counts for file responses.
    pub bytes: u64,
    pub duration: Duration,
    /// `None`: refused, or answered before anyone was authorised.
    pub principal: Option<Principal>,
    pub range: Option<HeaderValue>,
    pub user_agent: Option<HeaderValue>,
    pub request_id: RequestId,
    /// Requests served on this connection before this one.
    pub connection_requests: u32,
    /// The content coding of a file body sent (`identity`, `br`, `gzip`); `None` for in-memory replies.
    pub encoding: Option<&'static str>,
    /// Who encrypted the connection (`ktls` or `userspace`); `None` on plain HTTP.
    pub tls: Option<&'static str>,
    /// The limit that refused the request, if one did.
    pub throttled: Option<ThrottledBy>,
}

/// Which limit refused a request (`blobgate limits`): its kind (`requests`, `concurrent`) and the scope it was set
/// on (`token`, `s3-key`, `bucket`, `anonymous`, `default`); logged as `scope:kind`. A response carries it as an
/// extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThrottledBy {
    pub limit: &'static str,
    pub scope: &'static str,
}

impl fmt::Display for ThrottledBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.scope, self.limit)
    }
}

/// A field serialised from its `Display` form, straight into the output (serde_json's `collect_str` escapes as
/// it writes, with no intermediate `String`).
struct Shown<T>(T);

impl<T: fmt::Display> Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// `principal`, or `-` for none.
struct PrincipalOrDash<'a>(Option<&'a Principal>);

impl fmt::Display for PrincipalOrDash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(p) => p.fmt(f),
            None => f.write_str("-"),
        }
    }
}

#[derive(Serialize)]
struct Line<'a> {
    time: Shown<humantime::Rfc3339Timestamp>,
    listener: &'a str,
    remote: Shown<&'a SocketAddr>,
    method: &'a str,
    path: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    query: Option<String>,
    status: u16,
    bytes: u64,
    duration_ms: f64,
    principal: Shown<PrincipalOrDash<'a>>,
    range: Option<&'a str>,
    user_agent: Option<&'a str>,
    request_id: Shown<RequestId>,
    connection_requests: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    encoding: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    throttled: Option<Shown<ThrottledBy>>,
}

impl Entry {
    fn line(&self) -> Line<'_> {
        Line {
            time: Shown(humantime::format_rfc3339_millis(self.time)),
            listener: self.listener,
            remote: Shown(&self.remote),
            method: self.method.as_str(),
            path: self.uri.path(),
            query: self.uri.query().and_then(redacted_query),
            status: self.status,
            bytes: self.bytes,
            duration_ms: (self.duration.as_secs_f64() * 1e6).round() / 1e3,
            principal: Shown(PrincipalOrDash(self.principal.as_ref())),
            range: self.range.as_ref().and_then(|v| v.to_str().ok()),
            user_agent: self.user_agent.as_ref().and_then(|v| v.to_str().ok()),
            request_id: Shown(self.request_id),
            connection_requests: self.connection_requests,
            encoding: self.encoding,
            tls: self.tls,
            throttled: self.throttled.map(Shown),
        }
    }

    /// The JSON line (without its newline), without credentials.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.line()).expect("a line of strings and numbers serialises")
    }

    /// Writes the JSON line and its newline to `out`.
    fn write_to(&self, out: &mut impl Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, &self.line())?;
        out.write_all(b"\n")
    }
}

/// Query parameters that carry credentials, by prefix: `bg-*` (our signed URLs) and `X-Amz-*` (SigV4 presigns:
/// credential, signature, security token). Lower case; names compare case-insensitively.
pub const CREDENTIAL_PARAM_PREFIXES: [&str; 2] = ["bg-", "x-amz-"];
/// Query parameters that carry credentials, by name: SigV2 presigns (`AWSAccessKeyId`, `Signature`), which the S3
/// front end refuses but a misdirected client may fill with real AWS credentials. Lower case.
pub const CREDENTIAL_PARAMS: [&str; 2] = ["awsaccesskeyid", "signature"];

/// Whether a (decoded) query parameter name carries a credential: the one list the access log, the admin
/// listener's trace span and the S3 front end's detection (`s3::operation::carries_aws_credentials`, checked by its
/// tests) share.
pub fn is_credential_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    CREDENTIAL_PARAM_PREFIXES.iter().any(|p| name.starts_with(p)) || CREDENTIAL_PARAMS.contains(&name.as_str())
}

/// The query without credentials ([`is_credential_param`]), whatever their case or percent-encoding. `None` when
/// nothing is left.
pub fn redacted_query(query: &str) -> Option<String> {
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .filter(|pair| {
            let name = pair.split('=').next().unwrap_or_default();
            let name: String = form_urlencoded::parse(name.as_bytes()).map(|(k, _)| k).collect();
            !is_credential_param(&name)
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The listeners' handle: cheap to clone, never blocks.
#[derive(Clone)]
pub struct AccessLog {
    lines: SyncSender<Entry>,
    dropped: metrics::Counter,
}

impl AccessLog {
    /// Queues `entry` for the writer, or drops and counts it when the writer is behind.
    pub fn log(&self, entry: Entry) {
        match self.lines.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => self.dropped.increment(1),
        }
    }
}

/// The writer thread; [`Writer::finish`] writes what is queued and stops it.
pub struct Writer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Writer {
    pub fn finish(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.thread.join();
    }
}

enum Target {
    Stdout,
    File { path: PathBuf, mode: u32, file: BufWriter<File> },
}

impl Target {
    /// Opens `path` for appending; a file it creates gets `mode` (`access_log_mode`) whatever the umask (the
    /// process runs under `077`), so a log shipper in the file's group can read it. An existing file keeps its
    /// mode: the operator (or logrotate's `create`) chose it.
    fn open(path: &Path, mode: u32) -> io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        if path == Path::new("-") {
            return Ok(Target::Stdout);
        }
        let file = match OpenOptions::new().create_new(true).append(true).open(path) {
            Ok(created) => {
                created.set_permissions(std::fs::Permissions::from_mode(mode))?;
                created
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => OpenOptions::new().append(true).open(path)?,
            Err(e) => return Err(e),
        };
        Ok(Target::File { path: path.to_owned(), mode, file: BufWriter::with_capacity(64 * 1024, file) })
    }

    fn write_entry(&mut self, entry: &Entry) -> io::Result<()> {
        match self {
            Target::Stdout => entry.write_to(&mut io::stdout().lock()),
            Target::File { file, .. } => entry.write_to(file),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Target::Stdout => io::stdout().flush(),
            Target::File { file, .. } => file.flush(),
        }
    }

    fn reopen(&mut self) {
        let _ = self.flush();
        if let Target::File { path, mode, .. } = self {
            match Target::open(path, *mode) {
                Ok(reopened) => *self = reopened,
                Err(e) => tracing::error!(path = %path.display(), error = %e, "cannot reopen the access log; \
                    still writing to the old file"),
            }
        }
    }
}

/// Opens `path` (`-` for stdout; a new file gets `mode`) and starts the writer. An unopenable file is an error
/// here, at start-up. `dropped` counts the lines dropped when the writer is behind
/// (`blobgate_access_log_dropped_total`).
pub fn start(path: &Path, mode: u32, dropped: metrics::Counter) -> anyhow::Result<(AccessLog, Writer)> {
    let target = Target::open(path, mode)
        .with_context(|| format!("cannot open the access log {} (access_log)", path.display()))?;
    let (lines, received) = sync_channel(CHANNEL_CAPACITY);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = std::thread::Builder::new()
        .name("access-log".into())
        .spawn({
            let stop = stop.clone();
            move || run_writer(target, received, &stop)
        })
        .context("cannot start the access log writer")?;
    Ok((AccessLog { lines, dropped }, Writer { stop, thread }))
}

fn run_writer(mut target: Target, received: Receiver<Entry>, stop: &AtomicBool) {
    let mut generation = REOPEN_GENERATION.load(Ordering::Relaxed);
    loop {
        // Sleeping rather than blocking in `recv`: a sender then never finds a parked receiver to wake, so a line
        // costs the data workers no futex call, only the channel's atomics.
        std::thread::sleep(FLUSH_EVERY);
        let stopping = stop.load(Ordering::Acquire);
        // Before writing: a line that arrives after SIGHUP goes to the new file.
        let now = REOPEN_GENERATION.load(Ordering::Relaxed);
        if now != generation {
            generation = now;
            target.reopen();
            tracing::info!("access log reopened");
        }
        let (mut wrote, mut disconnected) = (false, false);
        loop {
            match received.try_recv() {
                Ok(entry) => {
                    write(&mut target, &entry);
                    wrote = true;
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if wrote && let Err(e) = target.flush() {
            tracing::warn!(error = %e, "cannot write the access log");
        }
        if stopping || disconnected {
            return;
        }
    }
}

fn write(target: &mut Target, entry: &Entry) {
    if let Err(e) = target.write_entry(entry) {
        tracing::warn!(error = %e, "cannot write the access log");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_drops_every_signature_and_credential_parameter() {
        assert_eq!(redacted_query("bg-expires=5&bg-key=k1&bg-sig=abc"), None);
        assert_eq!(redacted_query("a=1&BG-SIG=x&bg%2Dsig=y&b=2"), Some("a=1&b=2".into()));
        assert_eq!(
            redacted_query("X-Amz-Credential=AK%2F1&X-Amz-Signature=ff&x-amz-security-token=t&response-content-type=x"),
            Some("response-content-type=x".into())
        );
        assert_eq!(redacted_query(""), None);
        // SigV2 presigns, however spelt; `Expires` and look-alikes are not credentials.
        assert_eq!(
            redacted_query(
                "AWSAccessKeyId=AKIAREAL&Expires=99&Signature=c2ln&awsaccesskeyid=x&%53ignature=y&Signatures=1"
            ),
            Some("Expires=99&Signatures=1".into())
        );
        assert_eq!(redacted_query("a=1&a%3D=2&=3"), Some("a=1&a%3D=2&=3".into()));
    }

    #[test]
    fn a_line_has_every_field_and_no_credentials() {
        let entry = Entry {
            time: SystemTime::UNIX_EPOCH + Duration::from_millis(1500),
            listener: "data",
            remote: "127.0.0.1:5000".parse().unwrap(),
            method: Method::GET,
            uri: "/b/k?bg-expires=5&bg-key=k1&bg-sig=SECRET".parse().unwrap(),
            status: 206,
            bytes: 10,
            duration: Duration::from_micros(1234),
            principal: Some(Principal::Presigned("k1".into())),
            range: Some(HeaderValue::from_static("bytes=0-9")),
            user_agent: None,
            request_id: RequestId { thread: 1, n: 7 },
            connection_requests: 2,
            encoding: Some("br"),
            tls: Some("userspace"),
            throttled: None,
        };
        let line = entry.to_json();
        assert!(!line.contains("SECRET"), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["time"], "1970-01-01T00:00:01.500Z");
        assert_eq!(v["path"], "/b/k");
        assert!(v.get("query").is_none());
        assert_eq!(v["status"], 206);
        assert_eq!(v["bytes"], 10);
        assert_eq!(v["duration_ms"], 1.234);
        assert_eq!(v["principal"], "presigned:k1");
        assert_eq!(v["range"], "bytes=0-9");
        assert_eq!(v["user_agent"], serde_json::Value::Null);
        assert_eq!(v["connection_requests"], 2);
        assert_eq!(v["encoding"], "br");
        assert_eq!(v["tls"], "userspace");
        assert!(v["request_id"].as_str().unwrap().ends_with("-1-7"));
    }

    #[test]
    fn request_ids_differ_within_a_thread() {
        assert_ne!(RequestId::next(), RequestId::next());
        for n in [0, 1, 0xf, 0x10, 0xdead_beef, u64::MAX] {
            let id = RequestId { thread: (n % 300) as u32, n };
            assert_eq!(id.header_value().to_str().unwrap(), id.to_string());
        }
    }
}
