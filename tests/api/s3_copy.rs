//! Server-side copies on the admin listener (CopyObject, UploadPartCopy), driven by real clients (boto3's
//! `copy_object` and managed `copy`, `aws s3 cp`/`mv`/`sync` between S3 URLs, rclone's server-side copy, s3cmd's
//! `cp`), each copy read back from the data listener and checked with SHA-256. A copy names its source's blob, so
//! the blob dir holds one file per distinct content however many copies there are. Refused copies (a source the
//! key may not read, a read key, a failed `x-amz-copy-source-if-*`, a bad range) get S3's code and store nothing.

use std::path::Path;

use crate::helpers::s3::{
    aws, aws_home, key_json, rclone, rclone_config, rclone_output, run_boto3, s3_key, s3cmd, s3cmd_config,
};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::{listed, quoted_md5, read_back};

/// Every file under `dir` (the data dir's `blobs/`, `parts/` or `tmp/`).
fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else {
                found.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    walk(dir, &mut found);
    found.sort();
    found
}

const BOTO3_COPIES: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
reader, prefixed = client(spec["endpoint"], spec["read"]), client(spec["endpoint"], spec["prefixed"])
b = "bkt"
out = {}

small = open(spec["small"], "rb").read()
src_etag = s3.put_object(Bucket=b, Key="src/a b+c%d é.txt", Body=small, ContentType="text/x-small",
    CacheControl="max-age=60")["ETag"]
s3.upload_file(spec["big"], b, "src/big.bin",
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=4))
big_etag = s3.head_object(Bucket=b, Key="src/big.bin")["ETag"]
source = {"Bucket": b, "Key": "src/a b+c%d é.txt"}

r = s3.copy_object(Bucket=b, Key="dst/copy é.txt", CopySource=source)
out["copy_etag"] = [r["CopyObjectResult"]["ETag"], src_etag]
h = s3.head_object(Bucket=b, Key="dst/copy é.txt")
out["copy_head"] = [h["ContentType"], h.get("CacheControl"), h["ContentLength"], h["ETag"]]
out["copy_last_modified"] = r["CopyObjectResult"]["LastModified"].year
s3.copy_object(Bucket=b, Key="dst/replaced.txt", CopySource=source, MetadataDirective="REPLACE",
    ContentType="application/x-new")
h = s3.head_object(Bucket=b, Key="dst/replaced.txt")
out["replaced_head"] = [h["ContentType"], h.get("CacheControl")]
out["self_copy"] = code(lambda: s3.copy_object(Bucket=b, Key="dst/replaced.txt",
    CopySource={"Bucket": b, "Key": "dst/replaced.txt"}))
out["self_replace"] = code(lambda: s3.copy_object(Bucket=b, Key="dst/replaced.txt",
    CopySource={"Bucket": b, "Key": "dst/replaced.txt"}, MetadataDirective="REPLACE", ContentType="text/x-third"))
out["self_replaced_type"] = s3.head_object(Bucket=b, Key="dst/replaced.txt")["ContentType"]
out["from_public"] = code(lambda: s3.copy_object(Bucket=b, Key="dst/from-public.bin",
    CopySource={"Bucket": "pub", "Key": "p.bin"}))

# x-amz-copy-source-if-*: as RFC 9110's If-* on the source.
past = datetime.datetime(2001, 1, 1, tzinfo=datetime.timezone.utc)
future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
cases = {
    "if_match_ok": {"CopySourceIfMatch": src_etag},
    "if_match_bad": {"CopySourceIfMatch": '"0123"'},
    "if_none_match_hit": {"CopySourceIfNoneMatch": src_etag},
    "if_none_match_miss": {"CopySourceIfNoneMatch": '"0123"'},
    "if_unmodified_since_past": {"CopySourceIfUnmodifiedSince": past},
    "if_modified_since_past": {"CopySourceIfModifiedSince": past},
    "if_match_wins_over_unmodified_since": {"CopySourceIfMatch": src_etag, "CopySourceIfUnmodifiedSince": past},
}
for name, extra in cases.items():
    out[name] = code(lambda: s3.copy_object(Bucket=b, Key="cond/" + name, CopySource=source, **extra))

out["missing_source"] = code(lambda: s3.copy_object(Bucket=b, Key="bad/missing",
    CopySource={"Bucket": b, "Key": "src/absent"}))
