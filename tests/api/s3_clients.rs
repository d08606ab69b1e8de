//! The S3 API driven by real clients: boto3, aws-cli (v1), rclone (`provider=Other`, both list versions) and
//! s3cmd, each with its own config and a clean environment (no inherited `AWS_*`/`RCLONE_*`, its own `$HOME`),
//! every byte checked with SHA-256. Objects are seeded with `blobgate put`; signatures come from botocore, never
//! from our code. Bad input (wrong secret, unknown or revoked key, wrong bucket or prefix, skewed dates,
//! tampered presigned URLs, over-long expiry) gets the right S3 error code and reveals nothing.

use std::process::Command;

use crate::helpers::s3::*;
use crate::helpers::*;

/// A private bucket `bkt` with the odd keys, a 40 MiB object and a read key.
struct World {
    env: TestEnv,
    objects: Vec<(String, Vec<u8>)>,
    key: AccessKey,
}

const BIG: &str = "big/forty.bin";

fn world() -> World {
    world_in(TestEnv::new())
}

/// The same world in `env` (e.g. `TestEnv::on_postgres()`).
fn world_in(env: TestEnv) -> World {
    env.bucket("bkt", false);
    let mut objects = Vec::new();
    for (i, key) in ODD_KEYS.iter().enumerate() {
        let bytes = test_bytes(1000 + i * 777, i as u64);
        env.put_bytes("bkt", key, &bytes, &[]);
        objects.push(((*key).to_owned(), bytes));
    }
    let big = test_bytes(40 << 20, 40);
    env.put_bytes("bkt", BIG, &big, &[]);
    objects.push((BIG.to_owned(), big));
    objects.sort();
    let key = s3_key(&env, "bkt", &[]);
    World { env, objects, key }
}

impl World {
    fn keys(&self) -> Vec<&str> {
        self.objects.iter().map(|(k, _)| k.as_str()).collect()
    }

    fn bytes(&self, key: &str) -> &[u8] {
        &self.objects.iter().find(|(k, _)| k == key).expect("a seeded key").1
    }
}

const BOTO3_SCRIPT: &str = r#"
s3 = client(spec["endpoint"], spec)
b = "bkt"
out = {"buckets": [x["Name"] for x in s3.list_buckets()["Buckets"]]}
out["region"] = s3.head_bucket(Bucket=b)["ResponseMetadata"]["HTTPHeaders"].get("x-amz-bucket-region")
out["objects"] = {}
for key in spec["keys"]:
    got = s3.get_object(Bucket=b, Key=key)
    head = s3.head_object(Bucket=b, Key=key)
    out["objects"][key] = {"sha256": hashlib.sha256(got["Body"].read()).hexdigest(), "size": head["ContentLength"],
                           "etag": head["ETag"]}
got = s3.get_object(Bucket=b, Key=spec["keys"][0], Range="bytes=3-12")
out["range"] = {"sha256": hashlib.sha256(got["Body"].read()).hexdigest(), "content_range": got["ContentRange"]}
try:
    s3.get_object(Bucket=b, Key=spec["keys"][0], Range="bytes=0-9", IfMatch='"0000"')
    out["if_match"] = "served"
except ClientError as e:
    out["if_match"] = e.response["Error"]["Code"]
try:
    s3.get_object(Bucket=b, Key="no/such/key")
    out["missing"] = "served"
except ClientError as e:
    out["missing"] = e.response["Error"]["Code"]
pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket=b, PaginationConfig={"PageSize": 2}))
out["v2_pages"] = len(pages)
out["v2"] = [o["Key"] for p in pages for o in p.get("Contents", [])]
out["v2_sizes"] = {o["Key"]: o["Size"] for p in pages for o in p.get("Contents", [])}
pages = list(s3.get_paginator("list_objects").paginate(Bucket=b, PaginationConfig={"PageSize": 2}))
out["v1_pages"] = len(pages)
out["v1"] = [o["Key"] for p in pages for o in p.get("Contents", [])]
r = s3.list_objects_v2(Bucket=b, Delimiter="/")
out["delimited"] = {"keys": [o["Key"] for o in r.get("Contents", [])],
                    "prefixes": [p["Prefix"] for p in r.get("CommonPrefixes", [])]}
