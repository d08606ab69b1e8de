//! What a review of the S3 API found (issue 15): writes we do not implement are refused before anything is
//! stored or deleted, newer SDKs' `x-id` is accepted, and the edges of the write path (limits, digests, timeouts,
//! key shapes) answer in S3's words. Requests come from aws-cli or are signed by botocore, never by our code.

use crate::helpers::s3::{AccessKey, PythonScript, run_ok, s3_key};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::{listed, read_back};

/// Sends each case of `spec["cases"]` (`[name, host, method, path, headers, body]`, body as latin-1 text) signed
/// by botocore's `S3SigV4Auth` (unless the case's headers carry their own `Authorization`), and prints
/// `{name: [status, code, headers]}`. A `_stall: SECS` header sends half the body, then waits that long.
const RAW: &str = r#"
import http.client, json, sys, time
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
spec = json.loads(sys.argv[1])
out = {}
for name, host, method, path, headers, body in spec["cases"]:
    body = body.encode("latin-1")
    key = spec["keys"][headers.pop("_key", "write")]
    stall = float(headers.pop("_stall", "0"))
    if "Authorization" not in headers:
        req = AWSRequest(method=method, url="http://" + host + path, headers=headers, data=body)
        S3SigV4Auth(Credentials(key["id"], key["secret"]), "s3", "us-east-1").add_auth(req)
        headers = dict(req.headers.items())
    conn = http.client.HTTPConnection(host, timeout=30)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for k, v in headers.items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    if stall:
        # Half the body, then silence: the server must not wait for the rest forever.
        conn.send(body[:len(body) // 2])
        time.sleep(stall)
    else:
        conn.send(body)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    code = text.split("<Code>")[1].split("</Code>")[0] if "<Code>" in text else ""
    out[name] = [r.status, code, dict((k.lower(), v) for k, v in r.getheaders())]
print(json.dumps(out))
"#;

/// One raw request for [`raw`].
pub struct Case<'a> {
    pub name: &'a str,
    pub host: String,
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

/// Sends the cases (signed by botocore with `keys["write"]`, or the key a case's `_key` header names) and
/// returns each case's `[status, code, headers]`.
pub fn raw(env: &TestEnv, keys: &[(&str, &AccessKey)], cases: &[Case<'_>]) -> serde_json::Value {
    let keys: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|(name, k)| ((*name).to_owned(), serde_json::json!({"id": k.id, "secret": k.secret})))
        .collect();
    let cases: Vec<serde_json::Value> = cases
        .iter()
        .map(|c| {
            let headers: serde_json::Map<String, serde_json::Value> =
                c.headers.iter().map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v))).collect();
            let body: String = c.body.iter().map(|&b| b as char).collect();
            serde_json::json!([c.name, c.host, c.method, c.path, headers, body])
        })
        .collect();
    let spec = serde_json::json!({"keys": keys, "cases": cases});
    let home = env.dir.path().join("raw-home");
    let out = run_ok(&mut PythonScript::boto3(&home, RAW, &[&spec.to_string()]));
    serde_json::from_str(out.trim()).expect("the script prints JSON")
}

/// A case's `(status, code)`.
pub fn answer(out: &serde_json::Value, name: &str) -> (u64, String) {
    let case = &out[name];
    (case[0].as_u64().unwrap_or_else(|| panic!("{name}: {out}")), case[1].as_str().unwrap().to_owned())
}

