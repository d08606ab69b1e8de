//! Real S3-compatible stores for tests of blobgate in front of one, and a proxy that counts what reaches them.
//!
//! [`S3Upstream`] is moto (Python, in memory), the one `scripts/test-services` runs for the whole test run, where
//! each test makes buckets of its own ([`S3Upstream::bucket`]); or s3s-fs (Rust, a directory served as S3) as a
//! process of the test's own on a loopback port, killed on drop. [`CountingProxy`] sits between a client (blobgate)
//! and such a store and frames every HTTP/1.1 request and response that crosses it, so that a test can say how many
//! GETs reached the store, for which ranges, and how many body bytes came back; it can also make the store
//! unreachable and reachable again without restarting it.

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::s3::{AccessKey, Run, clean_command, run_boto3};
use super::{listening_addrs, rand_u64, reserved_local_addr, test_service};

/// A real S3-compatible server on `127.0.0.1` (path-style requests, region us-east-1). One of the test's own is
/// killed on drop, also when the test fails; on the shared moto, the buckets the test made are deleted.
pub struct S3Upstream {
    /// `None`: the run's shared moto.
    child: Option<Child>,
    addr: SocketAddr,
    name: &'static str,
    key: AccessKey,
    /// Its log, the `$HOME` of its own processes and of the boto3 clients, and (s3s-fs) the directory it serves.
    dir: tempfile::TempDir,
    /// The buckets made by [`S3Upstream::bucket`].
    buckets: Mutex<Vec<String>>,
}

impl S3Upstream {
    /// moto's standalone server (`python3 -m moto.server`, pip package `moto[server]`), the one of the test run
    /// (`BLOBGATE_TEST_MOTO`): objects in memory, and any access key accepted (the ones returned are what its
    /// clients sign with). Tests share it, each in buckets of its own: faults go through a [`CountingProxy`].
    pub fn moto() -> Self {
        let addr = test_service("BLOBGATE_TEST_MOTO").parse().expect("BLOBGATE_TEST_MOTO is 127.0.0.1:PORT");
        let key = AccessKey { id: "moto-test-key".into(), secret: "moto-test-secret".into() };
        let dir = tempfile::tempdir().expect("temp dir");
        S3Upstream { child: None, addr, name: "moto", key, dir, buckets: Mutex::default() }
    }

    /// s3s-fs (crates.io), which serves a fresh temporary directory as S3 and checks SigV4 signatures against
    /// the one access key it is started with.
    pub fn s3s_fs() -> Self {
        // scripts/test builds it once into its tools directory, outside the clone, and names it here.
        let s3s_fs = std::env::var("BLOBGATE_TEST_S3S_FS").unwrap_or_else(|_| {
            panic!(
                "BLOBGATE_TEST_S3S_FS is not set: run the tests with scripts/test, which installs s3s-fs (crates.io)"
            )
        });
        assert!(Path::new(&s3s_fs).is_file(), "BLOBGATE_TEST_S3S_FS names no file: {s3s_fs}");
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let key = AccessKey { id: "s3s-fs-test-key".into(), secret: "s3s-fs-test-secret".into() };
        let mut cmd = clean_command(&s3s_fs, &dir.path().join("home"));
        cmd.args(["--host", "127.0.0.1", "--port", "0", "--access-key", &key.id, "--secret-key", &key.secret])
            .arg(&root)
            .current_dir(dir.path());
        Self::spawn("s3s-fs", cmd, dir, key)
    }

