//! The command line: one-line errors with a non-zero exit for bad input (and nothing stored), the put JSON,
//! idempotent puts and imports, configuration errors that name their key or file, tokens and presign limits.

use std::time::Duration;

use crate::helpers::*;

/// Nothing was stored: no blob files and no temp files.
fn assert_nothing_stored(env: &TestEnv) {
    assert!(env.blob_files().is_empty(), "blobs stored: {:?}", env.blob_files());
    assert!(env.tmp_files().is_empty(), "temp files left: {:?}", env.tmp_files());
}

#[test]
fn bucket_create_refuses_bad_names_with_one_line() {
    let env = TestEnv::new();
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
    assert!(list.contains(r#"{"bucket":"abc","public":false}"#), "{list}");
    assert!(list.contains(&format!(r#"{{"bucket":"{}","public":true}}"#, "a".repeat(63))), "{list}");
}

#[test]
fn duplicate_buckets_are_an_error() {
    let env = TestEnv::new();
    let out = env.ok(&["bucket", "create", "dup", "--public"]);
    assert_eq!(out.trim(), r#"{"bucket":"dup","public":true}"#);
    let err = env.fails(&["bucket", "create", "dup"]);
    assert!(err.contains("dup") && err.contains("already exists"), "{err}");
    // The first one is unchanged (still public).
    assert_eq!(env.ok(&["bucket", "list"]).trim(), r#"{"bucket":"dup","public":true}"#);
}

#[test]
fn put_refuses_bad_input_and_stores_nothing() {
    let env = TestEnv::new();
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
    let env = TestEnv::new();
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
    let env = TestEnv::new();
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

    // Re-import while the server runs, a second later: nothing changes, not even Last-Modified.
    std::thread::sleep(Duration::from_millis(1100));
    let out = env.ok(&["import", "bkt", root.to_str().unwrap()]);
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((&summary["created"], &summary["replaced"], &summary["unchanged"]), (&0.into(), &0.into(), &5.into()));
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
    let env = TestEnv::new();
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
    let env = TestEnv::new();
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
    let env = TestEnv::new();
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
    let expires = json["expires_at"].as_i64().unwrap() - json["created_at"].as_i64().unwrap();
    assert_eq!(expires, 60);
}

#[test]
fn presign_refuses_bad_input() {
    let env = TestEnv::new();
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
    let env = TestEnv::new();
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
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let lifetime = [("BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME", "1h")];
    let out = env.cli_env(&["presign", "bkt", "k", "--expires-in", "7200"], &lifetime);
    let err = one_line_error(&out, &["presign with BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME=1h"]);
    assert!(err.contains("auth.presign_max_lifetime"), "{err}");
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME", "soon")]);
    let err = one_line_error(&out, &["BLOBGATE_AUTH__PRESIGN_MAX_LIFETIME=soon"]);
    assert!(err.contains("auth.presign_max_lifetime"), "{err}");
}
