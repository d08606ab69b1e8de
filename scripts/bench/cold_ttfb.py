#!/usr/bin/env python3
"""Cold time-to-first-byte of a blob in an S3-compatible store: blobgate with an empty cache against a direct GET of
the store object, with the store throttled to a realistic per-connection rate.

s3s-fs (Rust, a directory served as S3) holds the blobs; in front of it runs a throttling TCP proxy started by this
script (a child process, threads): each connection's store->client direction is paced to --rate MB/s (10^6 B/s; a
token bucket refilled continuously, bursts of at most --burst-kib), the client->store direction is not, and the
bytes pass unchanged (the Host header is unchanged too, so SigV4 still verifies). Every store client, blobgate
included, has the proxy as its endpoint. The proxy acknowledges the store's bytes at once (TCP_QUICKACK after each
read; --no-quickack: not): s3s-fs does not set TCP_NODELAY and writes a response in pieces (a 256 MiB blob's
8,248-byte slice manifest as 166 bytes of headers, 8,192 bytes, then 56), so Nagle holds the last small piece until
what went before is ACKed, and on a connection just used for a request and its answer (blobgate's /readyz pings the
store, and the cold read's manifest GET reuses that connection) Linux delays that ACK by about 40 ms, which lands
in blobgate's TTFB: a cost of this loopback set-up, not of a store across a network. One --big-mib object is put into the public bucket `pub` through the CLI
(`blobgate put`, with the store settings), so it lands in the store, at PREFIX/ab/cd/<sha256>, with its slice
manifest sealed by that data dir's secrets key; the second server's data dir is a copy of the first's.

Then --reps repetitions, the order of the three cases alternating:

  blobgate     the server (default `cache.slice_bytes`, 8 MiB) is stopped, its data dir's `cache/` removed, the
               server started again and waited for (/readyz on the admin listener answers 200), then
               `curl -o /dev/null -w '%{time_starttransfer} %{time_total}'` of the object from the data listener:
               time to first byte (the response's headers wait for the first slice, so this is the body's first
               byte too) and total time. /metrics must show the whole object fetched from the store.
  direct       a signed GET of the store object itself through the same proxy, as a client that went to the store
               would see it: boto3 `get_object` (path-style, the store's key), in a Python process of its own; its
               client is warmed by a HEAD of the object, then its connection dropped, so the timed GET opens a new
               connection as blobgate's first fetch does. Timed from the call to the first byte of the streaming
               body, and to its end.
  1mib-slices  as `blobgate`, on a second server whose `cache.slice_bytes` is 1 MiB (BLOBGATE_CACHE__SLICE_BYTES):
               the first byte leaves once a whole slice has arrived and been checked against the blob's manifest
               (1 MiB chunks), so this bounds what streaming within an 8 MiB slice (booking each verified 1 MiB
               chunk as it arrives) could buy at most.

It prints per case the median TTFB and total time, then the medians (min-max) of the per-repetition ratios
blobgate/direct and 1mib-slices/blobgate. The floor of a cold TTFB through blobgate is one slice at --rate (8 MiB
at 50 MB/s: 168 ms), printed beside them. Note that the pacing is per connection: blobgate fetches a few slices
ahead of the reader on connections of their own, so its total time can beat one direct GET's.

Pinning: blobgate on CPU 0, curl and the boto3 client on CPU 1; s3s-fs and the proxy are not pinned (the store
side is neither the server under test nor its client). The store's file is in the page cache.

Usage (from the project root; builds target/release/blobgate with `cargo build --release` if it is missing):
    python3 scripts/bench/cold_ttfb.py [--reps 5] [--big-mib 256] [--rate 50] [--burst-kib 64] [--no-quickack]
                                       [--bin target/release/blobgate] [--s3s-fs PATH] [--json OUT] [--keep]
Quote the ratios, never the absolute figures.
"""
import argparse, json, os, shutil, signal, socket, statistics, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import object_store  # noqa: E402  (s3s-fs, blobgate servers with store settings, process groups)
from object_store import BUCKET, FETCHED, STORE_BUCKET  # noqa: E402

CASES = ("blobgate", "direct", "1mib-slices")
LABELS = {"blobgate": "blobgate, empty cache, 8 MiB slices (default)", "direct": "direct GET of the store object",
          "1mib-slices": "blobgate, empty cache, 1 MiB slices"}
