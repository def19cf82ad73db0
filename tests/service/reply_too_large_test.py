#!/usr/bin/python3
"""Atomic rejection against a real normd: a training Normalize, a Fit or a
CreateModel whose reply would pass --max_message_bytes is refused with
RESOURCE_EXHAUSTED before it changes or creates anything.

Usage: reply_too_large_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
import numpy as np  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from hostile import CHECKS  # noqa: E402
from hostile_calls import (Code, tensor, fit_request, require, connect,
                           export)  # noqa: E402


def a_reply_too_large_changes_nothing():
    server = hostile.Server(ARGS.normd, ["--max_num_features=1048576"])
    require(server.start(), server.log)
    _, stub = connect(server)
    channels = 1 << 20
    stub.CreateModel(pb.CreateModelRequest(name="wide", num_features=channels))
    before = stub.GetModel(pb.GetModelRequest(name="wide"))
    # 32 MiB of input: its output plus a model of 1<<20 channels is past
    # the 64 MiB message limit.
    CHECKS.expect_error(
        lambda: stub.Normalize(pb.NormalizeRequest(
            model="wide", mode=pb.BATCH_NORM, training=True,
            input=tensor([8, channels], np.ones(8 * channels),
                         dtype=pb.FLOAT32))),
        Code.RESOURCE_EXHAUSTED, "--max_message_bytes",
        what="training Normalize whose reply is past 64 MiB")
    after = stub.GetModel(pb.GetModelRequest(name="wide"))
    CHECKS.expect(after.generation == before.generation and
                  after.num_batches_tracked == before.num_batches_tracked and
                  after.sample_count == 0,
                  f"the refused step moved the model: generation "
                  f"{before.generation} -> {after.generation}")
    server.stop()

    # The same for Fit and CreateModel under a small message limit.
    server = hostile.Server(ARGS.normd, ["--max_message_bytes=1048576"])
    require(server.start(), server.log)
    _, stub = connect(server)
    CHECKS.expect_error(
        lambda: stub.Fit(fit_request("small", 65536, rows=2,
                                     dtype=pb.FLOAT32)),
        Code.RESOURCE_EXHAUSTED, "--max_message_bytes",
        what="Fit whose reply is past the message limit")
    CHECKS.expect(export(stub, "small") is None,
                  "a Fit refused for its reply created the model")
    CHECKS.expect_error(
        lambda: stub.CreateModel(pb.CreateModelRequest(
            name="small", num_features=65536)),
        Code.RESOURCE_EXHAUSTED, "--max_message_bytes",
        what="CreateModel whose reply is past the message limit")
    CHECKS.expect(export(stub, "small") is None,
                  "a CreateModel refused for its reply created the model")
    server.stop()


if __name__ == "__main__":
    sys.exit(hostile.main("reply too large", (
        a_reply_too_large_changes_nothing,)))
