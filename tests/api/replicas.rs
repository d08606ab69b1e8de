//! Several replicas: three real `blobgate serve` processes on one PostgreSQL database (a fresh one per test) and
//! one shared data dir. Changes made through any of them, or through the CLI, reach every replica (within 1 s: the
//! delays are printed, the arrival is asserted).
//! Every server is a `Server`, which kills its process when dropped, so a failed assertion leaves none running.

use std::io::Write;
use std::net::TcpStream;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::helpers::*;

/// The contract's bound for a change to reach every replica: reported, not asserted.
const PROPAGATION: Duration = Duration::from_secs(1);

/// Bounds a hang only: a change that has not reached a replica by then never will.
const HANG: Duration = Duration::from_secs(30);

/// One database, one data dir, and the replicas serving them.
struct Replicas {
    env: TestEnv,
    url: String,
    servers: Vec<Server>,
}

impl Replicas {
    /// A fresh database and data dir; `prepare` runs CLI commands before the replicas start.
    fn start(count: usize, prepare: impl FnOnce(&Replicas)) -> Self {
        let mut replicas = Replicas { env: TestEnv::new(), url: postgres_database(), servers: Vec::new() };
        prepare(&replicas);
        for _ in 0..count {
            let server = replicas.serve();
            replicas.servers.push(server);
        }
        replicas
    }

    fn serve(&self) -> Server {
        self.env.serve_with(&[("BLOBGATE_DATABASE_URL", &self.url)], &[])
    }

    fn cli(&self, args: &[&str]) -> std::process::Output {
        self.env.cli_env(args, &[("BLOBGATE_DATABASE_URL", &self.url)])
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "blobgate {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).expect("utf-8 stdout")
    }

    fn token(&self, bucket: &str, scope: &str) -> String {
        self.ok(&["token", "create", "--bucket", bucket, "--scope", scope]).trim().to_owned()
    }

    fn objects(&self, bucket: &str) -> Vec<serde_json::Value> {
        self.ok(&["ls", bucket, "--json"])
            .lines()
            .map(|l| serde_json::from_str(l).expect("ls --json prints one JSON object a line"))
            .collect()
    }
}

/// Asks every server in parallel, over and over, until `done` holds for its answer; returns how long after
/// `since` each one first answered so, or `None` for one that never did within [`HANG`].
fn delays_until(
    servers: &[&Server],
    since: Instant,
    ask: impl Fn(&Server) -> Response + Sync,
    done: impl Fn(&Response) -> bool + Sync,
) -> Vec<Option<Duration>> {
    std::thread::scope(|scope| {
        let waits: Vec<_> = servers
            .iter()
            .map(|server| {
                let (ask, done) = (&ask, &done);
                scope.spawn(move || {
                    loop {
                        let answered = done(&ask(server));
                        let elapsed = since.elapsed();
                        if answered {
                            return Some(elapsed);
                        }
                        if elapsed > HANG {
                            return None;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                })
            })
            .collect();
        waits.into_iter().map(|w| w.join().expect("poller")).collect()
    })
}

/// Every replica saw the change. The delays are printed against the 1 s contract, a figure for
/// docs/measurements.md: a wall-clock bound would fail on a loaded machine, so what is asserted is the event.
fn assert_reached_every_replica(what: &str, delays: &[Option<Duration>]) {
    assert!(delays.iter().all(Option::is_some), "{what} never reached every replica within {HANG:?}: {delays:?}");
    let worst = delays.iter().flatten().max().expect("at least one replica");
    println!("{what}: worst case {worst:?} over {} replicas ({delays:?}; contract {PROPAGATION:?})", delays.len());
}

#[test]
fn an_upload_on_one_replica_downloads_byte_exact_on_the_others() {
    let r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "shared"]);
    });
    let (writer, reader) = (r.token("shared", "write"), r.token("shared", "read"));
    let [a, b, c] = [&r.servers[0], &r.servers[1], &r.servers[2]];
    // The others have cached the key as absent: the upload must evict that, not just fill a miss.
    for server in [b, c] {
        assert_eq!(server.get_auth("/shared/big.bin", &reader, &[]).status, 404);
    }
    let bytes = test_bytes(3 << 20, 14);
    let put = a.put("/shared/big.bin", &writer, &bytes, &[]);
    assert!(put.status == 200 || put.status == 201, "upload: {} {}", put.status, String::from_utf8_lossy(&put.body));
    let uploaded = Instant::now();
    // HEAD, so that the delay measured is the change's and not the download's.
    let head = |s: &Server| s.request("HEAD", "/shared/big.bin", &[("Authorization", &format!("Bearer {reader}"))]);
    let delays = delays_until(&[b, c], uploaded, head, |r| r.status == 200);
    assert_reached_every_replica("a new object reaching the other replicas", &delays);
    for server in [a, b, c] {
        let got = server.get_auth("/shared/big.bin", &reader, &[]);
        assert_eq!(got.status, 200);
        assert_eq!(sha256_hex(&got.body), sha256_hex(&bytes), "byte-exact on {}", server.data);
    }
}

