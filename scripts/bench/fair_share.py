#!/usr/bin/env python3
"""Fair sharing between principals (issue 48), measured side by side: a noisy principal (64 connections looping
over a large object) beside a quiet one, each with a token of its own, on one server pinned to CPU 0 (its one data
worker), the clients on CPU 1.

  1. latency: the quiet principal's 4 KiB GETs (wrk, 4 connections) alone, then beside the noisy one: its p99 and
     the ratio (target <= 2x).
  2. throughput: both download the large object (the quiet one with 4 connections): each one's share of the bytes
     (target for the quiet one >= 40% at equal weights; by connections alone it would be 4/68 = 6%).

The download clients discard what they receive without copying it (`recv` with MSG_TRUNC), so the server's sends
are the bottleneck, not the clients. wrk runs at real-time priority (`chrt -f`; `--wrk-priority normal` to compare)
on the CPU it shares with the download clients: on this 2-core machine they cannot have CPUs of their own, and at the
same priority wrk would wait for the noisy clients' time slices on its CPU, a wait a client on another machine does
not have, so the ratio would measure the clients' scheduler instead of the server. With several --bin, each binary is measured in turn, round by round
(alternating order), and the medians are reported; a binary without fair sharing shows the split by connections.

    python3 scripts/bench/fair_share.py --bin target/release/blobgate [--bin OLD] [--rounds 3] [--secs 8]
"""
import argparse, multiprocessing, os, re, selectors, socket, statistics, subprocess, time
from pathlib import Path

import common
from common import compare

ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append")
ap.add_argument("--project", default=".")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--secs", type=int, default=8)
ap.add_argument("--big-mib", type=int, default=1024)
ap.add_argument("--noisy-conns", type=int, default=64)
ap.add_argument("--quiet-conns", type=int, default=4)
ap.add_argument("--wrk-priority", choices=["realtime", "normal"], default="realtime")
a = ap.parse_args()
common.set_project(a.project)
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/blobgate-fair"))
WORK.mkdir(parents=True, exist_ok=True)
compare.WORK = WORK
compare.need("wrk", "wrk")
compare.need("chrt", "util-linux")


def drain(port, token, conns, secs, out):
    """`conns` keep-alive connections, each asking for /bench/big again as soon as the last one ended, discarding the
    bodies in the kernel; puts the bytes received in `secs` into `out`."""
    os.sched_setaffinity(0, {1})
    request = f"GET /bench/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
    sel = selectors.DefaultSelector()
    state = {}
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port))
        s.setblocking(False)
        s.sendall(request)
        state[s] = [b"", None]  # head bytes so far, body bytes left (None: in the head)
        sel.register(s, selectors.EVENT_READ)
    sink = bytearray(4 << 20)
    received, end = 0, time.monotonic() + secs
    while time.monotonic() < end:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            head, left = state[s]
            if left is None:
                chunk = s.recv(65536, socket.MSG_PEEK)
                if not chunk:
                    raise SystemExit("the server closed a connection")
                at = (head + chunk).find(b"\r\n\r\n")
                if at < 0:
                    state[s][0] = head + s.recv(len(chunk))
                    continue
                take = at + 4 - len(head)
                whole = head + s.recv(take)
                length = int(re.search(rb"(?i)content-length: *(\d+)", whole).group(1))
                state[s] = [b"", length]
                continue
            n = s.recv_into(sink, min(left, len(sink)), socket.MSG_TRUNC)
            if n == 0:
                raise SystemExit("the server closed a connection")
            received += n
            left -= n
            if left == 0:
                s.send(request)
                state[s] = [b"", None]
            else:
                state[s][1] = left
    out.put(received)


def downloads(port, tokens_conns, secs):
    """Runs a drain per (token, conns) at once; returns the bytes each received."""
    queues = [multiprocessing.Queue() for _ in tokens_conns]
    procs = [multiprocessing.Process(target=drain, args=(port, t, c, secs, q)) for (t, c), q in zip(tokens_conns, queues)]
    for p in procs:
        p.start()
    got = [q.get() for q in queues]
    for p in procs:
        p.join()
    return got


def quiet_p99(port, token, secs):
    """wrk --latency with 4 connections of 4 KiB GETs: its p99 in ms."""
    priority = ["chrt", "-f", "50"] if a.wrk_priority == "realtime" else []
    cmd = priority + ["taskset", "-c", "1", "wrk", "-t1", f"-c{a.quiet_conns}", f"-d{secs}s", "--latency",
           "-H", f"Authorization: Bearer {token}", f"http://127.0.0.1:{port}/bench/small"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    value, unit = re.search(r"99%\s+([\d.]+)(us|ms|s)", out).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


big = WORK / "big.bin"
if not big.exists() or big.stat().st_size != a.big_mib << 20:
    common.write_test_file(big, a.big_mib)
small = WORK / "small.bin"
small.write_bytes(os.urandom(4096))

servers = []
for i, b in enumerate(a.bin or [None]):
    g = common.Gate(f"fair{i}", common.binary(b), WORK)
    g.cli("put", "bench", "big", str(big))
    g.cli("put", "bench", "small", str(small))
    g.noisy, g.quiet = g.read_token(), g.read_token()
    servers.append(g)

results = {g.name: {"alone": [], "beside": [], "share": []} for g in servers}
try:
    for r in range(a.rounds):
        for g in (servers if r % 2 == 0 else servers[::-1]):
            g.start()
            try:
                downloads(g.port, [(g.quiet, 1)], 2)  # warm: the object in the page cache, the tokens cached
                alone = quiet_p99(g.port, g.quiet, a.secs)
                noisy = multiprocessing.Queue()
                p = multiprocessing.Process(target=drain, args=(g.port, g.noisy, a.noisy_conns, a.secs + 2, noisy))
                p.start()
                time.sleep(1)
                beside = quiet_p99(g.port, g.quiet, a.secs)
                noisy.get(); p.join()
                n, q = downloads(g.port, [(g.noisy, a.noisy_conns), (g.quiet, a.quiet_conns)], a.secs)
            finally:
                g.stop()
            share = q / (n + q)
            results[g.name]["alone"].append(alone)
            results[g.name]["beside"].append(beside)
            results[g.name]["share"].append(share)
            print(f"round {r + 1} {g.bin}: quiet p99 alone {alone:.2f} ms, beside the noisy one {beside:.2f} ms "
                  f"({beside / alone:.2f}x); both downloading: noisy {n / (1 << 20) / a.secs:.0f} MiB/s "
                  f"({a.noisy_conns} conns), quiet {q / (1 << 20) / a.secs:.0f} MiB/s ({a.quiet_conns} conns): "
                  f"quiet share {share:.1%}", flush=True)
finally:
    common.stop_all(servers)

print("\nmedians (targets: p99 beside/alone <= 2.0, quiet share >= 40%)")
for g in servers:
    m = {k: statistics.median(v) for k, v in results[g.name].items()}
    print(f"{g.bin}: quiet p99 alone {m['alone']:.2f} ms, beside {m['beside']:.2f} ms "
          f"({m['beside'] / m['alone']:.2f}x); quiet share of bytes {m['share']:.1%}")
