//! The admin listener: health, metrics (the sent-bytes counter is exact), uploads (auth, attributes, limits,
//! de-duplication, aborted and chunked bodies) and deletes.

use std::io::Write;
use std::time::Duration;

use crate::helpers::*;

/// A private bucket `box` and a public bucket `open`, with write/read tokens for `box`.
struct Admin {
    env: TestEnv,
    write: String,
    read: String,
}

fn setup() -> Admin {
    let env = TestEnv::new();
    env.bucket("box", false);
    env.bucket("open", true);
    let write = env.token("box", "write", &[]);
    let read = env.token("box", "read", &[]);
    Admin { env, write, read }
}

#[test]
fn healthz_and_metrics() {
    let a = setup();
    let server = a.env.serve();
    let r = server.admin("GET", "/healthz", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"ok\n");
    let r = server.admin("GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"), "{:?}", r.header("content-type"));
    let text = String::from_utf8(r.body).unwrap();
    assert!(text.contains("blobgate_sent_bytes_total"), "{text}");
    // Every series is blobgate_-prefixed, and no label carries an object key or bucket name.
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        assert!(line.starts_with("blobgate_"), "unprefixed series: {line}");
    }
    // Admin paths are not object reads.
    // On the data listener `/healthz` is the root of a bucket of that name, absent here: refused like any.
    assert_eq!(server.get("/healthz", &[]).status, 401, "the data listener has no /healthz");
}

#[test]
fn sent_bytes_grow_by_exactly_the_object_bytes_of_downloads() {
    let a = setup();
    let env = &a.env;
    let bytes = test_bytes(300_000, 5);
    env.put_bytes("open", "m.bin", &bytes, &[]);
    let server = env.serve();
    let sent = || server.metric("blobgate_sent_bytes_total");
    let before = sent();
    let mut expected = 0usize;

    let full = server.get("/open/m.bin", &[]);
    assert!(full.body == bytes);
    expected += bytes.len();
    let ranged = server.get("/open/m.bin", &[("Range", "bytes=1000-1999")]);
    assert!(ranged.body == bytes[1000..2000]);
    expected += 1000;
    // Multipart: only the object bytes count, not boundaries or part headers.
    let multi = server.get("/open/m.bin", &[("Range", "bytes=0-99,200000-200049")]);
    assert_eq!(parse_multipart(&multi).len(), 2);
    assert!(multi.body.len() > 150);
    expected += 150;
    // HEAD, 304, 416 and errors send no object bytes.
    server.request("HEAD", "/open/m.bin", &[]);
    let etag = full.header("etag").unwrap().to_owned();
    assert_eq!(server.get("/open/m.bin", &[("If-None-Match", &etag)]).status, 304);
    assert_eq!(server.get("/open/m.bin", &[("Range", "bytes=999999-")]).status, 416);
    assert_eq!(server.get("/open/missing", &[]).status, 404);

    let target = before + expected as f64;
    let reached = wait_for(Duration::from_secs(30), || sent() >= target);
    assert!(reached, "sent bytes {} < {target}", sent());
    // Every connection that served them has ended (and counted whatever it sent before it did), so nothing is
    // left that could add to the count.
    let ended = wait_for(Duration::from_secs(30), || {
        server.metric("blobgate_open_connections") == 0.0 && server.metric("blobgate_active_downloads") == 0.0
    });
    assert!(ended, "data connections still open: {}", server.metric("blobgate_open_connections"));
    assert_eq!(sent(), target, "sent bytes must grow by exactly the object bytes");
    // Labels are bounded: no series names an object or a bucket.
    let text = server.metrics();
    assert!(!text.contains("m.bin") && !text.contains("\"open\""), "per-object labels:\n{text}");
}

