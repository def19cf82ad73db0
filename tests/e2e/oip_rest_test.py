#!/usr/bin/python3
"""The Open Inference Protocol (KServe v2) over HTTP/REST against a real
normd, with Python requests/http.client and with curl:

- every endpoint: /v2, /v2/health/live, /v2/health/ready, model metadata and
  readiness (following the model store), infer;
- each built-in model and a BatchNorm model in eval, training and fit, in
  FP32, FP64, FP16 and BF16, JSON data flat and nested: byte-for-byte the
  native API's output for the same request (the JSON numbers read back
  exactly), the BatchNorm state the native twin's, the response parameters;
- Triton's binary-data extension both ways (and mixed), a 4 MiB tensor;
- keep-alive (many requests on one connection) and concurrent connections;
- the bad-input table: each row's exact HTTP status and a message naming the
  field, with no model changed; wrong paths and methods; garbage and idle
  connections; the body limit (413) and the in-flight limit (429);
- TLS, the bearer token (health exempt), and normd_http_* in /metrics.

Usage: oip_rest_test.py --normd BUILD/normd --stubs BUILD/python
"""

import concurrent.futures
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process, oip_cases
import normd_process  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402
import oip_cases  # noqa: E402
from oip_cases import (BATCH_NORM_STEPS, DTYPES, MODES,  # noqa: E402
                       STATELESS_CASES, affine_inputs, decode, encode,
                       fingerprint, model_inputs,
                       layer_norm_reference, native_request)

HERE = os.path.dirname(os.path.abspath(__file__))


class Checker(oip_cases.Checker):
    def status(self, response, status, field, what):
        """`response` must have `status` and an error message naming
        `field`."""
        try:
            message = response.json().get("error", "")
        except ValueError:
            message = f"(not JSON: {response.content[:80]!r})"
        self.expect(response.status_code == status and field in message,
                    f"{what}: got {response.status_code} {message!r}, want "
                    f"{status} naming {field!r}")


def quantized(x, datatype):
    """`x` rounded to `datatype`'s values, so that JSON numbers, numpy and
    the server all mean the same elements."""
    return decode(encode(x, datatype), datatype).reshape(np.shape(x))


def json_tensor(name, datatype, shape, values, nested=False):
    data = np.asarray(values, np.float64).reshape(shape)
    return {"name": name, "datatype": datatype, "shape": list(shape),
            "data": data.tolist() if nested else data.ravel().tolist()}


