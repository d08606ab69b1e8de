#!/usr/bin/env python3
"""Signed S3 requests made by botocore's own signer, for the SigV4 verifier's tests (src/auth/sigv4/botocore_tests.rs).

Prints one JSON document: {"now": unix seconds, "region": ..., "cases": [...]}. Each case is a request exactly as
botocore would put it on the wire (method, raw path, raw query, headers with Host, body) with the secret that
signed it; for aws-chunked uploads also the SHA-256 of the object data, and which checksum trailer to expect.

Three sources, all botocore's code:
- a boto3 client whose requests are captured at `before-send` (nothing is sent), so serialisation, key encoding,
  checksums and aws-chunked bodies (STREAMING-UNSIGNED-PAYLOAD-TRAILER) are the SDK's;
- `generate_presigned_url` (S3SigV4QueryAuth);
- `S3SigV4Auth` / `S3SigV4QueryAuth` on hand-made `AWSRequest`s with extra x-amz headers and odd whitespace.
"""

import base64
import hashlib
import json
import sys
import time
from urllib.parse import urlsplit

import boto3

try:
    # botocore's optional CRT: CRC32C and CRC64NVME, and the CRT signer that aws-cli v2 uses. scripts/test
    # installs it into target/botocore-crt only (PYTHONPATH), so other boto3 users keep botocore's own signer.
    import awscrt  # noqa: F401
except ImportError:
    raise SystemExit("awscrt (botocore[crt]) is missing: scripts/test installs it with pip into target/botocore-crt")
import botocore.auth
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.crt.auth import CrtS3SigV4Auth, CrtS3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials

REGION = "us-east-1"
ENDPOINT = "https://127.0.0.1:8443"
HOST = "127.0.0.1:8443"

