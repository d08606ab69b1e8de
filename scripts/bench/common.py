"""What the benchmarks in this directory share: the project tree and the CLI run in it, a `blobgate serve` on a
data dir of its own, free ports, waiting for a listener, a process's RSS, and wrk's figures.

compare.py (../shared/bench, imported, never edited) stays the harness: importing this module puts it on the path,
so a script here says `import common` and then `from common import compare` or uses `common.compare`.
"""
import re, shutil, socket, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parents[2] / "shared" / "bench"))
import compare  # noqa: E402  (the shared harness: server wrapper, wrk conventions, CPU accounting)

PROJECT = Path(".").resolve()  # the binary's source tree: it reads config/default.toml from there


def set_project(path):
    """Where the CLI and the servers run (`--project`)."""
    global PROJECT
    PROJECT = Path(path).resolve()
    return PROJECT


def binary(given):
    """The blobgate binary: `--bin`, or PROJECT's release build, which must exist."""
    path = Path(given).resolve() if given else PROJECT / "target/release/blobgate"
    if not path.exists():
        raise SystemExit(f"{path} missing: run cargo build --release first")
    return path


def run(cmd):
    """A command run in PROJECT, its stdout; a failure raises with the command's stderr."""
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def wait_port(port, tries=100):
    """Until something accepts on `port` (a try every 0.1 s at least)."""
    for _ in range(tries):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close(); return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def bucket_with_write_key(binary, data):
    """A fresh data dir `data` with bucket `bkt` and a write S3 key on it, through the CLI: returns
    (run, key_id, secret), `run(*args)` being the CLI on that data dir (its stdout)."""
    def run(*args):
        return subprocess.run([str(binary), "--data-dir", str(data), *args], check=True, capture_output=True,
                              text=True).stdout
    run("bucket", "create", "bkt")
    key_id, secret = run("s3-key", "create", "--bucket", "bkt", "--scope", "write").split()
    return run, key_id, secret


def serve_data_dir(binary, data):
    """`blobgate serve` on `data` with both listeners on free ports, waited for: (process, port, admin_port)."""
    port, admin_port = free_port(), free_port()
    server = subprocess.Popen([str(binary), "--data-dir", str(data), "serve", "--listen", f"127.0.0.1:{port}",
                               "--admin-listen", f"127.0.0.1:{admin_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(admin_port, tries=200)
    except BaseException:
        server.kill()
        raise
    return server, port, admin_port


def write_test_file(path, mib):
    """`mib` MiB of incompressible bytes (one random MiB, rotated per MiB) at `path`; returns their SHA-256 (hex)."""
    import hashlib, os
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        block = os.urandom(1 << 20)
        for i in range(mib):
            chunk = block[i % 997:] + block[:i % 997]
            f.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()


def rss_kib(*pids):
    """The summed VmRSS of `pids`, in KiB."""
    total = 0
    for pid in pids:
        lines = [l for l in Path(f"/proc/{pid}/status").read_text().splitlines() if l.startswith("VmRSS:")]
        if not lines:
            raise RuntimeError(f"no VmRSS for {pid}")
        total += int(lines[0].split()[1])
    return total


def wrk(url, secs, headers=None, conns=64, extra=()):
    """wrk as compare.py's `small` case runs it (one thread, on CPU 1): (req/s, non-2xx responses, requests)."""
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{conns}", f"-d{secs}s", *extra]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), int(errors.group(1)) if errors else 0, requests


class Gate(compare.Server):
    """`blobgate serve` on a data dir of its own (`WORK/NAME-data`, emptied first) holding the private bucket
    `bench`: on SQLite, or on PostgreSQL with `database_url`. Started, pinned and stopped as compare.py's servers."""
    prefix = "bench/"

    def __init__(self, name, binary, work, database_url=None):
        self.name, self.bin, self.database_url = name, str(binary), database_url
        self.dd = work / f"{name}-data"
        shutil.rmtree(self.dd, ignore_errors=True)
        self.cli("bucket", "create", "bench")
        self.admin = free_port()

    def argv(self, *args):
        url = ["--database-url", self.database_url] if self.database_url else []
        return [self.bin, "--data-dir", str(self.dd), *url, *args]

    def cli(self, *args):
        return run(self.argv(*args))

    def read_token(self):
        return self.cli("token", "create", "--bucket", "bench", "--scope", "read").strip()

    def cwd(self):
        return PROJECT

    def command(self):
        return self.argv("serve", "--listen", f"127.0.0.1:{self.port}", "--admin-listen", f"127.0.0.1:{self.admin}")


def stop_all(servers):
    """Stops every server that was started and still runs."""
    for s in servers:
        if getattr(s, "proc", None) and s.proc.poll() is None:
            s.stop()
