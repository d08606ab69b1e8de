#!/usr/bin/env python3
"""Blobs in an S3-compatible object store against blobs in the data dir, side by side in one run.

Two `blobgate serve` processes from the same binary, both pinned to CPU 0 and both up for the whole run, each with
its own data dir holding the same public bucket `pub` with the same two objects (a --big-mib object and a 4 KiB
one): one in local mode (blobs in the data dir), one with `BLOBGATE_BLOB_STORE__URL` on s3s-fs (Rust, a directory
served as S3; moto is Python and would be the bottleneck of the cold reads), its data dir only a cache.

  warm  The store server's cache is filled first by one full read of each object (checked by SHA-256 for the big
        one). Then --reps repetitions, each measuring both servers (the order alternating): server CPU seconds per
        GiB over --rounds sequential curl downloads of the big object (one connection each, to /dev/null; CPU from
        every thread's /proc/PID/task/TID/schedstat, as scaling.py and s3_bench.py's `cpu` case: a GiB is a few
        hundred milliseconds, tens of clock ticks in /proc/PID/stat), and 4 KiB req/s with wrk as compare.py's
        `small` case (1 thread, 64 keep-alive connections, on CPU 1; anonymous GETs of the public object).
        /metrics must show blobgate_blob_store_bytes_fetched_total unchanged over the measured part: warm reads
        fetch nothing. Target: the ratio object store/local within 5% for both.
        --reread-cache adds a third server on the same store whose cache file, once filled, has its pages dropped
        (posix_fadvise DONTNEED) and read again sequentially: the same bytes served by the same code, but from the
        page-cache folios readahead makes rather than those the fill's writes left (the fill writes what the
        network delivers, a few thousand pwrite64 per 256 MiB, most of them not page-aligned, and sendfile from
        small folios costs more CPU per byte). The difference between the two store columns is that layout.
        Before the measured part, each server's big file (blob or cache file) is counted in page-cache folios
        (/proc/self/pagemap and /proc/kpageflags; printed when run as root).
  cold  --reps repetitions, alternating: the store server is stopped, its data dir's `cache/` removed and the
        server started again, then curl reads the big object once (time from start to last byte, MB/s = 10^6 B/s);
        beside it, `aws s3 cp s3://BUCKET/PREFIX/ab/cd/<sha256> /dev/null --endpoint-url ...` of the same store
        object, and a boto3 `download_fileobj` of it into /dev/null (s3transfer, the engine of `aws s3 cp`, with
        the same defaults: 8 MiB ranged GETs, 10 threads), timed from the call to its return: aws's wall time
        includes its own start-up (Python, half a second to a second here), which the boto3 figure leaves out.
        The store's file is in the page cache for all three, so this measures the fetch pipeline, not a disk.

Pinning: blobgate on CPU 0, curl, wrk, aws and boto3 on CPU 1; s3s-fs is not pinned (the store side of a cold read is
neither the server under test nor its client). On a two-core machine the upstream shares the cores with both.

Usage (from the project root; builds target/release/blobgate with `cargo build --release` if it is missing):
    python3 scripts/bench/object_store.py [--reps 5] [--big-mib 256] [--rounds 4] [--secs 5] [--reread-cache]
                                          [--only warm,cold] [--bin target/release/blobgate] [--s3s-fs PATH]
                                          [--json OUT] [--keep]
Quote the ratios, never the absolute figures.
"""
import argparse, hashlib, json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import scaling  # noqa: E402  (schedstat CPU accounting)

BUCKET = "pub"                                     # the public blobgate bucket both servers serve
STORE_BUCKET, STORE_PREFIX = "bench-blobs", "gate"  # s3s-fs wants bucket names of 3 characters or more
ACCESS_KEY, SECRET_KEY = "bench-store-key", "bench-store-secret"
FETCHED = "blobgate_blob_store_bytes_fetched_total"
HITS, MISSES = "blobgate_blob_cache_hits_total", "blobgate_blob_cache_misses_total"


