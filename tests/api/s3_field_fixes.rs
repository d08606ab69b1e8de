//! S3 behaviours real clients trip on (issue 46, item 11), each driven by a real client or signed by botocore: a
//! retried CompleteMultipartUpload answers as the first did (and resurrects nothing), a PUT with no length is
//! `411` and stores nothing, bucket CORS over S3 is the rule the CLI sets, ListBuckets pages, SigV4 dated by
//! `Date`, and ListObjects V1 echoes its parameters as sent.

use crate::helpers::s3::*;
use crate::helpers::*;
use crate::s3_writes::listed;

/// CompleteMultipartUpload, sent again after it succeeded (its answer "lost"), through `spec["retry"]` (another
/// replica, or the same server), then after the object changed. Prints JSON.
const COMPLETE_RETRY: &str = r#"
s3 = client(spec["endpoint"], spec)
retry = client(spec["retry"], spec)
part = bytes((i * 31) % 256 for i in range(5 << 20))
def upload(key):
    uid = s3.create_multipart_upload(Bucket="bkt", Key=key)["UploadId"]
    parts = []
    for n, body in enumerate([part, b"tail"], 1):
        etag = s3.upload_part(Bucket="bkt", Key=key, UploadId=uid, PartNumber=n, Body=body)["ETag"]
        parts.append({"PartNumber": n, "ETag": etag})
    return uid, parts
def complete(c, key, uid, parts):
    try:
        r = c.complete_multipart_upload(Bucket="bkt", Key=key, UploadId=uid, MultipartUpload={"Parts": parts})
        return [200, r["ETag"], r["Bucket"], r["Key"], r["Location"]]
    except ClientError as e:
        return [e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]]
out = {}
uid, parts = upload("a.bin")
out["first"] = complete(s3, "a.bin", uid, parts)
out["retry"] = complete(retry, "a.bin", uid, parts)
out["retry_again"] = complete(s3, "a.bin", uid, parts)
out["other_parts"] = complete(retry, "a.bin", uid, parts[:1])
out["other_key"] = complete(retry, "b.bin", uid, parts)
s3.put_object(Bucket="bkt", Key="a.bin", Body=b"replaced")
out["after_overwrite"] = complete(retry, "a.bin", uid, parts)
out["body_after_overwrite"] = s3.get_object(Bucket="bkt", Key="a.bin")["Body"].read().decode()
uid, parts = upload("d.bin")
out["second"] = complete(s3, "d.bin", uid, parts)
s3.delete_object(Bucket="bkt", Key="d.bin")
out["after_delete"] = complete(retry, "d.bin", uid, parts)
out["head_after_delete"] = code(lambda: s3.head_object(Bucket="bkt", Key="d.bin"))
print(json.dumps(out))
"#;

// A retried Complete (SDKs retry it when the answer is lost) gets the first answer, on any replica (the state is in
// the database); a different part list, another key, or a key overwritten or deleted since gets `NoSuchUpload`, and
// nothing comes back.
both_backends!(a_retried_complete_multipart_upload_answers_as_the_first_did, |env| {
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let first = env.serve();
    // On PostgreSQL the retry goes to a second replica on the same database and data dir.
    let second = env.database_url.is_some().then(|| env.serve());
    let retry_at = second.as_ref().unwrap_or(&first).data;
    let mut spec = key_json(&key);
    spec["endpoint"] = format!("http://{}", first.data).into();
    spec["retry"] = format!("http://{retry_at}").into();
    let out = run_boto3(&env.dir.path().join("home"), COMPLETE_RETRY, &spec);
    assert_eq!(out["first"][0], 200, "{out}");
    assert!(out["first"][1].as_str().unwrap().ends_with("-2\""), "a multipart ETag: {out}");
    assert_eq!(out["retry"], out["first"], "the same answer again: {out}");
    assert_eq!(out["retry_again"], out["first"], "{out}");
    let no_such_upload = serde_json::json!([404, "NoSuchUpload"]);
    assert_eq!(out["other_parts"], no_such_upload, "another part list is no retry: {out}");
    assert_eq!(out["other_key"], no_such_upload, "{out}");
    assert_eq!(out["after_overwrite"], no_such_upload, "{out}");
    assert_eq!(out["body_after_overwrite"], "replaced", "{out}");
    assert_eq!(out["second"][0], 200, "{out}");
    assert_eq!(out["after_delete"], no_such_upload, "{out}");
    assert_eq!(out["head_after_delete"], serde_json::json!([404, "404"]), "not resurrected: {out}");
    assert_eq!(listed(&env, "bkt"), [("a.bin".to_owned(), 8)], "only the overwritten object: {out}");
});