r = s3.list_objects_v2(Bucket=b, Prefix="dir/", Delimiter="/")
out["delimited_dir"] = {"keys": [o["Key"] for o in r.get("Contents", [])],
                        "prefixes": [p["Prefix"] for p in r.get("CommonPrefixes", [])]}
s3.download_file(b, spec["big"], spec["download_to"],
                 Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4))
out["presigned"] = s3.generate_presigned_url("get_object", Params={"Bucket": b, "Key": spec["keys"][0],
    "ResponseContentType": "text/x-presigned", "ResponseContentDisposition": "attachment"}, ExpiresIn=300)
print(json.dumps(out))
"#;

// On PostgreSQL the access key (its sealed secret), the objects and every listing page come from there.
both_backends!(boto3_gets_heads_lists_downloads_and_presigns, |env| {
    let w = world_in(env);
    if w.env.database_url.is_some() {
        assert!(!w.env.data_dir().join("blobgate.db").exists(), "no SQLite database beside PostgreSQL");
    }
    boto3_session(&w);
});

/// Runs `BOTO3_SCRIPT` against a server on `w` and checks every answer.
fn boto3_session(w: &World) {
    require_tool("curl", "apt package curl");
    let server = w.env.serve();
    let home = w.env.dir.path().join("boto3-home");
    let download = w.env.dir.path().join("boto3-download.bin");
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.data), "id": w.key.id, "secret": w.key.secret,
        "keys": w.keys(), "big": BIG, "download_to": download,
    });
    let out = boto3_output(&home, BOTO3_SCRIPT, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");

    assert_eq!(out["buckets"], serde_json::json!(["bkt"]));
    assert_eq!(out["region"], "us-east-1");
    for (key, bytes) in &w.objects {
        let got = &out["objects"][key];
        assert_eq!(got["sha256"], sha256_hex(bytes), "{key}");
        assert_eq!(got["size"], bytes.len(), "{key}");
        // `blobgate put` records the MD5, the ETag S3 clients expect of a single upload.
        let md5 = hex::encode(<md5::Md5 as sha2::Digest>::digest(bytes));
        assert_eq!(got["etag"], format!("\"{md5}\""), "{key}");
    }
    let first = w.bytes(w.keys()[0]);
    assert_eq!(out["range"]["sha256"], sha256_hex(&first[3..=12]));
    assert_eq!(out["range"]["content_range"], format!("bytes 3-12/{}", first.len()));
    assert_eq!(out["if_match"], "PreconditionFailed", "a changed object must not be stitched into a download");
    assert_eq!(out["missing"], "NoSuchKey");

    let all: Vec<&str> = w.keys();
    assert_eq!(out["v2"], serde_json::json!(all), "V2 lists every odd key exactly, in order");
    assert_eq!(out["v2_pages"], all.len().div_ceil(2), "pages of two");
    assert_eq!(out["v1"], serde_json::json!(all), "V1 too");
    assert_eq!(out["v1_pages"], all.len().div_ceil(2));
    for (key, bytes) in &w.objects {
        assert_eq!(out["v2_sizes"][key], bytes.len(), "{key}");
    }
    assert_eq!(out["delimited"]["keys"], serde_json::json!(["100%.txt", "top+plus.txt"]));
    assert_eq!(out["delimited"]["prefixes"], serde_json::json!(["big/", "dir/", "x/"]));
    assert_eq!(out["delimited_dir"]["keys"], serde_json::json!(["dir/a b+c%d.txt"]));
    assert_eq!(out["delimited_dir"]["prefixes"], serde_json::json!(["dir/sub/"]));

    let downloaded = std::fs::read(&download).expect("download_file wrote the file");
    assert_eq!(sha256_hex(&downloaded), sha256_hex(w.bytes(BIG)), "download_file with four threads");

    // The presigned URL works from curl, with the signed overrides.
    let url = out["presigned"].as_str().unwrap();
    assert!(url.contains("X-Amz-Signature="), "a SigV4 presigned URL: {url}");
    let fetched = w.env.dir.path().join("presigned.bin");
    let headers = run_ok(Command::new("curl").args(["-sS", "--fail", "-D", "-", "-o"]).arg(&fetched).arg(url));
    assert_eq!(sha256_hex(&std::fs::read(&fetched).unwrap()), sha256_hex(first));
    let headers = headers.to_ascii_lowercase();
    assert!(headers.contains("content-type: text/x-presigned"), "{headers}");
    assert!(headers.contains("content-disposition: attachment"), "{headers}");
    assert!(headers.contains("x-amz-request-id: "), "{headers}");
}