out["other_bucket_source"] = code(lambda: s3.copy_object(Bucket=b, Key="bad/other",
    CopySource={"Bucket": "other", "Key": "o.bin"}))
out["no_such_bucket_source"] = code(lambda: s3.copy_object(Bucket=b, Key="bad/nobucket",
    CopySource={"Bucket": "absent", "Key": "o.bin"}))
out["read_key_copy"] = code(lambda: reader.copy_object(Bucket=b, Key="bad/reader", CopySource=source))
out["prefixed_source_outside"] = code(lambda: prefixed.copy_object(Bucket=b, Key="ok/from-outside",
    CopySource=source))
out["prefixed_target_outside"] = code(lambda: prefixed.copy_object(Bucket=b, Key="bad/prefixed",
    CopySource={"Bucket": b, "Key": "ok/seed"}))
out["prefixed_inside"] = code(lambda: prefixed.copy_object(Bucket=b, Key="ok/copy",
    CopySource={"Bucket": b, "Key": "ok/seed"}))
out["versioned_source"] = code(lambda: s3.copy_object(Bucket=b, Key="bad/versioned",
    CopySource={"Bucket": b, "Key": "src/big.bin", "VersionId": "3HL4kqtJlcpXroDTDmJ"}))
out["bad_directive"] = code(lambda: s3.copy_object(Bucket=b, Key="bad/directive", CopySource=source,
    MetadataDirective="MOVE"))

# Managed copy above its threshold: CreateMultipartUpload, UploadPartCopy with ranges, Complete.
s3.copy({"Bucket": b, "Key": "src/big.bin"}, b, "dst/big copy.bin",
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=4))
out["big_copy_size"] = s3.head_object(Bucket=b, Key="dst/big copy.bin")["ContentLength"]

# UploadPartCopy by hand: a whole small source, a range of the big one, and refusals.
up = s3.create_multipart_upload(Bucket=b, Key="dst/parts.bin")["UploadId"]
p1 = s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId=up, PartNumber=1,
    CopySource={"Bucket": b, "Key": "src/big.bin"}, CopySourceRange="bytes=1000-%d" % (1000 + (5 << 20) - 1))
p2 = s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId=up, PartNumber=2, CopySource=source)
out["bad_range"] = code(lambda: s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId=up, PartNumber=3,
    CopySource=source, CopySourceRange="bytes=0-%d" % len(small)))
out["part_if_match_bad"] = code(lambda: s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId=up,
    PartNumber=3, CopySource=source, CopySourceIfMatch='"0123"'))
out["part_no_such_upload"] = code(lambda: s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId="0" * 32,
    PartNumber=1, CopySource=source))
out["part_other_bucket"] = code(lambda: s3.upload_part_copy(Bucket=b, Key="dst/parts.bin", UploadId=up,
    PartNumber=3, CopySource={"Bucket": "other", "Key": "o.bin"}))
parts = [{"PartNumber": 1, "ETag": p1["CopyPartResult"]["ETag"]}, {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]}]
listed_parts = s3.list_parts(Bucket=b, Key="dst/parts.bin", UploadId=up)["Parts"]
out["listed_parts"] = [[p["PartNumber"], p["Size"], p["ETag"]] for p in listed_parts]
out["copied_part_etags"] = [p["ETag"] for p in parts]
s3.complete_multipart_upload(Bucket=b, Key="dst/parts.bin", UploadId=up, MultipartUpload={"Parts": parts})

# The source goes; its copies stay.
s3.delete_object(Bucket=b, Key="src/a b+c%d é.txt")
print(json.dumps(out))
"#;

both_backends!(boto3_copies_objects_and_parts_server_side, |env| boto3_copies_on(env));

