"""A fork server for the tests' Python clients: imports boto3 (or aws-cli) once, then runs each script it is sent
in a process forked from that state, so that no script pays for the imports again (docs/measurements.md).

    python_server.py boto3|awscli SOCKET

Started once per test run by scripts/test-services. Each connection to the Unix socket SOCKET carries one
request, a JSON line:

    {"argv": ["-c", CODE, ARG...] or [SCRIPT, ARG...], "env": {...}, "cwd": DIR, "stdout": FILE, "stderr": FILE}

`argv` is what follows the interpreter on a command line. The script runs as `__main__` in a process forked from
this one, with exactly that environment, working directory and `sys.argv` (as `python3 ARGV...` sets them), stdin
from /dev/null and its output in the two files (which exist); once it has exited, the answer is one JSON line,
`{"wait_status": N}`, as waitpid(2) gives it.

Nothing one script does reaches another: each process starts from the state right after the imports. That state
also holds botocore's data files (the S3 model, endpoints, partitions) parsed but unused: the first load of each
in a script's process takes that copy (its own, by fork) instead of parsing the file again. A script's process
ends as an interpreter's exit ends it for all a script can see (threads joined, atexit handlers run, output
flushed), without tearing the imported modules down.
"""

import gc
import gzip
import json
import os
import signal
import socket
import sys

import botocore.loaders

kind, path = sys.argv[1], sys.argv[2]


def warm_up():
    """What a typical script of this kind loads; run in a throw-away process."""
    endpoint, key = "http://127.0.0.1:9", {"aws_access_key_id": "k", "aws_secret_access_key": "s"}
    if kind == "boto3":
        import boto3
        from botocore.config import Config

        config = Config(signature_version="s3v4", s3={"addressing_style": "path"}, retries={"max_attempts": 1})
        s3 = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config, **key)
        s3.get_paginator("list_objects_v2")
    else:
        os.environ.update(AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s", AWS_MAX_ATTEMPTS="1")
        awscli.clidriver.create_clidriver().main(["--endpoint-url", endpoint, "--region", "us-east-1", "s3", "ls"])


if kind == "boto3":
    import boto3  # noqa: F401
    import boto3.s3.transfer  # noqa: F401
    import botocore.auth  # noqa: F401
    import botocore.awsrequest  # noqa: F401
    import botocore.config  # noqa: F401
    import botocore.credentials  # noqa: F401
    import botocore.exceptions  # noqa: F401
elif kind == "awscli":
    import awscli
    import awscli.clidriver

    # What aws-cli's import set in the environment (its data directory), to set again in each script's.
    awscli_data_path = awscli._awscli_data_path[-1]
else:
    sys.exit(f"python_server.py: unknown kind {kind!r}: boto3 or awscli")
# Modules the tests' scripts import beside those.
import base64, datetime, hashlib, hmac, http.client, io, threading, time, zlib  # noqa: E401, E402, F401

# The data files a warm-up loads, recorded in a process of its own (its side effects die with it), then parsed
# here, where nothing uses them.
parse = botocore.loaders.JSONFileLoader()._load_file
reader, writer = os.pipe()
if os.fork() == 0:
    os.close(reader)
    loaded = []

    def recording(self, full_path, open_method, load=botocore.loaders.JSONFileLoader._load_file):
        data = load(self, full_path, open_method)
        if data is not None:
            loaded.append(full_path)
        return data

    botocore.loaders.JSONFileLoader._load_file = recording
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        warm_up()
    finally:
        os.write(writer, json.dumps(loaded).encode())
        os._exit(0)
os.close(writer)
with os.fdopen(reader, "rb") as recorded:
    parsed = {p: parse(p, gzip.open if p.endswith(".gz") else open) for p in json.loads(recorded.read() or b"[]")}
os.wait()


def load_file(self, full_path, open_method, load=botocore.loaders.JSONFileLoader._load_file):
    data = parsed.pop(full_path, None)
    if data is None:
        return load(self, full_path, open_method)
    botocore.loaders.logger.debug("Loading JSON file: %s", full_path)
    return data


botocore.loaders.JSONFileLoader._load_file = load_file

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(64)


def reap(signum, frame):
    """Waits for the processes forked for connections, so that their CPU time counts as this server's."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] != 0:
            pass
    except ChildProcessError:
        pass


signal.signal(signal.SIGCHLD, reap)
print(f"python_server.py: {kind} ready, {len(parsed)} data files parsed", flush=True)
sys.stderr.flush()

# What is here now stays: the collector of a script's process never walks it (which would write to its pages).
gc.freeze()

# The server's loop: only a process forked for a connection goes past it.
while True:
    conn, _ = listener.accept()
    if os.fork() == 0:
        break
    conn.close()

listener.close()
signal.signal(signal.SIGCHLD, signal.SIG_DFL)
with conn.makefile("rb") as lines:
    request = json.loads(lines.readline())
pid = os.fork()
if pid != 0:
    _, status = os.waitpid(pid, 0)
    conn.sendall(json.dumps({"wait_status": status}).encode() + b"\n")
    conn.close()
    os._exit(0)

# The script's process: its own environment, directory, argv and files, then the script as `__main__`; an
# exception or `sys.exit` ends it as it ends `python3 -c` (a traceback and status 1, or the exit code).
conn.close()
env = request["env"]
if kind == "awscli":
    given = [os.path.expanduser(os.path.expandvars(p)) for p in env.get("AWS_DATA_PATH", "").split(os.pathsep) if p]
    env["AWS_DATA_PATH"] = os.pathsep.join(given + [awscli_data_path])
os.environ.clear()
os.environ.update(env)
os.chdir(request["cwd"])
for fd, name, flags in (
    (0, os.devnull, os.O_RDONLY),
    (1, request["stdout"], os.O_WRONLY | os.O_TRUNC),
    (2, request["stderr"], os.O_WRONLY | os.O_TRUNC),
):
    opened = os.open(name, flags)
    os.dup2(opened, fd)
    os.close(opened)
sys.argv = list(request["argv"])
del listener, conn, lines, request, env, pid
# A fresh `__main__` module for the script, as the interpreter makes one.
sys.modules["__main__"] = type(sys)("__main__")
__main = sys.modules["__main__"].__dict__
__main["__builtins__"] = __builtins__
if sys.argv[0] == "-c":
    sys.path[0] = ""
    __script = compile(sys.argv.pop(1), "<string>", "exec")
else:
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    __main["__file__"] = sys.argv[0]
    with open(sys.argv[0], "rb") as __f:
        __script = compile(__f.read(), sys.argv[0], "exec")
    del __f
import atexit, threading  # noqa: E401, E402

try:
    exec(__script, __main)
    __status = 0
except SystemExit as e:
    __status = 0 if e.code is None else e.code
    if not isinstance(__status, int):
        print(__status, file=sys.stderr)
        __status = 1
except BaseException:
    sys.excepthook(*sys.exc_info())
    __status = 1
# What an interpreter's exit does that a script can see (its threads joined, its atexit handlers run, its output
# flushed), then the exit itself: tearing down the imported modules would write to every page shared with the
# server, which costs more CPU than the script.
threading._shutdown()
atexit._run_exitfuncs()
for __stream in (sys.stdout, sys.stderr):
    try:
        __stream.flush()
    except Exception:
        __status = 120
os._exit(__status & 0xFF)
