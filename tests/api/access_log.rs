//! The access log (`BLOBGATE_ACCESS_LOG`): one JSON line per response on both listeners, without credentials,
//! with the request id the response carries, reopened on SIGHUP; and no credential of any kind in it or in the
//! process log, at any level.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::helpers::s3::{Signing, presigned_path, s3_code, s3_key, signed_headers};
use crate::helpers::{Conn, TestEnv, path_of_url, raw_request, test_bytes, wait_for};

/// The log's lines once there are at least `n` (the writer flushes within a fraction of a second).
fn wait_for_lines(path: &Path, n: usize) -> Vec<Value> {
    let read = || -> (String, Vec<Value>) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
        (text, lines)
    };
    let enough = wait_for(Duration::from_secs(30), || read().1.len() >= n);
    let (text, lines) = read();
    assert!(enough, "wanted {n} access log lines, have {}:\n{text}", lines.len());
    lines
}

/// The line whose `request_id` is `id`.
fn line_for<'a>(lines: &'a [Value], id: Option<&str>) -> &'a Value {
    let id = id.expect("the response carries X-Request-Id");
    lines.iter().find(|l| l["request_id"] == id).unwrap_or_else(|| panic!("no line for {id}: {lines:?}"))
}

#[test]
fn every_response_is_logged_with_its_fields_and_no_credentials() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.bucket("priv", false);
    let object = test_bytes(1000, 7);
    let put = env.put_bytes("pub", "a.bin", &object, &[]);
    env.put_bytes("priv", "p.bin", &object, &[]);
    let token = env.token("priv", "read", &[]);
    let writer = env.token("priv", "write", &[]);
    let token_id = &token[3..15];
    let writer_id = &writer[3..15];
    let secret = &token[16..];
    let log = env.dir.path().join("access.log");
    let server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", log.to_str().unwrap())], &[]);

    let full = server.get("/pub/a.bin", &[("User-Agent", "curl/8.5")]);
    assert_eq!(full.status, 200);
    let bearer = format!("Bearer {token}");
    let range = server.get("/priv/p.bin", &[("Authorization", &bearer), ("Range", "bytes=0-9")]);
    assert_eq!(range.status, 206);
    let etag = put["etag"].as_str().unwrap();
    let not_modified = server.get("/pub/a.bin", &[("If-None-Match", etag)]);
    assert_eq!(not_modified.status, 304);
    let refused = server.get("/priv/p.bin", &[]);
    assert_eq!(refused.status, 401);
    let missing = server.get("/priv/none.bin", &[("Authorization", &bearer)]);
    assert_eq!(missing.status, 404);
    let url = env.ok(&["presign", "priv", "p.bin", "--base-url", &format!("http://{}", server.data)]);
    let link = path_of_url(url.trim()).to_owned();
    let signature = link.split("bg-sig=").nth(1).expect("a signed link").split('&').next().unwrap().to_owned();
    let key_id = link.split("bg-key=").nth(1).unwrap().split('&').next().unwrap().to_owned();
    let presigned = server.get(&link, &[]);
    assert_eq!(presigned.status, 200);
    let upload = server.admin("PUT", "/priv/up.bin", &[("Authorization", &format!("Bearer {writer}"))], b"hello");
    assert!(upload.status == 200 || upload.status == 201, "{upload:?}");
    // Two requests on one connection: the second was preceded by one.
    let mut conn = Conn::open(server.data);
    conn.send(&raw_request("GET", "/pub/a.bin", &[], false));
    let first = conn.read_response(false).unwrap();
    conn.send(&raw_request("GET", "/pub/a.bin", &[], true));
    let second = conn.read_response(false).unwrap();

    let lines = wait_for_lines(&log, 9);
    let l = line_for(&lines, full.header("x-request-id"));
    assert_eq!(
        (l["listener"].as_str(), l["method"].as_str(), l["path"].as_str()),
        (Some("data"), Some("GET"), Some("/pub/a.bin"))
    );
    assert_eq!((l["status"].as_u64(), l["bytes"].as_u64()), (Some(200), Some(1000)));
    assert_eq!(l["encoding"], "identity", "a file body says which coding it sent");
    assert_eq!((l["principal"].as_str(), l["user_agent"].as_str()), (Some("public"), Some("curl/8.5")));
    assert!(l["remote"].as_str().unwrap().starts_with("127.0.0.1:"), "{l}");
    assert!(l["time"].as_str().unwrap().ends_with('Z') && l["time"].as_str().unwrap().contains('T'), "{l}");
    assert!(l["duration_ms"].as_f64().unwrap() >= 0.0, "{l}");
    assert_eq!(l["range"], Value::Null);
    assert_eq!(l["connection_requests"], 0);

    let l = line_for(&lines, range.header("x-request-id"));
    assert_eq!((l["status"].as_u64(), l["bytes"].as_u64()), (Some(206), Some(10)));
    assert_eq!((l["principal"].as_str(), l["range"].as_str()), (Some(token_id), Some("bytes=0-9")));

    let l = line_for(&lines, not_modified.header("x-request-id"));
    assert_eq!(
        (l["status"].as_u64(), l["bytes"].as_u64(), l["principal"].as_str()),
        (Some(304), Some(0), Some("public"))
    );

    let l = line_for(&lines, refused.header("x-request-id"));
    assert_eq!((l["status"].as_u64(), l["principal"].as_str()), (Some(401), Some("-")));
    // A refusal after authorisation is logged with who asked.
    let l = line_for(&lines, missing.header("x-request-id"));
    assert_eq!((l["status"].as_u64(), l["principal"].as_str()), (Some(404), Some(token_id)));

    let l = line_for(&lines, presigned.header("x-request-id"));
    assert_eq!((l["status"].as_u64(), l["bytes"].as_u64()), (Some(200), Some(1000)));
    assert_eq!(
        (l["path"].as_str(), l["principal"].as_str()),
        (Some("/priv/p.bin"), Some(format!("presigned:{key_id}").as_str()))
    );
    assert!(l.get("query").is_none(), "a signed link's query is all credentials: {l}");

    let l = line_for(&lines, upload.header("x-request-id"));
    assert_eq!(
        (l["listener"].as_str(), l["method"].as_str(), l["path"].as_str()),
        (Some("admin"), Some("PUT"), Some("/priv/up.bin"))
    );
    assert_eq!((l["status"].as_u64(), l["principal"].as_str()), (Some(upload.status as u64), Some(writer_id)));

    let (a, b) = (line_for(&lines, first.header("x-request-id")), line_for(&lines, second.header("x-request-id")));
    assert_eq!((a["connection_requests"].as_u64(), b["connection_requests"].as_u64()), (Some(0), Some(1)));

    let text = std::fs::read_to_string(&log).unwrap();
    for secret in [secret, &token, &writer[16..], &signature, "bg-sig", "X-Amz-Signature"] {
        assert!(!text.contains(secret), "the access log holds {secret:?}:\n{text}");
    }
}

