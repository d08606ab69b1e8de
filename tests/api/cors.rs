//! CORS over the wire: `bucket cors set/clear`, preflights, and the headers of actual responses of every status.
//! The browser itself is in `browser.rs`.

use crate::helpers::*;

const APP: &str = "https://app.example";

fn preflight(server: &Server, path: &str, origin: &str, method: &str, headers: &str) -> Response {
    server.request(
        "OPTIONS",
        path,
        &[("Origin", origin), ("Access-Control-Request-Method", method), ("Access-Control-Request-Headers", headers)],
    )
}

fn cors_headers(r: &Response) -> Vec<(&String, &String)> {
    let mut h: Vec<_> = r.headers.iter().filter(|(k, _)| k.starts_with("access-control-")).collect();
    h.sort();
    h
}

#[test]
fn a_preflight_answers_from_the_bucket_rule_only() {
    let env = TestEnv::new();
    env.bucket("assets", false);
    env.put_bytes("assets", "a.js", b"x", &[]);
    let set = env.ok(&["bucket", "cors", "set", "assets", "--origin", APP, "--max-age", "600"]);
    assert!(set.contains(r#""origins":["https://app.example"]"#), "{set}");
    let server = env.serve();

    let asked = "range, if-none-match, authorization";
    let r = preflight(&server, "/assets/a.js", APP, "GET", asked);
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, HEAD"));
    assert_eq!(r.header("access-control-allow-headers"), Some("range, if-none-match, authorization"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    assert_eq!(r.header("vary"), Some("Origin, Access-Control-Request-Method, Access-Control-Request-Headers"));
    assert_eq!(r.header("access-control-allow-credentials"), None);

    // No credentials on a private bucket, and a missing object: the same answer, so nothing about existence.
    let missing = preflight(&server, "/assets/missing.js", APP, "GET", asked);
    assert_eq!((missing.status, cors_headers(&missing)), (r.status, cors_headers(&r)));

    // Not allowed: another origin, another method, a header the rule does not allow, an unknown bucket: 204
    // without CORS headers.
    for (path, origin, method, headers) in [
        ("/assets/a.js", "https://evil.example", "GET", "range"),
        ("/assets/a.js", APP, "PUT", "range"),
        ("/assets/a.js", APP, "GET", "range, x-other"),
        ("/nobucket/a.js", APP, "GET", "range"),
    ] {
        let r = preflight(&server, path, origin, method, headers);
        assert_eq!(r.status, 204, "{path} {origin} {method}");
        assert!(cors_headers(&r).is_empty(), "{path} {origin} {method}: {:?}", r.headers);
    }
    // An OPTIONS that is not a preflight is still refused as before.
    assert_eq!(server.request("OPTIONS", "/assets/a.js", &[]).status, 405);
}

#[test]
fn actual_responses_carry_cors_headers_on_every_status() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.bucket("priv", false);
    env.put_bytes("pub", "a.bin", &test_bytes(1000, 7), &[]);
    env.put_bytes("priv", "s.bin", b"secret", &[]);
    env.ok(&["bucket", "cors", "set", "pub", "--origin", APP, "--expose-header", "X-Request-Id"]);
    env.ok(&["bucket", "cors", "set", "priv", "--origin", APP, "--expose-header", "X-Request-Id"]);
    let server = env.serve();
    let etag = server.get("/pub/a.bin", &[]).header("etag").expect("an ETag").to_owned();

    let origin = ("Origin", APP);
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: Vec<Case> = vec![
        ("/pub/a.bin", vec![origin], 200),
        ("/pub/a.bin", vec![origin, ("Range", "bytes=0-99")], 206),
        ("/pub/a.bin", vec![origin, ("If-None-Match", etag.as_str())], 304),
        ("/pub/a.bin", vec![origin, ("If-Match", "\"other\"")], 412),
        ("/pub/a.bin", vec![origin, ("Range", "bytes=5000-")], 416),
        ("/pub/missing", vec![origin], 404),
    ];
    for (path, headers, status) in &cases {
        let r = server.get(path, headers);
        assert_eq!(r.status, *status, "{path} {headers:?}");
        assert_eq!(r.header("access-control-allow-origin"), Some(APP), "{path} {headers:?}");
        assert_eq!(
            r.header("access-control-expose-headers"),
            Some("Content-Range, Content-Length, ETag, Accept-Ranges, Content-Encoding, X-Request-Id"),
            "{path} {headers:?}"
        );
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")), "{path}: {:?}", r.headers);
    }
    // Refused before authorisation: no CORS headers and no Vary, exactly as for a bucket that does not exist
    // (which has no rule), so a script cannot tell them apart (the whole matrix is in
    // `refusals_before_authorisation_carry_no_cors_headers_whether_the_bucket_exists_or_not`).
    for path in ["/priv/s.bin", "/priv/missing", "/nobucket/x"] {
        let r = server.get(path, &[origin]);
        assert_eq!(r.status, 401, "{path}");
        assert!(cors_headers(&r).is_empty() && r.header("vary").is_none(), "{path}: {:?}", r.headers);
    }
    let head = server.request("HEAD", "/pub/a.bin", &[origin]);
    assert_eq!((head.status, head.header("access-control-allow-origin")), (200, Some(APP)));

    // Another origin: no CORS headers, only Vary. No Origin: nothing added at all.
    let other = server.get("/pub/a.bin", &[("Origin", "https://evil.example")]);
    assert!(cors_headers(&other).is_empty(), "{:?}", other.headers);
    assert_eq!(other.header("vary"), Some("Origin"));
    // No Origin: no CORS headers, but the answer still varies on it, so a shared cache keeps them apart.
    for headers in [vec![], vec![("Range", "bytes=0-9")], vec![("If-None-Match", etag.as_str())]] {
        let plain = server.get("/pub/a.bin", &headers);
        assert!(cors_headers(&plain).is_empty(), "{:?}", plain.headers);
        assert_eq!(plain.header("vary"), Some("Origin"), "{headers:?}: {:?}", plain.headers);
    }
    let with_origin = server.get("/pub/a.bin", &[origin]);
    assert_eq!(with_origin.header("vary"), Some("Origin"), "said once");
}

#[test]
fn star_is_echoed_for_credentialed_requests_and_a_rule_change_is_live_at_once() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a.bin", b"hello", &[]);
    let token = env.token("pub", "read", &[]);
    let server = env.serve();
    let origin = ("Origin", "https://any.example");

    // No rule yet: no CORS headers, and no Vary.
    let r = server.get("/pub/a.bin", &[origin]);
    assert!(cors_headers(&r).is_empty() && r.header("vary").is_none(), "{:?}", r.headers);

    env.ok(&["bucket", "cors", "set", "pub", "--origin", "*"]);
    let r = server.get("/pub/a.bin", &[origin]);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"), "the running server saw the new rule");
    let bearer = format!("Bearer {token}");
    for credential in [("Authorization", bearer.as_str()), ("Cookie", "a=b")] {
        let r = server.get("/pub/a.bin", &[origin, credential]);
        assert_eq!(r.status, 200, "{credential:?}");
        assert_eq!(r.header("access-control-allow-origin"), Some("https://any.example"), "{credential:?}");
        assert_eq!(r.header("access-control-allow-credentials"), None);
    }
    let listed = env.ok(&["bucket", "list"]);
    assert!(listed.contains(r#""cors":{"origins":["*"]}"#), "{listed}");

    env.ok(&["bucket", "cors", "clear", "pub"]);
    let r = server.get("/pub/a.bin", &[origin]);
    assert!(cors_headers(&r).is_empty(), "cleared: {:?}", r.headers);
    assert!(env.ok(&["bucket", "list"]).contains(r#""cors":null"#));
}

#[test]
fn bad_cors_rules_are_refused_with_one_line() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    for (args, what) in [
        (vec!["--origin", "https://app.example/"], "invalid origin"),
        (vec!["--origin", "app.example"], "invalid origin"),
        (vec!["--origin", "*", "--max-age", "999999"], "--max-age"),
        (vec!["--origin", "*", "--expose-header", "a b"], "invalid header name"),
    ] {
        let mut full = vec!["bucket", "cors", "set", "pub"];
        full.extend_from_slice(&args);
        let out = env.cli(&full);
        let line = one_line_error(&out, &full);
        assert!(line.starts_with("blobgate: ") && line.contains(what), "{line}");
    }
    let out = env.cli(&["bucket", "cors", "set", "nobucket", "--origin", "*"]);
    assert!(!out.status.success());
    assert!(env.ok(&["bucket", "list"]).contains(r#""cors":null"#), "nothing was stored");
}

/// CORS on S3 requests: a presigned URL's preflight ("OPTIONS object") is answered from the bucket's rule, with
/// its methods and headers; what the rule does not allow gets no CORS headers; answers after authorisation carry
/// the rule's headers, refusals before it none.
#[test]
fn s3_requests_follow_the_buckets_rule_with_its_methods_and_headers() {
    use crate::helpers::s3::{Signing, presigned_path, s3_key, signed_headers};
    let env = TestEnv::new();
    env.bucket("site", false);
    env.put_bytes("site", "a.txt", b"hello", &[]);
    let key = s3_key(&env, "site", &["--scope", "write"]);
    let app = "https://app.example";
    // Methods and headers are taken in any case (stored as browsers compare them).
    let rule = ["--method", "get", "--method", "PUT", "--allow-header", "Content-Type", "--max-age", "60"];
    env.ok(&[&["bucket", "cors", "set", "site", "--origin", app][..], &rule[..]].concat());
    let server = env.serve();
    let put = presigned_path(&key, "/site/b.txt", &Signing { method: "PUT", expires: Some(600), ..Default::default() });
    let preflight = |path: &str, method: &str, headers: Option<&str>| {
        let mut h = vec![("Origin", app), ("Access-Control-Request-Method", method)];
        h.extend(headers.map(|v| ("Access-Control-Request-Headers", v)));
        server.request("OPTIONS", path, &h)
    };
    let r = preflight(&put, "PUT", Some("content-type"));
    assert_eq!(r.status, 204);
    assert_eq!(r.header("access-control-allow-origin"), Some(app));
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(r.header("access-control-allow-headers"), Some("content-type"));
    assert_eq!(r.header("access-control-max-age"), Some("60"));
    for (method, headers) in [("DELETE", None), ("PUT", Some("content-type, x-not-allowed")), ("POST", None)] {
        let r = preflight(&put, method, headers);
        assert_eq!(r.status, 204, "{method} {headers:?}");
        assert_eq!(r.header("access-control-allow-origin"), None, "{method} {headers:?}: not allowed");
    }
    // The upload itself, with Origin: stored, and the answer carries the rule's headers.
    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("PUT", &put, &[("Origin", app), ("Content-Length", "5")], false));
    conn.send(b"howdy");
    let r = conn.read_response(false).expect("an answer");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("access-control-allow-origin"), Some(app));
    assert!(r.header("vary").is_some_and(|v| v.contains("Origin")));
    // A signed GetObject from a page (SigV4 header: credentialed, so the origin is echoed).
    let get = signed_headers(&key, "/site/b.txt", &Signing::default());
    let mut headers = crate::helpers::s3::as_refs(&get);
    headers.push(("Origin", app));
    let r = server.get("/site/b.txt", &headers);
    assert_eq!((r.status, r.body.as_slice()), (200, &b"howdy"[..]));
    assert_eq!(r.header("access-control-allow-origin"), Some(app));
    assert!(r.header("access-control-expose-headers").is_some_and(|v| v.contains("ETag")));
    // A refusal before authorisation (a tampered signature): no CORS headers, as for a bucket without a rule.
    let tampered = put.replace("X-Amz-Signature=", "X-Amz-Signature=0");
    let r = server.request("PUT", &tampered, &[("Origin", app), ("Content-Length", "0")]);
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert!(!r.header("vary").is_some_and(|v| v.contains("Origin")));
    // Bad rules are refused in one line.
    for (args, says) in [(vec!["--method", "PATCH"], "--method"), (vec!["--allow-header", "a b"], "--allow-header")] {
        let mut full = vec!["bucket", "cors", "set", "site", "--origin", app];
        full.extend(args);
        assert!(env.fails(&full).contains(says));
    }
}

/// Every refusal before authorisation looks the same for an existing private bucket with a CORS rule and for a
/// bucket that does not exist: no `Access-Control-*`, no `Vary: Origin`, the same status and body.
#[test]
fn refusals_before_authorisation_carry_no_cors_headers_whether_the_bucket_exists_or_not() {
    let env = TestEnv::new();
    env.bucket("secret", false);
    env.bucket("other", false);
    env.put_bytes("secret", "plan.txt", b"launch at dawn", &[]);
    env.ok(&["bucket", "cors", "set", "secret", "--origin", APP]);
    let wrong_bucket = env.token("other", "read", &[]);
    let revoked = env.token("secret", "read", &[]);
    env.ok(&["token", "revoke", &revoked]);
    let reader = env.token("secret", "read", &[]);
    let server = env.serve();
    let origin = ("Origin", APP);
    let (wrong_bucket, revoked, reader) =
        (format!("Bearer {wrong_bucket}"), format!("Bearer {revoked}"), format!("Bearer {reader}"));
    type Refusal<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let refusals: [Refusal; 5] = [
        ("no credentials", vec![origin], 401),
        ("a malformed token", vec![origin, ("Authorization", "Bearer ")], 401),
        ("a revoked token", vec![origin, ("Authorization", revoked.as_str())], 401),
        ("another bucket's token", vec![origin, ("Authorization", wrong_bucket.as_str())], 403),
        ("a bad signed URL", vec![origin], 401),
    ];
    for (what, headers, status) in &refusals {
        let query = if *what == "a bad signed URL" { "?bg-expires=99999999999&bg-key=k&bg-sig=00" } else { "" };
        let present = server.get(&format!("/secret/plan.txt{query}"), headers);
        let absent = server.get(&format!("/nosuchbucket/plan.txt{query}"), headers);
        assert_eq!(present.status, *status, "{what}: {:?}", present.headers);
        assert_eq!(
            (present.status, present.headers_without_date(), &present.body),
            (absent.status, absent.headers_without_date(), &absent.body),
            "{what}: an existing bucket answers unlike an absent one"
        );
        assert!(!present.headers.keys().any(|k| k.starts_with("access-control-")), "{what}: {:?}", present.headers);
        assert!(present.header("vary").is_none(), "{what}: {:?}", present.headers);
    }
    // Authorised: the rule applies, to a 200 and to a 404 alike.
    for (path, status) in [("/secret/plan.txt", 200), ("/secret/missing.txt", 404)] {
        let r = server.get(path, &[origin, ("Authorization", reader.as_str())]);
        assert_eq!((r.status, r.header("access-control-allow-origin")), (status, Some(APP)), "{path}");
        assert!(r.header("vary").is_some_and(|v| v.contains("Origin")), "{path}: {:?}", r.headers);
    }
}
