//! Process lifecycle and storage faults: graceful shutdown on SIGTERM/SIGINT, the start-up sweep, blob removal
//! with the last reference, a blob that shrinks mid-download and a blob that is missing.

use std::net::TcpStream;
use std::time::Duration;

use crate::helpers::*;

fn refused(addr: std::net::SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err()
}

#[test]
fn sigterm_refuses_new_connections_and_drains_an_in_flight_download() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let size = 64 << 20;
    let bytes = test_bytes(size, 64);
    env.put_bytes("pub", "big", &bytes, &[]);
    let mut server = env.serve();

    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", "/pub/big", &[], false));
    let (status, headers) = conn.read_head().expect("a head");
    assert_eq!(status, 200);
    assert_eq!(headers.get("content-length"), Some(&size.to_string()));
    let mut body = conn.read_raw(1 << 20);
    assert_eq!(body.len(), 1 << 20);

    server.signal("TERM");
    let stopped_accepting = wait_for(Duration::from_secs(30), || refused(server.data) && refused(server.admin));
    assert!(stopped_accepting, "new connections are still accepted after SIGTERM");
    // The download in flight completes, byte-exact, at the client's (slow) pace.
    while body.len() < size {
        std::thread::sleep(Duration::from_millis(2));
        let chunk = conn.read_raw((size - body.len()).min(4 << 20));
        if chunk.is_empty() {
            break;
        }
        body.extend_from_slice(&chunk);
    }
    assert_eq!(body.len(), size, "the in-flight download was cut short");
    assert!(body == bytes, "the drained download differs");
    // The response was keep-alive, but the server is stopping: it closes after it.
    assert!(conn.is_closed(Duration::from_secs(30)));
    assert_eq!(server.wait_exit(Duration::from_secs(10)), Some(0), "log:\n{}", server.log());
    assert!(server.log().contains("stopped"), "{}", server.log());
}

#[test]
fn sigint_exits_zero_and_idle_connections_do_not_hold_it_up() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a", b"a", &[]);
    // A grace of ten minutes: exiting at all within the hang bound below means idle connections ended at once.
    let mut server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SHUTDOWN_GRACE", "600s")], &[]);
    // An idle keep-alive connection, and a connection that has not sent a byte.
    let mut idle = Conn::open(server.data);
    idle.send(&raw_request("GET", "/pub/a", &[], false));
    assert_eq!(idle.read_response(false).unwrap().status, 200);
    let mut silent = Conn::open(server.data);
    server.signal("INT");
    assert_eq!(server.wait_exit(Duration::from_secs(60)), Some(0), "log:\n{}", server.log());
    assert!(idle.is_closed(Duration::from_secs(30)));
    assert!(silent.is_closed(Duration::from_secs(30)));
}

#[test]
fn sigterm_on_an_idle_server_exits_zero() {
    let env = TestEnv::new();
    let mut server = env.serve();
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn the_startup_sweep_removes_dead_temp_files_and_unreferenced_blobs() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let kept = env.put_bytes("pub", "kept", b"referenced", &[]);
    let kept_blob = env.blob_path(kept["sha256"].as_str().unwrap());
    let tmp = env.data_dir().join("tmp");
    let me = blobgate::store::blobs::this_process();
    let stage = |owner: &blobgate::store::staging::StageOwner| {
        write_file(&tmp, &blobgate::store::staging::stage_name(owner, "0123456789abcdef"), b"part")
    };
    // pid 0 is never a user process on this host.
    let dead_stage = stage(&blobgate::store::staging::StageOwner { pid: 0, ..me.clone() });
    // This test process is alive: its staged upload must survive the sweep.
    let live_stage = stage(me);
    let retired = write_file(&tmp, &format!("retired-{}-x", "e".repeat(64)), b"old");
    let orphan_sha = format!("abcd{}", "0".repeat(60));
    let orphan = env.blob_path(&orphan_sha);
    write_file(orphan.parent().unwrap(), &orphan_sha, b"nobody refers to me");
    // Unreferenced blobs go only past timeouts.sweep_grace (1h): a younger one may be a peer's, its row on the way.
    let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
    std::fs::File::options().write(true).open(&orphan).unwrap().set_modified(an_hour_ago).unwrap();
    let young_sha = format!("abce{}", "0".repeat(60));
    let young_orphan = env.blob_path(&young_sha);
    write_file(young_orphan.parent().unwrap(), &young_sha, b"a peer's, a moment old");
    let unrelated = write_file(&tmp, "notes.txt", b"not ours");

    let server = env.serve();
    // `tmp/` is swept before the server answers; the blobs in the background, right after.
    assert!(!dead_stage.exists(), "a dead process's staged file survived");
    assert!(!retired.exists(), "a retired blob survived");
    assert!(wait_for(Duration::from_secs(30), || !orphan.exists()), "an unreferenced blob survived: {}", server.log());
    assert!(wait_for(Duration::from_secs(30), || server.log().contains("sweep removed unreferenced blobs")));
    assert!(young_orphan.exists(), "an unreferenced blob younger than the grace period was removed");
    assert!(live_stage.exists(), "a live process's staged file was removed");
    assert!(unrelated.exists(), "a file that is not a temp file was removed");
    assert!(kept_blob.exists(), "a referenced blob was removed");
    assert_eq!(server.get("/pub/kept", &[]).body, b"referenced");
    assert!(server.log().contains("start-up sweep removed leftovers"), "{}", server.log());
}

