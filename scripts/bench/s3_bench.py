#!/usr/bin/env python3
"""S3 API figures, each measured side by side in one run (server on CPU 0, clients on CPU 1, as compare.py):

  get   4 KiB GetObject req/s with SigV4 header auth against the bearer path, same server, same object. wrk (1
        thread, 64 keep-alive connections, compare.py's `small` case) replays one fixed header set signed by botocore
        (`S3SigV4Auth`; re-signed before every round, so the date stays well inside the 15-minute skew window);
        --rounds rounds, bearer and SigV4 interleaved, the order alternating. Target: SigV4/bearer >= 0.9.
  list  ListObjectsV2 page latency, p50/p99, at 1k and 1M keys (two servers, one data dir each), for the first page
        and for a deep page (a continuation token near the end of the bucket). Every request is signed by botocore
        just before it is sent (not timed) and carries `encoding-type=url`, as botocore's own lists do; the time is
        from sending the request to the last byte of the body, over one keep-alive connection. The sizes and kinds
        are interleaved round by round. Target: flat from 1k to 1M.
  cpu   server CPU seconds per GiB of a SigV4 GetObject of a --big-mib object (sequential curl downloads, one
        connection each, the headers signed by botocore per download) against nginx (`sendfile on`) serving the same
        file, with the bearer path beside them; --reps repetitions interleaved, CPU from per-thread schedstat
        (scaling.py's accounting). Reports the medians and the median of the per-repetition ratios.

The 1M-key bucket is filled by a bench-only bulk path: one object is put through the CLI, then its row is copied to
a million keys with one SQLite transaction before the server starts (its triggers write the change log as any
writer would). Listings never open blob files.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/s3_bench.py [--only get,list,cpu] [--rounds 6] [--secs 8] [--keys 1000,1000000]
                                      [--page 100] [--requests 60] [--big-mib 512] [--reps 5]
                                      [--bin target/release/blobgate] [--json OUT]
Quote the ratios, never the absolute figures.
"""
import argparse, http.client, json, os, re, signal, sqlite3, statistics, subprocess, time
from pathlib import Path
from urllib.parse import quote

import common
import scaling  # (schedstat CPU accounting)
from common import compare, stop_all

WORK = compare.WORK / "s3"
REGION = "us-east-1"