#[test]
fn a_token_revocation_is_refused_by_every_replica_within_a_second() {
    let r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "secure"]);
    });
    let (writer, reader) = (r.token("secure", "write"), r.token("secure", "read"));
    let put = r.servers[0].put("/secure/doc", &writer, b"classified", &[]);
    assert!(put.status == 200 || put.status == 201, "upload: {}", put.status);
    let all: Vec<&Server> = r.servers.iter().collect();
    // Warm: every replica has the token cached as live (and serves the object).
    let warm = delays_until(&all, Instant::now(), |s| s.get_auth("/secure/doc", &reader, &[]), |r| r.status == 200);
    assert_reached_every_replica("the object", &warm);

    let asked = Instant::now();
    let out = r.cli(&["token", "revoke", &reader]);
    assert!(out.status.success(), "revoke: {}", String::from_utf8_lossy(&out.stderr));
    // The commit happened before the CLI exited: measure from its exit (the CLI's own start-up is not
    // propagation), and print the delay from the command's start as well.
    let committed = Instant::now();
    let delays = delays_until(&all, committed, |s| s.get_auth("/secure/doc", &reader, &[]), |r| r.status == 401);
    println!("revocation: the CLI ran for {:?}", committed - asked);
    assert_reached_every_replica("a CLI token revocation being refused", &delays);
    for server in &all {
        assert_eq!(server.get_auth("/secure/doc", &reader, &[]).status, 401, "stays refused on {}", server.data);
    }
}

/// [`delays_until`], keeping every answer each server gave, in order (one list per server, as `servers`).
fn answers_until(
    servers: &[&Server],
    since: Instant,
    ask: impl Fn(&Server) -> Response + Sync,
    done: impl Fn(&Response) -> bool + Sync,
) -> (Vec<Option<Duration>>, Vec<Vec<Response>>) {
    let answers: Vec<Mutex<Vec<Response>>> = servers.iter().map(|_| Mutex::default()).collect();
    let keep = |server: &Server| {
        let response = ask(server);
        let n = servers.iter().position(|s| s.data == server.data).expect("one of the servers");
        answers[n].lock().unwrap().push(response.clone());
        response
    };
    let delays = delays_until(servers, since, keep, done);
    (delays, answers.into_iter().map(|a| a.into_inner().unwrap()).collect())
}

/// `blobgate_throttled_requests_total` for a token's request-rate limit on `server` (0 when absent).
fn throttled_token_requests(server: &Server, id: &str) -> f64 {
    let labels = format!("limit=\"requests\",scope=\"token\",principal=\"{id}\"");
    server.metric_with("blobgate_throttled_requests_total", &labels)
}