CHUNK = 64 << 10  # the proxy's reads


def fail(msg):
    raise SystemExit(f"cold_ttfb: {msg}")


def need(tool, hint):
    """The path of `tool` (a name on PATH, or a path), or exit non-zero saying where to get it."""
    path = shutil.which(tool) if "/" not in tool else (tool if os.access(tool, os.X_OK) else None)
    if not path:
        fail(f"{tool} is missing ({hint})")
    return path


# --- the throttling proxy (run as a child process: `cold_ttfb.py --proxy LISTEN:UPSTREAM --rate R`) ---

def pump(src, dst, rate, burst, quickack=False):
    """Copies `src` to `dst` until EOF, paced to `rate` B/s (token bucket of `burst` bytes) unless `rate` is None,
    then half-closes `dst`. A token debt is slept off before the bytes are passed on. With `quickack`, what is read
    from `src` is acknowledged at once (TCP_QUICKACK after each read) rather than by a delayed ACK."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    size = CHUNK if rate is None else min(CHUNK, burst)
    tokens, last = burst, time.monotonic()
    try:
        while True:
            n = src.recv_into(buf, size)
            if not n:
                break
            if quickack:
                src.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
            if rate is not None:
                now = time.monotonic()
                tokens = min(burst, tokens + (now - last) * rate) - n
                last = now
                if tokens < 0:
                    time.sleep(-tokens / rate)
            dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def proxy_connection(client, upstream_port, rate, burst, quickack):
    try:
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    up = threading.Thread(target=pump, args=(client, upstream, None, burst), daemon=True)
    up.start()
    pump(upstream, client, rate, burst, quickack)
    up.join()
    client.close()
    upstream.close()


def serve_proxy(spec, rate_mb, burst_kib, quickack):
    """The proxy's process: listens on 127.0.0.1:LISTEN, one upstream connection and two threads per client."""
    listen, upstream = (int(p) for p in spec.split(":"))
    rate, burst = rate_mb * 1e6, burst_kib << 10
    server = socket.create_server(("127.0.0.1", listen), backlog=256)
    while True:
        client, _ = server.accept()
        threading.Thread(target=proxy_connection, args=(client, upstream, rate, burst, quickack),
                         daemon=True).start()


class Proxy:
    """The throttling proxy in front of `store`, a child process in a session of its own."""

    def __init__(self, store, work, rate, burst_kib, quickack=True):
        self.store, self.log, self.rate, self.burst_kib = store, work / "proxy.log", rate, burst_kib
        self.quickack = quickack
        self.proc = None

    def start(self):
        self.port = common.free_port()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--proxy",
                                      f"{self.port}:{self.store.port}", "--rate", str(self.rate), "--burst-kib",
                                      str(self.burst_kib), *([] if self.quickack else ["--no-quickack"])],
                                     stdin=subprocess.DEVNULL, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        object_store.wait_listening(self.proc, self.port, self.log, "the throttling proxy")

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def env(self):
        """The store's settings with the proxy as the endpoint: what blobgate and the direct client get."""
        return {**self.store.env(), "BLOBGATE_BLOB_STORE__ENDPOINT": self.endpoint}

    def stop(self):
        object_store.stop_group(self.proc, signal.SIGTERM)


# --- the measurements ---

def wait_ready(gate, secs=30):
    """Until the admin listener's /readyz answers 200 (the store reachable through the proxy)."""
    end, last = time.time() + secs, None
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{gate.admin}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError) as e:
            last = e
        time.sleep(0.05)
    fail(f"{gate.name}: /readyz not 200 after {secs} s ({last}); its log ends:\n{object_store.log_tail(gate.log)}")


def curl_times(url, size):
    """One curl of `url` to /dev/null on CPU 1, checked to be a 200 of `size` bytes: (TTFB, total) in seconds."""
    r = subprocess.run(["taskset", "-c", "1", "curl", "-s", "-o", "/dev/null", "-w",
                        "%{http_code} %{size_download} %{time_starttransfer} %{time_total}", url],
                       capture_output=True, text=True)
    fields = r.stdout.split()
    if r.returncode != 0 or len(fields) != 4 or fields[:2] != ["200", str(size)]:
        fail(f"GET {url}: curl exit {r.returncode}, answered {r.stdout!r} (wanted 200 and {size} bytes)")
    return float(fields[2]), float(fields[3])


