//! The PostgreSQL backend over the wire: the CLI and `serve` on a database of the test cluster
//! (`BLOBGATE_TEST_POSTGRES_URL`, which `scripts/test` sets; a missing variable fails the test), the start-up
//! errors of a bad `database.url`, and two servers adding to the same stats rows.

use std::time::Duration;

use crate::helpers::*;

/// `stats --json`, once the rows satisfy `done` (the batcher writes at least once a second) or after 30 s.
fn stats_when(env: &TestEnv, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let mut s = serde_json::Value::Null;
    wait_for(Duration::from_secs(30), || {
        s = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).expect("stats JSON");
        done(&s)
    });
    s
}

/// The id part of `bg_<id>_<secret>`.
fn token_id(token: &str) -> &str {
    token.split('_').nth(1).expect("bg_<id>_<secret>")
}

#[test]
fn the_cli_and_serve_work_on_postgres() {
    let env = TestEnv::on_postgres().by_cli();
    env.bucket("pgb", false);
    let bytes = test_bytes(300_000, 14);
    let put = env.put_bytes("pgb", "dir/blob.bin", &bytes, &[]);
    assert_eq!(put["status"], "created", "{put}");
    env.put_bytes("pgb", "dir/other.txt", b"other", &[]);
    let ls = env.ok(&["ls", "pgb", "dir/"]);
    let keys: Vec<&str> = ls.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert_eq!(keys, ["dir/blob.bin", "dir/other.txt"], "{ls}");
    assert!(ls.lines().next().unwrap().contains("\t300000\t"), "{ls}");
    assert!(env.ok(&["bucket", "list"]).contains("\"bucket\":\"pgb\""));
    assert!(!env.data_dir().join("blobgate.db").exists(), "no SQLite database beside PostgreSQL");

    let reader = env.token("pgb", "read", &[]);
    let server = env.serve();
    let path = "/pgb/dir/blob.bin";
    let got = server.get_auth(path, &reader, &[]);
    assert_eq!(got.status, 200);
    assert!(got.body == bytes, "the object comes back byte-exact");
    assert_eq!(server.get(path, &[]).status, 401, "a private bucket needs a token");

    // Tokens made and revoked by the CLI while the server runs (before the server has seen them).
    let late = env.token("pgb", "read", &[]);
    assert_eq!(server.get_auth(path, &late, &[]).status, 200);
    let revoked = env.token("pgb", "read", &[]);
    env.ok(&["token", "revoke", token_id(&revoked)]);
    assert_eq!(server.get_auth(path, &revoked, &[]).status, 401, "a revoked token is refused");
    let list = env.ok(&["token", "list"]);
    assert!(list.lines().any(|l| l.contains(token_id(&revoked)) && l.contains("revoked")), "{list}");

    // An upload through the server replaces the object; the server serves the new bytes and the old blob goes.
    let writer = env.token("pgb", "write", &[]);
    let new = test_bytes(5000, 15);
    let replaced = server.put(path, &writer, &new, &[]);
    assert!(matches!(replaced.status, 200 | 201), "{}", replaced.status);
    let got = server.get_auth(path, &reader, &[]);
    assert!(got.status == 200 && got.body == new, "the replaced object is served");
    assert!(!env.blob_path(&sha256_hex(&bytes)).exists(), "the replaced blob was removed");

    // Three downloads of blob.bin (the refused requests count for nothing).
    let s = stats_when(&env, |s| s[0]["requests"] == 3);
    let row = s.as_array().unwrap().iter().find(|r| r["key"] == "dir/blob.bin").expect("a stats row").clone();
    assert_eq!((row["bucket"].as_str(), row["requests"].as_u64()), (Some("pgb"), Some(3)), "{row}");
    assert_eq!(row["bytes_sent"].as_u64(), Some(2 * bytes.len() as u64 + new.len() as u64), "{row}");

    env.ok(&["rm", "pgb", "dir/other.txt"]);
    assert_eq!(env.ok(&["ls", "pgb"]).lines().count(), 1);
}

#[test]
fn a_bad_database_url_fails_at_start_with_one_line_naming_it() {
    let env = TestEnv::new();
    std::fs::create_dir(env.data_dir()).unwrap();
    let server = postgres_server_url();
    let (_, host_and_db) = server.rsplit_once('@').expect("user:password@host");
    let closed_port = reserved_local_addr();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let cases = [
        ("postgres://blobgate:hunter2@db:notaport/bg".to_owned(), "not a valid PostgreSQL URL"),
        (format!("postgres://blobgate:hunter2@{host_and_db}"), "password authentication failed"),
        (format!("postgresql://blobgate:hunter2@{closed_port}/bg"), &*format!("on {closed_port} as blobgate")),
        ("postgres://blobgate:hunter2@no-such-host.invalid/bg".to_owned(), "on no-such-host.invalid:5432"),
        // Accepts (the kernel does, into the backlog) and never answers: bounded by the connect timeout.
        (format!("postgres://blobgate:hunter2@{silent_addr}/bg"), "no answer within 5s"),
    ];
    for (url, reason) in &cases {
        for args in [&["bucket", "list"][..], &["bucket", "create", "b"], &["serve"]] {
            // Bounded by the connect timeout: the silent server's line says "no answer within 5s", and
            // `refused_database_url` fails a command still running after 30 s.
            let line = env.refused_database_url(args, url);
            assert!(line.contains(reason), "{args:?}: {line}");
            assert!(!line.contains("hunter2"), "the password shows: {line}");
        }
    }
}