#[test]
fn upload_with_a_write_token_answers_the_put_json_and_is_downloadable() {
    let a = setup();
    let server = a.env.serve();
    let bytes = test_bytes(200_000, 6);
    let r = server.put("/box/dir/up.json", &a.write, &bytes, &[]);
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let json = r.json();
    let sha = sha256_hex(&bytes);
    assert_eq!(json["bucket"], "box");
    assert_eq!(json["key"], "dir/up.json");
    assert_eq!(json["size"], bytes.len() as u64);
    assert_eq!(json["sha256"], sha.as_str());
    assert_eq!(json["etag"], format!("\"{sha}\""));
    assert_eq!(json["content_type"], "application/json");
    assert_eq!(json["status"], "created");
    let got = server.get_auth("/box/dir/up.json", &a.read, &[]);
    assert_eq!(got.status, 200);
    assert!(got.body == bytes);
    assert_eq!(got.header("etag"), json["etag"].as_str());

    // The same JSON as `blobgate put` for the same content.
    let cli = a.env.put_bytes("box", "dir/cli.json", &bytes, &[]);
    for field in ["size", "sha256", "etag", "content_type"] {
        assert_eq!(cli[field], json[field], "{field}");
    }
    // The same again is unchanged; other bytes replace (and the old blob goes with its last reference).
    let again = server.put("/box/dir/up.json", &a.write, &bytes, &[]);
    assert_eq!(again.json()["status"], "unchanged");
    let other = test_bytes(10, 60);
    let replaced = server.put("/box/solo", &a.write, &other, &[]);
    assert_eq!(replaced.json()["status"], "created");
    let old_blob = a.env.blob_path(&sha256_hex(&other));
    assert!(old_blob.is_file());
    let replaced = server.put("/box/solo", &a.write, b"new", &[]);
    assert_eq!(replaced.json()["status"], "replaced");
    assert!(!old_blob.exists(), "the replaced blob had no other reference");
    assert_eq!(server.get_auth("/box/solo", &a.read, &[]).body, b"new");
    // Admin scope writes too.
    let admin = a.env.token("box", "admin", &[]);
    assert_eq!(server.put("/box/by-admin", &admin, b"a", &[]).status, 201);
}

#[test]
fn uploads_need_write_access_to_that_bucket() {
    let a = setup();
    let env = &a.env;
    env.bucket("other", false);
    let prefixed = env.token("box", "write", &["--prefix", "inbox/"]);
    let server = env.serve();
    let r = server.put("/box/k", &a.read, b"x", &[]);
    assert_json_error(&r, 403, "forbidden");
    let r = server.admin("PUT", "/box/k", &[], b"x");
    assert_json_error(&r, 401, "unauthorized");
    assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    let r = server.admin("PUT", "/box/k", &[("Authorization", "Basic eDp5")], b"x");
    assert_json_error(&r, 401, "unauthorized");
    // A public bucket is still not writable anonymously.
    assert_json_error(&server.admin("PUT", "/open/k", &[], b"x"), 401, "unauthorized");
    // A valid token for another bucket, on an existing or a missing bucket: 403 either way.
    assert_json_error(&server.put("/other/k", &a.write, b"x", &[]), 403, "forbidden");
    assert_json_error(&server.put("/nosuchbucket/k", &a.write, b"x", &[]), 403, "forbidden");
    // Prefix-limited write tokens.
    assert_eq!(server.put("/box/inbox/k", &prefixed, b"x", &[]).status, 201);
    assert_json_error(&server.put("/box/outbox/k", &prefixed, b"x", &[]), 403, "forbidden");
    // Bad names are 400.
    assert_json_error(&server.put("/box/a/../b", &a.write, b"x", &[]), 400, "invalid_name");
    assert_json_error(&server.put("/BOX/k", &a.write, b"x", &[]), 400, "invalid_name");
    // Nothing of the refused uploads is visible.
    for path in ["/box/k", "/box/outbox/k"] {
        assert_eq!(server.get_auth(path, &a.write, &[]).status, 404, "{path}");
    }
    assert_eq!(env.blob_files().len(), 1, "only the one accepted upload is stored");
}

#[test]
fn upload_attributes_are_stored_and_served() {
    let a = setup();
    let server = a.env.serve();
    let headers = [
        ("Content-Type", "text/csv; charset=utf-8"),
        ("Cache-Control", "public, max-age=600"),
        ("Content-Disposition", "attachment"),
    ];
    let r = server.put("/box/reports/q1.bin", &a.write, b"a,b\n1,2\n", &headers);
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["content_type"], "text/csv; charset=utf-8");
    let got = server.get_auth("/box/reports/q1.bin", &a.read, &[]);
    assert_eq!(got.header("content-type"), Some("text/csv; charset=utf-8"));
    // Stored as given, served as `private` because `box` is a private bucket (shared caches must not keep it).
    assert_eq!(got.header("cache-control"), Some("private, max-age=600"));
    assert_eq!(got.header("content-disposition"), Some("attachment; filename=\"q1.bin\""));
    assert_eq!(got.body, b"a,b\n1,2\n");

    for (name, value) in [
        ("Content-Type", "nonsense"),
        ("Content-Type", "text/plain; charset"),
        ("Content-Disposition", "attachment; filename"),
        ("Content-Disposition", "; x=y"),
    ] {
        let r = server.put("/box/bad-attr", &a.write, b"x", &[(name, value)]);
        assert_json_error(&r, 400, "invalid_name");
        assert!(r.json()["message"].as_str().unwrap().contains(&name.to_ascii_lowercase().replace('-', " ")));
    }
    assert_eq!(server.get_auth("/box/bad-attr", &a.read, &[]).status, 404);
}

