//! Anonymous S3 reads of public buckets (boto3 with `signature_version=UNSIGNED`, curl), path-style and
//! virtual-hosted, with private and absent buckets answering alike; and absolute-form request targets, whose
//! authority chooses the bucket and is the host SigV4 checks (RFC 9112 §3.2.2), never `Host`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::helpers::s3::*;
use crate::helpers::*;

/// boto3, unsigned, reads `spec["key"]` of each bucket in both addressing styles (`*.s3.test` resolves to the
/// server), and tries what stays refused: a listing and an upload. Prints per style and bucket what each call
/// gave: the SHA-256 of a body, a length, or `[status, code]`.
const UNSIGNED_READS: &str = r#"
import socket
from botocore import UNSIGNED
real = socket.getaddrinfo
def local(host, *args, **kwargs):
    if isinstance(host, str) and (host == "s3.test" or host.endswith(".s3.test")):
        host = "127.0.0.1"
    return real(host, *args, **kwargs)
socket.getaddrinfo = local
def attempt(call):
    try:
        return call()
    except ClientError as e:
        return [e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"]]
out = {}
for style in ("path", "virtual"):
    s3 = boto3.client("s3", endpoint_url=spec["endpoint"], region_name="us-east-1",
        config=Config(signature_version=UNSIGNED, s3={"addressing_style": style}, retries={"max_attempts": 1}))
    for b in ("pub", "priv", "gone"):
        k = spec["key"]
        sha = lambda **kw: hashlib.sha256(s3.get_object(Bucket=b, Key=k, **kw)["Body"].read()).hexdigest()
        out[style + "/" + b] = {
            "get": attempt(sha),
            "range": attempt(lambda: sha(Range="bytes=1000-1999")),
            "head": attempt(lambda: s3.head_object(Bucket=b, Key=k)["ContentLength"]),
            "list": attempt(lambda: s3.list_objects_v2(Bucket=b)["KeyCount"]),
            "put": attempt(lambda: s3.put_object(Bucket=b, Key="new.txt", Body=b"x")["ETag"]),
        }
print(json.dumps(out))
"#;

/// A response as curl saw it: status, header fields (lower-case names) and body.
fn curl(home: &std::path::Path, args: &[&str]) -> Response {
    let (head, body) = (home.join("head"), home.join("body"));
    let mut cmd = clean_command("curl", home);
    cmd.args(["-sS", "-D"]).arg(&head).arg("-o").arg(&body).args(args);
    run_ok(&mut cmd);
    let head = std::fs::read_to_string(&head).unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers =
        lines.filter_map(|l| l.split_once(':')).map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned())).collect();
    // With `-I` (HEAD) curl writes the head where the body would go: a HEAD answer has none.
    let body = if args.contains(&"-I") { Vec::new() } else { std::fs::read(&body).unwrap_or_default() };
    Response { status, headers, body }
}

/// What two refusals must share: status, every header but the request's own (`Date`, the request id) and the
/// body with its request id taken out.
fn refusal(r: &Response) -> (u16, BTreeMap<String, String>, String) {
    let mut headers = r.headers_without_date();
    // A request id is per request, and its length varies (a counter in hex), so the body's length does too.
    for own in ["x-amz-request-id", "x-request-id", "content-length"] {
        headers.remove(own);
    }
    let body = String::from_utf8_lossy(&r.body).into_owned();
    let body = match (body.find("<RequestId>"), body.find("</RequestId>")) {
        (Some(s), Some(e)) => format!("{}{}", &body[..s], &body[e..]),
        _ => body,
    };
    (r.status, headers, body)
}

/// [`refusal`] without the XML error's `<Resource>`, which echoes the request's own path.
fn without_resource(r: &Response) -> (u16, BTreeMap<String, String>, String) {
    let (status, headers, body) = refusal(r);
    let body = match (body.find("<Resource>"), body.find("</Resource>")) {
        (Some(s), Some(e)) => format!("{}{}", &body[..s], &body[e..]),
        _ => body,
    };
    (status, headers, body)
}