def blobgate_cold(gate, size):
    """Restarts `gate` with an empty cache and reads the big object once: (TTFB, total)."""
    gate.stop()
    shutil.rmtree(gate.dd / "cache", ignore_errors=True)
    gate.start()
    wait_ready(gate)
    m0 = gate.metrics()
    times = curl_times(gate.url("big.bin"), size)
    fetched = gate.metrics().get(FETCHED, 0) - m0.get(FETCHED, 0)
    if fetched < size:
        fail(f"{gate.name}: the cold read fetched {fetched:.0f} bytes from the store, wanted {size}: was the "
             "cache emptied?")
    return times


DIRECT_GET = """
import sys, time, boto3
from botocore.config import Config
endpoint, bucket, key, size = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                  config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
s3.head_object(Bucket=bucket, Key=key)  # loads what a client's first call loads (models, endpoint rules)
s3._endpoint.http_session.close()       # and drops that call's connection: the GET opens its own
t0 = time.perf_counter()
body = s3.get_object(Bucket=bucket, Key=key)["Body"]
n = len(body.read(1))
t1 = time.perf_counter()
for chunk in body.iter_chunks(1 << 20):
    n += len(chunk)
t2 = time.perf_counter()
if n != size:
    sys.exit(f"read {n} bytes, wanted {size}")
print(t1 - t0, t2 - t0)
"""


