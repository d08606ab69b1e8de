//! Resource limits that unauthenticated or slow clients must not be able to hold: the connection cap (idle
//! connections are reclaimed at it), the per-address cap, the keep-alive timeout under pressure, and bounded
//! uploads (body idle timeout, concurrency cap, no thread or temp file per stalled upload).

use std::io::{ErrorKind, Read};
use std::time::{Duration, Instant};

use crate::helpers::*;

/// How a connection that was left idle ended, read within `wait`.
#[derive(Debug, PartialEq)]
enum IdleEnd {
    /// Still open, nothing received.
    Open,
    /// A clean EOF with nothing received before it.
    CleanClose,
    /// Bytes arrived (a response nobody asked for) or the connection was reset.
    Unclean(String),
}

fn idle_end(conn: &mut Conn, wait: Duration) -> IdleEnd {
    if !conn.buffered().is_empty() {
        return IdleEnd::Unclean(format!("buffered {:?}", String::from_utf8_lossy(conn.buffered())));
    }
    conn.stream.set_read_timeout(Some(wait)).unwrap();
    let mut byte = [0u8; 64];
    match conn.stream.read(&mut byte) {
        Ok(0) => IdleEnd::CleanClose,
        Ok(n) => IdleEnd::Unclean(format!("received {:?}", String::from_utf8_lossy(&byte[..n]))),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => IdleEnd::Open,
        Err(e) => IdleEnd::Unclean(format!("read error {e}")),
    }
}

/// A public bucket with one small object; returns its bytes.
fn small_object(env: &TestEnv) -> Vec<u8> {
    env.bucket("pub", true);
    let bytes = test_bytes(4096, 7);
    env.put_bytes("pub", "a", &bytes, &[]);
    bytes
}

/// Opens `n` connections that each make one keep-alive request and then stay idle.
fn idle_connections(server: &Server, n: usize) -> Vec<Conn> {
    (0..n)
        .map(|_| {
            let mut conn = Conn::open(server.data);
            conn.send(&raw_request("GET", "/pub/a", &[], false));
            assert_eq!(conn.read_response(false).expect("served under the cap").status, 200);
            conn
        })
        .collect()
}

#[test]
fn a_cap_full_of_idle_connections_admits_new_clients_within_a_second() {
    let env = TestEnv::new();
    let bytes = small_object(&env);
    // Two workers, so a worker may have to ask the other one to close an idle connection.
    // Idle connections never time out here (600 s): a new client can only be admitted by reclaiming one.
    let server = env.serve_with(
        &[
            ("BLOBGATE_LIMITS__MAX_CONNECTIONS", "20"),
            ("BLOBGATE_RUNTIME__DATA_WORKERS", "2"),
            ("BLOBGATE_TIMEOUTS__KEEP_ALIVE_IDLE", "600s"),
        ],
        &[],
    );
    let mut idle = idle_connections(&server, 20);
    // The new clients stay open too, so each one needs a slot of its own: each is served, and by then one more
    // idle connection has been reclaimed for it (events, not a stopwatch).
    let mut newcomers = Vec::new();
    for n in 0..5 {
        let mut conn = Conn::open(server.data);
        conn.send(&raw_request("GET", "/pub/a", &[], false));
        let r = conn.read_response(false).unwrap_or_else(|| panic!("new client {n} got no answer at the cap"));
        assert_eq!(r.status, 200);
        assert!(r.body == bytes);
        let reclaimed = server.metric("blobgate_idle_connections_reclaimed_total");
        assert!(reclaimed >= (n + 1) as f64, "new client {n} was served with {reclaimed} idle connections reclaimed");
        newcomers.push(conn);
    }
    // Every idle connection either stayed open or ended with a clean EOF and nothing sent: never a response it
    // did not ask for, a half response, or a reset. Enough of them were closed to admit the five.
    let ends: Vec<IdleEnd> = idle.iter_mut().map(|c| idle_end(c, Duration::from_millis(200))).collect();
    let closed = ends.iter().filter(|e| **e == IdleEnd::CleanClose).count();
    assert!(!ends.iter().any(|e| matches!(e, IdleEnd::Unclean(_))), "{ends:?}");
    assert!(closed >= 5, "only {closed} idle connections were closed for five new clients: {ends:?}");
    assert!(server.metric("blobgate_idle_connections_reclaimed_total") >= 5.0);
    // The ones left open still work.
    for (conn, end) in idle.iter_mut().zip(&ends) {
        if *end == IdleEnd::Open {
            conn.send(&raw_request("GET", "/pub/a", &[], true));
            assert_eq!(conn.read_response(false).expect("an idle survivor still serves").status, 200);
        }
    }
}

