//! The command line: one-line errors with a non-zero exit for bad input (and nothing stored), the put JSON,
//! idempotent puts and imports, configuration errors that name their key or file, tokens and presign limits;
//! bucket set/delete, ls and rm (also against a running server), the missing data dir, read-only data dirs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::helpers::*;

/// Nothing was stored: no blob files and no temp files.
fn assert_nothing_stored(env: &TestEnv) {
    assert!(env.blob_files().is_empty(), "blobs stored: {:?}", env.blob_files());
    assert!(env.tmp_files().is_empty(), "temp files left: {:?}", env.tmp_files());
}

#[test]
fn bucket_create_refuses_bad_names_with_one_line() {
    let env = TestEnv::new().by_cli();
    for name in ["ab", "AB", "Abc", "a..b", "192.168.0.1", "-abc", "abc-", "a_b", "a b", &"a".repeat(64)] {
        // `--` so that clap takes "-abc" as the name, not as flags.
        let err = env.fails(&["bucket", "create", "--", name]);
        assert!(err.starts_with("blobgate: invalid bucket name"), "{name}: {err}");
    }
    assert_eq!(env.ok(&["bucket", "list"]), "", "no bucket was created");
    // The boundaries are fine.
    env.bucket("abc", false);
    env.bucket(&"a".repeat(63), true);
    let list = env.ok(&["bucket", "list"]);
    assert_eq!(list.lines().count(), 2, "{list}");
    let buckets: Vec<serde_json::Value> = list.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!((&buckets[0]["bucket"], &buckets[0]["public"]), (&"a".repeat(63).into(), &true.into()), "{list}");
    assert_eq!((&buckets[1]["bucket"], &buckets[1]["public"]), (&"abc".into(), &false.into()), "{list}");
    assert_eq!(buckets[1]["cache_control"], serde_json::Value::Null);
    assert_rfc3339(&buckets[1]["created_at"]);
}

#[test]
fn duplicate_buckets_are_an_error() {
    let env = TestEnv::new().by_cli();
    let out = env.ok(&["bucket", "create", "dup", "--public"]);
    assert_eq!(out.trim(), r#"{"bucket":"dup","public":true}"#);
    let err = env.fails(&["bucket", "create", "dup"]);
    assert!(err.contains("dup") && err.contains("already exists"), "{err}");
    // The first one is unchanged (still public).
    let list: serde_json::Value = serde_json::from_str(env.ok(&["bucket", "list"]).trim()).unwrap();
    assert_eq!((&list["bucket"], &list["public"]), (&"dup".into(), &true.into()));
}

#[test]
fn put_refuses_bad_input_and_stores_nothing() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let file = write_file(env.dir.path(), "in.bin", b"content");
    let file = file.to_str().unwrap();
    let dir = env.dir.path().to_str().unwrap();
    let missing = env.dir.path().join("missing.bin");
    let missing = missing.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["put", "nosuch", "k", file], "no such bucket"),
        (&["put", "bkt", "k", missing], "missing.bin"),
        (&["put", "bkt", "k", dir], "not a regular file"),
        (&["put", "bkt", "a/../b", file], "invalid object key"),
        (&["put", "bkt", "./b", file], "invalid object key"),
        (&["put", "bkt", "a\u{1}b", file], "invalid object key"),
        (&["put", "bkt", "", file], "invalid object key"),
        (&["put", "BKT", "k", file], "invalid bucket name"),
        (&["put", "bkt", "k", file, "--content-type", "nonsense"], "content type"),
        (&["put", "bkt", "k", file, "--cache-control", "a\u{7f}"], "cache control"),
        (&["put", "bkt", "k", file, "--content-disposition", "attachment; filename"], "content disposition"),
    ];
    for (args, needle) in cases {
        let err = env.fails(args);
        assert!(err.starts_with("blobgate: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err:?} does not mention {needle:?}");
    }
    let long_key = "k".repeat(1025);
    let err = env.fails(&["put", "bkt", &long_key, file]);
    assert!(err.contains("1024"), "{err}");
    assert_nothing_stored(&env);
}

#[test]
fn put_prints_the_contract_json_and_is_idempotent() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let bytes = test_bytes(12_345, 4);
    let sha = sha256_hex(&bytes);
    let first = env.put_bytes("bkt", "dir/page.html", &bytes, &[]);
    assert_eq!(first["bucket"], "bkt");
    assert_eq!(first["key"], "dir/page.html");
    assert_eq!(first["size"], 12_345);
    assert_eq!(first["sha256"], sha.as_str());
    assert_eq!(first["etag"], format!("\"{sha}\""));
    assert_eq!(first["content_type"], "text/html");
    assert_eq!(first["status"], "created");
    let again = env.put_bytes("bkt", "dir/page.html", &bytes, &[]);
    assert_eq!(again["status"], "unchanged");
    assert_eq!(again["etag"], first["etag"]);
    // New attributes alone rewrite the row; new content replaces the blob.
    let typed = env.put_bytes("bkt", "dir/page.html", &bytes, &["--content-type", "text/plain"]);
    assert_eq!(typed["status"], "replaced");
    assert_eq!(typed["content_type"], "text/plain");
    assert_eq!(env.blob_files(), vec![env.blob_path(&sha)]);
    let other = test_bytes(10, 5);
    let replaced = env.put_bytes("bkt", "dir/page.html", &other, &[]);
    assert_eq!(replaced["status"], "replaced");
    assert_eq!(env.blob_files(), vec![env.blob_path(&sha256_hex(&other))], "the old blob went with its last reference");
    // stdout is exactly one JSON line.
    let path = write_file(env.dir.path(), "one.bin", b"1");
    let out = env.ok(&["put", "bkt", "one", path.to_str().unwrap()]);
    assert_eq!(out.lines().count(), 1, "{out:?}");
    assert!(out.ends_with('\n'));
}