#[test]
fn deleting_the_last_reference_removes_the_blob_file() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let bytes = test_bytes(10_000, 2);
    let put = env.put_bytes("box", "one", &bytes, &[]);
    env.put_bytes("box", "two", &bytes, &[]);
    let blob = env.blob_path(put["sha256"].as_str().unwrap());
    assert_eq!(env.blob_files(), vec![blob.clone()]);
    let token = env.token("box", "write", &[]);
    let server = env.serve();
    let auth = format!("Bearer {token}");
    assert_eq!(server.admin("DELETE", "/box/one", &[("Authorization", &auth)], b"").status, 204);
    assert!(blob.exists(), "`two` still refers to the blob");
    let r = server.get_auth("/box/two", &token, &[]);
    assert!(r.body == bytes);
    assert_eq!(server.admin("DELETE", "/box/two", &[("Authorization", &auth)], b"").status, 204);
    assert!(!blob.exists(), "the blob outlived its last reference");
    assert!(env.blob_files().is_empty());
    assert!(env.tmp_files().is_empty(), "{:?}", env.tmp_files());
}

#[test]
fn an_object_deleted_or_replaced_mid_download_is_still_sent_whole() {
    let env = TestEnv::new();
    env.bucket("box", false);
    let size = 16 << 20;
    let (first, second) = (test_bytes(size, 16), test_bytes(size, 17));
    let put = env.put_bytes("box", "doomed", &first, &[]);
    env.put_bytes("box", "swapped", &second, &[]);
    let token = env.token("box", "write", &[]);
    let server = env.serve();
    let auth = format!("Bearer {token}");
    let mut downloads = Vec::new();
    for key in ["doomed", "swapped"] {
        let mut conn = Conn::open(server.data);
        conn.send(&raw_request("GET", &format!("/box/{key}"), &[("Authorization", &auth)], true));
        let (status, _) = conn.read_head().expect("a head");
        assert_eq!(status, 200);
        let start = conn.read_raw(4096);
        downloads.push((conn, start));
    }
    assert_eq!(server.admin("DELETE", "/box/doomed", &[("Authorization", &auth)], b"").status, 204);
    assert_eq!(server.put("/box/swapped", &token, b"new and short", &[]).status, 201);
    assert!(!env.blob_path(put["sha256"].as_str().unwrap()).exists(), "the deleted blob is unlinked at once");
    for ((mut conn, mut body), want) in downloads.into_iter().zip([&first, &second]) {
        let (rest, _) = conn.read_to_end();
        body.extend_from_slice(&rest);
        assert_eq!(body.len(), size);
        assert!(body == *want, "a download changed under a delete/replace");
    }
    assert_eq!(server.get_auth("/box/swapped", &token, &[]).body, b"new and short");
    assert_eq!(server.get_auth("/box/doomed", &token, &[]).status, 404);
}