/// Sends `head` (no body framing at all), then a few bytes a client might still send, and reads the answer.
fn unframed(addr: std::net::SocketAddr, head: Vec<u8>) -> Response {
    let mut conn = Conn::open(addr);
    conn.send(&head);
    let _ = conn.send_lossy(b"these bytes have no length");
    conn.read_response(false).expect("an answer")
}

// A PUT with neither Content-Length nor chunked Transfer-Encoding: S3's `411 MissingContentLength` for PutObject and
// UploadPart, native JSON `411` for the native PUT; nothing stored, no part.
#[test]
fn a_put_without_a_length_is_411_and_stores_nothing() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let put = Signing { method: "PUT", ..Default::default() };
    let signed = signed_headers(&key, "/bkt/object.bin", &put);
    let r = unframed(server.data, raw_request("PUT", "/bkt/object.bin", &as_refs(&signed), true));
    assert_eq!((r.status, s3_code(&r)), (411, "MissingContentLength".to_owned()), "PutObject");

    let create = signed_headers(&key, "/bkt/part.bin?uploads", &Signing { method: "POST", ..Default::default() });
    let created = server.request("POST", "/bkt/part.bin?uploads", &as_refs(&create));
    let body = String::from_utf8_lossy(&created.body).into_owned();
    let upload_id = body.split("<UploadId>").nth(1).and_then(|s| s.split("</UploadId>").next()).expect(&body);
    let part_path = format!("/bkt/part.bin?partNumber=1&uploadId={upload_id}");
    let signed = signed_headers(&key, &part_path, &put);
    let r = unframed(server.data, raw_request("PUT", &part_path, &as_refs(&signed), true));
    assert_eq!((r.status, s3_code(&r)), (411, "MissingContentLength".to_owned()), "UploadPart");
    let parts_path = format!("/bkt/part.bin?uploadId={upload_id}");
    let list = signed_headers(&key, &parts_path, &Signing { method: "GET", ..Default::default() });
    let parts = server.get(&parts_path, &as_refs(&list));
    assert_eq!(parts.status, 200);
    assert!(!String::from_utf8_lossy(&parts.body).contains("<Part>"), "no part stored");

    let token = env.token("bkt", "write", &[]);
    let auth = format!("Bearer {token}");
    let head = format!("PUT /bkt/native.bin HTTP/1.1\r\nHost: t\r\nAuthorization: {auth}\r\nConnection: close\r\n\r\n");
    let r = unframed(server.admin, head.into_bytes());
    assert_eq!((r.status, r.json()["error"].as_str()), (411, Some("length_required")), "native PUT");

    assert!(listed(&env, "bkt").is_empty(), "nothing stored");
    // A zero length is still an empty object, and chunked framing still a body.
    let r = server.admin("PUT", "/bkt/empty.bin", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 201);
    let chunked = format!(
        "PUT /bkt/chunked.bin HTTP/1.1\r\nHost: t\r\nAuthorization: {auth}\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    );
    let mut conn = Conn::open(server.admin);
    conn.send(chunked.as_bytes());
    assert_eq!(conn.read_response(false).expect("an answer").status, 201);
    assert_eq!(listed(&env, "bkt"), [("chunked.bin".to_owned(), 5), ("empty.bin".to_owned(), 0)]);
}

const BUCKET_CORS: &str = r#"
admin = client(spec["endpoint"], spec["admin"])
writer = client(spec["endpoint"], spec["writer"])
rule = {"AllowedOrigins": ["https://app.example"], "AllowedMethods": ["GET", "PUT"],
        "AllowedHeaders": ["x-custom"], "ExposeHeaders": ["x-amz-meta-a"], "MaxAgeSeconds": 600}
