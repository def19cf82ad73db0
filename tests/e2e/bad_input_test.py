#!/usr/bin/python3
"""The bad-input table (tests/e2e/bad_inputs.json) from Python: every malformed
request gets its exact gRPC code and a message naming the field, changes no
model, and the server still serves afterwards. The same table runs from C++
in tests/bad_input_test.cc.

Usage: bad_input_test.py --normd BUILD/normd --stubs BUILD/python
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
from google.protobuf import json_format  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

TABLE = json.load(open(os.path.join(os.path.dirname(__file__),
                                    "bad_inputs.json")))
REQUEST_TYPES = {
    "Normalize": pb.NormalizeRequest, "Fit": pb.FitRequest,
    "CreateModel": pb.CreateModelRequest, "GetModel": pb.GetModelRequest,
    "DeleteModel": pb.DeleteModelRequest, "ResetModel": pb.ResetModelRequest,
    "ExportModel": pb.ExportModelRequest, "ImportModel": pb.ImportModelRequest,
    "MergeModel": pb.MergeModelRequest,
    "CreateModels": pb.CreateModelsRequest,
}
OVERSIZE_BYTES = 1200000


def make_request(rpc, fields):
    fields = json.loads(json.dumps(fields))  # Deep copy.
    oversize = fields.get("input", {}).get("data") == "OVERSIZE"
    if oversize:
        del fields["input"]["data"]
    request = json_format.ParseDict(fields, REQUEST_TYPES[rpc]())
    if oversize:
        request.input.data = bytes(OVERSIZE_BYTES)
    return request


def fingerprint(stub):
    models = stub.ListModels(pb.ListModelsRequest()).models
    return {m.name: stub.GetModel(pb.GetModelRequest(name=m.name))
            .SerializeToString() for m in models}


def main():
    proc, port, _ = normd_process.start_normd(ARGS.normd,
                                              TABLE["server_flags"])
    failures = []
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.NormalizerStub(channel)
        for step in TABLE["setup"]:
            getattr(stub, step["rpc"])(make_request(step["rpc"],
                                                    step["request"]))
        for row in TABLE["rows"]:
            if len(row["field"]) < 3:  # "" is in every message.
                failures.append(f"{row['name']}: names no field "
                                f"({row['field']!r})")
            before = fingerprint(stub)
            request = make_request(row["rpc"], row["request"])
            try:
                getattr(stub, row["rpc"])(request)
                failures.append(f"{row['name']}: succeeded")
                continue
            except grpc.RpcError as e:
                code, message = e.code().name, e.details() or ""
            if code != row["code"] or row["field"] not in message:
                failures.append(f"{row['name']}: got {code} {message!r}, want "
                                f"{row['code']} naming {row['field']!r}")
            if fingerprint(stub) != before:
                failures.append(f"{row['name']}: changed the state")

        # A bad message in the middle of a NormalizeStream: answered inline,
        # the stream goes on.
        spec = TABLE["streams"]["normalize"]
        before = fingerprint(stub)
        responses = list(stub.NormalizeStream(iter(
            [make_request("Normalize", r) for r in spec["requests"]])))
        if len(responses) != len(spec["requests"]):
            failures.append("NormalizeStream: wrong number of responses")
        for i, (response, want) in enumerate(zip(responses, spec["errors"])):
            got = response.error.code if response.HasField("error") else None
            if want is None and got is not None:
                failures.append(f"NormalizeStream message {i}: {response.error}")
            if want is not None and (
                    got != grpc.StatusCode[want["code"]].value[0] or
                    want["field"] not in response.error.message):
                failures.append(f"NormalizeStream message {i}: {response}")
        if fingerprint(stub) != before:
            failures.append("NormalizeStream changed the state")

        # A bad message in the middle of a FitStream ends the call; the steps
        # before it stay applied, the ones after it never run.
        spec = TABLE["streams"]["fit"]
        before = fingerprint(stub)
        try:
            stub.FitStream(iter([make_request("Fit", r)
                                 for r in spec["requests"]]))
            failures.append("FitStream: succeeded")
        except grpc.RpcError as e:
            if (e.code().name != spec["code"] or
                    spec["field"] not in (e.details() or "")):
                failures.append(f"FitStream: {e.code()} {e.details()!r}")
        after = fingerprint(stub)
        model = pb.ModelState.FromString(after.pop(spec["model"]))
        if model.num_batches_tracked != spec["applied_steps"]:
            failures.append(f"FitStream applied {model.num_batches_tracked}")
        if after != before:
            failures.append("FitStream changed other models")

        if not normd_process.is_serving(channel):
            failures.append("the server is not SERVING afterwards")
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if proc.returncode != 0:
        failures.append(f"normd exited with {proc.returncode}")
    return normd_process.report(
        failures, f"{len(TABLE['rows'])} rows + 2 streams")


if __name__ == "__main__":
    sys.exit(main())
