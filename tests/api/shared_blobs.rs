//! A blob directory shared by several processes (issue 14, ARCHITECTURE.md "Shared blob directory"): two real
//! `serve` processes on one data dir and one database, run once on each backend (SQLite, through WAL and the
//! shared generation file; PostgreSQL, on the test cluster). A start-up sweep never removes what a live peer is
//! doing; concurrent writers end consistent, with no orphan blob; a blob goes exactly once, with its last
//! reference.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use blobgate::store::blobs::{process_start_ticks, this_process};
use blobgate::store::staging::{StageOwner, stage_name};

use crate::helpers::*;

/// The metadata database the processes share.
#[derive(Clone, Copy)]
enum Db {
    Sqlite,
    Postgres,
}

/// A data dir and a database for several processes: every CLI command and server of the env uses both.
fn shared_env(db: Db) -> TestEnv {
    let env = match db {
        Db::Sqlite => TestEnv::new(),
        Db::Postgres => TestEnv::on_postgres(),
    };
    env.bucket("box", false);
    let sqlite_file = env.data_dir().join("blobgate.db").exists();
    assert_eq!(sqlite_file, matches!(db, Db::Sqlite), "the metadata is in the backend under test");
    env
}

/// A write and a read token for the bucket `box`.
fn tokens(env: &TestEnv) -> (String, String) {
    (env.token("box", "write", &[]), env.token("box", "read", &[]))
}

/// Each test once per backend: `on_sqlite::NAME` and `on_postgres::NAME`.
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod on_sqlite {
            $(#[test]
            fn $test() {
                super::$test(super::Db::Sqlite)
            })*
        }
        mod on_postgres {
            $(#[test]
            fn $test() {
                super::$test(super::Db::Postgres)
            })*
        }
    };
}

on_both_backends!(
    a_peers_slow_upload_survives_another_servers_startup_sweep_and_completes_byte_exact,
    a_slow_upload_survives_the_sweep_of_a_peer_that_cannot_see_its_pid,
    temp_files_go_when_their_owner_on_this_host_is_dead_or_when_another_hosts_pass_the_grace_period,
    two_servers_writing_one_key_at_once_end_consistent_with_no_orphan_blob,
    a_blob_shared_by_two_keys_is_unlinked_once_when_its_last_reference_goes,
);

/// A host id no machine has (ids are hashes; this one is all zeros).
const OTHER_HOST: &str = "0000000000000000";

/// Writes a staging file as `owner` would name it, last modified `idle` ago.
fn stage_file(env: &TestEnv, owner: &StageOwner, idle: Duration) -> PathBuf {
    let path = write_file(&env.data_dir().join("tmp"), &stage_name(owner, &format!("{:016x}", rand_u64())), b"part");
    set_idle(&path, idle);
    path
}

fn set_idle(path: &Path, idle: Duration) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    file.set_modified(SystemTime::now() - idle).unwrap();
}

fn here(pid: u32, start_ticks: u64) -> StageOwner {
    StageOwner { host: this_process().host.clone(), pid, start_ticks }
}

fn admin(server: &Server, method: &str, path: &str, token: &str, body: &[u8]) -> Response {
    server.admin(method, path, &[("Authorization", &format!("Bearer {token}"))], body)
}

/// Runs `a` and `b` at the same moment on two threads; returns both results.
fn at_once<A: Send, B: Send>(a: impl FnOnce() -> A + Send, b: impl FnOnce() -> B + Send) -> (A, B) {
    let start = Arc::new(Barrier::new(2));
    std::thread::scope(|s| {
        let (sa, sb) = (start.clone(), start.clone());
        let ha = s.spawn(move || {
            sa.wait();
            a()
        });
        let hb = s.spawn(move || {
            sb.wait();
            b()
        });
        (ha.join().unwrap(), hb.join().unwrap())
    })
}

