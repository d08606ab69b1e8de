#!/usr/bin/env python3
"""Millions of objects (issue 47, item 4): catalogs of 10^3, 10^6 and 10^7 objects on SQLite and 10^6 on
PostgreSQL, each with start-up, memory, 4 KiB GETs over random and hot keys, listing and maintenance measured in one
run, beside nginx serving 10^6 files from a directory tree as the anchor. Servers are pinned to CPU 0 and clients
to CPU 1 (compare.py's wrapper); wrk runs as compare.py's `small` case (1 thread, 64 keep-alive connections), with a
bearer token on a private bucket (auth, metrics and stats on); nginx serves the plain files.

Catalogs. Each starts as a real data dir made by the CLI (`bucket create bench`, a `put` of one 4 KiB object as
`k/00/00/00000000`, a read token, a read S3 key), then rows are bulk-inserted beside that real one, all naming its
blob, keys `k/{i % 100:02}/{i // 100 % 100:02}/{i:08}` for i < N (the Lua scripts compute a key from an integer):
  SQLite      one transaction: `INSERT … SELECT` from a recursive CTE copying the real row, its trigger writing one
              change-log row per object, and a second change-log row per object copied as a `put` leaves two (the
              prune then has 2N rows, as after any bulk load or `import`); then `wal_checkpoint(TRUNCATE)`.
  PostgreSQL  (--postgres, 10^6, a cluster from `scripts/pg-cluster`) one `INSERT … SELECT FROM generate_series` with
              triggers off for the session, then two change-log rows per object inserted directly, dated two hours
              ago so that the prune (by age, an hour) takes them; `ANALYZE`.
Beside the N keys, min(--blobs, N/10) objects `d/{i:07}` each name a distinct small blob file (content `scale blob
i`, named by its real SHA-256 under blobs/aa/bb/, mtime two hours ago, so the start-up sweep looks each one up), and
before the first start min(--orphans, blobs/100) old blob files that no row names are planted, for the sweep to
find and remove.
The "empty" catalog (the CLI's single object, no other blob) is the start-up baseline. Build times on this 2-core
machine, which two other engineers' builds loaded (each run prints its own): SQLite 10^3 in under a second; 10^5
(10^4 blobs) in 3 s (rows 2 s); 10^6 (10^5 blobs) in 73 s at load 5 and 188 s at load 12 to 20 (blob files 74 s,
rows 114 s), so about a minute on a quiet machine; 10^7, not run, by extrapolation about ten times the 10^6 rows
(5 to 20 minutes, the B-tree a level deeper) plus the same 10^5 blob files, and ~7 GB of disk (the 10^6 database
is 330 MB; the WAL grows as large until the checkpoint). PostgreSQL 10^5 in 3 s (rows 1.8 s), so 10^6 in about
30 s. nginx's tree is --nginx-files hard links to a 4 KiB file (one copy per 60,000 links, ext4's limit) under
bench/k/aa/bb/: 46 s for 10^6, kept between runs in the work dir with its count.

Measured, each catalog side by side:
  start-up      process start until the data listener answers a GET of the real object, median of --starts starts
                (catalogs interleaved, no orphans: the acceptance's case), and its ratio to the empty catalog's.
  sweep         the first start, orphans planted: start until they are gone (the start-up sweep's end, wherever
                it runs), and the longest write-lock hold from the start to then; RSS then.
  prune         the change-log prune, which `serve` runs once a minute (first a minute after start-up): from the
                first row gone to the last; its longest write-lock hold; RSS idle once it is over.
  write lock    SQLite only: a probe thread on the database does `BEGIN IMMEDIATE; COMMIT` every millisecond
                without a busy timeout, retrying every 0.2 ms, and records the longest hold it saw (LockProbe:
                from its first busy try to the lock, its own scheduling stalls left out; holds under 0.5 ms count
                as 0). The longest hold while the server idled before the prune is the probe's noise floor (0
                unless something else writes). Back-to-back transactions with gaps shorter than a retry (the
                prune's batches) read as one hold: the wait another process's writer would see. PostgreSQL has no database-wide write lock: there only durations
                are reported. Durations are polled: every 5 ms (sweep) or 10 ms (prune; on PostgreSQL a psql call,
                some 30 ms), so a prune shorter than a poll reads 0.
  GETs          req/s and server CPU per request (schedstat over the run / requests) for random keys over the whole
                key space and for one hot key (the same Lua script with a key space of 1, so the client costs the
                same), --rounds rounds of --secs, catalogs and nginx interleaved, the order alternating.
  first read    before the GET rounds, min(N, --distinct) distinct keys read in sequence (wrk in chunks, at most
                --distinct-secs): each key's first read, a miss; its req/s (and its ratio to the hot key's) and CPU
                per request. The rounds then measure the steady state (with a bound below the catalog's
                size, mostly misses still).
  RSS after     after that first read of every key.
  listing       ListObjectsV2 (SigV4 by botocore, pages of 1,000) over the prefix `k/07/` (N/100 keys): keys/s;
                `blobgate ls bench` over the whole bucket: seconds and keys/s.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/scale.py [--sizes 1e3,1e6] [--postgres] [--rounds 3] [--secs 8] [--starts 3]
                                   [--blobs 100000] [--orphans 1000] [--distinct 1000000] [--nginx-files N]
                                   [--bin target/release/blobgate] [--project .] [--json OUT]
--sizes 1e3,1e6,1e7 adds the 10^7 catalog. Develop with `--sizes 1e3,1e5`. Quote the ratios, not absolute figures.
"""
import argparse, hashlib, http.client, json, os, re, shutil, signal, sqlite3, statistics, subprocess, threading, time
from pathlib import Path