#[test]
fn aws_cli_lists_copies_down_and_presigns() {
    require_tool("curl", "apt package curl");
    let w = world();
    let server = w.env.serve();
    let endpoint = format!("http://{}", server.data);
    let home = w.env.dir.path().join("aws-home");
    aws_home(&home, &w.key);

    let listing = aws(&home, &endpoint, &["s3", "ls", "--recursive", "s3://bkt/"]);
    for (key, bytes) in &w.objects {
        let line =
            listing.lines().find(|l| l.ends_with(&format!(" {key}"))).unwrap_or_else(|| panic!("{key} in {listing}"));
        assert!(line.contains(&format!(" {} ", bytes.len())), "{line}");
    }
    let top = aws(&home, &endpoint, &["s3", "ls", "s3://bkt/"]);
    assert!(top.contains("PRE dir/") && top.contains("PRE big/") && top.contains("top+plus.txt"), "{top}");

    let down = w.env.dir.path().join("aws-down.bin");
    aws(&home, &endpoint, &["s3", "cp", &format!("s3://bkt/{BIG}"), down.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&down).unwrap()), sha256_hex(w.bytes(BIG)));
    let odd = w.env.dir.path().join("aws-odd.bin");
    aws(&home, &endpoint, &["s3", "cp", "s3://bkt/dir/sub/é ü.bin", odd.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&odd).unwrap()), sha256_hex(w.bytes("dir/sub/é ü.bin")));

    let url = aws(&home, &endpoint, &["s3", "presign", "s3://bkt/100%.txt", "--expires-in", "300"]);
    let url = url.trim();
    assert!(url.contains("X-Amz-Signature="), "{url}");
    let fetched = w.env.dir.path().join("aws-presigned.bin");
    run_ok(Command::new("curl").args(["-sS", "--fail", "-o"]).arg(&fetched).arg(url));
    assert_eq!(sha256_hex(&std::fs::read(&fetched).unwrap()), sha256_hex(w.bytes("100%.txt")));
}

#[test]
fn rclone_lists_copies_and_checks_with_both_list_versions() {
    let w = world();
    let server = w.env.serve();
    for list_version in ["1", "2"] {
        let home = w.env.dir.path().join(format!("rclone-home-{list_version}"));
        rclone_config(&home, &w.key, &server.data.to_string(), &format!("list_version = {list_version}\n"));
        let listing = rclone(&home, &["ls", "bg:bkt"]);
        for (key, bytes) in &w.objects {
            let want = format!("{} {key}", bytes.len());
            assert!(
                listing.lines().any(|l| l.trim_start() == want),
                "list_version {list_version}: {want:?} in {listing}"
            );
        }
        let local = home.join("copy");
        rclone(&home, &["copy", "bg:bkt", local.to_str().unwrap()]);
        for (key, bytes) in &w.objects {
            let got = std::fs::read(local.join(key)).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(sha256_hex(&got), sha256_hex(bytes), "list_version {list_version}: {key}");
        }
        // S3 reads answer a single upload's MD5 as its ETag, which `check` compares with the local files' MD5s;
        // `--download` compares the bytes themselves.
        for how in [&[][..], &["--download"][..]] {
            let args: Vec<&str> =
                ["check"].into_iter().chain(how.iter().copied()).chain(["bg:bkt", local.to_str().unwrap()]).collect();
            let checked = rclone_output(&home, &args);
            assert!(checked.status.success(), "rclone check {how:?}: {}", String::from_utf8_lossy(&checked.stderr));
            let report = String::from_utf8_lossy(&checked.stderr);
            assert!(report.contains(&format!("{} matching files", w.objects.len())), "{how:?}: {report}");
            assert!(!report.contains("hash"), "{how:?}: every hash compared: {report}");
        }
    }
}