#[test]
fn at_the_cap_the_longest_idle_connection_is_closed_first() {
    let env = TestEnv::new();
    small_object(&env);
    let server =
        env.serve_with(&[("BLOBGATE_LIMITS__MAX_CONNECTIONS", "4"), ("BLOBGATE_RUNTIME__DATA_WORKERS", "1")], &[]);
    let mut idle = idle_connections(&server, 4);
    // The second becomes the newest idle one again.
    idle[1].send(&raw_request("GET", "/pub/a", &[], false));
    assert_eq!(idle[1].read_response(false).unwrap().status, 200);
    // Two new clients that stay open: each needs an idle connection closed.
    let _newcomers = idle_connections(&server, 2);
    let ends: Vec<IdleEnd> = idle.iter_mut().map(|c| idle_end(c, Duration::from_millis(300))).collect();
    assert_eq!(ends, [IdleEnd::CleanClose, IdleEnd::Open, IdleEnd::CleanClose, IdleEnd::Open]);
}

#[test]
fn above_ninety_percent_of_the_cap_idle_connections_get_a_tenth_of_keep_alive_idle() {
    let env = TestEnv::new();
    small_object(&env);
    // One data worker: a connection takes its idle timeout right after its response is sent, with no await in
    // between, so the ninth has taken its own before the worker can accept the tenth. With two, a loaded machine
    // let the tenth in first and the ninth went idle at 100% too (a stress run beside a build).
    let server = env.serve_with(
        &[
            ("BLOBGATE_LIMITS__MAX_CONNECTIONS", "10"),
            ("BLOBGATE_TIMEOUTS__KEEP_ALIVE_IDLE", "30s"),
            ("BLOBGATE_RUNTIME__DATA_WORKERS", "1"),
        ],
        &[],
    );
    // The first nine go idle at up to 90% of the cap (30 s); the tenth at 100% (3 s). Timed from before the
    // tenth's response, so the lower bound cannot fail on a slow machine.
    let started = Instant::now();
    let mut idle = idle_connections(&server, 10);
    assert_eq!(idle_end(&mut idle[9], Duration::from_secs(28)), IdleEnd::CleanClose);
    let waited = started.elapsed();
    assert!(waited > Duration::from_secs(2), "closed after {waited:?}, before a tenth of keep_alive_idle");
    // A tenth, not the whole: the tenth closed while the nine opened before it are all still open.
    let open = idle[..9].iter_mut().filter_map(|conn| conn.untouched().then_some(())).count();
    assert_eq!(open, 9, "the tenth closed only with the others, after {waited:?}");
}

