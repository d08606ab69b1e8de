#!/usr/bin/env python3
"""Downloads beside uploads on the one public listener: 4 KiB bearer-token GETs (wrk, 64 connections, as
compare.py's `small` case) alone, and while `--uploads` clients (curl, native PUT with a write token) upload
`--size-mib` files to the same data listener for the whole measurement, restarting as each finishes.

The two cases are interleaved over `--rounds` on one server, so the ratio (beside / alone) is measured side by
side. Every upload must end 201 and every GET 200; the stored uploads are checked by size.

Usage (from the project root, after `cargo build --release`; needs wrk and curl):
    python3 scripts/bench/uploads_beside_downloads.py [--rounds 5] [--secs 5] [--uploads 8] [--size-mib 1024]
"""
import argparse, json, shutil, statistics, subprocess, sys, tempfile, threading, time
from pathlib import Path

import common


class Uploaders:
    """`n` curl clients uploading `source` again and again until stopped; counts finished uploads and failures."""

    def __init__(self, n, source, port, token):
        self.n, self.source, self.port, self.token = n, source, port, token
        self.stop, self.done, self.failed, self.lock = threading.Event(), 0, [], threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(n)]

    def run(self, i):
        round_ = 0
        while not self.stop.is_set():
            url = f"http://127.0.0.1:{self.port}/bkt/up/{i}-{round_}.bin"
            r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-T", str(self.source),
                                "-H", f"Authorization: Bearer {self.token}", url], capture_output=True, text=True)
            with self.lock:
                if r.stdout == "201":
                    self.done += 1
                elif not self.stop.is_set():
                    self.failed.append(r.stdout or r.stderr)
            round_ += 1

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--uploads", type=int, default=8)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--bin", default=None)
    args = ap.parse_args()
    for tool in ("wrk", "curl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is not installed (apt install {tool})")
    binary = common.binary(args.bin)
    work = Path(tempfile.mkdtemp(prefix="bg-up-down-"))
    data = work / "data"
    run, _, _ = common.bucket_with_write_key(binary, data)
    small = work / "small.bin"
    small.write_bytes(bytes(i % 251 for i in range(4096)))
    run("put", "bkt", "small.bin", str(small))
    read = run("token", "create", "--bucket", "bkt", "--scope", "read").strip()
    write = run("token", "create", "--bucket", "bkt", "--scope", "write").strip()
    source = work / "upload.bin"
    common.write_test_file(source, args.size_mib)
    server, port, _ = common.serve_data_dir(binary, data)
    url = f"http://127.0.0.1:{port}/bkt/small.bin"
    headers = {"Authorization": f"Bearer {read}"}
    alone, beside, uploaded, failures = [], [], 0, []
    try:
        common.wrk(url, 2, headers)  # warm-up
        for r in range(args.rounds):
            rps, errors, _ = common.wrk(url, args.secs, headers)
            if errors:
                raise SystemExit(f"round {r}: {errors} non-2xx responses alone")
            alone.append(rps)
            with Uploaders(args.uploads, source, port, write) as up:
                time.sleep(1)  # every uploader has started its body
                rps, errors, _ = common.wrk(url, args.secs, headers)
            if errors:
                raise SystemExit(f"round {r}: {errors} non-2xx responses beside uploads")
            beside.append(rps)
            uploaded += up.done
            failures += up.failed
            print(f"round {r}: alone {alone[-1]:,.0f} req/s, beside {args.uploads} uploads {beside[-1]:,.0f} req/s "
                  f"({beside[-1] / alone[-1]:.2f}); {up.done} uploads finished", flush=True)
    finally:
        server.terminate()
        server.wait()
    out = subprocess.run([str(binary), "--data-dir", str(data), "ls", "bkt", "up/", "--json"], capture_output=True,
                         text=True, check=True).stdout
    listed = [json.loads(line) for line in out.splitlines() if line.strip()]
    sizes = {o["size"] for o in listed}
    shutil.rmtree(work, ignore_errors=True)
    if failures:
        raise SystemExit(f"{len(failures)} uploads failed: {failures[:3]}")
    if sizes and sizes != {args.size_mib << 20}:
        raise SystemExit(f"stored upload sizes {sizes}, expected {args.size_mib << 20}")
    ratios = [b / a for a, b in zip(alone, beside)]
    print(f"4 KiB GETs beside {args.uploads} uploads of {args.size_mib} MiB on the same listener: median ratio "
          f"{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f}); alone median "
          f"{statistics.median(alone):,.0f} req/s, beside {statistics.median(beside):,.0f} req/s; "
          f"{uploaded} uploads finished during the measurements ({len(listed)} stored)")


if __name__ == "__main__":
    main()
