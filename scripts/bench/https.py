#!/usr/bin/env python3
"""HTTPS against nginx, interleaved: server CPU seconds per GiB of a large download and 4 KiB req/s, each server
with the same throw-away ECDSA P-256 certificate, through ../shared/bench/compare.py's own wrappers and cases
(`bench_cpu`: sequential curl downloads; `bench_small`: wrk, one thread, 64 keep-alive connections, bearer token on
a private bucket for blobgate, metrics and stats on). Server on CPU 0, clients on CPU 1.

compare.py's `--tls` runs each case once. Here every repetition runs both servers (the order alternating) and the
table gives each server's median and the median, min and max of the per-repetition ratios: the figure to quote.

Like for like: nginx 1.22 (Debian's) enables TLS 1.2 only by default; here it is also given TLS 1.3, so both
servers negotiate TLS 1.3 with curl and wrk (the protocol and cipher each negotiated are printed). On a kernel
without TLS, blobgate's path is the user-space one (rustls, bodies `pread` into one buffer per connection), and
nginx's is OpenSSL's: both copy and encrypt in user space.

`--ktls-vm` measures the kernel-TLS path instead, in ../shared/kernel-vm/run (a VM whose kernel has TLS; this
machine's has none): the release build serves a 64 MiB object over HTTPS to curl under `strace -f -yy`, full, one
range and a 3-part multi-range over TLS 1.3 and 1.2, and the table gives the bytes sendfile carried and those
copied by read/write-like calls on the download's socket (plus any read of the blob), per body byte, as
tests/https/ktls_in_vm.sh records them. nginx's anchor there is 0.00004 (README of kernel-vm). Functional
figures, not timing: the VM emulates its CPU.

Usage (from the project root, after `cargo build --release`):
    python3 scripts/bench/https.py [--reps 5] [--big-mib 256] [--rounds 4] [--secs 8] [--json out.json]
    python3 scripts/bench/https.py --ktls-vm
"""
import argparse, json, os, re, statistics, subprocess, tempfile
from pathlib import Path

import common
from common import compare


class Nginx13(compare.Nginx):
    """compare.py's nginx, with TLS 1.3 enabled beside 1.2."""

    def __init__(self, data):
        super().__init__(data)
        conf = self.conf.read_text()
        self.conf.write_text(conf.replace("ssl_certificate_key", "ssl_protocols TLSv1.2 TLSv1.3; ssl_certificate_key"))


def negotiated(server):
    """The protocol and cipher curl negotiates with `server`, from its verbose output."""
    server.start()
    try:
        out = subprocess.run(["curl", "-skv", "-o", "/dev/null", *server.headers(), server.url("small.bin")],
                             capture_output=True, text=True).stderr
    finally:
        server.stop()
    m = re.search(r"SSL connection using (\S+) / (\S+)", out)
    return f"{m.group(1)} {m.group(2)}" if m else "unknown"


def table(name, runs, fmt, reps):
    ratios = [b / max(n, 1e-9) for b, n in zip(runs["blobgate"], runs["nginx"])]
    row = {"blobgate": statistics.median(runs["blobgate"]), "nginx": statistics.median(runs["nginx"]),
           "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
           "runs": runs}
    print(f"| {name} | {fmt.format(row['blobgate'])} | {fmt.format(row['nginx'])} | "
          f"{row['ratio_median']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f} over {reps}) |")
    return row


COPY_CALLS = {"read", "readv", "recvfrom", "recvmsg", "write", "writev", "sendto", "sendmsg", "pwrite64"}


def download_copies(trace):
    """(bytes by sendfile, bytes copied) on the data listener's connections (port 8443) of an `strace -f -yy` file,
    plus any read of a blob file: what tests/api/https.rs's `socket_copies` counts."""
    def named(fd):
        m = re.search(r"<(.*)>", fd)
        return m.group(1) if m else ""
    pending, listeners, downloads = {}, set(), set()
    sent = copied = 0
    for line in trace.splitlines():
        tid, _, call = line.partition(" ")
        call = call.lstrip()
        if call.startswith("<... "):
            if tid not in pending:
                continue
            name, args = pending.pop(tid)
        else:
            name, _, args = call.partition("(")
            if line.endswith("<unfinished ...>"):
                pending[tid] = (name, args)
                continue
        m = re.search(r"\)\s+=\s+(\S+)", line)
        result = m.group(1) if m else ""
        moved = max(int(result), 0) if re.fullmatch(r"-?\d+", result) else 0
        fd = named(args.split(", ")[0])
        if name == "bind" and "htons(8443)" in args:
            listeners.add(fd)
        elif name == "accept4" and fd in listeners and not result.startswith("-"):
            downloads.add(named(result))
        elif name == "sendfile" and fd in downloads:
            sent += moved
        elif name in ("pread64", "preadv") and "/blobs/" in fd:
            copied += moved
        elif name in COPY_CALLS and fd in downloads:
            copied += moved
    return sent, copied