#[test]
fn sighup_reopens_the_access_log_for_logrotate() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a.bin", b"abc", &[]);
    let log = env.dir.path().join("access.log");
    let server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", log.to_str().unwrap())], &[]);
    let before = server.get("/pub/a.bin", &[]);
    assert_eq!(before.status, 200);
    wait_for_lines(&log, 1);

    let rotated = env.dir.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    assert!(Command::new("kill").args(["-HUP", &server.pid().to_string()]).status().unwrap().success());
    let acknowledged = wait_for(Duration::from_secs(30), || server.log().contains("SIGHUP received"));
    assert!(acknowledged, "SIGHUP not acknowledged:\n{}", server.log());
    let after = server.get("/pub/a.bin", &[]);
    assert_eq!(after.status, 200);

    let lines = wait_for_lines(&log, 1);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(line_for(&lines, after.header("x-request-id"))["status"], 200);
    let old = wait_for_lines(&rotated, 1);
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(line_for(&old, before.header("x-request-id"))["status"], 200);
}

#[test]
fn without_an_access_log_responses_carry_no_request_id() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.put_bytes("pub", "a.bin", b"abc", &[]);
    let server = env.serve();
    let r = server.get("/pub/a.bin", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), None);
}

#[test]
fn an_access_log_that_cannot_be_opened_is_refused_at_start() {
    let env = TestEnv::new();
    let missing = env.dir.path().join("no-such-dir/access.log");
    let out = env.cli(&[
        "--access-log",
        missing.to_str().unwrap(),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("blobgate: cannot open the access log") && stderr.contains("access_log"), "{stderr}");
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

/// A load balancer's and a scraper's probes are left out of the access log by default (`access_log_probes`), and
/// logged when it is on; other admin requests are logged either way.
#[test]
fn probes_are_not_access_logged_unless_asked_for() {
    let env = TestEnv::new();
    for (probes, expect_probes) in [(None, false), (Some("true"), true)] {
        let log = env.dir.path().join(format!("access-{expect_probes}.log"));
        let mut settings = vec![("BLOBGATE_ACCESS_LOG", log.to_str().unwrap().to_owned())];
        if let Some(value) = probes {
            settings.push(("BLOBGATE_ACCESS_LOG_PROBES", value.to_owned()));
        }
        let settings: Vec<(&str, &str)> = settings.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let server = env.serve_with(&settings, &[]);
        for path in ["/healthz", "/readyz", "/metrics"] {
            assert_eq!(server.admin("GET", path, &[], b"").status, 200, "{path}");
        }
        // Then a request that is logged either way, and the last line the log gets.
        assert_eq!(server.admin("GET", "/stats", &[], b"").status, 401);
        let has_stats = |lines: &[Value]| lines.iter().any(|l| l["path"] == "/stats");
        assert!(wait_for(Duration::from_secs(30), || has_stats(&wait_for_lines(&log, 1))), "the /stats line");
        let lines = wait_for_lines(&log, 1);
        let paths: Vec<_> = lines.iter().filter_map(|l| l["path"].as_str().map(str::to_owned)).collect();
        if expect_probes {
            // The harness's own readiness polls are there too.
            for path in ["/healthz", "/readyz", "/metrics", "/stats"] {
                assert!(paths.iter().any(|p| p == path), "{path} is logged with access_log_probes: {paths:?}");
            }
        } else {
            assert_eq!(paths, ["/stats"], "nothing but /stats is logged by default");
        }
    }
}