#[test]
fn a_blob_truncated_mid_download_ends_the_response_early_and_is_never_padded() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let size = 32 << 20;
    let bytes = test_bytes(size, 33);
    let put = env.put_bytes("pub", "big", &bytes, &[]);
    let blob = env.blob_path(put["sha256"].as_str().unwrap());
    let server = env.serve();
    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", "/pub/big", &[], false));
    let (status, headers) = conn.read_head().expect("a head");
    assert_eq!(status, 200);
    assert_eq!(headers.get("content-length"), Some(&size.to_string()));
    let mut body = conn.read_raw(64 * 1024);

    std::fs::OpenOptions::new().write(true).open(&blob).unwrap().set_len(1 << 20).unwrap();
    let (rest, _) = conn.read_to_end();
    body.extend_from_slice(&rest);
    assert!(body.len() < size, "all {size} bytes arrived from a 1 MiB file");
    assert!(body == bytes[..body.len()], "the bytes that arrived are not the object's prefix (padded?)");
    let counted = wait_for(Duration::from_secs(30), || server.metric("blobgate_truncated_responses_total") == 1.0);
    assert!(counted, "truncation not counted; metrics:\n{}", server.metrics());
}

#[test]
fn a_missing_blob_is_a_500_with_a_json_error() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    let put = env.put_bytes("pub", "lost", b"gone soon", &[]);
    let etag = put["etag"].as_str().unwrap().to_owned();
    std::fs::remove_file(env.blob_path(put["sha256"].as_str().unwrap())).unwrap();
    let server = env.serve();
    assert_eq!(server.metric("blobgate_blob_open_errors_total"), 0.0);
    let r = server.get("/pub/lost", &[]);
    assert_json_error(&r, 500, "object_data_unavailable");
    assert!(!r.json()["message"].as_str().unwrap().contains('/'), "no file paths in the message: {}", r.json());
    assert_eq!(server.metric("blobgate_blob_open_errors_total"), 1.0);
    assert_eq!(server.request("HEAD", "/pub/lost", &[]).status, 500);
    assert_eq!(server.metric("blobgate_blob_open_errors_total"), 2.0);
    // Preconditions are decided without opening the file.
    assert_eq!(server.get("/pub/lost", &[("If-None-Match", &etag)]).status, 304);
    assert_eq!(server.metric("blobgate_blob_open_errors_total"), 2.0);
    // The server keeps serving.
    assert_eq!(server.admin("GET", "/healthz", &[], b"").status, 200);
    // Each 500 is logged once, with its cause; the client's message above carries no cause. The server writes
    // the line before its response, but the test reads the server's stderr on a thread of its own, which may lag.
    let is_error = |line: &&str| line.contains("ERROR");
    wait_for(Duration::from_secs(30), || server.log().lines().filter(is_error).count() >= 2);
    let log = server.log();
    let failed: Vec<&str> = log.lines().filter(is_error).collect();
    assert_eq!(failed.len(), 2, "one error line per 500:\n{log}");
    for line in failed {
        assert!(line.contains("request failed") && line.contains("status=500"), "{line}");
        assert!(line.contains("No such file or directory"), "the cause is logged: {line}");
    }
}

#[test]
fn a_second_gateway_on_an_address_in_use_exits_naming_the_setting() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a", b"public bytes", &[]);
    let mut server = env.serve();
    let other = TestEnv::new();
    let (data, admin) = (server.data.to_string(), server.admin.to_string());
    for (listen, admin_listen, setting, addr) in
        [(data.as_str(), "127.0.0.1:0", "listen", &data), ("127.0.0.1:0", admin.as_str(), "admin_listen", &admin)]
    {
        let out = run_until_exit(other.serve_command(listen, admin_listen), Duration::from_secs(20));
        let line = one_line_error(&out, &["serve", setting]);
        assert!(line.contains(&format!("({setting})")) && line.contains(addr.as_str()), "{line}");
        assert!(line.starts_with("blobgate: "), "{line}");
    }
    // The first gateway kept every connection: none went to a second one (which would answer 401, not knowing
    // the bucket).
    for _ in 0..20 {
        let r = server.get("/pub/a", &[]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"public bytes"[..]));
    }
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn sighup_is_logged_and_the_server_keeps_serving() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a", b"still here", &[]);
    let mut server = env.serve();
    for n in 1..=2 {
        server.signal("HUP");
        let logged = wait_for(Duration::from_secs(30), || server.log().matches("SIGHUP received").count() == n);
        assert!(logged, "SIGHUP #{n} not logged:\n{}", server.log());
        assert!(server.log().lines().any(|l| l.contains("INFO") && l.contains("SIGHUP received")), "{}", server.log());
        let r = server.get("/pub/a", &[]);
        assert_eq!((r.status, r.body.as_slice()), (200, &b"still here"[..]), "after SIGHUP #{n}");
    }
    assert_eq!(server.stop(), Some(0), "log:\n{}", server.log());
}

