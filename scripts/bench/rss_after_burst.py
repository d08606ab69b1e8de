#!/usr/bin/env python3
"""RSS after a burst of parallel cold downloads, object store and local blobs side by side (issue 46, item 6).

For each mode: a fresh data dir with a public bucket of --objects distinct objects of --mib MiB each; `blobgate serve`
is started and its idle RSS read (after one small request and --settle seconds); then --objects curl clients download
one object each, all at once (cold: in `store` mode the data dir's cache is empty, so every byte is fetched from the
store while it is sent). RSS is sampled every 0.1 s during the burst (the peak) and then at 1, 5, 15 and 30 s after
the last client finished. The contract's bound: RSS returns within 2x idle + 16 MiB.

  store  blobs in moto (`python3 -m moto.server`, pip package moto[server]; objects in its memory), as the trial.
         --store s3s-fs uses s3s-fs instead (scripts/test installs it; $BLOBGATE_TEST_S3S_FS or --s3s-fs).
  local  blobs in the data dir (page cache warm from the puts; the burst is parallel, not cold from disk).

Usage (from the project root):
    python3 scripts/bench/rss_after_burst.py [--objects 50] [--mib 64] [--only store,local]
                                             [--bin target/release/blobgate] [--store moto|s3s-fs] [--json OUT]
Exit status 0 when every mode ends within the bound.
"""
import argparse, json, os, shutil, signal, subprocess, sys, tempfile, threading, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

BUCKET, STORE_BUCKET = "pub", "burst-blobs"
ACCESS_KEY, SECRET_KEY = "burst-key", "burst-secret"
AFTER = (1, 5, 15, 30)


def fail(msg):
    raise SystemExit(f"rss_after_burst: {msg}")


def clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith(("BLOBGATE_", "AWS_"))}


def stop(proc):
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


