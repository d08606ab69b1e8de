//! The native `PUT` honours what a CI job sends with it (issue 26): `If-None-Match: *` and `If-Match` are checked
//! under the write lock in the committing transaction, as S3's conditional writes are (one winner among racing
//! replicas, 412 for the rest, nothing stored), and `Content-MD5` and an RFC 9530 `sha-256` (`Repr-Digest`,
//! `Content-Digest`) are checked against the body before anything commits (400, nothing stored).

use std::sync::Barrier;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use md5::Digest as _;

use crate::helpers::*;

fn etag_of(put: &Response) -> String {
    put.json()["etag"].as_str().expect("the put JSON names its ETag").to_owned()
}

#[test]
fn conditional_native_puts_never_overwrite_what_they_must_not() {
    let env = TestEnv::new();
    env.bucket("releases", false);
    let writer = env.token("releases", "write", &[]);
    let reader = env.token("releases", "read", &[]);
    let server = env.serve();
    let release = test_bytes(200_000, 3);
    let path = "/releases/v1/app.tar.gz";
    let create_only = [("If-None-Match", "*")];

    let first = server.put(path, &writer, &release, &create_only);
    assert_eq!(first.status, 201, "{}", String::from_utf8_lossy(&first.body));
    // The re-run of the CI job: refused, and the release is intact.
    let again = server.put(path, &writer, b"oops\n", &create_only);
    assert_json_error(&again, 412, "precondition_failed");
    assert_eq!(server.get_auth(path, &reader, &[]).body, release, "the 200 kB release survived");

    let current = etag_of(&first);
    let stale = "\"0000000000000000000000000000000000000000000000000000000000000000\"";
    assert_json_error(&server.put(path, &writer, b"v2", &[("If-Match", stale)]), 412, "precondition_failed");
    let replaced = server.put(path, &writer, b"v2", &[("If-Match", &current)]);
    assert_eq!(replaced.status, 201);
    assert_eq!(server.get_auth(path, &reader, &[]).body, b"v2");
    // The tag it replaced no longer matches; `*` matches any current object; no object matches no tag.
    assert_json_error(&server.put(path, &writer, b"v3", &[("If-Match", &current)]), 412, "precondition_failed");
    assert_eq!(server.put(path, &writer, b"v3", &[("If-Match", "*")]).status, 201);
    assert_json_error(&server.put("/releases/absent", &writer, b"x", &[("If-Match", "*")]), 412, "precondition_failed");
    // The object's S3 ETag (its MD5) is one of its validators too.
    let md5 = format!("\"{}\"", hex::encode(md5::Md5::digest(b"v3")));
    assert_eq!(server.put(path, &writer, b"v4", &[("If-Match", &md5)]).status, 201);
    // What cannot be honoured as sent is refused before the body is read.
    for bad in [
        vec![("If-None-Match", "\"abc\"")],
        vec![("If-Match", "\"a\", \"b\"")],
        vec![("If-Match", "*"), ("If-None-Match", "*")],
    ] {
        assert_json_error(&server.put(path, &writer, b"x", &bad), 400, "bad_request");
    }
    assert_eq!(server.get_auth(path, &reader, &[]).body, b"v4");
    assert!(env.tmp_files().is_empty(), "refused bodies leave nothing staged: {:?}", env.tmp_files());
}

#[test]
fn declared_digests_are_checked_before_anything_is_stored() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let writer = env.token("bkt", "write", &[]);
    let server = env.serve();
    let body = test_bytes(70_000, 9);
    let md5 = STANDARD.encode(md5::Md5::digest(&body));
    let sha = format!("sha-256=:{}:", STANDARD.encode(<sha2::Sha256 as sha2::Digest>::digest(&body)));
    let other_md5 = STANDARD.encode(md5::Md5::digest(b"other"));
    let other_sha = format!("sha-256=:{}:", STANDARD.encode(<sha2::Sha256 as sha2::Digest>::digest(b"other")));

    for (n, (name, value)) in [("Content-MD5", &other_md5), ("Repr-Digest", &other_sha), ("Content-Digest", &other_sha)]
        .into_iter()
        .enumerate()
    {
        let r = server.put(&format!("/bkt/wrong{n}"), &writer, &body, &[(name, value.as_str())]);
        assert_json_error(&r, 400, "bad_digest");
        assert!(r.json()["message"].as_str().unwrap().contains(name), "{name}: {}", r.json());
    }
    for (name, value) in [("Content-MD5", "bm90IDE2IGJ5dGVz"), ("Repr-Digest", "sha-256=abc"), ("Content-Digest", "x")]
    {
        assert_json_error(&server.put("/bkt/malformed", &writer, &body, &[(name, value)]), 400, "invalid_digest");
    }
    assert!(env.ok(&["ls", "bkt"]).trim().is_empty(), "nothing was stored");
    assert!(env.tmp_files().is_empty(), "{:?}", env.tmp_files());

    let all = [("Content-MD5", md5.as_str()), ("Repr-Digest", sha.as_str()), ("Content-Digest", sha.as_str())];
    assert_eq!(server.put("/bkt/ok", &writer, &body, &all).status, 201);
    assert_eq!(server.get_auth("/bkt/ok", &writer, &[]).body, body);
}

/// Replicas racing to create the same key with `If-None-Match: *`: one wins, the others get 412, and the object
/// is the winner's bytes.
#[test]
fn one_of_several_replicas_racing_to_create_a_key_wins() {
    let env = TestEnv::on_postgres();
    env.bucket("ci-builds", false);
    let writer = env.token("ci-builds", "write", &[]);
    let servers = [env.serve(), env.serve()];
    let racers = 8;
    let start = Barrier::new(racers);
    let answers: Vec<(usize, u16)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..racers)
            .map(|n| {
                let (server, start, writer) = (&servers[n % 2], &start, &writer);
                scope.spawn(move || {
                    let body = test_bytes(50_000, n as u64);
                    start.wait();
                    (n, server.put("/ci-builds/build/artifact.zip", writer, &body, &[("If-None-Match", "*")]).status)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let winners: Vec<usize> = answers.iter().filter(|(_, s)| *s == 201).map(|(n, _)| *n).collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    assert!(answers.iter().all(|(_, s)| *s == 201 || *s == 412), "{answers:?}");
    let stored = servers[1].get_auth("/ci-builds/build/artifact.zip", &writer, &[]).body;
    assert_eq!(sha256_hex(&stored), sha256_hex(&test_bytes(50_000, winners[0] as u64)), "the winner's bytes");
}