/// Lays out a tree: `a.txt`, `sub/b.bin`, `sub/deeper/c.json`, `sub/deeper/empty`, plus a symlink (skipped).
fn tree(env: &TestEnv) -> (std::path::PathBuf, Vec<(&'static str, Vec<u8>)>) {
    let root = env.dir.path().join("tree");
    let files = vec![
        ("a.txt", test_bytes(100, 1)),
        ("sub/b.bin", test_bytes(70_000, 2)),
        ("sub/deeper/c.json", test_bytes(3, 3)),
        ("sub/deeper/empty", Vec::new()),
        ("sub/twin.bin", test_bytes(100, 1)),
    ];
    for (name, bytes) in &files {
        write_file(&root, name, bytes);
    }
    std::os::unix::fs::symlink(root.join("a.txt"), root.join("sub/link.txt")).unwrap();
    (root, files)
}

#[test]
fn import_stores_a_tree_and_reimport_changes_nothing() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let (root, files) = tree(&env);
    let out = env.ok(&["import", "bkt", root.to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON summary line");
    let total: usize = files.iter().map(|(_, b)| b.len()).sum();
    assert_eq!(summary["bucket"], "bkt");
    assert_eq!(summary["files"], files.len(), "symlinks are skipped: {summary}");
    assert_eq!(summary["bytes"], total);
    assert_eq!((&summary["created"], &summary["replaced"], &summary["unchanged"]), (&5.into(), &0.into(), &0.into()));
    // a.txt and sub/twin.bin share a blob.
    assert_eq!(env.blob_files().len(), 4);

    let token = env.token("bkt", "read", &[]);
    let server = env.serve();
    let mut modified = Vec::new();
    for (key, bytes) in &files {
        let r = server.get_auth(&format!("/bkt/{key}"), &token, &[]);
        assert_eq!(r.status, 200, "{key}");
        assert!(r.body == *bytes, "{key} differs");
        modified.push(r.header("last-modified").unwrap().to_owned());
    }
    assert_eq!(server.get_auth("/bkt/sub/link.txt", &token, &[]).status, 404, "symlinks are not imported");

    // Re-import while the server runs: nothing changes, not even Last-Modified. Every write of an object row adds
    // to the change log (a trigger), so an unmoved log says no row was written, in this second or any other.
    let logged = env.last_change();
    let out = env.ok(&["import", "bkt", root.to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((&summary["created"], &summary["replaced"], &summary["unchanged"]), (&0.into(), &0.into(), &5.into()));
    assert_eq!(env.last_change(), logged, "the re-import wrote a row");
    for ((key, _), lm) in files.iter().zip(&modified) {
        let r = server.get_auth(&format!("/bkt/{key}"), &token, &[]);
        assert_eq!(r.header("last-modified"), Some(lm.as_str()), "{key}");
    }
    // With a prefix, the same tree lands under it.
    let out = env.ok(&["import", "bkt", root.to_str().unwrap(), "--prefix", "v2/"]);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["created"], 5);
    let r = server.get_auth("/bkt/v2/sub/deeper/c.json", &token, &[]);
    assert!(r.body == files[2].1);
    assert_eq!(env.blob_files().len(), 4, "same contents, same blobs");
}

#[test]
fn import_with_an_invalid_name_stores_nothing() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let root = env.dir.path().join("tree");
    write_file(&root, "good.txt", b"good");
    write_file(&root, "zz/bad\u{1}name", b"bad");
    let err = env.fails(&["import", "bkt", root.to_str().unwrap()]);
    assert!(err.contains("invalid object key"), "{err}");
    assert_nothing_stored(&env);
    // Not a directory, or an unknown bucket: errors too.
    let err = env.fails(&["import", "bkt", root.join("good.txt").to_str().unwrap()]);
    assert!(err.contains("not a directory"), "{err}");
    let err = env.fails(&["import", "nosuch", root.to_str().unwrap()]);
    assert!(err.contains("no such bucket"), "{err}");
    assert_nothing_stored(&env);
}

#[test]
fn configuration_errors_name_their_file_or_key() {
    let env = TestEnv::new().by_cli();
    let missing = env.dir.path().join("missing.toml");
    let err = env.fails(&["--config", missing.to_str().unwrap(), "bucket", "list"]);
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_CONFIG", missing.to_str().unwrap())]);
    assert!(one_line_error(&out, &["BLOBGATE_CONFIG"]).contains("missing.toml"));

    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_LIMITS__MAX_HEADERS", "abc")]);
    let err = one_line_error(&out, &["BLOBGATE_LIMITS__MAX_HEADERS=abc"]);
    assert!(err.contains("limits.max_headers"), "{err}");
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_LIMITS__MAX_HEADERS", "3")]);
    assert!(one_line_error(&out, &["BLOBGATE_LIMITS__MAX_HEADERS=3"]).contains("limits.max_headers"));
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_TIMEOUTS__HEADER_READ", "soon")]);
    assert!(one_line_error(&out, &["BLOBGATE_TIMEOUTS__HEADER_READ=soon"]).contains("timeouts.header_read"));

    let bad = write_file(env.dir.path(), "bad.toml", b"[limits]\nmax_header = 5\n");
    let err = env.fails(&["--config", bad.to_str().unwrap(), "bucket", "list"]);
    assert!(err.contains("max_header"), "{err}");
    // A good file applies (and is overridden by the environment).
    let good = write_file(env.dir.path(), "good.toml", b"[auth]\npresign_max_lifetime = \"1h\"\n");
    env.bucket("bkt", false);
    let config = good.to_str().unwrap();
    let err = env.fails(&["--config", config, "presign", "bkt", "k", "--expires-in", "3601"]);
    assert!(err.contains("3600"), "{err}");
    env.ok(&["--config", config, "presign", "bkt", "k", "--expires-in", "3600"]);
}

#[test]
fn token_create_refuses_bad_input() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let cases: &[(&[&str], &str)] = &[
        (&["token", "create", "--bucket", "nosuch"], "no such bucket"),
        (&["token", "create", "--bucket", "BKT"], "invalid bucket name"),
        (&["token", "create", "--bucket", "bkt", "--scope", "root"], "invalid scope"),
        (&["token", "create", "--bucket", "bkt", "--expires-in", "0"], "--expires-in"),
        (&["token", "create", "--bucket", "bkt", "--prefix", "a/../"], "invalid prefix"),
    ];
    for (args, needle) in cases {
        let err = env.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    assert_eq!(env.ok(&["token", "list"]), "", "no token was created");
    let token = env.token("bkt", "write", &["--prefix", "in/", "--expires-in", "60"]);
    assert_eq!(token.lines().count(), 1);
    let list = env.ok(&["token", "list"]);
    let json: serde_json::Value = serde_json::from_str(list.trim()).unwrap();
    assert_eq!((&json["bucket"], &json["prefix"], &json["scope"]), (&"bkt".into(), &"in/".into(), &"write".into()));
    // Times are RFC 3339, like every time the CLI prints.
    let expires = assert_rfc3339(&json["expires_at"]).duration_since(assert_rfc3339(&json["created_at"])).unwrap();
    assert_eq!(expires, Duration::from_secs(60));
    assert_eq!(json["revoked_at"], serde_json::Value::Null);
    env.ok(&["token", "revoke", &token]);
    let json: serde_json::Value = serde_json::from_str(env.ok(&["token", "list"]).trim()).unwrap();
    assert_rfc3339(&json["revoked_at"]);
    let key: serde_json::Value = serde_json::from_str(env.ok(&["signing", "rotate"]).trim()).unwrap();
    assert_rfc3339(&key["created_at"]);
    env.ok(&["signing", "retire", key["key_id"].as_str().unwrap()]);
    let key: serde_json::Value = serde_json::from_str(env.ok(&["signing", "list"]).trim()).unwrap();
    assert_rfc3339(&key["retired_at"]);
}

#[test]
fn presign_refuses_bad_input() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let week = (7 * 24 * 3600).to_string();
    let over = (7 * 24 * 3600 + 1).to_string();
    let cases: &[(&[&str], &str)] = &[
        (&["presign", "bkt", "k", "--expires-in", &over], "auth.presign_max_lifetime"),
        (&["presign", "bkt", "k", "--expires-in", "0"], "--expires-in"),
        (&["presign", "nosuch", "k"], "no such bucket"),
        (&["presign", "bkt", "a/../b"], "invalid object key"),
        (&["presign", "bkt", "k", "--base-url", "ftp://h"], "--base-url"),
    ];
    for (args, needle) in cases {
        let err = env.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    let url = env.ok(&["presign", "bkt", "k", "--expires-in", &week]);
    assert_eq!(url.lines().count(), 1);
    assert!(url.starts_with("http://127.0.0.1:8080/bkt/k?bg-expires="), "default base URL: {url}");
}

#[test]

fn argument_errors_are_one_line_too() {
    // The contract: "Every command exits non-zero with a one-line error on stderr for bad input."
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    for args in [
        &["presign", "bkt", "k", "--expires-in", "abc"][..],
        &["token", "create", "--bucket", "bkt", "--expires-in", "-1"],
        &["serve", "--listen", "nope"],
        &["put", "bkt"],
        &["frobnicate"],
    ] {
        env.fails(args);
    }
}

#[test]

fn auth_settings_can_be_set_from_the_environment() {
    // config/default.toml: "Precedence: command-line flags > BLOBGATE_* environment > this file > built-in defaults."
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let lifetime = [("BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME", "1h")];
    let out = env.cli_env(&["presign", "bkt", "k", "--expires-in", "7200"], &lifetime);
    let err = one_line_error(&out, &["presign with BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME=1h"]);
    assert!(err.contains("auth.presign_max_lifetime"), "{err}");
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME", "soon")]);
    let err = one_line_error(&out, &["BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME=soon"]);
    assert!(err.contains("auth.presign_max_lifetime"), "{err}");
}

/// Parses an RFC 3339 time the CLI printed (and so asserts it is one).
fn assert_rfc3339(value: &serde_json::Value) -> SystemTime {
    let text = value.as_str().unwrap_or_else(|| panic!("not a time string: {value}"));
    humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("{text:?} is not RFC 3339: {e}"))
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}"))).collect()
}

