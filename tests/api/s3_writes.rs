//! S3 writes on the admin listener, driven by real clients (boto3, aws-cli, rclone, s3cmd) with their own config
//! and a clean environment, every byte checked with SHA-256 by reading it back from the data listener. Bad input
//! (a bad chunk signature, a wrong trailing checksum, a Complete with missing or misordered parts, a read key
//! writing, the wrong bucket or prefix) gets the right S3 code and stores nothing (`blobgate ls` and the blob
//! dir). Requests are signed by botocore; chunk signatures are computed by the Python helper from the AWS spec,
//! never by our code.

use std::path::Path;
use std::time::Duration;

use crate::helpers::s3::{
    AccessKey, PythonScript, aws, aws_home, boto3_output, rclone, rclone_config, run_ok, s3_key, s3cmd, s3cmd_config,
};
use crate::helpers::sha256_hex;
use crate::helpers::*;

/// The keys `blobgate ls BUCKET` lists, with their sizes.
pub fn listed(env: &TestEnv, bucket: &str) -> Vec<(String, u64)> {
    let out = env.ok(&["ls", bucket, "--json"]);
    out.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["key"].as_str().unwrap().to_owned(), v["size"].as_u64().unwrap())
        })
        .collect()
}

/// Every file under the data dir's `blobs/` (content-addressed objects).
fn blob_files(env: &TestEnv) -> Vec<String> {
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
    walk(&env.data_dir().join("blobs"), &mut found);
    found.sort();
    found
}

/// An object read back from the data listener with a SigV4 GET signed by botocore.
pub fn read_back(server: &Server, key: &AccessKey, path: &str) -> Vec<u8> {
    let headers = crate::helpers::s3::signed_headers(
        key,
        path,
        &crate::helpers::s3::Signing { method: "GET", ..Default::default() },
    );
    let r = server.get(path, &crate::helpers::s3::as_refs(&headers));
    assert_eq!(r.status, 200, "GET {path}: {}", String::from_utf8_lossy(&r.body));
    r.body
}

const BOTO3_WRITES: &str = r#"
s3 = client(spec["endpoint"], spec)
b = "bkt"
out = {}
small = open(spec["small"], "rb").read()
r = s3.put_object(Bucket=b, Key="odd/a b+c%d é.txt", Body=small, ContentType="text/x-small")
out["put_etag"] = r["ETag"]
out["put_md5"] = '"' + hashlib.md5(small).hexdigest() + '"'
s3.upload_file(spec["big"], b, "big/twenty.bin",
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=4))
out["big_head"] = s3.head_object(Bucket=b, Key="big/twenty.bin")["ContentLength"]
for k in ["del/one", "del/two", "del/three"]:
    s3.put_object(Bucket=b, Key=k, Body=k.encode())
s3.delete_object(Bucket=b, Key="del/one")
r = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "del/two"}, {"Key": "del/absent"}]})
out["deleted"] = sorted(d["Key"] for d in r.get("Deleted", []))
r = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "del/three"}], "Quiet": True})
out["quiet_deleted"] = r.get("Deleted", [])
# An upload left open, listed, then aborted.
up = s3.create_multipart_upload(Bucket=b, Key="open/upload")["UploadId"]
s3.upload_part(Bucket=b, Key="open/upload", UploadId=up, PartNumber=1, Body=b"x" * 1000)
out["uploads"] = [u["Key"] for u in s3.list_multipart_uploads(Bucket=b).get("Uploads", [])]
out["parts"] = [(p["PartNumber"], p["Size"]) for p in s3.list_parts(Bucket=b, Key="open/upload", UploadId=up)["Parts"]]
s3.abort_multipart_upload(Bucket=b, Key="open/upload", UploadId=up)
out["uploads_after_abort"] = [u["Key"] for u in s3.list_multipart_uploads(Bucket=b).get("Uploads", [])]
try:
    s3.put_object(Bucket=b, Key="bad/md5", Body=b"hello", ContentMD5="XrY7u+Ae7tCTyyK7j1rNww==")
    out["bad_md5"] = "stored"
except ClientError as e:
    out["bad_md5"] = e.response["Error"]["Code"]
print(json.dumps(out))
"#;

#[test]
fn boto3_puts_uploads_multipart_and_deletes() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let small = test_bytes(70_000, 1);
    let big = test_bytes(20 << 20, 2);
    let small_path = write_file(env.dir.path(), "small.bin", &small);
    let big_path = write_file(env.dir.path(), "big.bin", &big);
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.admin), "id": key.id, "secret": key.secret,
        "small": small_path, "big": big_path,
    });
    let home = env.dir.path().join("boto3-home");
    let out = boto3_output(&home, BOTO3_WRITES, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");

    assert_eq!(out["put_etag"], out["put_md5"], "PutObject answers the content's MD5 as its ETag");
    assert_eq!(out["big_head"], big.len());
    assert_eq!(out["deleted"], serde_json::json!(["del/absent", "del/two"]), "S3 reports an absent key deleted");
    assert_eq!(out["quiet_deleted"], serde_json::json!([]), "Quiet reports only failures");
    assert_eq!(out["uploads"], serde_json::json!(["open/upload"]));
    assert_eq!(out["parts"], serde_json::json!([[1, 1000]]));
    assert_eq!(out["uploads_after_abort"], serde_json::json!([]));
    assert_eq!(out["bad_md5"], "BadDigest");

    let read = s3_key(&env, "bkt", &[]);
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/odd/a%20b%2Bc%25d%20%C3%A9.txt")), sha256_hex(&small));
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/big/twenty.bin")), sha256_hex(&big));
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["big/twenty.bin", "odd/a b+c%d é.txt"], "deleted, aborted and refused keys are gone");
    assert_eq!(blob_files(&env).len(), 2, "one blob per object, nothing else");
}

