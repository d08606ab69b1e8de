//! Schema migrations across releases, on SQLite and on PostgreSQL: a rollback (this binary on a database that a
//! newer release migrated) serves on; a database from another line of releases is refused in one line;
//! `db status` and `db migrate` on a fresh database; read-only commands on a database that has no schema yet.
//!
//! The number of migrations is never assumed: "the latest this binary knows" is what it recorded in
//! `_sqlx_migrations` when it migrated a fresh database.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use sha2::Digest;
use sqlx::Connection;

use crate::helpers::*;

/// `on_both_backends!(name)` runs `fn name(new_env: fn() -> TestEnv)` as the tests `name::sqlite` and
/// `name::postgres` (a fresh database on the test cluster).
macro_rules! on_both_backends {
    ($name:ident) => {
        mod $name {
            #[test]
            fn sqlite() {
                super::$name(crate::helpers::TestEnv::new)
            }

            #[test]
            fn postgres() {
                super::$name(crate::helpers::TestEnv::on_postgres)
            }
        }
    };
}

/// Runs `f` on a new connection to `env`'s database (SQLite in its data dir, or its PostgreSQL database), as an
/// operator's tool or a newer release would: the binary under test is not involved.
macro_rules! on_database {
    ($env:expr, $conn:ident => $body:expr) => {{
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            match &$env.database_url {
                Some(url) => {
                    let mut $conn = sqlx::PgConnection::connect(url).await.expect("connect to PostgreSQL");
                    let result = $body;
                    $conn.close().await.unwrap();
                    result
                }
                None => {
                    let url = format!("sqlite://{}", $env.data_dir().join("blobgate.db").display());
                    let mut $conn = sqlx::SqliteConnection::connect(&url).await.expect("open the SQLite database");
                    let result = $body;
                    $conn.close().await.unwrap();
                    result
                }
            }
        })
    }};
}

fn execute(env: &TestEnv, sql: &str) {
    on_database!(env, conn => { sqlx::raw_sql(sql).execute(&mut conn).await.unwrap_or_else(|e| panic!("{sql}: {e}")); })
}

/// The versions recorded in `_sqlx_migrations`, in order.
fn recorded_versions(env: &TestEnv) -> Vec<i64> {
    let sql = "SELECT version FROM _sqlx_migrations ORDER BY version";
    on_database!(env, conn => sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap())
}

fn description_of(env: &TestEnv, version: i64) -> String {
    let sql = format!("SELECT description FROM _sqlx_migrations WHERE version = {version}");
    on_database!(env, conn => sqlx::query_scalar(&sql).fetch_one(&mut conn).await.unwrap())
}

/// Whether the database holds any table at all.
fn has_tables(env: &TestEnv) -> bool {
    let sql = match env.database_url {
        Some(_) => "SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname = 'public'",
        None => "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
    };
    let n: i64 = on_database!(env, conn => sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap());
    n > 0
}

/// A database this binary migrated (by `bucket create`): the latest migration it knows.
fn migrated(env: &TestEnv) -> i64 {
    env.bucket("pub", true);
    *recorded_versions(env).last().expect("the migrations were recorded")
}

/// What a newer release's migration does, by the rule in docs/operations.md: a new table, and new columns with defaults on
/// tables this release reads and writes.
const NEWER_MIGRATION: &str = "CREATE TABLE future_feature (id BIGINT PRIMARY KEY, note TEXT NOT NULL DEFAULT ''); \
     ALTER TABLE buckets ADD COLUMN future_quota BIGINT NOT NULL DEFAULT 0; \
     ALTER TABLE objects ADD COLUMN future_note TEXT";

/// Records a migration as sqlx does (checksum: the SHA-384 of its SQL).
fn record_migration(env: &TestEnv, version: i64, description: &str, sql: &str) {
    let checksum = hex::encode(sha2::Sha384::digest(sql));
    let checksum = match env.database_url {
        Some(_) => format!("'\\x{checksum}'::bytea"),
        None => format!("X'{checksum}'"),
    };
    execute(
        env,
        &format!(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES ({version}, '{description}', TRUE, {checksum}, 1000)"
        ),
    );
}

/// A newer release migrated the database: its schema change, and its row in `_sqlx_migrations`.
fn simulate_newer_release(env: &TestEnv, version: i64) {
    execute(env, NEWER_MIGRATION);
    record_migration(env, version, "future feature", NEWER_MIGRATION);
}

