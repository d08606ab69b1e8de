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
import argparse, json, os, re, shutil, signal, statistics, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "shared" / "bench"))
import compare  # noqa: E402  (the shared harness: server wrapper, wrk conventions, CPU accounting)

WORK = compare.WORK / "pg-replica"



PROJECT = Path(".").resolve()  # the binary's source tree: it reads config/default.toml from there


def run(cmd):
    """compare.sh, run in PROJECT, with the command's stderr in the error."""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout

class Replica(compare.Server):
    """One `blobgate serve` on its own data dir, with SQLite (database_url None) or PostgreSQL."""
    prefix = "bench/"

    def __init__(self, name, binary, database_url, small):
        self.name, self.bin, self.database_url = name, str(binary), database_url
        self.dd = WORK / f"{name}-data"
        shutil.rmtree(self.dd, ignore_errors=True)
        run(self.cli("bucket", "create", "bench"))
        run(self.cli("put", "bench", "small.bin", str(small)))
        self.token = run(self.cli("token", "create", "--bucket", "bench", "--scope", "read")).strip()
        self.admin = compare.free_port()

    def cli(self, *args):
        url = ["--database-url", self.database_url] if self.database_url else []
        return [self.bin, "--data-dir", str(self.dd), *url, *args]

    def cwd(self):
        return PROJECT

    def command(self):
        return self.cli("serve", "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin}")


def wrk(server, secs, conns=64):
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{secs}s", "-H", f"Authorization: Bearer {server.token}",
           server.url("small.bin")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), int(errors.group(1)) if errors else 0, requests


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
    global PROJECT
    PROJECT = Path(a.project).resolve()
    project = Path(a.project).resolve()
    binary = Path(a.bin).resolve() if a.bin else project / "target/release/blobgate"
    if not binary.exists():
        raise SystemExit(f"{binary} missing: run cargo build --release first")
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
        for s in servers:
            if getattr(s, "proc", None):
                s.stop()
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
