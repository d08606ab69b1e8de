#!/usr/bin/env python3
"""Random keys against one hot key over a catalog of --n objects (scale.py's, built once and kept in
$BENCH_WORK/scale/pristine-N), for A/B work on the miss path: each --bin serves a copy of the same catalog (on
SQLite; with --pg URL, one PostgreSQL database all share), and hot and random rounds of 4 KiB GETs alternate
between them, as scale.py's GETs (server on CPU 0, wrk on CPU 1, bearer token on a private bucket). Prints per
round and the medians: req/s, random/hot, server CPU per request. --warm reads every key once first (with a large
`--env BLOBGATE_CACHE__METADATA_BYTES=…`, every key cached); --env sets the servers' environment; --perf records
the first binary's random round (or --perf-kind hot). --charged SECS runs each binary alone, SECS of random keys then --secs of one key,
so whatever else the process does meanwhile (the stats fold) is in its CPU per request; --fold runs each alone and
reports the next stats fold (its phases, and the longest write-lock hold seen meanwhile).

    BENCH_WORK=/tmp/ab python3 scripts/bench/scale_ab.py --bin OLD --bin NEW [--rounds 6] [--secs 5] [--n 1000000]
"""
import argparse, json, os, shutil, subprocess, time, statistics
import common, scale, scaling

ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append", required=True)
ap.add_argument("--project", default=".")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--secs", type=int, default=5)
ap.add_argument("--n", type=int, default=1_000_000)
ap.add_argument("--perf", help="perf record the first binary's random run (--perf-kind) into this file")
ap.add_argument("--perf-kind", choices=("random", "hot"), default="random")
ap.add_argument("--env", action="append", default=[])
ap.add_argument("--warm", action="store_true", help="read every key once first")
ap.add_argument("--pg", help="a PostgreSQL server URL (…/postgres): the catalog in a database of its own there")
ap.add_argument("--charged", type=int, metavar="SECS",
                help="each binary alone in turn: random keys for SECS, then one key for --secs, so that background "
                     "work (the stats fold, once a minute) is charged to the rounds it shares the CPU with")
ap.add_argument("--fold", action="store_true",
                help="each binary alone in turn, SQLite: after --warm, waits for the stats fold and prints its log "
                     "line and the longest write-lock hold scale.py's probe saw meanwhile")
a = ap.parse_args()
common.set_project(a.project)
os.sched_setaffinity(0, {1})
scale.WORK.mkdir(parents=True, exist_ok=True)
pristine = scale.WORK / (f"pristine-{a.n}" + ("-pg" if a.pg else ""))
meta = pristine / "meta.json"
db_url = None
if a.pg:
    db_url = a.pg.rsplit("/", 1)[0] + f"/loop_{a.n}"
if not meta.exists():
    small = scale.WORK / "small.bin"; small.write_bytes(os.urandom(4096))
    if a.pg:
        scale.psql(a.pg, f"DROP DATABASE IF EXISTS loop_{a.n}", f"CREATE DATABASE loop_{a.n}")
    c = scale.Catalog(f"build-{a.n}", common.binary(a.bin[0]), a.n, 100, 0, small, db_url)
    shutil.rmtree(pristine, ignore_errors=True)
    shutil.copytree(c.dd, pristine / "data")
    meta.write_text(json.dumps({"token": c.token}))
    print(f"built in {c.build_secs:.0f} s", flush=True)
token = json.loads(meta.read_text())["token"]

class G(common.Gate):
    def __init__(self, name, binary, dd):
        self.name, self.bin, self.database_url, self.dd = name, str(binary), db_url, dd
        self.admin = common.free_port(); self.token = token; self.objects = a.n
    def start(self):
        self.port = common.free_port()
        env = dict(os.environ); env.update(dict(e.split("=", 1) for e in a.env))
        self.proc = subprocess.Popen(["taskset", "-c", "0", *self.command()], stdout=subprocess.DEVNULL,
                                     stderr=open(scale.WORK / f"{self.name}.log", "ab"), start_new_session=True, env=env)
        scale.first_answer(self.proc, self.port, f"/bench/{scale.REAL_KEY}", {"Authorization": f"Bearer {token}"})