/// A limit is stored once and counted by each replica on its own: `limits set` reaches every replica through the
/// change feed, and each then allows the token its one request a minute and refuses the next; `limits clear`
/// reaches them the same way. Every answer on the way is counted, and each replica's throttled series matches.
#[test]
fn a_limit_set_through_one_replica_applies_on_the_other_at_its_next_request() {
    let r = Replicas::start(2, |r| {
        r.ok(&["bucket", "create", "metered"]);
    });
    let (writer, reader) = (r.token("metered", "write"), r.token("metered", "read"));
    let put = r.servers[0].put("/metered/doc", &writer, b"counted", &[]);
    assert!(put.status == 200 || put.status == 201, "upload: {}", put.status);
    let all: Vec<&Server> = r.servers.iter().collect();
    let get = |s: &Server| s.get_auth("/metered/doc", &reader, &[]);
    // Warm: each replica has the token and the object cached, and no limit.
    for server in &all {
        let got = get(server);
        assert_eq!((got.status, got.body.as_slice()), (200, &b"counted"[..]), "warm on {}", server.data);
    }
    let id = token_id_in(&r.ok(&["token", "list"]), &reader);
    let principal = format!("token:{id}");

    r.ok(&["limits", "set", &principal, "--requests", "1/min"]);
    // Measured from the CLI's exit, as the revocation is: the commit happened before it.
    let set = Instant::now();
    let (delays, answers) = answers_until(&all, set, get, |resp| resp.status == 429);
    assert_reached_every_replica("a CLI limit refusing a request", &delays);
    for (server, answers) in all.iter().zip(&answers) {
        let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        println!("limit set: {} answered {} requests before its 429", server.data, statuses.len() - 1);
        let (refused, served) = answers.split_last().expect("at least the 429");
        // Served until the limit arrived, and then once more: the one request a minute this replica's own counter
        // allows (the other replica's requests do not count here).
        assert!(!served.is_empty() && served.iter().all(|a| a.status == 200), "on {}: {statuses:?}", server.data);
        assert_json_error(refused, 429, "too_many_requests");
        let policy = refused.header("ratelimit-policy");
        assert!(policy.is_some_and(|p| p.starts_with("\"token\";q=1;")), "on {}: {policy:?}", server.data);
        let again = get(server);
        assert_eq!(again.status, 429, "stays refused on {}", server.data);
        assert_eq!(throttled_token_requests(server, &id), 2.0, "two refusals counted on {}", server.data);
    }

    r.ok(&["limits", "clear", &principal]);
    let cleared = Instant::now();
    let (delays, answers) = answers_until(&all, cleared, get, |resp| resp.status == 200);
    assert_reached_every_replica("a CLI limit clear being served", &delays);
    for (server, answers) in all.iter().zip(&answers) {
        let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
        println!("limit cleared: {} refused {} requests before its 200", server.data, statuses.len() - 1);
        let (served, refused) = answers.split_last().expect("at least the 200");
        assert!(refused.iter().all(|a| a.status == 429), "on {}: {statuses:?}", server.data);
        assert_eq!(served.body, b"counted", "on {}", server.data);
        // More requests than the limit would allow in a minute: it is gone, not refilled.
        for _ in 0..3 {
            assert_eq!(get(server).status, 200, "stays served on {}", server.data);
        }
        let refusals = 2.0 + refused.len() as f64;
        assert_eq!(throttled_token_requests(server, &id), refusals, "every refusal counted on {}", server.data);
    }
    assert_eq!(r.ok(&["limits", "show"]), "", "nothing stored");
}

#[test]
fn a_replaced_or_deleted_object_is_seen_by_every_replica_within_a_second() {
    let r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "assets", "--public"]);
    });
    let writer = r.token("assets", "write");
    let all: Vec<&Server> = r.servers.iter().collect();
    let (first, second) = (test_bytes(200_000, 1), test_bytes(150_000, 2));
    assert!(matches!(r.servers[0].put("/assets/app.js", &writer, &first, &[]).status, 200 | 201));
    let seen_first = |resp: &Response| resp.status == 200 && resp.body == first;
    let warm = delays_until(&all, Instant::now(), |s| s.get("/assets/app.js", &[]), seen_first);
    assert_reached_every_replica("the first version", &warm);

    // Replaced through another replica's admin listener.
    assert!(matches!(r.servers[1].put("/assets/app.js", &writer, &second, &[]).status, 200 | 201));
    let replaced = Instant::now();
    // HEAD, so that the delay measured is the change's and not the download's; the sizes differ.
    let head = |s: &Server| s.request("HEAD", "/assets/app.js", &[]);
    let length = second.len().to_string();
    let delays = delays_until(&all, replaced, head, |resp| {
        resp.status == 200 && resp.header("content-length") == Some(length.as_str())
    });
    assert_reached_every_replica("a replaced object", &delays);
    for server in &all {
        assert_eq!(sha256_hex(&server.get("/assets/app.js", &[]).body), sha256_hex(&second), "on {}", server.data);
    }

    // Deleted through the CLI.
    r.ok(&["rm", "assets", "app.js"]);
    let deleted = Instant::now();
    let delays = delays_until(&all, deleted, |s| s.get("/assets/app.js", &[]), |resp| resp.status == 404);
    assert_reached_every_replica("a deleted object", &delays);
    assert!(r.objects("assets").is_empty());
}