def binary_body(document, blobs):
    """The binary-data extension's body and headers."""
    head = json.dumps(document).encode()
    return head + b"".join(blobs), {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream"}


def output_of(response):
    """(output tensor JSON, its bytes) of an infer response, JSON data or
    binary data."""
    length = response.headers.get("Inference-Header-Content-Length")
    if length is None:
        doc = response.json()
        out = doc["outputs"][0] if doc["outputs"] else None
        data = encode(out["data"], out["datatype"]) if out else b""
        return doc, out, data
    doc = json.loads(response.content[:int(length)])
    out = doc["outputs"][0]
    return doc, out, response.content[int(length):]


class Rest:
    """The REST endpoints of one normd."""

    def __init__(self, port, scheme="http", verify=None, token=None):
        self.base = f"{scheme}://127.0.0.1:{port}"
        self.session = requests.Session()
        # No proxies or CA bundles from the environment: this server only.
        self.session.trust_env = False
        if verify is not None:
            self.session.verify = verify
        if token is not None:
            self.session.headers["Authorization"] = f"Bearer {token}"

    def get(self, path, **kw):
        return self.session.get(self.base + path, timeout=30, **kw)

    def post(self, path, **kw):
        return self.session.post(self.base + path, timeout=60, **kw)

    def infer(self, model, document, **kw):
        return self.post(f"/v2/models/{model}/infer", json=document, **kw)


def check_endpoints(c, rest, native):
    r = rest.get("/v2/health/live")
    c.expect(r.status_code == 200 and r.json() == {"live": True},
             f"live: {r.status_code} {r.text}")
    r = rest.get("/v2/health/ready")
    c.expect(r.status_code == 200 and r.json() == {"ready": True},
             f"ready: {r.status_code} {r.text}")
    r = rest.get("/v2")
    c.expect(r.status_code == 200 and r.json()["name"] == "normd" and
             r.json()["version"] and
             "binary_tensor_data" in r.json()["extensions"],
             f"server metadata: {r.text}")
    for model in MODES:
        for path in (f"/v2/models/{model}", f"/v2/models/{model}/versions/1"):
            r = rest.get(path)
            m = r.json()
            c.expect(r.status_code == 200 and m["name"] == model and
                     m["versions"] == ["1"] and
                     [t["name"] for t in m["inputs"]] ==
                     model_inputs(model) and
                     [t["name"] for t in m["outputs"]] == ["output"],
                     f"metadata {path}: {r.text}")
            r = rest.get(path + "/ready")
            c.expect(r.status_code == 200 and
                     r.json() == {"name": model, "ready": True},
                     f"ready {path}: {r.status_code} {r.text}")
    native.CreateModel(pb.CreateModelRequest(name="rest/meta.bn",
                                             num_features=3))
    r = rest.get("/v2/models/rest%2Fmeta.bn")
    c.expect(r.status_code == 200 and r.json()["name"] == "rest/meta.bn" and
             r.json()["inputs"][0]["shape"] == [-1, 3] and
             r.json()["inputs"][1]["shape"] == [3],
             f"BatchNorm metadata (name with /): {r.text}")
    c.expect(rest.get("/v2/models/rest%2Fmeta.bn/ready").status_code == 200,
             "BatchNorm model ready")
    r = rest.get("/v2/models/rest%2Fmeta.bn/versions/2/ready")
    c.expect(r.status_code == 400 and r.json()["ready"] is False,
             f"version 2 ready: {r.status_code} {r.text}")
    native.DeleteModel(pb.DeleteModelRequest(name="rest/meta.bn"))
    r = rest.get("/v2/models/rest%2Fmeta.bn/ready")
    c.expect(r.status_code == 400 and r.json() == {"name": "rest/meta.bn",
                                                   "ready": False},
             f"ready after DeleteModel: {r.status_code} {r.text}")
    c.status(rest.get("/v2/models/nope"), 404, "nope", "metadata unknown")
    c.status(rest.get("/v2/models/layer_norm/versions/7"), 404, "version",
             "metadata version 7")


def check_stateless(c, rest, native, rng):
    for model, shape, params in STATELESS_CASES:
        for datatype in DTYPES:
            for form in ("flat", "nested", "binary"):
                x = quantized(rng.normal(3.0, 2.0, size=shape), datatype)
                tensors = [("input", datatype, shape, x)] + affine_inputs(
                    model, shape, params, datatype,
                    lambda mean, n: quantized(rng.normal(mean, .2, size=n),
                                              datatype))
                document = {"id": "r1", "parameters": params}
                what = f"{model} {shape} {params} {datatype} {form}"
                if form == "binary":
                    blobs = [encode(v, t) for _, t, _, v in tensors]
                    document["inputs"] = [
                        {"name": n, "datatype": t, "shape": s,
                         "parameters": {"binary_data_size": len(b)}}
                        for (n, t, s, _), b in zip(tensors, blobs)]
                    document["outputs"] = [
                        {"name": "output", "parameters": {"binary_data": True}}]
                    body, headers = binary_body(document, blobs)
                    got = rest.post(f"/v2/models/{model}/infer", data=body,
                                    headers=headers)
                else:
                    document["inputs"] = [json_tensor(*t, form == "nested")
                                          for t in tensors]
                    got = rest.infer(model, document)
                want = native.Normalize(native_request(model, tensors, params))
                if got.status_code != 200:
                    c.expect(False, f"{what}: {got.status_code} {got.text}")
                    continue
                doc, out, data = output_of(got)
                c.expect(out["name"] == "output" and
                         out["datatype"] == datatype and
                         out["shape"] == shape and doc["id"] == "r1" and
                         doc["model_name"] == model and
                         doc["model_version"] == "1" and
                         "parameters" not in doc, f"{what}: head {doc}")
                c.expect(data == want.output.data,
                         f"{what}: bytes differ from the native API's")
    # Binary in, JSON out; JSON in, binary out (binary_data_output).
    x = quantized(rng.normal(size=(3, 8)), "FP32")
    want = native.Normalize(native_request(
        "layer_norm", [("input", "FP32", [3, 8], x)])).output.data
    body, headers = binary_body({"inputs": [
        {"name": "input", "datatype": "FP32", "shape": [3, 8],
         "parameters": {"binary_data_size": 96}}]}, [encode(x, "FP32")])
    got = rest.post("/v2/models/layer_norm/infer", data=body, headers=headers)
    c.expect(got.status_code == 200 and
             "Inference-Header-Content-Length" not in got.headers and
             output_of(got)[2] == want, f"binary in, JSON out: {got.text}")
    got = rest.infer("layer_norm", {
        "parameters": {"binary_data_output": True},
        "inputs": [json_tensor("input", "FP32", [3, 8], x)]})
    c.expect(got.status_code == 200 and
             got.headers.get("Content-Type") == "application/octet-stream" and
             output_of(got)[1]["parameters"]["binary_data_size"] == 96 and
             output_of(got)[2] == want, "JSON in, binary out")
    # 4 MiB both ways in binary, and an FP64 LayerNorm against numpy.
    x = rng.normal(3.0, 2.0, size=(16, 128, 512)).astype(np.float32)
    body, headers = binary_body({"inputs": [
        {"name": "input", "datatype": "FP32", "shape": list(x.shape),
         "parameters": {"binary_data_size": x.nbytes}}],
        "outputs": [{"name": "output", "parameters": {"binary_data": True}}]},
        [x.tobytes()])
    got = rest.post("/v2/models/layer_norm/infer", data=body, headers=headers)
    want = native.Normalize(native_request(
        "layer_norm", [("input", "FP32", list(x.shape), x)]))
    c.expect(got.status_code == 200 and output_of(got)[2] ==
             want.output.data, "4 MiB binary: bytes differ")
    x = rng.normal(1e4, 1.0, size=(3, 50))
    got = rest.infer("layer_norm", {"inputs": [
        json_tensor("input", "FP64", [3, 50], x)]})
    y = np.asarray(got.json()["outputs"][0]["data"]).reshape(3, 50)
    error = np.max(np.abs(y - layer_norm_reference(x)))
    c.expect(error < 1e-9, f"LayerNorm FP64 vs numpy: {error}")


def check_batch_norm(c, rest, native, rng):
    """The same calls on a model through REST and on its twin natively."""
    for name in ("rest.bn", "twin.bn"):
        native.CreateModel(pb.CreateModelRequest(name=name, num_features=4,
                                                 momentum=0.2))
    for i, (datatype, params) in enumerate(BATCH_NORM_STEPS):
        x = quantized(rng.normal(2.0, 3.0, size=(6, 4, 5)), datatype)
        tensors = [("input", datatype, [6, 4, 5], x)]
        what = f"BatchNorm {datatype} {params}"
        got = rest.infer("rest.bn", {"parameters": params, "inputs": [
            json_tensor("input", datatype, [6, 4, 5], x, nested=i % 2 == 0)]})
        if got.status_code != 200:
            c.expect(False, f"{what}: {got.status_code} {got.text}")
            continue
        doc, out, data = output_of(got)
        if params.get("fit"):
            twin = native.Fit(pb.FitRequest(
                model="twin.bn", input=native_request("twin.bn",
                                                      tensors).input))
            c.expect(doc["outputs"] == [], f"{what}: fit returned an output")
        else:
            twin = native.Normalize(native_request("twin.bn", tensors, params))
            c.expect(data == twin.output.data,
                     f"{what}: bytes differ from the native twin's")
        c.expect(doc["parameters"] == {
            "generation": twin.model.generation,
            "num_batches_tracked": twin.model.num_batches_tracked},
            f"{what}: counters {doc.get('parameters')}")
    a = native.GetModel(pb.GetModelRequest(name="rest.bn"))
    b = native.GetModel(pb.GetModelRequest(name="twin.bn"))
    a.name = b.name
    c.expect(a == b, "BatchNorm state differs from the native twin's")


def one_input(datatype="FP32", shape=(2,), data=(1, 2), **extra):
    return {"inputs": [{"name": "input", "datatype": datatype,
                        "shape": list(shape), "data": list(data)}], **extra}


BAD = [
    # (what, model, body or document, extra headers, status, field)
    ("unknown model", "nope", one_input(shape=(2, 2), data=(1, 2, 3, 4)), {},
     404, "nope"),
    ("reserved name as a BatchNorm model", "layer_norm",
     one_input(parameters={"fit": True}), {}, 400, "parameters.fit"),
    ("unknown datatype", "layer_norm", one_input("INT8"), {}, 400,
     "inputs[0].datatype"),
    ("shape and data length differ", "layer_norm",
     one_input(shape=(2, 3), data=(1, 2, 3, 4)), {}, 400, "inputs[0].data"),
    ("data and binary_data_size both", "layer_norm",
     {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1],
                  "data": [1], "parameters": {"binary_data_size": 4}}]},
     {}, 400, "inputs[0]"),
    ("two inputs named input", "layer_norm",
     {"inputs": one_input()["inputs"] * 2}, {}, 400, "inputs[1].name"),
    ("no input named input", "layer_norm",
     {"inputs": [dict(one_input()["inputs"][0], name="weight")]}, {}, 400,
     "\"input\""),
    ("no data", "layer_norm",
     {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1]}]}, {},
     400, "inputs[0].data"),
    ("unknown parameter", "layer_norm", one_input(parameters={"momentum": .5}),
     {}, 400, "momentum"),
    ("wrong parameter type", "layer_norm",
     one_input(parameters={"normalized_ndim": "one"}), {}, 400,
     "parameters.normalized_ndim"),
    ("parameter not for the model", "layer_norm",
     one_input(parameters={"num_groups": 1}), {}, 400, "parameters.num_groups"),
    ("non-numeric eps string", "layer_norm",
     one_input(parameters={"eps": "tiny"}), {}, 400, "parameters.eps"),
    ("parameter of an object type", "layer_norm",
     one_input(parameters={"eps": [1]}), {}, 400, "parameters.eps"),
    ("unknown key", "layer_norm", dict(one_input(), input=[]), {}, 400,
     "\"input\""),
    ("malformed JSON", "layer_norm", b'{"inputs": [', {}, 400, "body"),
    ("not an object", "layer_norm", b"[1, 2]", {}, 400, "an object"),
    ("nested deeper than the shape", "layer_norm",
     one_input(shape=(2,), data=([1, 2], [3, 4])), {}, 400, "inputs[0].data"),
    ("ragged nesting", "layer_norm",
     {"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3],
                  "data": [[1, 2, 3, 4], [5, 6]]}]}, {}, 400,
     "inputs[0].data[0]"),
    ("a string element", "layer_norm", one_input(data=(1, "2")), {}, 400,
     "inputs[0].data[1]"),
    ("not finite for FP16", "layer_norm", one_input("FP16", data=(1, 70000)),
     {}, 400, "inputs[0].data[1]"),
    ("not finite for FP32", "layer_norm", one_input(data=(1e39, 1)), {}, 400,
     "inputs[0].data[0]"),
    ("binary_data_size overruns the body", "layer_norm", None,
     {"overrun": True}, 400, "binary_data_size"),
    ("wrong Inference-Header-Content-Length", "layer_norm", None,
     {"Inference-Header-Content-Length": "99999"}, 400,
     "Inference-Header-Content-Length"),
    ("non-numeric Inference-Header-Content-Length", "layer_norm", None,
     {"Inference-Header-Content-Length": "ten"}, 400,
     "Inference-Header-Content-Length"),
    ("binary bytes no input claims", "layer_norm", None, {"extra": True},
     400, "body"),
    ("fit with a weight", "guard.bn",
     {"parameters": {"fit": True},
      "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 2],
                  "data": [1, 2, 3, 4]},
                 {"name": "weight", "datatype": "FP32", "shape": [2],
                  "data": [1, 1]}]}, {}, 400, "inputs[1].name"),
    ("channel count differs", "guard.bn",
     {"parameters": {"training": True},
      "inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 3],
                  "data": [1, 2, 3, 4, 5, 6]}]}, {}, 400, "guard.bn"),
    ("fit with a non-finite input", "guard.bn",
     {"parameters": {"fit": True},
      "inputs": [{"name": "input", "datatype": "FP64", "shape": [1, 2],
                  "data": [1, 1e308]}]}, {}, 400, "not finite"),
    ("version 2", "layer_norm/versions/2", one_input(), {}, 404,
     "model_version"),
    ("unknown output", "layer_norm",
     one_input(outputs=[{"name": "mean"}]), {}, 400, "outputs[0].name"),
    ("bad model name characters", "bad%20name!", one_input(), {}, 400,
     "model"),
]


