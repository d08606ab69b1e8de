//! Test harness: spawn the real binary, drive it with its CLI, and talk raw HTTP/1.1 to it.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_blobgate");

/// A data dir with helpers to run CLI commands against it. The server is started separately, so tests can
/// prepare data first (or run CLI commands while it runs).
pub struct TestEnv {
    pub dir: tempfile::TempDir,
}

impl TestEnv {
    pub fn new() -> Self {
        Self { dir: tempfile::tempdir().expect("temp dir") }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Runs `blobgate --data-dir <dir> ARGS` and returns its output, whatever the exit status.
    pub fn cli(&self, args: &[&str]) -> Output {
        Command::new(BIN)
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
        assert!(
            out.status.success(),
            "blobgate {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    pub fn bucket(&self, name: &str, public: bool) {
        let mut args = vec!["bucket", "create", name];
        if public {
            args.push("--public");
        }
        self.ok(&args);
    }

    /// Writes `bytes` to a file and `put`s it; returns the put JSON.
    pub fn put_bytes(&self, bucket: &str, key: &str, bytes: &[u8], extra: &[&str]) -> serde_json::Value {
        let path = self.dir.path().join(format!("upload-{}", rand_u64()));
        std::fs::write(&path, bytes).unwrap();
        let mut args = vec!["put", bucket, key, path.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = self.ok(&args);
        std::fs::remove_file(&path).unwrap();
        serde_json::from_str(out.trim()).expect("put prints JSON")
    }

    pub fn token(&self, bucket: &str, scope: &str, extra: &[&str]) -> String {
        let mut args = vec!["token", "create", "--bucket", bucket, "--scope", scope];
        args.extend_from_slice(extra);
        self.ok(&args).trim().to_owned()
    }

    pub fn serve(&self) -> Server {
        self.serve_with(&[], &[])
    }

    /// Starts `blobgate serve` on port 0 with extra env vars and args, optionally wrapped (e.g. in strace).
    pub fn serve_with(&self, env: &[(&str, &str)], wrapper: &[&str]) -> Server {
        let mut cmd = if let Some((first, rest)) = wrapper.split_first() {
            let mut c = Command::new(first);
            c.args(rest).arg(BIN);
            c
        } else {
            Command::new(BIN)
        };
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
        let sink = log.clone();
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
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("server did not start; log:\n{}", log.lock().unwrap())
        });
        let addr = |field: &str| -> SocketAddr {
            let start = line.find(&format!("{field}=")).expect("address field") + field.len() + 1;
            line[start..].split_whitespace().next().unwrap().parse().expect("socket address")
        };
        Server { child: Some(child), wrapped: !wrapper.is_empty(), data: addr("data"), admin: addr("admin"), log }
    }
}

pub struct Server {
    child: Option<Child>,
    /// Started under a wrapper (strace): signals go to the wrapped blobgate, the wrapper's child.
    wrapped: bool,
    pub data: SocketAddr,
    pub admin: SocketAddr,
    log: Arc<Mutex<String>>,
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
        let mut conn = Conn::open(self.data);
        conn.send(&raw_request(method, path, headers, true));
        conn.read_response(method == "HEAD").expect("a response")
    }

    /// A request to the admin listener with an optional body.
    pub fn admin(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let mut conn = Conn::open(self.admin);
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

    /// Prometheus text from the admin listener.
    pub fn metrics(&self) -> String {
        String::from_utf8(self.admin("GET", "/metrics", &[], b"").body).unwrap()
    }

    /// The value of an unlabelled metric (0 when absent).
    pub fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).map(|v| v.trim().parse().unwrap()))
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

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {:?}", String::from_utf8_lossy(&self.body)))
    }
}

/// A raw client connection that can pipeline and read several responses.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
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