out = {}
out["writer_put"] = code(lambda: writer.put_bucket_cors(Bucket="bkt", CORSConfiguration={"CORSRules": [rule]}))
out["put"] = code(lambda: admin.put_bucket_cors(Bucket="bkt", CORSConfiguration={"CORSRules": [rule]}))
out["get"] = admin.get_bucket_cors(Bucket="bkt")["CORSRules"]
with_id = dict(rule, ID="r1")
out["with_id"] = code(lambda: admin.put_bucket_cors(Bucket="bkt", CORSConfiguration={"CORSRules": [with_id]}))
two = {"CORSRules": [rule, dict(rule, AllowedOrigins=["https://other.example"])]}
out["two_rules"] = code(lambda: admin.put_bucket_cors(Bucket="bkt", CORSConfiguration=two))
wild = dict(rule, AllowedOrigins=["https://*.example"])
out["wildcard"] = code(lambda: admin.put_bucket_cors(Bucket="bkt", CORSConfiguration={"CORSRules": [wild]}))
try:
    admin.put_bucket_cors(Bucket="bkt", CORSConfiguration={"CORSRules": [with_id]})
except ClientError as e:
    out["with_id_message"] = e.response["Error"]["Message"]
out["get_after_refusals"] = admin.get_bucket_cors(Bucket="bkt")["CORSRules"]
out["missing_bucket"] = code(lambda: writer.put_bucket_cors(Bucket="nope", CORSConfiguration={"CORSRules": [rule]}))
print(json.dumps(out))
"#;

const BUCKET_CORS_DELETE: &str = r#"
admin = client(spec["endpoint"], spec["admin"])
out = {"delete": code(lambda: admin.delete_bucket_cors(Bucket="bkt"))}
out["get"] = code(lambda: admin.get_bucket_cors(Bucket="bkt"))
print(json.dumps(out))
"#;

// PutBucketCors, GetBucketCors and DeleteBucketCors with boto3 set, show and clear the rule `bucket cors set` sets
// (the CLI's `bucket list` shows it, preflights answer by it), for `admin` on the bucket only; what the one rule
// cannot hold is refused naming the element, and the rule stays.
#[test]
fn bucket_cors_over_s3_is_the_rule_the_cli_sets() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let admin = s3_key_granting(&env, &["bkt:admin"]);
    let writer = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.data), "admin": key_json(&admin), "writer": key_json(&writer),
    });
    let home = env.dir.path().join("home");
    let out = run_boto3(&home, BUCKET_CORS, &spec);
    assert_eq!(out["writer_put"], serde_json::json!([403, "AccessDenied"]), "{out}");
    assert_eq!(out["put"], serde_json::json!([200, ""]), "{out}");
    let got = &out["get"][0];
    assert_eq!(got["AllowedOrigins"], serde_json::json!(["https://app.example"]), "{out}");
    assert_eq!(got["AllowedMethods"], serde_json::json!(["GET", "PUT"]), "{out}");
    assert!(got["AllowedHeaders"].as_array().unwrap().contains(&"x-custom".into()), "{out}");
    assert!(got["ExposeHeaders"].as_array().unwrap().contains(&"x-amz-meta-a".into()), "{out}");
    assert_eq!(got["MaxAgeSeconds"], 600, "{out}");
    assert_eq!(out["with_id"], serde_json::json!([501, "NotImplemented"]), "{out}");
    assert!(out["with_id_message"].as_str().unwrap().starts_with("ID"), "names the element: {out}");
    assert_eq!(out["two_rules"], serde_json::json!([501, "NotImplemented"]), "{out}");
    assert_eq!(out["wildcard"], serde_json::json!([400, "InvalidRequest"]), "{out}");
    assert_eq!(out["get_after_refusals"], out["get"], "a refusal changes nothing: {out}");
    assert_eq!(out["missing_bucket"], serde_json::json!([403, "AccessDenied"]), "as a private bucket: {out}");

    // The CLI sees the same rule, and a browser's preflight is answered by it.
    let buckets = env.ok(&["bucket", "list"]);
    assert!(buckets.contains("https://app.example") && buckets.contains("x-custom"), "{buckets}");
    let preflight = [("Origin", "https://app.example"), ("Access-Control-Request-Method", "PUT")];
    let r = server.request("OPTIONS", "/bkt/k", &preflight);
    assert_eq!(r.header("access-control-allow-origin"), Some("https://app.example"), "{:?}", r.headers);

    let out = run_boto3(&home, BUCKET_CORS_DELETE, &spec);
    assert_eq!(out["delete"], serde_json::json!([200, ""]), "{out}");
    assert_eq!(out["get"], serde_json::json!([404, "NoSuchCORSConfiguration"]), "{out}");
    let r = server.request("OPTIONS", "/bkt/k", &preflight);
    assert_eq!(r.header("access-control-allow-origin"), None, "cleared: {:?}", r.headers);
}