#[test]
fn aws_cli_copies_up_and_syncs_both_ways() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = format!("http://{}", server.admin);
    let data = format!("http://{}", server.data);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);

    // Above the 8 MiB multipart threshold: a multipart upload with the default part size.
    let big = test_bytes(20 << 20, 3);
    let big_path = write_file(env.dir.path(), "big.bin", &big);
    aws(&home, &admin, &["s3", "cp", big_path.to_str().unwrap(), "s3://bkt/up/big.bin"]);
    let down = env.dir.path().join("big-down.bin");
    aws(&home, &data, &["s3", "cp", "s3://bkt/up/big.bin", down.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&down).unwrap()), sha256_hex(&big));

    let local = env.dir.path().join("tree");
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.txt", test_bytes(10, 4)),
        ("dir/b c.bin", test_bytes(300_000, 5)),
        ("dir/sub/é.bin", test_bytes(9, 6)),
    ];
    // LastModified has whole seconds, and `aws s3 sync` uploads again a file whose mtime is later than it: a file
    // written in the same second as its upload would be copied once more. Written two seconds ago, it is not.
    let written = std::time::SystemTime::now() - std::time::Duration::from_secs(2);
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
        std::fs::File::options().write(true).open(local.join(name)).unwrap().set_modified(written).unwrap();
    }
    let first = aws(&home, &admin, &["s3", "sync", local.to_str().unwrap(), "s3://bkt/tree/"]);
    assert_eq!(first.matches("upload:").count(), files.len(), "{first}");
    let second = aws(&home, &admin, &["s3", "sync", local.to_str().unwrap(), "s3://bkt/tree/"]);
    assert!(!second.contains("upload:"), "the second sync copies nothing: {second}");

    let back = env.dir.path().join("back");
    let first = aws(&home, &data, &["s3", "sync", "s3://bkt/tree/", back.to_str().unwrap()]);
    assert_eq!(first.matches("download:").count(), files.len(), "{first}");
    for (name, bytes) in &files {
        assert_eq!(sha256_hex(&std::fs::read(back.join(name)).unwrap()), sha256_hex(bytes), "{name}");
    }
    let second = aws(&home, &data, &["s3", "sync", "s3://bkt/tree/", back.to_str().unwrap()]);
    assert!(!second.contains("download:"), "the second sync copies nothing: {second}");

    std::fs::remove_file(local.join("a.txt")).unwrap();
    let deleted = aws(&home, &admin, &["s3", "sync", "--delete", local.to_str().unwrap(), "s3://bkt/tree/"]);
    assert!(deleted.contains("delete: s3://bkt/tree/a.txt"), "{deleted}");
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["tree/dir/b c.bin", "tree/dir/sub/é.bin", "up/big.bin"]);
}

#[test]
fn rclone_copies_up_and_s3cmd_puts() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let home = env.dir.path().join("rclone-home");
    rclone_config(&home, &key, &server.admin.to_string(), "");
    let local = home.join("src");
    let files = [("one.bin", test_bytes(100_000, 7)), ("d/two words.txt", test_bytes(17, 8))];
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
    }
    rclone(&home, &["copy", local.to_str().unwrap(), "bg:bkt/rc"]);

    let s3cmd_home = env.dir.path().join("s3cmd-home");
    s3cmd_config(&s3cmd_home, &key, &server.admin.to_string());
    let put = test_bytes(250_000, 9);
    let put_path = write_file(env.dir.path(), "s3cmd.bin", &put);
    let out = s3cmd(&s3cmd_home, &["put", put_path.to_str().unwrap(), "s3://bkt/s3cmd/put.bin"]);
    assert!(out.status.success(), "s3cmd put: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("don't match"), "{}", String::from_utf8_lossy(&out.stderr));

    let read = s3_key(&env, "bkt", &[]);
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/rc/one.bin")), sha256_hex(&files[0].1));
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/rc/d/two%20words.txt")), sha256_hex(&files[1].1));
    assert_eq!(sha256_hex(&read_back(&server, &read, "/bkt/s3cmd/put.bin")), sha256_hex(&put));
}

/// Sends raw S3 writes with botocore's signer: aws-chunked bodies whose chunk signatures are computed here from
/// the AWS spec (never by blobgate), optionally spoiled, and plain requests. Prints `[status, code]` per case.
const RAW_WRITES: &str = r#"
import base64, hashlib, hmac, http.client, json, sys, zlib
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
spec = json.loads(sys.argv[1])
host = spec["host"]

class Seeded(S3SigV4Auth):
    """botocore's signer with the streaming x-amz-content-sha256 this case sends."""
    def __init__(self, creds, payload):
        super().__init__(creds, "s3", "us-east-1")
        self.fixed_payload = payload
    def payload(self, request):
        return self.fixed_payload or super().payload(request)

