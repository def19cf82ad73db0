#!/usr/bin/python3
"""The Open Inference Protocol (KServe v2) over gRPC against a real normd,
from Python stubs generated from proto/inference alone:

- every RPC: ServerLive, ServerReady, ModelReady (following the model store),
  ServerMetadata, ModelMetadata, ModelInfer;
- each built-in model and a BatchNorm model in eval, training and fit, in
  FP32, FP64, FP16 and BF16, raw and typed contents: byte-for-byte the
  native API's output for the same request, and the BatchNorm model's state
  the native twin's; one LayerNorm also against an fp64 numpy reference;
- the response parameters (num_batches_tracked, generation);
- the bad-input table: each row's exact code and a message naming the
  field, with no model changed;
- the bearer token (health-like ServerLive/ServerReady exempt), and the OIP
  methods in /metrics.

Usage: oip_grpc_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from inference import grpc_predict_v2_pb2 as oip  # noqa: E402
from inference import grpc_predict_v2_pb2_grpc as oip_grpc  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402
import oip_cases  # noqa: E402
from oip_cases import (BATCH_NORM_STEPS, DTYPES, MODES,  # noqa: E402
                       STATELESS_CASES, affine_inputs, encode, fingerprint,
                       model_inputs,
                       layer_norm_reference, native_request)

def param(value):
    return oip_cases.infer_parameter(oip, value)


def infer_request(model, tensors, params=None, raw=True, request_id="r1"):
    """tensors: [(name, datatype, shape, values)]."""
    request = oip.ModelInferRequest(model_name=model, id=request_id)
    for key, value in (params or {}).items():
        request.parameters[key].CopyFrom(param(value))
    for name, datatype, shape, values in tensors:
        tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
        if raw:
            request.raw_input_contents.append(encode(values, datatype))
        elif datatype == "FP32":
            tensor.contents.fp32_contents.extend(
                np.asarray(values, np.float32).ravel().tolist())
        else:
            tensor.contents.fp64_contents.extend(
                np.asarray(values, np.float64).ravel().tolist())
    return request


def output_bytes(response, datatype):
    if response.raw_output_contents:
        return response.raw_output_contents[0]
    contents = response.outputs[0].contents
    if datatype == "FP32":
        return np.asarray(contents.fp32_contents, "<f4").tobytes()
    return np.asarray(contents.fp64_contents, "<f8").tobytes()


class Checker(oip_cases.Checker):
    def code(self, call, code, field, what):
        """call() must fail with `code`, its message naming `field`."""
        try:
            call()
            self.expect(False, f"{what}: succeeded, want {code.name}")
        except grpc.RpcError as e:
            self.expect(e.code() == code and field in (e.details() or ""),
                        f"{what}: got {e.code().name} {e.details()!r}, want "
                        f"{code.name} naming {field!r}")


def check_health_and_metadata(c, stub, native):
    c.expect(stub.ServerLive(oip.ServerLiveRequest()).live, "ServerLive")
    c.expect(stub.ServerReady(oip.ServerReadyRequest()).ready, "ServerReady")
    meta = stub.ServerMetadata(oip.ServerMetadataRequest())
    c.expect(meta.name == "normd" and meta.version, f"ServerMetadata {meta}")
    for model in MODES:
        c.expect(stub.ModelReady(oip.ModelReadyRequest(name=model)).ready,
                 f"ModelReady {model}")
        m = stub.ModelMetadata(oip.ModelMetadataRequest(name=model))
        c.expect(m.name == model and list(m.versions) == ["1"] and
                 [t.name for t in m.inputs] == model_inputs(model) and
                 [t.name for t in m.outputs] == ["output"],
                 f"ModelMetadata {model}: {m}")
    native.CreateModel(pb.CreateModelRequest(name="meta.bn", num_features=3))
    c.expect(stub.ModelReady(oip.ModelReadyRequest(name="meta.bn",
                                                   version="1")).ready,
             "ModelReady of a store model")
    c.expect(not stub.ModelReady(oip.ModelReadyRequest(name="meta.bn",
                                                       version="2")).ready,
             "ModelReady of version 2")
    m = stub.ModelMetadata(oip.ModelMetadataRequest(name="meta.bn"))
    c.expect(list(m.inputs[0].shape) == [-1, 3] and
             list(m.inputs[1].shape) == [3], f"BatchNorm metadata: {m}")
    native.DeleteModel(pb.DeleteModelRequest(name="meta.bn"))
    c.expect(not stub.ModelReady(oip.ModelReadyRequest(name="meta.bn")).ready,
             "ModelReady after DeleteModel")
    c.expect(not stub.ModelReady(oip.ModelReadyRequest(name="nope")).ready,
             "ModelReady of an unknown model")
    c.code(lambda: stub.ModelMetadata(oip.ModelMetadataRequest(name="nope")),
           grpc.StatusCode.NOT_FOUND, "nope", "ModelMetadata unknown")
    c.code(lambda: stub.ModelMetadata(oip.ModelMetadataRequest(
        name="layer_norm", version="7")), grpc.StatusCode.NOT_FOUND,
        "version", "ModelMetadata version 7")


def check_stateless(c, stub, native, rng):
    for model, shape, params in STATELESS_CASES:
        for datatype in DTYPES:
            for raw in (True, False) if datatype in ("FP32", "FP64") else (
                    True,):
                x = rng.normal(3.0, 2.0, size=shape)
                tensors = [("input", datatype, shape, x)] + affine_inputs(
                    model, shape, params, datatype,
                    lambda mean, n: rng.normal(mean, .2, size=n))
                what = f"{model} {shape} {params} {datatype} raw={raw}"
                got = stub.ModelInfer(infer_request(model, tensors, params,
                                                    raw))
                want = native.Normalize(native_request(model, tensors, params))
                out = got.outputs[0] if got.outputs else None
                c.expect(out is not None and out.name == "output" and
                         out.datatype == datatype and
                         list(out.shape) == shape and got.id == "r1" and
                         got.model_name == model and
                         got.model_version == "1", f"{what}: head {got}")
                c.expect(bool(got.raw_output_contents) == raw,
                         f"{what}: raw output {raw} expected")
                c.expect(output_bytes(got, datatype) == want.output.data,
                         f"{what}: bytes differ from the native API's")
                c.expect(not got.parameters, f"{what}: parameters")
    # The input after its parameters (read in place from the third raw
    # entry), and a 4 MiB request (computed into its own response slice).
    for shape in ([3, 16], [16, 128, 512]):
        x = rng.normal(3.0, 2.0, size=shape)
        n = shape[-1:]
        tensors = [("weight", "FP32", n, rng.normal(1, .2, size=n)),
                   ("bias", "FP32", n, rng.normal(0, .2, size=n)),
                   ("input", "FP32", shape, x)]
        got = stub.ModelInfer(infer_request("layer_norm", tensors))
        want = native.Normalize(native_request("layer_norm", tensors))
        c.expect(got.raw_output_contents[0] == want.output.data and
                 list(got.outputs[0].shape) == shape,
                 f"input after weight and bias {shape}: bytes differ")
    # One against fp64 numpy: LayerNorm over the last dim of FP64 values.
    x = rng.normal(1e4, 1.0, size=(3, 50))
    got = stub.ModelInfer(infer_request("layer_norm",
                                        [("input", "FP64", [3, 50], x)]))
    y = np.frombuffer(got.raw_output_contents[0], "<f8").reshape(3, 50)
    error = np.max(np.abs(y - layer_norm_reference(x)))
    c.expect(error < 1e-9, f"LayerNorm FP64 vs numpy: {error}")


def check_batch_norm(c, stub, native, rng):
    """The same calls on a model through OIP and on its twin natively."""
    for name in ("oip.bn", "twin.bn"):
        native.CreateModel(pb.CreateModelRequest(name=name, num_features=4,
                                                 momentum=0.2))
    for datatype, params in BATCH_NORM_STEPS:
        x = rng.normal(2.0, 3.0, size=(6, 4, 5))
        tensors = [("input", datatype, [6, 4, 5], x)]
        what = f"BatchNorm {datatype} {params}"
        got = stub.ModelInfer(infer_request("oip.bn", tensors, params))
        if params.get("fit"):
            twin = native.Fit(pb.FitRequest(
                model="twin.bn", input=native_request("twin.bn",
                                                      tensors).input))
            c.expect(not got.outputs and not got.raw_output_contents,
                     f"{what}: fit returned an output")
        else:
            twin = native.Normalize(native_request("twin.bn", tensors, params))
            c.expect(got.raw_output_contents[0] == twin.output.data,
                     f"{what}: bytes differ from the native twin's")
        c.expect(got.parameters["num_batches_tracked"].int64_param ==
                 twin.model.num_batches_tracked and
                 got.parameters["generation"].int64_param ==
                 twin.model.generation, f"{what}: counters {got.parameters}")
    a = native.GetModel(pb.GetModelRequest(name="oip.bn"))
    b = native.GetModel(pb.GetModelRequest(name="twin.bn"))
    a.name = b.name
    c.expect(a == b, "BatchNorm state differs from the native twin's")
    c.expect(a.num_batches_tracked == 4, f"num_batches_tracked {a}")


BAD = [
    # (what, request, code, field)
    ("unknown model", infer_request("nope", [("input", "FP32", [2, 2],
                                               [1, 2, 3, 4])]),
     grpc.StatusCode.NOT_FOUND, "nope"),
    ("empty model name", infer_request("", [("input", "FP32", [1], [1])]),
     grpc.StatusCode.INVALID_ARGUMENT, "model_name"),
    ("unknown datatype", infer_request("layer_norm", [("input", "FP32", [2],
                                                        [1, 2])]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].datatype"),
    ("shape and data length differ", infer_request(
        "layer_norm", [("input", "FP32", [2, 3], [1, 2, 3, 4])]),
     grpc.StatusCode.INVALID_ARGUMENT, "input"),
    ("raw and typed contents", None, grpc.StatusCode.INVALID_ARGUMENT,
     "contents"),
    ("two inputs named input", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2]),
                       ("input", "FP32", [2], [1, 2])]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[1].name"),
    ("no input named input", infer_request(
        "layer_norm", [("weight", "FP32", [2], [1, 2])]),
     grpc.StatusCode.INVALID_ARGUMENT, "\"input\""),
    ("unknown input name", infer_request(
        "layer_norm", [("x", "FP32", [2], [1, 2])]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[0].name"),
    ("unknown parameter", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])], {"momentum": 0.5}),
     grpc.StatusCode.INVALID_ARGUMENT, "momentum"),
    ("wrong parameter type", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])],
        {"normalized_ndim": "one"}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.normalized_ndim"),
    ("parameter not for the model", infer_request(
        "group_norm", [("input", "FP32", [1, 2, 2], [1, 2, 3, 4])],
        {"num_groups": 1, "style": "bert"}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.style"),
    ("non-numeric eps string", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])], {"eps": "tiny"}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.eps"),
    ("eps not positive", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])], {"eps": -1.0}),
     grpc.StatusCode.INVALID_ARGUMENT, "eps"),
    ("unknown style", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])], {"style": "keras"}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.style"),
    ("normalized_ndim out of int32", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])],
        {"normalized_ndim": 1 << 40}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.normalized_ndim"),
    ("group_norm without num_groups", infer_request(
        "group_norm", [("input", "FP32", [1, 2, 2], [1, 2, 3, 4])]),
     grpc.StatusCode.INVALID_ARGUMENT, "num_groups"),
    ("fit and training", infer_request(
        "guard.bn", [("input", "FP32", [2, 2], [1, 2, 3, 4])],
        {"fit": True, "training": True}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.training"),
    ("weight with fit", infer_request(
        "guard.bn", [("input", "FP32", [2, 2], [1, 2, 3, 4]),
                     ("weight", "FP32", [2], [1, 1])], {"fit": True}),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[1].name"),
    ("training on a stateless model", infer_request(
        "layer_norm", [("input", "FP32", [2], [1, 2])], {"training": True}),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.training"),
    ("FP16 as typed contents", None, grpc.StatusCode.INVALID_ARGUMENT,
     "inputs[0].contents"),
    ("raw contents count", None, grpc.StatusCode.INVALID_ARGUMENT,
     "raw_input_contents"),
    ("unknown output", None, grpc.StatusCode.INVALID_ARGUMENT,
     "outputs[0].name"),
    ("channel count differs", infer_request(
        "guard.bn", [("input", "FP32", [2, 3], [1, 2, 3, 4, 5, 6])],
        {"training": True}),
     grpc.StatusCode.FAILED_PRECONDITION, "guard.bn"),
    ("version 2", None, grpc.StatusCode.NOT_FOUND, "model_version"),
    ("bad model name characters", infer_request(
        "bad name!", [("input", "FP32", [2, 2], [1, 2, 3, 4])]),
     grpc.StatusCode.INVALID_ARGUMENT, "model"),
]


def bad_requests():
    rows = []
    for what, request, code, field in BAD:
        if what == "unknown datatype":
            request.inputs[0].datatype = "INT8"
        elif what == "raw and typed contents":
            request = infer_request("layer_norm",
                                    [("input", "FP32", [2], [1, 2])])
            request.inputs[0].contents.fp32_contents.extend([1, 2])
        elif what == "FP16 as typed contents":
            request = infer_request("layer_norm",
                                    [("input", "FP16", [2], [1, 2])],
                                    raw=False)
            request.inputs[0].contents.fp32_contents.extend([1, 2])
        elif what == "raw contents count":
            request = infer_request("layer_norm",
                                    [("input", "FP32", [2], [1, 2])])
            request.raw_input_contents.append(b"\0" * 8)
        elif what == "unknown output":
            request = infer_request("layer_norm",
                                    [("input", "FP32", [2], [1, 2])])
            request.outputs.add(name="mean")
        elif what == "version 2":
            request = infer_request("layer_norm",
                                    [("input", "FP32", [2], [1, 2])])
            request.model_version = "2"
        rows.append((what, request, code, field))
    return rows


def check_bad_input(c, stub, native):
    native.CreateModel(pb.CreateModelRequest(name="guard.bn", num_features=2))
    stub.ModelInfer(infer_request(
        "guard.bn", [("input", "FP32", [2, 2], [1, 2, 3, 4])], {"fit": True}))
    for what, request, code, field in bad_requests():
        before = fingerprint(native)
        c.code(lambda: stub.ModelInfer(request), code, field, what)
        c.expect(fingerprint(native) == before, f"{what}: changed the state")


def check_garbage(c, channel):
    infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    c.code(lambda: infer(b"\xff\xff\xff", timeout=5),
           grpc.StatusCode.INVALID_ARGUMENT,
           "not a serialized inference.ModelInferRequest", "garbage bytes")


def check_metrics(c, metrics_port):
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    line = ('grpc_server_handled_total{grpc_code="OK",grpc_method="ModelInfer",'
            'grpc_service="inference.GRPCInferenceService",grpc_type="unary"}')
    counts = [float(l.split()[-1]) for l in text.splitlines()
              if l.startswith(line)]
    c.expect(counts and counts[0] > 10, f"metrics: {line} = {counts}")


def check_token(c):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "token")
        with open(path, "w") as f:
            f.write("s3cret\n")
        proc, port, _ = normd_process.start_normd(
            ARGS.normd, [f"--auth_token_file={path}"])
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            stub = oip_grpc.GRPCInferenceServiceStub(channel)
            c.expect(stub.ServerLive(oip.ServerLiveRequest()).live,
                     "ServerLive without a token")
            c.expect(stub.ServerReady(oip.ServerReadyRequest()).ready,
                     "ServerReady without a token")
            request = infer_request("layer_norm",
                                    [("input", "FP32", [2], [1, 2])])
            c.code(lambda: stub.ModelInfer(request),
                   grpc.StatusCode.UNAUTHENTICATED, "", "infer, no token")
            c.code(lambda: stub.ModelMetadata(oip.ModelMetadataRequest(
                name="layer_norm")), grpc.StatusCode.UNAUTHENTICATED, "",
                "metadata, no token")
            got = stub.ModelInfer(request, metadata=[("authorization",
                                                      "Bearer s3cret")])
            c.expect(len(got.raw_output_contents) == 1, "infer with token")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def main():
    c = Checker()
    rng = np.random.default_rng(31)
    proc, port, metrics_port = normd_process.start_normd(ARGS.normd)
    try:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_receive_message_length", 64 << 20)])
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        native = pb_grpc.NormalizerStub(channel)
        check_health_and_metadata(c, stub, native)
        check_stateless(c, stub, native, rng)
        check_batch_norm(c, stub, native, rng)
        check_bad_input(c, stub, native)
        check_garbage(c, channel)
        check_metrics(c, metrics_port)
        c.expect(normd_process.is_serving(
            channel, "inference.GRPCInferenceService"),
            "health of inference.GRPCInferenceService")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    check_token(c)
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