def direct_get(proxy, key, size):
    """boto3 `get_object` of the store object through the proxy, in a Python process on CPU 1: (TTFB, total)."""
    r = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", DIRECT_GET, proxy.endpoint, STORE_BUCKET, key,
                        str(size)], capture_output=True, text=True, env=proxy.env())
    if r.returncode != 0:
        fail(f"boto3 get_object of {key}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    ttfb, total = (float(x) for x in r.stdout.split())
    return ttfb, total


def ratio_row(name, num, den):
    """A table row: the median (min-max) of the per-repetition ratios num/den."""
    ratios = [n / max(d, 1e-9) for n, d in zip(num, den)]
    row = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": ratios}
    print(f"| {name} | **{row['median']:.2f}** ({row['min']:.2f}-{row['max']:.2f}) |")
    return row


def report(times, reps, big_mib, rate):
    """Prints the tables; returns what --json writes."""
    ms = lambda s: f"{s * 1000:,.0f} ms"  # noqa: E731
    print(f"\n| cold read of {big_mib} MiB, store paced to {rate:g} MB/s per connection, {reps} reps | TTFB (median) "
          "| total (median) |\n|---|---|---|")
    out = {"cases": {}, "ratios": {}}
    for case in CASES:
        ttfb, total = [t for t, _ in times[case]], [t for _, t in times[case]]
        out["cases"][case] = {"ttfb_median": statistics.median(ttfb), "total_median": statistics.median(total),
                              "runs": times[case]}
        print(f"| {LABELS[case]} | {ms(statistics.median(ttfb))} | {ms(statistics.median(total))} |")
    for slice_mib in (8, 1):
        print(f"| (one {slice_mib} MiB slice at {rate:g} MB/s) | {ms((slice_mib << 20) / (rate * 1e6))} | |")
    print(f"\n| ratio, {reps} reps | median (min-max) of the per-repetition ratios |\n|---|---|")
    pairs = {"blobgate_direct": ("blobgate", "direct", "blobgate/direct"),
             "1mib_8mib": ("1mib-slices", "blobgate", "1 MiB slices/8 MiB slices"),
             "1mib_direct": ("1mib-slices", "direct", "1 MiB slices/direct")}
    for name, (num, den, label) in pairs.items():
        for i, what in ((0, "TTFB"), (1, "total")):
            out["ratios"][f"{name}_{what.lower()}"] = ratio_row(
                f"{what}, {label}", [t[i] for t in times[num]], [t[i] for t in times[den]])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of the three cases, the order alternating")
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--rate", type=float, default=50, help="store->client MB/s (10^6 B/s) per proxied connection")
    ap.add_argument("--burst-kib", type=int, default=64, help="the proxy's token bucket size")
    ap.add_argument("--no-quickack", action="store_true",
                    help="let the proxy delay its ACKs of the store's bytes (Linux's delayed ACK) as by default")
    ap.add_argument("--bin", help="blobgate binary (default: PROJECT/target/release/blobgate, built if missing)")
    ap.add_argument("--project", default=".", help="the source tree the binary reads config/default.toml from")
    ap.add_argument("--s3s-fs", help="s3s-fs binary (default: $BLOBGATE_TEST_S3S_FS, else where scripts/test "
                                     "installs it: ~/.cache/blobgate-tools/s3s-fs-0.14.1/bin/s3s-fs)")
    ap.add_argument("--json", help="write the medians, ratios and every run here")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (data dirs, logs)")
    ap.add_argument("--proxy", help=argparse.SUPPRESS)  # LISTEN:UPSTREAM: run as the throttling proxy
    a = ap.parse_args()
    if a.proxy:
        return serve_proxy(a.proxy, a.rate, a.burst_kib, not a.no_quickack)
    if a.rate <= 0 or a.burst_kib <= 0 or a.reps < 1 or a.big_mib < 1:
        fail("--rate, --burst-kib, --reps and --big-mib must be positive")

    project = common.set_project(a.project)
    for tool, hint in (("taskset", "util-linux"), ("curl", "apt install curl")):
        need(tool, hint)
    s3s_fs = object_store.s3s_fs_binary(a.s3s_fs)
    try:
        import boto3  # noqa: F401  (the direct client; it runs in a child process)
    except ImportError:
        fail("boto3 is missing (pip install boto3)")
    binary = object_store.release_binary(a.bin, project)
    # SIGTERM (e.g. a timeout) unwinds through the finally below, so no server outlives the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("cold_ttfb: terminated"))

    work = Path(tempfile.mkdtemp(prefix="cold-ttfb-"))
    size = a.big_mib << 20
    store = object_store.Store(s3s_fs, work)
    proxy = Proxy(store, work, a.rate, a.burst_kib, quickack=not a.no_quickack)
    gates = {}
    try:
        # A copy of the binary: a rebuild of the tree during the run must not change what the servers run.
        shutil.copy2(binary, work / "blobgate")
        sha = common.write_test_file(work / "big.bin", a.big_mib)
        store.start()
        proxy.start()
        gates["blobgate"] = object_store.Gate("slices-8mib", work / "blobgate", work, proxy.env())
        gates["1mib-slices"] = object_store.Gate("slices-1mib", work / "blobgate", work,
                                                 {**proxy.env(), "BLOBGATE_CACHE__SLICE_BYTES": str(1 << 20)})
        first = gates["blobgate"]
        first.cli("bucket", "create", BUCKET, "--public")
        put = json.loads(first.cli("put", BUCKET, "big.bin", str(work / "big.bin")))["sha256"]
        if put != sha:
            fail(f"put's sha256 {put} is not the file's {sha}")
        # The second server is a copy of the first's data dir, as two replicas of one deployment: the same catalog
        # and the same secrets key, which seals the blob's slice manifest in the store (another key: quarantined).
        shutil.copytree(first.dd, gates["1mib-slices"].dd)
        key = store.key_of(sha)
        store_file = store.root / STORE_BUCKET / key
        if not store_file.is_file() or store_file.stat().st_size != size:
            fail(f"the object's store copy is not at {store_file}")
        for gate in gates.values():
            gate.start()
            wait_ready(gate)
        print(f"binary {binary} (run as a copy); s3s-fs at {store.endpoint}, paced to {a.rate:g} MB/s per "
              f"connection by the proxy at {proxy.endpoint}; work dir {work}", flush=True)
        direct_get(proxy, key, size)  # the first run compiles boto3's .pyc files and such

        times = {case: [] for case in CASES}
        for rep in range(a.reps):
            for case in (CASES if rep % 2 == 0 else CASES[::-1]):
                if case == "direct":
                    ttfb, total = direct_get(proxy, key, size)
                else:
                    ttfb, total = blobgate_cold(gates[case], size)
                times[case].append((ttfb, total))
                print(f"rep {rep + 1} {case:12}: TTFB {ttfb * 1000:8.1f} ms, total {total:.3f} s "
                      f"({size / 1e6 / total:,.0f} MB/s)", flush=True)
        result = {"binary": str(binary), "big_mib": a.big_mib, "rate_mb_per_s": a.rate, "burst_kib": a.burst_kib,
                  "quickack": not a.no_quickack,
                  "reps": a.reps, **report(times, a.reps, a.big_mib, a.rate)}
    finally:
        for gate in gates.values():
            gate.stop()
        proxy.stop()
        store.stop()
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
