"""What the red-team tests share: a real normd on loopback whose log is kept
(so that a test can read start-up warnings), restarted on the same state
directory, raw calls with arbitrary bytes, and checks that collect failures
instead of stopping at the first.

Run by Debian's /usr/bin/python3 (python3-grpcio); the generated stubs come
from --stubs.
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "testing"))  # normd_process


def parse_args(doc, extra=()):
    """--normd, --stubs and `extra` ((flag, kwargs) pairs); makes the stubs
    importable."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--normd", required=True)
    parser.add_argument("--stubs", required=True)
    for flag, kwargs in extra:
        parser.add_argument(flag, **kwargs)
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)
    return args


INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


RUNNING = set()  # Servers to kill if a test ends early.
BLOCKED = []  # Blockers to release then.


def kill_all():
    for blocker in BLOCKED:
        blocker.released.set()
    BLOCKED.clear()
    for server in list(RUNNING):
        server.stop(signal.SIGKILL)


class Blocker:
    """A request iterator that yields `messages`, then blocks until
    released (an idle client)."""

    def __init__(self, messages=()):
        self.messages = list(messages)
        self.released = threading.Event()
        BLOCKED.append(self)

    def __iter__(self):
        yield from self.messages
        self.released.wait(120)


class Server:
    """A normd child process; `log` holds everything it wrote."""

    def __init__(self, binary, flags=(), state_dir=None):
        self.binary = binary
        self.flags = list(flags)
        if state_dir is not None:
            self.flags.append(f"--state_dir={state_dir}")
        self.proc = None
        self.port = None
        self.metrics_port = None
        self.lines = []

    @property
    def log(self):
        return "".join(self.lines)

    def start(self, timeout=60):
        """Starts it; True once it serves, False (log kept) if it exits."""
        self.lines = []
        self.proc = subprocess.Popen(
            [self.binary, "--bind_address=127.0.0.1", "--port=0",
             "--metrics_port=0", "--http_port=0", *self.flags],
            stderr=subprocess.PIPE, text=True, errors="replace")
        RUNNING.add(self)
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.lines.append(line)
                match = re.search(
                    r"serving gRPC on [^ ]*:(\d+), metrics on [^ ]*:(\d+)",
                    line)
                if match:
                    self.port = int(match.group(1))
                    self.metrics_port = int(match.group(2))
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        ready.wait(timeout)
        if self.port is None or self.proc.poll() is not None:
            self.stop(signal.SIGKILL)
            self.port = None
            return False
        return True

    def stop(self, sig=signal.SIGTERM, timeout=60):
        """Sends `sig` and waits; the exit code (negative: killed by it)."""
        if self.proc is None:
            return None
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        time.sleep(0.05)  # The log thread reads the last lines.
        self.proc = None
        RUNNING.discard(self)
        return code

    def target(self):
        return f"127.0.0.1:{self.port}"

    def rss_mib(self):
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def metric(self, name):
        """The value of an unlabelled series of /metrics."""
        import urllib.request
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10
        ).read().decode()
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(match.group(1)) if match else None


class Checks:
    """Collects failed expectations with what was being checked."""

    def __init__(self):
        self.failures = []
        self.passed = 0
        self.section = ""

    def begin(self, section):
        self.section = section
        print(f"-- {section}", flush=True)

    def expect(self, condition, what):
        if condition:
            self.passed += 1
        else:
            self.failures.append(f"{self.section}: {what}")
            print(f"FAIL {self.section}: {what}", flush=True)
        return condition

    def expect_error(self, call, code, *fragments, what=""):
        """Runs `call`; expects it to fail with `code` and a message holding
        every fragment (and under 1 KiB). Returns the exception or None."""
        import grpc
        try:
            call()
        except grpc.RpcError as error:
            details = error.details() or ""
            ok = self.expect(error.code() == code,
                             f"{what}: code {error.code()}, want {code}: "
                             f"{details[:300]}")
            for fragment in fragments:
                ok &= self.expect(fragment in details,
                                  f"{what}: {fragment!r} not in {details!r}")
            self.expect(len(details.encode()) < 1024,
                        f"{what}: message of {len(details.encode())} bytes")
            return error if ok else None
        self.expect(False, f"{what}: succeeded, want {code}")
        return None

    def run(self, test):
        """Runs `test`; an exception is a failure of its section, and the
        servers it left running are killed."""
        try:
            test()
        except Exception as error:  # noqa: BLE001 - reported as a failure.
            import traceback
            traceback.print_exc()
            self.expect(False, f"raised {type(error).__name__}: "
                        f"{str(error)[:500]}")
        finally:
            kill_all()

    def report(self, name):
        print(f"{name}: {self.passed} checks passed, "
              f"{len(self.failures)} failed")
        for failure in self.failures:
            print("FAIL", failure)
        return 1 if self.failures else 0
