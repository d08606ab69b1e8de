//! S3 additional checksums (`x-amz-checksum-*`), stored and answered, driven by boto3 and aws-cli with awscrt
//! (CRC32C and CRC64NVME need it; `scripts/test` installs it into `target/botocore-crt`) in a fresh Python process
//! each: every algorithm on PutObject (echoed, then read back with `ChecksumMode=ENABLED`, which the SDK
//! validates itself), multipart uploads composite and full-object (the SDK's own combination checked against
//! ours), ListParts, GetObjectAttributes, and none without checksum mode or for a range.

use std::path::Path;
use std::process::Command;

use crate::helpers::s3::{AccessKey, aws_home, clean_command, python, run_ok, s3_key};
use crate::helpers::*;

/// `target/botocore-crt`, where `scripts/test` installs awscrt.
fn crt_path() -> String {
    let crt = concat!(env!("CARGO_MANIFEST_DIR"), "/target/botocore-crt");
    assert!(Path::new(crt).join("awscrt").is_dir(), "awscrt is missing from {crt}: scripts/test installs it");
    crt.to_owned()
}

/// A fresh `python3` with awscrt importable (the fork servers imported botocore without it).
fn python_with_crt(home: &Path) -> Command {
    let mut cmd = clean_command(python(), home);
    cmd.env("PYTHONPATH", crt_path());
    cmd
}

const PRELUDE: &str = r#"
import base64, hashlib, json, sys, zlib
import boto3
from awscrt import checksums as crt
from botocore.config import Config
spec = json.loads(sys.argv[1])
s3 = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["id"],
    aws_secret_access_key=spec["secret"], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
plain = boto3.client("s3", endpoint_url=spec["endpoint"], aws_access_key_id=spec["id"],
    aws_secret_access_key=spec["secret"], region_name="us-east-1",
    config=Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                  response_checksum_validation="when_required"))
WIDTH = {"CRC32": 4, "CRC32C": 4, "CRC64NVME": 8}
def digest(alg, data):
    if alg in WIDTH:
        f = {"CRC32": zlib.crc32, "CRC32C": crt.crc32c, "CRC64NVME": crt.crc64nvme}[alg]
        return f(data).to_bytes(WIDTH[alg], "big")
    return getattr(hashlib, alg.lower())(data).digest()
def b64(raw):
    return base64.b64encode(raw).decode()
def checksums(response):
    return {k: v for k, v in response.items() if k.startswith("Checksum")}
"#;

fn run_script(home: &Path, script: &str, spec: &serde_json::Value) -> serde_json::Value {
    let code = format!("{PRELUDE}{script}");
    let out = run_ok(python_with_crt(home).arg("-c").arg(code).arg(spec.to_string()));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("the script prints JSON ({e}): {out}"))
}

fn spec(server: &Server, key: &AccessKey, extra: serde_json::Value) -> serde_json::Value {
    let mut spec =
        serde_json::json!({"endpoint": format!("http://{}", server.admin), "id": key.id, "secret": key.secret});
    spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    spec
}

const SINGLE_PUTS: &str = r#"
data = open(spec["file"], "rb").read()
out = {}
for alg in ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]:
    key = "single/" + alg
    want = b64(digest(alg, data))
    put = s3.put_object(Bucket="bkt", Key=key, Body=data, ChecksumAlgorithm=alg)
    got = s3.get_object(Bucket="bkt", Key=key, ChecksumMode="ENABLED")
    body = got["Body"]
    read = body.read()
    head = s3.head_object(Bucket="bkt", Key=key, ChecksumMode="ENABLED")
    plain_head = s3.head_object(Bucket="bkt", Key=key)
    # boto3 asks for checksums on every GetObject unless told to only when required.
    plain_get = plain.get_object(Bucket="bkt", Key=key)
    plain_get["Body"].read()
    ranged = s3.get_object(Bucket="bkt", Key=key, Range="bytes=0-9", ChecksumMode="ENABLED")
    ranged["Body"].read()
    attrs = s3.get_object_attributes(Bucket="bkt", Key=key,
        ObjectAttributes=["ETag", "Checksum", "ObjectSize", "StorageClass"])
    out[alg] = {
        "want": want,
        "sha256": b64(hashlib.sha256(data).digest()),
        "put": put.get("Checksum" + alg), "put_type": put.get("ChecksumType"),
        "get": got.get("Checksum" + alg), "get_type": got.get("ChecksumType"),
        # botocore wraps the body to validate it when the response carries a checksum it can check.
        "validated_by_sdk": type(body).__name__ == "StreamingChecksumBody",
        "read_ok": read == data,
        "head": head.get("Checksum" + alg), "head_type": head.get("ChecksumType"),
        "head_sha256": head.get("ChecksumSHA256"),
        "plain_head": checksums(plain_head), "plain_get": checksums(plain_get), "ranged": checksums(ranged),
        "attrs": attrs.get("Checksum", {}), "attrs_etag": attrs.get("ETag"), "attrs_size": attrs.get("ObjectSize"),
        "put_etag": put["ETag"].strip('"'),
    }
