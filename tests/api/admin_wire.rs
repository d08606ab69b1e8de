//! The admin listener's HTTP/1.1 framing, now that the driver serves it: Content-Length and chunked request
//! bodies on keep-alive connections, `Expect: 100-continue`, bodies cut short, broken chunk framing, pipelined
//! requests after a body, and S3 GetObject beside uploads on one connection.

use std::time::Duration;

use crate::helpers::s3::{AccessKey, Signing, s3_key, signed_headers_for_host};
use crate::helpers::sha256_hex;
use crate::helpers::*;

struct Admin {
    env: TestEnv,
    write: String,
    read: String,
}

fn setup() -> Admin {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let read = env.token("box", "read", &[]);
    Admin { env, write, read }
}

/// A native PUT head with a Content-Length (keep-alive).
fn put_head(path: &str, token: &str, len: usize, extra: &str) -> Vec<u8> {
    format!("PUT {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: {len}\r\n{extra}\r\n")
        .into_bytes()
}

/// A whole native PUT with a Content-Length body.
fn put(path: &str, token: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = put_head(path, token, body.len(), "");
    raw.extend_from_slice(body);
    raw
}

/// A whole native PUT with a chunked body, in chunks of `chunk` bytes (with an extension and a trailer).
fn chunked_put(path: &str, token: &str, body: &[u8], chunk: usize) -> Vec<u8> {
    let mut raw = format!(
        "PUT {path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for piece in body.chunks(chunk) {
        raw.extend_from_slice(format!("{:x};note=x\r\n", piece.len()).as_bytes());
        raw.extend_from_slice(piece);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\nX-Done: yes\r\n\r\n");
    raw
}

/// An S3 GetObject signed by botocore, as raw bytes for host `t`.
fn s3_get(path: &str, key: &AccessKey) -> Vec<u8> {
    let headers = signed_headers_for_host("t", key, path, &Signing { method: "GET", ..Default::default() });
    let mut raw = format!("GET {path} HTTP/1.1\r\nHost: t\r\n");
    for (k, v) in &headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    raw.push_str("\r\n");
    raw.into_bytes()
}

/// Bytes that look like requests, to show a body is never parsed as one.
fn body_with_request_lines(len: usize, seed: u64) -> Vec<u8> {
    let mut body = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n0\r\n\r\n".to_vec();
    body.extend_from_slice(&test_bytes(len, seed));
    body
}

#[test]
fn one_keep_alive_connection_puts_gets_by_s3_and_puts_again() {
    let a = setup();
    let server = a.env.serve();
    let key = s3_key(&a.env, "box", &[]);
    let first = body_with_request_lines(300_000, 31);
    let second = body_with_request_lines(200_000, 32);
    let mut conn = Conn::open(server.admin);

    conn.send(&put("/box/one.bin", &a.write, &first));
    let r = conn.read_response(false).expect("PUT answered");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["sha256"], sha256_hex(&first));
    assert_eq!(r.header("connection"), None, "keep-alive");

    conn.send(&s3_get("/box/one.bin", &key));
    let r = conn.read_response(false).expect("GET answered");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.header("x-amz-request-id").is_some());
    assert_eq!(sha256_hex(&r.body), sha256_hex(&first), "GetObject on the admin listener serves the bytes");

    conn.send(&chunked_put("/box/two.bin", &a.write, &second, 65_000));
    let r = conn.read_response(false).expect("chunked PUT answered");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["size"], second.len() as u64);
    assert_eq!(r.json()["sha256"], sha256_hex(&second));

    conn.send(&s3_get("/box/two.bin", &key));
    let r = conn.read_response(false).expect("second GET answered");
    assert_eq!(r.status, 200);
    assert_eq!(sha256_hex(&r.body), sha256_hex(&second));
    // The connection carries on: nothing arrived unasked, and one more request is answered on it.
    assert!(conn.untouched(), "the connection carries on");
    conn.send(&raw_request("GET", "/healthz", &[], false));
    assert_eq!(conn.read_response(false).expect("an answer on the same connection").status, 200);
    // Admin downloads count as data-listener ones do: their object bytes, from sendfile's return values.
    assert_eq!(server.metric("blobgate_sent_bytes_total") as usize, first.len() + second.len());
    assert!(server.get_auth("/box/two.bin", &a.read, &[]).body == second);
}