def hm(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()

def signing_key(secret, date):
    return hm(hm(hm(hm(("AWS4" + secret).encode(), date), "us-east-1"), "s3"), "aws4_request")

def send(method, path, headers, body, key=None, payload=None):
    k = key or spec["key"]
    req = AWSRequest(method=method, url="http://" + host + path, headers=headers, data=body)
    Seeded(Credentials(k["id"], k["secret"]), payload).add_auth(req)
    return req

def transmit(method, path, headers, body):
    conn = http.client.HTTPConnection(host)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    conn.putheader("Host", host)
    for name, value in headers.items():
        conn.putheader(name, value)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders()
    conn.send(body)
    r = conn.getresponse()
    text = r.read().decode("utf-8", "replace")
    code = text.split("<Code>")[1].split("</Code>")[0] if "<Code>" in text else ""
    return [r.status, code, dict((k.lower(), v) for k, v in r.getheaders()), text]

def signed_chunked(path, data, chunk, spoil=None, trailer=False, wrong_crc=False):
    payload = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD" + ("-TRAILER" if trailer else "")
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data))}
    if trailer:
        headers["x-amz-trailer"] = "x-amz-checksum-crc32"
    req = send("PUT", path, headers, b"", payload=payload)
    seed = req.headers["Authorization"].split("Signature=")[1]
    ts = req.headers["X-Amz-Date"]
    scope = ts[:8] + "/us-east-1/s3/aws4_request"
    skey = signing_key(spec["key"]["secret"], ts[:8])
    empty = hashlib.sha256(b"").hexdigest()
    prev, body = seed, b""
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    for n, piece in enumerate(pieces):
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", ts, scope, prev, empty, hashlib.sha256(piece).hexdigest()])
        sig = hmac.new(skey, sts.encode(), hashlib.sha256).hexdigest()
        if spoil == n:
            sig = ("0" if sig[0] != "0" else "1") + sig[1:]
        prev = sig
        body += b"%x;chunk-signature=%s\r\n" % (len(piece), sig.encode())
        if piece:
            body += piece + b"\r\n"
    if trailer:
        crc = zlib.crc32(data) ^ (1 if wrong_crc else 0)
        line = "x-amz-checksum-crc32:" + base64.b64encode(crc.to_bytes(4, "big")).decode()
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", ts, scope, prev, hashlib.sha256((line + "\n").encode()).hexdigest()])
        tsig = hmac.new(skey, sts.encode(), hashlib.sha256).hexdigest()
        body += (line + "\r\nx-amz-trailer-signature:" + tsig + "\r\n").encode()
    body += b"\r\n"
    return transmit("PUT", path, dict(req.headers.items()), body)