#[test]
fn s3cmd_lists_and_gets() {
    let w = world();
    let server = w.env.serve();
    let home = w.env.dir.path().join("s3cmd-home");
    s3cmd_config(&home, &w.key, &server.data.to_string());
    let out = s3cmd(&home, &["ls", "--recursive", "s3://bkt/"]);
    assert!(out.status.success(), "s3cmd ls: {}", String::from_utf8_lossy(&out.stderr));
    let listing = String::from_utf8_lossy(&out.stdout);
    for (key, bytes) in &w.objects {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!("s3://bkt/{key}")))
            .unwrap_or_else(|| panic!("{key} in {listing}"));
        assert!(line.split_whitespace().any(|f| f == bytes.len().to_string()), "{line}");
    }
    for key in ["dir/a b+c%d.txt", BIG] {
        let local = home.join("got.bin");
        let _ = std::fs::remove_file(&local);
        let out = s3cmd(&home, &["get", "--force", &format!("s3://bkt/{key}"), local.to_str().unwrap()]);
        assert!(out.status.success(), "s3cmd get {key}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(sha256_hex(&std::fs::read(&local).unwrap()), sha256_hex(w.bytes(key)), "{key}");
    }
}

/// Every refusal: the right S3 code, the same answer for a present and an absent object, nothing else told.
#[test]
fn bad_credentials_get_the_right_s3_error_and_reveal_nothing() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.bucket("other", false);
    let bytes = test_bytes(5000, 7);
    env.put_bytes("bkt", "pub/a.txt", &bytes, &[]);
    env.put_bytes("bkt", "secret/b.txt", &bytes, &[]);
    env.put_bytes("other", "pub/a.txt", &bytes, &[]);
    let good = s3_key(&env, "bkt", &[]);
    let prefixed = s3_key(&env, "bkt", &["--prefix", "pub/"]);
    let revoked = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    env.ok(&["s3-key", "revoke", &revoked.id]);

    let get = |path: &str, headers: &[(String, String)]| server.get(path, &as_refs(headers));
    let sign =
        |key: &AccessKey, path: &str| signed_headers(key, path, &Signing { method: "GET", ..Default::default() });

    // The good key reads.
    let ok = get("/bkt/pub/a.txt", &sign(&good, "/bkt/pub/a.txt"));
    assert_eq!(ok.status, 200);
    assert!(ok.body == bytes);
    assert!(ok.header("x-amz-request-id").is_some());

    let wrong_secret = AccessKey { id: good.id.clone(), secret: "x".repeat(40) };
    let unknown = AccessKey { id: "AKBGAAAAAAAAAAAAAAAA".into(), secret: good.secret.clone() };
    // (what, key, object path, status, code): each for a present and an absent object alike.
    let cases: [(&str, &AccessKey, &str, u16, &str); 6] = [
        ("wrong secret", &wrong_secret, "/bkt/pub/", 403, "SignatureDoesNotMatch"),
        ("unknown key", &unknown, "/bkt/pub/", 403, "InvalidAccessKeyId"),
        ("revoked key", &revoked, "/bkt/pub/", 403, "InvalidAccessKeyId"),
        ("wrong bucket", &good, "/other/pub/", 403, "AccessDenied"),
        ("wrong prefix", &prefixed, "/bkt/secret/", 403, "AccessDenied"),
        ("absent bucket", &good, "/nosuch/pub/", 403, "AccessDenied"),
    ];
    for (what, key, dir, status, code) in cases {
        let mut bodies = Vec::new();
        for name in ["a.txt", "b.txt", "missing.txt"] {
            let path = format!("{dir}{name}");
            let r = get(&path, &sign(key, &path));
            assert_eq!((r.status, s3_code(&r)), (status, code.to_owned()), "{what}: {path}");
            assert_eq!(r.header("content-type"), Some("application/xml"), "{what}");
            let body = String::from_utf8_lossy(&r.body).to_string();
            // Only the request id and the echoed path differ between the answers.
            let id = r.header("x-amz-request-id").unwrap().to_owned();
            bodies.push(body.replace(&id, "ID").replace(&path, "PATH"));
        }
        assert!(bodies.windows(2).all(|w| w[0] == w[1]), "{what}: the answers differ: {bodies:?}");
    }
    // A prefixed key lists under its prefix only; asking for another, or a shorter one, is refused.
    let list = |key: &AccessKey, query: &str| {
        let path = format!("/bkt?{query}");
        get(&path, &sign(key, &path))
    };
    for query in ["list-type=2&prefix=secret%2F", "list-type=2", "prefix=pu"] {
        let r = list(&prefixed, query);
        assert_eq!((r.status, s3_code(&r)), (403, "AccessDenied".into()), "{query}");
    }
    let r = list(&good, "list-type=2&prefix=pub%2F");
    assert_eq!(r.status, 200);
    let r = list(&prefixed, "list-type=2&prefix=pub%2F");
    assert_eq!(r.status, 200);
    let body = String::from_utf8_lossy(&r.body);
    assert!(body.contains("<Key>pub/a.txt</Key>") && !body.contains("secret"), "{body}");

    // Skewed dates, both ways.
    for skew in [-20 * 60, 20 * 60] {
        let headers =
            signed_headers(&good, "/bkt/pub/a.txt", &Signing { method: "GET", skew_secs: skew, ..Default::default() });
        let r = get("/bkt/pub/a.txt", &headers);
        assert_eq!((r.status, s3_code(&r)), (403, "RequestTimeTooSkewed".into()), "skew {skew}");
    }
    // Within the 15 minutes: fine.
    let headers =
        signed_headers(&good, "/bkt/pub/a.txt", &Signing { method: "GET", skew_secs: -600, ..Default::default() });
    assert_eq!(get("/bkt/pub/a.txt", &headers).status, 200);
    // Another region's scope.
    let headers = signed_headers(
        &good,
        "/bkt/pub/a.txt",
        &Signing { method: "GET", region: Some("eu-west-1"), ..Default::default() },
    );
    let r = get("/bkt/pub/a.txt", &headers);
    assert_eq!((r.status, s3_code(&r)), (400, "AuthorizationHeaderMalformed".into()));

    // Over-long expiry: S3's 7 days at most.
    let presign = |key: &AccessKey, path: &str, expires: u64| {
        presigned_path(key, path, &Signing { method: "GET", expires: Some(expires), ..Default::default() })
    };
    let r = get(&presign(&good, "/bkt/pub/a.txt", 604_801), &[]);
    assert_eq!((r.status, s3_code(&r)), (400, "AuthorizationQueryParametersError".into()));
    let week = presign(&good, "/bkt/pub/a.txt", 604_800);
    assert_eq!(get(&week, &[]).status, 200, "exactly seven days is allowed");

    // Tampered presigned URLs: every character of the signature, then each signed field in turn.
    let url = presign(&good, "/bkt/pub/a.txt", 300);
    assert_eq!(get(&url, &[]).status, 200);
    let sig_at = url.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let sig_end = url[sig_at..].find('&').map_or(url.len(), |i| sig_at + i);
    for i in sig_at..sig_end {
        let mut tampered = url.clone().into_bytes();
        tampered[i] = if tampered[i] == b'0' { b'1' } else { b'0' };
        let tampered = String::from_utf8(tampered).unwrap();
        let r = get(&tampered, &[]);
        assert_eq!(r.status, 403, "signature char {}: {tampered}", i - sig_at);
        assert_eq!(s3_code(&r), "SignatureDoesNotMatch", "signature char {}", i - sig_at);
    }
    let field = |name: &str| -> (usize, usize) {
        let at = url.find(&format!("{name}=")).unwrap_or_else(|| panic!("{name} in {url}")) + name.len() + 1;
        (at, url[at..].find('&').map_or(url.len(), |i| at + i))
    };
    let replace = |name: &str, value: &str| {
        let (s, e) = field(name);
        format!("{}{value}{}", &url[..s], &url[e..])
    };
    let (s, e) = field("X-Amz-Date");
    let date = &url[s..e];
    let earlier_date = format!("{}{}", &date[..date.len() - 2], if date.ends_with("0Z") { "1Z" } else { "0Z" });
    let (s, e) = field("X-Amz-Credential");
    let credential = |id: &str| replace("X-Amz-Credential", &url[s..e].replacen(&good.id, id, 1));
    let tampered: [(&str, String, &str); 7] = [
        ("path", url.replacen("/bkt/pub/a.txt", "/bkt/pub/A.txt", 1), "SignatureDoesNotMatch"),
        ("expires", replace("X-Amz-Expires", "301"), "SignatureDoesNotMatch"),
        ("date", replace("X-Amz-Date", &earlier_date), "SignatureDoesNotMatch"),
        ("signed headers", replace("X-Amz-SignedHeaders", "host%3Brange"), "SignatureDoesNotMatch"),
        // The signature is checked before the key's state, so only the key's holder learns it was revoked.
        ("credential: a revoked key's id", credential(&revoked.id), "SignatureDoesNotMatch"),
        ("credential: another key's id", credential(&prefixed.id), "SignatureDoesNotMatch"),
        ("credential: an unknown id", credential("AKBGAAAAAAAAAAAAAAAA"), "InvalidAccessKeyId"),
    ];
    for (what, tampered, code) in tampered {
        let r = get(&tampered, &[]);
        assert_eq!(s3_code(&r), code, "{what}: {tampered}");
        assert!(r.status == 403 || r.status == 400, "{what}: {}", r.status);
    }
    // A response override added to a signed URL is not covered by the signature.
    let r = get(&format!("{url}&response-content-type=text%2Fhtml"), &[]);
    assert_eq!(s3_code(&r), "SignatureDoesNotMatch");
    // `response-*` overrides apply to presigned requests only; a header-signed one is served as stored.
    let path = "/bkt/pub/a.txt?response-content-type=text%2Fhtml";
    let r = get(path, &sign(&good, path));
    assert_eq!(r.status, 200);
    assert_ne!(r.header("content-type"), Some("text/html"), "no override without a presign");
    let overridden = presign(&good, path, 300);
    let r = get(&overridden, &[]);
    assert_eq!((r.status, r.header("content-type")), (200, Some("text/html")));
    // An empty override never removes a stored header: refused, even when signed.
    let empty = presign(&good, "/bkt/pub/a.txt?response-cache-control=", 300);
    let r = get(&empty, &[]);
    assert_eq!((r.status, s3_code(&r)), (400, "InvalidArgument".into()));
    // An expired presigned URL.
    let expired = presigned_path(
        &good,
        "/bkt/pub/a.txt",
        &Signing { method: "GET", expires: Some(60), skew_secs: -3600, ..Default::default() },
    );
    let r = get(&expired, &[]);
    assert_eq!((r.status, s3_code(&r)), (403, "AccessDenied".into()));
    // Native requests are untouched by all this: no SigV4, no XML.
    let native = server.get("/bkt/pub/a.txt", &[]);
    assert_eq!(native.status, 401);
    assert!(native.header("content-type").unwrap().starts_with("application/json"));
}

