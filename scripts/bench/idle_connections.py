#!/usr/bin/env python3
"""RSS cost of idle keep-alive connections: opens N connections to a real blobgate, makes one request on each
(so each has been through the whole request path and sits idle in keep-alive), and reports the server's RSS
growth per connection. Side by side with nginx on the same file when nginx is installed.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/idle_connections.py [--connections 3000]
Exit status 0 when blobgate stays at or under 16 KiB per idle connection.
"""
import argparse, os, resource, shutil, signal, socket, subprocess, sys, tempfile, time
from pathlib import Path

from common import free_port, rss_kib, wait_port



def measure(port, path, n, pids, headers=""):
    conns = []
    request = f"GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode()
    # Warm-up connection so that lazily created state (pools, caches) is not counted per connection.
    warm = socket.create_connection(("127.0.0.1", port)); warm.sendall(request); warm.recv(65536); warm.close()
    time.sleep(0.5)
    before = rss_kib(*pids)
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(request)
        conns.append(s)
    for s in conns:
        got = b""
        while b"\r\n\r\n" not in got:
            got += s.recv(65536)
        if not got.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"unexpected answer: {got[:80]!r}")
    time.sleep(1.0)
    after = rss_kib(*pids)
    for s in conns:
        s.close()
    return before, after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--bin", default="target/release/blobgate")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.connections * 2 + 256), hard))
    tmp = Path(tempfile.mkdtemp(prefix="blobgate-idle-"))
    procs = []
    try:
        os.chmod(tmp, 0o755)  # nginx's workers run as an unprivileged user
        (tmp / "www").mkdir()
        (tmp / "www" / "small.bin").write_bytes(os.urandom(4096))
        bg = [str(Path(a.bin).resolve()), "--data-dir", str(tmp / "data")]
        subprocess.run(bg + ["bucket", "create", "idle"], check=True, capture_output=True)
        subprocess.run(bg + ["put", "idle", "small.bin", str(tmp / "www" / "small.bin")], check=True,
                       capture_output=True)
        token = subprocess.run(bg + ["token", "create", "--bucket", "idle"], check=True, capture_output=True,
                               text=True).stdout.strip()
        port = free_port()
        server = subprocess.Popen(bg + ["serve", "--listen", f"127.0.0.1:{port}", "--admin-listen",
                                        f"127.0.0.1:{free_port()}"], stderr=subprocess.DEVNULL)
        procs.append(server)
        wait_port(port)
        b0, b1 = measure(port, "/idle/small.bin", a.connections, [server.pid], f"Authorization: Bearer {token}\r\n")
        per_conn = (b1 - b0) / a.connections
        print(f"blobgate: {a.connections} idle keep-alive connections, RSS {b0} -> {b1} KiB, "
              f"{per_conn:.1f} KiB per connection")
        if shutil.which("nginx"):
            nport = free_port()
            conf = tmp / "nginx.conf"
            conf.write_text(f"worker_processes 1; daemon off; error_log {tmp}/nginx.err; pid {tmp}/nginx.pid;\n"
                            f"events {{ worker_connections {a.connections + 100}; }}\n"
                            f"http {{ access_log off; sendfile on; tcp_nopush on; keepalive_timeout 120;\n"
                            f"  server {{ listen 127.0.0.1:{nport}; root {tmp}/www; }} }}\n")
            nginx = subprocess.Popen(["nginx", "-c", str(conf)], stderr=subprocess.DEVNULL)
            procs.append(nginx)
            wait_port(nport)
            time.sleep(0.3)
            pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(nginx.pid)], capture_output=True,
                                                   text=True).stdout.split()] + [nginx.pid]
            n0, n1 = measure(nport, "/small.bin", a.connections, pids)
            print(f"nginx:    {a.connections} idle keep-alive connections, RSS {n0} -> {n1} KiB, "
                  f"{(n1 - n0) / a.connections:.1f} KiB per connection")
        sys.exit(0 if per_conn <= 16 else 1)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