def unsigned_trailer(path, data, wrong_crc=False):
    headers = {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(data)),
               "x-amz-trailer": "x-amz-checksum-crc32"}
    req = send("PUT", path, headers, b"", payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
    crc = zlib.crc32(data) ^ (1 if wrong_crc else 0)
    body = b"%x\r\n" % len(data) + data + b"\r\n0\r\n"
    body += b"x-amz-checksum-crc32:" + base64.b64encode(crc.to_bytes(4, "big")) + b"\r\n\r\n"
    return transmit("PUT", path, dict(req.headers.items()), body)

def plain(method, path, body=b"", key=None, headers=None):
    req = send(method, path, dict(headers or {}), body, key=key)
    return transmit(method, path, dict(req.headers.items()), body)

data = bytes((i * 7 + 3) % 251 for i in range(200_000))
out = {}
out["signed_ok"] = signed_chunked("/bkt/ok/signed.bin", data, 65536)
out["signed_trailer_ok"] = signed_chunked("/bkt/ok/signed-trailer.bin", data, 65536, trailer=True)
out["unsigned_trailer_ok"] = unsigned_trailer("/bkt/ok/unsigned-trailer.bin", data)
out["bad_chunk_signature"] = signed_chunked("/bkt/bad/chunk-sig.bin", data, 65536, spoil=2)
out["bad_final_signature"] = signed_chunked("/bkt/bad/final-sig.bin", data, 65536, spoil=4)
out["wrong_trailer_crc"] = unsigned_trailer("/bkt/bad/trailer-crc.bin", data, wrong_crc=True)
out["wrong_signed_trailer_crc"] = signed_chunked("/bkt/bad/strailer-crc.bin", data, 65536, trailer=True, wrong_crc=True)
# A short body: the decoded length promises more than the chunks bring.
req = send("PUT", "/bkt/bad/short.bin", {"Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": "10",
    "x-amz-trailer": "x-amz-checksum-crc32"}, b"", payload="STREAMING-UNSIGNED-PAYLOAD-TRAILER")
body = b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:" + base64.b64encode(zlib.crc32(b"hello").to_bytes(4, "big")) + b"\r\n\r\n"
out["short_body"] = transmit("PUT", "/bkt/bad/short.bin", dict(req.headers.items()), body)
# A plain body whose signed SHA-256 is not the body's.
req = send("PUT", "/bkt/bad/sha.bin", {}, b"the signed body")
out["sha_mismatch"] = transmit("PUT", "/bkt/bad/sha.bin", dict(req.headers.items()), b"another body!!!")
out["bad_checksum_header"] = plain("PUT", "/bkt/bad/crc-header.bin", b"abc",
    headers={"x-amz-checksum-crc32": base64.b64encode((zlib.crc32(b"abd")).to_bytes(4, "big")).decode()})
out["invalid_md5"] = plain("PUT", "/bkt/bad/md5.bin", b"abc", headers={"Content-MD5": "not base64!"})
out["read_key_put"] = plain("PUT", "/bkt/bad/read.bin", b"abc", key=spec["read"])
out["read_key_delete"] = plain("DELETE", "/bkt/ok/signed.bin", key=spec["read"])
out["read_key_create"] = plain("POST", "/bkt/bad/read-mp.bin?uploads", key=spec["read"])
out["wrong_bucket"] = plain("PUT", "/other/bad/x.bin", b"abc")
out["wrong_prefix"] = plain("PUT", "/bkt/outside/x.bin", b"abc", key=spec["prefixed"])
out["prefixed_ok"] = plain("PUT", "/bkt/ok/prefixed.bin", b"abc", key=spec["prefixed"])
# Multipart: two parts of 5 MiB and a last one; Complete with a part missing, then misordered, then right.
path = "/bkt/mp/obj.bin"
created = plain("POST", path + "?uploads")
assert created[0] == 200, (created, {k: v[:2] for k, v in out.items()})
upload_id = created[3].split("<UploadId>")[1].split("</UploadId>")[0]
part = bytes((i * 13) % 256 for i in range(5 << 20))
etags = []
for n in (1, 2, 3):
    body = part if n < 3 else b"tail"
    r = plain("PUT", "%s?partNumber=%d&uploadId=%s" % (path, n, upload_id), body)
    etags.append(r[2]["etag"])
def complete(parts):
    xml = "<CompleteMultipartUpload>" + "".join(
        "<Part><PartNumber>%d</PartNumber><ETag>%s</ETag></Part>" % (n, (etags + ['"00"'] * 9)[n - 1]) for n in parts) + \
        "</CompleteMultipartUpload>"
    return plain("POST", "%s?uploadId=%s" % (path, upload_id), xml.encode())
out["complete_missing"] = complete([1, 4])
out["complete_misordered"] = complete([2, 1, 3])
out["complete_small_part"] = complete([3, 1])
out["complete_wrong_etag"] = plain("POST", "%s?uploadId=%s" % (path, upload_id),
    b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>0123</ETag></Part></CompleteMultipartUpload>")
out["uploads_while_open"] = plain("GET", "/bkt?uploads")[0]
out["complete_ok"] = complete([1, 2, 3])
out["complete_etag"] = out["complete_ok"][3].split("<ETag>")[1].split("</ETag>")[0].replace("&quot;", '"')
out["expected_multipart_etag"] = '"%s-3"' % hashlib.md5(b"".join(
    bytes.fromhex(e.strip('"')) for e in etags)).hexdigest()
out["data_sha256"] = hashlib.sha256(data).hexdigest()
out["multipart_sha256"] = hashlib.sha256(part + part + b"tail").hexdigest()
for k in list(out):
    if isinstance(out[k], list) and len(out[k]) == 4:
        out[k] = out[k][:2]
print(json.dumps(out))
"#;

#[test]
fn bad_s3_writes_get_the_right_code_and_store_nothing() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.bucket("other", false);
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let read = s3_key(&env, "bkt", &[]);
    let prefixed = s3_key(&env, "bkt", &["--scope", "write", "--prefix", "ok/"]);
    let server = env.serve();
    let as_json = |k: &AccessKey| serde_json::json!({"id": k.id, "secret": k.secret});
    let spec = serde_json::json!({
        "host": server.admin.to_string(), "key": as_json(&write), "read": as_json(&read),
        "prefixed": as_json(&prefixed),
    });
    let home = env.dir.path().join("raw-home");
    let out = run_ok(&mut PythonScript::boto3(&home, RAW_WRITES, &[&spec.to_string()]));
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");
    let case = |name: &str| (out[name][0].as_u64().unwrap(), out[name][1].as_str().unwrap().to_owned());
    let want = |name: &str, status: u64, code: &str| assert_eq!(case(name), (status, code.to_owned()), "{name}");

    want("signed_ok", 200, "");
    want("signed_trailer_ok", 200, "");
    want("unsigned_trailer_ok", 200, "");
    want("prefixed_ok", 200, "");
    want("bad_chunk_signature", 403, "SignatureDoesNotMatch");
    want("bad_final_signature", 403, "SignatureDoesNotMatch");
    want("wrong_trailer_crc", 400, "BadDigest");
    want("wrong_signed_trailer_crc", 400, "BadDigest");
    want("short_body", 400, "IncompleteBody");
    want("sha_mismatch", 400, "XAmzContentSHA256Mismatch");
    want("bad_checksum_header", 400, "BadDigest");
    want("invalid_md5", 400, "InvalidDigest");
    want("read_key_put", 403, "AccessDenied");
    want("read_key_delete", 403, "AccessDenied");
    want("read_key_create", 403, "AccessDenied");
    want("wrong_bucket", 403, "AccessDenied");
    want("wrong_prefix", 403, "AccessDenied");
    want("complete_missing", 400, "InvalidPart");
    want("complete_misordered", 400, "InvalidPartOrder");
    want("complete_small_part", 400, "InvalidPartOrder");
    want("complete_wrong_etag", 400, "InvalidPart");
    assert_eq!(out["uploads_while_open"], 200);
    assert_eq!(out["complete_ok"][0], 200, "{}", out["complete_ok"]);

    let read_server = |path: &str| sha256_hex(&read_back(&server, &read, path));
    for path in ["/bkt/ok/signed.bin", "/bkt/ok/signed-trailer.bin", "/bkt/ok/unsigned-trailer.bin"] {
        assert_eq!(read_server(path), out["data_sha256"], "{path}");
    }
    assert_eq!(read_server("/bkt/mp/obj.bin"), out["multipart_sha256"]);
    assert_eq!(out["complete_etag"], out["expected_multipart_etag"], "Complete answers S3's multipart ETag");

    // Nothing refused was stored: only the accepted objects are listed, and the blob dir holds their blobs only.
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        keys,
        ["mp/obj.bin", "ok/prefixed.bin", "ok/signed-trailer.bin", "ok/signed.bin", "ok/unsigned-trailer.bin"]
    );
    assert!(listed(&env, "other").is_empty());
    assert_eq!(blob_files(&env).len(), 3, "one blob for the three equal uploads, one per other object");
    let tmp = env.data_dir().join("tmp");
    let left: Vec<_> = std::fs::read_dir(&tmp).map(|d| d.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    assert!(left.is_empty(), "no staged file is left behind: {left:?}");
}

#[test]
fn a_read_only_data_listener_refuses_writes_with_405_never_413() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    env.put_bytes("bkt", "keep.bin", b"kept", &[]);
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let token = env.token("bkt", "write", &[]);
    let server = env.serve_with(&[("BLOBGATE_LISTEN_READ_ONLY", "true")], &[]);
    let body = vec![7u8; 5 << 20];
    for (method, path) in
        [("PUT", "/bkt/k.bin"), ("POST", "/bkt/k.bin?uploads"), ("DELETE", "/bkt/keep.bin"), ("POST", "/bkt?delete")]
    {
        let headers = crate::helpers::s3::signed_headers(
            &write,
            path,
            &crate::helpers::s3::Signing { method, ..Default::default() },
        );
        let mut headers = crate::helpers::s3::as_refs(&headers);
        let length = body.len().to_string();
        if method == "PUT" {
            headers.push(("Content-Length", &length));
        }
        let r = server.request(method, path, &headers);
        assert_eq!(r.status, 405, "{method} {path}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(crate::helpers::s3::s3_code(&r), "MethodNotAllowed", "{method} {path}");
    }
    // Native writes: JSON 405, before the 5 MiB body is read.
    let auth = format!("Bearer {token}");
    let length = body.len().to_string();
    let r = server.request("PUT", "/bkt/n.bin", &[("Authorization", &auth), ("Content-Length", &length)]);
    assert_json_error(&r, 405, "method_not_allowed");
    let r = server.request("DELETE", "/bkt/keep.bin", &[("Authorization", &auth)]);
    assert_json_error(&r, 405, "method_not_allowed");
    // Reads are served; the admin listener still takes the writes.
    assert_eq!(server.get("/bkt/keep.bin", &[("Authorization", &auth)]).body, b"kept");
    assert_eq!(server.put("/bkt/n.bin", &token, b"native", &[]).status, 201);
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["keep.bin", "n.bin"]);
}

