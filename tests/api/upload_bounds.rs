//! What a multipart upload may hold, driven by boto3 and aws-cli: each UploadPart and UploadPartCopy is bounded
//! by `limits.max_upload_bytes`, an upload's parts together by `limits.max_object_bytes` (refused at the part
//! that would pass it, never only at Complete), and one access key's unfinished uploads by
//! `limits.max_unfinished_upload_bytes_per_key`. Unfinished uploads are listed and aborted with `blobgate
//! uploads`, and `bucket delete` takes a bucket's uploads and their part files with it.

use std::path::PathBuf;

use crate::helpers::s3::{AccessKey, PythonScript, Run, aws_home, key_json, run_boto3, s3_key};
use crate::helpers::*;
use crate::s3_writes::listed;

const MIB: u64 = 1 << 20;
/// The refused-parts counter, per limit.
const REFUSED: &str = "blobgate_multipart_parts_refused_total";

fn refused(server: &Server, limit: &str) -> f64 {
    server.metric(&format!("{REFUSED}{{limit=\"{limit}\"}}"))
}

fn part_files(env: &TestEnv) -> Vec<PathBuf> {
    files_under(&env.data_dir().join("parts"))
}

fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
}

/// An admin-listener boto3 spec with `key` as `spec["key"]`, and more fields.
fn spec(server: &Server, key: &AccessKey, more: serde_json::Value) -> serde_json::Value {
    let mut spec = serde_json::json!({"endpoint": format!("http://{}", server.admin), "key": key_json(key)});
    spec.as_object_mut().unwrap().extend(more.as_object().unwrap().clone());
    spec
}

/// A bucket `bkt` holding `source` (name, length: a part copy's source), `writers` write keys, and a server with
/// one setting changed (`limit`: the environment variable and its value).
fn bounded(source: (&str, usize), writers: usize, limit: (&str, &str)) -> (TestEnv, Vec<AccessKey>, Server) {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", source.0, &test_bytes(source.1, source.1 as u64), &[]);
    let keys = (0..writers).map(|_| s3_key(&env, "bkt", &["--scope", "write"])).collect();
    let server = env.serve_with(&[limit], &[]);
    (env, keys, server)
}

/// Runs a boto3 script with the first key as `spec["key"]` and the second, if any, as `spec["other"]`.
fn run(env: &TestEnv, server: &Server, keys: &[AccessKey], script: &str) -> serde_json::Value {
    let other = keys.get(1).map(key_json);
    run_boto3(&env.dir.path().join("boto3-home"), script, &spec(server, &keys[0], serde_json::json!({"other": other})))
}

/// The review's reproduction: with `max_upload_bytes` at 1 MiB, 1 MiB parts and part copies are taken, and a
/// larger part or a 16 MiB part copy is refused, leaving nothing in `parts/` or `tmp/`.
const PARTS_OVER_THE_BODY_LIMIT: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
b, k, mib = "bkt", "big/parts.bin", 1 << 20
src = {"Bucket": b, "Key": "src/sixteen.bin"}
up = s3.create_multipart_upload(Bucket=b, Key=k)["UploadId"]
part = lambda n, body: lambda: s3.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=n, Body=body)
copy = lambda n, **kw: lambda: s3.upload_part_copy(Bucket=b, Key=k, UploadId=up, PartNumber=n, CopySource=src, **kw)
out = {
    "part_at_limit": code(part(1, b"a" * mib)),
    "part_over": code(part(2, b"b" * (mib + 1))),
    "copy_whole": code(copy(3)),
    "copy_range_over": code(copy(3, CopySourceRange="bytes=0-%d" % mib)),
    "copy_range_at_limit": code(copy(4, CopySourceRange="bytes=%d-%d" % (mib, 2 * mib - 1))),
}
out["parts"] = [[p["PartNumber"], p["Size"]] for p in s3.list_parts(Bucket=b, Key=k, UploadId=up)["Parts"]]
print(json.dumps(out))
"#;

#[test]
fn parts_and_part_copies_over_max_upload_bytes_are_refused_and_leave_no_file() {
    let limit = ("BLOBGATE_LIMITS__MAX_UPLOAD_BYTES", "1048576");
    let (env, keys, server) = bounded(("src/sixteen.bin", 16 << 20), 1, limit);
    let out = run(&env, &server, &keys, PARTS_OVER_THE_BODY_LIMIT);
    let taken = serde_json::json!([200, ""]);
    let too_large = serde_json::json!([400, "EntityTooLarge"]);
    assert_eq!(out["part_at_limit"], taken, "{out}");
    assert_eq!(out["part_over"], too_large, "{out}");
    assert_eq!(out["copy_whole"], too_large, "a 16 MiB part copy is a part over the limit: {out}");
    assert_eq!(out["copy_range_over"], too_large, "{out}");
    assert_eq!(out["copy_range_at_limit"], taken, "{out}");
    assert_eq!(out["parts"], serde_json::json!([[1, MIB], [4, MIB]]));
    assert_eq!(part_files(&env).len(), 2, "only the two parts taken are in parts/");
    assert!(env.tmp_files().is_empty(), "refused parts leave no staged file: {:?}", env.tmp_files());
    assert_eq!(refused(&server, "max_upload_bytes"), 3.0);
}

