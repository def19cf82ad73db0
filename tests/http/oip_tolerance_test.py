#!/usr/bin/python3
"""What KServe and Triton clients send and ask for, against a real normd:

- the parameters their clients add (request timeout, priority, sequence_*,
  binary_data_output; input content_type) are accepted and change nothing,
  over REST and over gRPC, while a misspelt normd parameter (epsilon) and an
  output classification are still 400 naming them;
- POST /v2/repository/index lists the built-in models and every BatchNorm
  model, READY; GET /v2/models/{name}/config gives a BatchNorm model's
  num_features, eps and momentum; GET /v2/models[/{name}]/stats counts each
  model's infer calls, successes and failures;
- a BatchNorm model's generation past 2^63 goes out unsigned: the decimal
  it is in REST JSON, a string_param past INT64_MAX over gRPC.

Usage: oip_tolerance_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import normd_process  # noqa: E402
from tolerances import fp32_output_bound, worst_excess  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import requests  # noqa: E402
from inference import grpc_predict_v2_pb2 as oip  # noqa: E402
from inference import grpc_predict_v2_pb2_grpc as oip_grpc  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402
from oip_cases import Checker, encode, infer_parameter  # noqa: E402

X = [[1.0, 2.0, 3.0], [4.0, 5.0, 7.0]]


class Rest:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"
        self.session = requests.Session()
        self.session.trust_env = False

    def get(self, path):
        return self.session.get(self.base + path, timeout=30)

    def post(self, path, document=None):
        return self.session.post(self.base + path, json=document, timeout=30)


def rest_document(parameters=None, input_parameters=None, outputs=None):
    document = {"inputs": [{"name": "input", "datatype": "FP32",
                            "shape": [2, 3], "data": X}]}
    if parameters is not None:
        document["parameters"] = parameters
    if input_parameters is not None:
        document["inputs"][0]["parameters"] = input_parameters
    if outputs is not None:
        document["outputs"] = outputs
    return document


def grpc_request(model, parameters=None, input_parameters=None):
    request = oip.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 3])
    request.raw_input_contents.append(encode(X, "FP32"))
    for table, values in ((request.parameters, parameters),
                          (tensor.parameters, input_parameters)):
        for key, value in (values or {}).items():
            table[key].CopyFrom(infer_parameter(oip, value))
    return request


def check_tolerated_parameters(c, rest, stub):
    plain = rest.post("/v2/models/layer_norm/infer", rest_document())
    tolerated = rest.post("/v2/models/layer_norm/infer", rest_document(
        parameters={"timeout": 1000000, "priority": 1, "sequence_id": 7,
                    "sequence_start": True, "sequence_end": False},
        input_parameters={"content_type": "application/json"}))
    c.expect(plain.status_code == 200 and tolerated.status_code == 200 and
             tolerated.json()["outputs"] == plain.json()["outputs"],
             f"REST tolerated parameters: {tolerated.status_code} "
             f"{tolerated.text[:300]}")
    x = np.asarray(X)
    want = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) +
                                                    1e-5)
    got = np.asarray(plain.json()["outputs"][0]["data"]).reshape(2, 3)
    c.expect(worst_excess(got, want, fp32_output_bound(want)) <= 1,
             f"LayerNorm (FP32): {got}")
    reference = stub.ModelInfer(grpc_request("layer_norm"))
    answer = stub.ModelInfer(grpc_request(
        "layer_norm",
        {"timeout": 1000000, "priority": 1, "sequence_id": "s-1",
         "sequence_start": True, "sequence_end": False,
         "binary_data_output": True},
        {"content_type": "raw", "binary_data_size": 24}))
    c.expect(answer.raw_output_contents == reference.raw_output_contents,
             "gRPC tolerated parameters change the output")
    for document, field in (
            (rest_document(parameters={"epsilon": 1e-3}), '"epsilon"'),
            (rest_document(outputs=[{"name": "output", "parameters":
                                     {"classification": 2}}]),
             "outputs[0].parameters.classification")):
        r = rest.post("/v2/models/layer_norm/infer", document)
        c.expect(r.status_code == 400 and field in r.json()["error"],
                 f"{field}: {r.status_code} {r.text}")
    try:
        stub.ModelInfer(grpc_request("layer_norm", {"epsilon": "1e-3"}))
        c.expect(False, "gRPC epsilon accepted")
    except grpc.RpcError as e:
        c.expect(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
                 '"epsilon"' in e.details(), f"gRPC epsilon: {e}")


def check_repository_config_and_stats(c, rest, native):
    native.CreateModel(pb.CreateModelRequest(name="idx/bn", num_features=3,
                                             eps=1e-3, momentum=0.25))
    r = rest.post("/v2/repository/index")
    names = [m["name"] for m in r.json()] if r.status_code == 200 else []
    c.expect(r.status_code == 200 and
             names[:6] == ["layer_norm", "rms_norm", "group_norm",
                           "instance_norm", "l2_norm", "weight_norm"] and
             "idx/bn" in names and
             all(m["state"] == "READY" and m["version"] == "1"
                 for m in r.json()), f"index: {r.status_code} {r.text}")
    r = rest.post("/v2/repository/index", {"ready": True})
    c.expect(r.status_code == 200, f"index with ready: {r.status_code}")
    r = rest.post("/v2/repository/index", {"repository": "x"})
    c.expect(r.status_code == 400 and "repository" in r.json()["error"],
             f"index with an unknown key: {r.status_code} {r.text}")
    r = rest.get("/v2/models/idx%2Fbn/config")
    config = r.json() if r.status_code == 200 else {}
    c.expect(config.get("name") == "idx/bn" and
             config.get("platform") == "normd" and
             config.get("max_batch_size") == 0 and
             config["input"][0]["dims"] == [-1, 3] and
             config["input"][0]["data_type"] == "TYPE_FP32" and
             config["parameters"]["num_features"] == {"string_value": "3"} and
             config["parameters"]["eps"] == {"string_value": "0.001"} and
             config["parameters"]["momentum"] == {"string_value": "0.25"},
             f"config: {r.status_code} {r.text}")
    c.expect(rest.get("/v2/models/nope/config").status_code == 404,
             "config of an unknown model")
    before = rest.get("/v2/models/rms_norm/stats").json()
    for _ in range(3):
        rest.post("/v2/models/rms_norm/infer", rest_document())
    rest.post("/v2/models/rms_norm/infer",
              rest_document(parameters={"nope": 1}))
    after = rest.get("/v2/models/rms_norm/stats").json()
    stats = after["model_stats"][0]
    old = before["model_stats"][0]["inference_stats"]
    c.expect(stats["name"] == "rms_norm" and stats["version"] == "1" and
             stats["inference_stats"]["success"]["count"] ==
             old["success"]["count"] + 3 and
             stats["inference_stats"]["fail"]["count"] ==
             old["fail"]["count"] + 1 and
             stats["inference_stats"]["success"]["ns"] > 0 and
             stats["inference_count"] == stats["execution_count"] ==
             stats["inference_stats"]["success"]["count"],
             f"stats of rms_norm: {after}")
    everything = rest.get("/v2/models/stats").json()["model_stats"]
    c.expect({"layer_norm", "idx/bn"} <= {m["name"] for m in everything},
             f"stats of every model: {[m['name'] for m in everything]}")


def check_unsigned_generation(c, rest, native, stub):
    state = pb.ModelState(name="gen.bn", num_features=3,
                          running_mean=[0, 0, 0], running_var=[1, 1, 1],
                          weight=[1, 1, 1], bias=[0, 0, 0], eps=1e-5,
                          momentum=0.1, generation=(1 << 63) + 5)
    native.ImportModel(pb.ImportModelRequest(model=state))
    r = rest.post("/v2/models/gen.bn/infer",
                  rest_document(parameters={"training": True}))
    generation = r.json().get("parameters", {}).get("generation") \
        if r.status_code == 200 else None
    c.expect(generation == (1 << 63) + 6 and
             b'"generation":9223372036854775814' in r.content,
             f"REST generation past 2^63: {r.status_code} {r.text[:300]}")
    reply = stub.ModelInfer(grpc_request("gen.bn", {"training": True}))
    p = reply.parameters["generation"]
    c.expect(p.WhichOneof("parameter_choice") == "string_param" and
             p.string_param == str((1 << 63) + 7),
             f"gRPC generation past 2^63: {p}")
    small = stub.ModelInfer(grpc_request("idx/bn"))
    q = small.parameters["generation"]
    c.expect(q.WhichOneof("parameter_choice") == "int64_param" and
             q.int64_param >= 1, f"gRPC small generation: {q}")


def main():
    c = Checker()
    with normd_process.serving(ARGS.normd) as proc:
        channel = grpc.insecure_channel(f"127.0.0.1:{proc.grpc_port}")
        native = pb_grpc.NormalizerStub(channel)
        stub = oip_grpc.GRPCInferenceServiceStub(channel)
        rest = Rest(proc.http_port)
        check_tolerated_parameters(c, rest, stub)
        check_repository_config_and_stats(c, rest, native)
        check_unsigned_generation(c, rest, native, stub)
    return normd_process.report(c.failures, f"{c.checks} checks")


if __name__ == "__main__":
    sys.exit(main())