#[test]
fn connections_beyond_the_per_address_cap_get_a_clear_503() {
    let env = TestEnv::new();
    let bytes = small_object(&env);
    let server = env.serve_with(&[("BLOBGATE_LIMITS__MAX_CONNECTIONS_PER_IP", "2")], &[]);
    let mut held = idle_connections(&server, 2);
    let mut third = Conn::open(server.data);
    third.send(&raw_request("GET", "/pub/a", &[], false));
    let r = third.read_response(false).expect("an answer, not silence");
    assert_json_error(&r, 503, "too_many_connections");
    assert_eq!(r.header("connection"), Some("close"));
    assert!(third.is_closed(Duration::from_secs(30)), "the refused connection is closed");
    assert_eq!(server.metric("blobgate_per_ip_refused_connections_total"), 1.0);
    assert!(!server.log().contains("ERROR"), "load shedding is not logged: {}", server.log());
    // The admitted connections are not disturbed, and a closed one frees its place.
    held[0].send(&raw_request("GET", "/pub/a", &[], false));
    assert!(held[0].read_response(false).unwrap().body == bytes);
    drop(held.pop());
    let admitted = wait_for(Duration::from_secs(30), || server.get("/pub/a", &[]).status == 200);
    assert!(admitted, "a place freed by a closed connection is given to a new one");
}

/// A raw upload that sends its head and a few body bytes, then nothing.
fn stalled_upload(server: &Server, token: &str, key: &str) -> Conn {
    let mut conn = Conn::open(server.admin);
    let head = format!(
        "PUT /box/{key} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {token}\r\nContent-Length: 1000000\r\n\r\nfirst bytes"
    );
    conn.send(head.as_bytes());
    conn
}

fn thread_count(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status.lines().find_map(|l| l.strip_prefix("Threads:")).expect("a Threads line").trim().parse().unwrap()
}

#[test]
fn stalled_upload_bodies_get_408_store_nothing_and_do_not_delay_other_uploads() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let read = env.token("box", "read", &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__BODY_IDLE", "8s")], &[]);
    let body = test_bytes(2 << 20, 3);
    assert_eq!(server.put("/box/warm-up", &write, &body, &[]).status, 201);
    let threads_before = thread_count(server.pid());

    // One at a time: each writes its first bytes on a blocking thread, and 40 at once would grow the pool for a
    // moment (its threads linger idle for 10 s), which is not what is measured here.
    let mut stalled = Vec::new();
    for n in 0..40 {
        stalled.push(stalled_upload(&server, &write, &format!("stalled-{n}")));
        let open =
            wait_for(Duration::from_secs(30), || server.metric("blobgate_uploads_in_progress") == (n + 1) as f64);
        assert!(open, "stalled upload {n} did not start");
    }
    // A normal upload is stored while all forty stalls still hold their places: none had timed out when it was
    // answered (an ordering of events: an upload queued behind the stalls would finish only after their 408s).
    assert_eq!(server.put("/box/normal", &write, &body, &[]).status, 201);
    assert_eq!(server.metric("blobgate_upload_body_timeouts_total"), 0.0, "the normal upload waited for the stalls");
    assert_eq!(server.metric("blobgate_uploads_in_progress"), 40.0);
    // Stalled uploads hold no thread each (before, each held a blocking thread for its whole life).
    let threads = thread_count(server.pid());
    assert!(threads < threads_before + 10, "{threads} threads with 40 stalled uploads, {threads_before} before");

    for (n, conn) in stalled.iter_mut().enumerate() {
        let r = conn.read_response(false).unwrap_or_else(|| panic!("stalled upload {n} got no answer"));
        assert_json_error(&r, 408, "body_timeout");
    }
    assert_eq!(server.metric("blobgate_upload_body_timeouts_total"), 40.0);
    assert!(env.tmp_files().is_empty(), "temp files left behind: {:?}", env.tmp_files());
    for n in [0, 17, 39] {
        assert_eq!(server.get_auth(&format!("/box/stalled-{n}"), &read, &[]).status, 404, "stalled-{n} was stored");
    }
    assert!(server.get_auth("/box/normal", &read, &[]).body == body);
}