/// The ETag S3 requests see, object by object: what PutObject answered (an MD5), a multipart upload's
/// `"<md5 of md5s>-N"`, and for `blobgate put` and the native `PUT` their MD5 too. HEAD, GET (data and admin
/// listener), both list versions and the preconditions all use it; a stale one gets 412.
const BOTO3_ETAGS: &str = r#"
admin, data = client(spec["admin"], spec), client(spec["data"], spec)
b = "bkt"
def code(call):
    try:
        call()
        return "served"
    except ClientError as e:
        return e.response["Error"]["Code"]
out = {"put": {}, "seen": {}}
small = open(spec["small"], "rb").read()
out["put"]["put/small.bin"] = admin.put_object(Bucket=b, Key="put/small.bin", Body=small)["ETag"]
admin.upload_file(spec["big"], b, "mp/big.bin",
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=3))
big = open(spec["big"], "rb").read()
chunks = [big[i:i + (5 << 20)] for i in range(0, len(big), 5 << 20)]
md5s = b"".join(hashlib.md5(c).digest() for c in chunks)
out["put"]["mp/big.bin"] = '"%s-%d"' % (hashlib.md5(md5s).hexdigest(), len(chunks))
v2 = {o["Key"]: o["ETag"] for o in data.list_objects_v2(Bucket=b)["Contents"]}
v1 = {o["Key"]: o["ETag"] for o in data.list_objects(Bucket=b)["Contents"]}
for key in spec["keys"]:
    head = data.head_object(Bucket=b, Key=key)["ETag"]
    got = data.get_object(Bucket=b, Key=key)
    body = got["Body"].read()
    ranged = data.get_object(Bucket=b, Key=key, Range="bytes=0-9", IfMatch=head)
    out["seen"][key] = {"head": head, "get": got["ETag"], "admin_head": admin.head_object(Bucket=b, Key=key)["ETag"],
        "v2": v2[key], "v1": v1[key], "md5": '"%s"' % hashlib.md5(body).hexdigest(),
        "if_match": ranged["ResponseMetadata"]["HTTPStatusCode"], "ranged_etag": ranged["ETag"],
        "if_none_match": code(lambda: data.get_object(Bucket=b, Key=key, IfNoneMatch=head))}
# The object changes after the HEAD that gave its ETag: s3transfer's ranged GETs must not mix the two.
stale = data.head_object(Bucket=b, Key="put/small.bin")["ETag"]
out["replaced"] = admin.put_object(Bucket=b, Key="put/small.bin", Body=b"new content")["ETag"]
out["stale"] = code(lambda: data.get_object(Bucket=b, Key="put/small.bin", Range="bytes=0-3", IfMatch=stale))
out["after"] = data.head_object(Bucket=b, Key="put/small.bin")["ETag"]
print(json.dumps(out))
"#;

pub fn quoted_md5(bytes: &[u8]) -> String {
    use md5::Digest;
    format!("\"{}\"", hex::encode(md5::Md5::digest(bytes)))
}

both_backends!(s3_etags_agree_for_put_multipart_and_native_uploads, |env| s3_etags_agree_on(env));