fn boto3_copies_on(env: TestEnv) {
    env.bucket("bkt", false);
    env.bucket("pub", true);
    env.bucket("other", false);
    let public = test_bytes(3_000, 11);
    env.put_bytes("pub", "p.bin", &public, &[]);
    env.put_bytes("other", "o.bin", &test_bytes(100, 12), &[]);
    env.put_bytes("bkt", "ok/seed", &test_bytes(50, 13), &[]);
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let read = s3_key(&env, "bkt", &[]);
    let prefixed = s3_key(&env, "bkt", &["--scope", "write", "--prefix", "ok/"]);
    let server = env.serve();
    let small = test_bytes(70_000, 1);
    let big = test_bytes(12 << 20, 2);
    let small_path = write_file(env.dir.path(), "small.bin", &small);
    let big_path = write_file(env.dir.path(), "big.bin", &big);
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.admin), "key": key_json(&write), "read": key_json(&read),
        "prefixed": key_json(&prefixed), "small": small_path, "big": big_path,
    });
    let out = run_boto3(&env.dir.path().join("boto3-home"), BOTO3_COPIES, &spec);
    let want = |name: &str, status: u64, code: &str| {
        assert_eq!(out[name], serde_json::json!([status, code]), "{name}");
    };

    assert_eq!(out["copy_etag"][0], out["copy_etag"][1], "a copy's ETag is its source's");
    assert_eq!(
        out["copy_head"],
        serde_json::json!(["text/x-small", "private, max-age=60", small.len(), out["copy_etag"][1]])
    );
    assert!(out["copy_last_modified"].as_i64().unwrap() >= 2026, "{}", out["copy_last_modified"]);
    assert_eq!(
        out["replaced_head"],
        serde_json::json!(["application/x-new", "private"]),
        "REPLACE takes the request's (no Cache-Control)"
    );
    want("self_copy", 400, "InvalidRequest");
    want("self_replace", 200, "");
    assert_eq!(out["self_replaced_type"], "text/x-third");
    want("from_public", 200, "");
    want("if_match_ok", 200, "");
    want("if_match_bad", 412, "PreconditionFailed");
    want("if_none_match_hit", 412, "PreconditionFailed");
    want("if_none_match_miss", 200, "");
    want("if_unmodified_since_past", 412, "PreconditionFailed");
    want("if_modified_since_past", 200, "");
    want("if_match_wins_over_unmodified_since", 200, "");
    want("missing_source", 404, "NoSuchKey");
    // A source the key may not read answers alike whether or not it exists.
    want("other_bucket_source", 403, "AccessDenied");
    want("no_such_bucket_source", 403, "AccessDenied");
    want("read_key_copy", 403, "AccessDenied");
    want("prefixed_source_outside", 403, "AccessDenied");
    want("prefixed_target_outside", 403, "AccessDenied");
    want("prefixed_inside", 200, "");
    want("versioned_source", 400, "InvalidArgument");
    want("bad_directive", 400, "InvalidArgument");
    assert_eq!(out["big_copy_size"], big.len());
    want("bad_range", 400, "InvalidArgument");
    want("part_if_match_bad", 412, "PreconditionFailed");
    want("part_no_such_upload", 404, "NoSuchUpload");
    want("part_other_bucket", 403, "AccessDenied");
    let part_one_md5 = quoted_md5(&big[1000..1000 + (5 << 20)]);
    let part_two_md5 = quoted_md5(&small);
    assert_eq!(out["copied_part_etags"], serde_json::json!([part_one_md5, part_two_md5]), "a part's ETag is its MD5");
    assert_eq!(
        out["listed_parts"],
        serde_json::json!([[1, 5 << 20, part_one_md5], [2, small.len(), part_two_md5]]),
        "ListParts shows the copied parts"
    );

    let reader = |path: &str| sha256_hex(&read_back(&server, &read, path));
    assert_eq!(reader("/bkt/dst/copy%20%C3%A9.txt"), sha256_hex(&small), "the copy outlives its deleted source");
    assert_eq!(reader("/bkt/dst/replaced.txt"), sha256_hex(&small));
    assert_eq!(reader("/bkt/dst/from-public.bin"), sha256_hex(&public));
    assert_eq!(reader("/bkt/dst/big%20copy.bin"), sha256_hex(&big));
    assert_eq!(reader("/bkt/ok/copy"), reader("/bkt/ok/seed"));
    let mut parts = big[1000..1000 + (5 << 20)].to_vec();
    parts.extend_from_slice(&small);
    assert_eq!(reader("/bkt/dst/parts.bin"), sha256_hex(&parts));
    for name in ["if_match_ok", "if_none_match_miss", "if_modified_since_past", "if_match_wins_over_unmodified_since"] {
        assert_eq!(reader(&format!("/bkt/cond/{name}")), sha256_hex(&small), "{name}");
    }

    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    let mut expected = vec![
        "cond/if_match_ok",
        "cond/if_match_wins_over_unmodified_since",
        "cond/if_modified_since_past",
        "cond/if_none_match_miss",
        "dst/big copy.bin",
        "dst/copy é.txt",
        "dst/from-public.bin",
        "dst/parts.bin",
        "dst/replaced.txt",
        "ok/copy",
        "ok/seed",
        "src/big.bin",
    ];
    expected.sort();
    assert_eq!(keys, expected, "refused copies stored nothing");
    // Copies share their source's blob: small, big, the public and other objects, the seed, and the parts object.
    assert_eq!(files_under(&env.data_dir().join("blobs")).len(), 6, "one blob per distinct content");
    assert!(files_under(&env.data_dir().join("parts")).is_empty(), "no part file is left behind");
    assert!(env.tmp_files().is_empty(), "no staged file is left behind: {:?}", env.tmp_files());
}

