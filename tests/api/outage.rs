//! The database going away and coming back: readiness (`/readyz`), answers from cache, 503 + `Retry-After` for
//! what needs the database, download stats buffered through the outage.

use std::time::Duration;

use crate::helpers::*;

#[test]
fn readyz_is_ready_on_sqlite_and_liveness_stays_apart() {
    let env = TestEnv::new();
    env.bucket("open", true);
    let server = env.serve();
    let ready = wait_for(Duration::from_secs(30), || server.admin("GET", "/readyz", &[], b"").status == 200);
    assert!(ready, "/readyz never answered 200; log:\n{}", server.log());
    let r = server.admin("GET", "/readyz", &[], b"");
    assert_eq!(r.body, b"ok\n");
    assert_eq!(server.admin("GET", "/healthz", &[], b"").status, 200);
    let metrics = String::from_utf8(server.admin("GET", "/metrics", &[], b"").body).unwrap();
    assert!(metrics.lines().any(|l| l == "blobgate_database_up 1"), "{metrics}");
    // On the data listener `/readyz` is the root of a bucket of that name, absent here: refused like any.
    assert_eq!(server.get("/readyz", &[]).status, 401, "the data listener has no /readyz");
}

/// `requests` of BUCKET/KEY in `blobgate stats --json`, or None when the CLI fails.
fn downloads_of(env: &TestEnv, key: &str) -> Option<u64> {
    let out = env.cli(&["stats", "--json"]);
    if !out.status.success() {
        return None;
    }
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let row = rows.as_array().unwrap().iter().find(|r| r["key"] == key);
    Some(row.map_or(0, |r| r["requests"].as_u64().unwrap()))
}

#[test]
fn a_replica_rides_out_a_postgres_outage_and_resumes_without_a_restart() {
    let cluster = OwnCluster::start();
    let env = TestEnv { database_url: Some(cluster.url.clone()), ..TestEnv::new() };
    env.bucket("box", false);
    let cached = test_bytes(40_000, 1);
    env.put_bytes("box", "cached.bin", &cached, &[]);
    env.put_bytes("box", "uncached.bin", b"needs the database", &[]);
    let token = env.token("box", "read", &[]);
    let victim = env.token("box", "read", &[]);
    let auth = format!("Bearer {token}");
    let auth = [("Authorization", auth.as_str())];
    // A long staleness window: a revocation can then reach the caches only through the change feed.
    let server = env.serve_with(
        &[
            ("BLOBGATE_TIMEOUTS__HANDLER", "8s"),
            ("BLOBGATE_TIMEOUTS__DATABASE_ACQUIRE", "4s"),
            ("BLOBGATE_DATABASE__MAX_STALENESS", "600s"),
        ],
        &[],
    );
    assert_eq!(server.admin("GET", "/readyz", &[], b"").status, 200);
    for _ in 0..3 {
        let r = server.get("/box/cached.bin", &auth);
        assert_eq!((r.status, r.body == cached), (200, true));
    }
    let victim_auth = format!("Bearer {victim}");
    assert_eq!(server.get("/box/cached.bin", &[("Authorization", victim_auth.as_str())]).status, 200);
    assert!(wait_for(Duration::from_secs(30), || downloads_of(&env, "cached.bin") == Some(4)));

    cluster.run("halt");
    // Readiness flips once the probe sees the outage.
    let flipped = wait_for(Duration::from_secs(30), || server.admin("GET", "/readyz", &[], b"").status == 503);
    assert!(flipped, "/readyz stayed 200 with the database down; log:\n{}", server.log());
    // Uncached: a request that needs the database waits for a connection (sqlx retries a refused connect until
    // `database_acquire`), then gets 503 with Retry-After. `database_unavailable`, not `handler_timeout`: the
    // acquire timeout answered it, not the handler deadline.
    let done = std::sync::atomic::AtomicBool::new(false);
    let uncached = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| {
            let r = server.get("/box/uncached.bin", &auth);
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            r
        });
        // /readyz answers from the probe's last verdict: its 503 arrives while that request still waits for the
        // database (an ordering of events; a /readyz that asked the database would wait as long).
        let r = server.admin("GET", "/readyz", &[], b"");
        let answered_first = !done.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!((r.status, r.json()["error"].as_str()), (503, Some("database_unavailable")));
        assert!(answered_first, "/readyz answered only after a request waiting for the database had given up");
        waiting.join().unwrap()
    });
    assert_eq!(server.admin("GET", "/healthz", &[], b"").status, 200, "liveness does not depend on the database");
    assert_eq!(uncached.status, 503, "{}", String::from_utf8_lossy(&uncached.body));
    assert!(uncached.header("retry-after").is_some(), "no Retry-After: {:?}", uncached.headers_without_date());
    assert_eq!(uncached.json()["error"], "database_unavailable");

    // Cached: still served, byte-exact; these four downloads' stats wait in the buffer.
    for _ in 0..4 {
        let r = server.get("/box/cached.bin", &auth);
        assert_eq!((r.status, r.body == cached), (200, true), "a cached object during the outage");
    }

    // The CLI: one line naming the database (host, port, database; never the password), non-zero exit.
    let out = env.cli(&["ls", "box"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with("blobgate: "), "{stderr}");
    assert!(stderr.contains(&format!("127.0.0.1:{}", cluster.port())) && stderr.contains("postgres"), "{stderr}");
    assert!(!stderr.contains(":blobgate@"), "the password leaked: {stderr}");
    assert_eq!(downloads_of(&env, "cached.bin"), None, "stats cannot be read during the outage");

    // The outage is the probe's to log, once: sqlx's own chatter (every reconnect attempt) stays below the log.
    let log = server.log();
    let chatter: Vec<&str> =
        log.lines().filter(|l| l.contains(" sqlx") && (l.contains(" INFO ") || l.contains(" DEBUG "))).collect();
    assert!(chatter.is_empty(), "sqlx below warn at log = info: {chatter:?}");
    cluster.run("restart");
    let back = wait_for(Duration::from_secs(30), || server.admin("GET", "/readyz", &[], b"").status == 200);
    assert!(back, "/readyz stayed 503 after the restart; log:\n{}", server.log());
    // The replica resumes without a restart: what needs the database works again.
    let r = server.get("/box/uncached.bin", &auth);
    assert_eq!((r.status, r.body.as_slice()), (200, b"needs the database".as_slice()));
    // The outage's four downloads arrive, exactly once each.
    assert!(
        wait_for(Duration::from_secs(30), || downloads_of(&env, "cached.bin") == Some(8)),
        "{:?}",
        downloads_of(&env, "cached.bin")
    );
    // Once the batcher holds nothing (no write in flight, none in doubt, nothing pending: the gauge is 0 after
    // the write that stored these), nothing is left that could count them again.
    let drained = wait_for(Duration::from_secs(30), || server.metric("blobgate_stats_pending_objects") == 0.0);
    assert!(drained, "the batcher still holds stats: {}", server.metric("blobgate_stats_pending_objects"));
    assert_eq!(downloads_of(&env, "cached.bin"), Some(8), "counted twice after the restart");

    // A revocation made after the restart is honoured: with a 600 s staleness window, only the change feed,
    // listening again, can have told the caches (the deadline bounds a hang only).
    env.ok(&["token", "revoke", &victim]);
    let mut last = None;
    let refused = wait_for(Duration::from_secs(30), || {
        let r = server.get("/box/cached.bin", &[("Authorization", victim_auth.as_str())]);
        let refused = r.status == 401;
        last = Some(r);
        refused
    });
    let last = last.expect("a request was made");
    assert!(refused, "the revocation never reached the replica: {last:?}");
    assert_eq!(last.json()["message"], "token revoked");
}