#[test]

fn a_content_type_without_a_subtype_is_refused() {
    let a = setup();
    let server = a.env.serve();
    // RFC 9110 §8.3.1: media-type = type "/" subtype, and subtype is a token (at least one tchar).
    let r = server.put("/box/no-subtype", &a.write, b"x", &[("Content-Type", "text/")]);
    assert_json_error(&r, 400, "invalid_name");
    assert_eq!(server.get_auth("/box/no-subtype", &a.read, &[]).status, 404);
    let cli = a.env.fails(&["put", "box", "k", "/dev/null", "--content-type", "text/"]);
    assert!(cli.contains("content type"), "{cli}");
}

#[test]
fn uploads_over_the_size_limit_are_413_and_leave_nothing() {
    let a = setup();
    let server = a.env.serve_with(&[("BLOBGATE_LIMITS__MAX_UPLOAD_BYTES", "1000")], &[]);
    // At the limit is fine.
    let r = server.put("/box/exact", &a.write, &test_bytes(1000, 1), &[]);
    assert_eq!(r.status, 201);
    // Declared too large.
    let r = server.put("/box/big", &a.write, &test_bytes(1001, 2), &[]);
    assert_json_error(&r, 413, "payload_too_large");
    // Chunked, so the limit is found while streaming.
    let mut conn = Conn::open(server.admin);
    let auth = format!("Bearer {}", a.write);
    let mut raw =
        format!("PUT /box/big HTTP/1.1\r\nHost: t\r\nAuthorization: {auth}\r\nTransfer-Encoding: chunked\r\n\r\n")
            .into_bytes();
    for _ in 0..3 {
        raw.extend_from_slice(format!("{:x}\r\n", 600).as_bytes());
        raw.extend_from_slice(&test_bytes(600, 3));
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let _ = conn.send_lossy(&raw);
    let r = conn.read_response(false).expect("a response");
    assert_json_error(&r, 413, "payload_too_large");
    assert_eq!(server.get_auth("/box/big", &a.read, &[]).status, 404);
    assert!(wait_for(Duration::from_secs(30), || a.env.tmp_files().is_empty()), "{:?}", a.env.tmp_files());
    assert_eq!(a.env.blob_files().len(), 1, "only the 1000-byte object");
}

#[test]
fn identical_bodies_are_stored_once() {
    let a = setup();
    let server = a.env.serve();
    let bytes = test_bytes(50_000, 7);
    for key in ["one", "two", "dir/three"] {
        assert_eq!(server.put(&format!("/box/{key}"), &a.write, &bytes, &[]).status, 201);
    }
    let blobs = a.env.blob_files();
    assert_eq!(blobs, vec![a.env.blob_path(&sha256_hex(&bytes))]);
    assert_eq!(std::fs::read(&blobs[0]).unwrap(), bytes);
    assert!(a.env.tmp_files().is_empty());
}

#[test]
fn delete_removes_the_object() {
    let a = setup();
    let server = a.env.serve();
    assert_eq!(server.put("/box/gone", &a.write, b"bye", &[]).status, 201);
    let auth = format!("Bearer {}", a.write);
    let read_auth = format!("Bearer {}", a.read);
    assert_json_error(&server.admin("DELETE", "/box/gone", &[("Authorization", &read_auth)], b""), 403, "forbidden");
    assert_json_error(&server.admin("DELETE", "/box/gone", &[], b""), 401, "unauthorized");
    assert_eq!(server.get_auth("/box/gone", &a.read, &[]).status, 200, "refused deletes delete nothing");
    let r = server.admin("DELETE", "/box/gone", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_json_error(&server.get_auth("/box/gone", &a.read, &[]), 404, "not_found");
    assert_json_error(&server.admin("DELETE", "/box/gone", &[("Authorization", &auth)], b""), 404, "not_found");
    assert!(a.env.blob_files().is_empty(), "the last reference took the blob with it");
}

#[test]
fn an_aborted_upload_leaves_nothing_behind() {
    let a = setup();
    let server = a.env.serve();
    let total = 1 << 20;
    {
        let mut conn = Conn::open(server.admin);
        let head = format!(
            "PUT /box/partial HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: {total}\r\n\r\n",
            a.write
        );
        conn.send(head.as_bytes());
        conn.send(&test_bytes(total / 2, 8));
        conn.stream.flush().unwrap();
        // Give the server time to stage what arrived, then vanish.
        assert!(wait_for(Duration::from_secs(30), || !a.env.tmp_files().is_empty()), "no staged upload appeared");
    }
    assert!(
        wait_for(Duration::from_secs(30), || a.env.tmp_files().is_empty()),
        "temp files left: {:?}",
        a.env.tmp_files()
    );
    assert_json_error(&server.get_auth("/box/partial", &a.read, &[]), 404, "not_found");
    assert!(a.env.blob_files().is_empty());
    // The server is fine afterwards.
    assert_eq!(server.put("/box/partial", &a.write, b"whole", &[]).status, 201);
}

#[test]
fn a_short_body_is_refused() {
    let a = setup();
    let server = a.env.serve();
    let mut conn = Conn::open(server.admin);
    let head = format!(
        "PUT /box/short HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: 100\r\n\r\n",
        a.write
    );
    conn.send(head.as_bytes());
    conn.send(&[b'x'; 50]);
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    // Whatever the answer to a truncated body, nothing may become visible.
    let _ = conn.read_response(false);
    assert!(wait_for(Duration::from_secs(30), || a.env.tmp_files().is_empty()));
    assert_eq!(server.get_auth("/box/short", &a.read, &[]).status, 404);
    assert!(a.env.blob_files().is_empty());
}

#[test]
fn chunked_uploads_work() {
    let a = setup();
    let server = a.env.serve();
    let bytes = test_bytes(300_000, 9);
    let mut raw = format!(
        "PUT /box/chunked.bin HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n",
        a.write
    )
    .into_bytes();
    for chunk in bytes.chunks(70_001) {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let mut conn = Conn::open(server.admin);
    conn.send(&raw);
    let r = conn.read_response(false).expect("a response");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["size"], bytes.len() as u64);
    assert_eq!(r.json()["sha256"], sha256_hex(&bytes));
    let got = server.get_auth("/box/chunked.bin", &a.read, &[]);
    assert!(got.body == bytes);
}

#[test]
fn expect_100_continue_uploads_work_and_refusals_skip_the_body() {
    let a = setup();
    let server = a.env.serve_with(&[("BLOBGATE_LIMITS__MAX_UPLOAD_BYTES", "100000")], &[]);
    let bytes = test_bytes(50_000, 10);
    let mut conn = Conn::open(server.admin);
    let head = format!(
        "PUT /box/dir%2Fa%20b HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\n\
         Expect: 100-continue\r\nConnection: close\r\n\r\n",
        a.write,
        bytes.len()
    );
    conn.send(head.as_bytes());
    let interim = conn.read_response(false).expect("100 Continue");
    assert_eq!(interim.status, 100);
    conn.send(&bytes);
    let r = conn.read_response(false).expect("the final response");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // The path was percent-decoded once, as on the data listener.
    assert_eq!(r.json()["key"], "dir/a b");
    assert!(server.get_auth("/box/dir/a%20b", &a.read, &[]).body == bytes);

    // Over the limit: refused at once, without asking for the body.
    let mut conn = Conn::open(server.admin);
    let head = format!(
        "PUT /box/huge HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\nContent-Length: 100001\r\n\
         Expect: 100-continue\r\n\r\n",
        a.write
    );
    conn.send(head.as_bytes());
    let r = conn.read_response(false).expect("a final response");
    assert_json_error(&r, 413, "payload_too_large");
    // Unauthorised: also refused without the body.
    let mut conn = Conn::open(server.admin);
    conn.send(b"PUT /box/anon HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\nExpect: 100-continue\r\n\r\n");
    let r = conn.read_response(false).expect("a final response");
    assert_json_error(&r, 401, "unauthorized");
}

#[test]
fn empty_uploads_are_objects_too() {
    let a = setup();
    let server = a.env.serve();
    let r = server.put("/box/empty", &a.write, b"", &[]);
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["size"], 0);
    let got = server.get_auth("/box/empty", &a.read, &[]);
    assert_eq!(got.status, 200);
    assert_eq!(got.header("content-length"), Some("0"));
    assert!(got.body.is_empty());
}
