//! The invariant, proven with syscalls: object bytes leave by sendfile(2); read/write-like calls move only heads.
//! Runs the server under `strace -f` (installed by `.ci/run`) and downloads a 64 MiB object whole, by one
//! range, and as a 3-part multi-range.

use std::path::Path;
use std::process::Command;

use crate::helpers::*;

const COPY_CALLS: &[&str] = &[
    "read", "readv", "pread64", "preadv", "preadv2", "recvfrom", "recvmsg", "write", "writev", "pwrite64", "pwritev",
    "sendto", "sendmsg",
];

#[derive(Debug, Default)]
struct Trace {
    sendfile_calls: u64,
    sendfile_bytes: u64,
    copy_calls: u64,
    copied_bytes: u64,
}

/// Sums an `strace -f -o` file the way `shared/bench/compare.py` does.
fn parse_trace(path: &Path) -> Trace {
    let text = std::fs::read_to_string(path).expect("strace output");
    let mut t = Trace::default();
    for line in text.lines() {
        if line.contains("<unfinished") {
            continue;
        }
        let rest = line.trim_start_matches(|c: char| c.is_ascii_digit()).trim_start();
        let name = if let Some(r) = rest.strip_prefix("<... ") {
            r.split_whitespace().next().unwrap_or("")
        } else {
            rest.split('(').next().unwrap_or("")
        };
        let result = line.rsplit_once(") = ").and_then(|(_, r)| r.split_whitespace().next()?.parse::<i64>().ok());
        let moved = result.filter(|n| *n > 0).unwrap_or(0) as u64;
        if name == "sendfile" || name == "sendfile64" {
            t.sendfile_calls += 1;
            t.sendfile_bytes += moved;
        } else if COPY_CALLS.contains(&name) {
            t.copy_calls += 1;
            t.copied_bytes += moved;
        }
    }
    t
}

fn strace_available() -> bool {
    Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success())
}

/// Serves one request under strace and returns (response, trace).
fn traced_download(env: &TestEnv, path: &str, headers: &[(&str, &str)], name: &str) -> (Response, Trace) {
    let trace_file = env.dir.path().join(format!("{name}.strace"));
    let trace_arg = trace_file.to_str().unwrap().to_owned();
    let mut server = env.serve_with(&[], &["strace", "-f", "-qq", "-s", "0", "-o", &trace_arg]);
    let response = server.get(path, headers);
    assert_eq!(server.stop(), Some(0), "server log:\n{}", server.log());
    (response, parse_trace(&trace_file))
}

#[test]
fn object_bytes_leave_by_sendfile_only() {
    assert!(strace_available(), "strace is required for this test (.ci/run installs it: apt-get install -y strace)");
    let env = TestEnv::new();
    env.bucket("big", false);
    let size = 64 << 20;
    let bytes = test_bytes(size, 64);
    env.put_bytes("big", "blob.bin", &bytes, &[]);
    let token = env.token("big", "read", &[]);
    let auth = format!("Bearer {token}");

    let cases: [(&str, Option<String>, usize); 3] = [
        ("full", None, size),
        ("range", Some(format!("bytes=1000-{}", 40 << 20)), (40 << 20) - 1000 + 1),
        (
            "multi",
            Some(format!("bytes=0-99999,{}-{},{}-", size / 2, size / 2 + 5_000_000, size - 1000)),
            100_000 + 5_000_001 + 1000,
        ),
    ];
    for (name, range, object_bytes) in cases {
        let mut headers = vec![("Authorization", auth.as_str())];
        if let Some(r) = range.as_deref() {
            headers.push(("Range", r));
        }
        let (response, trace) = traced_download(&env, "/big/blob.bin", &headers, name);
        match name {
            "full" => {
                assert_eq!(response.status, 200);
                assert!(response.body == bytes, "full body differs");
            }
            "range" => {
                assert_eq!(response.status, 206);
                assert!(response.body == bytes[1000..=(40 << 20)], "range body differs");
            }
            _ => {
                assert_eq!(response.status, 206);
                assert!(response.header("content-type").unwrap().starts_with("multipart/byteranges"));
            }
        }
        eprintln!("{name}: {trace:?}");
        // sendfile carried every object byte...
        assert_eq!(trace.sendfile_bytes, object_bytes as u64, "{name}: sendfile moved {trace:?}");
        // ...and read/write-like calls moved under 0.1% of them (request/response heads, boundaries, start-up).
        let ratio = trace.copied_bytes as f64 / object_bytes as f64;
        assert!(
            ratio < 0.001,
            "{name}: read/write-like calls moved {} bytes ({ratio:.5} per body byte)",
            trace.copied_bytes
        );
    }
}