print(json.dumps(out))
"#;

#[test]
fn boto3_puts_with_each_checksum_algorithm_and_reads_it_back_validated() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let data = test_bytes(300_000, 46);
    let file = write_file(env.dir.path(), "data.bin", &data);
    let out =
        run_script(&env.dir.path().join("home"), SINGLE_PUTS, &spec(&server, &key, serde_json::json!({"file": file})));
    for alg in ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"] {
        let o = &out[alg];
        assert_eq!(o["put"], o["want"], "{alg}: PutObject echoes the checksum: {o}");
        assert_eq!(o["put_type"], "FULL_OBJECT", "{alg}: {o}");
        assert_eq!(o["get"], o["want"], "{alg}: GetObject with checksum mode answers it: {o}");
        assert_eq!(o["get_type"], "FULL_OBJECT", "{alg}: {o}");
        assert_eq!(o["validated_by_sdk"], true, "{alg}: boto3 validated the body: {o}");
        assert_eq!(o["read_ok"], true, "{alg}");
        assert_eq!(o["head"], o["want"], "{alg}: {o}");
        assert_eq!(o["head_type"], "FULL_OBJECT", "{alg}: {o}");
        assert_eq!(o["head_sha256"], o["sha256"], "{alg}: a single PUT always has its SHA-256: {o}");
        assert_eq!(o["plain_head"], serde_json::json!({}), "{alg}: no checksum without checksum mode: {o}");
        assert_eq!(o["plain_get"], serde_json::json!({}), "{alg}: {o}");
        assert_eq!(o["ranged"], serde_json::json!({}), "{alg}: a range's bytes are not the object's: {o}");
        assert_eq!(o["attrs"][format!("Checksum{alg}")], o["want"], "{alg}: GetObjectAttributes: {o}");
        assert_eq!(o["attrs"]["ChecksumType"], "FULL_OBJECT", "{alg}: {o}");
        assert_eq!(o["attrs_etag"], o["put_etag"], "{alg}: {o}");
        assert_eq!(o["attrs_size"], data.len(), "{alg}: {o}");
    }
}

const MULTIPART: &str = r#"
data = open(spec["file"], "rb").read()
cuts = [0, 5 << 20, 10 << 20, len(data)]
chunks = [data[a:b] for a, b in zip(cuts, cuts[1:])]
out = {}
for alg, kind in [("CRC32", "COMPOSITE"), ("CRC32", "FULL_OBJECT"), ("CRC32C", "COMPOSITE"),
                  ("CRC32C", "FULL_OBJECT"), ("CRC64NVME", "FULL_OBJECT"), ("SHA1", "COMPOSITE"),
                  ("SHA256", "COMPOSITE")]:
    key = "multi/%s-%s" % (alg, kind)
    field = "Checksum" + alg
    created = s3.create_multipart_upload(Bucket="bkt", Key=key, ChecksumAlgorithm=alg, ChecksumType=kind)
    upload = created["UploadId"]
    parts, echoed = [], []
    for number, chunk in enumerate(chunks, 1):
        r = s3.upload_part(Bucket="bkt", Key=key, UploadId=upload, PartNumber=number, Body=chunk,
                           ChecksumAlgorithm=alg)
        echoed.append(r.get(field) == b64(digest(alg, chunk)))
        parts.append({"PartNumber": number, "ETag": r["ETag"], field: r.get(field)})
    listed = s3.list_parts(Bucket="bkt", Key=key, UploadId=upload)
    # What the SDK user computes: S3's composite rule over the part checksums botocore sent, or the whole CRC.
    if kind == "COMPOSITE":
        want = b64(digest(alg, b"".join(base64.b64decode(p[field]) for p in parts))) + "-%d" % len(parts)
        extra = {}
    else:
        want = b64(digest(alg, data))
        extra = {"ChecksumType": "FULL_OBJECT", field: want}
    done = s3.complete_multipart_upload(Bucket="bkt", Key=key, UploadId=upload,
                                        MultipartUpload={"Parts": parts}, **extra)
    head = s3.head_object(Bucket="bkt", Key=key, ChecksumMode="ENABLED")
    got = s3.get_object(Bucket="bkt", Key=key, ChecksumMode="ENABLED")
    body = got["Body"]
    read = body.read()
    attrs = s3.get_object_attributes(Bucket="bkt", Key=key, ObjectAttributes=["Checksum", "ObjectParts", "ObjectSize"])
    out[alg + "-" + kind] = {
        "want": want, "kind": kind,
        "created": [created.get("ChecksumAlgorithm"), created.get("ChecksumType")],
        "parts_echoed": all(echoed),
        "listed": [p.get(field) for p in listed["Parts"]] == [p[field] for p in parts],
        "listed_algorithm": listed.get("ChecksumAlgorithm"),
        "complete": done.get(field), "complete_type": done.get("ChecksumType"),
        "head": head.get(field), "head_type": head.get("ChecksumType"),
        "get": got.get(field), "read_ok": read == data,
        "validated_by_sdk": type(body).__name__ == "StreamingChecksumBody",
        "attrs": attrs.get("Checksum", {}).get(field), "attrs_type": attrs.get("Checksum", {}).get("ChecksumType"),
        "attrs_parts": attrs.get("ObjectParts", {}).get("TotalPartsCount"),
    }
