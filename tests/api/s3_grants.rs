//! Credentials with several grants: a copy needs read on its source and write on its target, ListBuckets shows
//! the buckets a key's grants name, and a key with `*:admin` creates and deletes buckets with boto3, s3cmd and
//! rclone; tokens hold several grants too, and both list commands show them.

use crate::helpers::s3::*;
use crate::helpers::*;

/// boto3: copies between buckets with each key, and what each answered.
const COPIES: &str = r#"
out = {}
for name, key in spec["keys"].items():
    s3 = client(spec["endpoint"], key)
    for source, target in spec["copies"]:
        sb, sk = source.split("/", 1)
        tb, tk = target.split("/", 1)
        out[f"{name} {source} -> {target}"] = code(
            lambda: s3.copy_object(Bucket=tb, Key=tk, CopySource={"Bucket": sb, "Key": sk}))
    out[f"{name} buckets"] = [b["Name"] for b in s3.list_buckets()["Buckets"]]
print(json.dumps(out))
"#;

#[test]
fn a_copy_needs_read_on_its_source_and_write_on_its_target() {
    let env = TestEnv::new();
    for bucket in ["releases", "ci-builds", "secret"] {
        env.bucket(bucket, false);
    }
    let bytes = test_bytes(300_000, 3);
    env.put_bytes("releases", "app.bin", &bytes, &[]);
    env.put_bytes("secret", "key.pem", b"private", &[]);
    let copier = s3_key_granting(&env, &["releases:read", "ci-builds:write"]);
    let narrow = s3_key_granting(&env, &["releases/app:read", "ci-builds/only/:write"]);
    let writer = s3_key_granting(&env, &["ci-builds:write"]);
    let server = env.serve();
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.data),
        "keys": {"copier": key_json(&copier), "narrow": key_json(&narrow), "writer": key_json(&writer)},
        "copies": [
            ["releases/app.bin", "ci-builds/app.bin"],
            ["releases/app.bin", "ci-builds/only/app.bin"],
            ["secret/key.pem", "ci-builds/key.pem"],
            ["releases/app.bin", "releases/again.bin"],
        ],
    });
    let home = tempfile::tempdir().unwrap();
    let out = run_boto3(home.path(), COPIES, &spec);
    let answer = |name: &str| out[name].clone();
    let ok = serde_json::json!([200, ""]);
    let denied = serde_json::json!([403, "AccessDenied"]);
    assert_eq!(answer("copier releases/app.bin -> ci-builds/app.bin"), ok, "{out}");
    assert_eq!(answer("copier releases/app.bin -> ci-builds/only/app.bin"), ok, "{out}");
    assert_eq!(answer("copier secret/key.pem -> ci-builds/key.pem"), denied, "no grant on the source: {out}");
    assert_eq!(answer("copier releases/app.bin -> releases/again.bin"), denied, "read only on the target: {out}");
    assert_eq!(answer("narrow releases/app.bin -> ci-builds/app.bin"), denied, "outside its ci prefix: {out}");
    assert_eq!(answer("narrow releases/app.bin -> ci-builds/only/app.bin"), ok, "{out}");
    assert_eq!(answer("writer releases/app.bin -> ci-builds/app.bin"), denied, "no read on the source: {out}");
    // ListBuckets: the buckets a key's grants name, by name.
    assert_eq!(answer("copier buckets"), serde_json::json!(["ci-builds", "releases"]), "{out}");
    assert_eq!(answer("writer buckets"), serde_json::json!(["ci-builds"]), "{out}");

    let read = |path: &str| {
        let headers = signed_headers(&copier, path, &Signing::default());
        server.get(path, &as_refs(&headers))
    };
    assert_eq!(sha256_hex(&read("/ci-builds/app.bin").body), sha256_hex(&bytes));
    assert_eq!(sha256_hex(&read("/ci-builds/only/app.bin").body), sha256_hex(&bytes));
    assert_eq!(read("/secret/key.pem").status, 403);
    let listed = env.ok(&["ls", "ci-builds"]);
    assert!(!listed.contains("key.pem"), "a refused copy stores nothing: {listed}");

    // `s3-key list` shows each key's grants as `--grant` takes them.
    let keys = env.ok(&["s3-key", "list"]);
    let narrow_line: serde_json::Value = keys
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|k| k["id"] == narrow.id.as_str())
        .expect("listed");
    assert_eq!(narrow_line["grants"], serde_json::json!(["releases/app:read", "ci-builds/only/:write"]), "{keys}");
    assert_eq!(narrow_line["bucket"], "releases", "the first grant, as before keys had several");

    let (errors, series) = server.server_errors();
    assert!(series > 0 && errors == 0.0, "5xx responses: {errors}");
}

