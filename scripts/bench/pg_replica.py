#!/usr/bin/env python3
"""4 KiB req/s of a PostgreSQL-backed replica against an SQLite one, on the same object, warm cache, in one run.

Two `blobgate serve` processes run side by side from the same binary, both pinned to CPU 0 (compare.py's server
wrapper): one on SQLite in its own data dir, one on a throw-away PostgreSQL cluster (`scripts/pg-cluster`, stopped
at the end). Each holds the same 4 KiB object in a private bucket, read with a bearer token (auth, metrics and stats
on). After a warm-up, wrk (compare.py's `small` case: 1 thread, 64 keep-alive connections, CPU 1) runs --rounds
times against each, interleaved, the order alternating (A B, B A, ...), so both see the same machine. Reported:
each round's req/s, the per-round ratios postgres/sqlite, their median, and the ratio of the sums. Target >= 0.95:
with a warm cache the hot path never touches the database.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/pg_replica.py [--rounds 6] [--secs 8] [--bin target/release/blobgate] [--json OUT]
Quote the ratios, never the absolute req/s.
"""
import argparse, json, os, signal, statistics, subprocess, time
from pathlib import Path

import common
from common import compare, run

WORK = compare.WORK / "pg-replica"


class Replica(common.Gate):
    """One `blobgate serve` on its own data dir, with SQLite (database_url None) or PostgreSQL."""

    def __init__(self, name, binary, database_url, small):
        super().__init__(name, binary, WORK, database_url)
        self.cli("put", "bench", "small.bin", str(small))
        self.token = self.read_token()


def wrk(server, secs, conns=64):
    return common.wrk(server.url("small.bin"), secs, {"Authorization": f"Bearer {server.token}"}, conns)


def transactions(server_url, database):
    """Transactions the cluster has counted on `database` (PostgreSQL's cumulative statistics)."""
    sql = f"SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '{database}'"
    return int(run(["psql", server_url, "-Atqc", sql]).strip())


def main():
    signal.signal(signal.SIGTERM, compare._on_term)  # unwinds through the finally that stops the servers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", default=".")
    ap.add_argument("--bin", help="the blobgate binary (default: PROJECT/target/release/blobgate)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    project = common.set_project(a.project)
    binary = common.binary(a.bin)
    compare.need("wrk", "wrk"); compare.need("curl", "curl")
    WORK.mkdir(parents=True, exist_ok=True)
    small = WORK / "small.bin"
    small.write_bytes(os.urandom(4096))
    cluster = WORK / "pg"
    subprocess.run([str(project / "scripts/pg-cluster"), "stop", str(cluster)], check=True)
    server_url = run([str(project / "scripts/pg-cluster"), "start", str(cluster)]).strip()
    servers = []
    try:
        run(["psql", server_url, "-v", "ON_ERROR_STOP=1", "-qc", "CREATE DATABASE bench_replica"])
        database_url = server_url.rsplit("/", 1)[0] + "/bench_replica"
        servers = [Replica("sqlite", binary, None, small), Replica("postgres", binary, database_url, small)]
        for s in servers:
            s.start()
        for s in servers:  # warm every cache (bucket, token, object, open blob) and the connections
            assert compare.curl(s, "small.bin").startswith("200 4096"), s.name
            wrk(s, 1)
        rows = []
        time.sleep(1.5)  # backends flush their statistics at most once a second
        tx_before = transactions(server_url, "bench_replica")
        for r in range(a.rounds):
            order = servers if r % 2 == 0 else servers[::-1]
            got = {}
            for s in order:
                got[s.name] = wrk(s, a.secs)
            rows.append(got)
            print(f"round {r + 1}: sqlite {got['sqlite'][0]:,.0f} req/s, postgres {got['postgres'][0]:,.0f} req/s, "
                  f"ratio {got['postgres'][0] / got['sqlite'][0]:.3f}, non-2xx {got['sqlite'][1]}/{got['postgres'][1]}",
                  flush=True)
        time.sleep(1.5)
        pg_tx = transactions(server_url, "bench_replica") - tx_before
        pg_requests = sum(g["postgres"][2] for g in rows)
        print(f"database transactions during the postgres replica's {pg_requests:,} requests: {pg_tx} "
              "(one per request would mean the hot path reads the database)", flush=True)
    finally:
        common.stop_all(servers)
        subprocess.run([str(project / "scripts/pg-cluster"), "stop", str(cluster)])
    ratios = [g["postgres"][0] / g["sqlite"][0] for g in rows]
    summed = sum(g["postgres"][0] for g in rows) / sum(g["sqlite"][0] for g in rows)
    errors = sum(g["postgres"][1] + g["sqlite"][1] for g in rows)
    print(f"ratio req_per_s postgres/sqlite: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}), of sums {summed:.3f}; non-2xx {errors}")
    if a.json:
        Path(a.json).write_text(json.dumps({"rounds": rows, "ratios": ratios, "ratio_of_sums": summed,
                                            "postgres_transactions": pg_tx, "postgres_requests": pg_requests},
                                           indent=1))


if __name__ == "__main__":
    main()