fn s3_etags_agree_on(env: TestEnv) {
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let cli_bytes = test_bytes(30_000, 21);
    let cli_put = env.put_bytes("bkt", "cli/put.bin", &cli_bytes, &[]);
    let script = b"function f() { return 'precompressed'; }\n".repeat(200);
    env.put_bytes("bkt", "text/app.js", &script, &["--precompress"]);
    let server = env.serve();
    let token = env.token("bkt", "write", &[]);
    let native_bytes = test_bytes(40_000, 22);
    let native = server.put("/bkt/native/put.bin", &token, &native_bytes, &[]);
    assert_eq!(native.status, 201);
    let small = test_bytes(70_000, 23);
    let big = test_bytes(12 << 20, 24);
    let spec = serde_json::json!({
        "admin": format!("http://{}", server.admin), "data": format!("http://{}", server.data),
        "id": key.id, "secret": key.secret,
        "small": write_file(env.dir.path(), "small.bin", &small), "big": write_file(env.dir.path(), "big.bin", &big),
        "keys": ["cli/put.bin", "mp/big.bin", "native/put.bin", "put/small.bin", "text/app.js"],
    });
    let home = env.dir.path().join("boto3-home");
    let out = boto3_output(&home, BOTO3_ETAGS, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");

    let multipart = out["put"]["mp/big.bin"].as_str().unwrap().to_owned();
    assert!(multipart.ends_with("-3\""), "{multipart}");
    let want = [
        ("cli/put.bin", quoted_md5(&cli_bytes)),
        ("mp/big.bin", multipart),
        ("native/put.bin", quoted_md5(&native_bytes)),
        ("put/small.bin", out["put"]["put/small.bin"].as_str().unwrap().to_owned()),
        ("text/app.js", quoted_md5(&script)),
    ];
    assert_eq!(want[3].1, quoted_md5(&small), "PutObject answered the MD5");
    for (name, etag) in &want {
        let seen = &out["seen"][name];
        for view in ["head", "get", "admin_head", "v2", "v1", "ranged_etag"] {
            assert_eq!(seen[view], etag.as_str(), "{name}: {view} in {seen}");
        }
        assert_eq!(seen["if_match"], 206, "{name}: If-Match with the S3 ETag");
        assert_eq!(seen["if_none_match"], "304", "{name}: If-None-Match with the S3 ETag");
        if !etag.contains('-') {
            assert_eq!(seen["md5"], etag.as_str(), "{name}: a single upload's S3 ETag is the MD5 of what GET sends");
        }
    }
    assert_eq!(out["stale"], "PreconditionFailed", "a stale ETag gets 412");
    assert_eq!(out["after"], out["replaced"], "the replaced object has its new PutObject ETag");
    assert_eq!(out["replaced"], quoted_md5(b"new content"));

    // Native requests keep the native strong ETag (the SHA-256) and negotiate variants; S3 requests get the
    // stored bytes only, under the S3 ETag, whatever Accept-Encoding says.
    let r = server.get_auth("/bkt/cli/put.bin", &token, &[]);
    assert_eq!(r.header("etag"), Some(cli_put["etag"].as_str().unwrap()));
    assert_eq!(r.header("etag"), Some(format!("\"{}\"", sha256_hex(&cli_bytes)).as_str()));
    let r = server.get_auth("/bkt/text/app.js", &token, &[("Accept-Encoding", "br")]);
    assert_eq!(r.header("content-encoding"), Some("br"));
    let read = s3_key(&env, "bkt", &[]);
    let signing =
        crate::helpers::s3::Signing { method: "GET", headers: &[("Accept-Encoding", "br")], ..Default::default() };
    let headers = crate::helpers::s3::signed_headers(&read, "/bkt/text/app.js", &signing);
    let r = server.get("/bkt/text/app.js", &crate::helpers::s3::as_refs(&headers));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-encoding"), None);
    assert_eq!(r.header("vary"), None, "S3 answers do not vary with Accept-Encoding");
    assert_eq!(r.header("etag"), Some(quoted_md5(&script).as_str()));
    assert_eq!(sha256_hex(&r.body), sha256_hex(&script));
}

/// An upload left open (a client that died): `serve` aborts it past `timeouts.multipart_upload_expiry`.
const BOTO3_ABANDONS: &str = r#"
import time
s3 = client(spec["endpoint"], spec)
up = s3.create_multipart_upload(Bucket="bkt", Key="left/open")["UploadId"]
s3.upload_part(Bucket="bkt", Key="left/open", UploadId=up, PartNumber=1, Body=b"x" * 6000)
s3.upload_part(Bucket="bkt", Key="left/open", UploadId=up, PartNumber=2, Body=b"y" * 10)
out = {"parts_before": len(s3.list_parts(Bucket="bkt", Key="left/open", UploadId=up)["Parts"])}
start = time.time()
while time.time() - start < 20:
    try:
        s3.list_parts(Bucket="bkt", Key="left/open", UploadId=up)
        time.sleep(0.2)
    except ClientError as e:
        out["code"] = e.response["Error"]["Code"]
        break
out["uploads"] = [u["Key"] for u in s3.list_multipart_uploads(Bucket="bkt").get("Uploads", [])]
print(json.dumps(out))
"#;

both_backends!(serve_aborts_multipart_uploads_past_their_expiry, |env| abandoned_uploads_expire_on(env));

fn abandoned_uploads_expire_on(env: TestEnv) {
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve_with(&[("BLOBGATE_TIMEOUTS__MULTIPART_UPLOAD_EXPIRY", "2s")], &[]);
    let spec = serde_json::json!({"endpoint": format!("http://{}", server.admin), "id": key.id, "secret": key.secret});
    let home = env.dir.path().join("boto3-home");
    let out = boto3_output(&home, BOTO3_ABANDONS, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");
    assert_eq!(out["parts_before"], 2);
    assert_eq!(out["code"], "NoSuchUpload", "the upload was aborted: {out}");
    assert_eq!(out["uploads"], serde_json::json!([]));
    assert!(wait_for(Duration::from_secs(30), || files_under(&env.data_dir().join("parts")).is_empty()), "parts gone");
    assert_eq!(server.metric("blobgate_multipart_uploads_expired_total"), 1.0);
    assert!(listed(&env, "bkt").is_empty(), "nothing became visible");
}

#[test]
fn a_zero_multipart_upload_expiry_is_refused_naming_the_key() {
    let env = TestEnv::new();
    let out = env.cli_env(&["bucket", "list"], &[("BLOBGATE_TIMEOUTS__MULTIPART_UPLOAD_EXPIRY", "0s")]);
    let err = one_line_error(&out, &["BLOBGATE_TIMEOUTS__MULTIPART_UPLOAD_EXPIRY=0s"]);
    assert!(err.contains("timeouts.multipart_upload_expiry"), "{err}");
}

/// ListMultipartUploads with boto3: several uploads per key, odd keys, pagination by both markers, a delimiter
/// (common prefixes count toward `max-uploads`), a prefix, and `encoding-type=url`.
const BOTO3_LISTS_UPLOADS: &str = r#"
s3 = client(spec["endpoint"], spec)
b = "bkt"
created = [[k, s3.create_multipart_upload(Bucket=b, Key=k)["UploadId"]] for k in spec["keys"]]
def entries(r):
    return ([[u["Key"], u["UploadId"]] for u in r.get("Uploads", [])], [p["Prefix"] for p in r.get("CommonPrefixes", [])])
out = {"created": created, "all": entries(s3.list_multipart_uploads(Bucket=b))[0]}
pages = list(s3.get_paginator("list_multipart_uploads").paginate(Bucket=b, PaginationConfig={"PageSize": 2}))
out["paged"] = [u for p in pages for u in entries(p)[0]]
out["page_sizes"] = [len(p.get("Uploads", [])) for p in pages]
r = s3.list_multipart_uploads(Bucket=b, MaxUploads=1)
out["first"] = {"uploads": entries(r)[0], "truncated": r["IsTruncated"], "next": [r["NextKeyMarker"], r["NextUploadIdMarker"]]}
r = s3.list_multipart_uploads(Bucket=b, KeyMarker=r["NextKeyMarker"], UploadIdMarker=r["NextUploadIdMarker"], MaxUploads=1)
out["second"] = entries(r)[0]
out["after_key"] = entries(s3.list_multipart_uploads(Bucket=b, KeyMarker="a/one"))[0]
out["delimited"] = entries(s3.list_multipart_uploads(Bucket=b, Delimiter="/"))
out["delimited_prefix"] = entries(s3.list_multipart_uploads(Bucket=b, Prefix="b c/", Delimiter="/"))
steps, marker = [], {}
while True:
    r = s3.list_multipart_uploads(Bucket=b, Delimiter="/", MaxUploads=1, **marker)
    steps.append(entries(r))
    if not r["IsTruncated"] or len(steps) > 20:
        break
    marker = {"KeyMarker": r["NextKeyMarker"]}
    if r.get("NextUploadIdMarker"):
        marker["UploadIdMarker"] = r["NextUploadIdMarker"]
out["delimited_steps"] = steps
r = s3.list_multipart_uploads(Bucket=b, Prefix="b c/é", EncodingType="url")
out["encoded"] = {"uploads": entries(r)[0], "prefix": r["Prefix"], "encoding": r.get("EncodingType")}
print(json.dumps(out))
"#;

#[test]
fn boto3_lists_multipart_uploads_with_markers_delimiter_and_odd_keys() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let odd = "b c/é+%.bin";
    let keys = ["top", "a/one", odd, "a/two", "a/one", "b c/x", "top"];
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.admin), "id": key.id, "secret": key.secret, "keys": keys,
    });
    let home = env.dir.path().join("boto3-home");
    let out = boto3_output(&home, BOTO3_LISTS_UPLOADS, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");

    // By key, then by age (upload ids sort by creation time).
    let mut created: Vec<(String, String)> = serde_json::from_value(out["created"].clone()).unwrap();
    created.sort();
    let all: Vec<(String, String)> = serde_json::from_value(out["all"].clone()).unwrap();
    assert_eq!(all, created, "every upload, by key and then age");
    let ids_of = |k: &str| all.iter().filter(|(key, _)| key == k).map(|(_, id)| id.clone()).collect::<Vec<_>>();
    let upload = |k: &str, i: usize| serde_json::json!([k, ids_of(k)[i]]);
    assert_eq!(ids_of("a/one").len(), 2);
    assert_eq!(out["paged"], out["all"], "pages of two, continued by both markers, list everything once");
    assert_eq!(out["page_sizes"], serde_json::json!([2, 2, 2, 1]));
    assert_eq!(out["first"]["uploads"], serde_json::json!([upload("a/one", 0)]));
    assert_eq!(out["first"]["truncated"], true);
    assert_eq!(out["first"]["next"], upload("a/one", 0));
    assert_eq!(out["second"], serde_json::json!([upload("a/one", 1)]), "the key's second upload, by upload-id-marker");
    assert_eq!(out["after_key"][0], upload("a/two", 0), "a key marker alone skips every upload of its key");
    assert_eq!(out["delimited"], serde_json::json!([[upload("top", 0), upload("top", 1)], ["a/", "b c/"]]));
    assert_eq!(out["delimited_prefix"], serde_json::json!([[upload("b c/x", 0), upload(odd, 0)], []]), "byte order");
    let steps = serde_json::json!([[[], ["a/"]], [[], ["b c/"]], [[upload("top", 0)], []], [[upload("top", 1)], []],]);
    assert_eq!(out["delimited_steps"], steps, "a common prefix counts as one entry and is continued past");
    assert_eq!(out["encoded"]["encoding"], "url");
    assert_eq!(out["encoded"]["prefix"], "b%20c/%C3%A9");
    assert_eq!(out["encoded"]["uploads"], serde_json::json!([["b%20c/%C3%A9%2B%25.bin", ids_of(odd)[0]]]));
}