#[test]
fn unsigned_s3_reads_serve_public_buckets_and_private_and_missing_ones_answer_alike() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.bucket("priv", false);
    let bytes = test_bytes(300_000, 46);
    let key = "dir/a b.bin";
    env.put_bytes("pub", key, &bytes, &[]);
    env.put_bytes("priv", key, &bytes, &[]);
    let log = env.dir.path().join("access.log");
    let server =
        env.serve_with(&[("BLOBGATE_S3__DOMAIN", "s3.test"), ("BLOBGATE_ACCESS_LOG", log.to_str().unwrap())], &[]);
    let port = server.data.port();
    let (whole, range) = (sha256_hex(&bytes), sha256_hex(&bytes[1000..2000]));

    let home = tempfile::tempdir().unwrap();
    let spec = serde_json::json!({"endpoint": format!("http://s3.test:{port}"), "key": key});
    let out = run_boto3(home.path(), UNSIGNED_READS, &spec);
    for style in ["path", "virtual"] {
        let public = &out[format!("{style}/pub")];
        assert_eq!(public["get"], whole.as_str(), "{style}: {out}");
        assert_eq!(public["range"], range.as_str(), "{style}: {out}");
        assert_eq!(public["head"], bytes.len(), "{style}: {out}");
        // What S3's public-read offers anonymously is reading objects: no listing, no upload.
        assert!(public["list"].is_array() && public["put"].is_array(), "{style}: {out}");
        let (private, missing) = (&out[format!("{style}/priv")], &out[format!("{style}/gone")]);
        assert_eq!(private, missing, "{style}: a private and an absent bucket answer alike");
        assert_eq!(private["list"], serde_json::json!([403, "AccessDenied"]), "{style}: {out}");
    }
    // Virtual-hosted is S3 on every request: S3's 403 for the private and the absent bucket. Path-style, an
    // unsigned object read is the native API's (docs/s3.md), but an AWS SDK's refusal is answered in S3's words
    // all the same: the SDK sees the 403 `AccessDenied` it would see from S3, not the native 401.
    let s3_refusal = serde_json::json!({"get": [403, "AccessDenied"], "range": [403, "AccessDenied"],
        "head": [403, "403"], "list": [403, "AccessDenied"], "put": [403, "AccessDenied"]});
    assert_eq!(out["virtual/priv"], s3_refusal, "{out}");
    // (Its unsigned PutObject is a native upload, whose refusal is still the native one.)
    for call in ["get", "range", "head", "list"] {
        assert_eq!(out["path/priv"][call], s3_refusal[call], "{call}: {out}");
    }
    assert_eq!(out["virtual/pub"]["list"], serde_json::json!([403, "AccessDenied"]), "{out}");
    assert_eq!(out["virtual/pub"]["put"], serde_json::json!([403, "AccessDenied"]), "{out}");
    assert_eq!(env.ok(&["ls", "pub"]).lines().count(), 1, "no anonymous upload was stored");

    // curl, both styles: every byte, and a range.
    let resolve = |bucket: &str| format!("{bucket}.s3.test:{port}:127.0.0.1");
    let virtual_url = |bucket: &str| format!("http://{bucket}.s3.test:{port}/dir/a%20b.bin");
    let path_url = |bucket: &str| format!("http://127.0.0.1:{port}/{bucket}/dir/a%20b.bin");
    for (url, resolve) in [(virtual_url("pub"), resolve("pub")), (path_url("pub"), resolve("pub"))] {
        let r = curl(home.path(), &["--resolve", &resolve, &url]);
        assert_eq!((r.status, sha256_hex(&r.body)), (200, whole.clone()), "{url}");
        let r = curl(home.path(), &["--resolve", &resolve, "-r", "1000-1999", &url]);
        assert_eq!((r.status, sha256_hex(&r.body)), (206, range.clone()), "{url}");
        assert_eq!(r.header("content-range"), Some("bytes 1000-1999/300000"));
    }
    // The private and the absent bucket: the same refusal, header for header, byte for byte.
    for (method, extra) in [("GET", &[][..]), ("GET", &["-r", "0-9"][..]), ("HEAD", &["-I"][..])] {
        let answer = |bucket: &str| {
            let (resolve, url) = (resolve(bucket), virtual_url(bucket));
            curl(home.path(), &[&["--resolve", resolve.as_str(), "-X", method][..], extra, &[url.as_str()]].concat())
        };
        let (private, missing) = (answer("priv"), answer("gone"));
        assert_eq!(private.status, 403, "{method} {extra:?}");
        assert_eq!(refusal(&private), refusal(&missing), "{method} {extra:?}");
        let path = |bucket: &str, sdk: &[&str]| {
            let url = path_url(bucket);
            curl(home.path(), &[&["-X", method][..], extra, sdk, &[url.as_str()]].concat())
        };
        // Path-style, curl gets the native API's refusal: 401 with the bearer challenge.
        let (native_private, native_missing) = (path("priv", &[]), path("gone", &[]));
        assert_eq!(native_private.status, 401, "path-style {method} {extra:?}");
        assert_eq!(native_private.header("www-authenticate"), Some("Bearer realm=\"blobgate\""));
        assert_eq!(refusal(&native_private), refusal(&native_missing), "path-style {method} {extra:?}");
        // The same request with the fields every AWS SDK sends gets S3's refusal, header for header the
        // virtual-hosted one; the bodies differ only in `<Resource>`, the path each request named.
        let sdk = [
            "-H",
            "amz-sdk-invocation-id: 0b8a3f7e-46a2-4d1c-9d1e-7f2c1a6b5e44",
            "-H",
            "amz-sdk-request: attempt=1; max=1",
        ];
        let (sdk_private, sdk_missing) = (path("priv", &sdk), path("gone", &sdk));
        assert_eq!(sdk_private.status, 403, "path-style from an SDK {method} {extra:?}");
        for answer in [&sdk_missing, &private] {
            assert_eq!(without_resource(&sdk_private), without_resource(answer), "{method} {extra:?}");
        }
    }
    let (private, missing) = (
        server.get("/dir/a%20b.bin", &[("Host", "priv.s3.test")]),
        server.get("/dir/a%20b.bin", &[("Host", "gone.s3.test")]),
    );
    assert_eq!((private.status, s3_code(&private)), (403, "AccessDenied".into()));
    assert_eq!(refusal(&private), refusal(&missing));

    // Counted as the native anonymous downloads are, and logged as `public`: boto3 and curl read the object
    // whole four times and a range four times, and boto3 asked HEAD twice.
    let mut last = serde_json::Value::Null;
    let counted = wait_for(Duration::from_secs(30), || {
        let stats: serde_json::Value = serde_json::from_str(env.ok(&["stats", "--json"]).trim()).unwrap();
        last = stats.as_array().unwrap().iter().find(|r| r["bucket"] == "pub").cloned().unwrap_or_default();
        last["range_requests"] == 4 && last["head_requests"] == 2 && last["requests"] == 8
    });
    assert!(counted, "{last}");
    let lines = std::fs::read_to_string(&log).unwrap();
    let served: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["path"] == "/dir/a%20b.bin" && l["status"].as_u64().is_some_and(|s| s < 300))
        .collect();
    assert_eq!(served.len(), 5, "boto3 GET, range and HEAD, curl GET and range, virtual-hosted: {lines}");
    assert!(served.iter().all(|l| l["principal"] == "public"), "{served:?}");
}