/// A CLI command that must succeed with exactly one line on stderr, containing `warning`: its stdout.
fn ok_with_one_warning(env: &TestEnv, args: &[&str], warning: &str) -> String {
    let out = env.cli(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "blobgate {args:?} failed: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(lines.len() == 1 && lines[0].contains(warning), "blobgate {args:?}: one line naming {warning}: {stderr:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `serve`, which must refuse to start: its one stderr line. A server that starts serving fails the test at
/// once (no clock involved).
fn serve_refused(env: &TestEnv) -> String {
    let mut child = env
        .serve_command("127.0.0.1:0", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn blobgate serve");
    let mut lines = Vec::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok) {
        if line.contains("blobgate is serving") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("serve started; log: {lines:?}");
        }
        lines.push(line);
    }
    let status = child.wait().unwrap();
    assert!(!status.success() && lines.len() == 1, "serve: {status}, stderr {lines:?}");
    lines.remove(0)
}

/// `db status --json`: one object per migration.
fn status_json(env: &TestEnv) -> Vec<serde_json::Value> {
    let out = env.cli(&["db", "status", "--json"]);
    assert!(out.status.success(), "db status --json: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

fn state_of(status: &[serde_json::Value], version: i64) -> &str {
    let entry = status.iter().find(|m| m["version"] == version).unwrap_or_else(|| panic!("{version}: {status:?}"));
    entry["state"].as_str().unwrap()
}

// ---- A rollback: this binary on a database a newer release migrated ---------------------------------------------

on_both_backends!(a_rollback_serves_a_database_a_newer_release_migrated);

fn a_rollback_serves_a_database_a_newer_release_migrated(new_env: fn() -> TestEnv) {
    let env = new_env();
    let latest = migrated(&env);
    env.put_bytes("pub", "old.txt", b"stored before the upgrade", &[]);
    env.bucket("priv", false);
    let writer = env.token("priv", "write", &[]);
    let newer = latest + 1;
    simulate_newer_release(&env, newer);
    let named = format!("{newer} (future feature)");

    let mut server = env.serve();
    let log = server.log();
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains("future feature")).collect();
    assert_eq!(warnings.len(), 1, "one line names the newer migration: {log}");
    assert!(warnings[0].contains(" WARN ") && warnings[0].contains(&named), "{}", warnings[0]);
    let got = server.get("/pub/old.txt", &[]);
    assert_eq!((got.status, got.body.as_slice()), (200, &b"stored before the upgrade"[..]));
    let put = server.put("/priv/new.bin", &writer, b"uploaded after the rollback", &[]);
    assert_eq!(put.status, 201, "{}", String::from_utf8_lossy(&put.body));
    let got = server.get_auth("/priv/new.bin", &writer, &[]);
    assert_eq!((got.status, got.body.as_slice()), (200, &b"uploaded after the rollback"[..]));

    // The CLI beside it: each command says it once on stderr, and stdout is what it always is.
    ok_with_one_warning(&env, &["bucket", "create", "later", "--public"], &named);
    let file = write_file(env.dir.path(), "later.txt", b"put by the CLI");
    let put: serde_json::Value = serde_json::from_str(
        ok_with_one_warning(&env, &["put", "later", "k.txt", file.to_str().unwrap()], &named).trim(),
    )
    .unwrap();
    assert_eq!(put["status"], "created");
    let got = server.get("/later/k.txt", &[]);
    assert_eq!((got.status, got.body.as_slice()), (200, &b"put by the CLI"[..]));
    let buckets = ok_with_one_warning(&env, &["bucket", "list"], &named);
    assert_eq!(buckets.lines().count(), 3, "{buckets}");
    let ls = ok_with_one_warning(&env, &["ls", "priv", "--json"], &named);
    let listed: serde_json::Value = serde_json::from_str(ls.trim()).unwrap();
    assert_eq!(listed["key"], "new.bin");
    let stats: serde_json::Value =
        serde_json::from_str(ok_with_one_warning(&env, &["stats", "--json"], &named).trim()).unwrap();
    assert!(stats.is_array(), "{stats}");
    ok_with_one_warning(&env, &["token", "list"], &named);
    // Except `db copy`, which would leave the newer release's tables and columns behind.
    let target = format!("sqlite://{}", env.dir.path().join("copy.db").display());
    let refused = env.fails(&["db", "copy", "--to", &target]);
    assert!(refused.contains(&named) && refused.contains("cannot copy"), "{refused}");

    let status = status_json(&env);
    assert_eq!(state_of(&status, latest), "applied");
    assert_eq!(state_of(&status, newer), "newer");
    let entry = status.iter().find(|m| m["version"] == newer).unwrap();
    assert_eq!(entry["description"], "future feature");
    assert!(entry["applied_at"].is_string(), "{entry}");
    assert_eq!(server.stop(), Some(0));
    // The newer release, started again, finds its own schema as it left it.
    assert_eq!(recorded_versions(&env).last(), Some(&newer));
}

// ---- Another line of releases: refused in one line ---------------------------------------------------------------

/// Every way in refuses with the same kind of line, naming `needle` and the command that shows the history.
fn refused_everywhere(env: &TestEnv, needles: &[String]) {
    let lines = [
        ("serve", serve_refused(env)),
        ("bucket create", env.fails(&["bucket", "create", "other"])),
        ("bucket list", env.fails(&["bucket", "list"])),
        ("db migrate", env.fails(&["db", "migrate"])),
    ];
    for (what, line) in lines {
        assert!(line.starts_with("blobgate: ") && line.contains("blobgate db status"), "{what}: {line}");
        for needle in needles {
            assert!(line.contains(needle.as_str()), "{what}: {line} should name {needle}");
        }
    }
}

on_both_backends!(another_line_of_releases_is_refused_in_one_line);

fn another_line_of_releases_is_refused_in_one_line(new_env: fn() -> TestEnv) {
    // A migration of ours whose checksum differs: another build applied it.
    let env = new_env();
    let latest = migrated(&env);
    let description = description_of(&env, latest);
    execute(&env, &format!("UPDATE _sqlx_migrations SET execution_time = 7 WHERE version = {latest}"));
    let other = "SELECT 'another build'";
    let checksum = hex::encode(sha2::Sha384::digest(other));
    let literal = if env.database_url.is_some() { format!("'\\x{checksum}'::bytea") } else { format!("X'{checksum}'") };
    execute(&env, &format!("UPDATE _sqlx_migrations SET checksum = {literal} WHERE version = {latest}"));
    refused_everywhere(&env, &[format!("{latest} ({description})")]);
    assert_eq!(state_of(&status_json(&env), latest), "differs", "db status still shows the history");

    // A migration this binary does not know, below its latest: a gap in its history.
    let env = new_env();
    let latest = migrated(&env);
    let known = recorded_versions(&env);
    let gap = (1..latest).find(|v| !known.contains(v)).unwrap_or(0);
    record_migration(&env, gap, "hotfix elsewhere", "SELECT 'hotfix'");
    refused_everywhere(&env, &[format!("{gap} (hotfix elsewhere)")]);
    assert_eq!(state_of(&status_json(&env), gap), "unknown");

    // Our latest never applied, a later unknown one applied: a line of releases without ours.
    let env = new_env();
    let latest = migrated(&env);
    let description = description_of(&env, latest);
    execute(&env, &format!("DELETE FROM _sqlx_migrations WHERE version = {latest}"));
    record_migration(&env, latest + 1, "sibling branch", "SELECT 'sibling'");
    refused_everywhere(&env, &[format!("{latest} ({description})"), format!("{} (sibling branch)", latest + 1)]);
    assert!(!recorded_versions(&env).contains(&latest), "nothing was applied");
    let status = status_json(&env);
    assert_eq!((state_of(&status, latest), state_of(&status, latest + 1)), ("pending", "newer"));
}

// ---- `db status` and `db migrate` on a fresh database ------------------------------------------------------------

on_both_backends!(db_status_and_db_migrate_on_a_fresh_database);

/// One `db status` text line: version, state, applied at (`-` when pending), description.
fn status_fields(line: &str) -> (i64, &str, &str, &str) {
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields.len(), 4, "{line:?}");
    (fields[0].parse().expect("a version"), fields[1], fields[2], fields[3])
}

fn db_status_and_db_migrate_on_a_fresh_database(new_env: fn() -> TestEnv) {
    let env = &new_env();
    std::fs::create_dir(env.data_dir()).unwrap();
    // SQLite's fresh database has no file yet, PostgreSQL's no tables.
    let fresh = if env.database_url.is_some() { "has no schema yet" } else { "no database at" };
    // Before: every migration pending, said once on stderr, and nothing created.
    let out = env.cli(&["db", "status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "db status: {stderr}");
    assert!(
        stderr.lines().count() == 1 && stderr.contains(fresh) && stderr.contains("blobgate db migrate"),
        "{stderr}"
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let pending: Vec<(i64, &str, &str, &str)> = text.lines().map(status_fields).collect();
    assert!(!pending.is_empty() && pending.iter().all(|m| m.1 == "pending" && m.2 == "-"), "{text}");
    assert!(pending.windows(2).all(|w| w[0].0 < w[1].0), "in version order: {text}");
    let json = status_json(env);
    assert_eq!(json.len(), pending.len());
    for (line, (version, _, _, description)) in json.iter().zip(&pending) {
        assert_eq!((&line["version"], &line["description"]), (&(*version).into(), &(*description).into()));
        assert_eq!((&line["state"], &line["applied_at"]), (&"pending".into(), &serde_json::Value::Null), "{line}");
    }
    assert_eq!(std::fs::read_dir(env.data_dir()).unwrap().count(), 0, "db status created a file");
    if env.database_url.is_some() {
        assert!(!has_tables(env), "db status created a table");
    }

    // `db migrate` applies them all and prints each, as `db status` would.
    let migrate = env.ok(&["db", "migrate"]);
    let applied: Vec<(i64, &str, &str, &str)> = migrate.lines().map(status_fields).collect();
    assert_eq!(applied.len(), pending.len(), "{migrate}");
    for (a, p) in applied.iter().zip(&pending) {
        assert_eq!((a.0, a.1, a.3), (p.0, "applied", p.3));
        assert!(a.2.ends_with('Z'), "an RFC 3339 time: {}", a.2);
    }
    assert_eq!(recorded_versions(env), pending.iter().map(|m| m.0).collect::<Vec<_>>());

    // After: every one applied, with its time; quiet on stderr.
    let out = env.cli(&["db", "status"]);
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = String::from_utf8(out.stdout).unwrap();
    assert_eq!(after, migrate, "db status lists what db migrate applied");
    let json = status_json(env);
    assert!(json.iter().all(|m| m["state"] == "applied" && m["applied_at"].is_string()), "{json:?}");

    // Nothing pending: it says so, and stdout stays empty.
    let out = env.cli(&["db", "migrate"]);
    assert!(out.status.success());
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing pending"), "{out:?}");
    env.bucket("after", false);
    assert!(env.ok(&["bucket", "list"]).contains("\"after\""));
}

// ---- Read-only commands on a database without a schema -----------------------------------------------------------

const READ_ONLY: &[&[&str]] = &[
    &["bucket", "list"],
    &["ls", "bkt"],
    &["ls", "bkt", "--json"],
    &["stats", "--json"],
    &["stats"],
    &["token", "list"],
    &["s3-key", "list"],
    &["signing", "list"],
];

/// Each read-only command answers in one line naming what creates the schema, never with SQL's words.
fn read_only_commands_name_what_creates_the_schema(env: &TestEnv, fresh: &str) {
    for args in READ_ONLY {
        let line = env.fails(args);
        assert!(line.starts_with("blobgate: ") && line.contains(fresh), "{args:?}: {line}");
        assert!(line.contains("blobgate db migrate") && line.contains("blobgate serve"), "{args:?}: {line}");
        for sql in ["relation", "no such table", "does not exist", "error returned from database"] {
            assert!(!line.contains(sql), "{args:?}: {line}");
        }
    }
}

on_both_backends!(read_only_commands_on_a_fresh_database);

fn read_only_commands_on_a_fresh_database(new_env: fn() -> TestEnv) {
    let env = new_env();
    std::fs::create_dir(env.data_dir()).unwrap();
    let db = env.data_dir().join("blobgate.db");
    let line = match env.database_url {
        Some(_) => "has no schema yet".to_owned(),
        None => format!("no database at {}", db.display()),
    };
    read_only_commands_name_what_creates_the_schema(&env, &line);
    assert_eq!(std::fs::read_dir(env.data_dir()).unwrap().count(), 0, "a read-only command created a file");
    if env.database_url.is_some() {
        assert!(!has_tables(&env), "a read-only command created a table");
    } else {
        // An empty database file (a first start that died before migrating) is a database without a schema.
        std::fs::write(&db, b"").unwrap();
        read_only_commands_name_what_creates_the_schema(&env, "has no schema yet");
        let files: Vec<_> = std::fs::read_dir(env.data_dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(files, ["blobgate.db"]);
        assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "nothing was written");
    }
    // Once migrated, the same commands answer as on an empty database.
    env.ok(&["db", "migrate"]);
    assert_eq!(env.ok(&["bucket", "list"]), "");
    assert_eq!(env.ok(&["stats", "--json"]).trim(), "[]");
    assert!(env.fails(&["ls", "bkt"]).contains("no such bucket"));
}