KTLS_CASES = ["full13", "full12", "range13", "range12", "multi13", "multi12"]  # as ktls_in_vm.sh names them


def ktls_vm(project):
    """The kernel-TLS copies per body byte, in the kernel VM (see the module's doc)."""
    project = Path(project).resolve()
    vm = project.parent / "shared" / "kernel-vm" / "run"
    binary = project / "target" / "release" / "blobgate"
    out = Path(tempfile.mkdtemp(prefix="ktls-vm-"))
    os.chmod(out, 0o755)
    (out / "obj.bin").write_bytes(os.urandom(64 << 20))
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", out / "key.pem", "-out", out / "cert.pem", "-subj", "/CN=localhost", "-days", "2",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True)
    subprocess.run([vm, "--rw", out, "--", "bash", project / "tests/https/ktls_in_vm.sh", binary, out, *KTLS_CASES],
                   check=True, capture_output=True, cwd=project)
    print("| case | response body | by sendfile | copied | per body byte sent |\n|---|---|---|---|---|")
    rows = {}
    for case in KTLS_CASES:
        body = (out / f"body-{case}").stat().st_size
        sent, copied = download_copies((out / f"strace-{case}.txt").read_text(errors="replace"))
        rows[case] = {"body": body, "sendfile": sent, "copied": copied, "per_body_byte": copied / max(sent, 1)}
        print(f"| {case} | {body:,} | {sent:,} | {copied:,} | {copied / max(sent, 1):.5f} |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5, help="interleaved repetitions")
    ap.add_argument("--big-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4, help="downloads of the big object per CPU measurement")
    ap.add_argument("--secs", type=int, default=8, help="wrk seconds per 4 KiB measurement")
    ap.add_argument("--project", default=".")
    ap.add_argument("--json")
    ap.add_argument("--ktls-vm", action="store_true", help="the kernel-TLS copies per body byte, in the kernel VM")
    a = ap.parse_args()
    if a.ktls_vm:
        rows = ktls_vm(a.project)
        if a.json:
            Path(a.json).write_text(json.dumps(rows, indent=1))
        return
    compare.need("nginx", "nginx-light"); compare.need("wrk", "wrk"); compare.need("curl", "curl")
    compare.WORK = compare.WORK / "https"
    compare.WORK.mkdir(parents=True, exist_ok=True)
    compare.TLS = compare.make_cert()
    data = compare.make_data(a.big_mib)
    big = a.big_mib << 20
    servers = {"blobgate": compare.Blobgate(data, a.project), "nginx": Nginx13(data)}
    for name, server in servers.items():
        print(f"{name} negotiates {negotiated(server)}", flush=True)
    cpu = {name: [] for name in servers}
    rps = {name: [] for name in servers}
    for rep in range(a.reps):
        order = list(servers) if rep % 2 == 0 else list(reversed(servers))
        for name in order:
            c = compare.bench_cpu(servers[name], a.rounds, big)
            s = compare.bench_small(servers[name], a.secs)
            if s["non_2xx"]:
                raise SystemExit(f"{name}: {s['non_2xx']} non-2xx answers under wrk")
            cpu[name].append(c["cpu_s_per_gib"])
            rps[name].append(s["req_per_s"])
            print(f"rep {rep + 1} {name}: {c['cpu_s_per_gib']:.3f} CPU s/GiB, {s['req_per_s']} req/s (4 KiB)",
                  flush=True)
    print("\n| over HTTPS | blobgate (median) | nginx (median) | ratio blobgate/nginx: median (min-max) |"
          "\n|---|---|---|---|")
    result = {"cpu_s_per_gib": table("server CPU per GiB", cpu, "{:.3f} s", a.reps),
              "req_per_s": table("4 KiB req/s", rps, "{:,.0f}", a.reps)}
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
