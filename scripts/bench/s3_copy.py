#!/usr/bin/env python3
"""What a server-side copy costs: CopyObject moves no bytes, so its time does not grow with the object.

Starts a real blobgate on a throw-away data dir with a 4 KiB and a large object (1 GiB by default), then, with
boto3 on the admin listener, interleaves `--rounds` rounds of: CopyObject of the small object, CopyObject of the
large one, and (for scale) UploadPartCopy of the large object's first 64 MiB, which does copy bytes (in the kernel,
copy_file_range) and hashes them. Reports the median of each and the ratio large/small CopyObject (about 1 when a
copy is a row write), and checks a copy of the large object byte for byte by SHA-256 through the data listener.

Usage (from the project root, after `cargo build --release`; needs boto3: pip install boto3):
    python3 scripts/bench/s3_copy.py [--size-mib 1024] [--rounds 15] [--bin target/release/blobgate]
"""
import argparse, hashlib, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

from common import bucket_with_write_key, serve_data_dir, write_test_file


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--bin", default="target/release/blobgate")
    args = ap.parse_args()
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        sys.exit("boto3 is not installed (pip install boto3)")
    work = Path(tempfile.mkdtemp(prefix="bg-s3-copy-"))
    data = work / "data"
    run, key_id, secret = bucket_with_write_key(args.bin, data)
    large = work / "large.bin"
    large_sha = write_test_file(large, args.size_mib)
    (work / "small.bin").write_bytes(os.urandom(4096))
    run("put", "bkt", "large.bin", str(large))
    run("put", "bkt", "small.bin", str(work / "small.bin"))
    large.unlink()

    server, port, admin_port = serve_data_dir(args.bin, data)
    try:
        client = lambda endpoint: boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id=key_id, aws_secret_access_key=secret,
            region_name="us-east-1", config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
        s3 = client(f"http://127.0.0.1:{admin_port}")
        part_bytes = min(64, args.size_mib) << 20
        upload = s3.create_multipart_upload(Bucket="bkt", Key="parts.bin")["UploadId"]
        times = {"CopyObject 4 KiB": [], f"CopyObject {args.size_mib} MiB": [],
                 f"UploadPartCopy {part_bytes >> 20} MiB": []}
        small_name, large_name, part_name = times
        timed = lambda name, call: (lambda t0: (call(), times[name].append(time.perf_counter() - t0)))(
            time.perf_counter())
        for i in range(args.rounds):
            timed(small_name, lambda: s3.copy_object(Bucket="bkt", Key=f"copy/small-{i}",
                                                     CopySource={"Bucket": "bkt", "Key": "small.bin"}))
            timed(large_name, lambda: s3.copy_object(Bucket="bkt", Key=f"copy/large-{i}",
                                                     CopySource={"Bucket": "bkt", "Key": "large.bin"}))
            timed(part_name, lambda: s3.upload_part_copy(
                Bucket="bkt", Key="parts.bin", UploadId=upload, PartNumber=1,
                CopySource={"Bucket": "bkt", "Key": "large.bin"}, CopySourceRange=f"bytes=0-{part_bytes - 1}"))
        s3.abort_multipart_upload(Bucket="bkt", Key="parts.bin", UploadId=upload)
        body = client(f"http://127.0.0.1:{port}").get_object(Bucket="bkt", Key="copy/large-0")["Body"]
        got = hashlib.sha256()
        for chunk in iter(lambda: body.read(1 << 20), b""):
            got.update(chunk)
        assert got.hexdigest() == large_sha, "the copy of the large object differs"
        blobs = sum(len(files) for _, _, files in os.walk(data / "blobs"))
    finally:
        server.terminate(); server.wait()
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: statistics.median(t) * 1000 for name, t in times.items()}
    for name, ms in medians.items():
        print(f"{name:>24}: median {ms:8.2f} ms over {args.rounds} interleaved rounds")
    print(f"CopyObject {args.size_mib} MiB / 4 KiB: {medians[large_name] / medians[small_name]:.2f}")
    print(f"blob files after {2 * args.rounds} copies: {blobs} (the two sources)")


if __name__ == "__main__":
    main()