    /// Starts `cmd` with its output in `server.log` and waits until it answers HTTP on the port it bound.
    fn spawn(name: &'static str, mut cmd: Command, dir: tempfile::TempDir, key: AccessKey) -> Self {
        let log = std::fs::File::create(dir.path().join("server.log")).expect("server log");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        // From here on a failure kills it (drop).
        let mut upstream = S3Upstream {
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            name,
            key,
            dir,
            buckets: Mutex::default(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let child = upstream.child.as_mut().expect("its own process");
            if let Some(status) = child.try_wait().expect("wait") {
                panic!("{name} exited at start ({status}):\n{}", upstream.log());
            }
            if let Some(addr) = listening_addrs(child.id()).into_iter().next()
                && answers_http(addr)
            {
                upstream.addr = addr;
                return upstream;
            }
            assert!(Instant::now() < deadline, "{name} did not answer HTTP within 60 s:\n{}", upstream.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server's process (SIGSTOP): connections still open at the kernel, nothing answered, as a hung
    /// store. Only a server of the test's own (s3s-fs), never the shared moto.
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// Lets a [`pause`](Self::pause)d server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().unwrap_or_else(|| panic!("{} is shared: it cannot be paused", self.name));
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid"));
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|e| panic!("{signal} to {}: {e}", self.name));
    }

    /// "moto" or "s3s-fs", for messages.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn access_key(&self) -> &str {
        &self.key.id
    }

    pub fn secret_key(&self) -> &str {
        &self.key.secret
    }

    /// What the server printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Runs a boto3 script after `helpers::s3`'s prelude with `s3`, a client of this store's key at `endpoint`
    /// (this store's own, or a proxy's in front of it), and `spec` as its JSON argument (plus `endpoint` and `key`);
    /// returns the JSON it prints. It must succeed.
    pub fn boto3(&self, endpoint: &str, script: &str, mut spec: serde_json::Value) -> serde_json::Value {
        let fields = spec.as_object_mut().expect("spec is a JSON object");
        fields.insert("endpoint".into(), endpoint.into());
        fields.insert("key".into(), serde_json::json!({ "id": self.access_key(), "secret": self.secret_key() }));
        let script = format!("s3 = client(spec[\"endpoint\"], spec[\"key\"])\n{script}");
        run_boto3(&self.dir.path().join("boto3-home"), &script, &spec)
    }

    /// A new bucket of this test's own, `PREFIX-<unique>`: its name.
    pub fn bucket(&self, prefix: &str) -> String {
        let bucket = format!("{prefix}-{}-{:x}", std::process::id(), rand_u64() & 0xffff_ffff);
        let script = "s3.create_bucket(Bucket=spec['bucket'])\nprint('null')";
        self.boto3(&self.endpoint(), script, serde_json::json!({ "bucket": bucket }));
        lock(&self.buckets).push(bucket.clone());
        bucket
    }

    /// Stores an object straight into the store (not through any proxy).
    pub fn put_object(&self, bucket: &str, key: &str, bytes: &[u8]) {
        let file = tempfile::NamedTempFile::new_in(self.dir.path()).unwrap();
        std::fs::write(file.path(), bytes).unwrap();
        let script = "with open(spec['path'], 'rb') as f:\n    s3.put_object(Bucket=spec['bucket'], Key=spec['object'], \
                      Body=f.read())\nprint('null')";
        self.boto3(
            &self.endpoint(),
            script,
            serde_json::json!({ "bucket": bucket, "object": key, "path": file.path() }),
        );
    }

    /// Every key of `bucket` with its size, in the store's (lexicographic) order.
    pub fn list_keys(&self, bucket: &str) -> Vec<(String, u64)> {
        let script = "pages = s3.get_paginator('list_objects_v2').paginate(Bucket=spec['bucket'])\n\
                      print(json.dumps([[o['Key'], o['Size']] for p in pages for o in p.get('Contents', [])]))";
        let out = self.boto3(&self.endpoint(), script, serde_json::json!({ "bucket": bucket }));
        serde_json::from_value(out).expect("[[key, size], ...]")
    }

    /// An object's bytes, straight from the store.
    pub fn get_object(&self, bucket: &str, key: &str) -> Vec<u8> {
        let file = tempfile::NamedTempFile::new_in(self.dir.path()).unwrap();
        let script = "body = s3.get_object(Bucket=spec['bucket'], Key=spec['object'])['Body'].read()\n\
                      with open(spec['path'], 'wb') as f:\n    f.write(body)\nprint('null')";
        self.boto3(
            &self.endpoint(),
            script,
            serde_json::json!({ "bucket": bucket, "object": key, "path": file.path() }),
        );
        std::fs::read(file.path()).unwrap()
    }

    pub fn delete_object(&self, bucket: &str, key: &str) {
        let script = "s3.delete_object(Bucket=spec['bucket'], Key=spec['object'])\nprint('null')";
        self.boto3(&self.endpoint(), script, serde_json::json!({ "bucket": bucket, "object": key }));
    }
}

/// Empties and deletes buckets (objects, unfinished multipart uploads), as far as it can.
const DELETE_BUCKETS: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
for bucket in spec["buckets"]:
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for o in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=o["Key"])
        for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
        s3.delete_bucket(Bucket=bucket)
    except Exception as e:
        print(f"cannot delete bucket {bucket}: {e}", file=sys.stderr)
"#;

