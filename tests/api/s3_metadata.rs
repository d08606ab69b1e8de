//! S3 user metadata (`x-amz-meta-*`): stored with the object by PutObject and CreateMultipartUpload, kept or
//! replaced by a copy, answered by GetObject and HeadObject on both listeners, bounded at 2 KB. Driven by boto3,
//! aws-cli and rclone (which keeps a file's modification time in `x-amz-meta-mtime` and reads it back).

use crate::helpers::s3::{aws, aws_home, key_json, rclone, rclone_config, rclone_output, run_boto3, s3_key};
use crate::helpers::*;
use crate::s3_writes::listed;

const BOTO3_METADATA: &str = r#"
s3, data = client(spec["admin"], spec["key"]), client(spec["data"], spec["key"])
b = "bkt"
out = {}
meta = {"Mtime": "1700000000.5", "a-b": "x, y", "empty": ""}
s3.put_object(Bucket=b, Key="put.txt", Body=b"hello", Metadata=meta)
out["head"] = data.head_object(Bucket=b, Key="put.txt")["Metadata"]
out["get"] = data.get_object(Bucket=b, Key="put.txt")["Metadata"]
out["head_admin"] = s3.head_object(Bucket=b, Key="put.txt")["Metadata"]
s3.upload_file(spec["big"], b, "multipart.bin", ExtraArgs={"Metadata": {"origin": "ci"}},
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
out["multipart"] = data.head_object(Bucket=b, Key="multipart.bin")["Metadata"]
s3.copy_object(Bucket=b, Key="copied.txt", CopySource={"Bucket": b, "Key": "put.txt"})
out["copied"] = data.head_object(Bucket=b, Key="copied.txt")["Metadata"]
s3.copy_object(Bucket=b, Key="replaced.txt", CopySource={"Bucket": b, "Key": "put.txt"},
    MetadataDirective="REPLACE", Metadata={"new": "1"})
out["replaced"] = data.head_object(Bucket=b, Key="replaced.txt")["Metadata"]
s3.put_object(Bucket=b, Key="put.txt", Body=b"hello again")
out["overwritten"] = data.head_object(Bucket=b, Key="put.txt")["Metadata"]
out["at_limit"] = code(lambda: s3.put_object(Bucket=b, Key="limit.txt", Body=b"x", Metadata={"k": "v" * 2047}))
out["too_large"] = code(lambda: s3.put_object(Bucket=b, Key="large.txt", Body=b"x", Metadata={"k": "v" * 2048}))
out["too_large_upload"] = code(lambda: s3.create_multipart_upload(Bucket=b, Key="large.bin",
    Metadata={"k": "v" * 3000}))
out["too_large_copy"] = code(lambda: s3.copy_object(Bucket=b, Key="large-copy.txt",
    CopySource={"Bucket": b, "Key": "copied.txt"}, MetadataDirective="REPLACE", Metadata={"k": "v" * 3000}))
print(json.dumps(out))
"#;

both_backends!(boto3_user_metadata_is_stored_copied_and_answered, |env| boto3_metadata_on(env));

fn boto3_metadata_on(env: TestEnv) {
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let big_path = write_file(env.dir.path(), "big.bin", &test_bytes(11 << 20, 5));
    let spec = serde_json::json!({
        "admin": format!("http://{}", server.admin), "data": format!("http://{}", server.data),
        "key": key_json(&key), "big": big_path,
    });
    let out = run_boto3(&env.dir.path().join("boto3-home"), BOTO3_METADATA, &spec);

    // Field names are case-insensitive, so S3 (and we) answer them in lower case.
    let sent = serde_json::json!({"mtime": "1700000000.5", "a-b": "x, y", "empty": ""});
    assert_eq!(out["head"], sent, "HeadObject on the data listener");
    assert_eq!(out["get"], sent, "GetObject");
    assert_eq!(out["head_admin"], sent, "HeadObject on the admin listener");
    assert_eq!(out["multipart"], serde_json::json!({"origin": "ci"}), "CreateMultipartUpload's metadata");
    assert_eq!(out["copied"], sent, "a COPY keeps the source's");
    assert_eq!(out["replaced"], serde_json::json!({"new": "1"}), "a REPLACE takes the request's");
    assert_eq!(out["overwritten"], serde_json::json!({}), "a new PutObject without metadata has none");
    assert_eq!(out["at_limit"], serde_json::json!([200, ""]), "2 KB of names and values is allowed");
    for case in ["too_large", "too_large_upload", "too_large_copy"] {
        assert_eq!(out[case], serde_json::json!([400, "MetadataTooLarge"]), "{case}");
    }
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["copied.txt", "limit.txt", "multipart.bin", "put.txt", "replaced.txt"],
        "refusals stored nothing"
    );
}

#[test]
fn aws_cli_metadata_and_rclone_modification_times_survive_the_round_trip() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = format!("http://{}", server.admin);
    let data = format!("http://{}", server.data);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);
    let file = write_file(env.dir.path(), "a.txt", b"metadata");
    aws(&home, &admin, &["s3", "cp", file.to_str().unwrap(), "s3://bkt/a.txt", "--metadata", "build=42,branch=main"]);
    let head = aws(&home, &data, &["s3api", "head-object", "--bucket", "bkt", "--key", "a.txt"]);
    let head: serde_json::Value = serde_json::from_str(&head).expect("head-object prints JSON");
    assert_eq!(head["Metadata"], serde_json::json!({"build": "42", "branch": "main"}));

    // rclone keeps the file's mtime in x-amz-meta-mtime and lists it from there: an old mtime comes back.
    let rclone_home = env.dir.path().join("rclone-home");
    rclone_config(&rclone_home, &key, &server.admin.to_string(), "");
    let local = rclone_home.join("src");
    std::fs::create_dir_all(&local).unwrap();
    let old = write_file(&local, "old.bin", &test_bytes(1000, 6));
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000); // 2001-09-09
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(mtime).unwrap();
    rclone(&rclone_home, &["copy", local.to_str().unwrap(), "bg:bkt/rc"]);
    let listing = rclone(&rclone_home, &["lsl", "bg:bkt/rc"]);
    assert!(listing.contains("2001-09-09"), "rclone reads the mtime it stored: {listing}");
    let again = rclone_output(&rclone_home, &["copy", "-v", "--stats", "0", local.to_str().unwrap(), "bg:bkt/rc"]);
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{log}");
    assert!(!log.contains("Copied"), "a second copy sees equal mtimes and copies nothing: {log}");
}
