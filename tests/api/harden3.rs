//! What the third security review reproduced (issue 25), beside the partition (`partition.rs`), the database link
//! (`postgres_tls.rs`) and the upload bounds (`upload_bounds.rs`): a presigned `response-cache-control` on a
//! private bucket, CORS headers before authorisation, and credentials in the server log and the access log.

use crate::helpers::s3::{Signing, presigned_path, s3_code, s3_key, signed_headers};
use crate::helpers::*;

const APP: &str = "https://app.example";

/// The presigned override keeps `private` on a private bucket (and drops what would let a shared cache store the
/// answer), as stored values are; a public bucket's presigned override applies as given.
#[test]
fn a_presigned_cache_control_cannot_make_a_private_answer_shareable() {
    let env = TestEnv::new();
    env.bucket("vault", false);
    env.bucket("open", true);
    env.put_bytes("vault", "report.pdf", b"%PDF-1.7 quarterly", &[]);
    env.put_bytes("open", "app.css", b"body{}", &[]);
    let vault_key = s3_key(&env, "vault", &[]);
    let open_key = s3_key(&env, "open", &[]);
    let server = env.serve();
    let presigned = |key, path: &str| presigned_path(key, path, &Signing { expires: Some(600), ..Default::default() });
    for (asked, answered) in [
        ("public%2C%20s-maxage%3D86400", "private"),
        ("max-age%3D60%2C%20public", "private, max-age=60"),
        ("no-store", "private, no-store"),
        ("private%2C%20max-age%3D5", "private, max-age=5"),
    ] {
        let url = presigned(&vault_key, &format!("/vault/report.pdf?response-cache-control={asked}"));
        let r = server.get(&url, &[]);
        assert_eq!((r.status, r.header("cache-control")), (200, Some(answered)), "{asked}");
    }
    let url = presigned(&open_key, "/open/app.css?response-cache-control=public%2C%20s-maxage%3D86400");
    let r = server.get(&url, &[]);
    assert_eq!((r.status, r.header("cache-control")), (200, Some("public, s-maxage=86400")), "a public bucket's");
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

/// Every credential a request can carry, sent to both listeners with the server logging at `trace`, refused or
/// not: none of them reaches the server log or the access log.
#[test]
fn no_credential_reaches_any_log_at_any_level() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "a.txt", b"hello", &[]);
    let token = env.token("bkt", "write", &[]);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let signed_link = env.ok(&["presign", "bkt", "a.txt", "--expires-in", "600"]).trim().to_owned();
    let access_log = env.dir.path().join("access.log");
    let server = env.serve_with(&[("RUST_LOG", "trace"), ("BLOBGATE_ACCESS_LOG", access_log.to_str().unwrap())], &[]);

    // `bg_<id>_<secret>`; the secret may hold `_` itself.
    let token_secret = token.splitn(3, '_').nth(2).expect("bg_<id>_<secret>").to_owned();
    let mut secrets: Vec<String> = vec![token_secret, key.secret.clone()];
    let signing = Signing { method: "GET", ..Default::default() };
    // Native: a bearer token and a signed URL, on both listeners.
    let bearer = format!("Bearer {token}");
    assert_eq!(server.get("/bkt/a.txt", &[("Authorization", bearer.as_str())]).status, 200);
    let link = path_of_url(&signed_link);
    assert_eq!(server.get(link, &[]).status, 200);
    secrets.push(query_value(link, "bg-sig"));
    let put = server.admin("PUT", "/bkt/b.txt", &[("Authorization", bearer.as_str())], b"native");
    assert_eq!(put.status, 201);
    // SigV4 in a header, and presigned: a GET on the data listener, a PUT on the admin listener (valid for days).
    let headers = signed_headers(&key, "/bkt/a.txt", &signing);
    let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(server.get("/bkt/a.txt", &refs).status, 200);
    let authorization = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("authorization")).unwrap();
    secrets.push(authorization.1.rsplit("Signature=").next().unwrap().to_owned());
    let get = presigned_path(&key, "/bkt/a.txt", &Signing { expires: Some(600), ..Default::default() });
    assert_eq!(server.get(&get, &[]).status, 200);
    let put =
        presigned_path(&key, "/bkt/c.txt", &Signing { method: "PUT", expires: Some(86_400), ..Default::default() });
    let mut conn = Conn::open(server.admin);
    conn.send(
        format!("PUT {put} HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi").as_bytes(),
    );
    assert_eq!(conn.read_response(false).expect("a response").status, 200, "the presigned PUT");
    for url in [&get, &put] {
        secrets.push(query_value(url, "X-Amz-Signature"));
        secrets.push(query_value(url, "X-Amz-Credential"));
    }
    // SigV2 presigns (refused) carrying what may be a misdirected client's real AWS credentials.
    let sigv2 = "AWSAccessKeyId=AKIAIOSFODNN7EXAMPLE&Expires=1900000000&Signature=c2lndjJzZWNyZXQ%3D";
    for listener in [server.data, server.admin] {
        let mut conn = Conn::open(listener);
        conn.send(format!("GET /bkt/a.txt?{sigv2} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes());
        let r = conn.read_response(false).expect("a response");
        assert_eq!((r.status, s3_code(&r).as_str()), (400, "InvalidRequest"), "SigV2 gets S3's answer");
    }
    secrets.extend(["AKIAIOSFODNN7EXAMPLE".to_owned(), "c2lndjJzZWNyZXQ".to_owned()]);

    let mut server = server;
    server.stop();
    let logged = server.log();
    assert!(logged.contains("TRACE") || logged.contains("DEBUG"), "not logging at trace:\n{logged}");
    assert!(logged.contains("/bkt/c.txt"), "the admin listener's span names the path:\n{logged}");
    let access = std::fs::read_to_string(&access_log).expect("the access log");
    assert!(access.lines().count() >= 8, "{access}");
    for secret in &secrets {
        assert!(secret.len() >= 15, "too short to tell apart from chance: {secret:?}");
        let decoded = percent_decoded(secret);
        for (name, text) in [("server log", &logged), ("access log", &access)] {
            assert!(!text.contains(secret.as_str()) && !text.contains(&decoded), "{secret:?} in the {name}:\n{text}");
        }
    }
}

/// The value of `name` in `url`'s query, as sent (still percent-encoded).
fn query_value(url: &str, name: &str) -> String {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let pair =
        query.split('&').find(|p| p.starts_with(&format!("{name}="))).unwrap_or_else(|| panic!("{name} in {url}"));
    pair[name.len() + 1..].to_owned()
}

fn percent_decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}
