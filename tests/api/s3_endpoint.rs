//! One public S3 endpoint: the probes clients send routinely (answered, never 501), CreateBucket on a bucket the
//! caller may write, virtual-hosted-style addressing under `s3.domain`, and the operation layer's refusals, on
//! both listeners. Driven by boto3 and by requests botocore signed.

use crate::helpers::s3::*;
use crate::helpers::*;

/// boto3 sends every probe to `spec["endpoint"]` and prints what each answered.
const PROBES: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
b = spec["bucket"]
out = {}
def answer(name, call, pick):
    try:
        out[name] = [200, pick(call())]
    except ClientError as e:
        out[name] = [e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]]
answer("versioning", lambda: s3.get_bucket_versioning(Bucket=b), lambda r: r.get("Status", ""))
answer("acl", lambda: s3.get_bucket_acl(Bucket=b), lambda r: [g["Permission"] for g in r["Grants"]])
answer("cors", lambda: s3.get_bucket_cors(Bucket=b),
       lambda r: [r["CORSRules"][0]["AllowedOrigins"], r["CORSRules"][0]["AllowedMethods"],
                  r["CORSRules"][0].get("MaxAgeSeconds")])
answer("lifecycle", lambda: s3.get_bucket_lifecycle_configuration(Bucket=b), lambda r: "")
answer("policy", lambda: s3.get_bucket_policy(Bucket=b), lambda r: "")
answer("encryption", lambda: s3.get_bucket_encryption(Bucket=b), lambda r: "")
answer("tagging", lambda: s3.get_bucket_tagging(Bucket=b), lambda r: "")
answer("object_acl", lambda: s3.get_object_acl(Bucket=b, Key="a.txt"),
       lambda r: [g["Permission"] for g in r["Grants"]])
answer("missing_object_acl", lambda: s3.get_object_acl(Bucket=b, Key="missing.txt"), lambda r: "")
answer("create_bucket", lambda: s3.create_bucket(Bucket=b), lambda r: "")
print(json.dumps(out))
"#;

fn probes(endpoint: &str, key: &AccessKey, bucket: &str) -> serde_json::Value {
    let home = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({"endpoint": endpoint, "key": key_json(key), "bucket": bucket});
    run_boto3(home.path(), PROBES, &spec)
}

fn answer(out: &serde_json::Value, name: &str) -> serde_json::Value {
    out[name].clone()
}

#[test]
fn routine_probes_are_answered_on_both_listeners_and_never_501() {
    let env = TestEnv::new();
    env.bucket("site", false);
    env.bucket("other", false);
    env.put_bytes("site", "a.txt", b"hello", &[]);
    let write = s3_key(&env, "site", &["--scope", "write"]);
    let read = s3_key(&env, "site", &["--scope", "read"]);
    let stranger = s3_key(&env, "other", &["--scope", "write"]);
    let server = env.serve();
    let data = format!("http://{}", server.data);
    let admin = format!("http://{}", server.admin);

    for endpoint in [&data, &admin] {
        let out = probes(endpoint, &write, "site");
        assert_eq!(answer(&out, "versioning"), serde_json::json!([200, ""]), "never enabled: {out}");
        assert_eq!(answer(&out, "acl"), serde_json::json!([200, ["FULL_CONTROL"]]), "{out}");
        assert_eq!(answer(&out, "cors"), serde_json::json!([404, "NoSuchCORSConfiguration"]), "{out}");
        assert_eq!(answer(&out, "lifecycle"), serde_json::json!([404, "NoSuchLifecycleConfiguration"]));
        assert_eq!(answer(&out, "policy"), serde_json::json!([404, "NoSuchBucketPolicy"]));
        assert_eq!(
            answer(&out, "encryption"),
            serde_json::json!([404, "ServerSideEncryptionConfigurationNotFoundError"])
        );
        assert_eq!(answer(&out, "tagging"), serde_json::json!([404, "NoSuchTagSet"]));
        assert_eq!(answer(&out, "object_acl"), serde_json::json!([200, ["FULL_CONTROL"]]));
        assert_eq!(answer(&out, "missing_object_acl"), serde_json::json!([404, "NoSuchKey"]));
    }
    // CreateBucket of a bucket this key may write: S3's answer to its owner (rclone's check before a copy).
    let out = probes(&admin, &write, "site");
    assert_eq!(answer(&out, "create_bucket"), serde_json::json!([409, "BucketAlreadyOwnedByYou"]), "{out}");
    // A read key may probe, but not create.
    let out = probes(&admin, &read, "site");
    assert_eq!(answer(&out, "versioning"), serde_json::json!([200, ""]));
    assert_eq!(answer(&out, "create_bucket"), serde_json::json!([403, "AccessDenied"]));
    // A key of another bucket learns nothing of this one: every probe is refused before any lookup, alike for a
    // bucket that exists and one that does not.
    for bucket in ["site", "nosuchbucket"] {
        let out = probes(&data, &stranger, bucket);
        for name in ["versioning", "acl", "cors", "lifecycle", "policy", "encryption", "tagging", "object_acl"] {
            assert_eq!(answer(&out, name), serde_json::json!([403, "AccessDenied"]), "{bucket} {name}: {out}");
        }
    }

    // With a CORS rule, GetBucketCors shows it.
    env.ok(&["bucket", "cors", "set", "site", "--origin", "https://app.example", "--max-age", "600"]);
    let shown =
        wait_for(std::time::Duration::from_secs(30), || answer(&probes(&data, &read, "site"), "cors")[0] == 200);
    assert!(shown, "the rule never reached the cache");
    let out = probes(&data, &read, "site");
    assert_eq!(answer(&out, "cors"), serde_json::json!([200, [["https://app.example"], ["GET", "HEAD"], 600]]));

    // None of it was a server error.
    let metrics = server.metrics();
    let server_errors: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("blobgate_responses_total") && l.contains("status=\"5")).collect();
    assert!(server_errors.iter().all(|l| l.ends_with(" 0")), "5xx responses: {server_errors:?}");
}

