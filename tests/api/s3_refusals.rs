//! S3 requests refused in S3's words (found by a review of the S3 API, issue 15): writes we do not implement are
//! refused before anything is stored or deleted, newer SDKs' `x-id` is accepted, and small XML bodies need a
//! digest and are paced. Requests are signed by botocore and sent raw ([`raw`]), never signed by our code.

use crate::helpers::s3::{AccessKey, PythonScript, run_ok, s3_key};
use crate::helpers::sha256_hex;
use crate::helpers::*;
use crate::s3_writes::{listed, read_back};

/// Sends each case of `spec["cases"]` (`[name, host, method, path, headers, body]`, body as latin-1 text) signed
/// by botocore's `S3SigV4Auth` (unless the case's headers carry their own `Authorization`), and prints
/// `{name: [status, code, headers]}`. A `_stall` header sends half the body and nothing more: the answer is read
/// as soon as the server gives it (its own timer ends the wait).
const RAW: &str = r#"
import http.client, json, sys
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
spec = json.loads(sys.argv[1])
out = {}
for name, host, method, path, headers, body in spec["cases"]:
    body = body.encode("latin-1")
    key = spec["keys"][headers.pop("_key", "write")]
    stall = headers.pop("_stall", None) is not None
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
    let stalled_md5 = [("Content-MD5", md5_b), ("_stall", "")];
    let cases = vec![
        case("no_digest", "/bkt?delete", &[][..], delete_a),
        case("invalid_md5", "/bkt?delete", &[("Content-MD5", "not base64!")], delete_a),
        case("wrong_md5", "/bkt?delete", &with_md5, delete_a),
        case("stalled_delete", "/bkt?delete", &stalled_md5, delete_b),
        case("stalled_complete", "/bkt/k?uploadId=00", &[("_stall", "")], complete),
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
