//! S3 conditional writes (`If-None-Match: *`, `If-Match`) on PutObject and CompleteMultipartUpload, and
//! conditional deletes (`If-Match` on DeleteObject, `<ETag>` in DeleteObjects), driven by boto3. The precondition is checked under the write lock, so of writers racing to create one key (a lock file,
//! as Terraform's S3 backend writes it) exactly one wins, on one server or on two replicas of one PostgreSQL
//! database; the losers get 412 and the stored bytes are the winner's.

use crate::helpers::s3::{key_json, run_boto3, s3_key};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::read_back;

const BOTO3_CONDITIONAL: &str = r#"
clients = [client(e, spec["key"]) for e in spec["endpoints"]]
s3 = clients[0]
b = "bkt"
out = {}

out["create"] = code(lambda: s3.put_object(Bucket=b, Key="lock", Body=b"first", IfNoneMatch="*"))
out["create_again"] = code(lambda: s3.put_object(Bucket=b, Key="lock", Body=b"second", IfNoneMatch="*"))
etag = s3.head_object(Bucket=b, Key="lock")["ETag"]
out["match_stale"] = code(lambda: s3.put_object(Bucket=b, Key="lock", Body=b"third", IfMatch='"0123"'))
out["match_absent"] = code(lambda: s3.put_object(Bucket=b, Key="absent", Body=b"x", IfMatch=etag))
out["match_current"] = code(lambda: s3.put_object(Bucket=b, Key="lock", Body=b"fourth", IfMatch=etag))
out["match_old_again"] = code(lambda: s3.put_object(Bucket=b, Key="lock", Body=b"fifth", IfMatch=etag))

# CompleteMultipartUpload with If-None-Match on an existing key: 412, and the upload stays to be completed.
up = s3.create_multipart_upload(Bucket=b, Key="lock")["UploadId"]
part = s3.upload_part(Bucket=b, Key="lock", UploadId=up, PartNumber=1, Body=b"multipart")
parts = {"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]}
out["complete_if_absent"] = code(lambda: s3.complete_multipart_upload(Bucket=b, Key="lock", UploadId=up,
    MultipartUpload=parts, IfNoneMatch="*"))
out["parts_after"] = len(s3.list_parts(Bucket=b, Key="lock", UploadId=up)["Parts"])
out["complete_new_key"] = code(lambda: s3.complete_multipart_upload(Bucket=b, Key="lock", UploadId=up,
    MultipartUpload=parts))

# Racing creators, spread over every endpoint: exactly one wins.
results = [None] * 16
def race(i):
    c = clients[i % len(clients)]
    results[i] = code(lambda: c.put_object(Bucket=b, Key="race", Body=("writer %d" % i).encode(), IfNoneMatch="*"))
threads = [threading.Thread(target=race, args=(i,)) for i in range(len(results))]
for t in threads:
    t.start()
for t in threads:
    t.join()
out["race"] = results
out["race_winners"] = [i for i, r in enumerate(results) if r[0] == 200]

# Conditional deletes: If-Match on DeleteObject, <ETag> on DeleteObjects entries.
s3.put_object(Bucket=b, Key="d1", Body=b"one")
s3.put_object(Bucket=b, Key="d2", Body=b"two")
d1 = s3.head_object(Bucket=b, Key="d1")["ETag"]
out["delete_stale"] = code(lambda: s3.delete_object(Bucket=b, Key="d1", IfMatch='"0123"'))
out["delete_absent"] = code(lambda: s3.delete_object(Bucket=b, Key="gone", IfMatch="*"))
out["delete_kept"] = s3.get_object(Bucket=b, Key="d1")["Body"].read().decode()
out["delete_match"] = code(lambda: s3.delete_object(Bucket=b, Key="d1", IfMatch=d1))
out["delete_star"] = code(lambda: s3.delete_object(Bucket=b, Key="d2", IfMatch="*"))
s3.put_object(Bucket=b, Key="m1", Body=b"m1")
s3.put_object(Bucket=b, Key="m2", Body=b"m2")
m1 = s3.head_object(Bucket=b, Key="m1")["ETag"]
r = s3.delete_objects(Bucket=b, Delete={"Objects": [
    {"Key": "m1", "ETag": m1}, {"Key": "m2", "ETag": '"0123"'}, {"Key": "m3", "ETag": m1}]})
out["multi_deleted"] = sorted(d["Key"] for d in r.get("Deleted", []))
out["multi_errors"] = sorted([e["Key"], e["Code"]] for e in r.get("Errors", []))
out["left"] = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=b).get("Contents", []))
print(json.dumps(out))
"#;

fn run_conditional(env: &TestEnv, servers: &[&Server]) -> serde_json::Value {
    env.bucket("bkt", false);
    let key = s3_key(env, "bkt", &["--scope", "write"]);
    let endpoints: Vec<String> = servers.iter().map(|s| format!("http://{}", s.admin)).collect();
    let spec = serde_json::json!({"endpoints": endpoints, "key": key_json(&key)});
    let out = run_boto3(&env.dir.path().join("boto3-home"), BOTO3_CONDITIONAL, &spec);
    let want = |name: &str, status: u64, code: &str| {
        assert_eq!(out[name], serde_json::json!([status, code]), "{name}");
    };
    want("create", 200, "");
    want("create_again", 412, "PreconditionFailed");
    want("match_stale", 412, "PreconditionFailed");
    want("match_absent", 404, "NoSuchKey");
    want("match_current", 200, "");
    want("match_old_again", 412, "PreconditionFailed");
    want("complete_if_absent", 412, "PreconditionFailed");
    assert_eq!(out["parts_after"], 1, "a refused Complete leaves its upload");
    want("complete_new_key", 200, "");
    let winners = out["race_winners"].as_array().unwrap();
    assert_eq!(winners.len(), 1, "exactly one racing creator wins: {}", out["race"]);
    for (i, result) in out["race"].as_array().unwrap().iter().enumerate() {
        if result[0] != 200 {
            assert_eq!(*result, serde_json::json!([412, "PreconditionFailed"]), "writer {i}");
        }
    }
    let read = s3_key(env, "bkt", &[]);
    let winner = winners[0].as_u64().unwrap();
    let stored = read_back(servers[0], &read, "/bkt/race");
    assert_eq!(sha256_hex(&stored), sha256_hex(format!("writer {winner}").as_bytes()), "the winner's bytes");
    assert_eq!(read_back(servers[0], &read, "/bkt/lock"), b"multipart");

    want("delete_stale", 412, "PreconditionFailed");
    want("delete_absent", 404, "NoSuchKey");
    assert_eq!(out["delete_kept"], "one", "a refused delete keeps the object");
    want("delete_match", 200, "");
    want("delete_star", 200, "");
    assert_eq!(out["multi_deleted"], serde_json::json!(["m1"]), "the entry whose ETag matched");
    assert_eq!(out["multi_errors"], serde_json::json!([["m2", "PreconditionFailed"], ["m3", "NoSuchKey"]]));
    assert_eq!(out["left"], serde_json::json!(["lock", "m2", "race"]), "only the matching deletes deleted");
    out
}

#[test]
fn boto3_conditional_writes_create_once_and_match_the_current_etag() {
    let env = TestEnv::new();
    let server = env.serve();
    run_conditional(&env, &[&server]);
    assert!(env.tmp_files().is_empty(), "refused writes left staged files: {:?}", env.tmp_files());
}

#[test]
fn conditional_creates_racing_on_two_replicas_have_one_winner() {
    let env = TestEnv::on_postgres();
    let (a, b) = (env.serve(), env.serve());
    run_conditional(&env, &[&a, &b]);
}
