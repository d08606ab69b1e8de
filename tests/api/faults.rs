//! Faults the gateway must survive while serving everyone else: fd exhaustion at accept, slowloris heads, a
//! full disk during an upload, and a database locked by another process while stats are being written.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::helpers::*;

#[test]
fn emfile_at_accept_backs_off_and_keeps_serving() {
    let env = TestEnv::new();
    env.bucket("fds", true);
    env.put_bytes("fds", "k", b"still here", &[]);
    let server = env.serve_with(&[("BLOBGATE_RUNTIME__DATA_WORKERS", "2")], &[]);
    // Warm up so the database pool and runtime have their fds, then cap the process at 64 open files.
    assert_eq!(server.get("/fds/k", &[]).status, 200);
    let limited = Command::new("prlimit").args(["--pid", &server.pid().to_string(), "--nofile=64:64"]).status();
    assert!(limited.is_ok_and(|s| s.success()), "prlimit is needed (util-linux)");

    let flooded = Instant::now();
    let mut idle: Vec<TcpStream> = (0..120).map(|_| TcpStream::connect(server.data).unwrap()).collect();
    // The accept loop is now failing with EMFILE: it must back off, not spin. The back-off doubles from 5 ms
    // and a success resets it, so reaching 320 ms takes six failures in a row, each followed by its wait.
    let backed_off = wait_for(Duration::from_secs(30), || server.log().contains("backoff_ms=320"));
    assert!(backed_off, "the accept back-off never reached 320 ms; log:\n{}", server.log());

    // Free fds: the server takes the waiting connections and serves new ones again.
    idle.truncate(5);
    let recovered = wait_for(Duration::from_secs(30), || {
        let mut conn = Conn::open(server.data);
        conn.send(&raw_request("GET", "/fds/k", &[], true));
        conn.read_response(false)
            .inspect(|r| assert_eq!((r.status, r.body.as_slice()), (200, &b"still here"[..])))
            .is_some()
    });
    assert!(recovered, "the server did not recover after fds were freed");
    let window = flooded.elapsed();
    drop(idle);
    // Every failure is followed by a wait of at least 5 ms, so each acceptor (two data workers, the admin
    // listener) fails at most once per 5 ms of the window; a loop that spins fails thousands of times as often.
    // The bound grows with the window measured here, so a slow machine only loosens it.
    let failures = server.metric("blobgate_accept_errors_total");
    let most = 3.0 * (window.as_millis() as f64 / 5.0 + 1.0);
    assert!(failures >= 1.0, "EMFILE was never counted");
    assert!(failures <= most, "{failures} accept failures in {window:?}: at most {most} with the back-off");
    assert!(server.log().contains("accept failed; backing off"), "no back-off was logged");
}

