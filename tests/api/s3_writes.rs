//! S3 writes on the admin listener, driven by real clients (boto3, aws-cli, rclone, s3cmd) with their own config
//! and a clean environment, every byte checked with SHA-256 by reading it back from the data listener. Bad input
//! (a bad chunk signature, a wrong trailing checksum, a Complete with missing or misordered parts, a read key
//! writing, the wrong bucket or prefix) gets the right S3 code and stores nothing (`blobgate ls` and the blob
//! dir). Requests are signed by botocore; chunk signatures are computed by the Python helper from the AWS spec,
//! never by our code.

use std::path::Path;

use crate::helpers::*;
use crate::s3_clients::{AccessKey, aws, aws_home, clean_command, python, rclone, run_ok, s3_key, s3cmd, sha256_hex};

/// The keys `blobgate ls BUCKET` lists, with their sizes.
fn listed(env: &TestEnv, bucket: &str) -> Vec<(String, u64)> {
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
fn read_back(server: &Server, key: &AccessKey, path: &str) -> Vec<u8> {
    let headers = crate::s3_clients::signed_headers(
        key,
        path,
        &crate::s3_clients::Signing { method: "GET", ..Default::default() },
    );
    let r = server.get(path, &crate::s3_clients::as_refs(&headers));
    assert_eq!(r.status, 200, "GET {path}: {}", String::from_utf8_lossy(&r.body));
    r.body
}

const BOTO3_WRITES: &str = r#"
import hashlib, json, sys
import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError
spec = json.loads(sys.argv[1])
s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["id"],
    aws_secret_access_key=spec["secret"], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
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
    let out = run_ok(clean_command(python(), &home).args(["-c", BOTO3_WRITES, &spec.to_string()]));
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
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
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
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("rclone.conf"),
        format!(
            "[bg]\ntype = s3\nprovider = Other\naccess_key_id = {}\nsecret_access_key = {}\nendpoint = http://{}\n\
             region = us-east-1\nforce_path_style = true\n",
            key.id, key.secret, server.admin
        ),
    )
    .unwrap();
    let local = home.join("src");
    let files = [("one.bin", test_bytes(100_000, 7)), ("d/two words.txt", test_bytes(17, 8))];
    for (name, bytes) in &files {
        std::fs::create_dir_all(local.join(name).parent().unwrap()).unwrap();
        std::fs::write(local.join(name), bytes).unwrap();
    }
    rclone(&home, &["copy", local.to_str().unwrap(), "bg:bkt/rc"]);

    let s3cmd_home = env.dir.path().join("s3cmd-home");
    std::fs::create_dir_all(&s3cmd_home).unwrap();
    std::fs::write(
        s3cmd_home.join(".s3cfg"),
        format!(
            "[default]\naccess_key = {}\nsecret_key = {}\nhost_base = {addr}\nhost_bucket = {addr}\nuse_https = False\n\
             signature_v2 = False\nbucket_location = us-east-1\ncheck_ssl_certificate = False\n",
            key.id,
            key.secret,
            addr = server.admin
        ),
    )
    .unwrap();
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
    let out = run_ok(clean_command(python(), &home).args(["-c", RAW_WRITES, &spec.to_string()]));
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
fn the_data_listener_refuses_s3_writes_in_xml() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let write = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    for method in ["PUT", "POST", "DELETE"] {
        let headers = crate::s3_clients::signed_headers(
            &write,
            "/bkt/k.bin",
            &crate::s3_clients::Signing { method, ..Default::default() },
        );
        let r = server.request(method, "/bkt/k.bin", &crate::s3_clients::as_refs(&headers));
        assert_eq!(r.status, 405, "{method}");
        assert_eq!(crate::s3_clients::s3_code(&r), "MethodNotAllowed", "{method}");
    }
    assert!(listed(&env, "bkt").is_empty());
}

/// One boto3 client whose only endpoint is the admin listener: it writes and reads on the same pooled keep-alive
/// connections (as boto3 does when pointed at one endpoint), and every GetObject body leaves by sendfile there.
const BOTO3_ADMIN_ONLY: &str = r#"
import hashlib, json, sys
import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
spec = json.loads(sys.argv[1])
s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["id"],
    aws_secret_access_key=spec["secret"], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
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

#[test]
fn boto3_with_only_the_admin_endpoint_puts_uploads_gets_and_downloads() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let small = test_bytes(70_000, 11);
    let twenty = test_bytes(20 << 20, 12);
    let forty = test_bytes(40 << 20, 13);
    let download = env.dir.path().join("forty-down.bin");
    let spec = serde_json::json!({
        "endpoint": format!("http://{}", server.admin), "id": key.id, "secret": key.secret,
        "small": write_file(env.dir.path(), "small.bin", &small),
        "twenty": write_file(env.dir.path(), "twenty.bin", &twenty),
        "forty": write_file(env.dir.path(), "forty.bin", &forty), "download_to": download,
    });
    let home = env.dir.path().join("boto3-home");
    let out = run_ok(clean_command(python(), &home).args(["-c", BOTO3_ADMIN_ONLY, &spec.to_string()]));
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
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let admin = format!("http://{}", server.admin);
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
}