/// boto3 with an admin key of every bucket: create, list, fill, refuse to delete while full, empty, delete.
const BUCKETS: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
out = {}
out["create"] = code(lambda: s3.create_bucket(Bucket="made-by-boto3"))
out["again"] = code(lambda: s3.create_bucket(Bucket="made-by-boto3"))
out["bad name"] = code(lambda: s3.create_bucket(Bucket="Bad_Name"))
s3.put_object(Bucket="made-by-boto3", Key="a.txt", Body=b"in a new bucket")
out["body"] = s3.get_object(Bucket="made-by-boto3", Key="a.txt")["Body"].read().decode()
out["buckets"] = [b["Name"] for b in s3.list_buckets()["Buckets"]]
out["delete full"] = code(lambda: s3.delete_bucket(Bucket="made-by-boto3"))
s3.delete_object(Bucket="made-by-boto3", Key="a.txt")
out["delete empty"] = code(lambda: s3.delete_bucket(Bucket="made-by-boto3"))
out["head deleted"] = code(lambda: s3.head_bucket(Bucket="made-by-boto3"))
out["delete missing"] = code(lambda: s3.delete_bucket(Bucket="never-made"))
if "writer" in spec:
    w = client(spec["endpoint"], spec["writer"])
    out["writer create"] = code(lambda: w.create_bucket(Bucket="by-a-writer"))
    out["writer delete"] = code(lambda: w.delete_bucket(Bucket="existing"))
    out["writer delete missing"] = code(lambda: w.delete_bucket(Bucket="never-made"))
print(json.dumps(out))
"#;

#[test]
fn an_admin_key_of_every_bucket_creates_and_deletes_buckets_with_boto3_s3cmd_and_rclone() {
    let env = TestEnv::new();
    env.bucket("existing", false);
    let admin = s3_key_granting(&env, &["*:admin"]);
    let writer = s3_key(&env, "existing", &["--scope", "admin"]);
    let server = env.serve();
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.data), "key": key_json(&admin), "writer": key_json(&writer),
    });
    let home = tempfile::tempdir().unwrap();
    let out = run_boto3(home.path(), BUCKETS, &spec);
    let ok = serde_json::json!([200, ""]);
    assert_eq!(out["create"], ok, "{out}");
    assert_eq!(out["again"], serde_json::json!([409, "BucketAlreadyOwnedByYou"]), "{out}");
    assert_eq!(out["bad name"][0], 400, "{out}");
    assert_eq!(out["body"], "in a new bucket");
    assert_eq!(out["buckets"], serde_json::json!(["existing", "made-by-boto3"]), "every bucket: {out}");
    assert_eq!(out["delete full"], serde_json::json!([409, "BucketNotEmpty"]), "{out}");
    assert_eq!(out["delete empty"], ok, "{out}");
    assert_eq!(out["head deleted"][0], 404, "{out}");
    assert_eq!(out["delete missing"], serde_json::json!([404, "NoSuchBucket"]), "{out}");
    // Admin of one bucket is not admin of every bucket: no creating, no deleting, and no telling whether a bucket
    // exists.
    assert_eq!(out["writer create"], serde_json::json!([403, "AccessDenied"]), "{out}");
    assert_eq!(out["writer delete"], serde_json::json!([403, "AccessDenied"]), "{out}");
    assert_eq!(out["writer delete missing"], serde_json::json!([403, "AccessDenied"]), "{out}");

    // s3cmd mb and rb, rclone mkdir and rmdir, against the data listener alone.
    let endpoint = server.data.to_string();
    let s3cmd_home = env.dir.path().join("s3cmd-home");
    s3cmd_config(&s3cmd_home, &admin, &endpoint);
    let s3cmd_ok = |args: &[&str]| {
        let out = s3cmd(&s3cmd_home, args);
        assert!(out.status.success(), "s3cmd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    s3cmd_ok(&["mb", "s3://made-by-s3cmd"]);
    let put = test_bytes(70_000, 4);
    let put_path = write_file(env.dir.path(), "s3cmd.bin", &put);
    s3cmd_ok(&["put", put_path.to_str().unwrap(), "s3://made-by-s3cmd/x.bin"]);
    let rclone_home = env.dir.path().join("rclone-home");
    rclone_config(&rclone_home, &admin, &endpoint, "");
    rclone(&rclone_home, &["mkdir", "bg:made-by-rclone"]);
    rclone(&rclone_home, &["copyto", "bg:made-by-s3cmd/x.bin", "bg:made-by-rclone/y.bin"]);
    let got = rclone_home.join("y.bin");
    rclone(&rclone_home, &["copyto", "bg:made-by-rclone/y.bin", got.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&got).unwrap()), sha256_hex(&put));
    let buckets = env.ok(&["bucket", "list"]);
    for name in ["existing", "made-by-s3cmd", "made-by-rclone"] {
        assert!(buckets.contains(name), "{name}: {buckets}");
    }
    assert!(!buckets.contains("made-by-boto3"), "{buckets}");
    s3cmd_ok(&["del", "s3://made-by-s3cmd/x.bin"]);
    s3cmd_ok(&["rb", "s3://made-by-s3cmd"]);
    rclone(&rclone_home, &["purge", "bg:made-by-rclone"]);
    let buckets = env.ok(&["bucket", "list"]);
    assert!(!buckets.contains("made-by-s3cmd") && !buckets.contains("made-by-rclone"), "{buckets}");

    // A key that may not create gets a refusal from s3cmd, and nothing is made.
    let writer_home = env.dir.path().join("s3cmd-writer");
    s3cmd_config(&writer_home, &writer, &endpoint);
    let refused = s3cmd(&writer_home, &["mb", "s3://not-allowed"]);
    assert!(!refused.status.success(), "s3cmd mb with a one-bucket key succeeded");
    assert!(!env.ok(&["bucket", "list"]).contains("not-allowed"));

    let (errors, series) = server.server_errors();
    assert!(series > 0 && errors == 0.0, "5xx responses: {errors}");
}

