#!/usr/bin/env python3
"""Scaling tables, blobgate beside nginx in one run, through ../shared/bench/compare.py's own server wrappers
(server pinned to CPU 0, clients to CPU 1; blobgate with a bearer token on a private bucket, metrics on):

  1. server CPU seconds per GiB against object size (1 MiB, 64 MiB, 1 GiB), sequential curl downloads;
  2. requests/s for a 4 KiB object against keep-alive connections (16, 256, 2048), wrk.

CPU is read from every task's /proc/<pid>/task/<tid>/schedstat (nanoseconds actually run), not from the
clock-tick counters in /proc/<pid>/stat: a 1 MiB round is a few hundred microseconds, below a tick. Over loopback,
the client's receive processing runs in softirq on the sender's core and is charged to whichever server task is
running, so a single CPU/GiB figure swings by +-40% between identical runs. Each size is therefore measured
--reps times with the two servers interleaved (the order alternating), and the table gives the median of each
server and the median, min and max of the per-repetition ratios.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/scaling.py [--only cpu,rps] [--reps 5] [--secs 5] [--json out.json]
Prints Markdown tables with the ratio blobgate/nginx per row. Quote ratios, not absolute figures.
"""
import argparse, json, resource, statistics
from pathlib import Path

import common
from common import compare

SIZES = [(1, 1024), (64, 16), (1024, 3)]          # (MiB, rounds): 1-3 GiB per measurement
CONNECTIONS = [16, 256, 2048]


def run_seconds(pid):
    """CPU time the server's processes have run, to the nanosecond, summed over all their threads."""
    total = 0
    for p in compare.proc_tree(pid):
        for task in Path(f"/proc/{p}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return total / 1e9


def cpu_per_gib(server, rounds, size):
    server.start()
    try:
        compare.curl(server, "big.bin")  # warm the page cache and the server's caches
        c0 = run_seconds(server.proc.pid)
        for _ in range(rounds):
            compare.curl(server, "big.bin")
        c1 = run_seconds(server.proc.pid)
    finally:
        server.stop()
    return (c1 - c0) / (rounds * size / (1 << 30))


def rps(server, conns, secs):
    server.start()
    try:
        compare.curl(server, "small.bin")
        headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}
        got = common.wrk(server.url("small.bin"), secs, headers, conns, extra=["--timeout", "10s"])
    finally:
        server.stop()
    return got[:2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secs", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions per object size")
    ap.add_argument("--project", default=".")
    ap.add_argument("--only", default="cpu,rps", help="cpu, rps or both")
    ap.add_argument("--json")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    compare.need("nginx", "nginx-light"); compare.need("wrk", "wrk"); compare.need("curl", "curl")
    base = compare.WORK
    result = {"cpu_s_per_gib": [], "req_per_s": []}
    for mib, rounds in SIZES if "cpu" in a.only else []:
        compare.WORK = base / f"scaling-{mib}m"
        compare.WORK.mkdir(parents=True, exist_ok=True)
        data = compare.make_data(mib)
        servers = {"blobgate": compare.Blobgate(data, a.project), "nginx": compare.Nginx(data)}
        runs = {name: [] for name in servers}
        for rep in range(a.reps):
            order = list(servers) if rep % 2 == 0 else list(reversed(servers))
            for name in order:
                runs[name].append(cpu_per_gib(servers[name], rounds, mib << 20))
        ratios = [b / max(n, 1e-9) for b, n in zip(runs["blobgate"], runs["nginx"])]
        row = {"object_mib": mib, "blobgate": statistics.median(runs["blobgate"]),
               "nginx": statistics.median(runs["nginx"]), "ratio_median": statistics.median(ratios),
               "ratio_min": min(ratios), "ratio_max": max(ratios), "runs": runs}
        result["cpu_s_per_gib"].append(row)
        print(f"cpu {mib} MiB: {json.dumps(row)}", flush=True)
    compare.WORK = base / "scaling-conns"
    compare.WORK.mkdir(parents=True, exist_ok=True)
    data = compare.make_data(1)
    servers = {"blobgate": compare.Blobgate(data, a.project), "nginx": compare.Nginx(data)}
    for conns in CONNECTIONS if "rps" in a.only else []:
        row = {"connections": conns}
        for name, server in servers.items():
            row[name], row[f"{name}_non_2xx"] = rps(server, conns, a.secs)
        result["req_per_s"].append(row)
        print(f"rps {conns}: {row}", flush=True)

    print(f"\n| object size | blobgate CPU s/GiB (median) | nginx CPU s/GiB (median) | ratio: median (min-max of {a.reps}) |"
          "\n|---|---|---|---|")
    for r in result["cpu_s_per_gib"]:
        print(f"| {r['object_mib']} MiB | {r['blobgate']:.3f} | {r['nginx']:.3f} | "
              f"{r['ratio_median']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) |")
    print("\n| connections | blobgate req/s | nginx req/s | ratio |\n|---|---|---|---|")
    for r in result["req_per_s"]:
        print(f"| {r['connections']} | {r['blobgate']:.0f} | {r['nginx']:.0f} | {r['blobgate'] / max(r['nginx'], 1):.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