#[test]
fn expect_100_continue_is_sent_when_the_handler_reads_and_an_early_answer_closes() {
    let a = setup();
    let server = a.env.serve();
    let bytes = test_bytes(80_000, 33);

    // The handler reads the body: 100 Continue, then 201, and the connection carries another request.
    let mut conn = Conn::open(server.admin);
    conn.send(&put_head("/box/continued", &a.write, bytes.len(), "Expect: 100-continue\r\n"));
    let interim = conn.read_response(false).expect("an interim response");
    assert_eq!(interim.status, 100);
    conn.send(&bytes);
    let r = conn.read_response(false).expect("the final response");
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    conn.send(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert_eq!(conn.read_response(false).expect("the next request").status, 200);
    assert!(server.get_auth("/box/continued", &a.read, &[]).body == bytes);

    // A bad token: refused before the body is asked for, so no 100, and the connection closes after the answer
    // (the body the client may still send is never read as a request).
    let mut conn = Conn::open(server.admin);
    conn.send(&put_head("/box/refused", "bg_not_a_token", bytes.len(), "Expect: 100-continue\r\n"));
    let r = conn.read_response(false).expect("a final response");
    assert_json_error(&r, 401, "unauthorized");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(conn.is_closed(Duration::from_secs(30)), "closed after an answer that left the body unread");
    assert_eq!(server.get_auth("/box/refused", &a.read, &[]).status, 404);
}

#[test]
fn a_body_cut_short_stores_nothing() {
    let a = setup();
    let server = a.env.serve();
    // Shorter than its Content-Length, then the client closes.
    let mut conn = Conn::open(server.admin);
    conn.send(&put_head("/box/short", &a.write, 200_000, ""));
    conn.send(&test_bytes(100_000, 34));
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let r = conn.read_response(false).expect("an answer before the close");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    // A chunked body that stops mid-chunk.
    let mut conn = Conn::open(server.admin);
    let mut raw = chunked_put("/box/short-chunked", &a.write, &test_bytes(100_000, 35), 60_000);
    raw.truncate(raw.len() - 30_000);
    conn.send(&raw);
    conn.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let r = conn.read_response(false).expect("an answer before the close");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert!(wait_for(Duration::from_secs(30), || a.env.tmp_files().is_empty()));
    assert_eq!(server.get_auth("/box/short", &a.read, &[]).status, 404);
    assert_eq!(server.get_auth("/box/short-chunked", &a.read, &[]).status, 404);
    assert!(a.env.blob_files().is_empty());
}

#[test]
fn broken_chunk_framing_is_refused_and_closes() {
    let a = setup();
    let server = a.env.serve();
    let mut conn = Conn::open(server.admin);
    let mut raw = chunked_put("/box/broken", &a.write, b"hello", 5);
    // The chunk's data is not followed by CRLF.
    let at = raw.windows(7).position(|w| w == b"hello\r\n").unwrap() + 5;
    raw[at] = b'X';
    conn.send(&raw);
    let r = conn.read_response(false).expect("an answer");
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("connection"), Some("close"));
    assert!(conn.is_closed(Duration::from_secs(30)));
    assert_eq!(server.get_auth("/box/broken", &a.read, &[]).status, 404);
    // A transfer coding we do not decode, and one together with a Content-Length: refused from the head.
    for extra in ["Transfer-Encoding: gzip\r\n", "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"] {
        let mut conn = Conn::open(server.admin);
        let head = format!("PUT /box/te HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n{extra}\r\n", a.write);
        conn.send(head.as_bytes());
        let r = conn.read_response(false).expect("an answer");
        assert!(matches!(r.status, 400 | 501), "{extra:?}: {}", r.status);
        assert!(conn.is_closed(Duration::from_secs(30)), "{extra:?}");
    }
    assert!(a.env.blob_files().is_empty());
}