#[test]
fn help_describes_every_argument_and_no_empty_env() {
    let env = TestEnv::new().by_cli();
    let top = env.ok(&["--help"]);
    assert!(top.contains("[env: BLOBGATE_CONFIG]"), "{top}");
    assert!(!top.contains("=]"), "an empty env value is printed: {top}");
    // The arguments the trial found bare: each line names the argument and then describes it.
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["put", "--help"],
            &["<BUCKET>", "<KEY>", "<FILE>", "--content-type", "--cache-control", "--content-disposition"],
        ),
        (&["bucket", "create", "--help"], &["<NAME>", "--public"]),
        (&["bucket", "set", "--help"], &["<NAME>", "--public", "--private", "--cache-control"]),
        (&["token", "create", "--help"], &["--bucket"]),
        (&["stats", "--help"], &["--bucket"]),
        (&["ls", "--help"], &["<BUCKET>", "[PREFIX]", "--json", "--page-size"]),
        (&["rm", "--help"], &["<BUCKET>", "<KEY>"]),
    ];
    for (args, names) in cases {
        let help = env.ok(args);
        for name in *names {
            let line = help.lines().find(|l| l.trim_start().starts_with(name) || l.contains(&format!(", {name}")));
            let line = line.unwrap_or_else(|| panic!("{args:?}: no line for {name}:\n{help}"));
            let after = line.trim_start().split_once("  ").map(|(_, rest)| rest.trim()).unwrap_or("");
            assert!(!after.is_empty(), "{args:?}: {name} has no description: {line:?}");
        }
        assert!(!help.contains("=]"), "{args:?}: {help}");
    }
}