def sign(method, url, key_id, secret):
    """The headers botocore's S3 signer adds to an unsigned-body request for `url` (Host is signed from the URL)."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials
    req = AWSRequest(method=method, url=url, headers={"x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    S3SigV4Auth(Credentials(key_id, secret), "s3", REGION).add_auth(req)
    return {k: v for k, v in req.headers.items()}



class S3Gate(common.Gate):
    """`blobgate serve` with one private bucket, a read token and a read S3 key. `sigv4` picks what `headers()`
    sends, so compare.curl asks either way."""

    def __init__(self, name, binary, files=(), keys=0, page_source=None):
        super().__init__(name, binary, WORK)
        self.sigv4 = False
        for f in files:
            self.cli("put", "bench", f.name, str(f))
        self.token = self.read_token()
        self.key_id, self.secret = self.cli("s3-key", "create", "--bucket", "bench", "--scope", "read").split()
        if keys:
            self.fill(keys, page_source)

    def fill(self, keys, source):
        """Bench-only bulk path: `keys` rows copied from one object put through the CLI, in one transaction."""
        self.cli("put", "bench", list_key(0), str(source))
        db = sqlite3.connect(self.dd / "blobgate.db")
        with db:
            db.execute(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
                "INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition, "
                "created_at, updated_at) "
                "SELECT o.bucket_id, 'keys/' || printf('%07d', n.i), o.sha256, o.size, o.content_type, "
                "o.cache_control, o.content_disposition, o.created_at, o.updated_at "
                "FROM n, objects o WHERE o.key = ?", (keys - 1, list_key(0)))
        count = db.execute("SELECT count(*) FROM objects").fetchone()[0]
        db.close()
        if count != keys:
            raise RuntimeError(f"{self.name}: {count} objects after the fill, wanted {keys}")

    def headers(self):
        if not self.sigv4:
            return ["-H", f"Authorization: Bearer {self.token}"]
        return [arg for k, v in self.signed_object_headers("big.bin").items() for arg in ("-H", f"{k}: {v}")]

    def signed_object_headers(self, key):
        return sign("GET", self.url(key), self.key_id, self.secret)


def list_key(i):
    return f"keys/{i:07d}"


# ---- get: SigV4 against bearer, wrk ------------------------------------------------------------------------------

def wrk(server, secs, headers):
    """(req/s, non-2xx responses)."""
    return common.wrk(server.url("small.bin"), secs, headers)[:2]


def check_get(server, headers):
    args = [a for k, v in headers.items() for a in ("-H", f"{k}: {v}")]
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", *args,
                        server.url("small.bin")], capture_output=True, text=True, check=True).stdout
    if r != "200 4096":
        raise RuntimeError(f"GET small.bin with {sorted(headers)} answered {r}")


def bench_get(binary, small, rounds, secs):
    server = S3Gate("get", binary, files=[small])
    server.start()
    rows = []
    try:
        bearer = {"Authorization": f"Bearer {server.token}"}
        check_get(server, bearer)
        check_get(server, server.signed_object_headers("small.bin"))
        wrk(server, 1, bearer)
        wrk(server, 1, server.signed_object_headers("small.bin"))
        for r in range(rounds):
            got = {}
            for kind in (("bearer", "sigv4") if r % 2 == 0 else ("sigv4", "bearer")):
                headers = bearer if kind == "bearer" else server.signed_object_headers("small.bin")
                got[kind] = wrk(server, secs, headers)
            rows.append(got)
            print(f"get round {r + 1}: bearer {got['bearer'][0]:,.0f} req/s, sigv4 {got['sigv4'][0]:,.0f} req/s, "
                  f"ratio {got['sigv4'][0] / got['bearer'][0]:.3f}, non-2xx {got['bearer'][1]}/{got['sigv4'][1]}",
                  flush=True)
    finally:
        stop_all([server])
    ratios = [g["sigv4"][0] / g["bearer"][0] for g in rows]
    summed = sum(g["sigv4"][0] for g in rows) / sum(g["bearer"][0] for g in rows)
    errors = sum(g["sigv4"][1] + g["bearer"][1] for g in rows)
    print(f"ratio req_per_s sigv4/bearer: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}), of sums {summed:.3f}; non-2xx {errors}", flush=True)
    return {"rounds": rows, "ratios": ratios, "ratio_of_sums": summed, "non_2xx": errors}


# ---- list: ListObjectsV2 page latency ----------------------------------------------------------------------------

def list_path(params):
    """`/bench?...` with the query in S3's canonical form (sorted, RFC 3986 encoded), so what botocore signs is
    byte for byte what is sent."""
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items()))
    return f"/bench?{query}"


def list_once(conn, server, params):
    path = list_path(params)
    headers = sign("GET", f"http://127.0.0.1:{server.port}{path}", server.key_id, server.secret)
    started = time.perf_counter()
    conn.request("GET", path, headers=headers)
    resp = conn.getresponse()
    body = resp.read()
    elapsed = time.perf_counter() - started
    if resp.status != 200:
        raise RuntimeError(f"{server.name} {path}: {resp.status} {body[:300]!r}")
    return elapsed, body


def deep_token(conn, server, keys, page):
    """A continuation token that starts a full page near the end of the bucket."""
    _, body = list_once(conn, server, {"list-type": "2", "encoding-type": "url", "max-keys": "1",
                                       "start-after": list_key(keys - page - 50)})
    m = re.search(rb"<NextContinuationToken>([^<]+)</NextContinuationToken>", body)
    if not m:
        raise RuntimeError(f"{server.name}: no continuation token in {body[:300]!r}")
    return m.group(1).decode()


def bench_list(binary, small, sizes, page, rounds, requests):
    servers = [S3Gate(f"list-{n}", binary, keys=n, page_source=small) for n in sizes]
    out = {}
    try:
        for s in servers:
            s.start()
        conns = {s.name: http.client.HTTPConnection("127.0.0.1", s.port, timeout=30) for s in servers}
        cases = []
        for n, s in zip(sizes, servers):
            first = {"list-type": "2", "encoding-type": "url", "max-keys": str(page)}
            deep = dict(first, **{"continuation-token": deep_token(conns[s.name], s, n, page)})
            for kind, params in (("first", first), ("deep", deep)):
                _, body = list_once(conns[s.name], s, params)  # warm, and check the page is full
                got = body.count(b"<Key>")
                if got != page:
                    raise RuntimeError(f"{s.name} {kind} page: {got} keys, wanted {page}")
                cases.append((n, kind, s, params))
        times = {(n, kind): [] for n, kind, _, _ in cases}
        for r in range(rounds):
            for n, kind, s, params in (cases if r % 2 == 0 else cases[::-1]):
                for _ in range(requests):
                    times[(n, kind)].append(list_once(conns[s.name], s, params)[0])
        for (n, kind), t in times.items():
            t.sort()
            p = lambda q: t[min(int(len(t) * q), len(t) - 1)] * 1e3  # noqa: E731
            out[f"{n}/{kind}"] = {"p50_ms": round(p(0.5), 3), "p99_ms": round(p(0.99), 3), "samples": len(t)}
            print(f"list {n:>8} keys, {kind:>5} page of {page}: p50 {p(0.5):.3f} ms, p99 {p(0.99):.3f} ms "
                  f"({len(t)} requests)", flush=True)
        small_n, big_n = sizes[0], sizes[-1]
        for kind in ("first", "deep"):
            a, b = out[f"{small_n}/{kind}"], out[f"{big_n}/{kind}"]
            print(f"ratio {kind} page {big_n}/{small_n} keys: p50 {b['p50_ms'] / a['p50_ms']:.2f}, "
                  f"p99 {b['p99_ms'] / a['p99_ms']:.2f}", flush=True)
    finally:
        stop_all(servers)
    return out


# ---- cpu: CPU per GiB of a SigV4 GetObject against nginx ---------------------------------------------------------

def cpu_per_gib(server, rounds, size):
    compare.curl(server, "big.bin")  # warm the page cache and the server's caches
    c0 = scaling.run_seconds(server.proc.pid)
    for _ in range(rounds):
        res = compare.curl(server, "big.bin")
        if res != f"200 {size}":
            raise RuntimeError(f"{server.name}: GET big.bin answered {res}")
    return (scaling.run_seconds(server.proc.pid) - c0) / (rounds * size / (1 << 30))


def bench_cpu(binary, data, big_mib, reps, rounds):
    size = big_mib << 20
    gate = S3Gate("cpu", binary, files=[data / "big.bin"])
    nginx = compare.Nginx(data)
    out = {"sigv4": [], "bearer": [], "nginx": []}
    try:
        gate.start(); nginx.start()
        for r in range(reps):
            kinds = ["sigv4", "bearer", "nginx"]
            for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                if kind == "nginx":
                    out[kind].append(cpu_per_gib(nginx, rounds, size))
                else:
                    gate.sigv4 = kind == "sigv4"
                    out[kind].append(cpu_per_gib(gate, rounds, size))
            print(f"cpu rep {r + 1}: s/GiB sigv4 {out['sigv4'][-1]:.3f}, bearer {out['bearer'][-1]:.3f}, "
                  f"nginx {out['nginx'][-1]:.3f}", flush=True)
    finally:
        stop_all([gate, nginx])
    med = {k: statistics.median(v) for k, v in out.items()}
    ratio = lambda a, b: statistics.median(x / y for x, y in zip(out[a], out[b]))  # noqa: E731
    summary = {"median_s_per_gib": med, "sigv4_over_nginx": ratio("sigv4", "nginx"),
               "sigv4_over_bearer": ratio("sigv4", "bearer"), "bearer_over_nginx": ratio("bearer", "nginx")}
    print(f"cpu s/GiB medians: sigv4 {med['sigv4']:.3f}, bearer {med['bearer']:.3f}, nginx {med['nginx']:.3f}; "
          f"median ratios sigv4/nginx {summary['sigv4_over_nginx']:.2f} "
          f"(min {min(x / y for x, y in zip(out['sigv4'], out['nginx'])):.2f}, "
          f"max {max(x / y for x, y in zip(out['sigv4'], out['nginx'])):.2f}), "
          f"sigv4/bearer {summary['sigv4_over_bearer']:.2f}, bearer/nginx {summary['bearer_over_nginx']:.2f}",
          flush=True)
    return {"reps": out, **summary}


def main():
    signal.signal(signal.SIGTERM, compare._on_term)  # unwinds through the finally blocks that stop servers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="get,list,cpu")
    ap.add_argument("--project", default=".")
    ap.add_argument("--bin", help="the blobgate binary (default: PROJECT/target/release/blobgate)")
    ap.add_argument("--rounds", type=int, default=6, help="get: wrk rounds per path; list: rounds of requests")
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--keys", default="1000,1000000")
    ap.add_argument("--page", type=int, default=100, help="max-keys of the timed pages")
    ap.add_argument("--requests", type=int, default=60, help="list: requests per case per round")
    ap.add_argument("--big-mib", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5, help="cpu: interleaved repetitions")
    ap.add_argument("--downloads", type=int, default=4, help="cpu: downloads per repetition")
    ap.add_argument("--json")
    a = ap.parse_args()
    common.set_project(a.project)
    binary = common.binary(a.bin)
    compare.need("wrk", "wrk"); compare.need("curl", "curl"); compare.need("nginx", "nginx-light")
    os.sched_setaffinity(0, {1})  # the list client and the signer run on the client core
    WORK.mkdir(parents=True, exist_ok=True)
    small = WORK / "small.bin"
    small.write_bytes(os.urandom(4096))
    result = {}
    for what in a.only.split(","):
        if what == "get":
            result["get"] = bench_get(binary, small, a.rounds, a.secs)
        elif what == "list":
            sizes = [int(n) for n in a.keys.split(",")]
            result["list"] = bench_list(binary, small, sizes, a.page, a.rounds, a.requests)
        elif what == "cpu":
            data = compare.make_data(a.big_mib)
            result["cpu"] = bench_cpu(binary, data, a.big_mib, a.reps, a.downloads)
        else:
            raise SystemExit(f"unknown measurement {what}: get, list or cpu")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