/// With `max_object_bytes` at 12 MiB: parts of 5 + 5 MiB are taken, a third of 3 MiB (or a 3 MiB part copy) is
/// refused and the first two stay; part 2 sent again counts once; a third of 2 MiB makes exactly 12 MiB, which
/// completes. A 13 MiB PutObject is refused too (it is an object).
const PARTS_OVER_THE_OBJECT_LIMIT: &str = r#"
s3 = client(spec["endpoint"], spec["key"])
b, k, mib = "bkt", "whole.bin", 1 << 20
up = s3.create_multipart_upload(Bucket=b, Key=k)["UploadId"]
etags = {}
def part(n, body):
    def call():
        etags[n] = s3.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=n, Body=body)["ETag"]
    return code(call)
out = {"p1": part(1, b"a" * (5 * mib)), "p2": part(2, b"b" * (5 * mib)), "p3_over": part(3, b"c" * (3 * mib))}
out["copy_over"] = code(lambda: s3.upload_part_copy(Bucket=b, Key=k, UploadId=up, PartNumber=3,
    CopySource={"Bucket": b, "Key": "src/three.bin"}))
out["parts_after_refusals"] = [[p["PartNumber"], p["Size"]] for p in s3.list_parts(Bucket=b, Key=k, UploadId=up)["Parts"]]
out["p2_again"] = part(2, b"d" * (5 * mib))
out["p3"] = part(3, b"e" * (2 * mib))
parts = [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]
out["complete"] = code(lambda: s3.complete_multipart_upload(Bucket=b, Key=k, UploadId=up,
    MultipartUpload={"Parts": parts}))
out["size"] = s3.head_object(Bucket=b, Key=k)["ContentLength"]
out["put_over"] = code(lambda: s3.put_object(Bucket=b, Key="put.bin", Body=b"f" * (13 * mib)))
print(json.dumps(out))
"#;

#[test]
fn the_part_that_would_take_an_upload_past_max_object_bytes_is_refused() {
    let twelve = (12 * MIB).to_string();
    let (env, keys, server) = bounded(("src/three.bin", 3 << 20), 1, ("BLOBGATE_LIMITS__MAX_OBJECT_BYTES", &twelve));
    let out = run(&env, &server, &keys, PARTS_OVER_THE_OBJECT_LIMIT);
    let taken = serde_json::json!([200, ""]);
    let too_large = serde_json::json!([400, "EntityTooLarge"]);
    for name in ["p1", "p2", "p2_again", "p3", "complete"] {
        assert_eq!(out[name], taken, "{name}: {out}");
    }
    assert_eq!(out["p3_over"], too_large, "{out}");
    assert_eq!(out["copy_over"], too_large, "{out}");
    assert_eq!(out["parts_after_refusals"], serde_json::json!([[1, 5 * MIB], [2, 5 * MIB]]), "earlier parts stay");
    assert_eq!(out["size"], 12 * MIB, "an object of exactly max_object_bytes completes");
    assert_eq!(out["put_over"], too_large, "{out}");
    assert_eq!(refused(&server, "max_object_bytes"), 2.0, "the part and the part copy");
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["src/three.bin", "whole.bin"]);
    assert!(part_files(&env).is_empty(), "the completed upload's parts went with it");
}

/// Two write keys with `max_unfinished_upload_bytes_per_key` at 12 MiB: key A's second upload is refused once A's
/// unfinished parts would pass 12 MiB (as UploadPart and as UploadPartCopy); key B is unaffected; aborting A's
/// first upload frees its bytes.
const PER_KEY_CAP: &str = r#"
a, bb = client(spec["endpoint"], spec["key"]), client(spec["endpoint"], spec["other"])
b, mib = "bkt", 1 << 20
def start(s3, k):
    return s3.create_multipart_upload(Bucket=b, Key=k)["UploadId"]
def part(s3, k, up, n, size):
    return code(lambda: s3.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=n, Body=b"x" * (size * mib)))
def message(s3, k, up, n, size):
    try:
        s3.upload_part(Bucket=b, Key=k, UploadId=up, PartNumber=n, Body=b"x" * (size * mib))
        return ""
    except ClientError as e:
        return e.response["Error"].get("Message", "")
