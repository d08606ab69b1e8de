//! Test harness: spawn the real binary, set its data up (through the library, `fixtures`, or its CLI), and talk raw
//! HTTP/1.1 to it. `s3` holds what the S3 modules share (clients, keys, signatures), `upstream` the S3 stores behind
//! it, `pki` the certificates of the TLS tests.

pub mod fixtures;
pub mod pki;
pub mod s3;
pub mod strace;
pub mod upstream;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_blobgate");

/// A data dir with helpers to run CLI commands against it. The server is started separately, so tests can
/// prepare data first (or run CLI commands while it runs).
pub struct TestEnv {
    pub dir: tempfile::TempDir,
    /// `BLOBGATE_DATABASE_URL` for every command and server of this env (`on_postgres`); unset: SQLite.
    pub database_url: Option<String>,
    /// What `bucket`, `put_bytes`, `token` and `s3::s3_key` need to set data up in this process (`fixtures`).
    pub fixtures: fixtures::Fixtures,
}

impl TestEnv {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temp dir"), database_url: None, fixtures: Default::default() }
    }

    /// An env whose metadata is a fresh database on the test PostgreSQL cluster.
    pub fn on_postgres() -> Self {
        Self { database_url: Some(postgres_database()), ..Self::new() }
    }

    /// The command with this env's database, if it names one.
    fn with_database<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        match &self.database_url {
            Some(url) => cmd.env("BLOBGATE_DATABASE_URL", url),
            None => cmd.env_remove("BLOBGATE_DATABASE_URL"),
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `blobgate --data-dir <dir> ARGS` and returns its output, whatever the exit status.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.with_database(&mut Command::new(BIN))
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(args)
            // Keep the developer's config file and environment out of the tests.
            .current_dir(self.dir.path())
            .env_remove("BLOBGATE_CONFIG")
            .env_remove("RUST_LOG")
            .output()
            .expect("run blobgate")
    }

    /// Runs a CLI command that must succeed; returns its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "blobgate {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    pub fn serve(&self) -> Server {
        self.serve_with(&[], &[])
    }

    /// Starts `blobgate serve` on port 0 with extra env vars and args, optionally wrapped (e.g. in strace).
    pub fn serve_with(&self, env: &[(&str, &str)], wrapper: &[&str]) -> Server {
        if wrapper.first() == Some(&"strace") {
            require_group("strace");
        }
        let mut cmd = if let Some((first, rest)) = wrapper.split_first() {
            let mut c = Command::new(first);
            c.args(rest).arg(BIN);
            c
        } else {
            Command::new(BIN)
        };
        self.with_database(&mut cmd);
        cmd.arg("--data-dir")
            .arg(self.data_dir())
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .current_dir(self.dir.path())
            .env_remove("BLOBGATE_CONFIG")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn blobgate serve");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let (sink, drained) = (log.clone(), Arc::new((Mutex::new(false), Condvar::new())));
        let eof = drained.clone();
        // Drains stderr for the whole run, so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("blobgate is serving") {
                    let _ = tx.send(line.clone());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
            *eof.0.lock().unwrap() = true;
            eof.1.notify_all();
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("server did not start; log:\n{}", log.lock().unwrap())
        });
        // `data=ADDR` in the text log, `"data":"ADDR"` in the JSON one (`log_format = "json"`).
        let addr = |field: &str| -> SocketAddr {
            let (text, json) = (format!("{field}="), format!("\"{field}\":\""));
            let start = match (line.find(&text), line.find(&json)) {
                (Some(at), _) => at + text.len(),
                (None, Some(at)) => at + json.len(),
                (None, None) => panic!("no {field} address in {line}"),
            };
            let end = line[start..].find(|c: char| c.is_whitespace() || c == '"').map_or(line.len(), |n| start + n);
            line[start..end].parse().expect("socket address")
        };
        let wrapped = !wrapper.is_empty();
        Server { child: Some(child), wrapped, data: addr("data"), admin: addr("admin"), log, drained }
    }
}

pub struct Server {
    child: Option<Child>,
    /// Started under a wrapper (strace): signals go to the wrapped blobgate, the wrapper's child.
    wrapped: bool,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
    /// Set when stderr has reached its end: the whole log is in `log`.
    drained: Arc<(Mutex<bool>, Condvar)>,
}