gates = []
for i, b in enumerate(a.bin):
    dd = scale.WORK / f"run-{i}"
    shutil.rmtree(dd, ignore_errors=True)
    shutil.copytree(pristine / "data", dd)
    gates.append(G(f"g{i}", b, dd))
def alone(g):
    """Starts `g` with its debug log (the fold's line), reads every key first with --warm."""
    g.log = scale.WORK / f"{g.name}.log"
    g.log.write_bytes(b"")
    os.environ["RUST_LOG"] = "blobgate=debug"
    g.start()
    if a.warm:
        print(g.bin, "warmed: keys, req/s, us a request", scale.read_distinct(g, a.n, 300), flush=True)

if a.charged or a.fold:
    for g in gates:
        try:
            alone(g)
            if a.charged:
                r = scale.gets(g, g.proc.pid, scale.lua_script("random", a.n), a.charged)
                h = scale.gets(g, g.proc.pid, scale.lua_script("random", 1), a.secs)
                print(f"{g.bin}: random {r[0]:,.0f} req/s, {r[2]:.1f} us a request over {a.charged} s; hot {h[0]:,.0f}, "
                      f"{h[2]:.1f} us; random/hot {r[0] / h[0]:.3f}; rss anon {scale.rss_anon_kib(g.proc.pid) / 1024:.0f} MiB",
                      flush=True)
            if a.fold:
                probe = scale.LockProbe(str(g.dd / "blobgate.db")); probe.start()
                since, deadline, line = time.perf_counter(), time.monotonic() + 600, None
                cpu0 = scaling.run_seconds(g.proc.pid)
                while line is None and time.monotonic() < deadline:
                    time.sleep(0.5)
                    line = next((l for l in open(g.log, errors="replace")
                                 if "download stats folded" in l and " rows=0 " not in l), None)
                probe.finish()
                print(f"{g.bin}: {line.strip() if line else 'no fold within 600 s'}; longest write-lock hold "
                      f"{1000 * probe.longest(since, time.perf_counter()):.1f} ms; the process's CPU from the warm "
                      f"read's end to the fold's end {scaling.run_seconds(g.proc.pid) - cpu0:.1f} s", flush=True)
        finally:
            common.stop_all([g])
    raise SystemExit(0)

try:
    for g in gates: g.start()
    scripts = {"random": scale.lua_script("random", a.n), "hot": scale.lua_script("random", 1)}
    for g in gates: scale.gets(g, g.proc.pid, scripts["hot"], 1)
    if a.warm:
        for g in gates: print("warmed: keys, req/s, us a request", scale.read_distinct(g, a.n, 300), flush=True)
    got = {g.name: {"random": [], "hot": []} for g in gates}
    if a.perf:
        g = gates[0]
        p = subprocess.Popen(["perf", "record", *os.environ.get("PERF_CG", "-g").split(), "-o", a.perf, "-p", str(g.proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        r = scale.gets(g, g.proc.pid, scripts[a.perf_kind], a.secs)
        p.send_signal(2); p.wait()
        print("perf", a.perf_kind, r, flush=True)
    for r in range(a.rounds):
        for g in (gates if r % 2 == 0 else gates[::-1]):
            for kind in (("random", "hot") if r % 2 == 0 else ("hot", "random")):
                got[g.name][kind].append(scale.gets(g, g.proc.pid, scripts[kind], a.secs))
            x = got[g.name]
            print(f"round {r+1} {g.name}: random {x['random'][-1][0]:,.0f} ({x['random'][-1][2]:.1f} us) "
                  f"hot {x['hot'][-1][0]:,.0f} ({x['hot'][-1][2]:.1f} us) ratio {x['random'][-1][0]/x['hot'][-1][0]:.3f}", flush=True)
    for g, b in zip(gates, a.bin):
        x = got[g.name]
        rr = statistics.median(v[0] for v in x["random"]); hh = statistics.median(v[0] for v in x["hot"])
        print(f"{b}: random {rr:,.0f} hot {hh:,.0f} ratio {rr/hh:.3f}; cpu random {statistics.median(v[2] for v in x['random']):.1f} hot {statistics.median(v[2] for v in x['hot']):.1f} us; rss anon {scale.rss_anon_kib(g.proc.pid)/1024:.0f} MiB, {scale.huge_pages_kib(g.proc.pid)/1024:.0f} MiB in huge pages")
finally:
    common.stop_all(gates)
