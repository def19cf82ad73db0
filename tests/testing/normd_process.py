"""Starts a real normd on loopback for the Python tests (Debian's python3)."""

import argparse
import contextlib
import os
import re
import subprocess
import sys
import threading


def parse_test_args(doc, required=()):
    """Parses --normd, --stubs (the generated Python stubs, made importable)
    and each flag named in `required` (e.g. "normctl")."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--normd", required=True)
    parser.add_argument("--stubs", required=True)
    for name in required:
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)
    return args


def start_normd(binary, flags=(), port=0):
    """Starts `binary` on free ports (gRPC on `port` if given); returns
    (process, grpc_port, metrics_port), the ports also as process.grpc_port,
    process.metrics_port and process.http_port (None when a flag turned REST
    off).

    `binary` is a path, or a whole command (e.g. a chroot into a container
    image and its entrypoint) that the loopback and free-port flags follow.
    Reads its log until the "serving" line (kept as process.serving_line),
    then keeps draining it so that the server can never block on a full
    pipe.
    """
    command = [binary] if isinstance(binary, str) else list(binary)
    proc = subprocess.Popen(
        [*command, "--bind_address=127.0.0.1", f"--port={port}",
         "--metrics_port=0", "--http_port=0",
         *flags], stderr=subprocess.PIPE, text=True)
    log = []
    for line in proc.stderr:
        log.append(line)
        match = re.search(
            r"serving gRPC on [^ ]*:(\d+), metrics on [^ ]*:(\d+)", line)
        if match:
            proc.serving_line = line
            rest = re.search(r"REST on [^ ]*:(\d+)", line)
            proc.http_port = int(rest.group(1)) if rest else None
            proc.grpc_port = int(match.group(1))
            proc.metrics_port = int(match.group(2))
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(match.group(1)), int(match.group(2))
    proc.kill()
    raise RuntimeError("normd did not start: " + "".join(log))


@contextlib.contextmanager
def serving(binary, flags=()):
    """start_normd's process for the `with` block; terminated (and waited
    for) when the block ends, however it ends."""
    proc, _, _ = start_normd(binary, flags)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def write_token_file(directory, token):
    """A --auth_token_file holding `token` in `directory`; its path."""
    path = os.path.join(directory, "token")
    with open(path, "w") as f:
        f.write(token)
    return path


def rss_kib(pid, field="VmRSS"):
    """A process's resident memory in KiB (`field`: VmRSS now, VmHWM its
    peak)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def is_serving(channel, service="normd.v1.Normalizer", metadata=None):
    """grpc.health.v1.Health/Check by hand (grpcio's own "grpc" package
    shadows generated health stubs): request {service = 1}, response
    {status = 1}, SERVING = 1."""
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    name = service.encode()
    request = b"\x0a" + bytes([len(name)]) + name if name else b""
    return check(request, timeout=5, metadata=metadata) == b"\x08\x01"


def report(failures, summary):
    """Prints each failure and the summary; the exit code."""
    for f in failures:
        print("FAIL", f)
    print(f"{summary}, {len(failures)} failures")
    return 1 if failures else 0