import common
import s3_bench  # (botocore's SigV4 signing and S3's canonical query)
import scaling  # (schedstat CPU accounting)
from common import compare, stop_all

WORK = compare.WORK / "scale"
REAL_KEY = "k/00/00/00000000"
LIST_PREFIX = "k/07/"
TWO_HOURS_AGO = time.time() - 7200  # older than the default sweep grace (1 h)

LUA = """-- Keys as scale.py's object_key: {mode} over {n} keys.
local n, start, sent = {n}, {start}, 0
request = function()
  local i
  if "{mode}" == "sequence" then i = (start + sent) % n; sent = sent + 1 else i = math.random(0, n - 1) end
  return wrk.format(nil, string.format("/bench/k/%02d/%02d/%08d", i % 100, math.floor(i / 100) % 100, i))
end
"""


def object_key(i):
    return f"k/{i % 100:02d}/{i // 100 % 100:02d}/{i:08d}"


def lua_script(mode, n, start=0):
    """A wrk script asking keys 0..n-1 at random, or in sequence from `start`."""
    path = WORK / f"{mode}-{n}.lua"  # wrk reads it at its start: the next chunk of a sequence may overwrite it
    path.write_text(LUA.format(mode=mode, n=n, start=start))
    return path


def blob_content(i):
    """The distinct blob of object `d/{i:07}`."""
    return f"scale blob {i}\n".encode()


def plant_blob(data_dir, content, mtime):
    """A blob file as the store names it (blobs/aa/bb/SHA256 of its content), last written at `mtime`."""
    sha = hashlib.sha256(content).hexdigest()
    d = data_dir / "blobs" / sha[:2] / sha[2:4]
    d.mkdir(parents=True, exist_ok=True)
    path = d / sha
    path.write_bytes(content)
    os.utime(path, (mtime, mtime))
    return sha, path


def psql(url, *commands, stdin=None):
    cmd = ["psql", url, "-v", "ON_ERROR_STOP=1", "-Atq"] + [a for c in commands for a in ("-c", c)]
    return subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True).stdout