def fail(msg):
    raise SystemExit(f"object_store: {msg}")


def need(tool, hint):
    path = shutil.which(tool) if "/" not in tool else (tool if os.access(tool, os.X_OK) else None)
    if not path:
        fail(f"{tool} is missing ({hint})")
    return path


def s3s_fs_binary(explicit):
    """The s3s-fs to run: `explicit`, else $BLOBGATE_TEST_S3S_FS, else where scripts/test installs it."""
    tools = Path(os.environ.get("BLOBGATE_TOOLS") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                 / "blobgate-tools")
    return need(explicit or os.environ.get("BLOBGATE_TEST_S3S_FS") or str(tools / "s3s-fs-0.14.1/bin/s3s-fs"),
                "scripts/test installs it (into ~/.cache/blobgate-tools)")


def release_binary(explicit, project):
    """`explicit`, else PROJECT/target/release/blobgate, built with `cargo build --release` if missing."""
    if explicit is None and not (project / "target/release/blobgate").exists():
        print("building target/release/blobgate (cargo build --release) ...", flush=True)
        subprocess.run(["cargo", "build", "--release"], cwd=project, check=True)
    return common.binary(explicit)


def clean_env():
    """This process's environment without any BLOBGATE_ or AWS_ setting, so that local mode is local mode."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("BLOBGATE_", "AWS_"))}


def log_tail(path, lines=20):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_group(proc, sig=signal.SIGINT):
    """Stops a process started with start_new_session (its group is its own), then waits for it."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=10)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def wait_listening(proc, port, log, what, secs=30):
    end = time.time() + secs
    while time.time() < end:
        if proc.poll() is not None:
            fail(f"{what} exited at start (status {proc.returncode}); its log ends:\n{log_tail(log)}")
        try:
            common.wait_port(port, tries=1)
            return
        except RuntimeError:
            pass
    fail(f"{what} does not listen on {port} after {secs} s; its log ends:\n{log_tail(log)}")