impl Drop for S3Upstream {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A paused server goes on first, so that it dies now and its sockets close.
            if let Ok(pid) = i32::try_from(child.id()) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT);
            }
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        // The shared moto keeps running: what this test stored goes (not while a failure unwinds, when a panic here
        // would abort; moto's memory then holds it until the run ends).
        let buckets = std::mem::take(&mut *lock(&self.buckets));
        if buckets.is_empty() || std::thread::panicking() {
            return;
        }
        let key = serde_json::json!({ "id": self.access_key(), "secret": self.secret_key() });
        let spec = serde_json::json!({ "endpoint": self.endpoint(), "key": key, "buckets": buckets });
        let home = self.dir.path().join("boto3-home");
        let out = super::s3::boto3_command(&home, DELETE_BUCKETS, &spec).run();
        if !out.status.success() || !out.stderr.is_empty() {
            eprintln!("moto: deleting {buckets:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

/// Whether an HTTP server answers at `addr` (any status: an anonymous request may well be refused).
fn answers_http(addr: SocketAddr) -> bool {
    let Ok(mut conn) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else { return false };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
    let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let mut start = [0u8; 7];
    conn.write_all(request.as_bytes()).is_ok() && conn.read_exact(&mut start).is_ok() && &start == b"HTTP/1."
}

/// What the proxy saw of one request on its way to the upstream and of its response on the way back. Counted
/// before they are passed on: whatever a client has received is already in here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxiedRequest {
    pub method: String,
    /// The request target as sent (`/bucket/key?query`).
    pub target: String,
    /// Its `Range` header.
    pub range: Option<String>,
    /// The final status; 0 until it comes, and for good when the connection ended before it.
    pub status: u16,
    /// Body bytes the upstream sent back so far (of a chunked body, the data without its framing).
    pub response_body_bytes: u64,
    /// Body bytes the client sent so far (the same).
    pub request_body_bytes: u64,
    /// Its `Authorization` header (a SigV4 signature names its access key id; unsigned requests have none).
    pub authorization: Option<String>,
    /// Its `x-amz-security-token` header (temporary credentials' session token).
    pub security_token: Option<String>,
}

/// An HTTP/1.1 proxy on a loopback port in front of `upstream`, counting each request that passes (see
/// [`ProxiedRequest`]). It passes every byte on unchanged, `Host` included (so SigV4 signatures still verify);
/// it reads the heads and body framing (Content-Length, chunked on either side, keep-alive, `Expect:
/// 100-continue`) only to tell one request from the next. Stops on drop: its port is closed when drop returns.
pub struct CountingProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    /// Accepts connections while the proxy is up; `None` while it is down.
    acceptor: Mutex<Option<Acceptor>>,
}

#[derive(Default)]
struct Shared {
    /// Every request, in the order its head arrived; each entry updated as its bytes cross.
    log: Mutex<Vec<Arc<Mutex<ProxiedRequest>>>>,
    /// Open connections by id: the client's socket and, once connected, the upstream's, to shut them down when the
    /// proxy goes down.
    live: Mutex<HashMap<u64, Vec<TcpStream>>>,
    next_id: AtomicU64,
    /// Connections accepted since the start or the last `reset`.
    connections: AtomicU64,
    /// Requests stalled before they reach the upstream (`CountingProxy::hold`).
    holds: Holds,
}

/// Which requests to stall, and the ones stalled now. A stalled request is logged, then waits before its head is
/// passed on, as a store that takes its time over one call would.
#[derive(Default)]
struct Holds {
    state: Mutex<HoldState>,
    changed: Condvar,
}

type HoldRule = Arc<dyn Fn(&ProxiedRequest) -> bool + Send + Sync>;

#[derive(Default)]
struct HoldState {
    rule: Option<HoldRule>,
    held: usize,
}