#[test]
fn a_missing_data_dir_is_an_error_naming_it_and_nothing_is_created() {
    let env = TestEnv::new().by_cli();
    let data = env.data_dir();
    let file = write_file(env.dir.path(), "f.txt", b"f");
    let file = file.to_str().unwrap();
    let tree = env.dir.path().to_str().unwrap();
    let commands: &[&[&str]] = &[
        &["bucket", "list"],
        &["bucket", "set", "bkt", "--public"],
        &["bucket", "delete", "bkt"],
        &["ls", "bkt"],
        &["rm", "bkt", "k"],
        &["put", "bkt", "k", file],
        &["import", "bkt", tree],
        &["stats", "--json"],
        &["token", "list"],
        &["token", "create", "--bucket", "bkt"],
        &["token", "revoke", "bg_0123456789ab_x"],
        &["presign", "bkt", "k"],
        &["signing", "list"],
        &["signing", "rotate"],
        &["uploads", "list"],
        &["uploads", "abort", "bkt", "k", "0123"],
    ];
    let expected = format!("blobgate: data dir {} does not exist", data.display());
    for args in commands {
        let err = env.fails(args);
        assert!(err.starts_with(&expected), "{args:?}: {err}");
        assert!(!data.exists(), "{args:?} created the data dir");
    }
    // Run from the wrong directory with the default `./data`: the message names the absolute path it looked at.
    let out = Command::new(BIN)
        .args(["bucket", "list"])
        .current_dir(env.dir.path())
        .env_remove("BLOBGATE_CONFIG")
        .env_remove("BLOBGATE_DATA_DIR")
        .output()
        .unwrap();
    let err = one_line_error(&out, &["bucket list from the wrong directory"]);
    assert!(err.contains(&format!("{}/data does not exist", env.dir.path().display())), "{err}");
    assert!(!data.exists());
    // A file where the dir should be.
    std::fs::write(&data, b"").unwrap();
    assert!(env.fails(&["ls", "bkt"]).contains("is not a directory"));
    std::fs::remove_file(&data).unwrap();
    // An empty dir: read-only commands name the database they did not find, and create nothing.
    std::fs::create_dir(&data).unwrap();
    let err = env.fails(&["bucket", "list"]);
    assert!(err.contains(&format!("no database at {}", data.join("blobgate.db").display())), "{err}");
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    std::fs::remove_dir(&data).unwrap();
    // `bucket create` starts a data dir (so does `serve`).
    env.bucket("bkt", false);
    assert!(data.join("blobgate.db").is_file());
    assert_eq!(env.ok(&["ls", "bkt"]), "");
}