#[test]
fn writes_naming_what_we_do_not_implement_get_not_implemented_and_x_id_is_accepted() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let original = test_bytes(5_000, 12);
    env.put_bytes("bkt", "keep.bin", &original, &[]);
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = server.admin.to_string();
    let data = server.data.to_string();
    let on_admin = |name, method, path, headers, body| Case { name, host: admin.clone(), method, path, headers, body };
    let xml = b"<Tagging><TagSet><Tag><Key>a</Key><Value>b</Value></Tag></TagSet></Tagging>".as_slice();
    let cases = vec![
        on_admin("acl", "PUT", "/bkt/keep.bin?acl", &[], b"<AccessControlPolicy/>"),
        on_admin("tagging", "PUT", "/bkt/keep.bin?tagging", &[], xml),
        on_admin("retention", "PUT", "/bkt/keep.bin?retention", &[], b"<Retention/>"),
        on_admin("legal_hold", "PUT", "/bkt/keep.bin?legal-hold", &[], b"<LegalHold/>"),
        on_admin("delete_tagging", "DELETE", "/bkt/keep.bin?tagging", &[], b""),
        on_admin("bucket_tagging", "PUT", "/bkt?tagging", &[], xml),
        on_admin("if_match_tagging", "PUT", "/bkt/keep.bin?tagging", &[("If-Match", "\"abc\"")], xml),
        on_admin("delete_version", "DELETE", "/bkt/keep.bin?versionId=3", &[], b""),
        on_admin(
            "copy_sse_c",
            "PUT",
            "/bkt/copy.bin",
            &[
                ("x-amz-copy-source", "/bkt/keep.bin"),
                ("x-amz-copy-source-server-side-encryption-customer-algorithm", "AES256"),
            ],
            b"",
        ),
        on_admin("copy_by_post", "POST", "/bkt/copy.bin?uploads", &[("x-amz-copy-source", "/bkt/keep.bin")], b""),
        on_admin(
            "sse_c",
            "PUT",
            "/bkt/keep.bin",
            &[("x-amz-server-side-encryption-customer-algorithm", "AES256")],
            b"plain",
        ),
        on_admin("sse", "PUT", "/bkt/keep.bin", &[("x-amz-server-side-encryption", "aws:kms")], b"plain"),
        on_admin("lock", "PUT", "/bkt/keep.bin", &[("x-amz-object-lock-mode", "GOVERNANCE")], b"plain"),
        on_admin("if_none_match", "PUT", "/bkt/keep.bin", &[("If-None-Match", "*")], b"plain"),
        on_admin("if_match", "PUT", "/bkt/keep.bin", &[("If-Match", "\"abc\"")], b"plain"),
        on_admin("if_none_match_etag", "PUT", "/bkt/keep.bin", &[("If-None-Match", "\"abc\"")], b"plain"),
        on_admin("if_match_delete", "DELETE", "/bkt/keep.bin", &[("If-Match", "\"abc\"")], b""),
        on_admin("if_none_match_delete", "DELETE", "/bkt/keep.bin", &[("If-None-Match", "*")], b""),
        on_admin("if_match_size_delete", "DELETE", "/bkt/keep.bin", &[("x-amz-if-match-size", "5000")], b""),
        on_admin(
            "if_none_match_copy",
            "PUT",
            "/bkt/copy.bin",
            &[("x-amz-copy-source", "/bkt/keep.bin"), ("If-None-Match", "*")],
            b"",
        ),
        on_admin("gzip", "PUT", "/bkt/keep.bin", &[("Content-Encoding", "gzip")], b"plain"),
        on_admin(
            "create_sse_c",
            "POST",
            "/bkt/mp.bin?uploads",
            &[("x-amz-server-side-encryption-customer-algorithm", "AES256")],
            b"",
        ),
        on_admin("put_x_id", "PUT", "/bkt/new.bin?x-id=PutObject", &[], b"new object"),
        Case {
            name: "get_x_id",
            host: data.clone(),
            method: "GET",
            path: "/bkt/keep.bin?x-id=GetObject",
            headers: &[],
            body: b"",
        },
        Case {
            name: "list_buckets_x_id",
            host: data.clone(),
            method: "GET",
            path: "/?x-id=ListBuckets",
            headers: &[],
            body: b"",
        },
        on_admin("head_x_id_admin", "HEAD", "/bkt/keep.bin?x-id=HeadObject", &[], b""),
    ];
    let out = raw(&env, &[("write", &write)], &cases);
    for name in [
        "acl",
        "retention",
        "legal_hold",
        "delete_version",
        "bucket_tagging",
        "if_match_tagging",
        "copy_sse_c",
        "copy_by_post",
        "sse_c",
        "sse",
        "lock",
        "if_none_match_etag",
        "if_none_match_delete",
        "if_match_size_delete",
        "if_none_match_copy",
        "gzip",
        "create_sse_c",
    ] {
        assert_eq!(answer(&out, name), (501, "NotImplemented".into()), "{name}");
    }
    // Conditional PutObjects and a DeleteObject whose precondition fails on the existing object
    // (tests/api/s3_conditional.rs).
    for name in ["if_none_match", "if_match", "if_match_delete"] {
        assert_eq!(answer(&out, name), (412, "PreconditionFailed".into()), "{name}");
    }
    // Tagging is implemented (tests/api/s3_tagging.rs): it changes no content.
    assert_eq!(answer(&out, "tagging").0, 200, "{}", out["tagging"]);
    assert_eq!(answer(&out, "delete_tagging").0, 204, "{}", out["delete_tagging"]);
    for name in ["put_x_id", "get_x_id", "list_buckets_x_id", "head_x_id_admin"] {
        assert_eq!(answer(&out, name).0, 200, "{name}: {}", out[name]);
    }

    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["keep.bin", "new.bin"], "nothing refused was stored or deleted");
    assert_eq!(sha256_hex(&read_back(&server, &write, "/bkt/keep.bin")), sha256_hex(&original));
    assert_eq!(read_back(&server, &write, "/bkt/new.bin"), b"new object");
}

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
    assert_eq!(completes.iter().filter(|c| c.0 == 200).count(), 1, "exactly one Complete wins: {completes:?}");
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