class Store:
    """moto or s3s-fs on a free port, with the bucket STORE_BUCKET."""

    def __init__(self, kind, work, s3s_fs):
        self.kind, self.work, self.s3s_fs, self.proc = kind, work, s3s_fs, None

    def start(self):
        self.port = common.free_port()
        log = open(self.work / f"{self.kind}.log", "ab")
        if self.kind == "moto":
            cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        else:
            root = self.work / "s3s-root"
            (root / STORE_BUCKET).mkdir(parents=True, exist_ok=True)
            cmd = [self.s3s_fs, "--host", "127.0.0.1", "--port", str(self.port), "--access-key", ACCESS_KEY,
                   "--secret-key", SECRET_KEY, str(root)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=clean_env())
        common.wait_port(self.port, tries=300)
        if self.kind == "moto":
            import boto3
            boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
                         aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=STORE_BUCKET)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.port}"

    def env(self):
        return {**clean_env(), "BLOBGATE_BLOB_STORE__URL": f"s3://{STORE_BUCKET}/gate",
                "BLOBGATE_BLOB_STORE__ENDPOINT": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_DEFAULT_REGION": "us-east-1"}


def make_objects(work, n, mib):
    """n files of `mib` MiB, each from a random MiB of its own (distinct blobs)."""
    files = []
    for i in range(n):
        path = work / f"o{i}.bin"
        block = os.urandom(1 << 20)
        with open(path, "wb") as f:
            for _ in range(mib):
                f.write(block)
        files.append(path)
    return files


def run_mode(name, binary, work, env, files, settle):
    data = work / f"{name}-data"
    cli = lambda *args: subprocess.run([str(binary), "--data-dir", str(data), *args], check=True,
                                       capture_output=True, text=True, env=env)
    cli("bucket", "create", BUCKET, "--public")
    (work / "small.bin").write_bytes(b"x" * 4096)
    cli("put", BUCKET, "small.bin", str(work / "small.bin"))
    # Four at a time: moto (Python) answers 50 parallel multipart uploads too slowly for the store timeouts.
    for at in range(0, len(files), 4):
        puts = [subprocess.Popen([str(binary), "--data-dir", str(data), "put", BUCKET, f.name, str(f)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env) for f in files[at:at + 4]]
        for p in puts:
            if p.wait() != 0:
                fail(f"{name}: put failed: {p.stderr.read().decode()}")
    if name == "store":
        shutil.rmtree(data / "cache", ignore_errors=True)
    port, admin = common.free_port(), common.free_port()
    server = subprocess.Popen([str(binary), "--data-dir", str(data), "serve", "--listen", f"127.0.0.1:{port}",
                               "--admin-listen", f"127.0.0.1:{admin}"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=open(work / f"{name}.log", "ab"),
                              start_new_session=True, env=env)
    try:
        common.wait_port(port, tries=300)
        subprocess.run(["curl", "-sf", "-o", "/dev/null", f"http://127.0.0.1:{port}/{BUCKET}/small.bin"], check=True)
        time.sleep(settle)
        idle = common.rss_kib(server.pid)
        peak, done = [idle], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], common.rss_kib(server.pid))
                time.sleep(0.1)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.time()
        curls = [subprocess.Popen(["curl", "-sf", "-o", "/dev/null", "-w", "%{http_code} %{size_download}",
                                   f"http://127.0.0.1:{port}/{BUCKET}/{f.name}"], stdout=subprocess.PIPE, text=True)
                 for f in files]
        for c, f in zip(curls, files):
            out = c.communicate()[0].split()
            if c.returncode != 0 or out != ["200", str(f.stat().st_size)]:
                fail(f"{name}: GET {f.name}: curl exit {c.returncode}, {out}")
        burst_secs = time.time() - t0
        done.set()
        sampler.join()
        end, after = time.time(), {}
        for secs in AFTER:
            time.sleep(max(0.0, end + secs - time.time()))
            after[secs] = common.rss_kib(server.pid)
        return {"idle_kib": idle, "peak_kib": peak[0], "after_kib": after, "burst_secs": round(burst_secs, 2)}
    finally:
        stop(server)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=50)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--only", default="store,local")
    ap.add_argument("--bin", default="target/release/blobgate")
    ap.add_argument("--store", choices=["moto", "s3s-fs"], default="moto")
    ap.add_argument("--s3s-fs", default=os.environ.get("BLOBGATE_TEST_S3S_FS"))
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between start and the idle figure")
    ap.add_argument("--json")
    a = ap.parse_args()
    binary = Path(a.bin).resolve()
    if not binary.exists():
        fail(f"{binary} missing (cargo build --release, or --bin target/debug/blobgate)")
    work = Path(tempfile.mkdtemp(prefix="blobgate-burst-"))
    store, results, ok = None, {}, True
    try:
        shutil.copy2(binary, work / "blobgate")
        files = make_objects(work, a.objects, a.mib)
        for name in a.only.split(","):
            env = clean_env()
            if name == "store":
                store = Store(a.store, work, a.s3s_fs)
                store.start()
                env = store.env()
            r = run_mode(name, work / "blobgate", work, env, files, a.settle)
            bound = 2 * r["idle_kib"] + 16 * 1024
            r["bound_kib"], r["within"] = bound, r["after_kib"][AFTER[-1]] <= bound
            ok &= r["within"]
            results[name] = r
            after = ", ".join(f"+{s}s {v / 1024:.0f}" for s, v in r["after_kib"].items())
            print(f"{name:5} ({a.objects} x {a.mib} MiB in {r['burst_secs']} s): idle {r['idle_kib'] / 1024:.0f} MiB, "
                  f"peak {r['peak_kib'] / 1024:.0f} MiB, after {after} MiB; bound {bound / 1024:.0f} MiB: "
                  f"{'within' if r['within'] else 'OVER'}", flush=True)
            if store is not None:
                stop(store.proc)
                store = None
        if a.json:
            Path(a.json).write_text(json.dumps(results, indent=1))
        sys.exit(0 if ok else 1)
    finally:
        if store is not None:
            stop(store.proc)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