#[test]
fn ls_lists_every_object_in_key_order_across_pages() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    env.bucket("other", false);
    let root = env.dir.path().join("tree");
    // Neighbours of the prefix `a/` on both sides, non-ASCII, and more keys than several pages.
    let mut keys: Vec<String> = vec!["a/x.html".into(), "a/é.txt".into(), "a0".into(), "b".into(), "é".into()];
    keys.extend((0..7).map(|i| format!("a/{i}")));
    for (i, key) in keys.iter().enumerate() {
        write_file(&root, key, &test_bytes(i + 1, i as u64));
    }
    // Whole seconds, as `ls` prints them.
    let secs = |t: SystemTime| t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let before = secs(SystemTime::now());
    env.ok(&["import", "bkt", root.to_str().unwrap()]);
    let after = secs(SystemTime::now());
    // `a` beside `a/…` cannot be a file in the tree.
    env.put_bytes("bkt", "a", b"a", &[]);
    env.put_bytes("bkt", "typed", b"t", &["--content-type", "text/x-typed", "--cache-control", "max-age=5"]);
    env.put_bytes("other", "a/0", b"not bkt's", &[]);
    keys.extend(["a".into(), "typed".into()]);
    keys.sort();

    let listed = |args: &[&str]| -> Vec<String> {
        env.ok(args).lines().map(|l| l.split('\t').next().unwrap().to_owned()).collect()
    };
    // Page sizes below, at and above the count give the same listing, in byte order.
    for page in ["1", "2", "3", "14", "1000"] {
        assert_eq!(listed(&["ls", "bkt", "--page-size", page]), keys, "page size {page}");
    }
    let under_a: Vec<String> = keys.iter().filter(|k| k.starts_with("a/")).cloned().collect();
    assert_eq!(under_a.len(), 9);
    assert_eq!(listed(&["ls", "bkt", "a/", "--page-size", "2"]), under_a);
    assert_eq!(listed(&["ls", "bkt", "é"]), ["é"]);
    assert!(listed(&["ls", "bkt", "zz"]).is_empty());

    // A text line: key, size, ETag, content type, updated (tab-separated).
    let out = env.ok(&["ls", "bkt", "a/x.html"]);
    let fields: Vec<&str> = out.trim_end().split('\t').collect();
    let bytes = std::fs::read(root.join("a/x.html")).unwrap();
    assert_eq!(fields.len(), 5, "{out:?}");
    assert_eq!(fields[0], "a/x.html");
    assert_eq!(fields[1], bytes.len().to_string());
    assert_eq!(fields[2], format!("\"{}\"", sha256_hex(&bytes)));
    assert_eq!(fields[3], "text/html");
    // Stored by the import: its time is the import's, however long the import took.
    let updated = secs(humantime::parse_rfc3339(fields[4]).expect("RFC 3339"));
    assert!((before..=after).contains(&updated), "updated {updated}, imported between {before} and {after}");

    // --json: one object per line, across pages too.
    let json = json_lines(&env.ok(&["ls", "bkt", "--json", "--page-size", "4"]));
    assert_eq!(json.iter().map(|o| o["key"].as_str().unwrap()).collect::<Vec<_>>(), keys);
    let typed = json.iter().find(|o| o["key"] == "typed").unwrap();
    assert_eq!(typed["size"], 1);
    assert_eq!(typed["sha256"], sha256_hex(b"t"));
    assert_eq!(typed["etag"], format!("\"{}\"", sha256_hex(b"t")));
    assert_eq!(typed["content_type"], "text/x-typed");
    assert_eq!(typed["cache_control"], "max-age=5");
    assert_rfc3339(&typed["updated_at"]);
    assert_rfc3339(&typed["created_at"]);

    for (args, needle) in [
        (&["ls", "nosuch"][..], "no such bucket"),
        (&["ls", "BKT"], "invalid bucket name"),
        (&["ls", "bkt", "--page-size", "0"], "page-size"),
    ] {
        let err = env.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn bucket_set_and_rm_reach_a_running_server_at_its_next_request() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "plain", b"plain", &[]);
    env.put_bytes("bkt", "own", b"own", &["--cache-control", "max-age=60"]);
    let token = env.token("bkt", "read", &[]);
    let server = env.serve();
    let cache_control = |key: &str| {
        let r = server.get_auth(&format!("/bkt/{key}"), &token, &[]);
        assert_eq!(r.status, 200, "{key}");
        r.header("cache-control").map(str::to_owned)
    };
    // Warm the server's caches first, so the changes below must evict them.
    // A private bucket's responses always say `private` (shared caches must not keep them).
    assert_eq!(cache_control("plain").as_deref(), Some("private"));
    assert_eq!(cache_control("own").as_deref(), Some("private, max-age=60"));
    assert_eq!(server.get("/bkt/plain", &[]).status, 401);

    let set = json_lines(&env.ok(&["bucket", "set", "bkt", "--cache-control", "max-age=300, immutable"]));
    assert_eq!((&set[0]["bucket"], &set[0]["public"]), (&"bkt".into(), &false.into()));
    assert_eq!(set[0]["cache_control"], "max-age=300, immutable");
    assert_eq!(
        cache_control("plain").as_deref(),
        Some("private, max-age=300, immutable"),
        "the default applies at once"
    );
    assert_eq!(cache_control("own").as_deref(), Some("private, max-age=60"), "an object's own value wins");
    let head = server.request("HEAD", "/bkt/plain", &[("Authorization", &format!("Bearer {token}"))]);
    assert_eq!(head.header("cache-control"), Some("private, max-age=300, immutable"));

    env.ok(&["bucket", "set", "bkt", "--public"]);
    assert_eq!(server.get("/bkt/plain", &[]).status, 200, "public at once");
    assert_eq!(cache_control("plain").as_deref(), Some("max-age=300, immutable"), "a public bucket's value as set");
    let list = json_lines(&env.ok(&["bucket", "list"]));
    assert_eq!((&list[0]["public"], &list[0]["cache_control"]), (&true.into(), &"max-age=300, immutable".into()));
    env.ok(&["bucket", "set", "bkt", "--private", "--cache-control", ""]);
    assert_eq!(server.get("/bkt/plain", &[]).status, 401, "private at once");
    assert_eq!(cache_control("plain").as_deref(), Some("private"), "the default is gone");

    for (args, needle) in [
        (&["bucket", "set", "bkt"][..], "--public"),
        (&["bucket", "set", "bkt", "--public", "--private"], "--private"),
        (&["bucket", "set", "nosuch", "--public"], "no such bucket"),
        (&["bucket", "set", "bkt", "--cache-control", "a\u{7f}"], "cache control"),
    ] {
        let err = env.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }

    // Read-only commands beside a running server read its live WAL.
    env.put_bytes("bkt", "late", b"late", &[]);
    let listed = env.ok(&["ls", "bkt"]);
    assert_eq!(listed.lines().map(|l| l.split('\t').next().unwrap()).collect::<Vec<_>>(), ["late", "own", "plain"]);

    let sha = sha256_hex(b"plain");
    let out = env.cli(&["rm", "bkt", "plain"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r = server.get_auth("/bkt/plain", &token, &[]);
    assert_eq!(r.status, 404, "deleted objects are gone at the next request");
    assert!(!env.blob_path(&sha).exists(), "its blob went with its last reference");
    assert_eq!(cache_control("own").as_deref(), Some("private, max-age=60"), "other objects are untouched");
    for (args, needle) in [
        (&["rm", "bkt", "plain"][..], "no such object"),
        (&["rm", "nosuch", "k"], "no such bucket"),
        (&["rm", "bkt", "a/../b"], "invalid object key"),
    ] {
        let err = env.fails(args);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn bucket_delete_is_refused_while_objects_remain_and_force_removes_everything() {
    let env = TestEnv::new().by_cli();
    env.bucket("doomed", false);
    env.bucket("kept", false);
    let shared = test_bytes(1000, 1);
    let own = test_bytes(1000, 2);
    env.put_bytes("doomed", "shared", &shared, &[]);
    env.put_bytes("doomed", "own", &own, &[]);
    env.put_bytes("doomed", "own-twin", &own, &[]);
    env.put_bytes("kept", "shared", &shared, &[]);
    let doomed_token = env.token("doomed", "read", &[]);
    let kept_token = env.token("kept", "read", &[]);
    let server = env.serve();
    assert_eq!(server.get_auth("/doomed/own", &doomed_token, &[]).status, 200);

    let err = env.fails(&["bucket", "delete", "doomed"]);
    assert!(err.contains("3 objects") && err.contains("--force"), "{err}");
    assert_eq!(server.get_auth("/doomed/own", &doomed_token, &[]).status, 200, "refused: nothing changed");
    assert_eq!(env.ok(&["ls", "doomed"]).lines().count(), 3);

    // A download whose stats are still in the server's batch when the bucket goes.
    assert_eq!(server.get_auth("/doomed/shared", &doomed_token, &[]).status, 200);
    let out = json_lines(&env.ok(&["bucket", "delete", "doomed", "--force"]));
    let deleted =
        serde_json::json!({ "bucket": "doomed", "deleted_objects": 3, "deleted_tokens": 1, "aborted_uploads": 0 });
    assert_eq!(out[0], deleted);
    // The running server: the bucket, its objects and its token are gone at the next request.
    let r = server.get_auth("/doomed/own", &doomed_token, &[]);
    assert_eq!(r.status, 401, "its token went with it");
    assert_eq!(r.json()["message"], "invalid token");
    assert_eq!(server.get_auth("/kept/shared", &kept_token, &[]).status, 200);
    assert_eq!(
        env.blob_files(),
        vec![env.blob_path(&sha256_hex(&shared))],
        "only the blob another bucket uses is left"
    );
    let buckets = json_lines(&env.ok(&["bucket", "list"]));
    assert_eq!(buckets.iter().map(|b| b["bucket"].as_str().unwrap()).collect::<Vec<_>>(), ["kept"]);
    assert_eq!(json_lines(&env.ok(&["token", "list"])).len(), 1);
    // The stats batcher keeps writing (rows of the deleted bucket are dropped, not retried forever).
    let wrote = wait_for(Duration::from_secs(30), || {
        let stats: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
        let rows = stats.as_array().unwrap();
        rows.iter().any(|r| r["bucket"] == "kept" && r["requests"] == 1)
    });
    assert!(wrote, "stats were not written after the delete; log:\n{}", server.log());
    let stats: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
    assert!(stats.as_array().unwrap().iter().all(|r| r["bucket"] != "doomed"), "{stats}");

    // Deleting again, or an unknown bucket, is an error; an empty bucket needs no --force.
    assert!(env.fails(&["bucket", "delete", "doomed"]).contains("no such bucket"));
    env.bucket("empty", false);
    let out = json_lines(&env.ok(&["bucket", "delete", "empty"]));
    assert_eq!(out[0]["deleted_objects"], 0);
    // A new bucket of the same name starts clean: no objects, no tokens, no stats.
    env.bucket("doomed", true);
    assert_eq!(env.ok(&["ls", "doomed"]), "");
    assert_eq!(server.get("/doomed/own", &[]).status, 404);
}

/// Every path under `dir` (directories included) with its size and modification time.
fn snapshot(dir: &Path) -> Vec<(PathBuf, u64, SystemTime)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for entry in std::fs::read_dir(&d).unwrap().map(Result::unwrap) {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                pending.push(entry.path());
            }
            out.push((entry.path(), meta.len(), meta.modified().unwrap()));
        }
    }
    let meta = std::fs::metadata(dir).unwrap();
    out.push((dir.to_path_buf(), meta.len(), meta.modified().unwrap()));
    out.sort();
    out
}