/// A revocation reaches a running server at its next request; the access log names the key.
#[test]
fn a_revoked_key_is_refused_at_the_next_request_and_the_log_names_keys() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "a.txt", b"hello", &[]);
    let key = s3_key(&env, "bkt", &[]);
    let log = env.dir.path().join("access.log");
    let server = env.serve_with(&[("BLOBGATE_ACCESS_LOG", log.to_str().unwrap())], &[]);
    let headers = signed_headers(&key, "/bkt/a.txt", &Signing { method: "GET", ..Default::default() });
    assert_eq!(server.get("/bkt/a.txt", &as_refs(&headers)).status, 200);
    let listed = env.ok(&["s3-key", "list"]);
    assert!(listed.contains(&key.id) && !listed.contains(&key.secret), "list never shows secrets: {listed}");
    env.ok(&["s3-key", "revoke", &key.id]);
    let r = server.get("/bkt/a.txt", &as_refs(&headers));
    assert_eq!((r.status, s3_code(&r)), (403, "InvalidAccessKeyId".into()));
    assert!(env.cli(&["s3-key", "revoke", &key.id]).status.code() == Some(1), "revoking twice fails");
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    let parsed =
        |text: &str| -> Vec<serde_json::Value> { text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect() };
    let written = wait_for(std::time::Duration::from_secs(30), || parsed(&read()).len() >= 2);
    let text = read();
    assert!(written, "access log: {text}");
    let lines = parsed(&text);
    assert_eq!(lines[0]["status"], 200, "{text}");
    assert_eq!(lines[0]["principal"], key.id.as_str(), "{text}");
    assert!(!text.contains("X-Amz-Signature") && !text.contains(&key.secret), "{text}");
}