class Catalog(common.Gate):
    """A data dir of `objects` keys (see the module's doc), on SQLite or on PostgreSQL (`database_url`)."""

    def __init__(self, name, binary, objects, blobs, orphans, small, database_url=None):
        super().__init__(name, binary, WORK, database_url)
        self.objects, self.blobs, self.orphans = objects, blobs, orphans
        started = time.perf_counter()
        self.cli("put", "bench", REAL_KEY, str(small))
        self.token = self.read_token()
        self.key_id, self.secret = self.cli("s3-key", "create", "--bucket", "bench", "--scope", "read").split()
        blob_rows = [plant_blob(self.dd, blob_content(i), TWO_HOURS_AGO)[0] for i in range(blobs)]
        self.blob_secs = time.perf_counter() - started
        if database_url:
            self.fill_postgres(blob_rows)
        else:
            self.fill_sqlite(blob_rows)
        self.build_secs = time.perf_counter() - started
        self.orphan_paths = []

    def fill_sqlite(self, blob_rows):
        db = sqlite3.connect(self.dd / "blobgate.db", isolation_level=None)
        db.execute("BEGIN")
        db.execute(
            "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) "
            "INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition, "
            "created_at, updated_at) "
            "SELECT o.bucket_id, printf('k/%02d/%02d/%08d', n.i % 100, n.i / 100 % 100, n.i), o.sha256, o.size, "
            "o.content_type, o.cache_control, o.content_disposition, o.created_at, o.updated_at "
            "FROM n, objects o WHERE n.i > 0 AND o.key = ?", (self.objects, REAL_KEY))
        db.execute("INSERT INTO cache_changes (kind, bucket_id, name) "
                   "SELECT 'object', bucket_id, key FROM objects WHERE key <> ?", (REAL_KEY,))
        bucket_id, created = db.execute("SELECT bucket_id, created_at FROM objects WHERE key = ?",
                                        (REAL_KEY,)).fetchone()
        db.executemany("INSERT INTO objects (bucket_id, key, sha256, size, created_at, updated_at) "
                       "VALUES (?, ?, ?, ?, ?, ?)",
                       ((bucket_id, f"d/{i:07d}", sha, len(blob_content(i)), created, created)
                        for i, sha in enumerate(blob_rows)))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count = db.execute("SELECT count(*) FROM objects").fetchone()[0]
        db.close()
        if count != self.objects + len(blob_rows):
            raise RuntimeError(f"{self.name}: {count} objects after the fill")

    def fill_postgres(self, blob_rows):
        url = self.database_url
        psql(url, "SET session_replication_role = replica",
             "INSERT INTO objects (bucket_id, key, sha256, size, content_type, cache_control, content_disposition, "
             "created_at, updated_at) "
             "SELECT o.bucket_id, 'k/' || lpad((i % 100)::text, 2, '0') || '/' || lpad((i / 100 % 100)::text, 2, '0') "
             "|| '/' || lpad(i::text, 8, '0'), o.sha256, o.size, o.content_type, o.cache_control, "
             f"o.content_disposition, o.created_at, o.updated_at FROM generate_series(1, {self.objects - 1}) i, "
             f"objects o WHERE o.key = '{REAL_KEY}'",
             "INSERT INTO cache_changes (kind, bucket_id, name, created_at) "
             "SELECT 'object', bucket_id, key, now() - interval '2 hours' FROM objects, generate_series(1, 2) "
             f"WHERE key <> '{REAL_KEY}'")
        bucket_id, created = psql(url, f"SELECT bucket_id, created_at FROM objects WHERE key = '{REAL_KEY}'"
                                  ).strip().split("|")
        rows = "".join(f"{bucket_id}\td/{i:07d}\t{sha}\t{len(blob_content(i))}\t{created}\t{created}\n"
                       for i, sha in enumerate(blob_rows))
        psql(url, "SET session_replication_role = replica",
             "COPY objects (bucket_id, key, sha256, size, created_at, updated_at) FROM STDIN", stdin=rows)
        psql(url, "ANALYZE")

    def plant_orphans(self):
        """Old blob files no row names, for the next start's sweep to remove (its end is when they are gone)."""
        self.orphan_paths = [plant_blob(self.dd, f"scale orphan {i}\n".encode(), TWO_HOURS_AGO)[1]
                             for i in range(self.orphans)]

    def change_log(self):
        """(oldest, newest) change-log sequence numbers; (None, None) when it is empty."""
        sql = "SELECT min(seq), max(seq) FROM cache_changes"
        if self.database_url:
            return tuple(int(v) if v else None for v in psql(self.database_url, sql).strip().split("|"))
        db = sqlite3.connect(f"file:{self.dd / 'blobgate.db'}?mode=ro", uri=True)
        try:
            return db.execute(sql).fetchone()
        finally:
            db.close()

    def lock_probe(self):
        return LockProbe(self.dd / "blobgate.db") if not self.database_url else None

    def start_timed(self):
        """Starts the server (pinned as compare.py's are): seconds until its data listener answered a GET."""
        self.port = common.free_port()
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(["taskset", "-c", "0", *self.command()], stdout=subprocess.DEVNULL,
                                     stderr=open(compare.WORK / f"{self.name}.log", "ab"), start_new_session=True,
                                     cwd=self.cwd())
        status = first_answer(self.proc, self.port, f"/bench/{REAL_KEY}", {"Authorization": f"Bearer {self.token}"})
        if status != 200:
            raise RuntimeError(f"{self.name}: GET {REAL_KEY} answered {status}")
        return time.perf_counter() - self.started_at