#[test]
fn unknown_subresources_get_not_implemented_and_writes_on_the_data_listener_get_method_not_allowed() {
    let env = TestEnv::new();
    env.bucket("site", false);
    env.put_bytes("site", "a.txt", b"hello", &[]);
    let key = s3_key(&env, "site", &["--scope", "write"]);
    let server = env.serve();
    let signed = |method: &str, path: &str| {
        let headers = signed_headers(&key, path, &Signing { method, ..Default::default() });
        server.request(method, path, &as_refs(&headers))
    };
    for path in ["/site?website", "/site?versions", "/site/a.txt?retention", "/site/a.txt?attributes"] {
        let r = signed("GET", path);
        assert_eq!((r.status, s3_code(&r)), (501, "NotImplemented".into()), "{path}");
        assert!(r.header("x-amz-request-id").is_some());
    }
    // A write on the data listener, without a body: refused in S3's words, not 413.
    for (method, path) in [("DELETE", "/site/a.txt"), ("POST", "/site/a.txt?uploads"), ("PUT", "/site")] {
        let r = signed(method, path);
        assert_eq!((r.status, s3_code(&r)), (405, "MethodNotAllowed".into()), "{method} {path}");
    }
    assert_eq!(
        server.get("/site/a.txt", &as_refs(&signed_headers(&key, "/site/a.txt", &Signing::default()))).body,
        b"hello"
    );
}

#[test]
fn virtual_hosted_requests_address_the_bucket_in_the_host() {
    let env = TestEnv::new();
    env.bucket("site", false);
    env.bucket("pub", true);
    let bytes = test_bytes(70_000, 5);
    env.put_bytes("site", "dir/a b.bin", &bytes, &[]);
    env.put_bytes("pub", "index.txt", b"public", &[]);
    let key = s3_key(&env, "site", &["--scope", "read"]);
    let server = env.serve_with(&[("BLOBGATE_S3__DOMAIN", "s3.example.test")], &[]);
    // Any port: botocore signs the Host it sends, port included.
    let host = "site.s3.example.test:9000";
    let at_host = |path: &str, signing: &Signing<'_>| {
        let mut headers = signed_headers_for_host(host, &key, path, signing);
        headers.push(("Host".into(), host.into()));
        server.request(signing.method, path, &as_refs(&headers))
    };
    let get = Signing { method: "GET", ..Default::default() };
    let r = at_host("/dir/a%20b.bin", &get);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(r.body == bytes);
    let r = at_host(
        "/dir/a%20b.bin",
        &Signing { method: "GET", headers: &[("Range", "bytes=10-19")], ..Default::default() },
    );
    assert_eq!((r.status, r.body.as_slice()), (206, &bytes[10..20]));
    let r = at_host("/?list-type=2", &get);
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("<Key>dir/a b.bin</Key>"));
    let r = at_host("/", &Signing { method: "HEAD", ..Default::default() });
    assert_eq!(r.status, 200);
    // Unsigned S3 requests are refused, as on path-style S3 requests (anonymous S3 access is not offered; the
    // native API serves public buckets), in S3's words.
    let r = server.get("/index.txt", &[("Host", "pub.s3.example.test:8080")]);
    assert_eq!((r.status, s3_code(&r)), (403, "AccessDenied".into()));
    // The same path without the virtual host is the native API.
    let r = server.get("/pub/index.txt", &[("Host", "s3.example.test")]);
    assert_eq!((r.status, r.body.as_slice()), (200, b"public".as_slice()));
    let r = server.get("/k", &[("Host", "Bad_Name.s3.example.test")]);
    assert_eq!((r.status, s3_code(&r)), (400, "InvalidBucketName".into()));

    // A bad domain is refused at start, naming the key.
    let out = env.cli_env(
        &["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        &[("BLOBGATE_S3__DOMAIN", "https://s3.example.test/")],
    );
    assert!(!out.status.success());
    let line = one_line_error(&out, &["s3.domain"]);
    assert!(line.contains("not a DNS name"), "{line}");
}
