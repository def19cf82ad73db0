#!/usr/bin/python3
"""Streams against a real normd: idle streams hold no admission slot,
--stream_idle_timeout ends a stream that waits on its client (CANCELLED,
the steps it carried applied) and 0 turns it off; a garbage message at
every position of a FitStream ends it with INVALID_ARGUMENT naming the
message, the steps before it applied, and in a NormalizeStream gets an
error response while the stream goes on.

Usage: streams_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
import grpc  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from hostile import CHECKS  # noqa: E402
from hostile_calls import (Code, SERVICE, GARBAGE, tensor, fit_request,
                           require, connect, export)  # noqa: E402


def idle_streams_hold_no_slot_and_time_out():
    server = hostile.Server(ARGS.normd)
    require(server.start(), server.log)
    channel, stub = connect(server)
    # 300 open streams that send nothing: over --max_inflight_requests
    # (256), yet a new caller is served.
    blockers = [hostile.Blocker() for _ in range(300)]
    calls = [stub.NormalizeStream(iter(b)) for b in blockers]
    time.sleep(1.0)
    CHECKS.expect(server.metric("normd_open_streams") == 300,
                  f"normd_open_streams {server.metric('normd_open_streams')}")
    try:
        reply = stub.Normalize(pb.NormalizeRequest(
            mode=pb.LAYER_NORM, input=tensor([2, 4])), timeout=10)
        CHECKS.expect(len(reply.output.data) == 64, "Normalize reply")
    except grpc.RpcError as error:
        CHECKS.expect(False, f"a caller beside 300 idle streams: "
                      f"{error.code()} {error.details()}")
    for blocker in blockers:
        blocker.released.set()
    for call in calls:
        CHECKS.expect(list(call) == [], "an idle stream answered something")
    server.stop()

    # --stream_idle_timeout ends a stream that waits on its client.
    server = hostile.Server(ARGS.normd, ["--stream_idle_timeout=1s"])
    require(server.start(), server.log)
    _, stub = connect(server)
    request = pb.NormalizeRequest(mode=pb.LAYER_NORM, input=tensor([2, 4]))
    for what, blocker, want in [
            ("NormalizeStream that sent nothing", hostile.Blocker(),
             "no message arrived"),
            ("NormalizeStream idle after one message", hostile.Blocker([request]),
             "after 1 messages")]:
        start = time.monotonic()
        responses = []
        try:
            for response in stub.NormalizeStream(iter(blocker), timeout=30):
                responses.append(response)
            CHECKS.expect(False, f"{what}: ended OK")
        except grpc.RpcError as error:
            elapsed = time.monotonic() - start
            CHECKS.expect(error.code() == Code.CANCELLED,
                          f"{what}: {error.code()}")
            CHECKS.expect("--stream_idle_timeout" in error.details() and
                          want in error.details(),
                          f"{what}: {error.details()}")
            CHECKS.expect(1.0 <= elapsed < 10, f"{what}: ended after "
                          f"{elapsed:.1f} s, timeout 1 s")
        CHECKS.expect(len(responses) == len(blocker.messages),
                      f"{what}: {len(responses)} responses")
        blocker.released.set()
    blocker = hostile.Blocker([fit_request("idle-fit", 2, seed=s) for s in range(2)])
    CHECKS.expect_error(lambda: stub.FitStream(iter(blocker), timeout=30),
                        Code.CANCELLED, "--stream_idle_timeout",
                        "the 2 steps it carried are applied",
                        what="FitStream idle after two steps")
    blocker.released.set()
    CHECKS.expect(export(stub, "idle-fit").num_batches_tracked == 2,
                  "the idle FitStream's steps are not applied")
    CHECKS.expect(server.metric("normd_idle_streams_ended_total") == 3,
                  "normd_idle_streams_ended_total")
    server.stop()
    # --stream_idle_timeout=0 turns it off: a stream idle for 2.5 s (which
    # the 1 s timeout above ends) goes on.
    server = hostile.Server(ARGS.normd, ["--stream_idle_timeout=0"])
    require(server.start(), server.log)
    _, stub = connect(server)

    def slow_client():
        yield request
        time.sleep(2.5)
        yield request

    try:
        answered = list(stub.NormalizeStream(slow_client(), timeout=30))
        CHECKS.expect(len(answered) == 2 and
                      all(not r.HasField("error") for r in answered),
                      f"--stream_idle_timeout=0: {len(answered)} answers")
    except grpc.RpcError as error:
        CHECKS.expect(False, f"--stream_idle_timeout=0 ended a stream idle "
                             f"2.5 s: {error.code()} {error.details()}")
    CHECKS.expect(server.metric("normd_idle_streams_ended_total") == 0,
                  "--stream_idle_timeout=0: normd_idle_streams_ended_total")
    server.stop()


def a_garbage_message_anywhere_in_a_stream():
    server = hostile.Server(ARGS.normd)
    require(server.start(), server.log)
    channel, stub = connect(server)
    fit_stream = channel.stream_unary(SERVICE + "FitStream")
    for position in range(5):
        name = f"garbage-{position}"
        messages = [fit_request(name, 3, seed=i).SerializeToString()
                    for i in range(5)]
        messages[position] = GARBAGE
        CHECKS.expect_error(
            lambda: fit_stream(iter(messages), timeout=30),
            Code.INVALID_ARGUMENT, f"FitStream message {position}",
            "not a serialized normd.v1.FitRequest",
            f"the {position} steps before it are applied",
            what=f"FitStream, garbage at {position}")
        model = export(stub, name)
        applied = 0 if model is None else model.num_batches_tracked
        CHECKS.expect(applied == position,
                      f"garbage at {position}: {applied} steps applied")

    normalize_stream = channel.stream_stream(SERVICE + "NormalizeStream")
    requests = [pb.NormalizeRequest(mode=pb.LAYER_NORM, request_id=str(i),
                                    input=tensor([2, 8], seed=i))
                for i in range(6)]
    want = [stub.Normalize(r).output.data for r in requests]
    for position in range(6):
        messages = [r.SerializeToString() for r in requests]
        messages[position] = GARBAGE
        try:
            replies = [pb.NormalizeResponse.FromString(b) for b in
                       normalize_stream(iter(messages), timeout=30)]
        except grpc.RpcError as error:
            CHECKS.expect(False, f"NormalizeStream, garbage at {position}: "
                          f"{error.code()} {error.details()}")
            continue
        CHECKS.expect(len(replies) == 6,
                      f"garbage at {position}: {len(replies)} responses")
        for i, reply in enumerate(replies):
            if i == position:
                CHECKS.expect(
                    reply.error.code == Code.INVALID_ARGUMENT.value[0] and
                    "not a serialized normd.v1.NormalizeRequest"
                    in reply.error.message,
                    f"garbage at {position}: response {i}: {reply.error}")
            else:
                CHECKS.expect(not reply.HasField("error") and
                              reply.output.data == want[i],
                              f"garbage at {position}: response {i} wrong")
    server.stop()


if __name__ == "__main__":
    sys.exit(hostile.main("streams", (idle_streams_hold_no_slot_and_time_out, a_garbage_message_anywhere_in_a_stream)))
