#!/usr/bin/env python3
"""RSS cost of idle keep-alive connections: opens N connections to a real blobgate, makes one request on each
(so each has been through the whole request path and sits idle in keep-alive), and reports the server's RSS
growth per connection. Side by side with nginx on the same file when nginx is installed.

--https: the same over TLS (a self-signed ECDSA certificate made with openssl, the same pair for nginx), and the
object is --body-kib KiB (default 200, above user-space TLS's 128 KiB body piece): each connection has received a
whole body before it idles, so a buffer kept per connection shows. Plain HTTP serves the same object.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/idle_connections.py [--connections 3000] [--https] [--body-kib 200] [--bin PATH]
Exit status 0 when blobgate stays at or under 16 KiB per idle connection.
"""
import argparse, os, resource, shutil, signal, socket, ssl, subprocess, sys, tempfile, time
from pathlib import Path

from common import free_port, rss_kib, wait_port


def read_response(s):
    """One response with a Content-Length body, read whole from `s`; its status line."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed before the head")
        got += chunk
    head, body = got.split(b"\r\n\r\n", 1)
    length = next(int(l.split(b":", 1)[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("closed mid-body")
        body += chunk
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"unexpected answer: {head[:80]!r}")
    return head.split(b"\r\n")[0]


def measure(port, path, n, pids, headers="", tls=None):
    conns = []
    request = f"GET {path} HTTP/1.1\r\nHost: localhost\r\n{headers}\r\n".encode()

    def connect():
        s = socket.create_connection(("127.0.0.1", port))
        return tls.wrap_socket(s, server_hostname="localhost") if tls else s

    # Warm-up connections so that lazily created state (pools, caches, allocator arenas) is not counted.
    for _ in range(20):
        warm = connect(); warm.sendall(request); read_response(warm); warm.close()
    time.sleep(0.5)
    before = rss_kib(*pids)
    for _ in range(n):
        s = connect()
        s.sendall(request)
        read_response(s)
        conns.append(s)
    time.sleep(1.0)
    after = rss_kib(*pids)
    for s in conns:
        s.close()
    return before, after


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=3000)
    ap.add_argument("--bin", default="target/release/blobgate")
    ap.add_argument("--https", action="store_true")
    ap.add_argument("--body-kib", type=int, default=None, help="object size (default 4 plain, 200 with --https)")
    a = ap.parse_args()
    body_kib = a.body_kib or (200 if a.https else 4)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.connections * 2 + 256), hard))
    tmp = Path(tempfile.mkdtemp(prefix="blobgate-idle-"))
    procs, tls, scheme = [], None, "https" if a.https else "http"
    try:
        os.chmod(tmp, 0o755)  # nginx's workers run as an unprivileged user
        (tmp / "www").mkdir()
        (tmp / "www" / "o.bin").write_bytes(os.urandom(body_kib * 1024))
        serve_tls = []
        if a.https:
            cert, key = tmp / "tls.crt", tmp / "tls.key"
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                            "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                            "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], check=True, capture_output=True)
            tls = ssl.create_default_context(cafile=str(cert))
            serve_tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
        bg = [str(Path(a.bin).resolve()), "--data-dir", str(tmp / "data")]
        subprocess.run(bg + ["bucket", "create", "idle"], check=True, capture_output=True)
        subprocess.run(bg + ["put", "idle", "o.bin", str(tmp / "www" / "o.bin")], check=True, capture_output=True)
        token = subprocess.run(bg + ["token", "create", "--bucket", "idle"], check=True, capture_output=True,
                               text=True).stdout.strip()
        port = free_port()
        server = subprocess.Popen(bg + ["serve", "--listen", f"127.0.0.1:{port}", "--admin-listen",
                                        f"127.0.0.1:{free_port()}", *serve_tls], stderr=subprocess.DEVNULL)
        procs.append(server)
        wait_port(port)
        b0, b1 = measure(port, "/idle/o.bin", a.connections, [server.pid], f"Authorization: Bearer {token}\r\n", tls)
        per_conn = (b1 - b0) / a.connections
        print(f"blobgate ({scheme}, {body_kib} KiB body): {a.connections} idle keep-alive connections, "
              f"RSS {b0} -> {b1} KiB, {per_conn:.1f} KiB per connection")
        nginx_bin = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
        if nginx_bin:
            nport = free_port()
            listen = f"127.0.0.1:{nport}" + (" ssl" if a.https else "")
            certs = f"ssl_certificate {tmp}/tls.crt; ssl_certificate_key {tmp}/tls.key;" if a.https else ""
            conf = tmp / "nginx.conf"
            conf.write_text(f"worker_processes 1; daemon off; error_log {tmp}/nginx.err; pid {tmp}/nginx.pid;\n"
                            f"events {{ worker_connections {a.connections + 100}; }}\n"
                            f"http {{ access_log off; sendfile on; tcp_nopush on; keepalive_timeout 120;\n"
                            f"  keepalive_requests 100000;\n"
                            f"  server {{ listen {listen}; {certs} root {tmp}/www; }} }}\n")
            nginx = subprocess.Popen([nginx_bin, "-c", str(conf)], stderr=subprocess.DEVNULL)
            procs.append(nginx)
            wait_port(nport)
            time.sleep(0.3)
            pids = [int(p) for p in subprocess.run(["pgrep", "-P", str(nginx.pid)], capture_output=True,
                                                   text=True).stdout.split()] + [nginx.pid]
            n0, n1 = measure(nport, "/o.bin", a.connections, pids, "", tls)
            print(f"nginx    ({scheme}, {body_kib} KiB body): {a.connections} idle keep-alive connections, "
                  f"RSS {n0} -> {n1} KiB, {(n1 - n0) / a.connections:.1f} KiB per connection")
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