#[test]
fn pipelined_requests_after_bodies_are_answered_in_order() {
    let a = setup();
    let server = a.env.serve();
    let first = body_with_request_lines(150_000, 36);
    let second = body_with_request_lines(90_000, 37);
    let mut raw = put("/box/p1", &a.write, &first);
    raw.extend_from_slice(&chunked_put("/box/p2", &a.write, &second, 10_000));
    raw.extend_from_slice(
        format!("DELETE /box/p1 HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {}\r\n\r\n", a.write).as_bytes(),
    );
    raw.extend_from_slice(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let mut conn = Conn::open(server.admin);
    conn.send(&raw);
    let statuses: Vec<u16> = (0..4).map(|_| conn.read_response(false).expect("a response").status).collect();
    assert_eq!(statuses, [201, 201, 204, 200]);
    assert!(conn.is_closed(Duration::from_secs(30)));
    assert_eq!(server.get_auth("/box/p1", &a.read, &[]).status, 404);
    assert!(server.get_auth("/box/p2", &a.read, &[]).body == second);
}

#[test]
fn a_fragment_in_an_admin_target_is_refused() {
    let a = setup();
    let server = a.env.serve();
    let mut conn = Conn::open(server.admin);
    conn.send(&put("/box/k#/../x", &a.write, b"hello"));
    let r = conn.read_response(false).expect("an answer");
    assert_eq!(r.status, 400);
    assert!(conn.is_closed(Duration::from_secs(30)));
    assert!(a.env.blob_files().is_empty());
}

#[test]
fn an_early_answer_reaches_a_client_that_sends_its_body_without_waiting() {
    let a = setup();
    let server = a.env.serve();
    let body = test_bytes(4 << 20, 38);
    let mut conn = Conn::open(server.admin);
    conn.send(&put_head("/box/anon", "bg_not_a_token", body.len(), ""));
    // The client writes its whole body at once; the server answers 401 without reading it, and must not reset
    // the connection under the answer.
    let mut writer = conn.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let _ = writer.write_all(&body);
    });
    // Read late: once the server has answered and ended its side (which, without lingering, would be a close under
    // the unread body: a reset that takes the unread answer with it).
    conn.wait_until_ended_by_server();
    let r = conn.read_response(false).expect("the answer arrives before the close");
    assert_json_error(&r, 401, "unauthorized");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(conn.is_closed(Duration::from_secs(30)));
    sender.join().unwrap();
    assert!(a.env.blob_files().is_empty());
}

#[test]
fn an_admin_head_not_received_in_time_is_a_408() {
    let a = setup();
    let server = a
        .env
        .serve_with(&[("BLOBGATE_TIMEOUTS__HEADER_READ", "1s"), ("BLOBGATE_TIMEOUTS__KEEP_ALIVE_IDLE", "6s")], &[]);
    // A reference: a keep-alive connection gone idle, closed at 6 s (the default header timeout is 10 s).
    let mut reference = Conn::open(server.admin);
    reference.send(&raw_request("GET", "/healthz", &[], false));
    assert_eq!(reference.read_response(false).expect("an answer").status, 200);
    let mut conn = Conn::open(server.admin);
    conn.send(b"PUT /box/slow HTTP/1.1\r\nHost: t\r\n");
    let r = conn.read_response(false).expect("an answer");
    assert_eq!(r.status, 408);
    // Answered by the configured 1 s: before the reference's 6 s idle close (an ordering of the server's timers).
    assert!(reference.untouched(), "the 408 came only after a 6 s keep-alive idle close");
    assert!(conn.is_closed(Duration::from_secs(30)));
}