def first_answer(proc, port, path, headers, timeout=300):
    """The status of the first answer to GET `path` (a connection is retried until the listener is bound)."""
    end = time.monotonic() + timeout
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            conn.close()
            return resp.status
        except ConnectionRefusedError:
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"the server on {port} never answered (exit {proc.poll()})")
            time.sleep(0.002)


STALL = 0.010  # a probe that tried nothing for this long was descheduled, not waiting (p99.9 of a 0.2 ms sleep here at load 10: 7 ms)


class LockProbe(threading.Thread):
    """Holds of SQLite's write lock as another writer sees them: `BEGIN IMMEDIATE; COMMIT` every millisecond, retried
    every 0.2 ms while busy (no busy timeout: SQLite's own back-off sleeps up to 100 ms and would blur the figure).
    A hold is the time from the first busy try to the lock, counted only over tries that follow each other within
    STALL: a gap longer than that is this busy machine descheduling the probe, and the count starts again at the
    next busy try (so a hold can be under-read, never read from a stall). Only holds within a window count."""

    def __init__(self, db_path):
        super().__init__(daemon=True)
        self.db = sqlite3.connect(db_path, timeout=0, isolation_level=None, check_same_thread=False)
        self.holds = []  # (first busy try, seconds) of every hold over 0.5 ms
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            busy_since = last_try = None
            while True:
                now = time.perf_counter()
                try:
                    self.db.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) and "busy" not in str(e):
                        raise
                    if busy_since is None or now - last_try > STALL:
                        busy_since = now
                    last_try = now
                    time.sleep(0.0002)
            self.db.execute("COMMIT")
            if busy_since is not None and now - last_try <= STALL and now - busy_since > 0.0005:
                self.holds.append((busy_since, now - busy_since))
            time.sleep(0.001)

    def finish(self):
        self.stopped.set()
        self.join()
        self.db.close()

    def longest(self, since, until):
        """The longest hold that overlapped [since, until] (perf_counter seconds)."""
        return max((h for began, h in self.holds if began <= until and began + h >= since), default=0.0)


def probed(catalog):
    probe = catalog.lock_probe()
    if probe:
        probe.start()
    return probe


def longest(probe, since, until):
    return probe.longest(since, until) if probe else None


def start_and_sweep(catalog):
    """A start with orphans planted: (start-up s, sweep s, longest lock wait s from the start to the sweep's end, or
    None without SQLite). Leaves the server running."""
    catalog.plant_orphans()
    probe = probed(catalog)
    try:
        startup = catalog.start_timed()
        left = list(catalog.orphan_paths)
        while left and time.perf_counter() - catalog.started_at < 300:
            left = [p for p in left if p.exists()]
            time.sleep(0.005)
        swept = time.perf_counter()
    finally:
        if probe:
            probe.finish()
    sweep = swept - catalog.started_at if catalog.orphan_paths and not left else None
    return startup, sweep, longest(probe, catalog.started_at, swept)


def wait_for_prune(catalog):
    """From the server's start: (change-log rows, prune s from first row gone to last, longest lock wait s during
    it, longest lock wait s while the server idled before it: the probe's noise floor on this machine); the
    duration is None when no prune was seen within the timeout: the first prune's minute, then 0.1 s per
    2,000-row batch (one batch and the 30 ms pause after it take about 35 ms; 20 M rows about 6 minutes)."""
    oldest, newest = catalog.change_log()
    rows = newest - oldest + 1 if newest else 0
    timeout = 140 + rows / 2000 * 0.1
    probe = probed(catalog)
    watched = time.perf_counter()
    began = done = None
    try:
        while time.perf_counter() - catalog.started_at < timeout:
            now_oldest, _ = catalog.change_log()
            moment = time.perf_counter()
            if began is None and now_oldest != oldest:
                began = moment
            if now_oldest is None or (newest is not None and now_oldest >= newest):
                done = moment
                break
            time.sleep(0.01)
    finally:
        if probe:
            probe.finish()
    if not (began and done):
        return rows, None, None, longest(probe, watched, time.perf_counter())
    # A batch may have begun up to a poll before the first row was seen gone.
    return rows, done - began, longest(probe, began - 0.02, done), longest(probe, watched, began - 0.5)


