#!/usr/bin/env python3
"""What one native 4 KiB GET costs the server in user space, counted rather than timed (issue "Small objects"):
instructions, first-level instruction-cache misses (64-byte lines of code fetched again), data-cache misses and
heap allocations per request, for a bearer-token GET of a private object and an anonymous GET of a public one,
with the functions that cost the most.

As `s3_cost.py` does: the server serves N and then 3N keep-alive GETs of one 4 KiB object under valgrind, and the
difference of the two runs divided by 2N is one request, start-up excluded; counts do not depend on the machine's
load, so two binaries compare one run each. Instructions and cache misses come from callgrind (with its cache
simulation), counted on the request path only: inside the data connection's task (reading and parsing the head,
the handler, the response head, sendfile, metrics and the download record) and the stats batcher's aggregation
of each record. Counted over the whole process (cachegrind), the batcher's once-a-second SQLite write and the
metrics clock's calibration at start moved the per-request figure by up to a third between runs of one binary.
Allocations (blocks and bytes) come from DHAT over the whole process, with the sites that allocate (the first
blobgate frame of each stack). The kernel's share (the three syscalls) is not counted: valgrind sees user space
only. SHA-256 runs in software under valgrind (no SHA extensions), so `sha2::` is shown apart.

    python3 scripts/bench/request_cost.py --bin target/release/blobgate [--requests 2000] [--top 20]

Needs valgrind (apt `valgrind`).
"""
import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_bench  # noqa: E402
from s3_cost import EVENTS, by_function, get, per_request  # noqa: E402

KINDS = ("bearer", "public")


def serve_under(tool_args, binary, kind, requests, small):
    """One server run under valgrind with `tool_args`: `requests` GETs of `small`, by bearer token or anonymous
    on a public bucket."""
    wrap = Path(tempfile.mkdtemp()) / "blobgate"
    # Only `serve` runs under valgrind; the set-up commands run natively.
    wrap.write_text("#!/bin/sh\ncase \" $* \" in *\" serve \"*) exec valgrind " + " ".join(tool_args)
                    + f" {binary} \"$@\";; esac\nexec {binary} \"$@\"\n")
    wrap.chmod(0o755)
    server = s3_bench.S3Gate(f"cost-{kind}", str(wrap), files=[small])
    if kind == "public":
        server.cli("bucket", "set", "bench", "--public")
    server.start()
    try:
        headers = {"Authorization": f"Bearer {server.token}"} if kind == "bearer" else {}
        get(server.url(small.name), headers, requests, small.stat().st_size)
    finally:
        s3_bench.stop_all([server])
        shutil.rmtree(wrap.parent, ignore_errors=True)


# Where a request's work runs: the data connection's task, and the batcher's aggregation of its record.
# The connection's task is the only one the driver tracks (`TaskTracker`); its loop (`Connection::run`) may be
# inlined into the tracker's poll, so the poll is what is named.
REQUEST_PATH = ("*TrackedFuture*::poll", "blobgate::stats::Batch::add_within")


def callgrind(binary, kind, requests, work, small):
    """{function: [EVENTS per request]} on the request path, as s3_cost.py counts it."""
    def serve(binary, kind, n, out, small):
        serve_under(["--tool=callgrind", "--cache-sim=yes", "--dump-instr=no", f"--callgrind-out-file={out}",
                     *(f"--toggle-collect={f}" for f in REQUEST_PATH)], binary, kind, n, small)
    return per_request(binary, kind, requests, work, small, serve=serve,
                       count=lambda out: by_function(out, annotate=("callgrind_annotate", "--auto=no")))


