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