def gets(target, pid, script, secs):
    """wrk with `script`: (req/s, requests, server CPU µs per request); any non-2xx fails the run."""
    c0 = scaling.run_seconds(pid)
    headers = {"Authorization": f"Bearer {target.token}"} if target.token else None
    rps, errors, requests = common.wrk(f"http://127.0.0.1:{target.port}/", secs, headers, extra=("-s", str(script)))
    cpu = scaling.run_seconds(pid) - c0
    if errors:
        raise RuntimeError(f"{target.name}: {errors} non-2xx answers to {script.name}")
    return rps, requests, cpu / max(requests, 1) * 1e6


def read_distinct(catalog, want, max_secs):
    """Reads keys 0, 1, … in sequence until `want` were answered (or `max_secs` ran out): how many were, and
    their rate (req/s and server CPU µs per request over the chunks: each key's first read, a miss unless cached)."""
    done, rate, end, spent, cpu = 0, None, time.monotonic() + max_secs, 0.0, 0.0
    while done < want and time.monotonic() < end:
        secs = 2 if rate is None else max(1, min(10, round((want - done) / rate + 0.5)))
        secs = max(1, min(secs, int(end - time.monotonic())))
        rate, requests, per_request = gets(catalog, catalog.proc.pid, lua_script("sequence", catalog.objects, done),
                                           secs)
        done += requests
        spent += requests / max(rate, 1)
        cpu += per_request * requests
    return min(done, want), done / max(spent, 1e-9), cpu / max(done, 1)


def list_keys_per_s(catalog, prefix):
    """ListObjectsV2 over `prefix`, pages of 1,000, signing not timed: (keys, keys/s)."""
    conn = http.client.HTTPConnection("127.0.0.1", catalog.port, timeout=120)
    params = {"list-type": "2", "encoding-type": "url", "max-keys": "1000", "prefix": prefix}
    keys, spent = 0, 0.0
    while True:
        path = s3_bench.list_path(params)
        headers = s3_bench.sign("GET", f"http://127.0.0.1:{catalog.port}{path}", catalog.key_id, catalog.secret)
        started = time.perf_counter()
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        spent += time.perf_counter() - started
        if resp.status != 200:
            raise RuntimeError(f"{catalog.name} list: {resp.status} {body[:300]!r}")
        keys += body.count(b"<Key>")
        token = re.search(rb"<NextContinuationToken>([^<]+)</NextContinuationToken>", body)
        if not token:
            return keys, keys / spent
        params["continuation-token"] = token.group(1).decode()


def ls_seconds(catalog):
    """`blobgate ls bench` over the whole bucket, beside the running server: (lines, seconds)."""
    started = time.perf_counter()
    proc = subprocess.Popen(catalog.argv("ls", "bench"), stdout=subprocess.PIPE, cwd=common.PROJECT)
    lines = sum(chunk.count(b"\n") for chunk in iter(lambda: proc.stdout.read(1 << 20), b""))
    if proc.wait() != 0:
        raise RuntimeError(f"{catalog.name}: blobgate ls exited {proc.returncode}")
    return lines, time.perf_counter() - started


LINKS_PER_FILE = 60_000  # ext4 allows 65,000 links to one inode


def nginx_tree(files, content):
    """`files` hard links to a 4 KiB file (one copy per 60,000 links) under WORK/nginx-root/bench/k/aa/bb/, kept
    between runs."""
    root = WORK / "nginx-root"
    count = root / "count"
    if count.exists() and count.read_text() == str(files):
        return root, 0.0
    started = time.perf_counter()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for a in range(100):
        for b in range(100):
            (root / "bench" / "k" / f"{a:02d}" / f"{b:02d}").mkdir(parents=True)
    for i in range(files):
        source = root / f"copy-{i // LINKS_PER_FILE}.bin"
        if i % LINKS_PER_FILE == 0:
            source.write_bytes(content)
        os.link(source, root / "bench" / object_key(i))
    count.write_text(str(files))
    return root, time.perf_counter() - started


def mib(kib):
    return round(kib / 1024, 1)


