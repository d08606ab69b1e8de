//! Bad names and paths on the data listener of the in-process application (`spawn_app`; the binary where its log
//! is read): every one is a 4xx with a JSON error, never a 500, and no answer tells an unauthorised caller whether
//! a bucket or object exists.

use crate::helpers::*;
use crate::in_process::{TestApp, spawn_app};

/// A private bucket `priv` with `obj`, a public bucket `open` with `obj`, and a read token for `priv`.
fn setup(app: &TestApp) -> String {
    app.bucket("priv", false);
    app.bucket("open", true);
    app.put("priv", "obj", b"private");
    app.put("open", "obj", b"public");
    app.token("priv", "read")
}

#[test]
fn invalid_bucket_names_are_400() {
    let app = spawn_app();
    let token = setup(&app);
    let server = &app;
    for path in [
        "/PRIV/obj",
        "/Priv/obj",
        "/ab/obj",
        &format!("/{}/obj", "a".repeat(64)),
        "/a..b/obj",
        "/192.168.1.1/obj",
        "/-abc/obj",
        "/abc-/obj",
        "/a_b/obj",
        "/",
        "//obj",
    ] {
        for token in [None, Some(token.as_str())] {
            let r = match token {
                None => server.get(path, &[]),
                Some(t) => server.get_auth(path, t, &[]),
            };
            assert_json_error(&r, 400, "invalid_name");
            assert!(r.json()["message"].as_str().unwrap().contains("bucket"), "{path}: {}", r.json());
        }
    }
}

#[test]
fn invalid_keys_are_400() {
    let app = spawn_app();
    let token = setup(&app);
    let server = &app;
    let too_long = format!("/open/{}", "%61".repeat(1025));
    assert!(too_long.len() < 8192, "still under the URI limit");
    for path in [
        too_long.as_str(),
        "/open/%ff",
        "/open/a%C3",
        "/open/%00",
        "/open/a%00b",
        "/open/%2e%2e",
        "/open/%2E%2E/priv/obj",
        "/open/a/%2e/b",
        "/open/a/../obj",
        "/open/./obj",
        "/open/..",
        "/open/a/.",
        "/open/%01",
        "/open/a%0ab",
        "/open/a%0d%0aSet-Cookie:%20x",
        "/open/%7f",
        "/open/%c2%85",
    ] {
        let anonymous = server.get(path, &[]);
        assert_json_error(&anonymous, 400, "invalid_name");
        assert!(anonymous.json()["message"].as_str().unwrap().contains("key"), "{path}: {}", anonymous.json());
        let with_token = server.get_auth(path, &token, &[]);
        assert_json_error(&with_token, 400, "invalid_name");
        let head = server.request("HEAD", path, &[]);
        assert_eq!(head.status, 400, "HEAD {path}");
        assert!(head.body.is_empty());
    }
    // A bucket's root names no key, but is no bad path either: 404 (`website.rs`: a static site's home), after
    // authorisation as every read.
    for path in ["/open/", "/open"] {
        assert_json_error(&server.get(path, &[]), 404, "not_found");
    }
    assert_json_error(&server.get("/priv/", &[]), 401, "unauthorized");
    assert_json_error(&server.get_auth("/priv/", &token, &[]), 404, "not_found");
    // The boundaries are valid: 1024 bytes is a key (absent: 404), one byte is a key.
    let max = format!("/open/{}", "%61".repeat(1024));
    assert_json_error(&server.get(&max, &[]), 404, "not_found");
    assert_json_error(&server.get("/open/x", &[]), 404, "not_found");
    // Dots that are not whole segments are ordinary key characters.
    assert_json_error(&server.get("/open/a/..b/.c", &[]), 404, "not_found");
}

#[test]
fn paths_are_percent_decoded_exactly_once() {
    let app = spawn_app();
    app.bucket("open", true);
    app.put("open", "dir/a b.txt", b"spaced");
    app.put("open", "%2F", b"literal percent");
    app.put("open", "é/ü", b"unicode");
    app.put("open", "q?x#y", b"query chars");
    let server = &app;
    for (path, body) in [
        ("/open/dir/a%20b.txt", &b"spaced"[..]),
        ("/open/dir%2Fa%20b.txt", b"spaced"),
        ("/open/%252F", b"literal percent"),
        ("/open/%C3%A9/%C3%BC", b"unicode"),
        ("/open/q%3Fx%23y", b"query chars"),
    ] {
        let r = server.get(path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.body, body, "{path}");
    }
    // Decoding twice would find "%2F" -> "/" here; once finds the absent key "/".
    assert_json_error(&server.get("/open/%25252F", &[]), 404, "not_found");
    // A query string is not part of the key.
    let r = server.get("/open/dir/a%20b.txt?x=1", &[]);
    assert_eq!(r.body, b"spaced");
}

