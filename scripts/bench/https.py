#!/usr/bin/env python3
"""HTTPS against nginx, interleaved: server CPU seconds per GiB of a large download and 4 KiB req/s, each server
with the same throw-away ECDSA P-256 certificate, through ../shared/bench/compare.py's own wrappers and cases
(`bench_cpu`: sequential curl downloads; `bench_small`: wrk, one thread, 64 keep-alive connections, bearer token on
a private bucket for blobgate, metrics and stats on). Server on CPU 0, clients on CPU 1.

compare.py's `--tls` runs each case once. Here every repetition runs both servers (the order alternating) and the
table gives each server's median and the median, min and max of the per-repetition ratios: the figure to quote.

Like for like: nginx 1.22 (Debian's) enables TLS 1.2 only by default; here it is also given TLS 1.3, so both
servers negotiate TLS 1.3 with curl and wrk (the protocol and cipher each negotiated are printed). On a kernel
without TLS, blobgate's path is the user-space one (rustls, bodies `pread` into one buffer per connection), and
nginx's is OpenSSL's: both copy and encrypt in user space.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/https.py [--reps 5] [--big-mib 256] [--rounds 4] [--secs 8] [--json out.json]
"""
import argparse, json, re, statistics, subprocess
from pathlib import Path

import common
from common import compare


class Nginx13(compare.Nginx):
    """compare.py's nginx, with TLS 1.3 enabled beside 1.2."""

    def __init__(self, data):
        super().__init__(data)
        conf = self.conf.read_text()
        self.conf.write_text(conf.replace("ssl_certificate_key", "ssl_protocols TLSv1.2 TLSv1.3; ssl_certificate_key"))


def negotiated(server):
    """The protocol and cipher curl negotiates with `server`, from its verbose output."""
    server.start()
    try:
        out = subprocess.run(["curl", "-skv", "-o", "/dev/null", *server.headers(), server.url("small.bin")],
                             capture_output=True, text=True).stderr
    finally:
        server.stop()
    m = re.search(r"SSL connection using (\S+) / (\S+)", out)
    return f"{m.group(1)} {m.group(2)}" if m else "unknown"


def table(name, runs, fmt, reps):
    ratios = [b / max(n, 1e-9) for b, n in zip(runs["blobgate"], runs["nginx"])]
    row = {"blobgate": statistics.median(runs["blobgate"]), "nginx": statistics.median(runs["nginx"]),
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "runs": runs}
    print(f"| {name} | {fmt.format(row['blobgate'])} | {fmt.format(row['nginx'])} | "
          f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f} over {reps}) |")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="downloads of the big object per CPU measurement")
    ap.add_argument("--secs", type=int, default=8, help="wrk seconds per 4 KiB measurement")
    ap.add_argument("--project", default=".")
    ap.add_argument("--json")
    a = ap.parse_args()
    compare.need("nginx", "nginx-light"); compare.need("wrk", "wrk"); compare.need("curl", "curl")
    compare.WORK = compare.WORK / "https"
    compare.WORK.mkdir(parents=True, exist_ok=True)
    compare.TLS = compare.make_cert()
    data = compare.make_data(a.big_mib)
    big = a.big_mib << 20
    servers = {"blobgate": compare.Blobgate(data, a.project), "nginx": Nginx13(data)}
    for name, server in servers.items():
        print(f"{name} negotiates {negotiated(server)}", flush=True)
    cpu = {name: [] for name in servers}
    rps = {name: [] for name in servers}
    for rep in range(a.reps):
        order = list(servers) if rep % 2 == 0 else list(reversed(servers))
        for name in order:
            c = compare.bench_cpu(servers[name], a.rounds, big)
            s = compare.bench_small(servers[name], a.secs)
            if s["non_2xx"]:
                raise SystemExit(f"{name}: {s['non_2xx']} non-2xx answers under wrk")
            cpu[name].append(c["cpu_s_per_gib"])
            rps[name].append(s["req_per_s"])
            print(f"rep {rep + 1} {name}: {c['cpu_s_per_gib']:.3f} CPU s/GiB, {s['req_per_s']} req/s (4 KiB)",
                  flush=True)
    print("\n| over HTTPS | blobgate (median) | nginx (median) | ratio blobgate/nginx: median (min-max) |"
          "\n|---|---|---|---|")
    result = {"cpu_s_per_gib": table("server CPU per GiB", cpu, "{:.3f} s", a.reps),
              "req_per_s": table("4 KiB req/s", rps, "{:,.0f}", a.reps)}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