/// SIGTERM while the database is down (`halt`: connections refused) or hung (every PostgreSQL process stopped),
/// under load: cached downloads (whose stats cannot be written), uncached ones and an upload waiting for the
/// database. The process exits within `timeouts.shutdown_grace` + 10 s, as the contract says, and the stats it
/// could not write are logged and counted as dropped.
fn sigterm_during_a_database_outage(hung: bool) {
    let cluster = OwnCluster::start();
    let env = TestEnv { database_url: Some(cluster.url.clone()), ..TestEnv::new() };
    env.bucket("box", false);
    let cached = test_bytes(40_000, 3);
    env.put_bytes("box", "cached.bin", &cached, &[]);
    env.put_bytes("box", "uncached.bin", b"needs the database", &[]);
    let token = env.token("box", "read", &[]);
    let writer = env.token("box", "write", &[]);
    let auth = format!("Bearer {token}");
    let grace = Duration::from_secs(2);
    let mut server = env.serve_with(&[("BLOBGATE_TIMEOUTS__SHUTDOWN_GRACE", "2s")], &[]);
    let r = server.get("/box/cached.bin", &[("Authorization", auth.as_str())]);
    assert_eq!((r.status, r.body == cached), (200, true));

    let _frozen = match hung {
        true => Some(cluster.freeze()),
        false => {
            cluster.run("halt");
            None
        }
    };
    // Downloads from the cache go on; their stats wait for the database.
    for _ in 0..5 {
        let r = server.get("/box/cached.bin", &[("Authorization", auth.as_str())]);
        assert_eq!((r.status, r.body == cached), (200, true), "a cached object during the outage");
    }
    let stopped = std::thread::scope(|scope| {
        // Requests that wait for the database when the signal comes: uncached reads and an upload.
        let data = server.data;
        for _ in 0..3 {
            let auth = auth.clone();
            // Cut by the shutdown or answered 503: either way, nothing to assert but that the process exits.
            scope.spawn(move || {
                let mut conn = Conn::open(data);
                let _ = conn.send_lossy(&raw_request("GET", "/box/uncached.bin", &[("Authorization", &auth)], true));
                let _ = conn.read_response(false);
            });
        }
        let (admin, writer) = (server.admin, format!("Bearer {writer}"));
        let uploading = scope.spawn(move || {
            let mut conn = Conn::open(admin);
            let head = format!(
                "PUT /box/new.bin HTTP/1.1\r\nHost: t\r\nAuthorization: {writer}\r\nContent-Length: 9\r\n\r\nan upload"
            );
            let _ = conn.send_lossy(head.as_bytes());
            let _ = conn.read_response(false);
        });
        std::thread::sleep(Duration::from_millis(500));
        server.signal("TERM");
        let started = std::time::Instant::now();
        let code = server.wait_exit(grace + Duration::from_secs(10));
        let _ = uploading.join();
        (code, started.elapsed())
    });
    assert_eq!(stopped.0, Some(0), "exit status; log:\n{}", server.log());
    let log = server.log();
    assert!(log.contains("stopped"), "{log}");
    assert!(log.contains("could not write the last download stats before exit"), "{log}");
    eprintln!("exited {:?} after SIGTERM ({} outage)", stopped.1, if hung { "hung" } else { "halted" });
}

#[test]
fn sigterm_during_a_halted_database_exits_within_the_grace_period_and_ten_seconds() {
    sigterm_during_a_database_outage(false);
}

#[test]
fn sigterm_during_a_hung_database_exits_within_the_grace_period_and_ten_seconds() {
    sigterm_during_a_database_outage(true);
}