print(json.dumps(out))
"#;

#[test]
fn boto3_multipart_checksums_are_what_the_sdk_computes_composite_and_full_object() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let data = test_bytes((10 << 20) + 12_345, 47);
    let file = write_file(env.dir.path(), "data.bin", &data);
    let out =
        run_script(&env.dir.path().join("home"), MULTIPART, &spec(&server, &key, serde_json::json!({"file": file})));
    let cases = out.as_object().unwrap();
    assert_eq!(cases.len(), 7);
    for (case, o) in cases {
        let (alg, kind) = case.split_once('-').unwrap();
        assert_eq!(o["created"], serde_json::json!([alg, kind]), "{case}: Create echoes algorithm and type: {o}");
        assert_eq!(o["parts_echoed"], true, "{case}: UploadPart echoes the part's checksum: {o}");
        assert_eq!(o["listed"], true, "{case}: ListParts shows the parts' checksums: {o}");
        assert_eq!(o["listed_algorithm"], alg, "{case}: {o}");
        assert_eq!(o["complete"], o["want"], "{case}: Complete answers the SDK's own value: {o}");
        assert_eq!(o["complete_type"], kind, "{case}: {o}");
        assert_eq!(o["head"], o["want"], "{case}: {o}");
        assert_eq!(o["head_type"], kind, "{case}: {o}");
        assert_eq!(o["get"], o["want"], "{case}: {o}");
        assert_eq!(o["read_ok"], true, "{case}");
        // botocore validates a full-object checksum, and skips a composite one (`…-N`).
        assert_eq!(o["validated_by_sdk"], kind == "FULL_OBJECT", "{case}: {o}");
        assert_eq!(o["attrs"], o["want"], "{case}: GetObjectAttributes: {o}");
        assert_eq!(o["attrs_type"], kind, "{case}: {o}");
        assert_eq!(o["attrs_parts"], 3, "{case}: {o}");
    }
}

/// `aws ARGS...` (aws-cli) in a fresh process with awscrt: its output.
fn aws_text(home: &Path, endpoint: &str, args: &[&str]) -> String {
    let aws = python().parent().unwrap().join("aws");
    run_ok(python_with_crt(home).arg(aws).args(["--endpoint-url", endpoint, "--output", "json"]).args(args))
}

/// The same, answering JSON.
fn aws_json(home: &Path, endpoint: &str, args: &[&str]) -> serde_json::Value {
    let out = aws_text(home, endpoint, args);
    if out.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_str(&out).expect("aws-cli prints JSON")
    }
}