impl Server {
    /// The blobgate process itself (not a wrapper such as strace).
    pub fn pid(&self) -> u32 {
        let pid = self.child.as_ref().expect("server running").id();
        if !self.wrapped {
            return pid;
        }
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        children.split_whitespace().next().and_then(|p| p.parse().ok()).expect("the wrapper has started blobgate")
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends a signal and waits for the process; returns its exit status code.
    pub fn stop_with(&mut self, signal: &str) -> Option<i32> {
        let target = self.pid();
        let mut child = self.child.take()?;
        Command::new("kill").args([&format!("-{signal}"), &target.to_string()]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                // Its last lines too: `log` after a stop has all it wrote (unless something else holds its stderr).
                let (done, eof) = &*self.drained;
                let _ = eof.wait_timeout_while(done.lock().unwrap(), Duration::from_secs(30), |done| !*done);
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("server did not exit after SIG{signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) -> Option<i32> {
        self.stop_with("TERM")
    }

    /// One request on a fresh connection (`Connection: close`).
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        self.request("GET", path, headers)
    }

    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
        request_at(self.data, method, path, headers)
    }

    /// A request to the admin listener with an optional body.
    pub fn admin(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        admin_request_at(self.admin, method, path, headers, body)
    }

    /// Prometheus text from the admin listener.
    pub fn metrics(&self) -> String {
        String::from_utf8(self.admin("GET", "/metrics", &[], b"").body).unwrap()
    }

    /// The data listener's 5xx responses so far (`blobgate_responses_total{class="5xx"}`, every kind), and the
    /// number of series summed (so a test can tell a zero from a missing series).
    pub fn server_errors(&self) -> (f64, usize) {
        let metrics = self.metrics();
        let series: Vec<f64> = metrics
            .lines()
            .filter(|l| l.starts_with("blobgate_responses_total{") && l.contains("class=\"5xx\""))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        (series.iter().sum(), series.len())
    }

    /// The value of the series `name{labels}` (labels as Prometheus prints them: `a="x",b="y"`), 0 when absent.
    pub fn metric_with(&self, name: &str, labels: &str) -> f64 {
        let prefix = format!("{name}{{{labels}}} ");
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()).map(|v| v.trim().parse().unwrap()))
            .unwrap_or(0.0)
    }

    /// The value of an unlabelled metric (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| {
                l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).map(|v| v.trim().parse().unwrap())
            })
            .unwrap_or(0.0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One request to the data listener at `addr` on a fresh connection (`Connection: close`).
pub fn request_at(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut conn = Conn::open(addr);
    conn.send(&raw_request(method, path, headers, true));
    conn.read_response(method == "HEAD").expect("a response")
}

/// One request to the admin listener at `addr`, with an optional body, on a fresh connection.
pub fn admin_request_at(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
    let mut conn = Conn::open(addr);
    let mut raw = format!("{method} {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for (k, v) in headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "PUT" {
        raw.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    raw.push_str("\r\n");
    let mut bytes = raw.into_bytes();
    bytes.extend_from_slice(body);
    conn.send(&bytes);
    conn.read_response(method == "HEAD").expect("a response")
}

/// Builds a request head. Header names are sent as given; `Host` is added unless a test passes its own.
pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)], close: bool) -> Vec<u8> {
    let mut raw = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        raw.push_str("Host: test\r\n");
    }
    for (k, v) in headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    if close {
        raw.push_str("Connection: close\r\n");
    }
    raw.push_str("\r\n");
    raw.into_bytes()
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    /// Lower-cased names; repeated fields joined with ", ".
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    /// The headers but `Date`, in name order: what two answers to the same request must share.
    pub fn headers_without_date(&self) -> std::collections::BTreeMap<String, String> {
        self.headers.iter().filter(|(k, _)| k.as_str() != "date").map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// A raw client connection that can pipeline and read several responses.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Closes with an RST, not a FIN (`SO_LINGER` 0): the server's next sends fail with ECONNRESET, then EPIPE.
    pub fn reset(self) {
        use std::os::fd::AsFd;
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        nix::sys::socket::setsockopt(&self.stream.as_fd(), nix::sys::socket::sockopt::Linger, &linger).unwrap();
    }

    pub fn open(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Self { stream, buf: Vec::new() }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send request");
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Reads one response; `None` when the server closed the connection first. The body length comes from
    /// Content-Length (or no body for HEAD/204/304, or read-to-close when there is no length).
    pub fn read_response(&mut self, head_request: bool) -> Option<Response> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Response::new(&mut headers);
            match parsed.parse(&self.buf).expect("a well-formed response head") {
                httparse::Status::Complete(len) => {
                    let status = parsed.code.unwrap();
                    let mut map: HashMap<String, String> = HashMap::new();
                    for h in parsed.headers.iter() {
                        let v = String::from_utf8_lossy(h.value).into_owned();
                        map.entry(h.name.to_ascii_lowercase()).and_modify(|e| *e = format!("{e}, {v}")).or_insert(v);
                    }
                    self.buf.drain(..len);
                    let bodiless = head_request || status == 204 || status == 304 || status < 200;
                    let body = match (bodiless, map.get("content-length")) {
                        (true, _) => Vec::new(),
                        (false, Some(n)) => {
                            let n: usize = n.parse().unwrap();
                            while self.buf.len() < n {
                                if !self.fill() {
                                    break;
                                }
                            }
                            let take = n.min(self.buf.len());
                            self.buf.drain(..take).collect()
                        }
                        (false, None) => {
                            while self.fill() {}
                            std::mem::take(&mut self.buf)
                        }
                    };
                    return Some(Response { status, headers: map, body });
                }
                httparse::Status::Partial => {
                    if !self.fill() {
                        return None;
                    }
                }
            }
        }
    }

    /// True when, at this moment, nothing has arrived and the server has not closed the connection (a
    /// non-blocking peek): for asserting that one server timer has not fired yet while another has.
    pub fn untouched(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        self.stream.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let untouched = matches!(self.stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        self.stream.set_nonblocking(false).unwrap();
        untouched
    }

    /// True when the server has closed the connection (reads EOF or an error within `wait`).
    pub fn is_closed(&mut self, wait: Duration) -> bool {
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut byte = [0u8; 1];
        let closed = match self.stream.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => {
                self.buf.push(byte[0]);
                false
            }
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        };
        self.stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        closed
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
/// A body size no connection can hold in flight: twice the client's and the server's socket buffers at their
/// largest (`tcp_rmem` and `tcp_wmem` maxima; 32 + 4 MiB on these machines). A client that resets after reading a
/// little of such a body always aborts its response: with less, a loaded server could have buffered all of it.
pub fn larger_than_socket_buffers() -> usize {
    require_group("large-body");
    let max_of = |sysctl: &str| -> usize {
        let text = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{sysctl}")).expect("read the sysctl");
        text.split_whitespace().last().and_then(|n| n.parse().ok()).expect("three numbers")
    };
    2 * (max_of("tcp_rmem") + max_of("tcp_wmem"))
}

pub fn test_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}