/// One boto3 client whose only endpoint is the admin listener: it writes and reads on the same pooled keep-alive
/// connections (as boto3 does when pointed at one endpoint), and every GetObject body leaves by sendfile there.
const BOTO3_ADMIN_ONLY: &str = r#"
s3 = client(spec["endpoint"], spec)
b = "bkt"
sha = lambda data: hashlib.sha256(data).hexdigest()
out = {}
small = open(spec["small"], "rb").read()
s3.put_object(Bucket=b, Key="one/small.bin", Body=small)
out["small"] = sha(s3.get_object(Bucket=b, Key="one/small.bin")["Body"].read())
s3.upload_file(spec["twenty"], b, "one/twenty.bin",
    Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20, max_concurrency=4))
out["twenty"] = sha(s3.get_object(Bucket=b, Key="one/twenty.bin")["Body"].read())
out["twenty_range"] = sha(s3.get_object(Bucket=b, Key="one/twenty.bin", Range="bytes=1000-1999999")["Body"].read())
s3.upload_file(spec["forty"], b, "one/forty.bin",
    Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4))
s3.download_file(b, "one/forty.bin", spec["download_to"],
    Config=TransferConfig(multipart_threshold=8 << 20, multipart_chunksize=8 << 20, max_concurrency=4))
out["forty_head"] = s3.head_object(Bucket=b, Key="one/forty.bin")["ContentLength"]
out["listed"] = {o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket=b, Prefix="one/").get("Contents", [])}
print(json.dumps(out))
"#;