#[test]
fn slowloris_heads_do_not_delay_others_and_are_timed_out() {
    let env = TestEnv::new();
    env.bucket("slow", true);
    let body = test_bytes(100_000, 4);
    env.put_bytes("slow", "k", &body, &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__HEADER_READ", "8s")], &[]);
    // 300 connections that each send half a head and then nothing.
    let mut lorises: Vec<Conn> = (0..300)
        .map(|_| {
            let mut conn = Conn::open(server.data);
            conn.send(b"GET /slow/k HTTP/1.1\r\nHost: x\r\nX-Slow: ");
            conn
        })
        .collect();
    // Everyone else is served normally meanwhile: all fifty before the header timeout answers a single loris
    // (an ordering of events; a server busy with the lorises would serve the others only once they time out).
    for _ in 0..50 {
        let r = server.get("/slow/k", &[]);
        assert!(r.status == 200 && r.body == body);
    }
    let waiting = lorises.iter_mut().filter_map(|conn| conn.untouched().then_some(())).count();
    assert_eq!(waiting, 300, "lorises were answered before the fifty normal requests were served");
    // And every partial head is answered 408 and closed by the header timeout.
    let mut timed_out = 0;
    for conn in lorises.iter_mut() {
        let (bytes, _) = conn.read_to_end();
        if bytes.starts_with(b"HTTP/1.1 408") {
            timed_out += 1;
        }
    }
    assert_eq!(timed_out, 300, "every slowloris connection gets 408 and is closed");
}

/// A tmpfs mounted over a directory for the life of the guard.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    /// Panics naming what is missing: mounting needs root (CAP_SYS_ADMIN) and `mount`.
    fn mount(dir: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("this test needs mount (Debian package mount; scripts/test installs it)");
        assert!(status.success(), "mounting a {size} tmpfs failed: this test needs root (CAP_SYS_ADMIN)");
        SmallDisk(dir.to_owned())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn disk_full_during_upload_is_507_and_leaves_nothing() {
    let env = TestEnv::new();
    let _disk = SmallDisk::mount(&env.data_dir(), "3m");
    env.bucket("full", true);
    env.put_bytes("full", "small", b"fits", &[]);
    let writer = env.token("full", "write", &[]);
    let server = env.serve();
    let big = test_bytes(6 << 20, 1);
    let r = server.admin("PUT", "/full/big", &[("Authorization", &format!("Bearer {writer}"))], &big);
    assert_eq!(r.status, 507, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["error"], "insufficient_storage");
    assert_eq!(server.get("/full/big", &[]).status, 404, "nothing of the failed upload is visible");
    let leftovers: Vec<_> = std::fs::read_dir(env.data_dir().join("tmp")).unwrap().collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
    // The gateway keeps serving, and a small upload still fits.
    assert_eq!(server.get("/full/small", &[]).body, b"fits");
    let r = server.admin("PUT", "/full/tiny", &[("Authorization", &format!("Bearer {writer}"))], b"ok");
    assert_eq!(r.status, 201);
    // The 507 is logged once, with its cause.
    let log = server.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert_eq!(errors.len(), 1, "one error line for one 507:\n{log}");
    assert!(errors[0].contains("request failed") && errors[0].contains("status=507"), "{}", errors[0]);
}

#[test]
fn a_locked_database_loses_no_stats() {
    let env = TestEnv::new();
    env.bucket("busy", true);
    env.put_bytes("busy", "k", &test_bytes(1000, 2), &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SQLITE_BUSY", "200ms")], &[]);
    // Another process holds SQLite's write lock until told to let go (readers still work in WAL mode).
    let db = env.data_dir().join("blobgate.db");
    let mut locker = Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys,time; c=sqlite3.connect(sys.argv[1], isolation_level=None); \
             c.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); sys.stdin.readline(); c.execute('COMMIT')",
        ])
        .arg(&db)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(locker.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    for _ in 0..7 {
        assert_eq!(server.get("/busy/k", &[]).status, 200);
    }
    let blocked = wait_for(Duration::from_secs(30), || server.metric("blobgate_stats_flush_errors_total") >= 1.0);
    assert!(blocked, "the lock never got in the batcher's way");
    // Let go of the lock: the buffered stats arrive, none lost.
    std::io::Write::write_all(locker.stdin.as_mut().unwrap(), b"go\n").unwrap();
    assert!(locker.wait().unwrap().success());
    let mut stats = serde_json::Value::Null;
    let arrived = wait_for(Duration::from_secs(30), || {
        stats = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
        stats[0]["requests"] == 7
    });
    assert!(arrived, "stats after the lock: {stats}");
    assert_eq!(stats[0]["completed"], 7);
    assert_eq!(stats[0]["bytes_sent"], 7000);
}

#[test]
fn cold_blobs_are_sent_from_the_blocking_pool_byte_exact() {
    use std::os::fd::AsRawFd;
    let env = TestEnv::new();
    env.bucket("cold", true);
    let size = 8 << 20;
    let bytes = test_bytes(size, 11);
    let put = env.put_bytes("cold", "big.bin", &bytes, &[]);
    let server = env.serve();
    // Drop the blob from the page cache, as if it had not been read for a long time.
    let sha = put["sha256"].as_str().unwrap();
    let blob = env.data_dir().join("blobs").join(&sha[..2]).join(&sha[2..4]).join(sha);
    let file = std::fs::File::open(&blob).unwrap();
    // SAFETY: posix_fadvise takes an open fd and numbers only.
    assert_eq!(unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) }, 0);
    let r = server.get("/cold/big.bin", &[]);
    assert_eq!(r.status, 200);
    assert!(r.body == bytes, "cold download differs");
    assert!(server.metric("blobgate_cold_chunks_total") >= 1.0, "no chunk was detected as cold");
    // A warm repeat goes inline: no new cold chunks.
    let before = server.metric("blobgate_cold_chunks_total");
    assert!(server.get("/cold/big.bin", &[]).body == bytes);
    assert_eq!(server.metric("blobgate_cold_chunks_total"), before);
}

#[test]
fn aborted_downloads_release_their_fds_and_nothing_spins() {
    use std::io::Read;
    let env = TestEnv::new();
    env.bucket("abrt", true);
    env.put_bytes("abrt", "big.bin", &test_bytes(larger_than_socket_buffers(), 3), &[]);
    let server = env.serve();
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", server.pid())).unwrap().count();
    assert_eq!(server.get("/abrt/big.bin", &[("Range", "bytes=0-0")]).status, 206);
    // The baseline once the warm-up's connection has ended (its socket is one of the fds).
    let closed = wait_for(Duration::from_secs(30), || server.metric("blobgate_open_connections") == 0.0);
    assert!(closed, "the warm-up connection never ended");
    let baseline = fds();
    // Twenty clients start the download, read a little, and reset their connections.
    for _ in 0..20 {
        let mut conn = Conn::open(server.data);
        conn.send(&raw_request("GET", "/abrt/big.bin", &[], true));
        let mut chunk = [0u8; 65536];
        let _ = conn.stream.read(&mut chunk);
        conn.reset();
    }
    let released = wait_for(Duration::from_secs(30), || fds() <= baseline);
    assert!(released, "fds not released: {} open, {baseline} before", fds());
    // And no task is left polling a dead socket: every aborted connection's task has ended (the gauges drop
    // when a connection's task does), so nothing is left to spin.
    let ended = wait_for(Duration::from_secs(30), || {
        server.metric("blobgate_open_connections") == 0.0 && server.metric("blobgate_active_downloads") == 0.0
    });
    assert!(
        ended,
        "connections still open after the aborts: {} open, {} downloads",
        server.metric("blobgate_open_connections"),
        server.metric("blobgate_active_downloads")
    );
    assert!(server.metric("blobgate_aborted_responses_total") >= 20.0);
}