/// Trickles a 2 MiB upload into one server over several seconds and starts `peer` (a second server on the same
/// data dir, its start-up sweep included) while the upload's temp file looks idle for ten minutes (its mtime set
/// back: longer than a 1 s grace period, shorter than the default hour): the upload must survive and complete
/// byte-exact, and the peer must serve it.
fn a_slow_upload_survives_a_peer_starting(
    db: Db,
    uploader_env: &[(&str, &str)],
    peer: impl FnOnce(&TestEnv) -> Server,
) {
    let env = shared_env(db);
    let (writer, reader) = tokens(&env);
    let uploader = env.serve_with(uploader_env, &[]);
    let body = test_bytes(2 << 20, 14);
    let mut conn = Conn::open(uploader.admin);
    conn.send(
        format!(
            "PUT /box/slow.bin HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {writer}\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    );
    let mut pieces = body.chunks(128 << 10);
    // The first 512 KiB reach the disk as one batch: the temp file appears.
    for chunk in pieces.by_ref().take(4) {
        conn.send(chunk);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Every byte sent so far is on disk, so no write of this batch can touch the temp file after its mtime is set.
    let written = wait_for(Duration::from_secs(30), || {
        env.tmp_files().iter().any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == 4 * (128 << 10)))
    });
    assert!(written, "the first 512 KiB never reached a staged upload: {:?}", env.tmp_files());
    let staged = env.tmp_files().remove(0);
    // The temp file has been idle for ten minutes when the peer's sweep looks at it.
    set_idle(&staged, Duration::from_secs(600));

    let peer = peer(&env);
    assert!(staged.exists(), "the peer's start-up sweep removed a live upload; log:\n{}", peer.log());
    assert!(!peer.log().contains("start-up sweep removed leftovers"), "{}", peer.log());
    let started = Instant::now();
    for chunk in pieces {
        conn.send(chunk);
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(started.elapsed() >= Duration::from_secs(2), "the body is trickled over seconds");
    let response = conn.read_response(false).expect("an answer to the upload");
    assert_eq!(response.status, 201, "{}", String::from_utf8_lossy(&response.body));
    assert_eq!(response.json()["sha256"], sha256_hex(&body));

    let downloaded = peer.get_auth("/box/slow.bin", &reader, &[]);
    assert_eq!(downloaded.status, 200);
    assert!(downloaded.body == body, "the peer serves the upload byte-exact");
    assert_eq!(env.blob_files(), vec![env.blob_path(&sha256_hex(&body))]);
    assert!(env.tmp_files().is_empty(), "{:?}", env.tmp_files());
}

fn a_peers_slow_upload_survives_another_servers_startup_sweep_and_completes_byte_exact(db: Db) {
    // A grace period shorter than the upload's idle time: only its owner being a live process on this host keeps
    // the temp file.
    let grace = [("BLOBGATE_TIMEOUTS__SWEEP_GRACE", "1s")];
    a_slow_upload_survives_a_peer_starting(db, &grace, |env| env.serve_with(&grace, &[]));
}

fn a_slow_upload_survives_the_sweep_of_a_peer_that_cannot_see_its_pid(db: Db) {
    // The peer in a pid namespace of its own, as in another container: the uploader's pid means nothing there,
    // so the temp file counts as another host's and is kept by the grace period (the default, 1h).
    require_tool("unshare", "apt package util-linux");
    let in_own_pid_namespace =
        ["unshare", "--user", "--map-root-user", "--pid", "--fork", "--mount-proc", "--kill-child"];
    let probe = Command::new(in_own_pid_namespace[0]).args(&in_own_pid_namespace[1..]).arg("true").output().unwrap();
    assert!(
        probe.status.success(),
        "this test needs user and pid namespaces (`unshare --user --pid`): {}",
        String::from_utf8_lossy(&probe.stderr)
    );
    a_slow_upload_survives_a_peer_starting(db, &[], |env| env.serve_with(&[], &in_own_pid_namespace));
}

fn temp_files_go_when_their_owner_on_this_host_is_dead_or_when_another_hosts_pass_the_grace_period(db: Db) {
    let env = &shared_env(db);
    let hour = Duration::from_secs(3600);
    let mut sleeper = Command::new("sleep").arg("120").spawn().expect("run sleep");
    let live_ticks = process_start_ticks(sleeper.id()).expect("the sleeper runs");
    let live = stage_file(env, &here(sleeper.id(), live_ticks), 2 * hour);
    let mut done = Command::new("true").spawn().expect("run true");
    let dead_pid = done.id();
    done.wait().unwrap();
    let dead = stage_file(env, &here(dead_pid, live_ticks), Duration::ZERO);
    // The sleeper's pid with another start time: a process that died and whose pid was reused.
    let reused = stage_file(env, &here(sleeper.id(), live_ticks + 1), Duration::ZERO);
    let elsewhere = StageOwner { host: OTHER_HOST.into(), pid: sleeper.id(), start_ticks: live_ticks };
    let elsewhere_young = stage_file(env, &elsewhere, hour - Duration::from_secs(120));
    let elsewhere_old = stage_file(env, &elsewhere, hour + Duration::from_secs(1));

    let mut server = env.serve();
    assert!(!dead.exists(), "a dead local process's temp file survived the start-up sweep");
    assert!(!reused.exists(), "a temp file whose pid was reused survived");
    assert!(live.exists(), "a live local process's temp file was removed, though idle for two hours");
    assert!(elsewhere_young.exists(), "another host's temp file went before the grace period (1h)");
    assert!(!elsewhere_old.exists(), "another host's temp file outlived the grace period");
    server.stop();

    set_idle(&elsewhere_young, hour);
    let mut server = env.serve();
    assert!(!elsewhere_young.exists(), "another host's temp file outlived the grace period");
    assert!(live.exists());
    server.stop();

    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let _server = env.serve();
    assert!(!live.exists(), "the temp file outlived its owner");
    assert!(env.tmp_files().is_empty(), "{:?}", env.tmp_files());
}

fn two_servers_writing_one_key_at_once_end_consistent_with_no_orphan_blob(db: Db) {
    let env = shared_env(db);
    let (writer, reader) = tokens(&env);
    let (a, b) = (env.serve(), env.serve());
    for round in 0..12u64 {
        let body_a = test_bytes(200_000, 2 * round);
        // Every third round both write the same bytes: one blob, installed once, the other copy dropped.
        let body_b = if round % 3 == 2 { body_a.clone() } else { test_bytes(150_000, 2 * round + 1) };
        let (ra, rb) =
            at_once(|| admin(&a, "PUT", "/box/k", &writer, &body_a), || admin(&b, "PUT", "/box/k", &writer, &body_b));
        for r in [&ra, &rb] {
            assert_eq!(r.status, 201, "round {round}: {}", String::from_utf8_lossy(&r.body));
        }
        let from_a = a.get_auth("/box/k", &reader, &[]).body;
        assert!(from_a == body_a || from_a == body_b, "round {round}: neither upload is visible");
        assert!(
            wait_for(Duration::from_secs(30), || b.get_auth("/box/k", &reader, &[]).body == from_a),
            "round {round}: the servers disagree"
        );
        assert_eq!(env.blob_files(), vec![env.blob_path(&sha256_hex(&from_a))], "round {round}: an orphan blob");
        assert!(env.tmp_files().is_empty(), "round {round}: {:?}", env.tmp_files());
    }
}

fn a_blob_shared_by_two_keys_is_unlinked_once_when_its_last_reference_goes(db: Db) {
    let env = shared_env(db);
    let (writer, reader) = tokens(&env);
    let (a, b) = (env.serve(), env.serve());
    let shared = test_bytes(100_000, 7);
    let blob = env.blob_path(&sha256_hex(&shared));
    for round in 0..6u64 {
        assert_eq!(admin(&a, "PUT", "/box/one", &writer, &shared).status, 201);
        assert_eq!(admin(&b, "PUT", "/box/two", &writer, &shared).status, 201);
        assert_eq!(env.blob_files(), vec![blob.clone()], "round {round}: identical content is stored once");

        // Replacing one key keeps the blob: the other key still refers to it.
        let other = test_bytes(50_000, 100 + round);
        assert_eq!(admin(&b, "PUT", "/box/one", &writer, &other).json()["status"], "replaced");
        assert!(blob.is_file(), "round {round}: a replace took a blob that `two` still uses");
        assert_eq!(a.get_auth("/box/two", &reader, &[]).body.len(), shared.len());
        assert_eq!(admin(&a, "PUT", "/box/one", &writer, &shared).json()["status"], "replaced");
        assert!(!env.blob_path(&sha256_hex(&other)).exists(), "round {round}: the replaced content's blob stayed");

        // Both references dropped at once, on two servers: the blob goes, exactly once.
        let (da, db) =
            at_once(|| admin(&a, "DELETE", "/box/one", &writer, b""), || admin(&b, "DELETE", "/box/two", &writer, b""));
        assert_eq!((da.status, db.status), (204, 204), "round {round}");
        assert!(!blob.exists(), "round {round}: the blob outlived its last reference");

        // One key deleted on both servers at once: one delete finds it, the blob goes once.
        assert_eq!(admin(&a, "PUT", "/box/one", &writer, &shared).status, 201);
        let (da, db) =
            at_once(|| admin(&a, "DELETE", "/box/one", &writer, b""), || admin(&b, "DELETE", "/box/one", &writer, b""));
        let mut statuses = [da.status, db.status];
        statuses.sort_unstable();
        assert_eq!(statuses, [204, 404], "round {round}");
        assert!(env.blob_files().is_empty(), "round {round}: {:?}", env.blob_files());
        assert!(env.tmp_files().is_empty(), "round {round}: {:?}", env.tmp_files());
    }
    for server in [&a, &b] {
        assert!(!server.log().contains("retired blob"), "an unlink failed:\n{}", server.log());
        assert!(!server.log().contains("ERROR"), "{}", server.log());
    }
}