/// One endpoint for reads and writes: the admin listener, and the data listener (the public one).
#[test]
fn boto3_with_only_the_admin_endpoint_puts_uploads_gets_and_downloads() {
    boto3_with_one_endpoint(|server| server.admin);
}

#[test]
fn boto3_with_only_the_data_endpoint_puts_uploads_gets_and_downloads() {
    boto3_with_one_endpoint(|server| server.data);
}

fn boto3_with_one_endpoint(endpoint: fn(&Server) -> std::net::SocketAddr) {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let small = test_bytes(70_000, 11);
    let twenty = test_bytes(20 << 20, 12);
    let forty = test_bytes(40 << 20, 13);
    let download = env.dir.path().join("forty-down.bin");
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", endpoint(&server)), "id": key.id, "secret": key.secret,
        "small": write_file(env.dir.path(), "small.bin", &small),
        "twenty": write_file(env.dir.path(), "twenty.bin", &twenty),
        "forty": write_file(env.dir.path(), "forty.bin", &forty), "download_to": download,
    });
    let home = env.dir.path().join("boto3-home");
    let out = boto3_output(&home, BOTO3_ADMIN_ONLY, &spec);
    let out: serde_json::Value = serde_json::from_str(out.trim()).expect("the script prints JSON");

    assert_eq!(out["small"], sha256_hex(&small));
    assert_eq!(out["twenty"], sha256_hex(&twenty));
    assert_eq!(out["twenty_range"], sha256_hex(&twenty[1000..2_000_000]));
    assert_eq!(sha256_hex(&std::fs::read(&download).unwrap()), sha256_hex(&forty), "download_file, four threads");
    assert_eq!(out["forty_head"], forty.len());
    assert_eq!(
        out["listed"],
        serde_json::json!({"one/forty.bin": forty.len(), "one/small.bin": small.len(), "one/twenty.bin": twenty.len()})
    );
}

#[test]
fn aws_cli_with_only_the_admin_endpoint_copies_and_syncs_both_ways() {
    aws_cli_with_one_endpoint(|server| server.admin);
}

#[test]
fn aws_cli_with_only_the_data_endpoint_copies_and_syncs_both_ways() {
    aws_cli_with_one_endpoint(|server| server.data);
}

fn aws_cli_with_one_endpoint(endpoint: fn(&Server) -> std::net::SocketAddr) {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = format!("http://{}", endpoint(&server));
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);

    let big = test_bytes(20 << 20, 14);
    let big_path = write_file(env.dir.path(), "big.bin", &big);
    aws(&home, &admin, &["s3", "cp", big_path.to_str().unwrap(), "s3://bkt/up/big.bin"]);
    let down = env.dir.path().join("big-down.bin");
    aws(&home, &admin, &["s3", "cp", "s3://bkt/up/big.bin", down.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&down).unwrap()), sha256_hex(&big));

    let local = env.dir.path().join("tree");
    let files: Vec<(&str, Vec<u8>)> =
        vec![("a.txt", test_bytes(10, 15)), ("dir/b c.bin", test_bytes(9 << 20, 16)), ("dir/é.bin", test_bytes(9, 17))];
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
    }
    let up = aws(&home, &admin, &["s3", "sync", local.to_str().unwrap(), "s3://bkt/tree/"]);
    assert_eq!(up.matches("upload:").count(), files.len(), "{up}");
    let back = env.dir.path().join("back");
    let first = aws(&home, &admin, &["s3", "sync", "s3://bkt/tree/", back.to_str().unwrap()]);
    assert_eq!(first.matches("download:").count(), files.len(), "{first}");
    for (name, bytes) in &files {
        assert_eq!(sha256_hex(&std::fs::read(back.join(name)).unwrap()), sha256_hex(bytes), "{name}");
    }
    let second = aws(&home, &admin, &["s3", "sync", "s3://bkt/tree/", back.to_str().unwrap()]);
    assert!(!second.contains("download:"), "the second sync copies nothing: {second}");

    // sync --delete, mv, rm --recursive.
    std::fs::remove_file(local.join("a.txt")).unwrap();
    let deleted = aws(&home, &admin, &["s3", "sync", "--delete", local.to_str().unwrap(), "s3://bkt/tree/"]);
    assert!(deleted.contains("delete: s3://bkt/tree/a.txt"), "{deleted}");
    aws(&home, &admin, &["s3", "mv", "s3://bkt/up/big.bin", "s3://bkt/moved/big.bin"]);
    aws(&home, &admin, &["s3", "rm", "--recursive", "s3://bkt/tree/"]);
    let keys: Vec<String> = listed(&env, "bkt").into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["moved/big.bin"]);
    let moved = env.dir.path().join("moved.bin");
    aws(&home, &admin, &["s3", "cp", "s3://bkt/moved/big.bin", moved.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&moved).unwrap()), sha256_hex(&big));
    let (errors, series) = server.server_errors();
    assert!(series > 0 && errors == 0.0, "5xx responses: {errors}");
}
