#!/usr/bin/python3
"""Ambiguous framing and absurd requests against a real normd's REST port,
each replayed as an attacker sends it, each answered at once with a precise
status (and the connection closed where its bytes can no longer be trusted),
the server serving on:

- a Range header of 300 ranges changes nothing (no multipart, the normal
  answer);
- Content-Length beside Transfer-Encoding, two different Content-Lengths,
  "12abc", "-5", a Transfer-Encoding other than chunked, a missing Host:
  400 and closed; HTTP/1.0: 505, but for the health checks load balancers
  send;
- an empty POST without Content-Length is answered at once, saying the body
  is empty; a body sent to an endpoint that takes none (a probe) is refused
  before it is read;
- a JSON array of 17,000,000 values is taken (counted exactly), and the
  output matches numpy's LayerNorm; 120,000 parameter names are refused in
  time linear in the body;
- a shape [1, 2^60] is 400 naming inputs[0].shape, never a 500.

Usage: framing_test.py --normd BUILD/normd --stubs BUILD/python
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import normd_process  # noqa: E402
from raw_http import Connection, request  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import numpy as np  # noqa: E402
from oip_cases import Checker  # noqa: E402

INFER = "/v2/models/layer_norm/infer"


def infer_body(values, shape, binary_output=False):
    document = {"inputs": [{"name": "input", "datatype": "FP32",
                            "shape": list(shape), "data": values}]}
    if binary_output:
        document["parameters"] = {"binary_data_output": True}
    return json.dumps(document).encode()


def exchange(port, data, timeout=10, closes=False):
    """Sends `data` on a fresh connection: the reply (or None), its error
    message, the seconds it took, and (with `closes`) whether the server
    closed the connection within 5 s."""
    with Connection(port, timeout=timeout) as conn:
        start = time.monotonic()
        conn.send(data)
        reply = conn.response()
        closed = conn.closed_by_server(within=5) if closes else None
        took = time.monotonic() - start
    message = json.loads(reply[2]).get("error", "") if reply else ""
    return reply, message, took, closed


def check_range_is_ignored(c, port):
    body = infer_body(list(range(1, 2049)), [2, 1024])
    with Connection(port) as conn:
        conn.send(request("POST", INFER, body))
        plain = conn.response()
        conn.send(request("POST", INFER, body, headers=[
            ("Range", "bytes=" + ",".join(["0-"] * 300))]))
        ranged = conn.response()
    c.expect(plain is not None and ranged is not None and
             ranged[0] == 200 and ranged[2] == plain[2] and
             "content-range" not in ranged[1] and
             not ranged[1].get("content-type", "").startswith("multipart"),
             f"Range: {ranged and (ranged[0], ranged[1], len(ranged[2]))}")


def check_ambiguous_framing(c, port):
    body = infer_body([1, 2], [2])
    cases = [
        ("Content-Length with Transfer-Encoding",
         [("Content-Length", str(len(body))),
          ("Transfer-Encoding", "chunked")], 400, "Transfer-Encoding"),
        ("Transfer-Encoding with Content-Length",
         [("Transfer-Encoding", "chunked"),
          ("Content-Length", str(len(body)))], 400, "Content-Length"),
        ("two different Content-Lengths",
         [("Content-Length", str(len(body))),
          ("Content-Length", str(len(body) + 1))], 400, "Content-Length"),
        ("Content-Length: 12abc", [("Content-Length", "12abc")], 400,
         "Content-Length"),
        ("Content-Length: -5", [("Content-Length", "-5")], 400,
         "Content-Length"),
        ("Transfer-Encoding: gzip", [("Transfer-Encoding", "gzip")], 400,
         "Transfer-Encoding"),
        ("Transfer-Encoding: gzip, chunked",
         [("Transfer-Encoding", "gzip, chunked")], 400, "Transfer-Encoding"),
    ]
    for what, headers, status, field in cases:
        reply, message, took, closed = exchange(
            port, request("POST", INFER, body, headers=headers), closes=True)
        c.expect(reply is not None and reply[0] == status and
                 field in message and closed and took < 5,
                 f"{what}: {reply and reply[0]} {message!r}, closed "
                 f"{closed} after {took:.1f} s")
    with Connection(port) as conn:
        conn.send(request("GET", "/v2/health/live", host=False))
        reply = conn.response()
        c.expect(reply is not None and reply[0] == 400 and
                 b"Host" in reply[2] and conn.closed_by_server(),
                 f"no Host: {reply}")
    with Connection(port) as conn:
        conn.send(b"POST " + INFER.encode() + b" HTTP/1.0\r\n"
                  b"Content-Length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        reply = conn.response()
        c.expect(reply is not None and reply[0] == 505 and
                 b"HTTP/1.1" in reply[2] and conn.closed_by_server(),
                 f"HTTP/1.0 infer: {reply}")
    # Other versions and no version at all: 400 naming the request line,
    # and the connection closed.
    for what, line in (("HTTP/2 prior knowledge",
                        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
                       ("HTTP/1.2", b"GET /v2/health/live HTTP/1.2\r\n"
                                    b"Host: n\r\n\r\n"),
                       ("HTTP/2.0", b"GET /v2/health/live HTTP/2.0\r\n"
                                    b"Host: n\r\n\r\n"),
                       ("HTTP/0.9", b"GET /v2/health/live\r\n\r\n")):
        with Connection(port) as conn:
            conn.send(line)
            reply = conn.response()
            c.expect(reply is not None and reply[0] == 400 and
                     b"not a well-formed HTTP/1.1 request" in reply[2] and
                     conn.closed_by_server(), f"{what}: {reply}")
    # A load balancer's HTTP/1.0 health check (HAProxy's httpchk) is served.
    with Connection(port) as conn:
        conn.send(b"GET /v2/health/ready HTTP/1.0\r\n\r\n")
        reply = conn.response()
        c.expect(reply is not None and reply[0] == 200 and
                 json.loads(reply[2]) == {"ready": True} and
                 conn.closed_by_server(), f"HTTP/1.0 health check: {reply}")


def check_bodies_where_none_belongs(c, port):
    """A body on an endpoint that takes none (a probe, which needs no token)
    is refused before it is read: no endpoint holds a body it did not
    admit."""
    reply, message, took, closed = exchange(
        port, request("GET", "/v2/health/live",
                      headers=[("Content-Length", str(64 << 20))]),
        closes=True)
    c.expect(reply is not None and reply[0] == 400 and
             message.startswith("body:") and took < 1 and closed,
             f"a 64 MiB body on a probe: {reply and reply[0]} {message!r} "
             f"after {took:.2f} s, closed {closed}")


def check_empty_post(c, port):
    reply, message, took, _ = exchange(
        port, f"POST {INFER} HTTP/1.1\r\nHost: normd\r\n\r\n".encode())
    c.expect(reply is not None and reply[0] == 400 and
             "body: empty" in message and took < 1,
             f"empty POST: {reply and reply[0]} {message!r} after "
             f"{took:.2f} s")
    # The index takes an empty body.
    with Connection(port) as conn:
        conn.send(b"POST /v2/repository/index HTTP/1.1\r\nHost: normd\r\n\r\n")
        reply = conn.response()
    c.expect(reply is not None and reply[0] == 200 and
             json.loads(reply[2])[0]["name"] == "layer_norm",
             f"empty index request: {reply}")


def check_huge_array(c, port):
    rows, cols = 17, 1000000  # 17,000,000 values, past simdjson's 2^24-1.
    rng = np.random.default_rng(5)
    x = rng.integers(-9, 10, size=(rows, cols)).astype(np.float32)
    body = ('{"parameters":{"binary_data_output":true},"inputs":[{"name":'
            '"input","datatype":"FP32","shape":[17,1000000],"data":['
            + ",".join(map(str, x.astype(np.int64).ravel().tolist()))
            + "]}]}").encode()
    with Connection(port, timeout=120) as conn:
        conn.send(request("POST", INFER, body))
        reply = conn.response()
    if reply is None or reply[0] != 200:
        c.expect(False, f"17,000,000 values: {reply and reply[:1]} "
                 f"{reply and reply[2][:300]}")
        return
    head = int(reply[1]["inference-header-content-length"])
    y = np.frombuffer(reply[2][head:], np.float32).reshape(rows, cols)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(
        x64.var(1, keepdims=True) + 1e-5)
    error = np.max(np.abs(y - want))
    c.expect(error < 1e-5, f"17,000,000 values: max error {error}")


def check_many_keys(c, port):
    """120,000 parameter names (1.5 MB): answered in well under a second,
    however many; checking each against every earlier one took minutes."""
    parameters = ",".join(f'"k{i}":{i}' for i in range(120000))
    body = ('{"parameters":{' + parameters + '},"inputs":[{"name":"input",'
            '"datatype":"FP32","shape":[2],"data":[1,2]}]}').encode()
    reply, message, took, _ = exchange(port, request("POST", INFER, body),
                                       timeout=60)
    c.expect(reply is not None and reply[0] == 400 and
             "unknown parameter" in message and took < 10,
             f"120,000 parameter names: {reply and reply[0]} "
             f"{message[:120]!r} after {took:.1f} s")


def check_absurd_shape(c, port):
    for data in ([1, 2], [[1, 2]]):  # Flat and nested.
        reply, message, _, _ = exchange(
            port, request("POST", INFER, infer_body(data, [1, 1 << 60])))
        c.expect(reply is not None and reply[0] == 400 and
                 "inputs[0].shape" in message and
                 not any(k.startswith("exception") for k in reply[1]),
                 f"shape [1, 2^60], data {data}: "
                 f"{reply and (reply[0], reply[1])} {message!r}")


def main():
    c = Checker()
    with normd_process.serving(ARGS.normd) as proc:
        port = proc.http_port
        check_range_is_ignored(c, port)
        check_ambiguous_framing(c, port)
        check_empty_post(c, port)
        check_bodies_where_none_belongs(c, port)
        check_absurd_shape(c, port)
        check_many_keys(c, port)
        check_huge_array(c, port)
        with Connection(port) as conn:
            conn.send(request("GET", "/v2/health/live"))
            reply = conn.response()
        c.expect(reply is not None and reply[0] == 200,
                 f"serving after it all: {reply}")
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