#[test]
fn stats_from_downloads_on_every_replica_sum_exactly() {
    let r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "counted", "--public"]);
    });
    let writer = r.token("counted", "write");
    let bytes = test_bytes(10_000, 3);
    assert!(matches!(r.servers[0].put("/counted/file", &writer, &bytes, &[]).status, 200 | 201));
    let all: Vec<&Server> = r.servers.iter().collect();
    let ready = delays_until(&all, Instant::now(), |s| s.request("HEAD", "/counted/file", &[]), |r| r.status == 200);
    assert_reached_every_replica("the object", &ready);
    let per_replica = [7u64, 11, 13];
    std::thread::scope(|scope| {
        for (server, n) in r.servers.iter().zip(per_replica) {
            let bytes = &bytes;
            scope.spawn(move || {
                for _ in 0..n {
                    let got = server.get("/counted/file", &[]);
                    assert_eq!((got.status, got.body.len()), (200, bytes.len()));
                }
            });
        }
    });
    // A graceful stop writes what each replica's batcher holds.
    let mut r = r;
    for server in &mut r.servers {
        assert_eq!(server.stop(), Some(0), "log:\n{}", server.log());
    }
    let stats: serde_json::Value = serde_json::from_str(r.ok(&["stats", "--json"]).trim()).expect("stats --json");
    let row = stats.as_array().unwrap().iter().find(|row| row["key"] == "file").expect("a row for the file").clone();
    let downloads: u64 = per_replica.iter().sum();
    // Three HEADs (one per replica) came first; they are counted apart from the downloads.
    assert_eq!(row["requests"], downloads, "{row}");
    assert_eq!(row["completed"], downloads, "{row}");
    assert_eq!(row["head_requests"], 3, "{row}");
    assert_eq!(row["bytes_sent"], downloads * bytes.len() as u64, "{row}");
    let table = r.ok(&["stats"]);
    assert!(table.lines().any(|l| l.starts_with("counted/file")), "{table}");
}

#[test]
fn kill_9_of_a_replica_mid_upload_leaves_nothing_visible_and_nothing_behind() {
    let mut r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "ups"]);
    });
    let (writer, reader) = (r.token("ups", "write"), r.token("ups", "read"));
    for server in &r.servers[1..] {
        assert_eq!(server.get_auth("/ups/half.bin", &reader, &[]).status, 404);
    }
    let total = 8 << 20;
    let mut stream = TcpStream::connect(r.servers[0].admin).unwrap();
    let head = format!(
        "PUT /ups/half.bin HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer {writer}\r\nContent-Length: {total}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&test_bytes(total / 2, 9)).unwrap();
    let tmp = r.env.data_dir().join("tmp");
    let staged = wait_for(Duration::from_secs(30), || {
        files_under(&tmp).iter().any(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0) > 0)
    });
    assert!(staged, "the upload never reached the disk");
    r.servers[0].stop_with("KILL");
    drop(stream);
    assert!(!files_under(&tmp).is_empty(), "the killed upload left its temp file (as a crash would)");

    // Nothing is visible, on the survivors or in the database, and no blob exists. A change made after the kill
    // reaching every survivor through the feed (an upload evicting the absence each had cached) shows that they
    // applied the log past the kill: a change the killed upload had made would have reached them first.
    for server in &r.servers[1..] {
        assert_eq!(server.get_auth("/ups/marker", &reader, &[]).status, 404);
    }
    let marker = r.servers[1].put("/ups/marker", &writer, b"after the kill", &[]);
    assert_eq!(marker.status, 201, "{}", String::from_utf8_lossy(&marker.body));
    for server in &r.servers[1..] {
        let seen = wait_for(HANG, || server.get_auth("/ups/marker", &reader, &[]).status == 200);
        assert!(seen, "the marker never reached {}", server.data);
        assert_eq!(server.get_auth("/ups/half.bin", &reader, &[]).status, 404);
    }
    let listed: Vec<serde_json::Value> = r.objects("ups").iter().map(|o| o["key"].clone()).collect();
    assert_eq!(listed, ["marker"], "no object row for a killed upload");
    let marker_blob = r.env.blob_path(&sha256_hex(b"after the kill"));
    assert_eq!(r.env.blob_files(), [marker_blob], "no blob for a killed upload");
    // The temp file's owner is a dead process on this host: the next replica's start-up sweep reclaims it.
    let restarted = r.serve();
    assert!(files_under(&tmp).is_empty(), "start-up sweep left temp files: {:?}", files_under(&tmp));
    assert_eq!(restarted.get_auth("/ups/half.bin", &reader, &[]).status, 404);
    for server in &r.servers[1..] {
        assert_eq!(server.get_auth("/ups/half.bin", &reader, &[]).status, 404, "the peers still serve");
    }
}

