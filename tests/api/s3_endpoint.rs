//! One public S3 endpoint: the probes clients send routinely (answered, never 501), CreateBucket on a bucket the
//! caller may write, virtual-hosted-style addressing under `s3.domain`, buckets named like the admin routes, and
//! the operation layer's refusals (SigV2, foreign key ids), on both listeners. Driven by boto3 and by requests
//! botocore signed.

use crate::helpers::s3::*;
use crate::helpers::*;
use crate::s3_refusals::{Case, answer as raw_answer, raw};
use crate::s3_writes::listed;

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
    let (errors, series) = server.server_errors();
    assert!(series > 0, "no 5xx series on /metrics");
    assert_eq!(errors, 0.0, "5xx responses on the data listener");
}

#[test]
fn unknown_subresources_get_not_implemented_and_the_data_listener_takes_writes() {
    let env = TestEnv::new();
    env.bucket("site", false);
    env.put_bytes("site", "a.txt", b"hello", &[]);
    let key = s3_key(&env, "site", &["--scope", "write"]);
    let server = env.serve();
    let signed = |method: &str, path: &str| {
        let headers = signed_headers(&key, path, &Signing { method, ..Default::default() });
        server.request(method, path, &as_refs(&headers))
    };
    for path in ["/site?website", "/site?versions", "/site/a.txt?retention", "/site/a.txt?legal-hold"] {
        let r = signed("GET", path);
        assert_eq!((r.status, s3_code(&r)), (501, "NotImplemented".into()), "{path}");
        assert!(r.header("x-amz-request-id").is_some());
    }
    for (method, path) in [("PATCH", "/site/a.txt"), ("POST", "/site/a.txt"), ("PUT", "/")] {
        let r = signed(method, path);
        assert_eq!((r.status, s3_code(&r)), (405, "MethodNotAllowed".into()), "{method} {path}");
    }
    // Writes on the data listener: CreateBucket of an owned bucket, CreateMultipartUpload, DeleteObject.
    let r = signed("PUT", "/site");
    assert_eq!((r.status, s3_code(&r)), (409, "BucketAlreadyOwnedByYou".into()));
    let r = signed("POST", "/site/b.txt?uploads");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert!(String::from_utf8_lossy(&r.body).contains("<UploadId>"));
    let read = signed_headers(&key, "/site/a.txt", &Signing::default());
    assert_eq!(server.get("/site/a.txt", &as_refs(&read)).body, b"hello");
    assert_eq!(signed("DELETE", "/site/a.txt").status, 204);
    let r = server.get("/site/a.txt", &as_refs(&read));
    assert_eq!((r.status, s3_code(&r)), (404, "NoSuchKey".into()));
}

/// A write's credentials are checked from its head: a 50 MB PUT without them (or with a read-only key, or a bad
/// signature) is answered before any of its body is sent, and the connection closed.
#[test]
fn a_write_without_write_credentials_is_refused_before_its_body() {
    let env = TestEnv::new();
    env.bucket("site", false);
    let read_key = s3_key(&env, "site", &["--scope", "read"]);
    let read_token = env.token("site", "read", &[]);
    let server = env.serve();
    let length = (50u64 << 20).to_string();
    let bearer = format!("Bearer {read_token}");
    let s3_read = signed_headers(&read_key, "/site/big.bin", &Signing { method: "PUT", ..Default::default() });
    type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, u16);
    let cases: Vec<Case> = vec![
        ("no credentials", vec![], 401),
        ("read token", vec![("Authorization", bearer.as_str())], 403),
        ("read S3 key", as_refs(&s3_read), 403),
        ("bad bearer", vec![("Authorization", "Bearer nope")], 401),
    ];
    for (what, mut headers, status) in cases {
        headers.push(("Content-Length", &length));
        let mut conn = Conn::open(server.data);
        // The head alone: the answer must come without a byte of the body.
        conn.send(&raw_request("PUT", "/site/big.bin", &headers, false));
        let r = conn.read_response(false).expect("an answer before the body");
        assert_eq!(r.status, status, "{what}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.header("connection"), Some("close"), "{what}: the unread body ends the connection");
    }
    assert!(env.blob_files().is_empty() && env.tmp_files().is_empty(), "nothing was staged");
}