const LIST_BUCKETS_PAGES: &str = r#"
s3 = client(spec["endpoint"], spec)
pages = [[b["Name"] for b in p["Buckets"]] for p in
         s3.get_paginator("list_buckets").paginate(PaginationConfig={"PageSize": 2})]
prefixed = [[b["Name"] for b in p["Buckets"]] for p in
            s3.get_paginator("list_buckets").paginate(Prefix="bb", PaginationConfig={"PageSize": 2})]
first = s3.list_buckets(MaxBuckets=2)
print(json.dumps({"pages": pages, "prefixed": prefixed, "token": first.get("ContinuationToken"),
                  "all": [b["Name"] for b in s3.list_buckets()["Buckets"]]}))
"#;

// boto3's ListBuckets paginator pages through `max-buckets` and `continuation-token`, with a prefix too.
#[test]
fn list_buckets_pages_through_max_buckets_and_continuation_tokens() {
    let env = TestEnv::new();
    for name in ["aa1", "bb1", "bb2", "bb3", "cc1"] {
        env.bucket(name, false);
    }
    let key = s3_key_granting(&env, &["*:read"]);
    let server = env.serve();
    let mut spec = key_json(&key);
    spec["endpoint"] = format!("http://{}", server.data).into();
    let out = run_boto3(&env.dir.path().join("home"), LIST_BUCKETS_PAGES, &spec);
    assert_eq!(out["pages"], serde_json::json!([["aa1", "bb1"], ["bb2", "bb3"], ["cc1"]]), "{out}");
    assert_eq!(out["prefixed"], serde_json::json!([["bb1", "bb2"], ["bb3"]]), "{out}");
    assert!(out["token"].is_string(), "{out}");
    assert_eq!(out["all"], serde_json::json!(["aa1", "bb1", "bb2", "bb3", "cc1"]), "{out}");
    // boto3 refuses 0 itself; the server does too.
    let signed = signed_headers(&key, "/?max-buckets=0", &Signing { method: "GET", ..Default::default() });
    let r = server.get("/?max-buckets=0", &as_refs(&signed));
    assert_eq!((r.status, s3_code(&r)), (400, "InvalidArgument".to_owned()));
}

// botocore's S3SigV4Auth signs a request that carries `Date` by that header (no `X-Amz-Date`, `date` signed): it is
// accepted, with the same clock-skew bounds.
#[test]
fn a_sigv4_request_dated_by_the_date_header_is_accepted() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "a.txt", b"dated", &[]);
    let key = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    let dated = |skew_secs: i64| {
        let signing =
            Signing { method: "GET", headers: &[("Date", "set by botocore")], skew_secs, ..Default::default() };
        signed_headers(&key, "/bkt/a.txt", &signing)
    };
    let headers = dated(0);
    assert!(headers.iter().any(|(k, _)| k == "Date"), "{headers:?}");
    assert!(!headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("x-amz-date")), "{headers:?}");
    let auth = &headers.iter().find(|(k, _)| k == "Authorization").unwrap().1;
    assert!(auth.contains("SignedHeaders=date;"), "{auth}");
    let r = server.get("/bkt/a.txt", &as_refs(&headers));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"dated"[..]), "{}", String::from_utf8_lossy(&r.body));
    for skew in [-20 * 60, 20 * 60] {
        let r = server.get("/bkt/a.txt", &as_refs(&dated(skew)));
        assert_eq!((r.status, s3_code(&r)), (403, "RequestTimeTooSkewed".to_owned()), "skew {skew}");
    }
    // Tampered after signing: the date is part of what was signed.
    let mut tampered = dated(0);
    let date = &mut tampered.iter_mut().find(|(k, _)| k == "Date").unwrap().1;
    let mut fields: Vec<String> = date.split(' ').map(str::to_owned).collect();
    let (hours_minutes, seconds) = fields[4].split_at(6);
    fields[4] = format!("{hours_minutes}{:02}", (seconds.parse::<u32>().unwrap() + 1) % 60);
    *date = fields.join(" ");
    let r = server.get("/bkt/a.txt", &as_refs(&tampered));
    assert_eq!((r.status, s3_code(&r)), (403, "SignatureDoesNotMatch".to_owned()));
}