pub fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

// ---------------------------------------------------------------------------------------------------------------
// Added helpers (module tests: downloads, wire, auth, admin, cli, lifecycle, bad_input).
// ---------------------------------------------------------------------------------------------------------------

impl TestEnv {
    /// Like [`TestEnv::cli`] with extra environment variables.
    pub fn cli_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(BIN);
        self.with_database(&mut cmd);
        cmd.arg("--data-dir")
            .arg(self.data_dir())
            .args(args)
            .current_dir(self.dir.path())
            .env_remove("BLOBGATE_CONFIG")
            .env_remove("RUST_LOG");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run blobgate")
    }

    /// Runs a CLI command that must fail; returns its single stderr line (asserting there is exactly one).
    pub fn fails(&self, args: &[&str]) -> String {
        one_line_error(&self.cli(args), args)
    }

    /// Where the blob with this SHA-256 lives: `data/blobs/<sha[0:2]>/<sha[2:4]>/<sha>`.
    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.data_dir().join("blobs").join(&sha256[0..2]).join(&sha256[2..4]).join(sha256)
    }

    /// Regular files under `data/blobs`.
    pub fn blob_files(&self) -> Vec<PathBuf> {
        files_under(&self.data_dir().join("blobs"))
    }

    /// Regular files under `data/tmp`.
    pub fn tmp_files(&self) -> Vec<PathBuf> {
        files_under(&self.data_dir().join("tmp"))
    }
}

/// Asserts a failed run with exactly one line on stderr, and returns that line.
pub fn one_line_error(out: &Output, what: &[&str]) -> String {
    assert!(!out.status.success(), "blobgate {what:?} should fail; stdout: {}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "blobgate {what:?}: expected one stderr line, got {stderr:?}");
    lines[0].to_owned()
}

impl Server {
    /// Sends a signal without waiting for the process to exit.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.pid().to_string()]).status().unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the process to exit (after [`Server::signal`]); returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take().expect("server running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                // Its last lines too: `log` after a stop has all it wrote (unless something else holds its stderr).
                let (done, eof) = &*self.drained;
                let _ = eof.wait_timeout_while(done.lock().unwrap(), Duration::from_secs(30), |done| !*done);
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not exit within {timeout:?}; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET with `Authorization: Bearer <token>`.
    pub fn get_auth(&self, path: &str, token: &str, headers: &[(&str, &str)]) -> Response {
        let auth = format!("Bearer {token}");
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        self.get(path, &all)
    }

    /// PUT to the admin listener with a bearer token and extra headers.
    pub fn put(&self, path: &str, token: &str, body: &[u8], headers: &[(&str, &str)]) -> Response {
        let auth = format!("Bearer {token}");
        let mut all = vec![("Authorization", auth.as_str())];
        all.extend_from_slice(headers);
        self.admin("PUT", path, &all, body)
    }
}

impl Conn {
    /// Sends bytes, tolerating a server that has already closed (EPIPE/ECONNRESET).
    pub fn send_lossy(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Bytes received but not yet consumed by `read_response`.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// True when nothing at all arrives within `wait` and the connection stays open.
    pub fn silent_for(&mut self, wait: Duration) -> bool {
        self.buf.is_empty() && !self.is_closed(wait) && self.buf.is_empty()
    }

    /// Reads until EOF or an error; returns everything read (including bytes buffered before) and whether the
    /// connection ended with an error (e.g. a reset) rather than a clean EOF.
    pub fn read_to_end(&mut self) -> (Vec<u8>, bool) {
        let mut out = std::mem::take(&mut self.buf);
        let mut chunk = vec![0u8; 256 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return (out, false),
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return (out, true),
            }
        }
    }

    /// Reads exactly `n` raw bytes (from the buffer first, then the socket); fewer when the connection ends.
    pub fn read_raw(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            if !self.fill() {
                break;
            }
        }
        let take = n.min(self.buf.len());
        self.buf.drain(..take).collect()
    }

    /// Reads one response head (status and lower-cased headers) and leaves the body on the socket.
    pub fn read_head(&mut self) -> Option<(u16, HashMap<String, String>)> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut parsed = httparse::Response::new(&mut headers);
            if let httparse::Status::Complete(len) = parsed.parse(&self.buf).expect("a well-formed response head") {
                let status = parsed.code.unwrap();
                let map = parsed
                    .headers
                    .iter()
                    .map(|h| (h.name.to_ascii_lowercase(), String::from_utf8_lossy(h.value).into_owned()))
                    .collect();
                self.buf.drain(..len);
                return Some((status, map));
            }
            if !self.fill() {
                return None;
            }
        }
    }
}

