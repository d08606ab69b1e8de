#!/usr/bin/env python3
"""Revocation propagation delay across replicas: three `blobgate serve` processes on one PostgreSQL database and
one data dir. For each of N tokens (default 100): every replica serves a private object with the token (so each
has it cached as live), `blobgate token revoke` runs, and one thread per replica asks again and again (a keep-alive
connection, no pause) until it answers 401. A sample is the time from the CLI's exit (its commit is done by then;
its own process start is not propagation) until a replica refuses; the revocation's delay is its slowest
replica's.

Prints p50/p99/max of the per-revocation delay (slowest replica) and of every replica sample.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/propagation.py [--database-url postgres://...] [--revocations 100] [--replicas 3]
Without --database-url it starts a throw-away cluster with scripts/pg-cluster and removes it at the end.
"""
import argparse, http.client, os, re, shutil, statistics, subprocess, sys, tempfile, threading, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"blobgate is serving.*data=(\S+).*admin=(\S+)")


def pct(samples, p):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class Gateway:
    def __init__(self, binary, data_dir, url):
        self.binary, self.data_dir, self.url = binary, data_dir, url

    def env(self):
        env = {k: v for k, v in os.environ.items() if k not in ("BLOBGATE_CONFIG", "RUST_LOG")}
        env["BLOBGATE_DATABASE_URL"] = self.url
        return env

    def cli(self, *args):
        out = subprocess.run([self.binary, "--data-dir", self.data_dir, *args], env=self.env(),
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"blobgate {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout.strip()

    def serve(self):
        env = self.env()
        env["RUST_LOG"] = "info"
        proc = subprocess.Popen([self.binary, "--data-dir", self.data_dir, "serve", "--listen", "127.0.0.1:0",
                                 "--admin-listen", "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 30
        for line in proc.stderr:
            m = SERVING.search(line)
            if m:
                threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
                host, port = m.group(1).rsplit(":", 1)
                return proc, (host, int(port))
            if time.time() > deadline:
                break
        proc.kill()
        sys.exit("a replica did not start")


def status(conn, path, token):
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    resp = conn.getresponse()
    resp.read()
    return resp.status


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url")
    ap.add_argument("--revocations", type=int, default=100)
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "blobgate"))
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="blobgate-propagation-"))
    cluster = None
    procs = []
    try:
        url = args.database_url
        if url is None:
            cluster = work / "pg"
            # The cluster runs as an unprivileged user, which must be able to reach its directory.
            os.chmod(work, 0o755)
            started = subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "start", str(cluster)],
                                     capture_output=True, text=True)
            if started.returncode != 0:
                sys.exit(f"scripts/pg-cluster start failed: {started.stderr.strip()}")
            url = started.stdout.strip()
        gw = Gateway(args.binary, str(work / "data"), url)
        gw.cli("bucket", "create", "bench")
        (work / "doc").write_bytes(b"x" * 4096)
        gw.cli("put", "bench", "doc", str(work / "doc"))
        tokens = [gw.cli("token", "create", "--bucket", "bench", "--scope", "read") for _ in range(args.revocations)]
        addrs = []
        for _ in range(args.replicas):
            proc, addr = gw.serve()
            procs.append(proc)
            addrs.append(addr)
        conns = [http.client.HTTPConnection(*a, timeout=10) for a in addrs]

        worst, every = [], []
        for token in tokens:
            for conn in conns:
                assert status(conn, "/bench/doc", token) == 200, "a live token must be served"
            gw.cli("token", "revoke", token)
            committed = time.perf_counter()
            delays = [None] * len(conns)

            def poll(i):
                while status(conns[i], "/bench/doc", token) != 401:
                    if time.perf_counter() - committed > 10:
                        break
                delays[i] = time.perf_counter() - committed

            threads = [threading.Thread(target=poll, args=(i,)) for i in range(len(conns))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            worst.append(max(delays))
            every.extend(delays)

        def line(name, samples):
            ms = [s * 1000 for s in samples]
            return (f"{name:<34} n={len(ms):<4} p50 {pct(ms, 50):7.1f} ms   p99 {pct(ms, 99):7.1f} ms   "
                    f"max {max(ms):7.1f} ms   mean {statistics.mean(ms):7.1f} ms")

        print(f"revocation propagation, {args.replicas} replicas, {args.revocations} revocations")
        print(line("slowest replica per revocation", worst))
        print(line("every replica sample", every))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if cluster is not None:
            subprocess.run([str(ROOT / "scripts" / "pg-cluster"), "stop", str(cluster)], check=False)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