#[test]
fn unknown_buckets_and_objects_do_not_leak_existence() {
    let app = spawn_app();
    let token = setup(&app);
    let server = &app;

    // Anonymous: a private bucket's present and absent keys and an absent bucket all look the same.
    let present = server.get("/priv/obj", &[]);
    let absent = server.get("/priv/nope", &[]);
    let no_bucket = server.get("/nosuchbucket/obj", &[]);
    for r in [&present, &absent, &no_bucket] {
        assert_json_error(r, 401, "unauthorized");
        assert!(r.header("www-authenticate").unwrap().starts_with("Bearer"));
    }
    assert_eq!(present.body, absent.body);
    assert_eq!(present.body, no_bucket.body);
    assert_eq!(present.headers_without_date(), absent.headers_without_date());
    assert_eq!(present.headers_without_date(), no_bucket.headers_without_date());

    // A valid token for `priv` used on a bucket that does not exist: 403, same as another existing bucket.
    let other = server.get_auth("/open/obj", &token, &[]);
    assert_eq!(other.status, 200, "public buckets are readable with any valid token");
    app.bucket("other", false);
    let existing_other = server.get_auth("/other/obj", &token, &[]);
    let missing_other = server.get_auth("/nosuchbucket/obj", &token, &[]);
    assert_json_error(&existing_other, 403, "forbidden");
    assert_json_error(&missing_other, 403, "forbidden");
    assert_eq!(existing_other.body, missing_other.body);

    // With access, absence is a plain 404.
    assert_json_error(&server.get_auth("/priv/nope", &token, &[]), 404, "not_found");
    // A public bucket tells anyone.
    assert_json_error(&server.get("/open/nope", &[]), 404, "not_found");
    let r = server.request("HEAD", "/open/nope", &[]);
    assert_eq!(r.status, 404);
    assert!(r.body.is_empty());
    // HEAD mirrors GET, errors included: same Content-Length as the GET's JSON body.
    let get = server.get("/open/nope", &[]);
    assert_eq!(r.header("content-length"), Some(get.body.len().to_string().as_str()));
}

#[test]
fn odd_inputs_never_cause_a_server_error() {
    // The binary: what it logged is part of the answer.
    let env = TestEnv::new();
    env.bucket("priv", false);
    env.bucket("open", true);
    env.put_bytes("priv", "obj", b"private", &[]);
    env.put_bytes("open", "obj", b"public", &[]);
    let token = env.token("priv", "read", &[]);
    let server = env.serve();
    let auth = format!("Bearer {token}");
    let paths = [
        "/priv/obj?bg-expires=1",
        "/priv/obj?bg-expires=x&bg-key=k&bg-sig=s",
        "/priv/obj?bg-expires=99999999999999999999&bg-key=k&bg-sig=s",
        "/priv/obj?bg-expires=1&bg-key=&bg-sig=",
        "/priv/obj?bg-expires=1&bg-expires=2&bg-key=k&bg-sig=s",
        "/priv/obj?response-content-disposition=attachment",
        "/priv/%",
        "/priv/%zz",
        "/priv/a%2",
        "/priv/obj%",
        "/priv//",
        "/priv/obj/",
        "/priv/\u{e9}",
        "/priv/obj;x=1",
        "/priv/obj#frag",
    ];
    let headers: [&[(&str, &str)]; 6] = [
        &[],
        &[("Authorization", auth.as_str())],
        &[("Authorization", "Bearer bg_000000000000_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")],
        &[("Authorization", "Bearer \u{e9}")],
        &[("Range", "bytes=0-0,-1"), ("Authorization", auth.as_str())],
        &[("If-None-Match", "\u{e9}"), ("If-Range", "x"), ("Authorization", auth.as_str())],
    ];
    for path in paths {
        for h in headers {
            let r = server.get(path, h);
            assert!((200..500).contains(&r.status), "{path} {h:?}: {} {}", r.status, String::from_utf8_lossy(&r.body));
            if r.status >= 400 {
                let json = r.json();
                assert!(json["error"].is_string() && json["message"].is_string(), "{path}: {json}");
            }
        }
    }
    assert!(server.log().lines().all(|l| !l.contains("ERROR")), "errors logged:\n{}", server.log());
}