#[test]
fn aws_cli_puts_with_each_checksum_algorithm_and_reads_it_back() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let server = env.serve();
    let endpoint = format!("http://{}", server.admin);
    let home = env.dir.path().join("aws-home");
    aws_home(&home, &key);
    let data = test_bytes(100_000, 48);
    let file = write_file(env.dir.path(), "data.bin", &data);
    let file = file.to_str().unwrap();
    for (alg, field) in [
        ("CRC32", "ChecksumCRC32"),
        ("CRC32C", "ChecksumCRC32C"),
        ("CRC64NVME", "ChecksumCRC64NVME"),
        ("SHA1", "ChecksumSHA1"),
        ("SHA256", "ChecksumSHA256"),
    ] {
        let object = format!("cli/{alg}");
        let put = aws_json(
            &home,
            &endpoint,
            &["s3api", "put-object", "--bucket", "bkt", "--key", &object, "--body", file, "--checksum-algorithm", alg],
        );
        let want = put[field].as_str().unwrap_or_else(|| panic!("{alg}: PutObject echoes {field}: {put}")).to_owned();
        let head = aws_json(
            &home,
            &endpoint,
            &["s3api", "head-object", "--bucket", "bkt", "--key", &object, "--checksum-mode", "ENABLED"],
        );
        assert_eq!(head[field], want.as_str(), "{alg}: {head}");
        assert_eq!(head["ChecksumType"], "FULL_OBJECT", "{alg}: {head}");
        let plain = aws_json(&home, &endpoint, &["s3api", "head-object", "--bucket", "bkt", "--key", &object]);
        assert!(plain.get(field).is_none(), "{alg}: no checksum without checksum mode: {plain}");
        let down = env.dir.path().join(format!("down-{alg}.bin"));
        let got = aws_json(
            &home,
            &endpoint,
            &[
                "s3api",
                "get-object",
                "--bucket",
                "bkt",
                "--key",
                &object,
                "--checksum-mode",
                "ENABLED",
                down.to_str().unwrap(),
            ],
        );
        assert_eq!(got[field], want.as_str(), "{alg}: {got}");
        assert_eq!(std::fs::read(&down).unwrap(), data, "{alg}");
        let attrs = aws_json(
            &home,
            &endpoint,
            &["s3api", "get-object-attributes", "--bucket", "bkt", "--key", &object, "--object-attributes", "Checksum"],
        );
        assert_eq!(attrs["Checksum"][field], want.as_str(), "{alg}: {attrs}");
    }
    // aws s3 cp of a file big enough for a multipart upload (8 MiB parts), with CRC32C.
    let big = test_bytes(20 << 20, 49);
    let big_file = write_file(env.dir.path(), "big.bin", &big);
    aws_text(
        &home,
        &endpoint,
        &["s3", "cp", big_file.to_str().unwrap(), "s3://bkt/cli/big.bin", "--checksum-algorithm", "CRC32C"],
    );
    let head = aws_json(
        &home,
        &endpoint,
        &["s3api", "head-object", "--bucket", "bkt", "--key", "cli/big.bin", "--checksum-mode", "ENABLED"],
    );
    assert!(head["ChecksumCRC32C"].is_string(), "the multipart upload's CRC32C is stored: {head}");
    assert!(head["ChecksumType"].is_string(), "{head}");
    let down = env.dir.path().join("big-down.bin");
    aws_text(&home, &endpoint, &["s3", "cp", "s3://bkt/cli/big.bin", down.to_str().unwrap()]);
    assert_eq!(sha256_hex(&std::fs::read(&down).unwrap()), sha256_hex(&big));
}

const NATIVE_AND_COPY: &str = r#"
out = {}
head = s3.head_object(Bucket="bkt", Key="native.bin", ChecksumMode="ENABLED")
out["native"] = checksums(head)
s3.put_object(Bucket="bkt", Key="src.bin", Body=b"copy me", ChecksumAlgorithm="CRC32C")
s3.copy_object(Bucket="bkt", Key="dst.bin", CopySource={"Bucket": "bkt", "Key": "src.bin"})
out["copy"] = checksums(s3.head_object(Bucket="bkt", Key="dst.bin", ChecksumMode="ENABLED"))
out["want_crc32c"] = b64(digest("CRC32C", b"copy me"))
print(json.dumps(out))
"#;

#[test]
fn a_native_put_answers_its_sha256_and_a_copy_keeps_its_source_checksum() {
    let env = TestEnv::new();
    env.bucket("bkt", false);
    let key = s3_key(&env, "bkt", &["--scope", "write"]);
    let bytes = test_bytes(5000, 50);
    let file = write_file(env.dir.path(), "native.bin", &bytes);
    env.ok(&["put", "bkt", "native.bin", file.to_str().unwrap()]);
    let server = env.serve();
    let out = run_script(&env.dir.path().join("home"), NATIVE_AND_COPY, &spec(&server, &key, serde_json::json!({})));
    let sha256 = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(hex::decode(sha256_hex(&bytes)).unwrap())
    };
    assert_eq!(out["native"], serde_json::json!({"ChecksumSHA256": sha256, "ChecksumType": "FULL_OBJECT"}));
    assert_eq!(out["copy"]["ChecksumCRC32C"], out["want_crc32c"], "{out}");
    assert_eq!(out["copy"]["ChecksumType"], "FULL_OBJECT", "{out}");
}