out = {}
first, second, other = start(a, "a/first"), start(a, "a/second"), start(bb, "b/other")
out["first"] = [part(a, "a/first", first, 1, 5), part(a, "a/first", first, 2, 5)]
out["second_over"] = part(a, "a/second", second, 1, 3)
out["second_over_message"] = message(a, "a/second", second, 1, 3)
out["second_copy_over"] = code(lambda: a.upload_part_copy(Bucket=b, Key="a/second", UploadId=second, PartNumber=1,
    CopySource={"Bucket": b, "Key": "src/three.bin"}))
out["first_replaced"] = part(a, "a/first", first, 2, 6)
out["other_key"] = [part(bb, "b/other", other, 1, 5), part(bb, "b/other", other, 2, 5)]
a.abort_multipart_upload(Bucket=b, Key="a/first", UploadId=first)
out["second_after_abort"] = part(a, "a/second", second, 1, 3)
print(json.dumps(out))
"#;

#[test]
fn one_keys_unfinished_uploads_are_capped_and_other_keys_are_not() {
    let cap = (12 * MIB).to_string();
    let limit = ("BLOBGATE_LIMITS__MAX_UNFINISHED_UPLOAD_BYTES_PER_KEY", cap.as_str());
    let (env, keys, server) = bounded(("src/three.bin", 3 << 20), 2, limit);
    let (a, b) = (&keys[0], &keys[1]);
    let out = run(&env, &server, &keys, PER_KEY_CAP);
    let taken = serde_json::json!([200, ""]);
    let quota = serde_json::json!([403, "QuotaExceeded"]);
    assert_eq!(out["first"], serde_json::json!([taken, taken]), "{out}");
    assert_eq!(out["second_over"], quota, "{out}");
    let message = out["second_over_message"].as_str().unwrap();
    assert!(
        message.contains("limits.max_unfinished_upload_bytes_per_key") && message.contains("blobgate uploads list"),
        "{message}"
    );
    assert_eq!(out["second_copy_over"], quota, "{out}");
    assert_eq!(out["first_replaced"], taken, "a replaced part counts once (6 + 5 MiB): {out}");
    assert_eq!(out["other_key"], serde_json::json!([taken, taken]), "another key is unaffected: {out}");
    assert_eq!(out["second_after_abort"], taken, "aborting frees the key's bytes: {out}");
    assert_eq!(refused(&server, "max_unfinished_upload_bytes_per_key"), 3.0);

    let uploads = json_lines(&env.ok(&["uploads", "list"]));
    let held: Vec<(&str, &str, u64)> = uploads
        .iter()
        .map(|u| (u["key"].as_str().unwrap(), u["created_by"].as_str().unwrap(), u["bytes"].as_u64().unwrap()))
        .collect();
    assert_eq!(held, [("a/second", a.id.as_str(), 3 * MIB), ("b/other", b.id.as_str(), 10 * MIB)]);
}

/// Leaves uploads unfinished: `spec["uploads"]` is a list of `[bucket, key, [part sizes]]`, each by the key
/// `spec["keys"][bucket]`. Prints the upload ids, in order.
const LEAVE_UNFINISHED: &str = r#"
ids = []
for bucket, k, sizes in spec["uploads"]:
    s3 = client(spec["endpoint"], spec["keys"][bucket])
    up = s3.create_multipart_upload(Bucket=bucket, Key=k)["UploadId"]
    for n, size in enumerate(sizes, 1):
        s3.upload_part(Bucket=bucket, Key=k, UploadId=up, PartNumber=n, Body=bytes([n]) * size)
    ids.append(up)
print(json.dumps(ids))
"#;

both_backends!(uploads_are_listed_and_aborted_and_bucket_delete_takes_them, |env| {
    uploads_list_abort_and_bucket_delete_on(env)
});