/// rclone and s3cmd with the data listener as their only endpoint: copies, syncs, checks, server-side copies
/// and deletes, every byte read back by SHA-256.
#[test]
fn rclone_and_s3cmd_with_only_the_data_endpoint() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let endpoint = server.data.to_string();
    let home = env.dir.path().join("rclone-home");
    rclone_config(&home, &key, &endpoint, "");
    let local = home.join("src");
    let files = [
        ("one.bin", test_bytes(100_000, 7)),
        ("d/two words.txt", test_bytes(17, 8)),
        ("big.bin", test_bytes(12 << 20, 9)),
    ];
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
    }
    let src = local.to_str().unwrap();
    rclone(&home, &["copy", src, "bg:bkt/rc"]);
    rclone(&home, &["check", src, "bg:bkt/rc"]);
    std::fs::write(local.join("one.bin"), b"changed").unwrap();
    rclone(&home, &["sync", src, "bg:bkt/rc"]);
    rclone(&home, &["copyto", "bg:bkt/rc/big.bin", "bg:bkt/copied/big.bin"]);
    let back = home.join("back");
    rclone(&home, &["copy", "bg:bkt/rc", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(back.join("one.bin")).unwrap(), b"changed");
    for (name, bytes) in &files[1..] {
        assert_eq!(sha256_hex(&std::fs::read(back.join(name)).unwrap()), sha256_hex(bytes), "{name}");
    }
    let purged = rclone_output(&home, &["purge", "bg:bkt/rc"]);
    let stderr = String::from_utf8_lossy(&purged.stderr);
    assert!(purged.status.success() && !stderr.contains("ERROR"), "rclone purge: {stderr}");

    let s3cmd_home = env.dir.path().join("s3cmd-home");
    s3cmd_config(&s3cmd_home, &key, &endpoint);
    let put = test_bytes(250_000, 10);
    let put_path = write_file(env.dir.path(), "s3cmd.bin", &put);
    let ok = |args: &[&str]| {
        let out = s3cmd(&s3cmd_home, args);
        assert!(out.status.success(), "s3cmd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    ok(&["put", put_path.to_str().unwrap(), "s3://bkt/s3cmd/put.bin"]);
    let got = env.dir.path().join("s3cmd-got.bin");
    ok(&["get", "s3://bkt/s3cmd/put.bin", got.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&put));
    ok(&["sync", &format!("{src}/"), "s3://bkt/s3cmd/tree/"]);
    ok(&["del", "s3://bkt/s3cmd/put.bin"]);

    let read = |path: &str| {
        let headers = signed_headers(&key, path, &Signing::default());
        server.get(path, &as_refs(&headers))
    };
    assert_eq!(sha256_hex(&read("/bkt/copied/big.bin").body), sha256_hex(&files[2].1));
    assert_eq!(sha256_hex(&read("/bkt/s3cmd/tree/big.bin").body), sha256_hex(&files[2].1));
    assert_eq!(read("/bkt/s3cmd/put.bin").status, 404);
    let listed = env.ok(&["ls", "bkt"]);
    assert!(!listed.lines().any(|l| l.starts_with("rc/")), "purged: {listed}");

    let (errors, series) = server.server_errors();
    assert!(series > 0, "no 5xx series on /metrics");
    assert_eq!(errors, 0.0, "5xx responses on the data listener");
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
    // An unsigned read of a public bucket is served, as S3 serves a public-read bucket; of a private one refused,
    // in S3's words (tests/api/s3_anonymous.rs has the rest).
    let r = server.get("/index.txt", &[("Host", "pub.s3.example.test:8080")]);
    assert_eq!((r.status, r.body.as_slice()), (200, b"public".as_slice()));
    let r = server.get("/dir/a%20b.bin", &[("Host", "site.s3.example.test:8080")]);
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

/// boto3 completes a two-part upload and prints the `Location` S3 answered.
const COMPLETE_LOCATION: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
up = s3.create_multipart_upload(Bucket="site", Key="dir/a b.bin")
part = b"x" * (5 << 20)
etags = [s3.upload_part(Bucket="site", Key="dir/a b.bin", UploadId=up["UploadId"], PartNumber=n, Body=part)["ETag"]
         for n in (1, 2)]
done = s3.complete_multipart_upload(Bucket="site", Key="dir/a b.bin", UploadId=up["UploadId"],
    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in zip((1, 2), etags)]})
print(json.dumps({"location": done["Location"]}))
"#;

#[test]
fn public_url_is_the_base_of_presigned_links_and_of_s3_locations() {
    let env = TestEnv::new();
    env.bucket("site", false);
    let key = s3_key(&env, "site", &["--scope", "write"]);
    let public = [("BLOBGATE_PUBLIC_URL", "https://dl.example.test/")];
    let presigned = |args: &[&str]| {
        let out = env.cli_env(args, &public);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let url = presigned(&["presign", "site", "dir/a b.txt"]);
    assert!(url.starts_with("https://dl.example.test/site/dir/a%20b.txt?"), "{url}");
    let url = presigned(&["presign", "site", "a.txt", "--base-url", "http://other.test:81"]);
    assert!(url.starts_with("http://other.test:81/site/a.txt?"), "--base-url still wins: {url}");
    for bad in ["dl.example.test", "ftp://dl.example.test", "https://dl.example.test/?x=1"] {
        let out = env.cli_env(&["presign", "site", "a.txt"], &[("BLOBGATE_PUBLIC_URL", bad)]);
        let line = one_line_error(&out, &["presign with", bad]);
        assert!(line.contains("public_url"), "{line}");
    }

    let server = env.serve_with(&public, &[]);
    let home = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({"endpoint": format!("http://{}", server.data), "key": key_json(&key)});
    let out = run_boto3(home.path(), COMPLETE_LOCATION, &spec);
    assert_eq!(out["location"], "https://dl.example.test/site/dir/a%20b.bin");
}

/// boto3: GetObject and HeadObject by part number, of a multipart object and of a single-part one.
const PARTS: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
mib = 1024 * 1024
config = TransferConfig(multipart_threshold=5 * mib, multipart_chunksize=5 * mib, max_concurrency=1)
s3.upload_file(spec["file"], "bkt", "multi.bin", Config=config)
s3.put_object(Bucket="bkt", Key="single.bin", Body=b"single part")
out = {}
for n in (1, 2, 3):
    r = s3.get_object(Bucket="bkt", Key="multi.bin", PartNumber=n)
    out[f"get {n}"] = [r["ResponseMetadata"]["HTTPStatusCode"], r["ContentRange"], r["PartsCount"],
                       hashlib.sha256(r["Body"].read()).hexdigest()]
h = s3.head_object(Bucket="bkt", Key="multi.bin", PartNumber=2)
out["head 2"] = [h["ResponseMetadata"]["HTTPStatusCode"], h["ContentLength"], h["PartsCount"]]
out["get 4"] = code(lambda: s3.get_object(Bucket="bkt", Key="multi.bin", PartNumber=4))
out["get 0"] = code(lambda: s3.get_object(Bucket="bkt", Key="multi.bin", PartNumber=0))
out["both"] = code(lambda: s3.get_object(Bucket="bkt", Key="multi.bin", PartNumber=1, Range="bytes=0-9"))
out["missing"] = code(lambda: s3.get_object(Bucket="bkt", Key="nothing.bin", PartNumber=1))
r = s3.get_object(Bucket="bkt", Key="single.bin", PartNumber=1)
out["single 1"] = [r["ResponseMetadata"]["HTTPStatusCode"], r.get("PartsCount"), r["Body"].read().decode()]
out["single 2"] = code(lambda: s3.get_object(Bucket="bkt", Key="single.bin", PartNumber=2))
s3.copy_object(Bucket="bkt", Key="copied.bin", CopySource={"Bucket": "bkt", "Key": "multi.bin"})
r = s3.get_object(Bucket="bkt", Key="copied.bin", PartNumber=3)
out["copied 3"] = [r["ContentRange"], r["PartsCount"]]
print(json.dumps(out))
"#;

/// `partNumber` GET and HEAD: part N of an object stored by multipart upload (206, `Content-Range`,
/// `x-amz-mp-parts-count`), the whole object as part 1 of a single-part one, and S3's refusals.
#[test]
fn a_part_number_reads_that_part_of_a_multipart_object() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let size = (12 << 20) + 12_345;
    let bytes = test_bytes(size, 11);
    let file = write_file(env.dir.path(), "multi.bin", &bytes);
    let server = env.serve();
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.data), "key": key_json(&key), "file": file.to_str().unwrap(),
    });
    let home = tempfile::tempdir().unwrap();
    let out = run_boto3(home.path(), PARTS, &spec);
    let mib = 1 << 20;
    for (n, range) in [(1, 0..5 * mib), (2, 5 * mib..10 * mib), (3, 10 * mib..size)] {
        let want = serde_json::json!([
            206,
            format!("bytes {}-{}/{size}", range.start, range.end - 1),
            3,
            sha256_hex(&bytes[range.clone()])
        ]);
        assert_eq!(out[format!("get {n}")], want, "{out}");
    }
    assert_eq!(out["head 2"], serde_json::json!([206, 5 * mib, 3]), "{out}");
    assert_eq!(out["get 4"], serde_json::json!([416, "InvalidPartNumber"]), "{out}");
    assert_eq!(out["get 0"], serde_json::json!([400, "InvalidArgument"]), "{out}");
    assert_eq!(out["both"], serde_json::json!([400, "InvalidRequest"]), "{out}");
    assert_eq!(out["missing"], serde_json::json!([404, "NoSuchKey"]), "{out}");
    assert_eq!(out["single 1"], serde_json::json!([206, 1, "single part"]), "{out}");
    assert_eq!(out["single 2"], serde_json::json!([416, "InvalidPartNumber"]), "{out}");
    assert_eq!(out["copied 3"], serde_json::json!([format!("bytes {}-{}/{size}", 10 * mib, size - 1), 3]), "{out}");
    let (errors, series) = server.server_errors();
    assert!(series > 0 && errors == 0.0, "5xx responses: {errors}");
}