/// A body that trickles a few bytes now and then never trips `body_idle`, but cannot keep its upload place:
/// below `limits.min_upload_rate` over a `body_idle` window it gets 408, and nothing is stored.
#[test]
fn a_trickling_upload_body_gets_408_and_stores_nothing() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let read = env.token("box", "read", &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__BODY_IDLE", "2s")], &[]);
    let mut conn = stalled_upload(&server, &write, "trickle");
    let mut refused = false;
    // The scenario's pace: ten bytes every 500 ms, for at most twenty trickles (five `body_idle` windows).
    let mut trickles = 0;
    while trickles < 20 {
        trickles += 1;
        std::thread::sleep(Duration::from_millis(500));
        if conn.send_lossy(b"0123456789").is_err() {
            refused = true;
            break;
        }
        conn.stream.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        if !conn.silent_for(Duration::from_millis(1)) {
            refused = true;
            break;
        }
    }
    assert!(refused, "a body at 20 bytes/s was still accepted after {trickles} trickles");
    conn.stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let r = conn.read_response(false).expect("an answer");
    // `body_too_slow`, not `body_timeout`: the rate rule refused it, not the idle timer its trickles reset.
    assert_json_error(&r, 408, "body_too_slow");
    assert!(env.tmp_files().is_empty(), "temp files left behind: {:?}", env.tmp_files());
    assert_eq!(server.get_auth("/box/trickle", &read, &[]).status, 404);
    // A body at a normal pace is stored.
    assert_eq!(server.put("/box/normal", &write, &test_bytes(1 << 20, 9), &[]).status, 201);
}

#[test]
fn uploads_beyond_the_concurrency_cap_wait_their_turn_then_get_503_with_retry_after() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let server = env.serve_with(
        &[("BLOBGATE_LIMITS__MAX_CONCURRENT_UPLOADS", "2"), ("BLOBGATE_TIMEOUTS__UPLOAD_QUEUE", "1s")],
        &[],
    );
    let stalled: Vec<Conn> = (0..2).map(|n| stalled_upload(&server, &write, &format!("stalled-{n}"))).collect();
    let holding = wait_for(Duration::from_secs(30), || server.metric("blobgate_uploads_in_progress") == 2.0);
    assert!(holding, "the stalled uploads did not start; log:\n{}", server.log());
    // A third waits `timeouts.upload_queue` for a place, then is refused.
    let started = Instant::now();
    let r = server.put("/box/third", &write, b"third", &[]);
    let waited = started.elapsed();
    assert_json_error(&r, 503, "too_many_uploads");
    assert_eq!(r.header("retry-after"), Some("1"));
    // A lower bound only (a slow machine cannot make it fail): it waited its turn before the refusal.
    assert!(waited >= Duration::from_millis(900), "refused after {waited:?}, before its turn could come");
    assert_eq!(server.metric("blobgate_uploads_refused_total"), 1.0);
    assert_eq!(server.metric("blobgate_uploads_waiting"), 0.0);
    assert_eq!(server.get_auth("/box/third", &write, &[]).status, 404, "a refused upload stored something");
    // Once the stalled clients go away, their places are free again.
    drop(stalled);
    let stored = wait_for(Duration::from_secs(30), || server.put("/box/third", &write, b"third", &[]).status == 201);
    assert!(stored, "uploads still refused after the others ended");
    // Load shedding is counted, not logged: a flood of refusals must not flood the log.
    assert!(!server.log().contains("ERROR"), "{}", server.log());
}