#[test]
fn sigpipe_is_ignored_so_a_reset_mid_response_cannot_kill_the_server() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    // With a 4 MiB body a loaded machine buffered it all before the reset, and the response completed.
    let big = test_bytes(larger_than_socket_buffers(), 9);
    env.put_bytes("pub", "big", &big, &[]);
    let mut server = env.serve();
    // SIGPIPE is signal 13: bit 12 of the ignored-signals mask.
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
    let ignored = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).expect("SigIgn line").trim();
    let mask = u64::from_str_radix(ignored, 16).unwrap();
    assert_ne!(mask & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE is not ignored: SigIgn {ignored}");
    for _ in 0..3 {
        let mut conn = Conn::open(server.data);
        conn.send(&raw_request("GET", "/pub/big", &[], false));
        conn.read_head().expect("head");
        conn.read_raw(1000);
        // An RST, not a FIN: the server's next sends fail with ECONNRESET, then EPIPE.
        conn.reset();
    }
    assert!(wait_for(Duration::from_secs(30), || server.metric("blobgate_aborted_responses_total") == 3.0));
    let r = server.get("/pub/big", &[]);
    assert!(r.status == 200 && r.body == big);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn an_invalid_log_filter_fails_at_start_naming_its_key() {
    let env = TestEnv::new();
    for (var, value, key) in [("BLOBGATE_LOG", "notalevel", "log"), ("RUST_LOG", "notalevel", "RUST_LOG")] {
        let mut cmd = env.serve_command("127.0.0.1:0", "127.0.0.1:0");
        cmd.env(var, value);
        let out = run_until_exit(cmd, Duration::from_secs(20));
        let line = one_line_error(&out, &["serve", var]);
        assert!(line.starts_with(&format!("blobgate: {key} is not a valid log filter")), "{line}");
    }
    // A valid filter still starts (and logs its start-up line).
    let server = env.serve_with(&[("RUST_LOG", "warn,blobgate=info")], &[]);
    assert!(wait_for(Duration::from_secs(30), || server.log().contains("blobgate is serving")), "{}", server.log());
}

/// Child processes that are killed when the test ends, failed or not (a failed assertion must not leave servers
/// running).
struct KillOnDrop(Vec<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[test]
fn of_two_gateways_started_at_once_on_one_address_exactly_one_serves() {
    use std::process::Stdio;
    for _ in 0..5 {
        // Both must be told one address before either binds: a port that binds to port 0 cannot take meanwhile.
        let listen = reserved_local_addr().to_string();
        let envs = [TestEnv::new(), TestEnv::new()];
        let mut children = KillOnDrop(
            envs.iter()
                .map(|env| {
                    let mut cmd = env.serve_command(&listen, "127.0.0.1:0");
                    cmd.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().expect("spawn serve")
                })
                .collect(),
        );
        let children = &mut children.0;
        // The loser exits at once; the winner keeps serving.
        let mut exited = None;
        let decided = wait_for(Duration::from_secs(30), || {
            exited = children.iter_mut().position(|c| c.try_wait().unwrap().is_some());
            exited.is_some()
        });
        assert!(decided, "both gateways are serving on {listen}");
        let loser = exited.unwrap();
        // The winner outlives the loser's exit, not only reaches it: after that exit, it answers on the address.
        let answer = request_at(listen.parse().unwrap(), "GET", "/nobucket/k", &[]);
        assert!(matches!(answer.status, 401 | 404), "{answer:?}");
        let winner = &mut children[1 - loser];
        let still_serving = winner.try_wait().unwrap().is_none();
        let _ = winner.kill();
        let _ = winner.wait();
        let out = children.remove(loser).wait_with_output().unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("(listen)"), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(still_serving, "neither gateway kept {listen}");
    }
}