#[test]
fn two_servers_on_one_database_lose_no_stats_increment() {
    let env = TestEnv::on_postgres();
    env.bucket("pub", true);
    let bytes = test_bytes(10_000, 16);
    env.put_bytes("pub", "hot.bin", &bytes, &[]);
    let mut servers = [env.serve(), env.serve()];
    let per_server = 60;
    std::thread::scope(|scope| {
        for server in &servers {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..per_server / 2 {
                        let r = server.get("/pub/hot.bin", &[]);
                        assert!(r.status == 200 && r.body.len() == bytes.len());
                    }
                });
            }
        }
    });
    // Stopping flushes what each server still holds.
    for server in &mut servers {
        assert_eq!(server.stop(), Some(0));
    }
    let s = stats_when(&env, |_| true);
    assert_eq!(s[0]["requests"].as_u64(), Some(2 * per_server), "{s}");
    assert_eq!(s[0]["bytes_sent"].as_u64(), Some(2 * per_server * bytes.len() as u64), "{s}");
}

#[test]
fn db_copy_moves_an_sqlite_database_to_postgres_and_refuses_a_non_empty_target() {
    let env = TestEnv::new();
    env.bucket("open", true);
    env.bucket("closed", false);
    let script = b"function f() { return 1; }\n".repeat(200);
    env.put_bytes("open", "app.js", &script, &["--precompress"]);
    let secret = test_bytes(50_000, 17);
    env.put_bytes("closed", "secret.bin", &secret, &[]);
    let reader = env.token("closed", "read", &[]);
    env.token("closed", "read", &[]);
    env.ok(&["token", "revoke", token_id(&env.token("closed", "admin", &[]))]);
    env.ok(&["signing", "rotate"]);
    let signed = env.ok(&["presign", "closed", "secret.bin"]).trim().to_owned();
    let revoked = env.ok(&["presign", "closed", "secret.bin", "--expires-in", "600"]).trim().to_owned();
    env.ok(&["signing", "revoke-url", &revoked]);
    env.ok(&["s3-key", "create", "--bucket", "closed"]);
    {
        let mut server = env.serve();
        assert_eq!(server.get("/open/app.js", &[("Accept-Encoding", "br")]).status, 200);
        assert_eq!(server.get_auth("/closed/secret.bin", &reader, &[]).status, 200);
        assert_eq!(server.stop(), Some(0));
    }
    let sqlite_stats = env.ok(&["stats", "--json"]);
    let sqlite_tokens = env.ok(&["token", "list"]);
    let sqlite_s3_keys = env.ok(&["s3-key", "list"]);

    let target = postgres_database();
    let pg = [("BLOBGATE_DATABASE_URL", target.as_str())];
    let out = env.ok(&["db", "copy", "--to", &target]);
    let report: serde_json::Value = serde_json::from_str(out.trim()).expect("db copy prints JSON");
    let copied = &report["copied"];
    for (table, rows) in [
        ("buckets", 2),
        ("objects", 2),
        ("object_variants", 2),
        ("tokens", 3),
        ("s3_keys", 1),
        ("signing_keys", 1),
        ("revoked_signatures", 1),
        ("object_stats", 2),
    ] {
        assert_eq!(copied[table], rows, "{table}: {report}");
    }
    assert!(!out.contains("blobgate@") && !out.contains(":blobgate"), "no credentials in {out}");

    // Everything reads back the same from PostgreSQL, with the same data dir.
    let on_pg = |args: &[&str]| {
        let out = env.cli_env(args, &pg);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(on_pg(&["stats", "--json"]), sqlite_stats);
    assert_eq!(on_pg(&["token", "list"]), sqlite_tokens);
    assert_eq!(on_pg(&["s3-key", "list"]), sqlite_s3_keys);
    let server = env.serve_with(&pg, &[]);
    let got = server.get_auth("/closed/secret.bin", &reader, &[]);
    assert!(got.status == 200 && got.body == secret, "the token works on PostgreSQL");
    let br = server.get("/open/app.js", &[("Accept-Encoding", "br")]);
    assert_eq!((br.status, br.header("content-encoding")), (200, Some("br")), "the variant was copied");
    assert_eq!(server.get(path_of_url(&signed), &[]).status, 200, "the sealed signing key opens");
    assert_eq!(server.get(path_of_url(&revoked), &[]).status, 401, "the revoked URL stays revoked");
    assert!(on_pg(&["bucket", "create", "new-bucket"]).contains("new-bucket"), "bucket ids continue");

    // A second copy finds the target in use: refused, and nothing changes.
    let before = (on_pg(&["bucket", "list"]), on_pg(&["ls", "closed"]), on_pg(&["token", "list"]));
    let line = env.fails(&["db", "copy", "--to", &target]);
    assert!(line.contains("not empty") && line.contains("nothing was copied"), "{line}");
    assert_eq!((on_pg(&["bucket", "list"]), on_pg(&["ls", "closed"]), on_pg(&["token", "list"])), before);
}
