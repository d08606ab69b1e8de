#!/usr/bin/env python3
"""Soak test: many concurrent keep-alive connections doing random ranges against a real blobgate, every byte
checked, with the server's RSS and open-fd count sampled throughout.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/soak.py                                   # 1000 connections for 60 s
    python3 scripts/soak.py --connections 200 --seconds 5     # the short version CI runs

It makes a temp data dir, stores a 64 MiB object with known content in a private bucket, starts
`blobgate serve` on free ports, and runs the load through loopback only. Each request is a random single range
(90%) or a 2-3 part multi-range (10%) with a bearer token; responses are compared byte for byte with the object.
A short warm-up comes first (the database pool opens its connections on demand); the idle baseline is taken
after it. Exit status 0 only if there were no errors or mismatches, the fd count came back to that baseline,
and RSS stayed flat under load (end of load within 20% + 16 MiB of the level at a quarter of the run).
"""
import argparse, asyncio, json, os, random, re, resource, shutil, signal, socket, subprocess, sys, tempfile, time
from pathlib import Path

SIZE = 64 << 20


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def rss_kib(pid):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Stats:
    def __init__(self):
        self.requests = self.errors = self.mismatches = self.bytes = 0
        self.first_error = None

    def error(self, what):
        self.errors += 1
        if self.first_error is None:
            self.first_error = what


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return status, headers


def check_multipart(body, content_type, data):
    boundary = re.search(r"boundary=([^;\s]+)", content_type).group(1).encode()
    parts = body.split(b"--" + boundary)
    seen = 0
    for part in parts[1:]:
        if part.startswith(b"--"):
            break
        head, _, payload = part.partition(b"\r\n\r\n")
        m = re.search(rb"content-range: bytes (\d+)-(\d+)/(\d+)", head, re.I)
        a, b = int(m.group(1)), int(m.group(2))
        payload = payload[: b - a + 1]
        if payload != data[a:b + 1]:
            return False
        seen += 1
    return seen >= 1


async def client(port, token, data, deadline, stats, rnd):
    reader = writer = None
    try:
        while time.monotonic() < deadline:
            if writer is None:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            multi = rnd.random() < 0.1
            if multi:
                starts = sorted(rnd.sample(range(0, SIZE - 70_000, 4096), rnd.choice([2, 3])))
                spec = ",".join(f"{s}-{s + rnd.randrange(1, 60_000)}" for s in starts)
            else:
                a = rnd.randrange(0, SIZE)
                b = min(SIZE - 1, a + rnd.randrange(0, 256 * 1024))
                spec = f"{a}-{b}"
            writer.write(f"GET /soak/blob.bin HTTP/1.1\r\nHost: soak\r\nAuthorization: Bearer {token}\r\n"
                         f"Range: bytes={spec}\r\n\r\n".encode())
            await writer.drain()
            status, headers = await read_head(reader)
            body = await reader.readexactly(int(headers["content-length"]))
            stats.requests += 1
            stats.bytes += len(body)
            if status != 206:
                stats.error(f"status {status} for {spec}")
            elif multi and headers.get("content-type", "").startswith("multipart/byteranges"):
                if not check_multipart(body, headers["content-type"], data):
                    stats.mismatches += 1
            else:
                m = re.match(r"bytes (\d+)-(\d+)/\d+", headers.get("content-range", ""))
                if not m or body != data[int(m.group(1)):int(m.group(2)) + 1]:
                    stats.mismatches += 1
            if headers.get("connection", "").lower() == "close":
                writer.close(); writer = None
    except Exception as e:  # noqa: BLE001 - every failure is counted and reported
        stats.error(repr(e))
    finally:
        if writer is not None:
            writer.close()


async def run_load(args, port, token, data, pid):
    stats = Stats()
    deadline = time.monotonic() + args.seconds
    samples = []

    async def sampler():
        while time.monotonic() < deadline:
            samples.append((time.monotonic(), rss_kib(pid), fd_count(pid)))
            await asyncio.sleep(0.5)

    tasks = [client(port, token, data, deadline, stats, random.Random(i)) for i in range(args.connections)]
    await asyncio.gather(sampler(), *tasks)
    return stats, samples


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--bin", default="target/release/blobgate")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.connections * 2 + 256)), hard))
    binary = Path(a.bin).resolve()
    if not binary.exists():
        sys.exit(f"soak: {binary} missing: run cargo build --release first")
    tmp = Path(tempfile.mkdtemp(prefix="blobgate-soak-"))
    server = None
    try:
        data = random.Random(42).randbytes(SIZE)
        (tmp / "blob.bin").write_bytes(data)
        bg = [str(binary), "--data-dir", str(tmp / "data")]
        subprocess.run(bg + ["bucket", "create", "soak"], check=True, capture_output=True)
        subprocess.run(bg + ["put", "soak", "blob.bin", str(tmp / "blob.bin")], check=True, capture_output=True)
        token = subprocess.run(bg + ["token", "create", "--bucket", "soak"], check=True, capture_output=True,
                               text=True).stdout.strip()
        port, admin = free_port(), free_port()
        server = subprocess.Popen(bg + ["serve", "--listen", f"127.0.0.1:{port}", "--admin-listen",
                                        f"127.0.0.1:{admin}"], stderr=open(tmp / "serve.log", "wb"))
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", admin), timeout=0.2).close(); break
            except OSError:
                time.sleep(0.1)
        time.sleep(0.3)
        # Warm-up: the database pool opens its connections (and their fds) on first demand. The baseline is
        # taken after it, idle, so that a later difference means a leak.
        warm = argparse.Namespace(connections=a.connections, seconds=min(3, max(1, a.seconds // 4)))
        asyncio.run(run_load(warm, port, token, data, server.pid))
        time.sleep(1.0)
        fds_before, rss_before = fd_count(server.pid), rss_kib(server.pid)
        started = time.monotonic()
        stats, samples = asyncio.run(run_load(a, port, token, data, server.pid))
        elapsed = time.monotonic() - started
        time.sleep(1.0)  # let the server see every close
        fds_after, rss_after = fd_count(server.pid), rss_kib(server.pid)
        quarter = [s for s in samples if s[0] - samples[0][0] >= elapsed / 4] or samples
        rss_quarter, rss_end = quarter[0][1], samples[-1][1]
        peak_fds = max(s[2] for s in samples)
        report = {
            "connections": a.connections, "seconds": round(elapsed, 1), "requests": stats.requests,
            "req_per_s": round(stats.requests / elapsed), "mib_verified": round(stats.bytes / 2**20),
            "errors": stats.errors, "mismatches": stats.mismatches, "first_error": stats.first_error,
            "rss_kib": {"idle_before": rss_before, "quarter": rss_quarter, "end_of_load": rss_end,
                        "idle_after": rss_after},
            "fds": {"before": fds_before, "peak": peak_fds, "after": fds_after},
        }
        print(json.dumps(report, indent=1))
        problems = []
        if stats.errors or stats.mismatches:
            problems.append("errors or byte mismatches")
        if stats.requests < a.connections:
            problems.append("too few requests completed")
        if fds_after > fds_before + 2:
            problems.append(f"fd count did not come back ({fds_before} -> {fds_after})")
        if rss_end > rss_quarter * 1.2 + 16 * 1024:
            problems.append(f"RSS grew under steady load ({rss_quarter} -> {rss_end} KiB)")
        if problems:
            print("soak FAILED: " + "; ".join(problems))
            sys.exit(1)
        print("soak passed")
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