/// Calls per syscall name in an `strace -f -o` file, and how many of them failed with EAGAIN. With
/// `threads_that_made`, only the calls of threads that made that syscall at least once count.
fn count_calls(path: &Path, threads_that_made: Option<&str>) -> std::collections::HashMap<String, (u64, u64)> {
    let text = std::fs::read_to_string(path).expect("strace output");
    let tid = |line: &str| line.split_whitespace().next().unwrap_or("").to_owned();
    let only: Option<std::collections::HashSet<String>> =
        threads_that_made.map(|call| text.lines().filter(|l| l.contains(&format!(" {call}("))).map(tid).collect());
    let mut counts = std::collections::HashMap::new();
    for line in text.lines().filter(|l| !l.contains("<unfinished")) {
        if only.as_ref().is_some_and(|threads| !threads.contains(&tid(line))) {
            continue;
        }
        let rest = line.trim_start_matches(|c: char| c.is_ascii_digit()).trim_start();
        let name = match rest.strip_prefix("<... ") {
            Some(r) => r.split_whitespace().next().unwrap_or(""),
            None => rest.split('(').next().unwrap_or(""),
        };
        let entry: &mut (u64, u64) = counts.entry(name.to_owned()).or_default();
        entry.0 += 1;
        entry.1 += u64::from(line.contains("EAGAIN"));
    }
    counts
}

/// A small download on a kept-alive connection costs three syscalls: the request's `recvfrom`, the head's `sendto` and the body's
/// `sendfile`. Guards two regressions that each added a syscall per request: a `recvfrom` that can only fail with
/// EAGAIN before every wait for the next request, and an eventfd `write` from registering a timer that is the
/// earliest on tokio's wheel (the handler deadline, or the idle deadline with few connections).
#[test]
fn a_small_request_costs_three_syscalls() {
    assert!(strace_available(), "strace is required for this test (.ci/run installs it: apt-get install -y strace)");
    let env = TestEnv::new();
    env.bucket("small", false);
    let bytes = test_bytes(4096, 7);
    env.put_bytes("small", "a.bin", &bytes, &[]);
    let token = env.token("small", "read", &[]);
    let auth = format!("Bearer {token}");
    let trace_file = env.dir.path().join("small.strace");
    let trace_arg = trace_file.to_str().unwrap().to_owned();
    let mut server = env.serve_with(&[], &["strace", "-f", "-qq", "-s", "0", "-o", &trace_arg]);
    // 100 connections one after another, 4 requests each: a new connection's first idle deadline, registered
    // while the worker has no other timer, is the case that unparked the driver before the timer anchor.
    const CONNECTIONS: u64 = 100;
    const REQUESTS: u64 = CONNECTIONS * 4;
    for _ in 0..CONNECTIONS {
        let mut conn = Conn::open(server.data);
        for _ in 0..REQUESTS / CONNECTIONS {
            conn.send(&raw_request("GET", "/small/a.bin", &[("Authorization", auth.as_str())], false));
            let response = conn.read_response(false).expect("a response");
            assert_eq!(response.status, 200);
            assert!(response.body == bytes);
        }
    }
    assert_eq!(server.stop(), Some(0), "server log:\n{}", server.log());
    // Count on the data workers' threads only (those that ran sendfile): start-up, the admin runtime and the
    // stats batcher have their own threads and wake-ups.
    let counts = count_calls(&trace_file, Some("sendfile"));
    let calls = |name: &str| counts.get(name).copied().unwrap_or_default();
    eprintln!(
        "per {REQUESTS} requests: {:?}",
        ["recvfrom", "sendto", "sendfile", "write", "epoll_wait"].map(|n| (n, calls(n)))
    );
    assert_eq!(calls("sendfile").0, REQUESTS, "one sendfile per 4 KiB body");
    assert!(calls("sendto").0 >= REQUESTS, "one send per head");
    // The worker's timer anchor adds a wake-up per 500 ms, not one per request.
    assert!(calls("recvfrom").1 < REQUESTS / 20, "recvfrom failed with EAGAIN {} times", calls("recvfrom").1);
    assert!(
        calls("write").0 < REQUESTS / 20,
        "{} write calls (eventfd wake-ups) for {REQUESTS} requests",
        calls("write").0
    );
}

#[test]
fn the_trace_parser_counts_like_compare_py() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(
        dir.path(),
        "t.strace",
        b"12 sendfile(5, 6, [0] => [100], 100) = 100\n\
          12 write(2, \"\"..., 20) = 20\n\
          13 sendfile(5, 6, [100], 50 <unfinished ...>\n\
          13 <... sendfile resumed> => [150]) = 50\n\
          12 recvfrom(5, \"\"..., 4096, 0, NULL, NULL) = -1 EAGAIN (Resource temporarily unavailable)\n\
          12 read(7, \"\"..., 10) = 10\n",
    );
    let t = parse_trace(&path);
    assert_eq!((t.sendfile_calls, t.sendfile_bytes), (2, 150));
    assert_eq!((t.copy_calls, t.copied_bytes), (3, 30));
}