#[test]
fn an_absolute_form_target_chooses_the_bucket_and_host_is_ignored() {
    let env = TestEnv::new();
    env.bucket("pub", true);
    env.bucket("priv", false);
    env.bucket("other", false);
    for bucket in ["pub", "priv", "other"] {
        env.put_bytes(bucket, "a/x", format!("{bucket} bytes").as_bytes(), &[]);
    }
    let key = s3_key_granting(&env, &["priv:read", "other:read"]);
    let server = env.serve_with(&[("BLOBGATE_S3__DOMAIN", "s3.test")], &[]);
    let body = |r: &Response| String::from_utf8_lossy(&r.body).into_owned();

    // Unsigned: the target's bucket, whatever Host says, virtual-hosted and path-style.
    let r = server.get("http://pub.s3.test/a/x", &[("Host", "priv.s3.test")]);
    assert_eq!((r.status, body(&r)), (200, "pub bytes".into()));
    let r = server.get("http://priv.s3.test/a/x", &[("Host", "pub.s3.test")]);
    assert_eq!((r.status, s3_code(&r)), (403, "AccessDenied".into()), "Host's public bucket is not read");
    let r = server.get("http://127.0.0.1/pub/a/x", &[("Host", "priv.s3.test")]);
    assert_eq!((r.status, body(&r)), (200, "pub bytes".into()), "a path-style target under another Host");

    // Signed as a client sending absolute-form signs: the host of its URL, which is what is checked.
    let get = Signing { method: "GET", ..Default::default() };
    let for_other = signed_headers_for_host("other.s3.test", &key, "/a/x", &get);
    let mut headers = as_refs(&for_other);
    headers.push(("Host", "priv.s3.test"));
    let r = server.get("http://other.s3.test/a/x", &headers);
    assert_eq!((r.status, body(&r)), (200, "other bytes".into()));
    let path_style = signed_headers_for_host("s3.test", &key, "/other/a/x", &get);
    let mut headers = as_refs(&path_style);
    headers.push(("Host", "priv.s3.test"));
    let r = server.get("http://s3.test/other/a/x", &headers);
    assert_eq!((r.status, body(&r)), (200, "other bytes".into()));

    // A signature made for Host `priv` cannot be replayed onto another bucket through the target.
    let for_priv = signed_headers_for_host("priv.s3.test", &key, "/a/x", &get);
    let mut headers = as_refs(&for_priv);
    headers.push(("Host", "priv.s3.test"));
    let r = server.get("/a/x", &headers);
    assert_eq!((r.status, body(&r)), (200, "priv bytes".into()), "as signed");
    let r = server.get("http://other.s3.test/a/x", &headers);
    assert_eq!((r.status, s3_code(&r)), (403, "SignatureDoesNotMatch".into()), "{}", body(&r));
    let r = server.get("http://pub.s3.test/a/x", &headers);
    assert_eq!((r.status, s3_code(&r)), (403, "SignatureDoesNotMatch".into()), "{}", body(&r));

    // HTTP/1.0 may send no Host: the authority chooses all the same.
    let mut conn = Conn::open(server.data);
    conn.send(b"GET http://pub.s3.test/a/x HTTP/1.0\r\n\r\n");
    let r = conn.read_response(false).expect("a response");
    assert_eq!((r.status, body(&r)), (200, "pub bytes".into()));

    // Userinfo in the authority is refused (RFC 9110 §4.2.4), before anything is read.
    let r = server.get("http://u@pub.s3.test/a/x", &[("Host", "pub.s3.test")]);
    assert_eq!(r.status, 400);
}