/// `chattr -R +i` for the guard's life: not even root can create, change or delete anything under it.
struct Immutable(PathBuf);

impl Immutable {
    fn set(dir: &Path) -> Self {
        let status = Command::new("chattr")
            .args(["-R", "+i"])
            .arg(dir)
            .status()
            .expect("this test needs chattr (Debian package e2fsprogs; scripts/test installs it)");
        assert!(status.success(), "chattr +i failed: this test needs a filesystem with the immutable attribute");
        Self(dir.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").args(["-R", "-i"]).arg(&self.0).status();
    }
}

#[test]
fn read_only_commands_create_nothing_and_work_on_a_read_only_data_dir() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", true);
    env.put_bytes("bkt", "dir/a.txt", b"a", &[]);
    env.put_bytes("bkt", "b.bin", b"b", &[]);
    env.token("bkt", "read", &[]);
    env.ok(&["signing", "rotate"]);
    let mut server = env.serve();
    assert_eq!(server.get("/bkt/b.bin", &[]).status, 200);
    let counted = wait_for(Duration::from_secs(30), || env.ok(&["stats", "--json"]).contains("b.bin"));
    assert!(counted, "the download was not counted");
    assert_eq!(server.stop(), Some(0));

    let read_only: &[&[&str]] = &[
        &["bucket", "list"],
        &["ls", "bkt"],
        &["ls", "bkt", "dir/", "--json"],
        &["stats", "--json"],
        &["stats"],
        &["token", "list"],
        &["signing", "list"],
    ];
    let expected: Vec<String> = read_only.iter().map(|args| env.ok(args)).collect();
    assert!(expected.iter().all(|out| !out.is_empty()), "{expected:?}");