#[test]
fn sigv2_and_foreign_key_ids_get_s3_xml_and_buckets_named_like_admin_routes_are_s3_buckets() {
    let env = TestEnv::new();
    let names = ["healthz", "readyz", "metrics", "stats"];
    for name in names {
        env.bucket(name, false);
        env.put_bytes(name, "inside.txt", name.as_bytes(), &[]);
    }
    env.put_bytes("stats", "gone.txt", b"to delete", &[]);
    let keys: Vec<AccessKey> = names.iter().map(|n| s3_key(&env, n, &["--scope", "write"])).collect();
    let foreign =
        AccessKey { id: "AKIAIOSFODNN7EXAMPLE".into(), secret: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into() };
    let server = env.serve();
    let (admin, data) = (server.admin.to_string(), server.data.to_string());
    let sigv2 = [("Authorization", "AWS AKBGAAAAAAAAAAAAAAAA:c2lnbmF0dXJl"), ("Date", "Tue, 01 Dec 2026 10:00:00 GMT")];
    let delete_gone = b"<Delete><Object><Key>gone.txt</Key></Object></Delete>".as_slice();
    // base64(md5(delete_gone)), computed by python3's hashlib.
    let delete_md5 = [("Content-MD5", "xMIDFYwcW8LK/z9C/up5fg=="), ("_key", "stats")];
    let mut cases = vec![
        Case {
            name: "sigv2_data",
            host: data.clone(),
            method: "GET",
            path: "/healthz/inside.txt",
            headers: &sigv2,
            body: b"",
        },
        Case {
            name: "sigv2_admin",
            host: admin.clone(),
            method: "PUT",
            path: "/healthz/new.txt",
            headers: &sigv2,
            body: b"x",
        },
        Case {
            name: "foreign_id",
            host: data.clone(),
            method: "GET",
            path: "/healthz/inside.txt",
            headers: &[("_key", "foreign")],
            body: b"",
        },
        Case {
            name: "delete_in_stats",
            host: admin.clone(),
            method: "POST",
            path: "/stats?delete",
            headers: &delete_md5,
            body: delete_gone,
        },
    ];
    /// A case's name, path, and the signing key's name.
    type Named<'a> = (String, String, [(&'a str, &'a str); 1]);
    let per_bucket: Vec<Named<'_>> =
        names.iter().map(|n| (format!("list_{n}"), format!("/{n}?list-type=2"), [("_key", *n)])).collect();
    let heads: Vec<(String, String)> = names.iter().map(|n| (format!("head_{n}"), format!("/{n}"))).collect();
    for ((list_name, list_path, key), (head_name, head_path)) in per_bucket.iter().zip(&heads) {
        cases.push(Case {
            name: list_name,
            host: admin.clone(),
            method: "GET",
            path: list_path,
            headers: key,
            body: b"",
        });
        cases.push(Case {
            name: head_name,
            host: admin.clone(),
            method: "HEAD",
            path: head_path,
            headers: key,
            body: b"",
        });
    }
    let mut signers: Vec<(&str, &AccessKey)> = names.iter().copied().zip(keys.iter()).collect();
    signers.push(("write", &keys[0]));
    signers.push(("foreign", &foreign));
    let out = raw(&env, &signers, &cases);

    assert_eq!(raw_answer(&out, "sigv2_data"), (400, "InvalidRequest".into()), "{}", out["sigv2_data"]);
    assert_eq!(out["sigv2_data"][2]["content-type"], "application/xml");
    assert_eq!(raw_answer(&out, "sigv2_admin"), (400, "InvalidRequest".into()), "{}", out["sigv2_admin"]);
    assert_eq!(raw_answer(&out, "foreign_id"), (403, "InvalidAccessKeyId".into()));
    assert_eq!(raw_answer(&out, "delete_in_stats").0, 200, "{}", out["delete_in_stats"]);
    for name in names {
        let (list, head) = (&out[format!("list_{name}")], &out[format!("head_{name}")]);
        // S3's answers, not the fixed route's: a listing in XML, a HeadBucket with its region.
        assert_eq!(
            (list[0].as_u64(), list[2]["content-type"].as_str()),
            (Some(200), Some("application/xml")),
            "{list}"
        );
        assert_eq!(
            (head[0].as_u64(), head[2]["x-amz-bucket-region"].as_str()),
            (Some(200), Some("us-east-1")),
            "{head}"
        );
    }
    let listed_keys = |bucket: &str| listed(&env, bucket).into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(listed_keys("stats"), ["inside.txt"], "DeleteObjects reached the stats bucket");
    assert_eq!(listed_keys("healthz"), ["inside.txt"], "the SigV2 PUT stored nothing");
    // The fixed routes still answer their own callers.
    assert_eq!(server.admin("GET", "/healthz", &[], b"").status, 200);
    let metrics = server.admin("GET", "/metrics", &[], b"");
    assert!(String::from_utf8_lossy(&metrics.body).contains("blobgate_"), "metrics still served");
}
