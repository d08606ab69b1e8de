//! Per-object download stats over the wire: exact counters after a known mix of responses, including a client
//! that resets the connection mid-body.

use std::io::Read;
use std::time::Duration;

use crate::helpers::*;

fn stats(env: &TestEnv) -> serde_json::Value {
    serde_json::from_str(env.ok(&["stats", "--json"]).trim()).expect("stats --json prints a JSON array")
}

/// Waits for the batcher (it writes at least once a second) until `done` holds.
fn wait_for_stats(env: &TestEnv, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let mut s = serde_json::Value::Null;
    wait_for(Duration::from_secs(30), || {
        s = stats(env);
        done(&s)
    });
    s
}

#[test]
fn counters_are_exact_after_a_known_mix() {
    let env = TestEnv::new();
    env.bucket("stat", true);
    let size = 16 << 20;
    let bytes = test_bytes(size, 5);
    env.put_bytes("stat", "big.bin", &bytes, &[]);
    env.put_bytes("stat", "other.bin", b"untouched", &[]);
    let server = env.serve();
    let path = "/stat/big.bin";
    let sent_before = server.metric("blobgate_sent_bytes_total");

    for _ in 0..2 {
        assert_eq!(server.get(path, &[]).body.len(), size);
    }
    let one = server.get(path, &[("Range", "bytes=100-1099")]);
    assert_eq!((one.status, one.body.len()), (206, 1000));
    let multi = server.get(path, &[("Range", "bytes=0-9,1000-1009,-10")]);
    assert_eq!(multi.status, 206);
    let etag = one.header("etag").unwrap().to_owned();
    assert_eq!(server.get(path, &[("If-None-Match", &etag)]).status, 304);
    assert_eq!(server.request("HEAD", path, &[]).status, 200);
    let completed_bytes = 2 * size as u64 + 1000 + 30;

    // A client that reads about 1 MiB, then resets the connection.
    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", path, &[], true));
    let mut received = 0usize;
    let mut chunk = vec![0u8; 64 * 1024];
    while received < (1 << 20) {
        received += conn.stream.read(&mut chunk).expect("read");
    }
    conn.reset();

    let s = wait_for_stats(&env, |s| s[0]["aborted"] == 1);
    let row = s.as_array().unwrap().iter().find(|r| r["key"] == "big.bin").expect("a row for big.bin").clone();
    assert_eq!(row["bucket"], "stat");
    assert_eq!(row["requests"], 5, "{row}");
    assert_eq!(row["completed"], 4, "{row}");
    assert_eq!(row["aborted"], 1, "{row}");
    assert_eq!(row["range_requests"], 2, "{row}");
    assert_eq!(row["not_modified"], 1, "{row}");
    assert_eq!(row["head_requests"], 1, "{row}");
    assert!(row["last_download_at"].as_str().is_some_and(|t| t.ends_with('Z')), "{row}");
    let aborted_bytes = row["bytes_sent"].as_u64().unwrap() - completed_bytes;
    // Sent (accepted by the kernel) is at least what the client read (less the response head, under 1 KiB)
    // and at most the object.
    assert!(
        aborted_bytes >= received as u64 - 1024 && aborted_bytes <= size as u64,
        "aborted response sent {aborted_bytes} bytes; client received {received}"
    );
    assert!(s.as_array().unwrap().iter().all(|r| r["key"] != "other.bin"), "untouched objects have no row");
    // The Prometheus counter and the database agree: both come from sendfile's return values.
    let sent = server.metric("blobgate_sent_bytes_total") - sent_before;
    assert_eq!(sent as u64, row["bytes_sent"].as_u64().unwrap());
}

#[test]
fn stats_survive_shutdown_and_filter_by_bucket_and_top() {
    let env = TestEnv::new();
    env.bucket("aaa", true);
    env.bucket("bbb", true);
    env.put_bytes("aaa", "small", &test_bytes(10, 1), &[]);
    env.put_bytes("aaa", "large", &test_bytes(10_000, 2), &[]);
    env.put_bytes("bbb", "x", &test_bytes(100, 3), &[]);
    let mut server = env.serve();
    for _ in 0..3 {
        server.get("/aaa/small", &[]);
    }
    server.get("/aaa/large", &[]);
    server.get("/bbb/x", &[]);
    // Stop at once: the batcher must write what it holds on shutdown.
    assert_eq!(server.stop(), Some(0));

    let by_bytes: serde_json::Value =
        serde_json::from_str(env.ok(&["stats", "--bucket", "aaa", "--json"]).trim()).unwrap();
    let keys: Vec<_> = by_bytes.as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap().to_owned()).collect();
    assert_eq!(keys, ["large", "small"]);
    let top: serde_json::Value =
        serde_json::from_str(env.ok(&["stats", "--top", "1", "--by", "requests", "--json"]).trim()).unwrap();
    assert_eq!(top.as_array().unwrap().len(), 1);
    assert_eq!(top[0]["key"], "small");
    assert_eq!(top[0]["requests"], 3);
    let table = env.ok(&["stats"]);
    assert!(table.lines().next().unwrap().starts_with("BUCKET/KEY"), "{table}");
    assert_eq!(table.lines().count(), 4, "{table}");
    let unknown = env.cli(&["stats", "--bucket", "nope", "--json"]);
    assert!(!unknown.status.success());
}

#[test]
fn admin_stats_endpoint_needs_an_admin_token_and_shows_only_its_bucket() {
    let env = TestEnv::new();
    env.bucket("mine", true);
    env.bucket("theirs", true);
    env.put_bytes("mine", "a", b"aaaa", &[]);
    env.put_bytes("theirs", "b", b"bbbb", &[]);
    let admin = env.token("mine", "admin", &[]);
    let reader = env.token("mine", "read", &[]);
    let server = env.serve();
    server.get("/mine/a", &[]);
    server.get("/theirs/b", &[]);
    wait_for_stats(&env, |s| s.as_array().is_some_and(|a| a.len() == 2));

    assert_eq!(server.admin("GET", "/stats", &[], b"").status, 401);
    let auth = |t: &str| format!("Bearer {t}");
    assert_eq!(server.admin("GET", "/stats", &[("Authorization", &auth(&reader))], b"").status, 403);
    let r = server.admin("GET", "/stats?top=10&by=requests", &[("Authorization", &auth(&admin))], b"");
    assert_eq!(r.status, 200);
    let rows = r.json();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["bucket"], "mine");
    assert_eq!(rows[0]["bytes_sent"], 4);
    assert_eq!(server.admin("GET", "/stats?by=size", &[("Authorization", &auth(&admin))], b"").status, 400);
}