/// Every regular file under `dir`, recursively (empty when `dir` does not exist).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.map_while(Result::ok) {
        let path = entry.path();
        let ft = entry.file_type().unwrap();
        if ft.is_dir() {
            out.extend(files_under(&path));
        } else if ft.is_file() {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes; returns whether it held.
pub fn wait_for(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The id of `token` in a `token list` listing (JSON lines): what `limits set token:ID` and the metrics name.
pub fn token_id_in(listing: &str, token: &str) -> String {
    listing
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("token list prints JSON lines"))
        .map(|t| t["id"].as_str().expect("an id").to_owned())
        .find(|id| token.contains(id.as_str()))
        .expect("the token is listed")
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// RFC 9530 `Repr-Digest` value for `bytes`.
pub fn repr_digest(bytes: &[u8]) -> String {
    use base64::Engine as _;
    use sha2::Digest;
    format!("sha-256=:{}:", base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(bytes)))
}

/// Path and query of an absolute `http://host:port/...` URL.
pub fn path_of_url(url: &str) -> &str {
    let rest = url.split_once("://").expect("absolute URL").1;
    &rest[rest.find('/').expect("a path")..]
}

/// One part of a `multipart/byteranges` body.
#[derive(Debug, Clone)]
pub struct Part {
    /// Lower-cased names.
    pub headers: HashMap<String, String>,
    pub body: Vec<u8>,
}

/// Parses a `multipart/byteranges` response body strictly (RFC 2046 §5.1.1): the boundary comes from the
/// Content-Type; the body must start with the first delimiter and end with the close-delimiter.
pub fn parse_multipart(response: &Response) -> Vec<Part> {
    let ct = response.header("content-type").expect("a Content-Type");
    let boundary = ct
        .strip_prefix("multipart/byteranges; boundary=")
        .unwrap_or_else(|| panic!("not multipart/byteranges: {ct}"))
        .trim_matches('"');
    let body = &response.body;
    let delimiter = format!("--{boundary}");
    let mut rest: &[u8] = body.strip_prefix(delimiter.as_bytes()).expect("body starts with the first delimiter");
    let mut parts = Vec::new();
    loop {
        if let Some(tail) = rest.strip_prefix(b"--") {
            assert!(
                tail == b"\r\n" || tail.is_empty(),
                "junk after the close-delimiter: {:?}",
                String::from_utf8_lossy(tail)
            );
            return parts;
        }
        rest = rest.strip_prefix(b"\r\n").expect("CRLF after a delimiter");
        let head_end = find(rest, b"\r\n\r\n").expect("part headers end");
        let head = std::str::from_utf8(&rest[..head_end]).expect("ASCII part headers");
        let headers: HashMap<String, String> = head
            .split("\r\n")
            .map(|line| {
                let (k, v) = line.split_once(':').expect("name: value");
                (k.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        rest = &rest[head_end + 4..];
        // The part's length comes from its Content-Range, so object bytes that happen to look like a boundary
        // cannot confuse the parser.
        let (first, last, _) = parse_content_range(headers.get("content-range").expect("part Content-Range"));
        let len = (last - first + 1) as usize;
        parts.push(Part { headers, body: rest[..len].to_vec() });
        rest = &rest[len..];
        let next = format!("\r\n{delimiter}");
        rest = rest.strip_prefix(next.as_bytes()).expect("CRLF + delimiter after a part");
    }
}

/// `bytes a-b/size` → (a, b, size).
pub fn parse_content_range(value: &str) -> (u64, u64, u64) {
    let spec = value.strip_prefix("bytes ").unwrap_or_else(|| panic!("bad Content-Range {value:?}"));
    let (range, size) = spec.split_once('/').expect("a /");
    let (a, b) = range.split_once('-').expect("a -");
    (a.parse().unwrap(), b.parse().unwrap(), size.parse().unwrap())
}

pub fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Asserts a JSON error body `{"error": code, "message": <non-empty string>}` served as application/json.
pub fn assert_json_error(response: &Response, status: u16, code: &str) {
    assert_eq!(response.status, status, "body: {}", String::from_utf8_lossy(&response.body));
    assert_eq!(response.header("content-type"), Some("application/json"), "{response:?}");
    let json = response.json();
    assert_eq!(json["error"], code, "{json}");
    assert!(json["message"].as_str().is_some_and(|m| !m.is_empty()), "{json}");
    assert_eq!(json.as_object().unwrap().len(), 2, "only error and message: {json}");
}

/// Runs `cmd` with piped output and waits up to `timeout` for it to exit on its own; a process still running
/// then is killed and reported as a panic (for commands that must fail at start, such as a `serve` that must not
/// start serving).
pub fn run_until_exit(mut cmd: Command, timeout: Duration) -> Output {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = Instant::now() + timeout;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!("still running after {timeout:?}; stderr:\n{}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collect output")
}

impl TestEnv {
    /// `blobgate --data-dir <dir> serve --listen LISTEN --admin-listen ADMIN` as a command to run, with the
    /// developer's config and RUST_LOG kept out.
    pub fn serve_command(&self, listen: &str, admin_listen: &str) -> Command {
        let mut cmd = Command::new(BIN);
        self.with_database(&mut cmd);
        cmd.arg("--data-dir")
            .arg(self.data_dir())
            .args(["serve", "--listen", listen, "--admin-listen", admin_listen])
            .current_dir(self.dir.path())
            .env_remove("BLOBGATE_CONFIG")
            .env_remove("RUST_LOG");
        cmd
    }
}

impl TestEnv {
    /// Runs `blobgate ARGS` (for `["serve"]`, `serve` on port 0) with `url` as `database.url`, which must fail at
    /// start with one stderr line naming `database.url`: that line.
    pub fn refused_database_url(&self, args: &[&str], url: &str) -> String {
        let mut cmd = if args == ["serve"] {
            self.serve_command("127.0.0.1:0", "127.0.0.1:0")
        } else {
            let mut cmd = Command::new(BIN);
            cmd.arg("--data-dir").arg(self.data_dir()).args(args).env_remove("BLOBGATE_CONFIG");
            cmd
        };
        cmd.env("BLOBGATE_DATABASE_URL", url).env_remove("RUST_LOG");
        let line = one_line_error(&run_until_exit(cmd, Duration::from_secs(30)), args);
        assert!(line.starts_with("blobgate: database.url"), "{args:?} {url}: {line}");
        line
    }
}

/// Fails the test, naming the tool and where it comes from (`from`: "apt package curl"), when `tool` is not on
/// the PATH.
/// The path of a system daemon (nginx, varnishd) that may live outside `PATH`; fails naming its apt package.
pub fn system_binary(name: &str, package: &str) -> PathBuf {
    ["/usr/sbin", "/usr/local/sbin", "/usr/bin"]
        .into_iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not installed: scripts/test installs it (apt package {package})"))
}

/// A loopback address, free now, for what cannot bind port 0 and report it (nginx's config, two gateways racing
/// for one address) or must name a port nobody listens on. The port lies below the kernel's ephemeral range, so
/// no bind to port 0 and no outgoing connection can be given it meanwhile, and it is this process's alone until it
/// exits: an exclusive `flock` on `$TMPDIR/blobgate-test-ports/PORT`, held open for the process's life, keeps every
/// other test (this run's, run a process per test, or another run's on the machine) off it.
pub fn reserved_local_addr() -> SocketAddr {
    use nix::fcntl::{Flock, FlockArg};
    static HELD: Mutex<Vec<Flock<std::fs::File>>> = Mutex::new(Vec::new());
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").expect("the ephemeral range");
    let low: u16 = range.split_whitespace().next().and_then(|p| p.parse().ok()).expect("its low end");
    let locks = std::env::temp_dir().join("blobgate-test-ports");
    std::fs::create_dir_all(&locks).expect("the port lock directory");
    // 8192 ports below the range (which starts at 32768 by default), never the privileged ones; a random start
    // spreads concurrent tests apart, so they seldom try the same locks.
    let span = 8192.min(low - 1024);
    let offset = (rand_u64() % u64::from(span)) as u16;
    for n in 0..span {
        let port = low - 1 - (offset.wrapping_add(n) % span);
        let file = std::fs::File::create(locks.join(port.to_string())).expect("a port lock file");
        // Non-blocking: a port another process holds is skipped at once.
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else { continue };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Free now (a fixed-port daemon of the machine's own may hold it): skip it if not.
        if TcpListener::bind(addr).is_ok() {
            HELD.lock().unwrap().push(lock);
            return addr;
        }
    }
    panic!("no free loopback port below {low}");
}

/// The TCP addresses process `pid` listens on (its sockets in LISTEN state, from /proc): how a helper process
/// told to bind port 0 says which port it got.
pub fn listening_addrs(pid: u32) -> Vec<SocketAddr> {
    let inodes: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|fds| {
            fds.map_while(Result::ok)
                .filter_map(|fd| std::fs::read_link(fd.path()).ok())
                .filter_map(|target| {
                    let target = target.to_string_lossy().into_owned();
                    target.strip_prefix("socket:[").and_then(|t| t.strip_suffix(']')).and_then(|t| t.parse().ok())
                })
                .collect()
        })
        .unwrap_or_default();
    tcp_sockets().into_iter().filter(|s| s.state == TCP_LISTEN && inodes.contains(&s.inode)).map(|s| s.local).collect()
}

pub fn require_tool(tool: &str, from: &str) {
    let found =
        Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success());
    assert!(found, "this test needs {tool} ({from}; scripts/test installs it)");
}

/// Declares one test per metadata backend from one body: `NAME::sqlite` on a fresh SQLite data dir and
/// `NAME::postgres` on a fresh database of the test cluster; the body gets the `TestEnv` as `env`.
macro_rules! both_backends {
    ($name:ident, |$env:ident| $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn sqlite() {
                let $env = $crate::helpers::TestEnv::new();
                $body
            }

            #[test]
            fn postgres() {
                let $env = $crate::helpers::TestEnv::on_postgres();
                $body
            }
        }
    };
}
pub(crate) use both_backends;

/// The throw-away PostgreSQL cluster that `scripts/test` starts (`scripts/pg-cluster`), as its superuser URL.
pub fn postgres_server_url() -> String {
    std::env::var("BLOBGATE_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "BLOBGATE_TEST_POSTGRES_URL is not set: run the tests with scripts/test, which starts a throw-away \
             PostgreSQL cluster (or `scripts/pg-cluster start DIR` and export the URL it prints)"
        )
    })
}