def bad_request(rest, model, body, headers):
    path = f"/v2/models/{model}/infer"
    if body is None:  # The binary-data extension's malformed bodies.
        blob = encode([1, 2], "FP32")
        document = {"inputs": [{"name": "input", "datatype": "FP32",
                                "shape": [2],
                                "parameters": {"binary_data_size": 8}}]}
        data, base = binary_body(document, [blob])
        if headers.get("overrun"):
            data = data[:-3]
        elif headers.get("extra"):
            data += b"\0\0\0\0"
        headers = {**base, **{k: v for k, v in headers.items()
                              if k.startswith("Inference")}}
        return rest.post(path, data=data, headers=headers)
    if isinstance(body, bytes):
        return rest.post(path, data=body, headers=headers)
    return rest.post(path, json=body, headers=headers)


def check_bad_input(c, rest, native):
    native.CreateModel(pb.CreateModelRequest(name="guard.bn", num_features=2))
    rest.infer("guard.bn", {"parameters": {"fit": True}, "inputs": [
        {"name": "input", "datatype": "FP32", "shape": [2, 2],
         "data": [1, 2, 3, 4]}]})
    for what, model, body, headers, status, field in BAD:
        before = fingerprint(native)
        c.status(bad_request(rest, model, body, headers), status, field, what)
        c.expect(fingerprint(native) == before, f"{what}: changed the state")
    # Wrong paths and methods.
    for path in ("/v3", "/v2/", "/v2/models", "/v2/models/layer_norm/run",
                 "/v2/health/alive", "/v2/models/layer_norm/versions/1/x"):
        c.status(rest.get(path), 404, "path", f"GET {path}")
    r = rest.get("/v2/models/layer_norm/infer")
    c.status(r, 405, "method", "GET infer")
    c.expect(r.headers.get("Allow") == "POST", f"Allow: {r.headers}")
    r = rest.post("/v2/health/ready", data=b"")
    c.status(r, 405, "method", "POST ready")
    c.status(rest.session.delete(rest.base + "/v2/models/layer_norm"), 405,
             "method", "DELETE model")


