"""What the hostile-input tests share (tests/*/..._test.py that replay
attacks against a real normd): normd on loopback whose log is kept (so that
a test can read start-up warnings), restarted on the same state directory,
idle clients, and checks that collect failures instead of stopping at the
first.

Run by Debian's /usr/bin/python3 (python3-grpcio); the generated stubs come
from --stubs.
"""

import argparse
import re
import signal
import sys
import threading

import normd_process


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


class Server(normd_process.Normd):
    """normd_process.Normd on a state directory if given, registered while
    it runs so that kill_all() stops it when a test ends early."""

    def __init__(self, binary, flags=(), state_dir=None):
        flags = list(flags)
        if state_dir is not None:
            flags.append(f"--state_dir={state_dir}")
        super().__init__(binary, flags)

    @property
    def port(self):
        return self.grpc_port

    def start(self, timeout=60):
        RUNNING.add(self)
        started = super().start(timeout)
        if not started:
            RUNNING.discard(self)
        return started

    def stop(self, sig=signal.SIGTERM, timeout=60):
        code = super().stop(sig, timeout)
        self.proc = None
        RUNNING.discard(self)
        return code

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


CHECKS = Checks()


def main(name, tests):
    """Runs each test in turn (see Checks.run); the exit code."""
    for test in tests:
        CHECKS.run(test)
    return CHECKS.report(name)