/// A service `scripts/test` starts once for the whole run (`scripts/test-services`): the value of its variable
/// (`BLOBGATE_TEST_BOTO3`, `BLOBGATE_TEST_MOTO`, ...).
pub fn test_service(variable: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| {
        panic!(
            "{variable} is not set: run the tests with scripts/test, which starts the services the tests share \
             (or `eval \"$(scripts/test-services start DIR)\"`, and `scripts/test-services stop DIR` after)"
        )
    })
}

/// A PostgreSQL cluster of a test's own (`scripts/pg-cluster`): one that can be stopped and started again on the
/// same port while a replica runs on it, or that speaks TLS only. Removed on drop, even when the test fails.
pub struct OwnCluster {
    dir: tempfile::TempDir,
    /// The superuser's URL (`127.0.0.1`, no `sslmode`).
    pub url: String,
}

const PG_CLUSTER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-cluster");

impl OwnCluster {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A cluster with TLS on (this certificate and key) that refuses TCP logins without it.
    pub fn start_tls(cert: &Path, key: &Path) -> Self {
        Self::start_with(&["--tls".as_ref(), cert.as_os_str(), key.as_os_str()])
    }

    fn start_with(args: &[&std::ffi::OsStr]) -> Self {
        require_tool("psql", "apt package postgresql-client");
        let dir = tempfile::tempdir().expect("temp dir");
        let out = Command::new(PG_CLUSTER)
            .arg("start")
            .arg(dir.path().join("pg"))
            .args(args)
            .output()
            .expect("run pg-cluster");
        assert!(out.status.success(), "pg-cluster start: {}", String::from_utf8_lossy(&out.stderr));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        OwnCluster { dir, url }
    }