def raw_exchange(port, data, read_timeout=10):
    """Sends `data` on a fresh connection; what comes back until the
    connection closes or one whole response (by its Content-Length) has
    arrived."""
    with socket.create_connection(("127.0.0.1", port), timeout=read_timeout) \
            as s:
        s.sendall(data)
        reply = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
                head, found, body = reply.partition(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in
                          head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:")]
                if found and length and len(body) >= length[0]:
                    break
        except socket.timeout:
            reply += b"<timeout>"
        return reply


def check_connections(c, rest, port, native):
    # Keep-alive: many requests, one connection (http.client would reopen a
    # closed one; the socket object shows whether it did).
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps(one_input(shape=(2, 2), data=(1, 2, 3, 5)))
    sockets = set()
    statuses = set()
    for _ in range(50):
        conn.request("POST", "/v2/models/layer_norm/infer", body=body,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        statuses.add(response.status)
        sockets.add(id(conn.sock))
    conn.close()
    c.expect(statuses == {200} and len(sockets) == 1,
             f"keep-alive: statuses {statuses}, {len(sockets)} connections")
    # Concurrent connections, each with its own keep-alive session.
    want = native.Normalize(native_request(
        "layer_norm", [("input", "FP32", [4, 6], np.arange(24.0))]))

    def client(_):
        session = Rest(port)
        ok = 0
        for _ in range(15):
            r = session.infer("layer_norm", {"inputs": [json_tensor(
                "input", "FP32", [4, 6], np.arange(24.0))]})
            ok += r.status_code == 200 and output_of(r)[2] == want.output.data
        return ok

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(client, range(16)))
    c.expect(results == [15] * 16, f"16 concurrent connections: {results}")
    # Garbage and half requests get their defined answer, status and the
    # JSON error naming what is wrong, never a crash or a silent close; the
    # server keeps serving.
    for garbage, status, names in (
            (b"\x00\xff garbage\r\n\r\n", 400, b"(bad method)"),
            (b"GET\r\n\r\n", 400, b"(bad method)"),
            (b"POST /v2/models/layer_norm/infer HTTP/1.1\r\nHost: n\r\n"
             b"Content-Length: -5\r\n\r\n", 400, b"Content-Length"),
            (b"POST /v2/models/layer_norm/infer HTTP/1.1\r\n"
             b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400, b"Host"),
            (b"POST /v2/models/layer_norm/infer HTTP/1.1\r\nHost: n\r\n"
             b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", 400,
             b"(bad chunk)"),
            (b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: n\r\n\r\n", 404,
             b"path: no endpoint")):
        reply = raw_exchange(port, garbage)
        head, _, body = reply.partition(b"\r\n\r\n")
        c.expect(head.startswith(b"HTTP/1.1 %d " % status) and
                 body.startswith(b'{"error":') and names in body,
                 f"garbage {garbage[:30]!r}: {reply[:160]!r}, want {status} "
                 f"naming {names!r}")
    c.expect(rest.get("/v2/health/live").status_code == 200,
             "serving after garbage")


def check_body_limits(c, proc, rest):
    """Bodies past --max_message_bytes get 413, chunked or not; an unread
    body is answered once and its connection closed."""
    big = one_input(shape=(30000,), data=[1.5] * 30000)
    c.status(rest.infer("layer_norm", big), 413, "--max_message_bytes",
             "oversize body")
    r = rest.post("/v2/models/layer_norm/infer",
                  data=(json.dumps(big).encode()[i:i + 4096]
                        for i in range(0, 300000, 4096)))
    c.status(r, 413, "--max_message_bytes", "oversize chunked body")
    # A method the path does not take is answered before its body is
    # read (405), and the connection closed: the rest of the body is not
    # a next request.
    for method in ("PUT", "PATCH"):
        r = rest.session.request(
            method, rest.base + "/v2/models/layer_norm", timeout=30,
            data=(b"x" * 4096 for _ in range(60)))
        c.status(r, 405, "method", f"chunked {method} body")
        c.expect(r.headers.get("Connection") == "close",
                 f"unread {method} body closes the connection: "
                 f"{r.headers.get('Connection')!r}")
    # An oversize chunked body gets one answer, then the connection is
    # closed: the rest of it is not read as a next request.
    with socket.create_connection(("127.0.0.1", proc.http_port),
                                  timeout=10) as s:
        chunk = b"1000\r\n" + b"x" * 4096 + b"\r\n"
        s.sendall(b"POST /v2/models/layer_norm/infer HTTP/1.1\r\n"
                  b"Host: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                  chunk * 40)
        reply = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                reply += data
        except (ConnectionResetError, socket.timeout):
            pass
        c.expect(reply.startswith(b"HTTP/1.1 413") and
                 reply.count(b"HTTP/1.1 ") == 1,
                 f"one answer to an oversize chunked body: {reply[:300]!r}")
    c.expect(rest.get("/v2/health/live").status_code == 200,
             "serving after oversize bodies")


def check_connection_limits(c, proc, rest):
    """Idle keep-alive connections are closed after --http_idle_timeout,
    headers past --http_max_header_bytes get 431, headers trickled past
    --http_header_timeout get 408, and the server serves after each."""
    # An idle keep-alive connection is closed after the idle timeout.
    with socket.create_connection(("127.0.0.1", proc.http_port),
                                  timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while not first.endswith(b'{"live":true}'):
            chunk = s.recv(65536)
            if not chunk:
                break
            first += chunk
        start = time.monotonic()
        rest_of_it = s.recv(65536)
        idle = time.monotonic() - start
    c.expect(first.startswith(b"HTTP/1.1 200") and rest_of_it == b"" and
             idle < 8, f"idle connection: {rest_of_it!r} after {idle} s")
    # Headers past --http_max_header_bytes: 431, connection closed, and
    # nothing held; headers trickled past --http_header_timeout: 408.
    with socket.create_connection(("127.0.0.1", proc.http_port),
                                  timeout=10) as s:
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
        try:
            for _ in range(1000):
                s.sendall(b"X-Filler: " + b"a" * 1000 + b"\r\n")
        except OSError:
            pass  # The server closed the connection: expected.
        reply = s.recv(65536)
    c.expect(reply.startswith(b"HTTP/1.1 431") and
             b"--http_max_header_bytes" in reply,
             f"header flood: {reply[:120]!r}")
    with socket.create_connection(("127.0.0.1", proc.http_port),
                                  timeout=10) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /v2/health/live HTTP/1.1\r\nHost: slow\r\n":
                s.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            pass
        reply = s.recv(65536)
        waited = time.monotonic() - start
    c.expect(reply.startswith(b"HTTP/1.1 408") and waited < 5,
             f"trickled headers: {reply[:120]!r} after {waited:.1f} s")
    c.expect(rest.get("/v2/health/live").status_code == 200,
             "serving after the header flood and the trickle")


def check_inflight_limit(c, proc):
    """One in flight at a time: of many concurrent requests, some get 429
    naming --max_inflight_requests, the rest 200."""
    document = one_input(shape=(2000,), data=list(range(2000)))
    codes = set()
    for _ in range(30):
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(
                lambda _: Rest(proc.http_port).infer("layer_norm",
                                                     document), range(8)))
        codes |= {r.status_code for r in replies}
        refused = [r for r in replies if r.status_code == 429]
        if refused and 200 in codes:
            c.status(refused[0], 429, "--max_inflight_requests", "429")
            break
    c.expect(codes == {200, 429}, f"in-flight limit: codes {codes}")


def check_limits(c):
    """Body limit (413), in-flight limit (429), idle connections closed.
    The short idle and header timeouts get a server of their own: the idle
    timeout is also how long a refused body's sender may pause without
    losing its answer, which a busy machine can exceed at 1 s."""
    for flags, checks in (
            (["--max_message_bytes=100000", "--max_inflight_requests=1"],
             (check_body_limits,
              lambda c, proc, rest: check_inflight_limit(c, proc))),
            (["--http_idle_timeout=1s", "--http_header_timeout=1s"],
             (check_connection_limits,))):
        proc, _, _ = normd_process.start_normd(ARGS.normd, flags)
        try:
            for check in checks:
                check(c, proc, Rest(proc.http_port))
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def check_curl(c, port):
    """curl, as a user would type it."""
    def curl(*args):
        return subprocess.run(["curl", "-s", "-w", "\n%{http_code}", *args],
                              capture_output=True, text=True, timeout=30
                              ).stdout.rsplit("\n", 1)
    body, code = curl(f"localhost:{port}/v2/health/ready")
    c.expect(code == "200" and json.loads(body) == {"ready": True},
             f"curl ready: {code} {body}")
    body, code = curl("-X", "POST", f"localhost:{port}/v2/models/layer_norm/"
                      "infer", "-d", '{"inputs": [{"name": "input", "shape": '
                      '[2, 3], "datatype": "FP32", "data": [[1, 2, 3], '
                      '[4, 5, 7]]}]}')
    x = np.array([[1, 2, 3], [4, 5, 7]], np.float64)
    mean = x.mean(axis=1, keepdims=True)
    ref = (x - mean) / np.sqrt(x.var(axis=1, keepdims=True) + 1e-5)
    got = json.loads(body)["outputs"][0] if code == "200" else {}
    c.expect(got.get("shape") == [2, 3] and np.max(np.abs(
        np.asarray(got["data"]).reshape(2, 3) - ref)) < 1e-6,
        f"curl infer: {code} {body}")


def check_metrics(c, metrics_port):
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()

    def value(series):
        found = [float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith(series + " ")]
        return found[0] if found else None

    ok = value('normd_http_requests_total{code="200",endpoint="infer"}')
    c.expect(ok is not None and ok > 100, f"http 200 infer count: {ok}")
    bad = value('normd_http_requests_total{code="400",endpoint="infer"}')
    c.expect(bad is not None and bad >= 20, f"http 400 infer count: {bad}")
    seen = value('normd_http_request_duration_seconds_count'
                 '{endpoint="infer"}')
    c.expect(seen is not None and seen >= ok, f"latency count: {seen}")
    c.expect("rest.bn" not in text and "guard.bn" not in text,
             "a model name in a metric label")


def check_tls_and_token(c):
    with tempfile.TemporaryDirectory() as certs:
        subprocess.run([os.path.join(HERE, "make_test_certs.sh"), certs],
                       check=True)
        path = lambda name: os.path.join(certs, name)  # noqa: E731
        with open(path("token")) as f:
            token = f.read().strip()
        proc, _, _ = normd_process.start_normd(ARGS.normd, [
            f"--tls_cert={path('server.crt')}",
            f"--tls_key={path('server.key')}",
            f"--auth_token_file={path('token')}",
            "--max_message_bytes=100000"])
        try:
            port = proc.http_port
            anonymous = Rest(port, "https", verify=path("ca.crt"))
            for endpoint in ("/v2/health/live", "/v2/health/ready"):
                r = anonymous.get(endpoint)
                c.expect(r.status_code == 200, f"TLS {endpoint} without a "
                         f"token: {r.status_code}")
            document = one_input(shape=(2, 2), data=(1, 2, 3, 4))
            r = anonymous.infer("layer_norm", document)
            c.status(r, 401, "Authorization", "infer without a token")
            c.expect(r.headers.get("WWW-Authenticate") == "Bearer",
                     f"401 header: {r.headers}")
            c.status(anonymous.get("/v2/models/layer_norm"), 401,
                     "Authorization", "metadata without a token")
            wrong = Rest(port, "https", verify=path("ca.crt"), token="nope")
            c.status(wrong.infer("layer_norm", document), 401,
                     "Authorization", "infer with a wrong token")
            good = Rest(port, "https", verify=path("ca.crt"), token=token)
            r = good.infer("layer_norm", document)
            c.expect(r.status_code == 200 and len(output_of(r)[2]) == 16,
                     f"TLS infer with the token: {r.status_code} {r.text}")
            # A refused body's rest is drained under TLS too.
            r = good.session.post(
                good.base + "/v2/models/layer_norm/infer", timeout=30,
                data=(b"x" * 4096 for _ in range(60)))
            c.status(r, 413, "--max_message_bytes", "TLS oversize body")
            c.expect(good.infer("layer_norm", document).status_code == 200,
                     "TLS serving after an oversize body")
            try:
                requests.get(f"http://127.0.0.1:{port}/v2/health/live",
                             timeout=10)
                c.expect(False, "plaintext HTTP on the TLS port answered")
            except requests.exceptions.RequestException:
                c.expect(True, "")
            try:
                Rest(port, "https", verify=path("rogue-ca.crt")).get(
                    "/v2/health/live")
                c.expect(False, "a server certificate of the wrong CA passed")
            except requests.exceptions.SSLError:
                c.expect(True, "")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
        # mTLS: a client certificate from the CA is required.
        proc, _, _ = normd_process.start_normd(ARGS.normd, [
            f"--tls_cert={path('server.crt')}",
            f"--tls_key={path('server.key')}",
            f"--tls_client_ca={path('ca.crt')}"])
        try:
            url = f"https://127.0.0.1:{proc.http_port}/v2/health/live"
            session = requests.Session()
            session.trust_env = False
            r = session.get(url, verify=path("ca.crt"), timeout=10,
                            cert=(path("client.crt"), path("client.key")))
            c.expect(r.status_code == 200, f"mTLS with a client certificate: "
                     f"{r.status_code}")
            for cert in (None, (path("rogue-client.crt"),
                                path("rogue-client.key"))):
                session = requests.Session()  # A new connection.
                session.trust_env = False
                try:
                    session.get(url, verify=path("ca.crt"), timeout=10,
                                cert=cert)
                    c.expect(False, f"mTLS without a good client "
                             f"certificate ({cert}) answered")
                except (requests.exceptions.SSLError,
                        requests.exceptions.ConnectionError, ssl.SSLError):
                    c.expect(True, "")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def check_off(c):
    proc, port, _ = normd_process.start_normd(ARGS.normd, ["--http_port=-1"])
    try:
        c.expect(proc.http_port is None and "REST on (disabled)" in
                 proc.serving_line, f"--http_port=-1: {proc.serving_line}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main():
    c = Checker()
    rng = np.random.default_rng(33)
    proc, port, metrics_port = normd_process.start_normd(ARGS.normd)
    try:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_receive_message_length", 64 << 20)])
        native = pb_grpc.NormalizerStub(channel)
        rest = Rest(proc.http_port)
        check_endpoints(c, rest, native)
        check_stateless(c, rest, native, rng)
        check_batch_norm(c, rest, native, rng)
        check_bad_input(c, rest, native)
        check_connections(c, rest, proc.http_port, native)
        check_curl(c, proc.http_port)
        check_metrics(c, metrics_port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    check_limits(c)
    check_tls_and_token(c)
    check_off(c)
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