class Store:
    """s3s-fs serving `root` (a bucket is a directory under it) with one access key."""

    def __init__(self, binary, work):
        self.bin, self.root, self.log = binary, work / "store-root", work / "s3s-fs.log"
        (self.root / STORE_BUCKET).mkdir(parents=True)
        self.proc = None

    def start(self):
        self.port = common.free_port()
        self.proc = subprocess.Popen([self.bin, "--host", "127.0.0.1", "--port", str(self.port), "--access-key",
                                      ACCESS_KEY, "--secret-key", SECRET_KEY, str(self.root)],
                                     stdin=subprocess.DEVNULL, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=clean_env())
        wait_listening(self.proc, self.port, self.log, "s3s-fs")

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def env(self):
        """What a blobgate process needs to keep its blobs here, and what aws needs to read them."""
        return {**clean_env(), "BLOBGATE_BLOB_STORE__URL": f"s3://{STORE_BUCKET}/{STORE_PREFIX}",
                "BLOBGATE_BLOB_STORE__ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}

    def key_of(self, sha256):
        return f"{STORE_PREFIX}/{sha256[:2]}/{sha256[2:4]}/{sha256}"

    def stop(self):
        stop_group(self.proc, signal.SIGTERM)


class Gate:
    """`blobgate serve` on a data dir of its own, pinned to CPU 0, run in the project tree with `env`."""

    def __init__(self, name, binary, work, env):
        self.name, self.bin, self.env = name, str(binary), env
        self.dd, self.log = work / f"{name}-data", work / f"{name}.log"
        self.proc = None

    def cli(self, *args):
        r = subprocess.run([self.bin, "--data-dir", str(self.dd), *args], capture_output=True, text=True,
                           cwd=common.PROJECT, env=self.env)
        if r.returncode != 0:
            fail(f"{self.name}: blobgate {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
        return r.stdout

    def start(self):
        self.port, self.admin = common.free_port(), common.free_port()
        self.proc = subprocess.Popen(["taskset", "-c", "0", self.bin, "--data-dir", str(self.dd), "serve",
                                      "--listen", f"127.0.0.1:{self.port}", "--admin-listen",
                                      f"127.0.0.1:{self.admin}"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=open(self.log, "ab"),
                                     start_new_session=True, cwd=common.PROJECT, env=self.env)
        wait_listening(self.proc, self.admin, self.log, f"blobgate ({self.name})")
        wait_listening(self.proc, self.port, self.log, f"blobgate ({self.name})")

    def stop(self):
        stop_group(self.proc)

    def url(self, key):
        return f"http://127.0.0.1:{self.port}/{BUCKET}/{key}"

    def metrics(self):
        """The unlabelled samples of /metrics, by name."""
        out = subprocess.run(["curl", "-sf", f"http://127.0.0.1:{self.admin}/metrics"], capture_output=True,
                             text=True)
        if out.returncode != 0:
            fail(f"{self.name}: GET /metrics failed (curl exit {out.returncode})")
        return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_]+) (\S+)$", out.stdout, re.M)}

    def cpu(self):
        return scaling.run_seconds(self.proc.pid)


def download(url, size):
    """One curl of `url` to /dev/null on CPU 1, checked to be a 200 of `size` bytes; its wall time in seconds."""
    t0 = time.perf_counter()
    r = subprocess.run(["taskset", "-c", "1", "curl", "-s", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                        url], capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if r.returncode != 0 or r.stdout != f"200 {size}":
        fail(f"GET {url}: curl exit {r.returncode}, answered {r.stdout!r} (wanted '200 {size}')")
    return elapsed


def sha256_of_url(url):
    """SHA-256 of a body, read through curl on CPU 1."""
    digest = hashlib.sha256()
    with subprocess.Popen(["taskset", "-c", "1", "curl", "-sf", url], stdout=subprocess.PIPE) as p:
        for chunk in iter(lambda: p.stdout.read(1 << 20), b""):
            digest.update(chunk)
    if p.returncode != 0:
        fail(f"GET {url}: curl exit {p.returncode}")
    return digest.hexdigest()


def aws_copy(store, key):
    """`aws s3 cp` of a store object to /dev/null on CPU 1: its wall time in seconds."""
    cmd = ["taskset", "-c", "1", "aws", "s3", "cp", f"s3://{STORE_BUCKET}/{key}", "/dev/null", "--endpoint-url",
           store.endpoint, "--no-progress", "--only-show-errors"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=store.env())
    elapsed = time.perf_counter() - t0
    if r.returncode != 0:
        fail(f"{' '.join(cmd[3:])}: exit {r.returncode}: {r.stderr.strip()}")
    return elapsed


BOTO3_GET = """
import sys, time, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1")
with open("/dev/null", "wb") as f:
    t0 = time.perf_counter()
    s3.download_fileobj(sys.argv[2], sys.argv[3], f)
    print(time.perf_counter() - t0)
"""


def boto3_copy(store, key):
    """boto3's download_fileobj of a store object into /dev/null, in a Python process on CPU 1: the seconds of
    the call alone (the interpreter's and boto3's start-up left out)."""
    r = subprocess.run(["taskset", "-c", "1", sys.executable, "-c", BOTO3_GET, store.endpoint, STORE_BUCKET, key],
                       capture_output=True, text=True, env=store.env())
    if r.returncode != 0:
        fail(f"boto3 download_fileobj of {key}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    return float(r.stdout.strip())


LABELS = {"store": "object store", "reread": "object store, cache file re-read"}


def reread_cache(gate, size):
    """Drops the page cache of `gate`'s complete cache file of `size` bytes and reads it again sequentially, so
    that its pages are the ones readahead makes rather than the ones the fill's writes made."""
    end = time.time() + 30
    while True:  # the fill renames the file `.c` once it is whole and fsynced, just after the response
        files = [f for f in (gate.dd / "cache").rglob("*.c") if f.stat().st_size == size]
        if files:
            break
        if time.time() > end:
            fail(f"{gate.name}: no complete {size}-byte cache file under {gate.dd / 'cache'}")
        time.sleep(0.1)
    fd = os.open(files[0], os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 1 << 20):
            pass
    finally:
        os.close(fd)


def folios(path):
    """(folios, 4 KiB pages) of `path`'s page cache, or None where /proc/kpageflags cannot be read (it needs root):
    the file is mapped and each page touched, then each page's frame is looked up in /proc/self/pagemap and its
    compound-page flags in /proc/kpageflags (a tail page belongs to the folio before it)."""
    import mmap, struct
    size = os.path.getsize(path)
    try:
        # Unbuffered: a buffered reader would answer later seeks from entries read before their pages were touched.
        pagemap = open("/proc/self/pagemap", "rb", buffering=0)
        kflags = open("/proc/kpageflags", "rb", buffering=0)
    except OSError:
        return None
    with open(path, "rb") as f, pagemap, kflags:
        mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        try:
            page = 4096
            start = None
            real = os.path.realpath(path)
            for line in open("/proc/self/maps"):
                if line.rstrip().endswith(" " + real):
                    start = int(line.split("-")[0], 16)
            if start is None:
                return None
            count = 0
            for i in range(size // page):
                mapped[i * page]  # maps the cached page (the file is in the page cache: no disk read)
                pagemap.seek((start // page + i) * 8)
                entry = struct.unpack("<Q", pagemap.read(8))[0]
                pfn = entry & ((1 << 55) - 1)
                if not entry >> 63 or not pfn:
                    return None
                kflags.seek(pfn * 8)
                if not struct.unpack("<Q", kflags.read(8))[0] & (1 << 16):  # KPF_COMPOUND_TAIL
                    count += 1
            return count, size // page
        finally:
            mapped.close()


def big_file(gate, size):
    """The file of `size` bytes in `gate`'s data dir: the blob (local mode) or its cache file (object store)."""
    files = [f for f in gate.dd.rglob("*") if f.is_file() and f.stat().st_size == size]
    return files[0] if len(files) == 1 else None


def cpu_per_gib(gate, rounds, size):
    c0 = gate.cpu()
    for _ in range(rounds):
        download(gate.url("big.bin"), size)
    return (gate.cpu() - c0) / (rounds * size / (1 << 30))


def small_rps(gate, secs):
    rps, errors, _ = common.wrk(gate.url("small.bin"), secs)
    if errors:
        fail(f"{gate.name}: {errors} non-2xx answers under wrk")
    return rps


def table(name, a, b, fmt, reps):
    ratios = [y / max(x, 1e-9) for x, y in zip(a, b)]
    row = {"first": statistics.median(a), "second": statistics.median(b), "ratio_median": statistics.median(ratios),
           "ratio_min": min(ratios), "ratio_max": max(ratios), "runs": [a, b]}
    print(f"| {name} | {fmt.format(row['first'])} | {fmt.format(row['second'])} | "
          f"{row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f} over {reps}) |")
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions of each part")
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="downloads of the big object per CPU measurement")
    ap.add_argument("--secs", type=int, default=5, help="wrk seconds per 4 KiB measurement")
    ap.add_argument("--bin", help="blobgate binary (default: PROJECT/target/release/blobgate, built if missing)")
    ap.add_argument("--project", default=".", help="the source tree the binary reads config/default.toml from")
    ap.add_argument("--s3s-fs", help="s3s-fs binary (default: $BLOBGATE_TEST_S3S_FS, else where scripts/test "
                                     "installs it: ~/.cache/blobgate-tools/s3s-fs-0.14.1/bin/s3s-fs)")
    ap.add_argument("--only", default="warm,cold")
    ap.add_argument("--reread-cache", action="store_true",
                    help="warm part: a third server, on the same store, whose cache file's pages are dropped and "
                         "read again (by readahead) after the fill")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (data dirs, logs)")
    a = ap.parse_args()
    only = set(a.only.split(","))
    project = common.set_project(a.project)
    for tool, hint in (("taskset", "util-linux"), ("curl", "apt install curl"), ("wrk", "apt install wrk"),
                       ("aws", "pip install awscli")):
        need(tool, hint)
    s3s_fs = s3s_fs_binary(a.s3s_fs)
    if "cold" in only:
        try:
            import boto3  # noqa: F401  (the cold part's direct client; it runs in a child process)
        except ImportError:
            fail("boto3 is missing (pip install boto3)")
    binary = release_binary(a.bin, project)
    # SIGTERM (e.g. a timeout) unwinds through the finally below, so no server outlives the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("object_store: terminated"))

    work = Path(tempfile.mkdtemp(prefix="object-store-"))
    big_size = a.big_mib << 20
    store, gates = Store(s3s_fs, work), {}
    result = {"binary": str(binary)}
    try:
        # A copy of the binary: a rebuild of the tree during the run must not change what the servers run.
        shutil.copy2(binary, work / "blobgate")
        big_sha = common.write_test_file(work / "big.bin", a.big_mib)
        (work / "small.bin").write_bytes(os.urandom(4096))
        store.start()
        gates["local"] = Gate("local", work / "blobgate", work, clean_env())
        gates["store"] = Gate("store", work / "blobgate", work, store.env())
        if a.reread_cache and "warm" in only:
            gates["reread"] = Gate("reread", work / "blobgate", work, store.env())
        shas = {}
        for name, gate in gates.items():
            gate.cli("bucket", "create", BUCKET, "--public")
            for f in ("big.bin", "small.bin"):
                shas[f] = json.loads(gate.cli("put", BUCKET, f, str(work / f)))["sha256"]
        if shas["big.bin"] != big_sha:
            fail(f"put's sha256 {shas['big.bin']} is not the file's {big_sha}")
        store_file = store.root / STORE_BUCKET / store.key_of(big_sha)
        if not store_file.is_file() or store_file.stat().st_size != big_size:
            fail(f"the big object's store copy is not at {store_file}")
        for name in gates:
            if name != "local" and any(f.is_file() and f.stat().st_size == big_size for f in gates[name].dd.rglob("*")):
                fail(f"{name}: the data dir holds the big blob before any read: is BLOBGATE_BLOB_STORE__URL honoured?")
        for gate in gates.values():
            gate.start()
        print(f"binary {binary} (run as a copy); s3s-fs at {store.endpoint}; work dir {work}", flush=True)

        if "warm" in only:
            for name, gate in gates.items():  # fills the store servers' caches, and every page cache
                if sha256_of_url(gate.url("big.bin")) != big_sha:
                    fail(f"{name}: the big object's body does not hash to its sha256")
                download(gate.url("small.bin"), 4096)
            if "reread" in gates:
                reread_cache(gates["reread"], big_size)
            stores = [name for name in gates if name != "local"]
            for name, gate in gates.items():
                path = big_file(gate, big_size)
                count = folios(path) if path else None
                if count:
                    print(f"{name}: the big object's file is {count[0]:,} page-cache folios ({count[1]:,} pages, "
                          f"{big_size / count[0] / 1024:.0f} KiB per folio on average)", flush=True)
                    result.setdefault("folios", {})[name] = count[0]
            m0 = {name: gates[name].metrics() for name in stores}
            for name in stores:
                if m0[name].get(FETCHED, 0) < big_size + 4096:
                    fail(f"{name}: the warming reads fetched {m0[name].get(FETCHED, 0):.0f} bytes from the store, "
                         f"wanted {big_size + 4096}")
            cpu = {name: [] for name in gates}
            rps = {name: [] for name in gates}
            for rep in range(a.reps):
                order = list(gates) if rep % 2 == 0 else list(reversed(gates))
                for name in order:
                    cpu[name].append(cpu_per_gib(gates[name], a.rounds, big_size))
                    rps[name].append(small_rps(gates[name], a.secs))
                    print(f"warm rep {rep + 1} {name:6}: {cpu[name][-1]:.3f} CPU s/GiB, {rps[name][-1]:,.0f} req/s "
                          "(4 KiB)", flush=True)
            result["warm"] = {}
            for name in stores:
                m1 = gates[name].metrics()
                fetched = m1.get(FETCHED, 0) - m0[name].get(FETCHED, 0)
                hits, misses = m1.get(HITS, 0) - m0[name].get(HITS, 0), m1.get(MISSES, 0) - m0[name].get(MISSES, 0)
                print(f"{name} server over the measured part: {fetched:.0f} bytes fetched from the store, "
                      f"{hits:,.0f} cache hits, {misses:.0f} misses")
                if fetched != 0 or misses != 0:
                    fail(f"{name}: the warm part fetched {fetched:.0f} bytes ({misses:.0f} misses): the cache was "
                         "not warm")
                result["warm"][f"{name}_store_bytes_fetched"] = fetched
                result["warm"][f"{name}_cache_hits"] = hits
            for name in stores:
                print(f"\n| warm cache, {a.reps} reps | local (median) | {LABELS[name]} (median) | "
                      f"ratio {name}/local: median (min-max) |\n|---|---|---|---|")
                result["warm"][name] = {
                    "cpu_s_per_gib": table(f"server CPU per GiB, {a.big_mib} MiB downloads", cpu["local"],
                                           cpu[name], "{:.3f} s", a.reps),
                    "req_per_s": table("4 KiB req/s, 64 keep-alive connections", rps["local"], rps[name],
                                       "{:,.0f}", a.reps)}
            print(flush=True)

        if "cold" in only:
            gate = gates["store"]
            big_key, small_key = store.key_of(big_sha), store.key_of(shas["small.bin"])
            aws_copy(store, small_key)  # aws's first run compiles its .pyc files and such
            boto3_copy(store, small_key)
            mbps = {"blobgate": [], "aws": [], "boto3": []}
            for rep in range(a.reps):
                order = ["blobgate", "aws", "boto3"]
                for name in (order if rep % 2 == 0 else order[::-1]):
                    if name == "blobgate":
                        gate.stop()
                        shutil.rmtree(gate.dd / "cache", ignore_errors=True)
                        gate.start()
                        m0 = gate.metrics()
                        secs = download(gate.url("big.bin"), big_size)
                        m1 = gate.metrics()
                        if m1.get(FETCHED, 0) - m0.get(FETCHED, 0) < big_size:
                            fail(f"the cold read fetched {m1.get(FETCHED, 0) - m0.get(FETCHED, 0):.0f} bytes from "
                                 f"the store, wanted {big_size}: was the cache emptied?")
                    elif name == "aws":
                        secs = aws_copy(store, big_key)
                    else:
                        secs = boto3_copy(store, big_key)
                    mbps[name].append(big_size / 1e6 / secs)
                    print(f"cold rep {rep + 1} {name:8}: {secs:.3f} s, {mbps[name][-1]:,.0f} MB/s", flush=True)
            print(f"\n| cold read of {a.big_mib} MiB, {a.reps} reps | store client (median) | "
                  "blobgate, empty cache (median) | ratio blobgate/client: median (min-max) |\n|---|---|---|---|")
            result["cold"] = {
                "aws_mb_per_s": table("MB/s against `aws s3 cp` (wall time, start-up included)", mbps["aws"],
                                      mbps["blobgate"], "{:,.0f}", a.reps),
                "boto3_mb_per_s": table("MB/s against boto3 `download_fileobj` (the transfer only)", mbps["boto3"],
                                        mbps["blobgate"], "{:,.0f}", a.reps)}
    finally:
        for gate in gates.values():
            gate.stop()
        store.stop()
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