#[test]
fn a_token_with_several_grants_reads_and_writes_where_each_allows() {
    let env = TestEnv::new();
    env.bucket("docs", false);
    env.bucket("uploads", false);
    env.bucket("other", false);
    env.put_bytes("docs", "guide.txt", b"guide", &[]);
    env.put_bytes("other", "x.txt", b"x", &[]);
    let token = env.ok(&["token", "create", "--grant", "docs:read", "--grant", "uploads/in/:write"]).trim().to_owned();
    let server = env.serve();
    assert_eq!(server.get_auth("/docs/guide.txt", &token, &[]).body, b"guide");
    assert_eq!(server.get_auth("/other/x.txt", &token, &[]).status, 403);
    assert_eq!(server.put("/uploads/in/a.txt", &token, b"uploaded", &[]).status, 201);
    assert_eq!(server.put("/uploads/out.txt", &token, b"no", &[]).status, 403, "outside its prefix");
    assert_eq!(server.put("/docs/new.txt", &token, b"no", &[]).status, 403, "read only there");
    assert_eq!(server.get_auth("/uploads/in/a.txt", &token, &[]).body, b"uploaded", "write includes read");

    let listed = env.ok(&["token", "list"]);
    let line: serde_json::Value = serde_json::from_str(listed.lines().next().unwrap()).unwrap();
    assert_eq!(line["grants"], serde_json::json!(["docs:read", "uploads/in/:write"]), "{listed}");

    // The one-grant flags and --grant go together; bad grants are refused in one line.
    let both = env.ok(&["token", "create", "--bucket", "docs", "--grant", "other:read"]);
    assert!(!both.trim().is_empty());
    for (args, says) in [
        (vec!["--grant", "docs"], "BUCKET[/PREFIX]:SCOPE"),
        (vec!["--grant", "docs:owner"], "read, write or admin"),
        (vec!["--grant", "nosuch:read"], "nosuch"),
        (vec!["--prefix", "p/"], "--prefix and --scope go with --bucket"),
        (vec![], "--grant"),
    ] {
        let mut full = vec!["token", "create"];
        full.extend(args.iter());
        let err = env.fails(&full);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