#[test]
fn aws_cli_rclone_and_s3cmd_copy_between_s3_urls() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let read = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    let admin = format!("http://{}", server.admin);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);

    // Above aws-cli's 8 MiB multipart threshold, so its copy is a multipart upload of UploadPartCopy parts.
    let big = test_bytes(20 << 20, 3);
    let small = test_bytes(5_000, 4);
    env.put_bytes("bkt", "src/big.bin", &big, &[]);
    env.put_bytes("bkt", "src/small é.txt", &small, &["--content-type", "text/x-kept"]);
    aws(&home, &admin, &["s3", "cp", "s3://bkt/src/big.bin", "s3://bkt/aws/big.bin"]);
    aws(&home, &admin, &["s3", "cp", "s3://bkt/src/small é.txt", "s3://bkt/aws/small é.txt"]);
    aws(&home, &admin, &["s3", "mv", "s3://bkt/aws/small é.txt", "s3://bkt/aws/moved.txt"]);
    let head = aws(&home, &admin, &["s3api", "head-object", "--bucket", "bkt", "--key", "aws/moved.txt"]);
    assert!(head.contains("text/x-kept"), "a copy keeps its source's Content-Type: {head}");
    let first = aws(&home, &admin, &["s3", "sync", "s3://bkt/src/", "s3://bkt/synced/"]);
    assert_eq!(first.matches("copy:").count(), 2, "{first}");
    let second = aws(&home, &admin, &["s3", "sync", "s3://bkt/src/", "s3://bkt/synced/"]);
    assert!(!second.contains("copy:"), "the second sync copies nothing: {second}");

    let rclone_home = env.dir.path().join("rclone-home");
    rclone_config(&rclone_home, &key, &server.admin.to_string(), "");
    // `-v` logs each file as copied; a server-side copy reads no object bytes through rclone.
    let copied = rclone_output(&rclone_home, &["copy", "-v", "--stats", "0", "bg:bkt/src", "bg:bkt/rc"]);
    let log = String::from_utf8_lossy(&copied.stderr);
    assert!(copied.status.success(), "rclone copy: {log}");
    assert!(log.contains("Copied (server-side copy)"), "rclone copied server-side: {log}");
    rclone(&rclone_home, &["check", "bg:bkt/src", "bg:bkt/rc"]);

    let s3cmd_home = env.dir.path().join("s3cmd-home");
    s3cmd_config(&s3cmd_home, &key, &server.admin.to_string());
    let out = s3cmd(&s3cmd_home, &["cp", "s3://bkt/src/small é.txt", "s3://bkt/s3cmd/copy.txt"]);
    assert!(out.status.success(), "s3cmd cp: {}", String::from_utf8_lossy(&out.stderr));

    let reader = |path: &str| sha256_hex(&read_back(&server, &read, path));
    for (path, bytes) in [
        ("/bkt/aws/big.bin", &big),
        ("/bkt/aws/moved.txt", &small),
        ("/bkt/synced/big.bin", &big),
        ("/bkt/synced/small%20%C3%A9.txt", &small),
        ("/bkt/rc/big.bin", &big),
        ("/bkt/rc/small%20%C3%A9.txt", &small),
        ("/bkt/s3cmd/copy.txt", &small),
    ] {
        assert_eq!(reader(path), sha256_hex(bytes), "{path}");
    }
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert!(!keys.iter().any(|k| k == "aws/small é.txt"), "mv removed its source: {keys:?}");
    assert_eq!(files_under(&env.data_dir().join("blobs")).len(), 2, "every copy shares its source's blob");
    assert!(files_under(&env.data_dir().join("parts")).is_empty(), "no part file is left behind");
}