#[test]
fn an_upload_beyond_the_cap_takes_the_first_place_freed_within_its_wait() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let server = env.serve_with(
        &[("BLOBGATE_LIMITS__MAX_CONCURRENT_UPLOADS", "1"), ("BLOBGATE_TIMEOUTS__UPLOAD_QUEUE", "20s")],
        &[],
    );
    let stalled = stalled_upload(&server, &write, "stalled");
    let holding = wait_for(Duration::from_secs(30), || server.metric("blobgate_uploads_in_progress") == 1.0);
    assert!(holding, "the stalled upload did not start; log:\n{}", server.log());
    let body = test_bytes(3 << 20, 4);
    let waiting = std::thread::scope(|scope| {
        let second = scope.spawn(|| server.put("/box/second", &write, &body, &[]));
        let queued = wait_for(Duration::from_secs(30), || server.metric("blobgate_uploads_waiting") == 1.0);
        // The first place frees: the waiting upload takes it and is stored whole.
        drop(stalled);
        (queued, second.join().unwrap())
    });
    let (queued, r) = waiting;
    assert!(queued, "the second upload never waited for a place; log:\n{}", server.log());
    assert_eq!(r.status, 201, "{r:?}\n{}", server.log());
    assert_eq!(server.get_auth("/box/second", &write, &[]).body, body);
    assert_eq!(server.metric("blobgate_uploads_refused_total"), 0.0);
    assert_eq!(server.metric("blobgate_uploads_waiting"), 0.0);
}

#[test]
fn with_no_upload_queue_an_upload_beyond_the_cap_is_refused_at_once() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let server = env.serve_with(
        &[
            ("BLOBGATE_LIMITS__MAX_CONCURRENT_UPLOADS", "1"),
            ("BLOBGATE_TIMEOUTS__UPLOAD_QUEUE", "0s"),
            ("BLOBGATE_TIMEOUTS__BODY_IDLE", "4s"),
        ],
        &[],
    );
    let _stalled = stalled_upload(&server, &write, "stalled");
    let holding = wait_for(Duration::from_secs(30), || server.metric("blobgate_uploads_in_progress") == 1.0);
    assert!(holding, "the stalled upload did not start; log:\n{}", server.log());
    let r = server.put("/box/second", &write, b"second", &[]);
    assert_json_error(&r, 503, "too_many_uploads");
    // Refused while the stall still holds the only place: an upload that waited at all would have taken the
    // place the stall's `body_idle` (4 s) frees, and been stored.
    assert_eq!(server.metric("blobgate_uploads_in_progress"), 1.0);
    assert_eq!(server.metric("blobgate_upload_body_timeouts_total"), 0.0);
    assert_eq!(server.metric("blobgate_uploads_waiting"), 0.0);
}

/// S3 parts sent at once: odd ones as `STREAMING-UNSIGNED-PAYLOAD-TRAILER` aws-chunked bodies (signed by
/// botocore's signer, framed here), even ones plain through boto3's `upload_part`; then Complete. Prints "ok".
const BUDGET_PARTS: &str = r#"
import base64, http.client, zlib
from concurrent.futures import ThreadPoolExecutor
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
host, parts, size = spec["host"], spec["parts"], spec["part_size"]
data = open(spec["file"], "rb").read()
s3 = client("http://" + host, spec)
up = s3.create_multipart_upload(Bucket="box", Key="s3/parts")["UploadId"]

class Streaming(S3SigV4Auth):
    def payload(self, request):
        return "STREAMING-UNSIGNED-PAYLOAD-TRAILER"

def chunked_part(number, piece):
    path = "/box/s3/parts?partNumber=%d&uploadId=%s" % (number, up)
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(piece)),
               "x-amz-trailer": "x-amz-checksum-crc32"}
    req = AWSRequest(method="PUT", url="http://" + host + path, headers=headers, data=b"")
    Streaming(Credentials(spec["id"], spec["secret"]), "s3", "us-east-1").add_auth(req)
    body = b"".join(b"%x\r\n%s\r\n" % (len(piece[i:i + 40000]), piece[i:i + 40000]) for i in range(0, len(piece), 40000))
    crc = base64.b64encode(zlib.crc32(piece).to_bytes(4, "big"))
    body += b"0\r\nx-amz-checksum-crc32:" + crc + b"\r\n\r\n"
    conn = http.client.HTTPConnection(host, timeout=60)
    conn.putrequest("PUT", path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for name, value in req.headers.items():
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body)
    r = conn.getresponse()
    text = r.read()
    assert r.status == 200, (number, r.status, text)
    return r.getheader("ETag")