# Access keys and secrets with the characters that break naive code: '/', '+', '=' and '%' in secrets.
KEYS = [
    ("AKIAEXAMPLE0000001", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    ("BGK5XQ2PL7RJ", "a+b/c=d%e~f g"),
]

ODD_KEYS = [
    "plain.txt",
    "dir/sub/file name.bin",
    "100%real+plus~tilde",
    "space at end ",
    "unicode/é中文🙂.txt",
    "symbols/!$&'()*,;=:@[]",
    "a//double/slash",
    "encoded%2Fslash%20and%25",
    "query?like#hash",
]

# The verifier's clock: before any signature, so that even a 1-second presign is still valid at it.
NOW = int(time.time())
cases = []
CURRENT = {"impl": "python"}


def b64(data):
    return base64.b64encode(data).decode("ascii") if data is not None else None


class Captured(Exception):
    def __init__(self, request, body):
        super().__init__("captured")
        self.request = request
        self.body = body


def capture(request, **_):
    body = request.body
    if hasattr(body, "read"):
        body = body.read()
    if isinstance(body, str):
        body = body.encode("utf-8")
    raise Captured(request, body or None)


def wire_case(name, secret, method, url, headers, body=None, data=None, checksum=None):
    name = f"[{CURRENT['impl']}] {name}"
    parts = urlsplit(url)
    pairs = []
    for k, v in headers.items():
        k = k.decode() if isinstance(k, bytes) else k
        v = v.decode("latin-1") if isinstance(v, bytes) else v
        # urllib3 sends these itself; they are never signed.
        if k.lower() in ("transfer-encoding", "expect"):
            continue
        pairs.append([k, v])
    # urllib3 adds Host when botocore did not (its Python signer signs it from the URL).
    if not any(k.lower() == "host" for k, _ in pairs):
        pairs.insert(0, ["host", HOST])
    cases.append(
        {
            "name": name,
            "secret": secret,
            "method": method,
            "path": parts.path,
            "query": parts.query if parts.query else None,
            "headers": pairs,
            "body_b64": b64(body),
            "data_sha256": hashlib.sha256(data).hexdigest() if data is not None else None,
            "checksum": checksum,
        }
    )


def client_for(access_key, secret):
    session = boto3.session.Session(aws_access_key_id=access_key, aws_secret_access_key=secret, region_name=REGION)
    client = session.client(
        "s3", endpoint_url=ENDPOINT, config=Config(s3={"addressing_style": "path"}, signature_version="s3v4")
    )
    client.meta.events.register("before-send", capture)
    return client


def sdk_call(name, secret, call, data=None, checksum_header=None):
    try:
        call()
    except Captured as c:
        checksum = None
        if checksum_header:
            checksum = [checksum_header, None]
        wire_case(name, secret, c.request.method, c.request.url, c.request.headers, c.body, data, checksum)
        return
    raise SystemExit(f"botocore did not send {name}")


# Each client request twice: signed by botocore's Python signer and by the CRT's (aws-c-auth).
IMPLEMENTATIONS = {
    "python": (S3SigV4Auth, S3SigV4QueryAuth),
    "crt": (CrtS3SigV4Auth, CrtS3SigV4QueryAuth),
}

for (impl, (header_auth, query_auth)), (access_key, secret) in [(i, k) for i in IMPLEMENTATIONS.items() for k in KEYS]:
    botocore.auth.AUTH_TYPE_MAPS["s3v4"] = header_auth
    botocore.auth.AUTH_TYPE_MAPS["s3v4-query"] = query_auth
    s3 = client_for(access_key, secret)
    first_key = access_key == KEYS[0][0]
    CURRENT["impl"] = impl
    for key in ODD_KEYS:
        sdk_call(f"get_object {key!r}", secret, lambda: s3.get_object(Bucket="bkt", Key=key, Range="bytes=0-9"))
        sdk_call(f"head_object {key!r}", secret, lambda: s3.head_object(Bucket="bkt", Key=key, IfMatch='"abc"'))
        sdk_call(
            f"list_objects_v2 {key!r}",
            secret,
            lambda: s3.list_objects_v2(
                Bucket="bkt", Prefix=key, Delimiter="/", StartAfter=key + "+", MaxKeys=7, FetchOwner=True
            ),
        )
    sdk_call("list_objects v1", secret, lambda: s3.list_objects(Bucket="bkt", Marker="a b+c", Prefix="é"))
    sdk_call("list_buckets", secret, lambda: s3.list_buckets())
    sdk_call("get_bucket_location", secret, lambda: s3.get_bucket_location(Bucket="bkt"))
    sdk_call(
        "delete_objects",
        secret,
        lambda: s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": k} for k in ODD_KEYS]}),
    )
    sdk_call("create_multipart_upload", secret, lambda: s3.create_multipart_upload(Bucket="bkt", Key=ODD_KEYS[2]))
    sdk_call(
        "put_object with metadata",
        secret,
        lambda: s3.put_object(
            Bucket="bkt", Key="meta", Body=b"", Metadata={"Owner": "a  b", "x": "1"}, ContentType="text/plain"
        ),
        data=b"",
        checksum_header="x-amz-checksum-crc32",
    )
    # aws-chunked uploads: botocore's STREAMING-UNSIGNED-PAYLOAD-TRAILER with each checksum it computes itself.
    # CRC32C and CRC64NVME are computed by the AWS CRT (botocore[crt]), as aws-cli v2 does.
    # botocore sends 1 MiB chunks: the largest body has two data chunks (kept small: the JSON carries bodies).
    for size in [0, 1, 5000, 1024 * 1024 + 17]:
        for algorithm in ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]:
            large_ones = {("python", "CRC32"), ("crt", "CRC32C"), ("crt", "CRC64NVME")}
            if size > 5000 and (not first_key or (impl, algorithm) not in large_ones):
                continue
            data = bytes((i * 7 + size) % 251 for i in range(size))
            header = "x-amz-checksum-" + algorithm.lower()
            sdk_call(
                f"put_object aws-chunked {algorithm} {size}",
                secret,
                lambda: s3.put_object(Bucket="bkt", Key=ODD_KEYS[4], Body=data, ChecksumAlgorithm=algorithm),
                data=data,
                checksum_header=header,
            )
    data = b"part data " * 1000
    sdk_call(
        "upload_part aws-chunked",
        secret,
        lambda: s3.upload_part(Bucket="bkt", Key="k", UploadId="u+1/2", PartNumber=3, Body=data),
        data=data,
        checksum_header="x-amz-checksum-crc32",
    )

    # Presigned URLs (botocore's S3SigV4QueryAuth through the client).
    presigner = boto3.session.Session(
        aws_access_key_id=access_key, aws_secret_access_key=secret, region_name=REGION
    ).client("s3", endpoint_url=ENDPOINT, config=Config(s3={"addressing_style": "path"}, signature_version="s3v4"))
    for key in ODD_KEYS:
        for expires in [1, 3600, 604800]:
            url = presigner.generate_presigned_url(
                "get_object", Params={"Bucket": "bkt", "Key": key}, ExpiresIn=expires
            )
            wire_case(f"presigned get {key!r} {expires}", secret, "GET", url, {})
    url = presigner.generate_presigned_url(
        "get_object",
        Params={
            "Bucket": "bkt",
            "Key": "report.pdf",
            "ResponseContentType": "application/pdf",
            "ResponseContentDisposition": 'attachment; filename="r é.pdf"',
            "ResponseCacheControl": "no-cache",
        },
        ExpiresIn=600,
    )
    wire_case("presigned get with response overrides", secret, "GET", url, {})
    url = presigner.generate_presigned_url("put_object", Params={"Bucket": "bkt", "Key": "up load"}, ExpiresIn=60)
    wire_case("presigned put", secret, "PUT", url, {})

    # The signers on hand-made requests: extra x-amz headers, whitespace to trim and collapse, several query
    # parameters (some without values).
    credentials = Credentials(access_key, secret)
    for signer_name, signer in [
        ("header", header_auth(credentials, "s3", REGION)),
        ("query", query_auth(credentials, "s3", REGION, expires=900)),
    ]:
        request = AWSRequest(
            method="GET",
            url=f"{ENDPOINT}/bkt/dir/a%20b%2Bc~d",
            params={"versionId": "3/L4kqtJl+cWuY", "acl": "", "z": "last", "a b": "x y", "uploads": ""},
            headers={
                "x-amz-meta-note": "  spaced   out\tvalue  ",
                "x-amz-request-payer": "requester",
                "Range": "bytes=1-2",
                "X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD",
            },
        )
        signer.add_auth(request)
        prepared = request.prepare()
        wire_case(f"hand-made {signer_name}", secret, "GET", prepared.url, prepared.headers)

json.dump({"now": NOW, "region": REGION, "cases": cases}, sys.stdout)