    // A copy of the data dir, as a stopped server left it: no -wal or -shm file.
    let copy = TestEnv::new().by_cli();
    let status = Command::new("cp").arg("-a").arg(env.data_dir()).arg(copy.data_dir()).status().unwrap();
    assert!(status.success());
    let names: Vec<String> = std::fs::read_dir(copy.data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.ends_with("-wal") || n.ends_with("-shm")), "{names:?}");

    // Writable (and the tests run as root, whom permissions do not stop): still nothing is created or touched,
    // not even the -wal and -shm files SQLite makes for a read-only connection that is not `immutable`.
    let before = snapshot(&copy.data_dir());
    for (args, want) in read_only.iter().zip(&expected) {
        assert_eq!(&copy.ok(args), want, "{args:?}");
    }
    assert_eq!(snapshot(&copy.data_dir()), before, "a read-only command changed the data dir");

    // Immutable: the same commands work; writes fail with one line, and nothing changes.
    let _guard = Immutable::set(&copy.data_dir());
    assert!(std::fs::write(copy.data_dir().join("probe"), b"").is_err(), "the data dir is still writable");
    for (args, want) in read_only.iter().zip(&expected) {
        assert_eq!(&copy.ok(args), want, "{args:?} on a read-only data dir");
    }
    assert_eq!(copy.ok(&["uploads", "list"]), "", "uploads list reads only (there are none here)");
    for args in [&["bucket", "create", "new"][..], &["rm", "bkt", "b.bin"], &["token", "create", "--bucket", "bkt"]] {
        copy.fails(args);
    }
    assert_eq!(snapshot(&copy.data_dir()), before, "the read-only data dir changed");
}