/// The admin listener answers every S3 read too (listings, HeadBucket, HeadObject, GetObject with its ranges, by
/// sendfile from the same driver), and plain GETs keep their 405.
#[test]
fn the_admin_listener_answers_s3_reads_with_object_bodies() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "dir/a.txt", b"hello", &[]);
    let key = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    let admin = |method: &str, path: &str| {
        let headers = signed_headers_for_host("t", &key, path, &Signing { method, ..Default::default() });
        server.admin(method, path, &as_refs(&headers), b"")
    };
    let r = admin("GET", "/bkt?list-type=2&prefix=dir%2F");
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("<Key>dir/a.txt</Key>"));
    let r = admin("HEAD", "/bkt");
    assert_eq!((r.status, r.header("x-amz-bucket-region")), (200, Some("us-east-1")));
    let r = admin("HEAD", "/bkt/dir/a.txt");
    assert_eq!((r.status, r.header("content-length")), (200, Some("5")));
    assert!(r.header("x-amz-request-id").is_some());
    let r = admin("GET", "/bkt/dir/a.txt");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"hello"[..]));
    assert!(r.header("x-amz-request-id").is_some());
    let headers = signed_headers_for_host(
        "t",
        &key,
        "/bkt/dir/a.txt",
        &Signing { method: "GET", headers: &[("Range", "bytes=1-3")], ..Default::default() },
    );
    let r = server.admin("GET", "/bkt/dir/a.txt", &as_refs(&headers), b"");
    assert_eq!((r.status, r.body.as_slice(), r.header("content-range")), (206, &b"ell"[..], Some("bytes 1-3/5")));
    let r = admin("GET", "/bkt/dir/missing.txt");
    assert_eq!((r.status, s3_code(&r)), (404, "NoSuchKey".into()));
    assert_eq!(server.admin("GET", "/bkt/dir/a.txt", &[], b"").status, 405, "a native GET is still refused");
}