#[test]
fn small_xml_bodies_are_paced_and_delete_objects_needs_a_digest() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    for key in ["a", "b", "c"] {
        env.put_bytes("bkt", key, key.as_bytes(), &[]);
    }
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__BODY_IDLE", "1s")], &[]);
    let admin = server.admin.to_string();
    let delete_a = b"<Delete><Object><Key>a</Key></Object></Delete>".as_slice();
    let delete_b = b"<Delete><Object><Key>b</Key></Object></Delete>".as_slice();
    // base64(md5(delete_b)), computed by python3's hashlib.
    let md5_b = "saCew/2Dq5dQ6qnZCXppLg==";
    let complete =
        b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"0\"</ETag></Part></CompleteMultipartUpload>";
    let case = |name, path, headers, body| Case { name, host: admin.clone(), method: "POST", path, headers, body };
    let with_md5 = [("Content-MD5", md5_b)];
    let stalled_md5 = [("Content-MD5", md5_b), ("_stall", "3")];
    let cases = vec![
        case("no_digest", "/bkt?delete", &[][..], delete_a),
        case("invalid_md5", "/bkt?delete", &[("Content-MD5", "not base64!")], delete_a),
        case("wrong_md5", "/bkt?delete", &with_md5, delete_a),
        case("stalled_delete", "/bkt?delete", &stalled_md5, delete_b),
        case("stalled_complete", "/bkt/k?uploadId=00", &[("_stall", "3")], complete),
        case("md5_ok", "/bkt?delete", &with_md5, delete_b),
    ];
    let out = raw(&env, &[("write", &write)], &cases);
    assert_eq!(answer(&out, "no_digest"), (400, "InvalidRequest".into()));
    assert_eq!(answer(&out, "invalid_md5"), (400, "InvalidDigest".into()));
    assert_eq!(answer(&out, "wrong_md5"), (400, "BadDigest".into()));
    assert_eq!(answer(&out, "stalled_delete"), (400, "RequestTimeout".into()));
    assert_eq!(answer(&out, "stalled_complete"), (400, "RequestTimeout".into()));
    assert_eq!(answer(&out, "md5_ok").0, 200, "{}", out["md5_ok"]);
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "c"], "only the verified DeleteObjects deleted anything");
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

    assert_eq!(answer(&out, "sigv2_data"), (400, "InvalidRequest".into()), "{}", out["sigv2_data"]);
    assert_eq!(out["sigv2_data"][2]["content-type"], "application/xml");
    assert_eq!(answer(&out, "sigv2_admin"), (400, "InvalidRequest".into()), "{}", out["sigv2_admin"]);
    assert_eq!(answer(&out, "foreign_id"), (403, "InvalidAccessKeyId".into()));
    assert_eq!(answer(&out, "delete_in_stats").0, 200, "{}", out["delete_in_stats"]);
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