/// `--database-url` (or `BLOBGATE_DATABASE_URL`) puts the metadata where it names, for the CLI and the server
/// alike.
#[test]
fn the_database_url_names_where_the_metadata_lives() {
    let env = TestEnv::new().by_cli();
    let db = env.dir.path().join("elsewhere").join("meta.db");
    std::fs::create_dir(db.parent().unwrap()).unwrap();
    let url = format!("sqlite://{}", db.display());
    env.ok(&["--database-url", &url, "bucket", "create", "pub", "--public"]);
    assert!(db.is_file(), "the database is where the URL says");
    assert!(!env.data_dir().join("blobgate.db").exists(), "no database in the data dir");
    let file = write_file(env.dir.path(), "k.txt", b"kept elsewhere");
    let out = env.cli_env(&["put", "pub", "k.txt", file.to_str().unwrap()], &[("BLOBGATE_DATABASE_URL", &url)]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = env.fails(&["ls", "pub"]);
    assert!(err.starts_with("blobgate: no database at"), "without the URL the default is used: {err}");

    let server = env.serve_with(&[("BLOBGATE_DATABASE__URL", &url)], &[]);
    let r = server.get("/pub/k.txt", &[]);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"kept elsewhere"[..]));
    drop(server);

    // PostgreSQL URLs are taken; where nothing answers, one line names where it looked, never the password.
    for (url, target) in [
        ("postgres://user:secret@db.invalid:5432/bg", "PostgreSQL database bg on db.invalid:5432 as user"),
        (
            "postgresql://user:secret@db/bg?host=/nonexistent/run",
            "PostgreSQL database bg on /nonexistent/run:5432 as user",
        ),
    ] {
        let expected = format!("blobgate: database.url: cannot connect to {target}: ");
        let err = env.fails(&["--database-url", url, "bucket", "list"]);
        assert!(err.starts_with(&expected) && !err.contains("secret"), "{err}");
        let serve =
            env.cli(&["--database-url", url, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        let err = one_line_error(&serve, &["serve"]);
        assert!(err.starts_with(&expected) && !err.contains("secret"), "{err}");
    }
    let err = env.fails(&["--database-url", "mysql://db/bg", "bucket", "list"]);
    assert!(err.starts_with("blobgate: database.url must be sqlite://PATH or postgres://"), "{err}");
}

fn brotli_of(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::BrotliCompress(&mut &bytes[..], &mut out, &brotli::enc::BrotliEncoderParams::default()).unwrap();
    out
}

fn gzip_of(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn put_and_import_precompress_text_and_take_sidecars_as_variants() {
    let env = TestEnv::new().by_cli();
    env.bucket("bkt", false);
    let script = "export function greet(name) { return `hello, ${name}`; }\n".repeat(300).into_bytes();
    let put = env.put_bytes("bkt", "app.js", &script, &["--precompress"]);
    assert_eq!(put["variants"], serde_json::json!(["br", "gzip"]), "{put}");
    assert_eq!(put["sha256"], sha256_hex(&script).as_str(), "the object is still the original bytes");
    assert_eq!(env.blob_files().len(), 3);
    let plain = env.put_bytes("bkt", "app.js", &script, &[]);
    assert_eq!(plain["variants"], serde_json::json!([]), "a put without the flag leaves none");
    assert_eq!(env.blob_files(), vec![env.blob_path(&sha256_hex(&script))], "the old variants' blobs went");
    // Not text-like, or not smaller: no variant.
    let png = env.put_bytes("bkt", "logo.png", &script, &["--precompress"]);
    assert_eq!(png["variants"], serde_json::json!([]));
    let tiny = env.put_bytes("bkt", "tiny.css", b"a", &["--precompress"]);
    assert_eq!(tiny["variants"], serde_json::json!([]));

    // Import: a good br sidecar is a variant, a gz sidecar of other content is refused with a warning, and a .gz
    // without a base file is an object of its own.
    let root = env.dir.path().join("site");
    let styles = "body { color: #333; margin: 0 auto; }\n".repeat(200).into_bytes();
    let br = brotli_of(&styles);
    write_file(&root, "css/site.css", &styles);
    write_file(&root, "css/site.css.br", &br);
    write_file(&root, "css/site.css.gz", &gzip_of(b"stale content"));
    let lone = gzip_of(&styles);
    write_file(&root, "dl/archive.tar.gz", &lone);
    let out = env.cli(&["import", "bkt", root.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("site.css.gz is not gzip of"), "{stderr}");
    let summary: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(summary["files"], 2, "the sidecars are not objects: {summary}");
    let keys = env.ok(&["ls", "bkt", "css/"]);
    assert_eq!(keys.lines().count(), 1, "{keys}");
    assert!(env.blob_path(&sha256_hex(&br)).is_file(), "the br sidecar is stored as a variant");
    assert!(env.ok(&["ls", "bkt", "dl/"]).contains("dl/archive.tar.gz"));
    let before = env.blob_files().len();
    // With --precompress the coding no good sidecar gave is made; the sidecar's br stays as it was.
    let out = env.cli(&["import", "bkt", root.to_str().unwrap(), "--precompress"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(env.blob_files().len(), before + 1, "a gzip variant was made for site.css");
    assert!(env.blob_path(&sha256_hex(&br)).is_file());
    // `ls --json` names each object's variants, page by page (a page of one here).
    let listed: Vec<serde_json::Value> = env
        .ok(&["ls", "bkt", "--json", "--page-size", "1"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let variants = |key: &str| listed.iter().find(|o| o["key"] == key).map(|o| o["variants"].clone());
    assert_eq!(variants("css/site.css"), Some(serde_json::json!(["br", "gzip"])), "{listed:?}");
    assert_eq!(variants("dl/archive.tar.gz"), Some(serde_json::json!([])), "{listed:?}");
}

/// A `serve` that fails to start leaves no data dir behind that it created (a mistyped `--data-dir` beside an
/// address in use or an unreachable database), so the corrected start does not find an empty one.
#[test]
fn a_failed_serve_leaves_no_data_dir_it_created() {
    let env = TestEnv::new().by_cli();
    let wrong = env.dir.path().join("typo-data");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let unreachable = format!("postgres://u:p@{}/db", reserved_local_addr());
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: [Case; 3] = [
        (&["--listen", &taken, "--admin-listen", "127.0.0.1:0"], &[], "(listen)"),
        (&["--listen", "127.0.0.1:0", "--admin-listen", &taken], &[], "(admin_listen)"),
        (
            &["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
            &[("BLOBGATE_DATABASE_URL", &unreachable)],
            "database.url",
        ),
    ];
    for (args, vars, names) in cases {
        let mut cmd = std::process::Command::new(BIN);
        cmd.arg("--data-dir").arg(&wrong).arg("serve").args(args).current_dir(env.dir.path());
        cmd.env_remove("BLOBGATE_CONFIG").env_remove("BLOBGATE_DATABASE_URL").envs(vars.iter().copied());
        let out = run_until_exit(cmd, std::time::Duration::from_secs(30));
        assert!(!out.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(names), "{args:?}: {stderr}");
        assert!(!wrong.exists(), "{args:?} left {} behind", wrong.display());
    }
}