#[test]
fn two_replicas_writing_one_key_at_once_end_consistent_without_orphan_blobs() {
    let r = Replicas::start(3, |r| {
        r.ok(&["bucket", "create", "race", "--public"]);
    });
    let writer = r.token("race", "write");
    let all: Vec<&Server> = r.servers.iter().collect();
    for round in 0..5u64 {
        let bodies = [test_bytes(300_000, 100 + 2 * round), test_bytes(250_000, 101 + 2 * round)];
        let start = Barrier::new(2);
        std::thread::scope(|scope| {
            for (server, body) in r.servers[..2].iter().zip(&bodies) {
                let (start, writer) = (&start, &writer);
                scope.spawn(move || {
                    start.wait();
                    let put = server.put("/race/same-key", writer, body, &[]);
                    assert!(matches!(put.status, 200 | 201), "round {round}: {} {:?}", put.status, put.body);
                });
            }
        });
        let listed = r.objects("race");
        assert_eq!(listed.len(), 1, "round {round}: one object for one key: {listed:?}");
        // The two bodies differ in size, so the listing says which one is stored.
        let size = listed[0]["size"].as_u64().unwrap();
        let winner = bodies.iter().find(|b| b.len() as u64 == size).expect("the stored object is one of the two");
        let winner_sha = sha256_hex(winner);
        // Every replica serves the stored one, within the bound.
        let settled = Instant::now();
        let length = winner.len().to_string();
        let head = |s: &Server| s.request("HEAD", "/race/same-key", &[]);
        let delays = delays_until(&all, settled, head, |resp| {
            resp.status == 200 && resp.header("content-length") == Some(length.as_str())
        });
        assert_reached_every_replica(&format!("round {round}: the stored upload on every replica"), &delays);
        for server in &all {
            assert_eq!(sha256_hex(&server.get("/race/same-key", &[]).body), winner_sha, "on {}", server.data);
        }
        // Exactly one blob: the loser's (and the previous round's) are gone.
        let blobs = r.env.blob_files();
        assert_eq!(blobs, vec![r.env.blob_path(&winner_sha)], "round {round}: orphan blobs left behind");
    }
}

/// The HA compose file's HAProxy configuration (`deploy/haproxy.cfg`), run here with its backends pointed at this
/// test's replicas: the compose network's names and fixed ports become 127.0.0.1 and the replicas' ports, and
/// nothing else changes.
fn haproxy_in_front_of(replicas: &[Server]) -> (std::process::Child, std::net::SocketAddr) {
    let haproxy = system_binary("haproxy", "haproxy");
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (front, stats) = (free_port(), free_port());
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy.cfg")).unwrap();
    let mut config = String::new();
    let mut skipping_resolvers = false;
    for line in source.lines() {
        let trimmed = line.trim_start();
        if line.starts_with("resolvers ") {
            skipping_resolvers = true;
            continue;
        }
        if skipping_resolvers {
            if trimmed.is_empty() {
                skipping_resolvers = false;
            }
            continue;
        }
        let line = match trimmed {
            "bind :8080" => format!("    bind {front}"),
            "bind :8404" => format!("    bind {stats}"),
            _ if trimmed.starts_with("default-server ") => "    default-server inter 1s fall 2 rise 2".to_owned(),
            _ if trimmed.starts_with("server blobgate-") || trimmed.starts_with("server cached-") => {
                let backup = trimmed.starts_with("server cached-");
                let n: usize = trimmed.split(['-', ' ']).nth(2).unwrap().parse().unwrap();
                let Some(replica) = replicas.get(n - 1) else { continue };
                if backup {
                    format!("    server cached-{n} {} backup no-check", replica.data)
                } else {
                    format!("    server blobgate-{n} {} check port {}", replica.data, replica.admin.port())
                }
            }
            _ => line.to_owned(),
        };
        config.push_str(&line);
        config.push('\n');
    }
    assert!(config.contains("option httpchk GET /readyz"), "the compose file's health check is kept:\n{config}");
    let dir = tempfile::tempdir().unwrap().keep();
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, &config).unwrap();
    let child = std::process::Command::new(haproxy)
        .args(["-db", "-f"])
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start haproxy");
    (child, front)
}

