#!/usr/bin/python3
"""What REST requests may cost a real normd in memory is bounded by the
admission flags, not by what clients send:

- 24 clients without a token each announce and send a 48 MiB binary body:
  each is answered 401 before its body is read, and the server's peak
  resident memory grows by less than 96 MiB (reading those bodies first
  grew it by 844 MiB);
- 24 clients with the token each send a 32 MiB binary request at once under
  --max_inflight_bytes=64MiB: those past the limit get 429 before their
  body is read, those admitted are answered correctly, and the peak grows by
  less than 256 MiB (it grew by 544 MiB when bodies were read before
  admission).

Usage: memory_test.py --normd BUILD/normd --stubs BUILD/python
"""

import concurrent.futures
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import normd_process  # noqa: E402
from raw_http import Connection, request  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import numpy as np  # noqa: E402
from oip_cases import Checker  # noqa: E402

TOKEN = "memory-token"
MIB = 1 << 20


def binary_request(x, token):
    head = json.dumps({"inputs": [{
        "name": "input", "datatype": "FP32", "shape": list(x.shape),
        "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "output",
                     "parameters": {"binary_data": True}}]}).encode()
    headers = [("Inference-Header-Content-Length", str(len(head))),
               ("Content-Length", str(len(head) + x.nbytes))]
    if token:
        headers.append(("Authorization", f"Bearer {token}"))
    return request("POST", "/v2/models/layer_norm/infer",
                   headers=headers), head + x.tobytes()


def send(port, head, body):
    """Sends the head, then the body while reading the answer; the answer
    (status, headers, body) or None."""
    with Connection(port, timeout=120) as conn:
        conn.send(head)
        try:
            conn.sock.settimeout(120)
            conn.send(body)
        except OSError:
            pass  # Answered and closed before the body was taken.
        return conn.response()


def peak_growth_mib(proc, idle_kib):
    return (normd_process.rss_kib(proc.pid, "VmHWM") - idle_kib) / 1024


def send_at_once(port, head, body, clients=24):
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda _: send(port, head, body),
                             range(clients)))


def check_tokenless_bodies(c, token_file):
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}"]) as proc:
        idle = normd_process.rss_kib(proc.pid)
        x = np.zeros((12, MIB), np.float32)  # 48 MiB.
        replies = send_at_once(proc.http_port, *binary_request(x, None))
        growth = peak_growth_mib(proc, idle)
        statuses = [r and r[0] for r in replies]
        c.expect(statuses == [401] * 24,
                 f"24 tokenless 48 MiB bodies: {statuses}")
        c.expect(growth < 96, f"24 tokenless 48 MiB bodies grew the peak "
                 f"resident memory by {growth:.0f} MiB")
        print(f"tokenless bodies: peak grew by {growth:.0f} MiB")


def check_admitted_bytes(c, token_file):
    with normd_process.serving(ARGS.normd, [
            f"--auth_token_file={token_file}",
            f"--max_inflight_bytes={64 * MIB}"]) as proc:
        idle = normd_process.rss_kib(proc.pid)
        rng = np.random.default_rng(3)
        x = rng.normal(2.0, 3.0, size=(8, MIB)).astype(np.float32)  # 32 MiB.
        replies = send_at_once(proc.http_port, *binary_request(x, TOKEN))
        growth = peak_growth_mib(proc, idle)
        statuses = [r and r[0] for r in replies]
        c.expect(set(statuses) <= {200, 429} and 200 in statuses and
                 429 in statuses,
                 f"24 x 32 MiB under --max_inflight_bytes=64MiB: {statuses}")
        refused = [r for r in replies if r and r[0] == 429]
        c.expect(all(b"--max_inflight_bytes" in r[2] for r in refused),
                 "429s name --max_inflight_bytes")
        x64 = x.astype(np.float64)
        want = ((x64 - x64.mean(1, keepdims=True)) /
                np.sqrt(x64.var(1, keepdims=True) + 1e-5))
        for r in replies:
            if r and r[0] == 200:
                start = int(r[1]["inference-header-content-length"])
                y = np.frombuffer(r[2][start:], np.float32).reshape(x.shape)
                error = float(np.max(np.abs(y - want)))
                c.expect(error < 1e-5, f"admitted answer: error {error}")
        c.expect(growth < 256, f"24 x 32 MiB under --max_inflight_bytes="
                 f"64MiB grew the peak resident memory by {growth:.0f} MiB")
        print(f"admitted bytes: {statuses.count(200)} answered, "
              f"{statuses.count(429)} refused; peak grew by {growth:.0f} MiB")


def main():
    c = Checker()
    with tempfile.TemporaryDirectory() as tmp:
        token_file = normd_process.write_token_file(tmp, TOKEN)
        check_tokenless_bodies(c, token_file)
        check_admitted_bytes(c, token_file)
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
