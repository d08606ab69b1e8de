//! S3 object tags: given with PutObject and CreateMultipartUpload (`x-amz-tagging`), kept or replaced by a copy
//! (`x-amz-tagging-directive`), changed in place by PutObjectTagging and DeleteObjectTagging, read by
//! GetObjectTagging on both listeners and counted by GetObject's `x-amz-tagging-count`. Refused tag sets store
//! nothing. Driven by boto3 and aws-cli.

use crate::helpers::s3::{aws, aws_home, key_json, run_boto3, s3_key};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::{listed, read_back};

const BOTO3_TAGGING: &str = r#"
s3, data = client(spec["admin"], spec["key"]), client(spec["data"], spec["key"])
reader = client(spec["data"], spec["read"])
b = "bkt"
out = {}
def tags(c, key):
    return sorted([t["Key"], t["Value"]] for t in c.get_object_tagging(Bucket=b, Key=key)["TagSet"])
s3.put_object(Bucket=b, Key="put.txt", Body=b"hello", Tagging="team=build&path=a/b.c&empty=&sp%20ace=x%2By")
out["put"] = tags(data, "put.txt")
out["put_admin"] = tags(s3, "put.txt")
out["count"] = data.get_object(Bucket=b, Key="put.txt").get("TagCount")
etag = data.head_object(Bucket=b, Key="put.txt")["ETag"]
s3.put_object_tagging(Bucket=b, Key="put.txt", Tagging={"TagSet": [{"Key": "new", "Value": "1"}]})
out["retagged"] = tags(reader, "put.txt")
out["count_after"] = data.get_object(Bucket=b, Key="put.txt").get("TagCount")
out["etag_kept"] = data.head_object(Bucket=b, Key="put.txt")["ETag"] == etag
out["body_kept"] = data.get_object(Bucket=b, Key="put.txt")["Body"].read().decode()
s3.upload_file(spec["big"], b, "multipart.bin", ExtraArgs={"Tagging": "origin=ci"},
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
out["multipart"] = tags(data, "multipart.bin")
s3.copy_object(Bucket=b, Key="copied.txt", CopySource={"Bucket": b, "Key": "put.txt"})
out["copied"] = tags(data, "copied.txt")
s3.copy_object(Bucket=b, Key="replaced.txt", CopySource={"Bucket": b, "Key": "put.txt"},
    TaggingDirective="REPLACE", Tagging="other=2")
out["replaced"] = tags(data, "replaced.txt")
s3.copy_object(Bucket=b, Key="meta-only.txt", CopySource={"Bucket": b, "Key": "put.txt"},
    MetadataDirective="REPLACE", Metadata={"m": "1"})
out["meta_only"] = tags(data, "meta-only.txt")
s3.delete_object_tagging(Bucket=b, Key="copied.txt")
out["deleted"] = tags(data, "copied.txt")
out["count_none"] = data.get_object(Bucket=b, Key="copied.txt").get("TagCount")
s3.put_object(Bucket=b, Key="put.txt", Body=b"hello again")
out["overwritten"] = tags(data, "put.txt")
eleven = [{"Key": "k%d" % i, "Value": ""} for i in range(11)]
out["too_many"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="replaced.txt", Tagging={"TagSet": eleven}))
out["repeated"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="replaced.txt",
    Tagging={"TagSet": [{"Key": "a", "Value": "1"}, {"Key": "a", "Value": "2"}]}))
out["bad_char"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="replaced.txt",
    Tagging={"TagSet": [{"Key": "a*b", "Value": "1"}]}))
out["reserved"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="replaced.txt",
    Tagging={"TagSet": [{"Key": "aws:x", "Value": "1"}]}))
out["long_value"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="replaced.txt",
    Tagging={"TagSet": [{"Key": "a", "Value": "v" * 257}]}))
out["bad_put"] = code(lambda: s3.put_object(Bucket=b, Key="refused.txt", Body=b"x", Tagging="a=1&a=2"))
out["bad_upload"] = code(lambda: s3.create_multipart_upload(Bucket=b, Key="refused.bin", Tagging="a*=1"))
out["bad_copy"] = code(lambda: s3.copy_object(Bucket=b, Key="refused-copy.txt",
    CopySource={"Bucket": b, "Key": "put.txt"}, TaggingDirective="REPLACE", Tagging="aws:a=1"))
out["bad_directive"] = code(lambda: s3.copy_object(Bucket=b, Key="refused-copy.txt",
    CopySource={"Bucket": b, "Key": "put.txt"}, TaggingDirective="MERGE"))
out["after_refusals"] = tags(data, "replaced.txt")
out["absent_get"] = code(lambda: data.get_object_tagging(Bucket=b, Key="absent.txt"))
out["absent_put"] = code(lambda: s3.put_object_tagging(Bucket=b, Key="absent.txt",
    Tagging={"TagSet": [{"Key": "a", "Value": "1"}]}))
out["absent_delete"] = code(lambda: s3.delete_object_tagging(Bucket=b, Key="absent.txt"))
out["read_key_put"] = code(lambda: client(spec["admin"], spec["read"]).put_object_tagging(Bucket=b,
    Key="replaced.txt", Tagging={"TagSet": []}))
out["other_bucket_get"] = code(lambda: data.get_object_tagging(Bucket="other", Key="secret.txt"))
out["other_bucket_absent"] = code(lambda: data.get_object_tagging(Bucket="other", Key="absent.txt"))
print(json.dumps(out))
"#;

