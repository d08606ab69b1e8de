#!/usr/bin/env python3
"""Where a SigV4 GetObject's extra server cost goes, counted rather than timed: the server runs under valgrind's
cachegrind (a simulated cache), serves N and then 3N keep-alive GETs of one 4 KiB object, bearer or SigV4 header
auth, and the difference of the two runs divided by 2N is the cost of one request, start-up excluded. Counts do
not depend on the machine's load, so two binaries can be compared one run each.

    python3 scripts/bench/s3_cost.py --bin target/release/blobgate [--requests 2000] [--top 25]

Per request, SigV4 beside bearer: instructions (Ir), first-level instruction-cache misses (I1mr: 64-byte lines
of code fetched again, which a request pays for since the kernel's network path evicts them between requests)
and data-cache misses (D1mr + D1mw), then the functions that add the most I1 misses and instructions.

Under valgrind SHA-256 runs in software (valgrind hides the CPU's SHA extensions), so `sha2::` is listed apart
and left out of the totals marked "without SHA-256"; natively SHA-NI hashes a block in about 1/30 of that.
Needs valgrind (apt `valgrind`).
"""
import argparse
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_bench  # noqa: E402

EVENTS = ["Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw"]


def serve_under_cachegrind(binary, kind, requests, out, small):
    """One server run: `requests` GETs of `small` with `kind` auth, the server under cachegrind."""
    wrap = Path(tempfile.mkdtemp()) / "blobgate"
    # Only `serve` runs under cachegrind; the set-up commands (bucket, put, key) run natively.
    wrap.write_text("#!/bin/sh\ncase \" $* \" in *\" serve \"*) exec valgrind --tool=cachegrind --cache-sim=yes "
                    f"--cachegrind-out-file={out} {binary} \"$@\";; esac\nexec {binary} \"$@\"\n")
    wrap.chmod(0o755)
    server = s3_bench.S3Gate(f"cost-{kind}", str(wrap), files=[small])
    server.start()
    try:
        headers = ({"Authorization": f"Bearer {server.token}"} if kind == "bearer"
                   else server.signed_object_headers(small.name))
        get(server.url(small.name), headers, requests, small.stat().st_size)
    finally:
        s3_bench.stop_all([server])
        shutil.rmtree(wrap.parent, ignore_errors=True)


def get(url, headers, requests, size):
    """`requests` GETs on one keep-alive connection, each answer checked to be a 200 of `size` bytes."""
    host, port = url.split("/")[2].split(":")
    path = "/" + url.split("/", 3)[3]
    head = f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items() if k.lower() != "host") + "\r\n"
    with socket.create_connection((host, int(port))) as sock:
        buf = b""
        for _ in range(requests):
            sock.sendall(head.encode())
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    status = buf[:buf.find(b"\r\n")]
                    if b" 200 " not in status:
                        raise RuntimeError(f"GET {path} answered {status!r}")
                    if len(buf) >= end + 4 + size:
                        buf = buf[end + 4 + size:]
                        break
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("the server closed the connection")
                buf += chunk


def by_function(out, annotate=("cg_annotate", "--auto=no")):
    """{function: [counts of EVENTS]} from a cachegrind file (or, with `annotate` callgrind_annotate's, a callgrind
    file), summed over the source files inlined into it. The columns are read in the order the file names them."""
    text = subprocess.run([*annotate, "--threshold=100" if "callgrind" in annotate[0] else "--threshold=0", out],
                          capture_output=True, text=True, check=True).stdout
    shown = re.search(r"^Events shown:\s+(.*)$", text, re.M).group(1).split()
    order = [shown.index(e) for e in EVENTS]
    counts = collections.defaultdict(lambda: [0] * len(EVENTS))
    for line in text.splitlines():
        values, name = [], None
        for number, zero, rest in re.findall(r"([\d,]+) \(\s*[\d.]+%\)|(?<=\s)(0|\.)(?=\s)|(\S.*)$", " " + line):
            if rest:
                name = rest.strip()
                break
            values.append(int(number.replace(",", "")) if number else 0)
        if len(values) != len(EVENTS) or not name:
            continue
        if name == "PROGRAM TOTALS":
            continue
        name = re.sub(r" \[[^\]]*\]$", "", name)
        name = re.sub(r"^(\S+?\.(?:rs|c|S|h)|\?\?\?):", "", name)
        for i, j in enumerate(order):
            counts[name][i] += values[j]
    return counts


def per_request(binary, kind, requests, work, small, serve=serve_under_cachegrind, count=by_function):
    """{function: [EVENTS per request]}: the difference of the N and 3N runs over 2N. `serve(binary, kind, n, out,
    small)` runs the server under valgrind for one run and `count(out)` reads its file (request_cost.py passes its
    own, for callgrind)."""
    runs = []
    for n in (requests, 3 * requests):
        out = work / f"{kind}-{n}.cachegrind"
        serve(binary, kind, n, out, small)
        runs.append(count(out))
    few, many = runs
    return {f: [(many[f][i] - few.get(f, [0] * len(EVENTS))[i]) / (2 * requests) for i in range(len(EVENTS))]
            for f in many}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    for tool in ("valgrind", "cg_annotate"):
        if not shutil.which(tool):
            sys.exit(f"s3_cost: {tool} is missing (apt install valgrind)")
    # As s3_bench does (see s3_ab.py): the server would create the bench's work directory private otherwise.
    s3_bench.WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="s3-cost-"))
    small = work / "small.bin"
    small.write_bytes(os.urandom(4096))
    binary = str(Path(args.bin).resolve())
    cost = {kind: per_request(binary, kind, args.requests, work, small) for kind in ("bearer", "sigv4")}
    shutil.rmtree(work, ignore_errors=True)

    def total(kind, event, sha=True):
        return sum(v[EVENTS.index(event)] for f, v in cost[kind].items() if sha or "sha2::" not in f)

    print(f"per request, {args.requests} and {3 * args.requests} GETs of 4 KiB, SigV4 / bearer:")
    for label, event, sha in (("instructions", "Ir", True), ("instructions without SHA-256", "Ir", False),
                              ("I1 misses", "I1mr", True), ("D1 read misses", "D1mr", True),
                              ("D1 write misses", "D1mw", True)):
        s, b = total("sigv4", event, sha), total("bearer", event, sha)
        print(f"  {label:30} {s:9.0f} / {b:9.0f}  = {s / b:5.2f}  (+{s - b:.0f})")
    functions = set(cost["sigv4"]) | set(cost["bearer"])
    zero = [0.0] * len(EVENTS)
    for event in ("I1mr", "Ir"):
        i = EVENTS.index(event)
        extra = sorted(functions, key=lambda f: cost["bearer"].get(f, zero)[i] - cost["sigv4"].get(f, zero)[i])
        print(f"\nfunctions adding the most {event} (SigV4, bearer, difference):")
        for f in extra[:args.top]:
            s, b = cost["sigv4"].get(f, zero)[i], cost["bearer"].get(f, zero)[i]
            print(f"  {s:8.1f} {b:8.1f} {s - b:+8.1f}  {f[:110]}")


if __name__ == "__main__":
    main()
