#!/usr/bin/env python3
"""Slow-reader soak: rate-limited, pausing and zero-window clients against a real blobgate, on a cold page cache,
with one data worker and with the default count. Every byte is verified, and no download by a client that keeps
reading may be cut short; a client that stops reading for good must be dropped.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/slow_soak.py                        # 3 rounds per worker setting (the version CI runs)
    python3 scripts/slow_soak.py --rounds 10
    python3 scripts/slow_soak.py --full-speed --seconds 40 --loops 6 --size-mib 256

Each round drops the blob from the page cache (posix_fadvise DONTNEED) and then runs, at once:
- paced readers of a large range, at 100 KB/s to 4 MB/s, for 6-9 s each, with a small fixed receive buffer;
- pausing readers at full speed with pauses shorter than send_progress;
- `curl --limit-rate` readers (bursts, then a shut window while curl sleeps: slow, never stalled);
- zero-window readers that send a request and never read (the server must drop them after send_progress).
`--full-speed` instead runs LOOPS parallel `curl` loops that download the whole object at full speed for SECONDS,
checking each body's SHA-256 (the field report's reproduction of cut-off bulk downloads).
Exit status 0 only if every download that kept reading completed byte-exact and every zero-window reader was
dropped.
"""
import argparse, asyncio, hashlib, json, os, random, shutil, signal, socket, subprocess, sys, tempfile, time
from pathlib import Path

SEND_PROGRESS = 3.0


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


class Tally:
    def __init__(self):
        self.completed = self.cut_short = self.mismatched = self.dropped = self.not_dropped = 0
        self.bytes = 0
        self.problems = []

    def problem(self, what):
        self.problems.append(what)


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers


async def request(port, spec, rcvbuf=None):
    sock = socket.socket()
    if rcvbuf:
        # A fixed small receive buffer (no autotuning), so a slow reader's backlog sits in the server's send
        # buffer, where writability returns only after a third of it has drained.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=64 * 1024)
    rng = f"Range: bytes={spec[0]}-{spec[1]}\r\n" if spec else ""
    writer.write(f"GET /soak/blob.bin HTTP/1.1\r\nHost: soak\r\n{rng}Connection: close\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def paced(port, data, spec, rate, pauses, tally, label):
    """Reads one response at `rate` bytes/s (None: full speed), pausing at the given body offsets."""
    reader, writer = await request(port, spec, rcvbuf=128 * 1024 if rate else None)
    try:
        status, headers = await read_head(reader)
        want = int(headers["content-length"])
        expected = data[spec[0]:spec[1] + 1] if spec else data
        if status != (206 if spec else 200) or want != len(expected):
            tally.problem(f"{label}: status {status}, length {want}")
            return
        digest, got, pauses = hashlib.sha256(), 0, sorted(pauses)
        started, base = time.monotonic(), 0  # pacing restarts after each pause
        while got < want:
            chunk = await reader.read(min(64 * 1024, want - got))
            if not chunk:
                break
            digest.update(chunk); got += len(chunk)
            if pauses and got >= pauses[0][0]:
                await asyncio.sleep(pauses.pop(0)[1])
                started, base = time.monotonic(), got
            if rate:
                due = (got - base) / rate - (time.monotonic() - started)
                if due > 0:
                    await asyncio.sleep(due)
        tally.bytes += got
        if got < want:
            tally.cut_short += 1
            tally.problem(f"{label}: cut short at {got} of {want}")
        elif digest.digest() != hashlib.sha256(expected).digest():
            tally.mismatched += 1
            tally.problem(f"{label}: bytes differ")
        else:
            tally.completed += 1
    except Exception as e:  # noqa: BLE001 - every failure is counted and reported
        tally.cut_short += 1
        tally.problem(f"{label}: {e!r}")
    finally:
        writer.close()


async def curl_limited(port, data, spec, rate, tally, label):
    """`curl --limit-rate`: reads its socket in bursts at full speed, then sleeps with its window shut until its
    average is back under the rate (the field report's steady slow reader, cut by the 3 s stall timeout once)."""
    rng = ["-r", f"{spec[0]}-{spec[1]}"] if spec else []
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--fail", "--limit-rate", str(rate), *rng, "-o", "-", f"http://127.0.0.1:{port}/soak/blob.bin",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    digest, got = hashlib.sha256(), 0
    while chunk := await proc.stdout.read(1 << 20):
        digest.update(chunk); got += len(chunk)
    err = (await proc.stderr.read()).decode(errors="replace").strip()
    code = await proc.wait()
    expected = data[spec[0]:spec[1] + 1] if spec else data
    tally.bytes += got
    if code != 0 or got != len(expected):
        tally.cut_short += 1
        tally.problem(f"{label}: curl exit {code} after {got} of {len(expected)} bytes: {err}")
    elif digest.digest() != hashlib.sha256(expected).digest():
        tally.mismatched += 1
        tally.problem(f"{label}: bytes differ")
    else:
        tally.completed += 1


async def zero_window(port, size, tally, label):
    """Sends a request, reads nothing for a while, then checks the server gave up and closed early."""
    reader, writer = await request(port, None)
    try:
        # Nothing is read for well past send_progress: asyncio's buffer fills, then the window shuts.
        reader._transport.pause_reading()  # noqa: SLF001 - a zero window is exactly this
        await asyncio.sleep(SEND_PROGRESS * 2 + 2)
        reader._transport.resume_reading()  # noqa: SLF001
        got = 0
        while True:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            got += len(chunk)
        if got < size:
            tally.dropped += 1
        else:
            tally.not_dropped += 1
            tally.problem(f"{label}: a reader that never read was not dropped")
    except (ConnectionResetError, asyncio.IncompleteReadError):
        tally.dropped += 1
    finally:
        writer.close()


async def slow_round(port, data, rnd, tally, round_no, curl_clients, curl_rate, curl_mib):
    size = len(data)
    tasks = []
    for i in range(4):
        rate = rnd.choice([100_000, 250_000, 1_000_000, 4_000_000])
        span = int(rate * rnd.uniform(6, 9))  # each paced read lasts about 6-9 s
        start = rnd.randrange(0, max(1, size - span))
        spec = None if span >= size else (start, start + span - 1)
        tasks.append(paced(port, data, spec, rate, [], tally, f"round {round_no} paced {rate} B/s"))
    for i in range(2):
        pauses = [(rnd.randrange(1 << 20, size // 2), rnd.uniform(0.5, SEND_PROGRESS - 1)),
                  (rnd.randrange(size // 2, size - 1), rnd.uniform(0.5, SEND_PROGRESS - 1))]
        tasks.append(paced(port, data, None, None, pauses, tally, f"round {round_no} pausing"))
    # curl --limit-rate readers of 16 MiB at 1 MB/s: with the stall timeout alone (limits.min_download_rate = 0)
    # each is cut near its 14th MB, once its buffers have grown (the field report's case, 4 clients reading 8 MiB
    # at 250 KB/s, is `--curl-rate 250000 --curl-mib 8 --curl-clients 4`).
    for i in range(curl_clients):
        span = min(size, curl_mib << 20)
        start = rnd.randrange(0, max(1, size - span))
        spec = None if span >= size else (start, start + span - 1)
        tasks.append(curl_limited(port, data, spec, curl_rate, tally, f"round {round_no} curl --limit-rate {curl_rate}"))
    tasks.append(zero_window(port, size, tally, f"round {round_no} zero-window"))
    await asyncio.gather(*tasks)


def drop_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def full_speed(port, data, loops, seconds, tally):
    expected = hashlib.sha256(data).hexdigest()
    script = (f'end=$((SECONDS+{seconds})); while [ $SECONDS -lt $end ]; do '
              f'h=$(curl -sS --fail -o - http://127.0.0.1:{port}/soak/blob.bin | sha256sum | cut -d" " -f1); '
              f'echo "${{PIPESTATUS[0]}} $h"; done')
    procs = [subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(loops)]
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        for line in out.split("\n"):
            if not line.strip():
                continue
            code, digest = line.split()
            if digest == expected:
                tally.completed += 1
                tally.bytes += len(data)
            else:
                tally.cut_short += 1
                tally.problem(f"curl exit {code}: body sha256 {digest[:12]}")


def run(args, binary, workers, tmp):
    rnd = random.Random(7)
    data = b"".join(rnd.randbytes(1 << 20) for _ in range(args.size_mib))
    (tmp / "blob.bin").write_bytes(data)
    bg = [str(binary), "--data-dir", str(tmp / "data")]
    subprocess.run(bg + ["bucket", "create", "soak", "--public"], check=True, capture_output=True)
    put = subprocess.run(bg + ["put", "soak", "blob.bin", str(tmp / "blob.bin")], check=True, capture_output=True,
                         text=True)
    sha = json.loads(put.stdout)["sha256"]
    blob = tmp / "data" / "blobs" / sha[:2] / sha[2:4] / sha
    port, admin = free_port(), free_port()
    env = dict(os.environ, BLOBGATE_RUNTIME__DATA_WORKERS=str(workers),
               BLOBGATE_TIMEOUTS__SEND_PROGRESS=f"{int(SEND_PROGRESS)}s", RUST_LOG="info")
    log = tmp / "serve.log"
    server = subprocess.Popen(bg + ["serve", "--listen", f"127.0.0.1:{port}", "--admin-listen", f"127.0.0.1:{admin}"],
                              stderr=open(log, "wb"), env=env)
    tally = Tally()
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", admin), timeout=0.2).close(); break
            except OSError:
                time.sleep(0.1)
        else:
            sys.exit(f"slow_soak: the server did not start:\n{log.read_text()}")
        if args.full_speed:
            drop_cache(blob)
            full_speed(port, data, args.loops, args.seconds, tally)
        else:
            rnd = random.Random(workers)
            for round_no in range(args.rounds):
                drop_cache(blob)
                asyncio.run(slow_round(port, data, rnd, tally, round_no, args.curl_clients, args.curl_rate, args.curl_mib))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(tmp / "data", ignore_errors=True)
    stalls = log.read_text().count("client made no progress")
    return tally, stalls


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=24)
    ap.add_argument("--full-speed", action="store_true")
    ap.add_argument("--loops", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 0], help="data_workers settings (0 = one per CPU)")
    ap.add_argument("--curl-clients", type=int, default=3, help="curl --limit-rate readers per round")
    ap.add_argument("--curl-rate", type=int, default=1_000_000, help="their --limit-rate, bytes/s")
    ap.add_argument("--curl-mib", type=int, default=16, help="what each reads, MiB")
    ap.add_argument("--bin", default="target/release/blobgate")
    a = ap.parse_args()
    binary = Path(a.bin).resolve()
    if not binary.exists():
        sys.exit(f"slow_soak: {binary} missing: run cargo build --release first")
    if not shutil.which("curl"):
        sys.exit("slow_soak: curl is needed (curl --limit-rate readers, --full-speed)")
    failed = False
    for workers in a.workers:
        tmp = Path(tempfile.mkdtemp(prefix="blobgate-slow-soak-"))
        try:
            tally, stalls = run(a, binary, workers, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        report = {"data_workers": workers, "mode": "full-speed" if a.full_speed else "slow readers, cold cache",
                  "completed": tally.completed, "cut_short": tally.cut_short, "mismatched": tally.mismatched,
                  "zero_window_dropped": tally.dropped, "zero_window_kept": tally.not_dropped,
                  "server_stall_closes": stalls, "mib_verified": round(tally.bytes / 2**20),
                  "problems": tally.problems[:10]}
        print(json.dumps(report, indent=1))
        expected_stalls = 0 if a.full_speed else a.rounds
        if tally.problems or tally.completed == 0 or stalls != expected_stalls:
            failed = True
            if stalls != expected_stalls:
                print(f"slow_soak: the server closed {stalls} responses as stalled; only the {expected_stalls} "
                      "zero-window readers should have been")
    print("slow soak FAILED" if failed else "slow soak passed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
