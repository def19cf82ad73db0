#!/usr/bin/python3
"""The memory budget against a real normd: --max_num_features refuses a
wide model before anything is allocated, --max_model_bytes stops the
models that would pass it (RESOURCE_EXHAUSTED naming the flag, nothing
created), normd_model_bytes counts what is held, resident memory stays
within the budget, and DeleteModel gives it back; drift references and
their windows are charged too.

Usage: memory_budget_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from hostile import CHECKS  # noqa: E402
from hostile_calls import (Code, tensor, fit_request, require, connect,
                           export)  # noqa: E402


# ASan keeps freed memory in quarantine: resident sizes mean nothing there.
UNDER_ASAN = "ASAN_OPTIONS" in os.environ


def model_limits_refuse_before_allocating():
    server = hostile.Server(ARGS.normd)
    require(server.start(), server.log)
    _, stub = connect(server)
    # The 13-byte request: refused by the default --max_num_features.
    CHECKS.expect_error(
        lambda: stub.CreateModel(pb.CreateModelRequest(
            name="huge", num_features=1 << 20)),
        Code.RESOURCE_EXHAUSTED, "num_features", "--max_num_features",
        what="CreateModel(num_features = 1<<20)")
    CHECKS.expect_error(
        lambda: stub.Fit(pb.FitRequest(model="huge", input=tensor(
            [1, 1 << 20], np.zeros(1 << 20), dtype=pb.FLOAT32))),
        Code.RESOURCE_EXHAUSTED, "--max_num_features",
        what="a Fit that would create a model of 1<<20 channels")
    CHECKS.expect(not stub.ListModels(pb.ListModelsRequest()).models,
                  "a refused model was created")
    server.stop()

    # With wide models allowed, the byte budget stops them: 1<<20 channels
    # cost 56 MiB each, so 3 fit in 200 MB and the 4th is refused.
    budget = 200_000_000
    server = hostile.Server(ARGS.normd, ["--max_num_features=1048576",
                                         f"--max_model_bytes={budget}"])
    require(server.start(), server.log)
    _, stub = connect(server)
    rss_before = server.rss_mib()
    accepted = 0
    for i in range(8):
        name = f"w{i}"
        try:
            stub.CreateModel(pb.CreateModelRequest(name=name,
                                                   num_features=1 << 20))
        except grpc.RpcError as error:
            CHECKS.expect(error.code() == Code.RESOURCE_EXHAUSTED and
                          "--max_model_bytes" in error.details(),
                          f"model {i}: {error.code()} {error.details()}")
            CHECKS.expect(export(stub, name) is None,
                          f"refused model {name} exists")
            continue
        accepted += 1
        stub.Fit(fit_request(name, 1 << 20, rows=2, dtype=pb.FLOAT32))
    CHECKS.expect(accepted == 3, f"{accepted} models of 1<<20 channels "
                  f"accepted in {budget} bytes, want 3")
    footprint = 256 + 2 + 56 * (1 << 20)
    CHECKS.expect(server.metric("normd_model_bytes") == 3 * footprint,
                  f"normd_model_bytes {server.metric('normd_model_bytes')}")
    CHECKS.expect(server.metric("normd_max_model_bytes") == budget,
                  "normd_max_model_bytes")
    growth = server.rss_mib() - rss_before
    if not UNDER_ASAN:
        CHECKS.expect(growth < budget / 2**20 + 160,
                      f"RSS grew by {growth:.0f} MiB for a {budget} byte "
                      "budget")
    # Deleting gives the budget back.
    stub.DeleteModel(pb.DeleteModelRequest(name="w0"))
    stub.CreateModel(pb.CreateModelRequest(name="w9", num_features=1 << 20))
    CHECKS.expect(server.metric("normd_model_bytes") == 3 * footprint,
                  "budget not given back by DeleteModel")
    server.stop()


def drift_references_are_charged():
    """A reference and its window cost 16 + 24 x --drift_buckets bytes per
    channel: with room for the model but not for that, SetReference is
    RESOURCE_EXHAUSTED naming the flag and the model keeps no reference;
    with room, normd_model_bytes counts it, and ClearReference gives it
    back."""
    channels = 1000
    model = 256 + 1 + 56 * channels
    drift = (16 + 24 * 4) * channels
    server = hostile.Server(ARGS.normd, ["--drift_buckets=4",
                                         f"--max_model_bytes={model + drift - 1}"])
    require(server.start(), server.log)
    _, stub = connect(server)
    stub.CreateModel(pb.CreateModelRequest(name="m", num_features=channels))
    CHECKS.expect_error(
        lambda: stub.SetReference(pb.SetReferenceRequest(
            model="m", source=pb.REFERENCE_RUNNING)),
        Code.RESOURCE_EXHAUSTED, "--max_model_bytes",
        what="SetReference past --max_model_bytes")
    state = stub.GetModel(pb.GetModelRequest(name="m"))
    CHECKS.expect(not state.HasField("reference") and state.generation == 1,
                  f"refused SetReference changed the model: {state}")
    CHECKS.expect(server.metric("normd_model_bytes") == model,
                  f"normd_model_bytes {server.metric('normd_model_bytes')}")
    server.stop()

    server = hostile.Server(ARGS.normd, ["--drift_buckets=4",
                                         f"--max_model_bytes={model + drift}"])
    require(server.start(), server.log)
    _, stub = connect(server)
    stub.CreateModel(pb.CreateModelRequest(name="m", num_features=channels))
    stub.SetReference(pb.SetReferenceRequest(model="m",
                                             source=pb.REFERENCE_RUNNING))
    CHECKS.expect(server.metric("normd_model_bytes") == model + drift,
                  f"normd_model_bytes {server.metric('normd_model_bytes')} "
                  f"with a reference, want {model + drift}")
    stub.ClearReference(pb.ClearReferenceRequest(model="m"))
    CHECKS.expect(server.metric("normd_model_bytes") == model,
                  "ClearReference did not give the bytes back")
    server.stop()


if __name__ == "__main__":
    sys.exit(hostile.main("memory budget", (
        model_limits_refuse_before_allocating, drift_references_are_charged)))
