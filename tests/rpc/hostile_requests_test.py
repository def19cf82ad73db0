#!/usr/bin/python3
"""Hostile requests against a real normd with a bearer token: bytes that
are not a method's message get INVALID_ARGUMENT naming the message on
every RPC (health included), never UNIMPLEMENTED; ranks of 100,000 and
5,000,000 are refused naming --max_rank; a non-ASCII name is shown as its
code point; reflection needs the token, health does not.

Usage: hostile_requests_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402
from hostile import CHECKS  # noqa: E402
from hostile_calls import (Code, SERVICE, GARBAGE, require,
                           connect)  # noqa: E402


def unparseable_requests_ranks_names_and_reflection():
    token_file = tempfile.NamedTemporaryFile("w", suffix=".token")
    token_file.write("s3cret\n")
    token_file.flush()
    server = hostile.Server(ARGS.normd,
                            [f"--auth_token_file={token_file.name}"])
    require(server.start(), server.log)
    channel, _ = connect(server)
    auth = [("authorization", "Bearer s3cret")]
    stub = pb_grpc.NormalizerStub(channel)
    for method, message in [
            ("Normalize", "NormalizeRequest"), ("Fit", "FitRequest"),
            ("CreateModel", "CreateModelRequest"),
            ("GetModel", "GetModelRequest"),
            ("ListModels", "ListModelsRequest"),
            ("DeleteModel", "DeleteModelRequest"),
            ("ResetModel", "ResetModelRequest"),
            ("ExportModel", "ExportModelRequest"),
            ("ImportModel", "ImportModelRequest"),
            ("MergeModel", "MergeModelRequest"),
            ("CreateModels", "CreateModelsRequest")]:
        call = channel.unary_unary(SERVICE + method)
        CHECKS.expect_error(
            lambda: call(GARBAGE, metadata=auth, timeout=10),
            Code.INVALID_ARGUMENT, f"request: not a serialized normd.v1.{message}",
            what=f"garbage to {method}")

    for rank in (100_000, 5_000_000):
        request = pb.NormalizeRequest(mode=pb.LAYER_NORM, input=pb.Tensor(
            dtype=pb.FLOAT64, shape=[1] * rank, values=[1.0]))
        CHECKS.expect_error(
            lambda: stub.Normalize(request, metadata=auth, timeout=60),
            Code.INVALID_ARGUMENT, "input.shape", f"rank {rank}",
            "--max_rank", what=f"a tensor of rank {rank}")

    CHECKS.expect_error(
        lambda: stub.CreateModel(pb.CreateModelRequest(
            name="caf\u00e9", num_features=1), metadata=auth),
        Code.INVALID_ARGUMENT, "name", "U+00E9 '\u00e9'",
        what="a name with a non-ASCII character")
    CHECKS.expect_error(
        lambda: stub.CreateModel(pb.CreateModelRequest(
            name="a\U0001F600b", num_features=1), metadata=auth),
        Code.INVALID_ARGUMENT, "U+1F600", "at byte 1",
        what="a name with a 4-byte character")

    reflect = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
    list_services = b"\x3a\x00"
    CHECKS.expect_error(lambda: list(reflect(iter([list_services]),
                                             timeout=10)),
                        Code.UNAUTHENTICATED, "authorization",
                        what="reflection without the token")
    reply = b"".join(reflect(iter([list_services]), metadata=auth,
                             timeout=10))
    CHECKS.expect(b"normd.v1.Normalizer" in reply,
                  f"reflection with the token: {reply!r}")
    # file_containing_symbol (field 4): the file and what it imports.
    symbol = b"normd.v1.Normalizer"
    reply = b"".join(reflect(iter([b"\x22" + bytes([len(symbol)]) + symbol]),
                             metadata=auth, timeout=10))
    CHECKS.expect(b"normd/v1/normalizer.proto" in reply,
                  "reflection does not describe normd.v1.Normalizer")
    reply = b"".join(reflect(iter([GARBAGE, list_services]), metadata=auth,
                             timeout=10))
    CHECKS.expect(b"not a serialized grpc.reflection.v1alpha."
                  b"ServerReflectionRequest" in reply and
                  b"normd.v1.Normalizer" in reply,
                  f"reflection: a garbage request, then list_services: "
                  f"{reply!r}")
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    CHECKS.expect(check(b"", timeout=10) == b"\x08\x01",
                  "health without the token")
    CHECKS.expect_error(
        lambda: check(GARBAGE, timeout=10), Code.INVALID_ARGUMENT,
        "request: not a serialized grpc.health.v1.HealthCheckRequest",
        what="garbage to Health/Check")
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")
    CHECKS.expect_error(
        lambda: list(watch(GARBAGE, timeout=10)), Code.INVALID_ARGUMENT,
        "request: not a serialized grpc.health.v1.HealthCheckRequest",
        what="garbage to Health/Watch")
    long_name = b"x" * 5000
    CHECKS.expect_error(
        lambda: check(b"\x0a\x88\x27" + long_name, timeout=10),
        Code.NOT_FOUND, "service: unknown service",
        what="Health/Check of a 5000-byte service name")
    server.stop()


if __name__ == "__main__":
    sys.exit(hostile.main("hostile requests", (
        unparseable_requests_ranks_names_and_reflection,)))
