"""Starts a real normd on loopback for the Python tests (Debian's python3)."""

import argparse
import contextlib
import os
import re
import signal
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


SERVING = re.compile(r"serving gRPC on [^ ]*:(\d+)")


class Normd:
    """A normd child process on loopback, the one way every Python test
    starts normd: free ports (gRPC on `port` if given), `flags` after the
    defaults (so that they override them), its log (stderr) drained by a
    thread into `lines` so that the server never blocks on a full pipe, and
    start() again after stop() on the same flags (a restart on its state
    directory).

    `binary` is a path, or a whole command (e.g. a chroot into a container
    image and its entrypoint) that the loopback and free-port flags follow.
    Driven by one test thread.
    """

    def __init__(self, binary, flags=(), port=0, env=None):
        self.command = [binary] if isinstance(binary, str) else list(binary)
        self.flags = list(flags)
        self.port_flag = port
        self.env = env
        self.proc = None
        self.lines = []
        self._drain = None
        self._reset()

    def _reset(self):
        self.grpc_port = self.metrics_port = self.http_port = None
        self.serving_line = None

    @property
    def log(self):
        return "".join(self.lines)

    def target(self):
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, timeout=60):
        """Starts it; True once it serves, False (its log and exit code
        kept) if it exits first or does not serve within `timeout`."""
        self.lines = []
        self._reset()
        proc = subprocess.Popen(
            [*self.command, "--bind_address=127.0.0.1",
             f"--port={self.port_flag}", "--metrics_port=0", "--http_port=0",
             *self.flags], stderr=subprocess.PIPE, text=True,
            errors="replace", env=self.env)
        self.proc = proc
        ready = threading.Event()

        def drain():
            for line in proc.stderr:
                self.lines.append(line)
                match = SERVING.search(line)
                if match and self.serving_line is None:
                    metrics = re.search(r"metrics on [^ ]*:(\d+)", line)
                    rest = re.search(r"REST on [^ ]*:(\d+)", line)
                    self.grpc_port = int(match.group(1))
                    self.metrics_port = int(metrics.group(1)) if metrics else None
                    self.http_port = int(rest.group(1)) if rest else None
                    self.serving_line = line
                    ready.set()
            ready.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        ready.wait(timeout)
        if self.serving_line is None or proc.poll() is not None:
            if proc.poll() is None:
                self.stop(signal.SIGKILL)
            else:
                self._drain.join(timeout=5)
            return False
        return True

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig` and waits (SIGKILL past `timeout`); the exit code
        (negative: killed by a signal), None if it was not started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._drain.join(timeout=5)  # The log's last lines.
        return code


def start_normd(binary, flags=(), port=0):
    """Starts `binary` (see Normd); returns (process, grpc_port,
    metrics_port), the process a subprocess.Popen with the ports also as
    process.grpc_port, process.metrics_port and process.http_port (None when
    a flag turned one off), its "serving" line as process.serving_line and
    its Normd as process.normd. Raises RuntimeError with the log if normd
    does not start."""
    normd = Normd(binary, flags, port)
    if not normd.start():
        raise RuntimeError("normd did not start: " + normd.log)
    proc = normd.proc
    proc.normd = normd
    proc.grpc_port = normd.grpc_port
    proc.metrics_port = normd.metrics_port
    proc.http_port = normd.http_port
    proc.serving_line = normd.serving_line
    return proc, normd.grpc_port, normd.metrics_port


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