/// Kills HAProxy when the test ends, however it ends.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// boto3 through the balanced endpoint: multipart uploads and a threaded multipart download.
const BOTO3_THROUGH_HAPROXY: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=4)
s3.upload_file(spec["file"], "shared", "boto3/big.bin", Config=config)
s3.download_file("shared", "boto3/big.bin", spec["download_to"], Config=config)
print(json.dumps(s3.head_object(Bucket="shared", Key="boto3/big.bin")["ContentLength"]))
"#;

/// One public endpoint for a replicated deployment: two replicas on one PostgreSQL database behind the compose
/// file's HAProxy configuration, and every S3 client (aws-cli, boto3, rclone, s3cmd) using only that endpoint for
/// uploads, downloads, syncs, copies, moves and deletes, every byte checked by SHA-256; both replicas serve, and
/// neither answers a 5xx.
#[test]
fn every_s3_client_through_haproxy_in_front_of_two_replicas() {
    use crate::helpers::s3::{
        AccessKey, aws, aws_home, boto3_output, rclone, rclone_config, rclone_output, s3cmd, s3cmd_config,
    };
    let replicas = Replicas::start(2, |r| {
        r.ok(&["bucket", "create", "shared"]);
    });
    let line = replicas.ok(&["s3-key", "create", "--grant", "*:admin"]);
    let (id, secret) = line.trim().split_once(' ').unwrap();
    let key = AccessKey { id: id.into(), secret: secret.into() };
    let (haproxy, front) = haproxy_in_front_of(&replicas.servers);
    let _haproxy = Killed(haproxy);
    let endpoint = format!("http://{front}");
    // HAProxy marks a replica up after two good /readyz checks a second apart.
    let up = wait_for(HANG, || {
        std::net::TcpStream::connect(front).is_ok_and(|mut s| {
            let _ = s.write_all(b"GET /shared/none HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
            let mut head = [0u8; 12];
            std::io::Read::read(&mut s, &mut head).is_ok_and(|n| n == 12 && &head[9..12] != b"503")
        })
    });
    assert!(up, "HAProxy never sent a request to a replica");
    let dir = replicas.env.dir.path();

    // aws-cli: multipart up and down, sync both ways and with --delete, mv, rm --recursive.
    let home = dir.join("aws-home");
    aws_home(&home, &key);
    let big = test_bytes(20 << 20, 41);
    let big_path = write_file(dir, "big.bin", &big);
    aws(&home, &endpoint, &["s3", "cp", big_path.to_str().unwrap(), "s3://shared/aws/big.bin"]);
    let down = dir.join("big-down.bin");
    aws(&home, &endpoint, &["s3", "cp", "s3://shared/aws/big.bin", down.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&down).unwrap()), sha256_hex(&big));
    let tree = dir.join("tree");
    let files = [("a.txt", test_bytes(10, 42)), ("d/b c.bin", test_bytes(300_000, 43)), ("d/é.bin", test_bytes(9, 44))];
    let written = std::time::SystemTime::now() - Duration::from_secs(2);
    for (name, bytes) in &files {
        std::fs::create_dir_all(tree.join(name).parent().unwrap()).unwrap();
        std::fs::write(tree.join(name), bytes).unwrap();
        std::fs::File::options().write(true).open(tree.join(name)).unwrap().set_modified(written).unwrap();
    }
    let tree_arg = tree.to_str().unwrap();
    aws(&home, &endpoint, &["s3", "sync", tree_arg, "s3://shared/tree/"]);
    let back = dir.join("back");
    aws(&home, &endpoint, &["s3", "sync", "s3://shared/tree/", back.to_str().unwrap()]);
    for (name, bytes) in &files {
        assert_eq!(sha256_hex(&std::fs::read(back.join(name)).unwrap()), sha256_hex(bytes), "{name}");
    }
    std::fs::remove_file(tree.join("a.txt")).unwrap();
    let deleted = aws(&home, &endpoint, &["s3", "sync", "--delete", tree_arg, "s3://shared/tree/"]);
    assert!(deleted.contains("delete: s3://shared/tree/a.txt"), "{deleted}");
    aws(&home, &endpoint, &["s3", "mv", "s3://shared/aws/big.bin", "s3://shared/moved/big.bin"]);
    aws(&home, &endpoint, &["s3", "rm", "--recursive", "s3://shared/tree/"]);
    let keys: Vec<String> = replicas.objects("shared").iter().map(|o| o["key"].as_str().unwrap().to_owned()).collect();
    assert_eq!(keys, ["moved/big.bin"], "after mv and rm --recursive");

    // boto3: upload_file and download_file, multipart, four threads.
    let download = dir.join("boto3-down.bin");
    let spec = serde_json::json!({
        "endpoint": endpoint, "key": {"id": key.id, "secret": key.secret},
        "file": big_path, "download_to": download,
    });
    let size = boto3_output(&dir.join("boto3-home"), BOTO3_THROUGH_HAPROXY, &spec);
    assert_eq!(size.trim(), big.len().to_string());
    assert_eq!(sha256_hex(&std::fs::read(&download).unwrap()), sha256_hex(&big));

    // rclone: copy, check, sync, copyto, purge, with no ERROR and no --s3-no-check-bucket.
    let rclone_home = dir.join("rclone-home");
    rclone_config(&rclone_home, &key, &front.to_string(), "");
    let src = dir.join("rclone-src");
    for (name, bytes) in &files {
        std::fs::create_dir_all(src.join(name).parent().unwrap()).unwrap();
        std::fs::write(src.join(name), bytes).unwrap();
    }
    let src_arg = src.to_str().unwrap();
    rclone(&rclone_home, &["copy", src_arg, "bg:shared/rc"]);
    rclone(&rclone_home, &["check", src_arg, "bg:shared/rc"]);
    std::fs::write(src.join("a.txt"), b"changed").unwrap();
    rclone(&rclone_home, &["sync", src_arg, "bg:shared/rc"]);
    rclone(&rclone_home, &["copyto", "bg:shared/moved/big.bin", "bg:shared/rc-copy/big.bin"]);
    let got = dir.join("rclone-got.bin");
    rclone(&rclone_home, &["copyto", "bg:shared/rc-copy/big.bin", got.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&big));
    let purged = rclone_output(&rclone_home, &["purge", "bg:shared/rc"]);
    let stderr = String::from_utf8_lossy(&purged.stderr);
    assert!(purged.status.success() && !stderr.contains("ERROR"), "rclone purge: {stderr}");

    // s3cmd: mb, put, get, sync, del.
    let s3cmd_home = dir.join("s3cmd-home");
    s3cmd_config(&s3cmd_home, &key, &front.to_string());
    let s3cmd_ok = |args: &[&str]| {
        let out = s3cmd(&s3cmd_home, args);
        assert!(out.status.success(), "s3cmd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    s3cmd_ok(&["mb", "s3://made-through-haproxy"]);
    let put = test_bytes(250_000, 45);
    let put_path = write_file(dir, "s3cmd.bin", &put);
    s3cmd_ok(&["put", put_path.to_str().unwrap(), "s3://made-through-haproxy/put.bin"]);
    let got = dir.join("s3cmd-got.bin");
    s3cmd_ok(&["get", "s3://made-through-haproxy/put.bin", got.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&put));
    s3cmd_ok(&["sync", &format!("{src_arg}/"), "s3://made-through-haproxy/tree/"]);
    s3cmd_ok(&["del", "s3://made-through-haproxy/put.bin"]);
    let keys: Vec<String> =
        replicas.objects("made-through-haproxy").iter().map(|o| o["key"].as_str().unwrap().to_owned()).collect();
    assert_eq!(keys.len(), files.len(), "the synced tree, the deleted put gone: {keys:?}");

    // Both replicas served, and neither answered a server error.
    for (n, server) in replicas.servers.iter().enumerate() {
        let metrics = server.metrics();
        let served: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("blobgate_responses_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum();
        eprintln!("replica {n}: {served} responses counted");
        assert!(served > 0.0, "replica {n} served nothing through HAProxy");
        let (errors, series) = server.server_errors();
        assert!(series > 0 && errors == 0.0, "replica {n}: {errors} 5xx responses");
    }
}
