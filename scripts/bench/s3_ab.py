#!/usr/bin/env python3
"""Interleaved A/B of two (or more) builds on s3_bench's `get` case: 4 KiB GetObject by bearer and by SigV4 header
auth, wrk as compare.py's `small` case (1 thread on CPU 1, 64 keep-alive connections), every server pinned to
CPU 0 and all of them running at once, so that each round measures every build within seconds of the others.

Per round and build: req/s of each path, and the server's user and system CPU per request (all its threads, from
/proc). Reports, per build, the median SigV4/bearer ratio and CPU per request; then each build's req/s over the
first build's, round by round, by their medians. Those last ratios are what to quote: the machine's speed drifts
between rounds by more than a change moves it, and a round-by-round ratio of two builds cancels that drift.

--limits: every build that has `blobgate limits` (`BIN limits --help` exits 0) gets, before its server starts, limits
that cover every request of the bench and are never reached (`--requests 100000000/s --concurrent 1000000
--read 1000GiB/s`, the options its `limits set --help` lists) on `default`, `bucket:bench`, the bench's read token
(`token:ID`) and its S3 key (`s3-key:ACCESS_KEY_ID`); so the A/B shows what the limit checks cost. Builds without
the command run as they are. A limit reached would fail the round (non-2xx answers).

    python3 scripts/bench/s3_ab.py --bin OLD --bin NEW [--rounds 12] [--secs 3] [--limits]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_bench  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def server_cpu(pid):
    """(user, system) seconds of all of `pid`'s threads."""
    user = system = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        user, system = user + int(fields[11]), system + int(fields[12])
    return user / TICK, system / TICK


# Never reached on this bench: far above what one core serves, in requests, requests in progress and bytes.
NEVER_REACHED = (("--requests", "100000000/s"), ("--concurrent", "1000000"), ("--read", "1000GiB/s"))


def limit_options(binary):
    """The options of NEVER_REACHED that `binary limits set` takes, or None when `binary` has no `limits`."""
    def help_of(*args):
        return subprocess.run([binary, *args, "--help"], capture_output=True, text=True, cwd=s3_bench.common.PROJECT)
    if help_of("limits").returncode != 0:
        return None
    usage = help_of("limits", "set").stdout
    return [(opt, value) for opt, value in NEVER_REACHED if re.search(rf"\s{re.escape(opt)}\s", usage)]


def set_limits(server, options):
    """Limits set with `options` on default, the bench's bucket, its read token and its S3 key, through the CLI on
    the server's data dir (before it starts); returns the principals."""
    tokens = [json.loads(line) for line in server.cli("token", "list").splitlines() if line.strip()]
    ids = [t["id"] for t in tokens if t["id"] in server.token]
    if len(ids) != 1:
        raise RuntimeError(f"{server.name}: {len(ids)} listed tokens match the bench's token")
    principals = ["default", "bucket:bench", f"token:{ids[0]}", f"s3-key:{server.key_id}"]
    for principal in principals:
        server.cli("limits", "set", principal, *[a for pair in options for a in pair])
    return principals


def round_of(server, kind, secs):
    """(req/s, user µs per request, system µs per request) of one wrk run."""
    headers = ({"Authorization": f"Bearer {server.token}"} if kind == "bearer"
               else server.signed_object_headers("small.bin"))
    before = server_cpu(server.proc.pid)
    rps, errors, requests = s3_bench.common.wrk(server.url("small.bin"), secs, headers)
    after = server_cpu(server.proc.pid)
    if errors:
        raise RuntimeError(f"{server.name}: {errors} non-2xx answers to {kind}")
    return rps, (after[0] - before[0]) / requests * 1e6, (after[1] - before[1]) / requests * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="a build; give two or more, the first is the base")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--secs", type=int, default=3)
    ap.add_argument("--limits", action="store_true",
                    help="set never-reached limits on every principal of the bench, on the builds that have them")
    args = ap.parse_args()
    if len(args.bin) < 2:
        sys.exit("s3_ab: give at least two --bin")
    # Made here, as s3_bench does: left to the server, the bench's work directory would be created private (0700),
    # and nginx's worker could not read compare.py's files under it afterwards.
    s3_bench.WORK.mkdir(parents=True, exist_ok=True)
    small = Path(tempfile.mkdtemp(prefix="s3-ab-")) / "small.bin"
    small.write_bytes(os.urandom(4096))
    servers = []
    try:
        for i, binary in enumerate(args.bin):
            server = s3_bench.S3Gate(f"ab{i}", str(Path(binary).resolve()), files=[small])
            if args.limits:
                options = limit_options(server.bin)
                if options is None:
                    print(f"build {i} ({binary}): no limits (it has no `limits` command)", flush=True)
                else:
                    principals = set_limits(server, options)
                    missing = [opt for opt, _ in NEVER_REACHED if opt not in dict(options)]
                    print(f"build {i} ({binary}): limits {' '.join(a for pair in options for a in pair)} on "
                          f"{', '.join(principals)}" + (f" (its `limits set` has no {', '.join(missing)})"
                                                        if missing else ""), flush=True)
            server.start()
            servers.append(server)
        for server in servers:
            s3_bench.check_get(server, {"Authorization": f"Bearer {server.token}"})
            s3_bench.check_get(server, server.signed_object_headers("small.bin"))
        runs = {}
        for r in range(args.rounds):
            # The order alternates, so that neither path nor build always runs first.
            order = [(i, kind) for i in range(len(servers)) for kind in ("bearer", "sigv4")]
            for i, kind in (order if r % 2 == 0 else order[::-1]):
                rps, user, system = round_of(servers[i], kind, args.secs)
                runs.setdefault((i, kind), []).append((rps, user, system))
                print(f"round {r + 1} build {i} {kind:6}: {rps:9,.0f} req/s, server {user:5.2f} µs user "
                      f"+ {system:5.2f} µs system per request", flush=True)
    finally:
        s3_bench.stop_all(servers)

    def median(values):
        return statistics.median(values)

    print()
    for i, binary in enumerate(args.bin):
        bearer, sigv4 = runs[(i, "bearer")], runs[(i, "sigv4")]
        ratio = median([s[0] / b[0] for b, s in zip(bearer, sigv4)])
        print(f"build {i} ({binary}): SigV4/bearer req/s median {ratio:.3f}; per request, bearer "
              f"{median([b[1] for b in bearer]):.2f} µs user + {median([b[2] for b in bearer]):.2f} system, SigV4 "
              f"{median([s[1] for s in sigv4]):.2f} + {median([s[2] for s in sigv4]):.2f}")
    for i in range(1, len(args.bin)):
        for kind in ("bearer", "sigv4"):
            ratio = median([n[0] / o[0] for o, n in zip(runs[(0, kind)], runs[(i, kind)])])
            print(f"build {i} / build 0, {kind} req/s: median {ratio:.3f} over {args.rounds} rounds")


if __name__ == "__main__":
    main()