    pub fn run(&self, command: &str) {
        let out = Command::new(PG_CLUSTER).arg(command).arg(self.dir.path().join("pg")).output().unwrap();
        assert!(out.status.success(), "pg-cluster {command}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn port(&self) -> String {
        self.url.rsplit_once(':').unwrap().1.split('/').next().unwrap().to_owned()
    }

    /// Stops the server and every backend (SIGSTOP): connections stay open at the kernel and nothing answers, as
    /// a database host that hangs looks. Thawed (SIGCONT) when the guard drops.
    pub fn freeze(&self) -> FrozenCluster {
        let pidfile = std::fs::read_to_string(self.dir.path().join("pg/data/postmaster.pid")).expect("postmaster.pid");
        let postmaster: i32 = pidfile.lines().next().unwrap().trim().parse().unwrap();
        let children = std::fs::read_to_string(format!("/proc/{postmaster}/task/{postmaster}/children")).unwrap();
        let mut pids: Vec<i32> = children.split_whitespace().map(|p| p.parse().unwrap()).collect();
        pids.insert(0, postmaster);
        for &pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP);
        }
        FrozenCluster { pids }
    }
}

/// A cluster stopped by [`OwnCluster::freeze`]; dropping it lets the processes go on.
pub struct FrozenCluster {
    pids: Vec<i32>,
}

impl Drop for FrozenCluster {
    fn drop(&mut self) {
        for &pid in &self.pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGCONT);
        }
    }
}

impl Drop for OwnCluster {
    fn drop(&mut self) {
        let _ = Command::new(PG_CLUSTER).arg("stop").arg(self.dir.path().join("pg")).output();
    }
}