def main():
    signal.signal(signal.SIGTERM, compare._on_term)  # unwinds through the finally blocks that stop servers
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e3,1e6", help="SQLite catalogs (objects), e.g. 1e3,1e6,1e7")
    ap.add_argument("--postgres", action="store_true", help="adds a PostgreSQL catalog of --postgres-size objects")
    ap.add_argument("--postgres-size", default="1e6")
    ap.add_argument("--blobs", type=int, default=100_000, help="distinct blobs (at most a tenth of the objects)")
    ap.add_argument("--orphans", type=int, default=1000,
                    help="unreferenced old blobs planted for the sweep (at most a hundredth of the blobs)")
    ap.add_argument("--distinct", type=int, default=1_000_000, help="distinct keys read before the last RSS")
    ap.add_argument("--distinct-secs", type=int, default=600, help="at most this long per catalog for them")
    ap.add_argument("--nginx-files", type=int, help="default: the largest catalog, at most 10^6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--secs", type=int, default=8)
    ap.add_argument("--starts", type=int, default=3, help="starts per catalog for the start-up median")
    ap.add_argument("--project", default=".")
    ap.add_argument("--bin", help="the blobgate binary (default: PROJECT/target/release/blobgate)")
    ap.add_argument("--json")
    a = ap.parse_args()
    project = common.set_project(a.project)
    binary = common.binary(a.bin)
    compare.need("wrk", "wrk"); compare.need("curl", "curl"); compare.need("nginx", "nginx-light")
    os.sched_setaffinity(0, {1})  # the probes, the listing client and the signer run on the client core
    WORK.mkdir(parents=True, exist_ok=True)
    small = WORK / "small.bin"
    small.write_bytes(os.urandom(4096))
    sizes = [int(float(s)) for s in a.sizes.split(",")]
    cluster = WORK / "pg"
    catalogs, servers = [], []
    try:
        specs = [("empty", 1, 0, None)]
        specs += [(f"sqlite-{n:.0e}".replace("+0", ""), n, min(a.blobs, n // 10), None) for n in sizes]
        if a.postgres:
            subprocess.run([str(project / "scripts/pg-cluster"), "stop", str(cluster)], check=True)
            server_url = common.run([str(project / "scripts/pg-cluster"), "start", str(cluster)]).strip()
            psql(server_url, "CREATE DATABASE bench_scale")
            n = int(float(a.postgres_size))
            specs.append((f"postgres-{n:.0e}".replace("+0", ""), n, min(a.blobs, n // 10),
                          server_url.rsplit("/", 1)[0] + "/bench_scale"))
        for name, n, blobs, url in specs:
            orphans = min(a.orphans, blobs // 100)
            catalogs.append(Catalog(name, binary, n, blobs, orphans, small, url))
            c = catalogs[-1]
            print(f"built {name}: {n:,} objects, {blobs:,} distinct blobs in {c.build_secs:.1f} s (the CLI and the "
                  f"blob files {c.blob_secs:.1f} s, the rows {c.build_secs - c.blob_secs:.1f} s)", flush=True)
        files = a.nginx_files or min(max(sizes), 1_000_000)
        root, secs = nginx_tree(files, small.read_bytes())
        print(f"nginx tree: {files:,} files" + (f", made in {secs:.1f} s" if secs else ", kept from a run before"),
              flush=True)
        res = {c.name: {"objects": c.objects, "blobs": c.blobs, "orphans": c.orphans,
                        "build_s": round(c.build_secs, 1), "starts": []} for c in catalogs}
        lock_ms = lambda v: "-" if v is None else f"{v * 1e3:.1f} ms"  # noqa: E731

        # Sweep and prune, one catalog at a time with nothing else running: a start with orphans planted, then
        # a minute's wait for the first prune, the server idle.
        for c in catalogs:
            out = res[c.name]
            out["startup_orphans_s"], out["sweep_s"], out["sweep_lock_s"] = start_and_sweep(c)
            out["rss_start_kib"] = common.rss_kib(c.proc.pid)
            print(f"{c.name}: start-up with {c.orphans:,} orphans {out['startup_orphans_s'] * 1e3:.0f} ms, sweep "
                  f"{lock_ms(out['sweep_s'])}, longest lock wait {lock_ms(out['sweep_lock_s'])}", flush=True)
            out["change_rows"], out["prune_s"], out["prune_lock_s"], out["idle_lock_s"] = wait_for_prune(c)
            out["rss_idle_kib"] = common.rss_kib(c.proc.pid)
            print(f"{c.name}: prune of {out['change_rows']:,} change-log rows "
                  f"{lock_ms(out['prune_s']) if out['prune_s'] is not None else 'not seen'}, longest lock wait "
                  f"{lock_ms(out['prune_lock_s'])} (idle before it {lock_ms(out['idle_lock_s'])}); "
                  f"RSS idle {mib(out['rss_idle_kib'])} MiB", flush=True)
            c.stop()
        # Start-up as the acceptance has it (the catalog's blobs, no orphans), catalogs interleaved.
        for r in range(a.starts):
            for c in (catalogs if r % 2 == 0 else catalogs[::-1]):
                try:
                    res[c.name]["starts"].append(c.start_timed())
                finally:
                    c.stop()
            print(f"start-up round {r + 1}: " + ", ".join(f"{c.name} {res[c.name]['starts'][-1] * 1e3:.0f} ms"
                                                          for c in catalogs), flush=True)

        # GETs: every server up, catalogs and nginx interleaved round by round.
        served = [c for c in catalogs if c.name != "empty"]
        nginx = compare.Nginx(root)
        servers = served + [nginx]
        for s in servers:
            s.start()
        keys = {s.name: (files if s is nginx else s.objects) for s in servers}
        scripts = {s.name: {"random": lua_script("random", keys[s.name]), "hot": lua_script("random", 1)}
                   for s in servers}
        got = {s.name: {"random": [], "hot": []} for s in servers}
        for s in servers:
            gets(s, s.proc.pid, scripts[s.name]["hot"], 1)  # warm: connections, bucket, token, the open blob
        # Each key's first read (misses, unless the bound is smaller than the catalog) before the rounds, so
        # that the rounds measure the steady state; the first reads are reported as their own rate.
        for c in served:
            out = res[c.name]
            out["distinct_read"], out["first_read_rps"], out["first_read_cpu_us"] = read_distinct(
                c, min(c.objects, a.distinct), a.distinct_secs)
            out["rss_after_kib"] = common.rss_kib(c.proc.pid)
            out["rss_anon_after_kib"] = rss_anon_kib(c.proc.pid)
            out["huge_after_kib"] = huge_pages_kib(c.proc.pid)
            print(f"{c.name}: first read of {out['distinct_read']:,} distinct keys at {out['first_read_rps']:,.0f} "
                  f"req/s ({out['first_read_cpu_us']:.1f} µs CPU/req); RSS {mib(out['rss_after_kib'])} MiB "
                  f"({mib(out['rss_anon_after_kib'])} MiB anonymous, {mib(out['huge_after_kib'])} MiB in huge pages) "
                  "after them", flush=True)
        for r in range(a.rounds):
            for s in (servers if r % 2 == 0 else servers[::-1]):
                for kind in (("random", "hot") if r % 2 == 0 else ("hot", "random")):
                    got[s.name][kind].append(gets(s, s.proc.pid, scripts[s.name][kind], a.secs))
                print(f"round {r + 1} {s.name}: random {got[s.name]['random'][-1][0]:,.0f} req/s "
                      f"({got[s.name]['random'][-1][2]:.1f} µs CPU/req), hot {got[s.name]['hot'][-1][0]:,.0f} req/s "
                      f"({got[s.name]['hot'][-1][2]:.1f} µs CPU/req)", flush=True)
        for s in servers:
            out = res.setdefault(s.name, {"objects": files})
            for kind in ("random", "hot"):
                runs = got[s.name][kind]
                out[f"{kind}_rps"] = sum(x[0] for x in runs) / len(runs)
                out[f"{kind}_cpu_us"] = statistics.median(x[2] for x in runs)
            out["random_over_hot"] = out["random_rps"] / out["hot_rps"]
        for c in served:
            out = res[c.name]
            out["random_over_nginx"] = out["random_rps"] / res["nginx"]["random_rps"]
            out["first_read_over_hot"] = out["first_read_rps"] / out["hot_rps"]
            out["list_keys"], out["list_keys_per_s"] = list_keys_per_s(c, LIST_PREFIX)
            out["ls_keys"], out["ls_s"] = ls_seconds(c)
            print(f"{c.name}: ListObjectsV2 {out['list_keys']:,} keys at {out['list_keys_per_s']:,.0f} keys/s; "
                  f"ls {out['ls_keys']:,} keys in {out['ls_s']:.2f} s", flush=True)
    finally:
        stop_all(servers + catalogs)
        if a.postgres:
            subprocess.run([str(project / "scripts/pg-cluster"), "stop", str(cluster)])
    base = statistics.median(res["empty"]["starts"])
    for c in catalogs:
        out = res[c.name]
        out["startup_s"] = statistics.median(out.pop("starts"))
        out["startup_ratio"] = out["startup_s"] / base
        locks = [x for x in (out["sweep_lock_s"], out["prune_lock_s"]) if x is not None]
        out["longest_lock_s"] = max(locks) if locks else None
    print_table(res, [c.name for c in catalogs] + ["nginx"], files)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


def rss_anon_kib(pid):
    """RssAnon: the process's own memory, without the file pages it maps (SQLite's map of the database is the
    page cache's, shared and reclaimable, and counts in VmRSS as its pages are touched)."""
    line = next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("RssAnon:"))
    return int(line.split()[1])


def huge_pages_kib(pid):
    """AnonHugePages: how much of the process's memory the kernel backs with transparent huge pages."""
    line = next(l for l in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                if l.startswith("AnonHugePages:"))
    return int(line.split()[1])


def print_table(res, names, nginx_files):
    """One column per catalog (and nginx), then the acceptance's ratios per catalog."""
    ms = lambda v: "-" if v is None else f"{v * 1e3:,.1f}"  # noqa: E731
    num = lambda fmt: lambda v: "-" if v is None else format(v, fmt)  # noqa: E731
    rows = [("objects", "objects", num(",")), ("distinct blobs", "blobs", num(",")),
            ("build s", "build_s", num(".1f")), ("start-up ms (median)", "startup_s", ms),
            ("start-up / empty", "startup_ratio", num(".2f")), ("orphans", "orphans", num(",")),
            ("start-up, orphans ms", "startup_orphans_s", ms), ("sweep ms", "sweep_s", ms),
            ("start+sweep: lock ms", "sweep_lock_s", ms), ("change-log rows", "change_rows", num(",")),
            ("prune ms", "prune_s", ms), ("prune: longest lock ms", "prune_lock_s", ms),
            ("idle: longest lock ms", "idle_lock_s", ms),
            ("RSS after start MiB", "rss_start_kib", lambda v: "-" if v is None else mib(v)),
            ("RSS idle (pruned) MiB", "rss_idle_kib", lambda v: "-" if v is None else mib(v)),
            ("random req/s", "random_rps", num(",.0f")), ("hot req/s", "hot_rps", num(",.0f")),
            ("random / hot", "random_over_hot", num(".2f")), ("random / nginx random", "random_over_nginx", num(".2f")),
            ("CPU µs/req random", "random_cpu_us", num(".1f")), ("CPU µs/req hot", "hot_cpu_us", num(".1f")),
            ("distinct keys read", "distinct_read", num(",")),
            ("  first read req/s", "first_read_rps", num(",.0f")),
            ("  first read / hot", "first_read_over_hot", num(".2f")),
            ("  CPU µs/req first read", "first_read_cpu_us", num(".1f")),
            ("RSS after them MiB", "rss_after_kib", lambda v: "-" if v is None else mib(v)),
            ("  of it anonymous MiB", "rss_anon_after_kib", lambda v: "-" if v is None else mib(v)),
            ("  in huge pages MiB", "huge_after_kib", lambda v: "-" if v is None else mib(v)),
            ("ListObjectsV2 keys", "list_keys", num(",")), ("ListObjectsV2 keys/s", "list_keys_per_s", num(",.0f")),
            ("ls keys", "ls_keys", num(",")), ("ls s", "ls_s", num(".2f"))]
    width = max(14, *(len(n) + 2 for n in names))
    print(f"\n{'':<26}" + "".join(f"{n:>{width}}" for n in names))
    for label, key, fmt in rows:
        print(f"{label:<26}" + "".join(f"{fmt(res.get(n, {}).get(key)):>{width}}" for n in names))
    print(f"\nnginx: {nginx_files:,} files; blobgate: bearer token on a private bucket; ListObjectsV2 over "
          f"'{LIST_PREFIX}', ls over the whole bucket")
    print("acceptance (SQLite 10^6): random/hot >= 0.7, random/nginx >= 0.7, RSS after 10^6 keys <= cache bound + "
          "64 MiB, longest lock <= 50 ms, start-up/empty <= 2")
    for n in names:
        r = res[n]
        if n in ("empty", "nginx"):
            continue
        print(f"  {n}: random/hot {r['random_over_hot']:.2f}, random/nginx {r['random_over_nginx']:.2f} "
              f"(each key's first read / hot {r['first_read_over_hot']:.2f}), "
              f"RSS after {r['distinct_read']:,} keys {mib(r['rss_after_kib'])} MiB "
              f"({mib(r['rss_anon_after_kib'])} MiB anonymous), longest lock "
              f"{'- (no SQLite lock)' if r['longest_lock_s'] is None else ms(r['longest_lock_s']) + ' ms'}, "
              f"start-up/empty {r['startup_ratio']:.2f}")


if __name__ == "__main__":
    main()