both_backends!(boto3_tags_are_stored_copied_changed_and_read, |env| boto3_tagging_on(env));

fn boto3_tagging_on(env: TestEnv) {
    env.bucket("bkt", false);
    env.bucket("other", false);
    env.put_bytes("other", "secret.txt", b"not yours", &[]);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let read = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    let big = test_bytes(11 << 20, 7);
    let big_path = write_file(env.dir.path(), "big.bin", &big);
    let spec = serde_json::json!({
        "admin": format!("http://{}", server.admin), "data": format!("http://{}", server.data),
        "key": key_json(&key), "read": key_json(&read), "big": big_path,
    });
    let out = run_boto3(&env.dir.path().join("boto3-home"), BOTO3_TAGGING, &spec);
    let tags = |pairs: &[(&str, &str)]| serde_json::json!(pairs.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>());

    let sent = tags(&[("empty", ""), ("path", "a/b.c"), ("sp ace", "x+y"), ("team", "build")]);
    assert_eq!(out["put"], sent, "PutObject's x-amz-tagging, read on the data listener");
    assert_eq!(out["put_admin"], sent, "and on the admin listener");
    assert_eq!(out["count"], 4, "GetObject's TagCount");
    assert_eq!(out["retagged"], tags(&[("new", "1")]), "PutObjectTagging replaces the set (read by a read key)");
    assert_eq!(out["count_after"], 1);
    assert_eq!(out["etag_kept"], true, "retagging keeps the ETag");
    assert_eq!(out["body_kept"], "hello");
    assert_eq!(out["multipart"], tags(&[("origin", "ci")]), "CreateMultipartUpload's tags, stored by Complete");
    assert_eq!(out["copied"], tags(&[("new", "1")]), "a copy keeps the source's tags");
    assert_eq!(out["replaced"], tags(&[("other", "2")]), "TaggingDirective REPLACE");
    assert_eq!(out["meta_only"], tags(&[("new", "1")]), "MetadataDirective REPLACE alone keeps the tags");
    assert_eq!(out["deleted"], tags(&[]), "DeleteObjectTagging");
    assert_eq!(out["count_none"], serde_json::Value::Null, "no tags, no TagCount");
    assert_eq!(out["overwritten"], tags(&[]), "a new PutObject without tags has none");
    for case in ["too_many", "repeated", "bad_char", "reserved", "long_value", "bad_put", "bad_upload", "bad_copy"] {
        assert_eq!(out[case], serde_json::json!([400, "InvalidTag"]), "{case}");
    }
    assert_eq!(out["bad_directive"], serde_json::json!([400, "InvalidArgument"]));
    assert_eq!(out["after_refusals"], tags(&[("other", "2")]), "a refused tag set changes nothing");
    for case in ["absent_get", "absent_put", "absent_delete"] {
        assert_eq!(out[case], serde_json::json!([404, "NoSuchKey"]), "{case}");
    }
    assert_eq!(out["read_key_put"], serde_json::json!([403, "AccessDenied"]));
    for case in ["other_bucket_get", "other_bucket_absent"] {
        assert_eq!(out[case], serde_json::json!([403, "AccessDenied"]), "{case}: existence is not revealed");
    }
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["copied.txt", "meta-only.txt", "multipart.bin", "put.txt", "replaced.txt"],
        "refusals stored nothing"
    );
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/multipart.bin")), sha256_hex(&big));
}

#[test]
fn aws_cli_tags_objects_and_reads_them_back() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let original = test_bytes(10_000, 11);
    env.put_bytes("bkt", "src.bin", &original, &[]);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = format!("http://{}", server.admin);
    let data = format!("http://{}", server.data);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);
    let get = |endpoint: &str| -> serde_json::Value {
        let out = aws(&home, endpoint, &["s3api", "get-object-tagging", "--bucket", "bkt", "--key", "src.bin"]);
        serde_json::from_str(&out).expect("get-object-tagging prints JSON")
    };
    assert_eq!(get(&data)["TagSet"], serde_json::json!([]), "a native upload has no tags");

    let tagging = "TagSet=[{Key=env,Value=prod},{Key=owner,Value=team a}]";
    let args = ["s3api", "put-object-tagging", "--bucket", "bkt", "--key", "src.bin", "--tagging", tagging];
    aws(&home, &admin, &args);
    let want = serde_json::json!([{"Key": "env", "Value": "prod"}, {"Key": "owner", "Value": "team a"}]);
    assert_eq!(get(&data)["TagSet"], want);
    assert_eq!(get(&admin)["TagSet"], want);

    let file = write_file(env.dir.path(), "up.txt", b"tagged upload");
    aws(
        &home,
        &admin,
        &[
            "s3api",
            "put-object",
            "--bucket",
            "bkt",
            "--key",
            "up.txt",
            "--body",
            file.to_str().unwrap(),
            "--tagging",
            "build=42",
        ],
    );
    let up = aws(&home, &data, &["s3api", "get-object-tagging", "--bucket", "bkt", "--key", "up.txt"]);
    let up: serde_json::Value = serde_json::from_str(&up).unwrap();
    assert_eq!(up["TagSet"], serde_json::json!([{"Key": "build", "Value": "42"}]));

    aws(&home, &admin, &["s3api", "delete-object-tagging", "--bucket", "bkt", "--key", "src.bin"]);
    assert_eq!(get(&data)["TagSet"], serde_json::json!([]));
    let read = s3_key(&env, "bkt", &[]);
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/src.bin")), sha256_hex(&original), "content unchanged");
}