impl Holds {
    /// Waits while `request` matches the rule in force.
    fn pass(&self, request: &ProxiedRequest) {
        let mut state = lock(&self.state);
        if !state.rule.as_ref().is_some_and(|rule| rule(request)) {
            return;
        }
        state.held += 1;
        self.changed.notify_all();
        while state.rule.as_ref().is_some_and(|rule| rule(request)) {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        state.held -= 1;
        self.changed.notify_all();
    }
}

struct Acceptor {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl CountingProxy {
    pub fn start(upstream: SocketAddr) -> Self {
        // Below the ephemeral range: after `set_down(true)` the port can be bound again for `set_down(false)`,
        // which no outgoing connection could have taken meanwhile.
        let proxy =
            CountingProxy { addr: reserved_local_addr(), upstream, shared: Arc::default(), acceptor: Mutex::new(None) };
        proxy.set_down(false);
        proxy
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for a client's endpoint URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request since the start or the last `reset`, in arrival order.
    pub fn requests(&self) -> Vec<ProxiedRequest> {
        lock(&self.shared.log).iter().map(|r| lock(r).clone()).collect()
    }

    /// Response body bytes of all GET requests: what was fetched from the store.
    pub fn bytes_fetched(&self) -> u64 {
        self.requests().iter().filter(|r| r.method == "GET").map(|r| r.response_body_bytes).sum()
    }

    /// How many GET requests reached the store.
    pub fn gets(&self) -> usize {
        self.requests().iter().filter(|r| r.method == "GET").count()
    }

    /// How many connections were accepted (keep-alive shows as fewer connections than requests).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Forgets the requests and connections counted so far (requests still under way go on counting, unseen).
    pub fn reset(&self) {
        lock(&self.shared.log).clear();
        self.shared.connections.store(0, Ordering::SeqCst);
    }

    /// Stalls every request `matches` accepts (its head logged, nothing passed on) until `release`: a store that
    /// takes its time over some calls. Replaces the rule in force.
    pub fn hold(&self, matches: impl Fn(&ProxiedRequest) -> bool + Send + Sync + 'static) {
        lock(&self.shared.holds.state).rule = Some(Arc::new(matches));
        self.shared.holds.changed.notify_all();
    }

    /// How many requests are stalled now.
    pub fn held(&self) -> usize {
        lock(&self.shared.holds.state).held
    }

    /// Passes the stalled requests on, and stalls no more.
    pub fn release(&self) {
        lock(&self.shared.holds.state).rule = None;
        self.shared.holds.changed.notify_all();
    }

    /// Down: as if the store had stopped. When this returns, new connections are refused (the port is closed)
    /// and open ones are shut down, mid-request or idle. Up again: the same port accepts again, forwarding to the
    /// same store, which never noticed.
    pub fn set_down(&self, down: bool) {
        let mut acceptor = lock(&self.acceptor);
        if down {
            if let Some(running) = acceptor.take() {
                running.stop.store(true, Ordering::SeqCst);
                // The thread owns the listener: once it has returned, the port is closed.
                let _ = running.thread.join();
            }
            for (_, sockets) in lock(&self.shared.live).drain() {
                for socket in sockets {
                    let _ = socket.shutdown(Shutdown::Both);
                }
            }
        } else if acceptor.is_none() {
            let listener = TcpListener::bind(self.addr).unwrap_or_else(|e| panic!("proxy: bind {}: {e}", self.addr));
            listener.set_nonblocking(true).unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let (upstream, shared, flag) = (self.upstream, self.shared.clone(), stop.clone());
            let thread = std::thread::Builder::new()
                .name(format!("proxy {}", self.addr))
                .spawn(move || accept_loop(listener, &flag, upstream, &shared))
                .unwrap();
            *acceptor = Some(Acceptor { stop, thread });
        }
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.release();
        self.set_down(true);
    }
}

/// A lock that outlives a panic elsewhere (a drop during a failing test must not panic again).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Accepts until `stop`, each connection on a thread of its own. Waits in poll(2) with a short timeout so that a
/// stop is seen at once without a wake-up connection.
fn accept_loop(listener: TcpListener, stop: &AtomicBool, upstream: SocketAddr, shared: &Arc<Shared>) {
    use nix::poll::{PollFd, PollFlags, poll};
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, 20u16);
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match listener.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                let Ok(registered) = client.try_clone() else { continue };
                let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                lock(&shared.live).insert(id, vec![registered]);
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let shared = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("proxy conn {id}"))
                    .spawn(move || serve_connection(id, client, upstream, &shared));
                if spawned.is_err() {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // Out of file descriptors and the like: try again shortly.
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

/// One request on its way, for the response side: what to count the response against and how it is framed.
struct Exchange {
    record: Arc<Mutex<ProxiedRequest>>,
    head_only: bool,
    expects_continue: bool,
    /// The request's body has been passed on whole.
    body_sent: Arc<AtomicBool>,
}

/// How a message body ends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Body {
    None,
    Length(u64),
    Chunked,
    /// A response without length: it ends when the upstream closes.
    UntilClose,
}

fn serve_connection(id: u64, client: TcpStream, upstream: SocketAddr, shared: &Shared) {
    let server = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)).ok();
    let registered = {
        let mut live = lock(&shared.live);
        // Gone from `live`: the proxy went down meanwhile, and this connection with it.
        match (&server, live.get_mut(&id)) {
            (Some(server), Some(sockets)) => server.try_clone().map(|s| sockets.push(s)).is_ok(),
            _ => false,
        }
    };
    let Some(server) = server.filter(|_| registered) else {
        lock(&shared.live).remove(&id);
        // Upstream unreachable: the client sees its connection closed, as if the store were down.
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let pending = Mutex::new(VecDeque::new());
    std::thread::scope(|scope| {
        scope.spawn(|| match forward_requests(&client, &server, &pending, shared) {
            // The client is done sending: tell the upstream, and let its last response come back.
            Ok(()) => {
                let _ = server.shutdown(Shutdown::Write);
            }
            Err(_) => {
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
            }
        });
        // Whatever ends the responses (the upstream closed, broke framing, or the proxy went down) ends the
        // connection; the request side then sees its socket shut and returns.
        let _ = forward_responses(&server, &client, &pending);
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
    });
    lock(&shared.live).remove(&id);
}

/// Client to upstream: each request head is logged, queued for its response, then passed on with its body.
fn forward_requests(
    client: &TcpStream,
    server: &TcpStream,
    pending: &Mutex<VecDeque<Exchange>>,
    shared: &Shared,
) -> io::Result<()> {
    let mut from = BufReader::with_capacity(64 << 10, client);
    let mut to = server;
    while let Some(head) = read_head(&mut from)? {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut request = httparse::Request::new(&mut headers);
        if !matches!(request.parse(&head), Ok(httparse::Status::Complete(_))) {
            return Err(invalid("request head"));
        }
        let method = request.method.unwrap_or_default().to_owned();
        let body = match (header(request.headers, "transfer-encoding"), header(request.headers, "content-length")) {
            (Some(codings), _) if last_coding_is_chunked(&codings) => Body::Chunked,
            (Some(_), _) => return Err(invalid("request body without chunked framing")),
            (None, Some(length)) => Body::Length(length.trim().parse().map_err(|_| invalid("Content-Length"))?),
            (None, None) => Body::None,
        };
        let record = Arc::new(Mutex::new(ProxiedRequest {
            method: method.clone(),
            target: request.path.unwrap_or_default().to_owned(),
            range: header(request.headers, "range"),
            status: 0,
            response_body_bytes: 0,
            request_body_bytes: 0,
            authorization: header(request.headers, "authorization"),
            security_token: header(request.headers, "x-amz-security-token"),
        }));
        let body_sent = Arc::new(AtomicBool::new(matches!(body, Body::None | Body::Length(0))));
        lock(&shared.log).push(record.clone());
        let seen = lock(&record).clone();
        shared.holds.pass(&seen);
        lock(pending).push_back(Exchange {
            record: record.clone(),
            head_only: method == "HEAD",
            expects_continue: header(request.headers, "expect")
                .is_some_and(|e| e.trim().eq_ignore_ascii_case("100-continue")),
            body_sent: body_sent.clone(),
        });
        to.write_all(&head)?;
        // An `Expect: 100-continue` body comes once the upstream's 100 (passed on by the other side) has reached
        // the client.
        forward_body(&mut from, &mut to, body, |n| lock(&record).request_body_bytes += n)?;
        body_sent.store(true, Ordering::SeqCst);
    }
    Ok(())
}

/// Upstream to client: interim (1xx) heads are passed on, each final response is counted against the oldest
/// request still waiting for one.
fn forward_responses(server: &TcpStream, client: &TcpStream, pending: &Mutex<VecDeque<Exchange>>) -> io::Result<()> {
    let mut from = BufReader::with_capacity(64 << 10, server);
    let mut to = client;
    let mut continued = false;
    while let Some(head) = read_head(&mut from)? {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut response = httparse::Response::new(&mut headers);
        if !matches!(response.parse(&head), Ok(httparse::Status::Complete(_))) {
            return Err(invalid("response head"));
        }
        let status = response.code.unwrap_or_default();
        if (100..200).contains(&status) && status != 101 {
            continued |= status == 100;
            to.write_all(&head)?;
            continue;
        }
        let exchange = lock(pending).pop_front().ok_or_else(|| invalid("a response to no request"))?;
        let body = if exchange.head_only || matches!(status, 101 | 204 | 304) {
            if status == 101 { Body::UntilClose } else { Body::None }
        } else {
            match (header(response.headers, "transfer-encoding"), header(response.headers, "content-length")) {
                (Some(codings), _) if last_coding_is_chunked(&codings) => Body::Chunked,
                (Some(_), _) => Body::UntilClose,
                (None, Some(length)) => Body::Length(length.trim().parse().map_err(|_| invalid("Content-Length"))?),
                (None, None) => Body::UntilClose,
            }
        };
        lock(&exchange.record).status = status;
        to.write_all(&head)?;
        forward_body(&mut from, &mut to, body, |n| lock(&exchange.record).response_body_bytes += n)?;
        // A final answer to `Expect: 100-continue` before the body went: the client may now send that body or
        // not, so nothing after it can be framed; servers close such a connection, and so does the proxy.
        let body_left_unsent = exchange.expects_continue && !continued && !exchange.body_sent.load(Ordering::SeqCst);
        if body == Body::UntilClose || body_left_unsent {
            return Ok(());
        }
        continued = false;
    }
    Ok(())
}

/// A message head up to and with its blank line, as received; `None` at a clean end of the stream. Blank lines
/// before a head are skipped (RFC 9112, section 2.2).
fn read_head(from: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut head = Vec::new();
    loop {
        let start = head.len();
        if from.by_ref().take(8 << 10).read_until(b'\n', &mut head)? == 0 {
            return if head.is_empty() { Ok(None) } else { Err(io::ErrorKind::UnexpectedEof.into()) };
        }
        if !head.ends_with(b"\n") {
            return Err(invalid("over-long head line"));
        }
        if matches!(&head[start..], b"\r\n" | b"\n") {
            if start == 0 {
                head.clear();
                continue;
            }
            return Ok(Some(head));
        }
        if head.len() > 64 << 10 {
            return Err(invalid("over-long head"));
        }
    }
}

/// Passes one body on, calling `count` with the number of data bytes of each piece before that piece is sent.
fn forward_body(
    from: &mut impl BufRead,
    to: &mut impl Write,
    body: Body,
    mut count: impl FnMut(u64),
) -> io::Result<()> {
    match body {
        Body::None => Ok(()),
        Body::Length(length) => copy_exact(from, to, length, &mut count),
        Body::Chunked => loop {
            let line = read_line(from)?;
            let size = std::str::from_utf8(&line)
                .ok()
                .and_then(|l| u64::from_str_radix(l.split(';').next().unwrap_or_default().trim(), 16).ok())
                .ok_or_else(|| invalid("chunk size"))?;
            to.write_all(&line)?;
            if size == 0 {
                // Trailer fields, up to a blank line.
                loop {
                    let line = read_line(from)?;
                    to.write_all(&line)?;
                    if matches!(line.as_slice(), b"\r\n" | b"\n") {
                        return Ok(());
                    }
                }
            }
            copy_exact(from, to, size, &mut count)?;
            let end = read_line(from)?;
            if !matches!(end.as_slice(), b"\r\n" | b"\n") {
                return Err(invalid("chunk end"));
            }
            to.write_all(&end)?;
        },
        Body::UntilClose => loop {
            let piece = from.fill_buf()?;
            if piece.is_empty() {
                return Ok(());
            }
            let n = piece.len();
            count(n as u64);
            to.write_all(piece)?;
            from.consume(n);
        },
    }
}

fn copy_exact(
    from: &mut impl BufRead,
    to: &mut impl Write,
    mut left: u64,
    count: &mut impl FnMut(u64),
) -> io::Result<()> {
    while left > 0 {
        let piece = from.fill_buf()?;
        if piece.is_empty() {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = piece.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        count(n as u64);
        to.write_all(&piece[..n])?;
        from.consume(n);
        left -= n as u64;
    }
    Ok(())
}

/// One line of chunked framing, with its line end.
fn read_line(from: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    from.by_ref().take(8 << 10).read_until(b'\n', &mut line)?;
    if !line.ends_with(b"\n") {
        return Err(invalid("chunk framing line"));
    }
    Ok(line)
}

/// A header's value, the values of a repeated one joined with commas.
fn header(headers: &[httparse::Header<'_>], name: &str) -> Option<String> {
    let values: Vec<String> = headers
        .iter()
        .filter(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| String::from_utf8_lossy(h.value).into_owned())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

fn last_coding_is_chunked(codings: &str) -> bool {
    codings.rsplit(',').next().is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("proxy: bad {what}"))
}