def allocations(binary, kind, requests, work, small):
    """(blocks, bytes) allocated per request, from DHAT's totals, and {allocation site: blocks per request}."""
    runs, sites = [], []
    for n in (requests, 3 * requests):
        log = work / f"{kind}-{n}.dhat.log"
        out = work / f"{kind}-{n}.dhat.json"
        serve_under(["--tool=dhat", f"--dhat-out-file={out}", f"--log-file={log}"], binary, kind, n, small)
        text = log.read_text()
        m = re.search(r"Total:\s+([\d,]+) bytes in ([\d,]+) blocks", text)
        if not m:
            raise RuntimeError(f"no DHAT totals in {log}:\n{text[-2000:]}")
        runs.append((int(m.group(2).replace(",", "")), int(m.group(1).replace(",", ""))))
        sites.append(allocation_sites(out))
    (b1, y1), (b3, y3) = runs
    few, many = sites
    per_site = {site: tuple((v - w) / (2 * requests) for v, w in zip(counts, few.get(site, (0, 0))))
                for site, counts in many.items()}
    return (b3 - b1) / (2 * requests), (y3 - y1) / (2 * requests), per_site


def allocation_sites(dhat_json):
    """{the first blobgate frame (or the first frame) of an allocation's stack: (total blocks, total bytes)} from
    DHAT's output (`tbk`, `tb` per program point)."""
    data = json.loads(Path(dhat_json).read_text())
    frames = data["ftbl"]
    sites = collections.defaultdict(lambda: (0, 0))
    for pp in data["pps"]:
        names = [frames[i] for i in pp["fs"]]
        ours = [f for f in names if "blobgate::" in f]
        site = re.sub(r"^0x[0-9A-F]+: ", "", ours[0] if ours else (names[0] if names else "?"))[:140]
        blocks, size = sites[site]
        sites[site] = (blocks + pp["tbk"], size + pp["tb"])
    return sites


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_annotate"):
        if not shutil.which(tool):
            sys.exit(f"request_cost: {tool} is missing (apt install valgrind)")
    s3_bench.WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="request-cost-"))
    small = work / "small.bin"
    small.write_bytes(os.urandom(4096))
    binary = str(Path(args.bin).resolve())
    cost = {kind: callgrind(binary, kind, args.requests, work, small) for kind in KINDS}
    allocs = {kind: allocations(binary, kind, args.requests, work, small) for kind in KINDS}
    shutil.rmtree(work, ignore_errors=True)

    def total(kind, event, sha=True):
        return sum(v[EVENTS.index(event)] for f, v in cost[kind].items() if sha or "sha2::" not in f)

    print(f"per request ({args.requests} and {3 * args.requests} keep-alive GETs of 4 KiB), "
          f"{' / '.join(KINDS)}:")
    rows = [("instructions", lambda k: total(k, "Ir")),
            ("instructions without SHA-256", lambda k: total(k, "Ir", sha=False)),
            ("I1 misses (code lines)", lambda k: total(k, "I1mr")),
            ("D1 misses (read + write)", lambda k: total(k, "D1mr") + total(k, "D1mw")),
            ("allocations (blocks)", lambda k: allocs[k][0]),
            ("allocated bytes", lambda k: allocs[k][1])]
    for label, value in rows:
        print(f"  {label:30} " + " / ".join(f"{value(k):9.1f}" for k in KINDS))
    for kind in KINDS:
        print(f"\n{kind}: allocation sites per request, blocks and bytes (the first blobgate frame of each stack):")
        for site, (blocks, size) in sorted(allocs[kind][2].items(), key=lambda kv: -kv[1][0])[:args.top]:
            if blocks >= 0.05:
                print(f"  {blocks:6.2f} {size:8.1f}  {site}")
    zero = [0.0] * len(EVENTS)
    for kind in KINDS:
        for event in ("Ir", "I1mr"):
            i = EVENTS.index(event)
            top = sorted(cost[kind], key=lambda f: -cost[kind].get(f, zero)[i])[:args.top]
            print(f"\n{kind}: the functions with the most {event} per request:")
            for f in top:
                print(f"  {cost[kind][f][i]:9.1f}  {f[:110]}")


if __name__ == "__main__":
    main()