fn uploads_list_abort_and_bucket_delete_on(env: TestEnv) {
    for bucket in ["bkt", "other"] {
        env.bucket(bucket, false);
    }
    let keys = [s3_key(&env, "bkt", &["--scope", "write"]), s3_key(&env, "other", &["--scope", "write"])];
    let server = env.serve();
    let home = env.dir.path().join("boto3-home");
    let leave = |uploads: serde_json::Value| -> Vec<String> {
        let more =
            serde_json::json!({"keys": {"bkt": key_json(&keys[0]), "other": key_json(&keys[1])}, "uploads": uploads});
        let ids = run_boto3(&home, LEAVE_UNFINISHED, &spec(&server, &keys[0], more));
        ids.as_array().unwrap().iter().map(|id| id.as_str().unwrap().to_owned()).collect()
    };
    let ids = leave(serde_json::json!([
        ["bkt", "left/open.bin", [5 << 20, 1000]],
        ["other", "o/one.bin", [300]],
        ["bkt", "left/also.bin", [7]],
    ]));
    assert_eq!(part_files(&env).len(), 4);

    let listed_uploads = json_lines(&env.ok(&["uploads", "list"]));
    let fields: Vec<(&str, &str, &str, u64, u64)> = listed_uploads
        .iter()
        .map(|u| {
            (
                u["bucket"].as_str().unwrap(),
                u["key"].as_str().unwrap(),
                u["upload_id"].as_str().unwrap(),
                u["parts"].as_u64().unwrap(),
                u["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("bkt", "left/also.bin", ids[2].as_str(), 1, 7),
            ("bkt", "left/open.bin", ids[0].as_str(), 2, (5 << 20) + 1000),
            ("other", "o/one.bin", ids[1].as_str(), 1, 300),
        ],
        "by bucket, then key"
    );
    for upload in &listed_uploads {
        let started = upload["started"].as_str().unwrap();
        assert!(humantime::parse_rfc3339(started).is_ok(), "started is RFC 3339: {started}");
    }
    assert_eq!(listed_uploads[0]["created_by"], keys[0].id.as_str());
    assert_eq!(listed_uploads[2]["created_by"], keys[1].id.as_str());
    let only_other = json_lines(&env.ok(&["uploads", "list", "--bucket", "other"]));
    assert_eq!(only_other, listed_uploads[2..]);
    assert!(env.fails(&["uploads", "list", "--bucket", "nosuch"]).contains("no such bucket"));

    // Abort: the rows and the part files go; a second abort, or the wrong key, is a one-line error.
    env.ok(&["uploads", "abort", "bkt", "left/open.bin", &ids[0]]);
    assert_eq!(part_files(&env).len(), 2);
    for args in [&["uploads", "abort", "bkt", "left/open.bin", &ids[0]][..], &["uploads", "abort", "bkt", "x", &ids[2]]]
    {
        let err = env.fails(args);
        assert!(err.contains("no such upload"), "{args:?}: {err}");
    }
    assert_eq!(json_lines(&env.ok(&["uploads", "list"])).len(), 2);

    // A bucket with no objects but an unfinished upload is deleted without --force, as S3 deletes one.
    let out = json_lines(&env.ok(&["bucket", "delete", "other"]));
    assert_eq!(out[0]["deleted_objects"], 0);
    assert_eq!(out[0]["aborted_uploads"], 1);
    assert_eq!(part_files(&env).len(), 1, "its part file went");
    // A bucket with objects is refused without --force, and its uploads stay; with it, they go.
    env.put_bytes("bkt", "kept.txt", b"kept", &[]);
    let err = env.fails(&["bucket", "delete", "bkt"]);
    assert!(err.contains("1 objects"), "{err}");
    assert_eq!(json_lines(&env.ok(&["uploads", "list"])).len(), 1, "a refused delete aborts nothing");
    let out = json_lines(&env.ok(&["bucket", "delete", "bkt", "--force"]));
    assert_eq!((out[0]["deleted_objects"].as_u64(), out[0]["aborted_uploads"].as_u64()), (Some(1), Some(1)));
    assert!(part_files(&env).is_empty());
    assert_eq!(env.ok(&["uploads", "list"]), "");
}

/// The user trial: `aws s3 cp` of a 200 MB file with `max_object_bytes` at 100 MB fails at an UploadPart (the
/// refusal is counted, and aws-cli names the operation), never at Complete after every byte was sent.
#[test]
fn aws_cp_over_max_object_bytes_fails_at_an_upload_part() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve_with(&[("BLOBGATE_LIMITS__MAX_OBJECT_BYTES", "100000000")], &[]);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);
    let file = env.dir.path().join("200mb.bin");
    std::fs::File::create(&file).unwrap().set_len(200_000_000).unwrap();
    let endpoint = format!("http://{}", server.admin);
    let out = PythonScript::aws(
        &home,
        &["--endpoint-url", &endpoint, "s3", "cp", file.to_str().unwrap(), "s3://bkt/200mb.bin"],
    )
    .run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the copy must fail: {stderr}");
    assert!(stderr.contains("EntityTooLarge") && stderr.contains("UploadPart"), "{stderr}");
    assert!(!stderr.contains("CompleteMultipartUpload"), "{stderr}");
    assert!(refused(&server, "max_object_bytes") >= 1.0, "a part was refused");
    assert!(listed(&env, "bkt").is_empty(), "nothing stored");
    // aws-cli aborts the upload it gave up on: nothing is left holding disk.
    assert_eq!(env.ok(&["uploads", "list"]), "");
    assert!(part_files(&env).is_empty());
}
