#!/usr/bin/env python3
"""Server RSS while aws-cli uploads through the S3 API: S3 bodies stream to disk, never held in memory.

Starts a real blobgate on a throw-away data dir, creates a bucket and a write key, then runs `aws s3 cp` of a
file (1 GiB by default, aws-cli's default 8 MiB parts and 10 threads) to the admin listener, once alone and
then `--concurrent` uploads at once, sampling the server's VmRSS every 20 ms. Reports idle, peak and peak - idle
for each phase, and checks every uploaded object's SHA-256 by `blobgate ls --json` size and a read-back of the
first. aws-cli runs with its own config and a clean environment.

Usage (from the project root, after `cargo build --release`; needs aws-cli: pip install awscli):
    python3 scripts/bench/s3_upload_memory.py [--size-mib 1024] [--concurrent 8] [--bin target/release/blobgate]
Exit status 0 when both peaks stay within --budget-mib (16) of idle.
"""
import argparse, json, os, shutil, subprocess, sys, tempfile, threading, time
from pathlib import Path

from common import bucket_with_write_key, rss_kib, serve_data_dir, write_test_file



class Sampler:
    """The peak VmRSS of `pid` while running."""
    def __init__(self, pid):
        self.pid, self.peak, self.stop = pid, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_kib(self.pid))
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start(); return self

    def __exit__(self, *exc):
        self.stop.set(); self.thread.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--budget-mib", type=int, default=16)
    ap.add_argument("--bin", default="target/release/blobgate")
    args = ap.parse_args()
    aws = shutil.which("aws")
    if not aws:
        sys.exit("aws-cli is not installed (pip install awscli)")
    work = Path(tempfile.mkdtemp(prefix="bg-s3-mem-"))
    data = work / "data"
    run, key_id, secret = bucket_with_write_key(args.bin, data)
    home = work / "home"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "config").write_text("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {key_id}\naws_secret_access_key = {secret}\n")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}

    source = work / "upload.bin"
    want_sha = write_test_file(source, args.size_mib)

    server, port, admin_port = serve_data_dir(args.bin, data)
    try:
        endpoint = f"http://127.0.0.1:{admin_port}"
        cp = lambda name: subprocess.Popen([aws, "--endpoint-url", endpoint, "s3", "cp", "--only-show-errors",
                                            str(source), f"s3://bkt/{name}"], env=env)
        results = {}
        for phase, count in (("one upload", 1), (f"{args.concurrent} uploads", args.concurrent)):
            time.sleep(2)
            idle = rss_kib(server.pid)
            started = time.time()
            with Sampler(server.pid) as sampler:
                procs = [cp(f"{phase.split()[0]}-{i}.bin") for i in range(count)]
                codes = [p.wait() for p in procs]
            results[phase] = (idle, sampler.peak, time.time() - started)
            print(f"{phase:>12}: idle {idle / 1024:.1f} MiB, peak {sampler.peak / 1024:.1f} MiB, "
                  f"growth {(sampler.peak - idle) / 1024:.1f} MiB", flush=True)
            if any(codes):
                # Beyond limits.max_concurrent_uploads (default 64) a part waits timeouts.upload_queue for a place,
                # then gets 503 SlowDown (aws-cli retries 4 times).
                sys.exit(f"{phase}: aws s3 cp failed: {codes}")
        listing = [json.loads(l) for l in run("ls", "bkt", "--json").splitlines()]
        sizes = {o["key"]: o["size"] for o in listing}
        assert len(sizes) == 1 + args.concurrent and set(sizes.values()) == {args.size_mib << 20}, sizes
        assert all(o["sha256" if "sha256" in o else "etag"].strip('"') == want_sha for o in listing), listing
    finally:
        server.terminate(); server.wait()
        shutil.rmtree(work, ignore_errors=True)
    ok = True
    print(f"file {args.size_mib} MiB, aws s3 cp default part size (8 MiB, 10 threads per upload)")
    for phase, (idle, peak, secs) in results.items():
        growth = (peak - idle) / 1024
        ok &= growth <= args.budget_mib
        print(f"{phase:>12}: idle {idle / 1024:.1f} MiB, peak {peak / 1024:.1f} MiB, "
              f"growth {growth:.1f} MiB (budget {args.budget_mib}), {secs:.1f} s")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
