//! Slow and stalled readers: no lost wake-ups on the pool send path, `send_progress` measured by what the peer
//! acknowledges (not by when the socket next turns writable), and a reader that stops for good still dropped.

use std::io::Read;
use std::time::{Duration, Instant};

use crate::helpers::*;

/// Reads one whole response at `bytes_per_second` (after an initial `pause`), returning the head's status and the
/// body read before the server closed or the body was complete.
fn read_paced(conn: &mut Conn, pause: Duration, bytes_per_second: usize) -> (u16, usize, Vec<u8>) {
    std::thread::sleep(pause);
    let (status, headers) = conn.read_head().expect("a response head");
    let length: usize = headers["content-length"].parse().unwrap();
    let mut body = conn.buffered().to_vec();
    let step = (bytes_per_second / 20).clamp(1, 256 * 1024);
    let mut chunk = vec![0u8; step];
    let started = Instant::now();
    while body.len() < length {
        match conn.stream.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
        // Pace by the clock, so a read that returned less than `step` does not slow the reader further.
        let due = Duration::from_secs_f64(body.len() as f64 / bytes_per_second as f64);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    (status, length, body)
}

/// The lost wake-up: a pool sendfile finds the socket full, the client then opens its window exactly once (it
/// drains everything and keeps reading), and that single writable edge reaches tokio while the pool thread still
/// runs. Clearing the readiness on the pool's EAGAIN erased that edge, and the download froze until
/// `send_progress` cut it. The fault hook holds the pool thread until the edge has arrived, so the interleaving
/// happens every time.
#[test]
fn a_writable_edge_during_a_pool_send_is_not_lost() {
    let env = TestEnv::new();
    env.bucket("edge", true);
    let bytes = test_bytes(48 << 20, 21);
    env.put_bytes("edge", "big.bin", &bytes, &[]);
    let server = env.serve_with(
        &[
            ("BLOBGATE_RUNTIME__DATA_WORKERS", "1"),
            ("BLOBGATE_TIMEOUTS__SEND_PROGRESS", "3s"),
            ("BLOBGATE_FAULTS__POOL_WOULDBLOCK_HOLD", "10s"),
        ],
        &[],
    );
    // A second connection on the only worker makes it shared, so every bulk chunk takes the pool.
    let mut other = Conn::open(server.data);
    other.send(&raw_request("GET", "/edge/missing", &[], false));
    assert_eq!(other.read_response(false).unwrap().status, 404);

    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", "/edge/big.bin", &[], true));
    // Not reading for a second fills the socket, so the pool's next sendfile returns EAGAIN; then read at full
    // speed: one window opening, one writable edge.
    let (status, length, body) = read_paced(&mut conn, Duration::from_secs(1), usize::MAX / 4);
    assert_eq!((status, length), (200, bytes.len()));
    assert_eq!(body.len(), bytes.len(), "the download was cut short; log:\n{}", server.log());
    assert_eq!(sha256_hex(&body), sha256_hex(&bytes));
    assert!(!server.log().contains("no progress"), "a reading client was taken for stalled:\n{}", server.log());
    drop(other);
}

/// Readers slower than a third of the send buffer per `send_progress` period are still reading: they must not be
/// dropped. At 250 KB/s, freeing the ~1.4 MB that makes a loopback socket writable again takes over 5 s.
#[test]
fn steady_slow_readers_complete() {
    let env = TestEnv::new();
    env.bucket("slow", true);
    let bytes = test_bytes(8 << 20, 22);
    env.put_bytes("slow", "eight.bin", &bytes, &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SEND_PROGRESS", "3s")], &[]);
    let expected = sha256_hex(&bytes);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let addr = server.data;
            std::thread::spawn(move || {
                let mut conn = Conn::open(addr);
                conn.send(&raw_request("GET", "/slow/eight.bin", &[], true));
                let (status, _, body) = read_paced(&mut conn, Duration::ZERO, 250_000);
                (status, body.len(), sha256_hex(&body))
            })
        })
        .collect();
    for reader in readers {
        let (status, len, sha) = reader.join().unwrap();
        assert_eq!((status, len), (200, bytes.len()), "a slow reader was cut short; log:\n{}", server.log());
        assert_eq!(sha, expected);
    }
    assert!(!server.log().contains("no progress"), "{}", server.log());
}

/// A client that stops reading for good (its window stays shut) is still dropped after `send_progress`.
#[test]
fn a_zero_window_reader_is_still_dropped() {
    let env = TestEnv::new();
    env.bucket("shut", true);
    let bytes = test_bytes(32 << 20, 23);
    env.put_bytes("shut", "big.bin", &bytes, &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SEND_PROGRESS", "2s")], &[]);
    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", "/shut/big.bin", &[], true));
    let started = Instant::now();
    assert!(
        wait_for(Duration::from_secs(30), || server.log().contains("client made no progress")),
        "a reader that never reads was never dropped; log:\n{}",
        server.log()
    );
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(2), "dropped after {waited:?}, before send_progress");
    let (body, _) = conn.read_to_end();
    assert!(body.len() < bytes.len(), "the stalled reader got the whole body");
    assert!(server.metric("blobgate_stalled_responses_total") >= 1.0, "{}", server.metrics());
}

/// curl's `--limit-rate` reads what its buffers hold at once, then sleeps with its window shut until its average
/// is back at the rate: seconds in which the server sees nothing acknowledged. Four of them reading 16 MiB at
/// 1 MB/s with `send_progress = 3s` are slow readers, not stalled ones (`limits.min_download_rate`): every one
/// gets every byte. Before the pause credit, three of four were cut after about 12 MB.
#[test]
fn bursty_rate_limited_curl_readers_are_not_taken_for_stalled() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let bytes = test_bytes(16 << 20, 29);
    env.put_bytes("pub", "big.bin", &bytes, &[]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SEND_PROGRESS", "3s")], &[]);
    let url = format!("http://{}/pub/big.bin", server.data);
    curl_rate_limited_readers(env.dir.path(), &url, 4, "1M", &bytes, || server.log());
    assert!(!server.log().contains("no progress"), "{}", server.log());
}