def part(number):
    piece = data[(number - 1) * size:number * size]
    if number % 2:
        return chunked_part(number, piece)
    return s3.upload_part(Bucket="box", Key="s3/parts", UploadId=up, PartNumber=number, Body=piece)["ETag"]

with ThreadPoolExecutor(parts) as pool:
    etags = list(pool.map(part, range(1, parts + 1)))
s3.complete_multipart_upload(Bucket="box", Key="s3/parts", UploadId=up,
    MultipartUpload={"Parts": [{"PartNumber": n + 1, "ETag": e} for n, e in enumerate(etags)]})
print("ok")
"#;

/// The body budget far below what the uploads at once would buffer (here one 64 KiB read for all of them,
/// against 16 uploads × a 128 or 512 KiB batch): every upload still completes byte-exact, because no upload
/// waits for more body while it holds unwritten chunks. Native PUTs with Content-Length and chunked bodies, and
/// S3 UploadParts, aws-chunked and plain, all at once.
#[test]
fn uploads_far_beyond_the_body_budget_all_complete_byte_exact() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let write = env.token("box", "write", &[]);
    let read = env.token("box", "read", &[]);
    let key = crate::helpers::s3::s3_key(&env, "box", &["--scope", "write"]);
    let server = env
        .serve_with(&[("BLOBGATE_LIMITS__UPLOAD_BUFFER_BYTES", "65536"), ("BLOBGATE_TIMEOUTS__BODY_IDLE", "10s")], &[]);
    let (parts, part_size) = (8, 5 << 20);
    let multipart = test_bytes(parts * part_size, 40);
    let file = write_file(env.dir.path(), "parts.bin", &multipart);
    let spec = serde_json::json!({
        "host": server.admin.to_string(), "id": key.id, "secret": key.secret, "file": file,
        "parts": parts, "part_size": part_size,
    });
    let home = env.dir.path().join("boto3-home");
    let mut s3 = crate::helpers::s3::boto3_command(&home, BUDGET_PARTS, &spec);
    let s3 = std::thread::spawn(move || crate::helpers::s3::run_ok(&mut s3));

    let bodies: Vec<Vec<u8>> = (0..8).map(|n| test_bytes((3 << 20) + n * 7919, 50 + n as u64)).collect();
    std::thread::scope(|scope| {
        for (n, body) in bodies.iter().enumerate() {
            let (server, write) = (&server, &write);
            scope.spawn(move || {
                if n % 2 == 0 {
                    let r = server.put(&format!("/box/native-{n}"), write, body, &[]);
                    assert_eq!(r.status, 201, "native PUT {n}: {}", String::from_utf8_lossy(&r.body));
                    return;
                }
                let mut conn = Conn::open(server.admin);
                let head = format!(
                    "PUT /box/native-{n} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {write}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                );
                conn.send(head.as_bytes());
                for piece in body.chunks(100_000) {
                    conn.send(format!("{:x}\r\n", piece.len()).as_bytes());
                    conn.send(piece);
                    conn.send(b"\r\n");
                }
                conn.send(b"0\r\n\r\n");
                conn.stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let r = conn.read_response(false).unwrap_or_else(|| panic!("chunked PUT {n} got no answer"));
                assert_eq!(r.status, 201, "chunked PUT {n}: {}", String::from_utf8_lossy(&r.body));
            });
        }
    });
    assert_eq!(s3.join().expect("the S3 client thread").trim(), "ok");
    for (n, body) in bodies.iter().enumerate() {
        let got = server.get_auth(&format!("/box/native-{n}"), &read, &[]);
        assert!(sha256_hex(&got.body) == sha256_hex(body), "native-{n} differs");
    }
    assert!(sha256_hex(&server.get_auth("/box/s3/parts", &read, &[]).body) == sha256_hex(&multipart));
    assert!(env.tmp_files().is_empty(), "temp files left behind: {:?}", env.tmp_files());
}