const LIST_V1_ECHO: &str = r#"
s3 = client(spec["endpoint"], spec)
v1 = s3.list_objects(Bucket="bkt", Prefix="dir/a b+c", Delimiter="/", Marker="dir/a b+c 0")
v2 = s3.list_objects_v2(Bucket="bkt", Prefix="dir/a b+c", Delimiter="/", StartAfter="dir/a b+c 0")
print(json.dumps({"v1": {k: v1.get(k) for k in ["Prefix", "Delimiter", "Marker"]},
                  "v1_keys": [o["Key"] for o in v1.get("Contents", [])],
                  "v2": {k: v2.get(k) for k in ["Prefix", "Delimiter", "StartAfter"]},
                  "v2_keys": [o["Key"] for o in v2.get("Contents", [])]}))
"#;

// ListObjects V1 and V2 as boto3 sends them (it adds `encoding-type=url` and decodes what S3 encodes, but not V1's
// Prefix): the parameters come back as they were given.
#[test]
fn list_objects_echoes_its_parameters_as_given() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "dir/a b+c 1.txt", b"x", &[]);
    let key = s3_key(&env, "bkt", &[]);
    let server = env.serve();
    let mut spec = key_json(&key);
    spec["endpoint"] = format!("http://{}", server.data).into();
    let out = run_boto3(&env.dir.path().join("home"), LIST_V1_ECHO, &spec);
    let given = serde_json::json!({"Prefix": "dir/a b+c", "Delimiter": "/", "Marker": "dir/a b+c 0"});
    assert_eq!(out["v1"], given, "{out}");
    assert_eq!(out["v1_keys"], serde_json::json!(["dir/a b+c 1.txt"]), "{out}");
    let given = serde_json::json!({"Prefix": "dir/a b+c", "Delimiter": "/", "StartAfter": "dir/a b+c 0"});
    assert_eq!(out["v2"], given, "{out}");
    assert_eq!(out["v2_keys"], serde_json::json!(["dir/a b+c 1.txt"]), "{out}");

    // Raw: V1's Prefix as given either way; the keys and V1's Marker encoded only when asked.
    let cases = [
        ("prefix=dir%2Fa%20b%2Bc&marker=dir%2Fa%20b", "<Prefix>dir/a b+c</Prefix><Marker>dir/a b</Marker>"),
        (
            "prefix=dir%2Fa%20b%2Bc&marker=dir%2Fa%20b&encoding-type=url",
            "<Prefix>dir/a b+c</Prefix><Marker>dir/a%20b</Marker>",
        ),
        ("list-type=2&prefix=dir%2Fa%20b%2Bc", "<Prefix>dir/a b+c</Prefix>"),
        ("list-type=2&prefix=dir%2Fa%20b%2Bc&encoding-type=url", "<Prefix>dir/a%20b%2Bc</Prefix>"),
    ];
    for (query, want) in cases {
        let path = format!("/bkt?{query}");
        let signed = signed_headers(&key, &path, &Signing { method: "GET", ..Default::default() });
        let r = server.get(&path, &as_refs(&signed));
        let body = String::from_utf8_lossy(&r.body);
        assert!(body.contains(want), "{query}: {body}");
    }
}
