//! Multipart uploads driven by raw requests botocore signs: Completes racing each other and an Abort get clean S3
//! answers (one object), and each part is held to `limits.max_upload_bytes` while the object may reach `max_object_bytes`.

use crate::helpers::s3::{AccessKey, PythonScript, run_ok, s3_key};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::{listed, read_back};

/// Multipart races and limits, signed by botocore: `spec["mode"]` is `race` (concurrent Completes of one upload,
/// then Completes racing an Abort) or `limit` (parts against `limits.max_upload_bytes`). Prints JSON.
const MULTIPART: &str = r#"
import hashlib, http.client, json, sys, threading
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
spec = json.loads(sys.argv[1])
host = spec["host"]
def call(method, path, body=b""):
    req = AWSRequest(method=method, url="http://" + host + path, data=body)
    S3SigV4Auth(Credentials(spec["id"], spec["secret"]), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection(host, timeout=120)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for k, v in req.headers.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    try:
        conn.send(body)
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused before the body was read: the answer is still there to read
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    code = text.split("<Code>")[1].split("</Code>")[0] if "<Code>" in text else ""
    return r.status, code, text, r.getheader("ETag")
def upload(path, parts):
    status, _, text, _ = call("POST", path + "?uploads")
    assert status == 200, text
    uid = text.split("<UploadId>")[1].split("</UploadId>")[0]
    xml = "<CompleteMultipartUpload>"
    for n, body in enumerate(parts, 1):
        status, code, text, etag = call("PUT", "%s?partNumber=%d&uploadId=%s" % (path, n, uid), body)
        if status != 200:
            return uid, None, [status, code]
        xml += "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>" % (n, etag)
    return uid, (xml + "</CompleteMultipartUpload>").encode(), None
def together(calls):
    results = [None] * len(calls)
    def run(i, c):
        results[i] = list(call(*c)[:2])
    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results
out = {}
part = bytes((i * 29) % 256 for i in range(5 << 20))
if spec["mode"] == "race":
    uid, xml, _ = upload("/bkt/race.bin", [part, part, b"end"])
    out["completes"] = together([("POST", "/bkt/race.bin?uploadId=" + uid, xml)] * 4)
    out["race_sha256"] = hashlib.sha256(part + part + b"end").hexdigest()
    out["aborts"] = []
    for round in range(3):
        path = "/bkt/abort%d.bin" % round
        uid, xml, _ = upload(path, [part, part, b"end"])
        out["aborts"].append(together([("POST", path + "?uploadId=" + uid, xml), ("DELETE", path + "?uploadId=" + uid)]))
else:
    uid, xml, _ = upload("/bkt/sum.bin", [part, b"x" * (2 << 20)])
    out["complete_sum"] = list(call("POST", "/bkt/sum.bin?uploadId=" + uid, xml)[:2])
    _, _, refused = upload("/bkt/one.bin", [b"y" * (7 << 20)])
    out["part_over"] = refused
print(json.dumps(out))
"#;

fn multipart(env: &TestEnv, server: &Server, key: &AccessKey, mode: &str) -> serde_json::Value {
    let spec = serde_json::json!({"host": server.admin.to_string(), "id": key.id, "secret": key.secret, "mode": mode});
    let home = env.dir.path().join("multipart-home");
    let out = run_ok(&mut PythonScript::boto3(&home, MULTIPART, &[&spec.to_string()]));
    serde_json::from_str(out.trim()).expect("the script prints JSON")
}

#[test]
fn concurrent_completes_and_an_abort_during_complete_get_clean_s3_answers() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let out = multipart(&env, &server, &key, "race");
    let completes: Vec<(u64, String)> = out["completes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r[0].as_u64().unwrap(), r[1].as_str().unwrap().to_owned()))
        .collect();
    // One Complete assembles; one that arrives after it committed is a retry and gets the same answer (200), one
    // that arrives while it assembles gets NoSuchUpload.
    assert!(completes.iter().any(|c| c.0 == 200), "a Complete wins: {completes:?}");
    assert!(completes.iter().all(|c| c.0 == 200 || *c == (404, "NoSuchUpload".into())), "{completes:?}");
    assert_eq!(sha256_hex(&read_back(&server, &key, "/bkt/race.bin")), out["race_sha256"]);
    for (round, pair) in out["aborts"].as_array().unwrap().iter().enumerate() {
        let (complete, abort) = (pair[0][0].as_u64().unwrap(), pair[1][0].as_u64().unwrap());
        assert!(complete == 200 || pair[0][1] == "NoSuchUpload", "round {round}: Complete answered {pair}");
        assert!(abort == 204 || pair[1][1] == "NoSuchUpload", "round {round}: Abort answered {pair}");
        let stored = listed(&env, "bkt").iter().any(|(k, _)| *k == format!("abort{round}.bin"));
        assert_eq!(stored, complete == 200, "round {round}: stored only if Complete succeeded ({pair})");
    }
}

#[test]
fn each_part_is_held_to_max_upload_bytes_and_the_object_to_max_object_bytes() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    // 6 MiB bodies: each part of 5 and 2 MiB fits, and so does their 7 MiB object (max_object_bytes bounds it);
    // one 7 MiB part does not.
    let server = env.serve_with(&[("BLOBGATE_LIMITS__MAX_UPLOAD_BYTES", "6291456")], &[]);
    let out = multipart(&env, &server, &key, "limit");
    assert_eq!(out["complete_sum"], serde_json::json!([200, ""]), "{out}");
    assert_eq!(out["part_over"], serde_json::json!([400, "EntityTooLarge"]), "{out}");
    assert_eq!(listed(&env, "bkt"), [("sum.bin".to_owned(), 7 << 20)], "only the object of two fitting parts");
}
