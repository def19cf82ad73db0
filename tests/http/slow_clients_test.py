#!/usr/bin/python3
"""Slow and partial clients against a real normd's REST port: none of them
can lock anyone out, hold the server, or delay its shutdown.

- 64 clients without a token send headers announcing a 1 MB body, then
  trickle it a byte at a time: each is answered 401 at once (its body never
  read), and meanwhile /v2/health/live, /v2/health/ready and a valid infer
  are answered within a second or two;
- 64 clients with the token trickle their bodies: each is cut with 408
  naming --http_min_body_rate after about a second;
- 64 clients trickle their headers: each gets 408 naming
  --http_header_timeout;
- a client without a token that pauses 2 s before sending the rest of its
  body still reads its 401; one that trickles the rest is closed after
  --http_idle_timeout;
- with one client trickling a body just fast enough to stay, SIGTERM under
  --shutdown_grace=2s ends the process within the grace plus a second.

Usage: slow_clients_test.py --normd BUILD/normd --stubs BUILD/python
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import normd_process  # noqa: E402
from raw_http import Connection, request  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
from oip_cases import Checker  # noqa: E402

TOKEN = "slow-clients-token"
INFER = "/v2/models/layer_norm/infer"
AUTH = [("Authorization", f"Bearer {TOKEN}")]
BODY = json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                               "shape": [2, 2],
                               "data": [1, 2, 3, 5]}]}).encode()


def probe(c, port, what):
    """live, ready and a valid infer, each answered promptly."""
    for method, path, headers, body in (
            ("GET", "/v2/health/live", [], b""),
            ("GET", "/v2/health/ready", [], b""),
            ("POST", INFER, AUTH, BODY)):
        start = time.monotonic()
        try:
            with Connection(port, timeout=10) as conn:
                conn.send(request(method, path, body, headers))
                reply = conn.response()
        except OSError as e:
            reply = None
            print(f"{what}: {path}: {e}")
        took = time.monotonic() - start
        c.expect(reply is not None and reply[0] == 200 and took < 2,
                 f"{what}: {path} got {reply and reply[0]} after "
                 f"{took:.1f} s")


class Trickler(threading.Thread):
    """A client that sends `head`, then trickles `rest` a byte every
    `every` seconds, and records the answer it gets and when."""

    def __init__(self, port, head, rest, every):
        super().__init__(daemon=True)
        self.conn = Connection(port, timeout=30)
        self.head, self.rest, self.every = head, rest, every
        self.reply, self.after = None, None
        self.ready = threading.Event()

    def run(self):
        start = time.monotonic()
        self.conn.send(self.head)
        self.ready.set()
        sender = threading.Thread(
            target=self.conn.trickle, args=(self.rest, self.every),
            daemon=True)
        sender.start()
        self.reply = self.conn.response()
        self.after = time.monotonic() - start
        self.conn.close()


def run_tricklers(port, head, rest, every, count=64):
    tricklers = [Trickler(port, head, rest, every) for _ in range(count)]
    for t in tricklers:
        t.start()
    for t in tricklers:
        t.ready.wait(10)
    return tricklers


def check_tricklers(c, port, what, head, rest, every, status, needle,
                    within):
    """64 clients trickle `rest` after `head`: health and infer stay prompt
    meanwhile, and each trickler gets `status` (its message naming
    `needle`) within `within` seconds."""
    tricklers = run_tricklers(port, head, rest, every)
    probe(c, port, f"64 {what}")
    for t in tricklers:
        t.join(15)
    statuses = [t.reply and t.reply[0] for t in tricklers]
    slowest = max(t.after or 99 for t in tricklers)
    c.expect(statuses == [status] * 64 and slowest < within and
             all(needle in t.reply[2] for t in tricklers if t.reply),
             f"{what}: {set(statuses)}, slowest answer after {slowest:.1f} s")


def check_tokenless_tricklers(c, port):
    check_tricklers(
        c, port, "tokenless body tricklers",
        request("POST", INFER, headers=[("Content-Length", "1000000")]),
        b"x" * 100, 1.0, 401, b"Authorization", 3)


def check_body_tricklers(c, port):
    check_tricklers(
        c, port, "body tricklers",
        request("POST", INFER, headers=AUTH + [("Content-Length",
                                                "1000000")]),
        b"x" * 100, 0.5, 408, b"--http_min_body_rate", 5)


def check_header_tricklers(c, port):
    check_tricklers(
        c, port, "header tricklers", b"G",
        b"ET /v2/health/live HTTP/1.1\r\nHost: x\r\n" * 4, 0.5, 408,
        b"--http_header_timeout", 8)


def check_lingering(c, port):
    """A body answered before it was read (401 here) is discarded while the
    client still sends it: a client that pauses 2 s before sending the rest
    can send it and then read its answer (no reset), and one that trickles
    the rest is closed after the idle timeout (5 s), not held for the
    linger timeout (30 s)."""
    head = request("POST", INFER, headers=[
        ("Content-Length", str(65536 + 4096 * 33))])
    with Connection(port, timeout=10) as conn:
        try:
            conn.send(head + b"x" * 65536)
            time.sleep(2)
            for _ in range(33):  # In pieces, as an HTTP client sends.
                conn.send(b"x" * 4096)
                time.sleep(0.01)
            reply = conn.response()
        except OSError as e:
            reply = f"{type(e).__name__} {e}"
        c.expect(isinstance(reply, tuple) and reply[0] == 401 and
                 b"Authorization" in reply[2],
                 f"a client pausing 2 s before the rest of its body: "
                 f"{reply if isinstance(reply, str) else reply[:2]}")
    with Connection(port, timeout=10) as conn:
        conn.send(request("POST", INFER,
                          headers=[("Content-Length", "1000000")]))
        reply = conn.response()
        start = time.monotonic()
        sent = conn.trickle(b"x" * 100, 0.25)
        took = time.monotonic() - start
        c.expect(reply is not None and reply[0] == 401 and sent < 100 and
                 4.5 <= took < 8,
                 f"a trickler after its answer: {reply and reply[0]}, "
                 f"closed after {took:.1f} s and {sent} bytes (idle "
                 f"timeout 5 s)")


def check_shutdown_with_a_slow_client(c, token_file):
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}",
            "--shutdown_grace=2s"]) as proc:
        port = proc.http_port
        # Just above the minimum rate: it would take 60 s to finish.
        conn = Connection(port, timeout=30)
        conn.send(request("POST", INFER, headers=AUTH + [
            ("Content-Length", str(80000 * 60))]))
        stop = threading.Event()

        def feed():
            while not stop.is_set():
                try:
                    conn.send(b" " * 8000)
                except OSError:
                    return
                time.sleep(0.1)

        threading.Thread(target=feed, daemon=True).start()
        header_trickler = Connection(port, timeout=30)
        threading.Thread(target=header_trickler.trickle,
                         args=(b"GET /v2 HTTP/1.1\r\n" * 10, 0.3),
                         daemon=True).start()
        time.sleep(1.5)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - start
        stop.set()
        c.expect(code == 0 and took < 3.0 + 1.0,
                 f"SIGTERM with slow clients, --shutdown_grace=2s: exit "
                 f"{code} after {took:.1f} s")
        conn.close()
        header_trickler.close()


def check_connection_limit(c, token_file):
    """--http_max_connections=4: with four connections open (idle), a
    fifth gets 503 naming the flag and is closed, counted in
    normd_http_connections_refused_total; once one of the four closes, a
    new connection is served."""
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}",
            "--http_max_connections=4"]) as proc:
        port = proc.http_port
        held = [Connection(port, timeout=10) for _ in range(4)]
        # Each held connection is accepted: one probe on each.
        for conn in held:
            conn.send(request("GET", "/v2/health/live"))
            reply = conn.response()
            c.expect(reply is not None and reply[0] == 200,
                     f"held connection: {reply}")
        with Connection(port, timeout=10) as extra:
            extra.send(request("GET", "/v2/health/live"))
            reply = extra.response()
            c.expect(reply is not None and reply[0] == 503 and
                     b"--http_max_connections" in reply[2] and
                     extra.closed_by_server(),
                     f"fifth connection: {reply}")
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{proc.metrics_port}/metrics",
            timeout=10).read().decode()
        c.expect("normd_http_connections_refused_total 1" in metrics,
                 "normd_http_connections_refused_total after one refusal")
        held.pop().close()
        for _ in range(50):  # The server sees the close asynchronously.
            with Connection(port, timeout=10) as again:
                again.send(request("GET", "/v2/health/live"))
                reply = again.response()
            if reply is not None and reply[0] == 200:
                break
            time.sleep(0.1)
        c.expect(reply is not None and reply[0] == 200,
                 f"a connection after one closed: {reply}")
        for conn in held:
            conn.close()


def check_body_deadline(c, token_file):
    """--http_body_timeout=2s with no minimum rate: a body that keeps
    coming, slowly, is cut at the whole-body deadline with 408 naming the
    flag, at 2 s (not after its last byte)."""
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}", "--http_body_timeout=2s",
            "--http_min_body_rate=0"]) as proc:
        t = Trickler(proc.http_port,
                     request("POST", INFER,
                             headers=AUTH + [("Content-Length", "1000")]),
                     b"x" * 100, 0.1)
        t.start()
        t.join(20)
        c.expect(t.reply is not None and t.reply[0] == 408 and
                 b"--http_body_timeout" in t.reply[2] and
                 t.after is not None and 1.9 <= t.after < 5,
                 f"body past --http_body_timeout: {t.reply and t.reply[0]} "
                 f"{t.reply and t.reply[2][:120]!r} after {t.after}")


def check_io_thread_never_computes(c, token_file):
    """--http_threads=1: one I/O thread moves every connection's bytes and
    never computes. While four 16 MiB binary LayerNorms (about 0.1-0.5 s of
    compute each, on a one-thread arena so that they queue there) are in
    flight on their own connections, health probes (live and ready) on
    further connections are answered at once, never queued behind the
    compute, and every infer is answered right."""
    import threading
    import numpy as np
    rows, cols = 1024, 4096
    x = np.random.default_rng(3).standard_normal((rows, cols)).astype(
        np.float32) + 7
    header = json.dumps({"inputs": [{
        "name": "input", "datatype": "FP32", "shape": [rows, cols],
        "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "output",
                     "parameters": {"binary_data": True}}]}).encode()
    body = header + x.tobytes()
    headers = AUTH + [("Inference-Header-Content-Length", str(len(header)))]
    want = (x - x.mean(1, keepdims=True, dtype=np.float64)) / np.sqrt(
        x.var(1, keepdims=True, dtype=np.float64) + 1e-5)
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}", "--http_threads=1",
            "--tbb_threads=1", "--max_message_bytes=134217728"]) as proc:
        port = proc.http_port
        results = []

        def infer():
            with Connection(port, timeout=60) as conn:
                conn.send(request("POST", INFER, body, headers))
                results.append(conn.response())

        workers = [threading.Thread(target=infer) for _ in range(4)]
        for w in workers:
            w.start()
        probes = []
        while any(w.is_alive() for w in workers) and len(probes) < 100:
            start = time.monotonic()
            path = ("/v2/health/live", "/v2/health/ready")[len(probes) % 2]
            with Connection(port, timeout=10) as conn:
                conn.send(request("GET", path))
                reply = conn.response()
            probes.append((reply and reply[0], time.monotonic() - start))
            time.sleep(0.02)
        for w in workers:
            w.join(120)
        c.expect(probes and all(code == 200 and took < 0.5
                                for code, took in probes),
                 f"--http_threads=1: probes during four infers {probes}")
        good = 0
        for reply in results:
            if reply is None or reply[0] != 200:
                continue
            length = int(reply[1].get("inference-header-content-length",
                                      "0"))
            y = np.frombuffer(reply[2][length:], np.float32).reshape(rows,
                                                                     cols)
            good += np.abs(y - want).max() < 1e-5
        c.expect(good == 4, f"--http_threads=1: {good} of 4 infers right "
                            f"({[r and r[0] for r in results]})")


def main():
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        token_file = normd_process.write_token_file(tmp, TOKEN)
        with normd_process.serving(ARGS.normd, [
                f"--auth_token_file={token_file}"]) as proc:
            port = proc.http_port
            check_tokenless_tricklers(c, port)
            check_body_tricklers(c, port)
            check_header_tricklers(c, port)
            check_lingering(c, port)
            probe(c, port, "after every trickler")
        check_shutdown_with_a_slow_client(c, token_file)
        check_io_thread_never_computes(c, token_file)
        check_connection_limit(c, token_file)
        check_body_deadline(c, token_file)
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