/// A fresh, empty database on the test cluster, for one test: its URL. Dropped by the cluster's removal at the
/// end of the run.
pub fn postgres_database() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let server = postgres_server_url();
    let name = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        rand_suffix()
    );
    require_tool("psql", "apt package postgresql-client");
    let out = Command::new("psql")
        .args([server.as_str(), "-v", "ON_ERROR_STOP=1", "-qc", &format!("CREATE DATABASE {name}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "CREATE DATABASE {name}: {}", String::from_utf8_lossy(&out.stderr));
    let (base, _) = server.rsplit_once('/').expect("the server URL ends in /DATABASE");
    format!("{base}/{name}")
}

fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.finish() as u32
}

/// Fails a test that nextest runs outside its test group `group` (.config/nextest.toml), naming the group: the
/// helpers that start strace, the kernel VM or a body larger than the socket buffers call it, so a new test of
/// that kind cannot run beside others of its kind unnoticed. Under `cargo test` (no nextest) there are no groups.
pub fn require_group(group: &str) {
    if let Ok(actual) = std::env::var("NEXTEST_TEST_GROUP") {
        let test = std::env::var("NEXTEST_TEST_NAME").unwrap_or_default();
        assert_eq!(
            actual, group,
            "{test} belongs to nextest's test group {group:?}: add it to that group's filter in .config/nextest.toml"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Time set in fixtures, and events read from the kernel: what lets a test wait for an event instead of a clock.
// ---------------------------------------------------------------------------------------------------------------

impl TestEnv {
    /// Runs `op` on this env's store as the fixtures do (`fixtures.rs`: opened as a CLI command opens it, and on
    /// SQLite closed after): for fixtures the CLI cannot make, such as one dated in the past.
    pub fn with_store<T>(&self, op: impl AsyncFnOnce(&blobgate::store::Store) -> anyhow::Result<T>) -> T {
        self.on_store("a fixture through the library", op)
    }

    /// The settings a CLI command of this env runs with (no config file).
    fn library_settings(&self) -> blobgate::config::Settings {
        let mut settings = blobgate::config::Settings { data_dir: self.data_dir(), ..Default::default() };
        settings.database.url = self.database_url.clone();
        settings
    }

    /// `blobgate token create --bucket BUCKET --scope SCOPE --expires-in EXPIRES_IN` as if run `ago` before now:
    /// with `expires_in` under `ago`, a token that has already expired.
    pub fn token_made_ago(&self, bucket: &str, scope: &str, ago: Duration, expires_in: Duration) -> String {
        let grant = blobgate::cli::GrantArgs {
            bucket: Some(bucket.to_owned()),
            prefix: None,
            scope: Some(scope.to_owned()),
            grants: Vec::new(),
            expires_in: Some(expires_in.as_secs()),
        };
        let now = blobgate::store::unix_now() - ago.as_secs() as i64;
        self.with_store(async |store| blobgate::cli::create_token(store, grant, now).await)
    }

    /// `blobgate presign BUCKET KEY --expires-in EXPIRES_IN --base-url BASE_URL` as if run `ago` before now: with
    /// `expires_in` under `ago`, a signed URL that has already expired.
    pub fn presigned_ago(
        &self,
        bucket: &str,
        key: &str,
        base_url: &str,
        ago: Duration,
        expires_in: Duration,
    ) -> String {
        let request = blobgate::cli::PresignRequest {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            expires_in: expires_in.as_secs(),
            base_url: base_url.to_owned(),
            response_content_disposition: None,
        };
        let now = blobgate::store::unix_now() - ago.as_secs() as i64;
        let settings = self.library_settings();
        self.with_store(async |store| blobgate::cli::presigned_url(store, &settings, request, now).await)
    }

    /// Stores `bytes` as `bucket/key` with `attrs`, last modified at `modified` (unix seconds), as a put made then
    /// would have: a Last-Modified in the past without waiting for the clock to pass it. Returns the SHA-256.
    pub fn put_modified_at(
        &self,
        bucket: &str,
        key: &str,
        bytes: &[u8],
        attrs: blobgate::names::ObjectAttrs,
        modified: i64,
    ) -> String {
        use blobgate::names::{BucketName, ObjectKey};
        self.with_store(async |store| {
            let (bucket, key) = (BucketName::parse(bucket)?, ObjectKey::parse(key)?);
            let mut writer = store.blobs.writer()?;
            writer.write(bytes)?;
            let staged = writer.finish()?;
            let mut tx = store.meta.lock_blob_refs().await?;
            let found = tx.bucket(&bucket).await?.ok_or_else(|| anyhow::anyhow!("no bucket {bucket}"))?;
            store.blobs.install(&staged)?;
            tx.upsert_object(found.id, &key, &staged.sha256, staged.size, &attrs, modified).await?;
            tx.commit().await?;
            Ok(staged.sha256.clone())
        })
    }

    /// The newest entry of the change log the caches follow (every committed change to an object, bucket or
    /// credential adds one): what a test compares to show that a command changed nothing.
    pub fn last_change(&self) -> i64 {
        // Read-only, as `blobgate ls` opens it: closing a writable handle waits up to a second for SQLite's WAL to
        // go, which it cannot while a server holds the database.
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        let settings = self.library_settings();
        let database = settings.database_url().expect("the env's database URL");
        runtime.block_on(async {
            let meta = blobgate::store::Metadata::open_read_only(&database, settings.timeouts.database())
                .await
                .expect("open the env's database read-only");
            let last = meta.feed().last_change().await.expect("the change log's head");
            meta.close().await;
            last
        })
    }
}

/// One IPv4 TCP socket as `/proc/net/tcp` shows it.
#[derive(Debug, Clone, Copy)]
pub struct TcpSocket {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The kernel's TCP state: 0x01 ESTABLISHED, 0x08 CLOSE_WAIT, 0x0A LISTEN, ...
    pub state: u8,
    /// Sent and not yet acknowledged (for a listening socket: 0).
    pub tx_queue: u64,
    /// Received and not yet read by the process (for a listening socket: connections not yet accepted).
    pub rx_queue: u64,
    /// The socket's inode: what `/proc/PID/fd/N` links to (`socket:[INODE]`).
    pub inode: u64,
}

pub const TCP_ESTABLISHED: u8 = 0x01;
pub const TCP_LISTEN: u8 = 0x0A;

/// Every IPv4 TCP socket of this network namespace.
pub fn tcp_sockets() -> Vec<TcpSocket> {
    let addr = |field: &str| -> SocketAddr {
        let (ip, port) = field.split_once(':').unwrap();
        let ip = std::net::Ipv4Addr::from(u32::from_str_radix(ip, 16).unwrap().to_be());
        SocketAddr::from((ip, u16::from_str_radix(port, 16).unwrap()))
    };
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // local_address and rem_address are HEX_IP:HEX_PORT (the IP in host byte order), then the state, the
            // queues, and the inode (the tenth field).
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (tx, rx) = fields.get(4)?.split_once(':')?;
            Some(TcpSocket {
                local: addr(fields[1]),
                remote: addr(fields[2]),
                state: u8::from_str_radix(fields[3], 16).ok()?,
                tx_queue: u64::from_str_radix(tx, 16).ok()?,
                rx_queue: u64::from_str_radix(rx, 16).ok()?,
                inode: fields.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The socket with these two ends, if it exists.
pub fn tcp_socket(local: SocketAddr, remote: SocketAddr) -> Option<TcpSocket> {
    tcp_sockets().into_iter().find(|s| s.local == local && s.remote == remote)
}

impl Conn {
    /// Waits (30 s bound a hang) until the server has read everything sent on this connection: nothing of it is
    /// unacknowledged at this end, and nothing unread at the server's.
    pub fn wait_until_read_by_server(&self) {
        let (local, remote) = (self.stream.local_addr().unwrap(), self.stream.peer_addr().unwrap());
        let read = wait_for(Duration::from_secs(30), || {
            tcp_socket(local, remote).is_some_and(|mine| mine.tx_queue == 0)
                && tcp_socket(remote, local).is_none_or(|theirs| theirs.rx_queue == 0)
        });
        assert!(read, "the server did not read what was sent: {:?}", tcp_socket(remote, local));
    }

    /// Waits (30 s bound a hang) until the server has ended its side of the connection (its FIN or its reset has
    /// arrived), without reading anything.
    pub fn wait_until_ended_by_server(&self) {
        // A socket whose peer reset it has no peer any more (ENOTCONN): ended already.
        let (Ok(local), Ok(remote)) = (self.stream.local_addr(), self.stream.peer_addr()) else { return };
        let ended = wait_for(Duration::from_secs(30), || {
            tcp_socket(local, remote).is_none_or(|mine| mine.state != TCP_ESTABLISHED)
        });
        assert!(ended, "the server never ended the connection");
    }
}

/// Connections to `addr` the kernel has completed and the server has not accepted yet (summed over every
/// listening socket on it, as with SO_REUSEPORT).
pub fn accept_backlog(addr: SocketAddr) -> u64 {
    tcp_sockets().iter().filter(|s| s.state == TCP_LISTEN && s.local == addr).map(|s| s.rx_queue).sum()
}

/// `clients` `curl --limit-rate RATE` downloads of `url` at once (files in `dir`); each must exit 0 with exactly
/// `expected`'s bytes (`log` says what the server wrote when one does not).
pub fn curl_rate_limited_readers(
    dir: &Path,
    url: &str,
    clients: usize,
    rate: &str,
    expected: &[u8],
    log: impl Fn() -> String,
) {
    require_tool("curl", "apt package curl");
    let expected = sha256_hex(expected);
    let readers: Vec<_> = (0..clients)
        .map(|n| {
            let out = dir.join(format!("curl-limited-{n}.bin"));
            let child = Command::new("curl")
                .args(["-sS", "--limit-rate", rate, "-o", out.to_str().unwrap(), url])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run curl");
            (out, child)
        })
        .collect();
    for (out, child) in readers {
        let finished = child.wait_with_output().unwrap();
        assert!(finished.status.success(), "curl: {}\n{}", String::from_utf8_lossy(&finished.stderr), log());
        assert_eq!(sha256_hex(&std::fs::read(out).unwrap()), expected);
    }
}
