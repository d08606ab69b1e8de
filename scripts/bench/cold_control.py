#!/usr/bin/env python3
"""Control for compare.py's cold-cache test: how much of the hot p99 growth is the client machine's, not ours?

compare.py's `cold` case measures the p99 of hot 4 KiB requests (wrk, 16 connections) alone, then beside two
clients that each drop a 512 MiB object from the page cache and fetch a random 64 MiB range of it. wrk and both
curls run on the client core (CPU 1). This script runs that case twice against blobgate, with the same wrk and
the same two cold-reading curls on the same core:

  - `http`:    the curls download the range from blobgate, as compare.py does;
  - `control`: the curls read the same cold range from the file directly (`curl file://`), so blobgate serves
               only the hot requests, exactly as when it runs alone.

If the control's p99 grows as much as the real case, the growth is client-side (wrk starved of CPU 1 and the
disk reads beside it), and no server change can remove it.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/cold_control.py [--secs 8] [--reps 3]
"""
import argparse, random, statistics, subprocess, sys, threading, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "shared" / "bench"))
import compare  # noqa: E402  (the shared harness: servers, data files, wrk p99)

BIG_MIB, RANGE = 512, 64 << 20


def cold_reader(server, blob, mode, stop):
    rnd = random.Random()
    while not stop.is_set():
        compare.drop_cache(blob)
        a = rnd.randrange(0, (BIG_MIB << 20) - RANGE)
        if mode == "http":
            cmd = ["curl", "-s", "-o", "/dev/null", *server.headers(), "-H", f"Range: bytes={a}-{a + RANGE - 1}",
                   server.url("big.bin")]
        else:
            cmd = ["curl", "-s", "-o", "/dev/null", "-r", f"{a}-{a + RANGE - 1}", f"file://{blob}"]
        subprocess.run(["taskset", "-c", "1"] + cmd, check=False)


def one_run(server, blob, mode, secs):
    server.start()
    stop = threading.Event()
    try:
        compare.curl(server, "small.bin")
        alone, _ = compare.wrk_p99(server, secs)
        readers = [threading.Thread(target=cold_reader, args=(server, blob, mode, stop)) for _ in range(2)]
        for t in readers:
            t.start()
        time.sleep(0.3)
        beside, _ = compare.wrk_p99(server, secs)
        stop.set()
        for t in readers:
            t.join()
    finally:
        server.stop()
    return beside / max(alone, 1e-6)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--project", default=".")
    a = ap.parse_args()
    compare.need("wrk", "wrk"); compare.need("curl", "curl")
    data = compare.make_data(BIG_MIB)
    server = compare.Blobgate(data, a.project)
    blob = server.blob_file(BIG_MIB << 20)
    ratios = {"http": [], "control": []}
    for rep in range(a.reps):
        for mode in (("http", "control") if rep % 2 == 0 else ("control", "http")):
            ratios[mode].append(one_run(server, blob, mode, a.secs))
            print(f"{mode}: p99 beside cold / p99 alone = {ratios[mode][-1]:.1f}", flush=True)
    print("\n| cold readers | hot p99 growth (median) | runs |\n|---|---|---|")
    for mode, label in (("http", "download from blobgate (compare.py's case)"), ("control", "read the file directly")):
        runs = ", ".join(f"{r:.1f}" for r in ratios[mode])
        print(f"| {label} | {statistics.median(ratios[mode]):.1f}x | {runs} |")


if __name__ == "__main__":
    main()
