#!/usr/bin/python3
"""The red-team findings of issue 28, each as a regression test against a
real normd: the exact gRPC code, the field or flag the message names, and
the state before and after (a refused call changes nothing; what the server
accepted, it recovers after SIGTERM and SIGKILL).

  1. Counters and statistics that overflow are refused (OUT_OF_RANGE) and
     every accepted state survives restarts; exports import back.
  2. The memory budget: --max_num_features and --max_model_bytes.
  3. Idle streams hold no admission slot; --stream_idle_timeout ends them.
  4. A garbage message at every position of both stream kinds.
  5. A training step whose reply would be too large changes nothing.
  6. Recovery of crashed state directories: torn and zero tails, checksum
     failures in the last and a middle record, a missing segment, missing
     snapshots and gaps, an out-of-range file number.
  7. Unparseable requests on every RPC, huge ranks, non-ASCII names,
     reflection behind the token.

Usage: red_team_test.py --normd BUILD/normd --stubs BUILD/python [--only 3,7]
"""

import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time

import harness

ARGS = harness.parse_args(__doc__, [
    ("--only", {"default": "", "help": "run only these findings, e.g. 3,7"}),
])
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

Code = grpc.StatusCode
CHECKS = harness.Checks()
SERVICE = "/normd.v1.Normalizer/"
# ASan keeps freed memory in quarantine: resident sizes mean nothing there.
UNDER_ASAN = "ASAN_OPTIONS" in os.environ


def tensor(shape, values=None, dtype=pb.FLOAT64, seed=0):
    count = int(np.prod(shape))
    if values is None:
        values = np.random.default_rng(seed).normal(2.0, 3.0, count)
    np_type = {pb.FLOAT64: "<f8", pb.FLOAT32: "<f4"}[dtype]
    return pb.Tensor(dtype=dtype, shape=shape,
                     data=np.asarray(values, dtype=np_type).tobytes())


def fit_request(model, channels, rows=4, seed=0, dtype=pb.FLOAT64):
    return pb.FitRequest(model=model,
                         input=tensor([rows, channels], dtype=dtype, seed=seed))


def require(condition, what):
    """Stops the test when `condition` is false. Unlike assert, it stays
    under `python3 -O` (where an assert would not even start the server)."""
    if not condition:
        raise RuntimeError(f"required: {what}")


def connect(server):
    channel = grpc.insecure_channel(
        server.target(),
        options=[("grpc.max_receive_message_length", 256 << 20),
                 ("grpc.max_send_message_length", 256 << 20)])
    return channel, pb_grpc.NormalizerStub(channel)


def export(stub, name):
    """The model's whole state, or None if it does not exist."""
    try:
        return stub.ExportModel(pb.ExportModelRequest(name=name))
    except grpc.RpcError as error:
        if error.code() == Code.NOT_FOUND:
            return None
        raise


def exports(stub):
    names = [m.name for m in stub.ListModels(pb.ListModelsRequest()).models]
    return {name: export(stub, name).SerializeToString() for name in names}


def state(name, channels, **fields):
    """A ModelState to import: defaults for what `fields` leaves out."""
    message = pb.ModelState(name=name, num_features=channels, momentum=0.1,
                            eps=1e-5, running_mean=[0.0] * channels,
                            running_var=[1.0] * channels,
                            weight=[1.0] * channels, bias=[0.0] * channels)
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(message, key)[:] = value
        else:
            setattr(message, key, value)
    return message


def restart_and_compare(server, stub_before, sig, what):
    """Stops `server` with `sig`, starts it again on its state directory and
    checks that it starts and holds exactly what it held; the new stub."""
    before = exports(stub_before)
    server.stop(sig)
    started = server.start()
    CHECKS.expect(started, f"{what}: restart failed: {server.log[-2000:]}")
    if not started:
        return None
    _, stub = connect(server)
    after = exports(stub)
    CHECKS.expect(after == before,
                  f"{what}: recovered {sorted(after)} differs from the "
                  f"acknowledged {sorted(before)}")
    return stub


def finding1_overflow_is_refused_and_state_recovers():
    CHECKS.begin("1. what the server accepts, it recovers")
    with tempfile.TemporaryDirectory() as state_dir:
        server = harness.Server(ARGS.normd, state_dir=state_dir)
        require(server.start(), server.log)
        _, stub = connect(server)

        # CreateModel(num_batches_tracked = INT64_MAX), then Fit: it used to
        # answer OK with the counter wrapped, and the restart refused.
        stub.CreateModel(pb.CreateModelRequest(
            name="created", num_features=2,
            num_batches_tracked=harness.INT64_MAX))
        before = export(stub, "created")
        CHECKS.expect_error(lambda: stub.Fit(fit_request("created", 2)),
                            Code.OUT_OF_RANGE, "num_batches_tracked",
                            what="Fit past num_batches_tracked = INT64_MAX")
        CHECKS.expect_error(
            lambda: stub.Normalize(pb.NormalizeRequest(
                model="created", mode=pb.BATCH_NORM, training=True,
                input=tensor([4, 2]))),
            Code.OUT_OF_RANGE, "num_batches_tracked",
            what="training Normalize past num_batches_tracked = INT64_MAX")
        CHECKS.expect(export(stub, "created") == before,
                      "refused steps changed model 'created'")

        # ImportModel(sample_count = INT64_MAX), then Fit.
        stub.ImportModel(pb.ImportModelRequest(model=state(
            "imported", 2, sample_count=harness.INT64_MAX, mean=[0.0, 1.0],
            var=[1.0, 2.0])))
        before = export(stub, "imported")
        CHECKS.expect_error(lambda: stub.Fit(fit_request("imported", 2)),
                            Code.OUT_OF_RANGE, "sample_count",
                            what="Fit past sample_count = INT64_MAX")
        # MergeModel of that state into itself (it answered OK with
        # sample_count = -2, and the log record could not be replayed).
        CHECKS.expect_error(
            lambda: stub.MergeModel(pb.MergeModelRequest(name="imported",
                                                         source=before)),
            Code.OUT_OF_RANGE, "sample_count",
            what="merging a state of sample_count INT64_MAX into itself")
        CHECKS.expect(export(stub, "imported") == before,
                      "refused changes changed model 'imported'")

        # Two large finite states: their average is representable, so the
        # merge is accepted and finite, and its export imports back.
        big = state("big", 1, num_batches_tracked=1, sample_count=1,
                    running_mean=[1.7e308], running_var=[1.7e308],
                    mean=[1.7e308], var=[0.0])
        stub.ImportModel(pb.ImportModelRequest(model=big))
        merged = stub.MergeModel(pb.MergeModelRequest(
            name="big", source=export(stub, "big")))
        CHECKS.expect(list(merged.running_mean) == [1.7e308] and
                      list(merged.running_var) == [1.7e308] and
                      list(merged.mean) == [1.7e308],
                      f"merge of two 1.7e308 states: {merged}")
        copy = stub.ImportModel(pb.ImportModelRequest(
            name="big-copy", model=export(stub, "big")))
        CHECKS.expect(copy.sample_count == 2, "the merged export imports")
        # Pooled statistics whose variance leaves the double range.
        stub.ImportModel(pb.ImportModelRequest(model=state(
            "high", 1, sample_count=1, mean=[1e200], var=[0.0])))
        before = export(stub, "high")
        CHECKS.expect_error(
            lambda: stub.MergeModel(pb.MergeModelRequest(
                name="high", source=state("low", 1, sample_count=1,
                                          mean=[-1e200], var=[0.0]))),
            Code.OUT_OF_RANGE, "var[0]",
            what="merge whose pooled variance overflows")
        CHECKS.expect(export(stub, "high") == before,
                      "a refused merge changed model 'high'")
        # Statistics that overflow on the way in: var x sample_count.
        CHECKS.expect_error(
            lambda: stub.ImportModel(pb.ImportModelRequest(model=state(
                "wide", 1, sample_count=10, mean=[0.0], var=[1e308]))),
            Code.OUT_OF_RANGE, "model.var[0]",
            what="import whose var x sample_count overflows")
        CHECKS.expect(export(stub, "wide") is None,
                      "a refused import created model 'wide'")
        # The generation counter.
        stub.ImportModel(pb.ImportModelRequest(model=state(
            "old", 2, generation=harness.UINT64_MAX)))
        CHECKS.expect_error(lambda: stub.Fit(fit_request("old", 2)),
                            Code.OUT_OF_RANGE, "generation",
                            what="Fit past generation = UINT64_MAX")
        CHECKS.expect_error(lambda: stub.ResetModel(
            pb.ResetModelRequest(name="old")), Code.OUT_OF_RANGE,
            "generation", what="Reset past generation = UINT64_MAX")
        # A first Fit that creates a model and is refused creates nothing.
        CHECKS.expect_error(
            lambda: stub.Fit(pb.FitRequest(model="fresh", input=tensor(
                [2, 1], [1e300, -1e300]))),
            Code.INVALID_ARGUMENT, "input", what="Fit whose moments overflow")
        CHECKS.expect(export(stub, "fresh") is None,
                      "a refused first Fit created model 'fresh'")

        stub.Fit(fit_request("normal", 3))
        stub = restart_and_compare(server, stub, signal.SIGTERM,
                                   "after SIGTERM")
        if stub is not None:
            stub.Fit(fit_request("normal", 3, seed=1))
            stub = restart_and_compare(server, stub, signal.SIGKILL,
                                       "after SIGKILL")
        server.stop()


def finding2_memory_budget():
    CHECKS.begin("2. the memory budget")
    server = harness.Server(ARGS.normd)
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
    server = harness.Server(ARGS.normd, ["--max_num_features=1048576",
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


def finding3_idle_streams():
    CHECKS.begin("3. idle streams")
    server = harness.Server(ARGS.normd)
    require(server.start(), server.log)
    channel, stub = connect(server)
    # 300 open streams that send nothing: over --max_inflight_requests
    # (256), yet a new caller is served.
    blockers = [harness.Blocker() for _ in range(300)]
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
    server = harness.Server(ARGS.normd, ["--stream_idle_timeout=1s"])
    require(server.start(), server.log)
    _, stub = connect(server)
    request = pb.NormalizeRequest(mode=pb.LAYER_NORM, input=tensor([2, 4]))
    for what, blocker, want in [
            ("NormalizeStream that sent nothing", harness.Blocker(),
             "no message arrived"),
            ("NormalizeStream idle after one message", harness.Blocker([request]),
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
    blocker = harness.Blocker([fit_request("idle-fit", 2, seed=s) for s in range(2)])
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
    server = harness.Server(ARGS.normd, ["--stream_idle_timeout=0"])
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


GARBAGE = b"\xff\xff\xff\xff\x0f"  # A field tag whose varint never ends.


def finding4_garbage_in_streams():
    CHECKS.begin("4. a garbage message at every position of a stream")
    server = harness.Server(ARGS.normd)
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


def finding5_rejected_training_step_changes_nothing():
    CHECKS.begin("5. a reply too large to send changes nothing")
    server = harness.Server(ARGS.normd, ["--max_num_features=1048576"])
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
    server = harness.Server(ARGS.normd, ["--max_message_bytes=1048576"])
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


SEGMENT_HEADER = 24  # Magic, version, first sequence, checksum.


def files(directory, prefix):
    return sorted(os.path.join(directory, f) for f in os.listdir(directory)
                  if f.startswith(prefix))


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x40]))


def record_offsets(path):
    """The offsets of the records of a log segment."""
    data = open(path, "rb").read()
    offsets, at = [], SEGMENT_HEADER
    while at + 16 <= len(data):
        length = struct.unpack_from("<I", data, at)[0]
        offsets.append(at)
        at += 16 + length
    return offsets


def finding6_recovery_of_crashed_state():
    CHECKS.begin("6. recovery of crashed state directories")
    work = tempfile.mkdtemp(prefix="normd_red_team_")
    try:
        base = os.path.join(work, "base")
        server = harness.Server(ARGS.normd, state_dir=base)
        require(server.start(), server.log)
        _, stub = connect(server)
        states = []
        for i in range(5):
            stub.Fit(fit_request("m", 3, seed=i))
            states.append(export(stub, "m").SerializeToString())
        server.stop(signal.SIGKILL)
        segment = files(base, "wal-")[-1]
        last = record_offsets(segment)[-1]

        def scenario(name, damage):
            directory = os.path.join(work, name)
            shutil.copytree(base, directory)
            damage(directory)
            return harness.Server(ARGS.normd, state_dir=directory)

        def expect_start(name, damage, want_state, *warnings):
            server = scenario(name, damage)
            if not CHECKS.expect(server.start(),
                                 f"{name}: refused: {server.log[-1500:]}"):
                return
            _, stub = connect(server)
            got = export(stub, "m")
            CHECKS.expect(got is not None and
                          got.SerializeToString() == want_state,
                          f"{name}: recovered state differs")
            for warning in warnings:
                CHECKS.expect(warning in server.log,
                              f"{name}: {warning!r} not in {server.log}")
            CHECKS.expect("never acknowledged" not in server.log,
                          f"{name}: the log claims what it cannot know")
            server.stop()

        def expect_refusal(name, damage, *fragments):
            server = scenario(name, damage)
            started = server.start()
            CHECKS.expect(not started, f"{name}: started")
            if started:
                server.stop()
                return
            for fragment in fragments:
                CHECKS.expect(fragment in server.log,
                              f"{name}: {fragment!r} not in {server.log}")

        def in_copy(directory, path):
            return os.path.join(directory, os.path.basename(path))

        expect_start(
            "torn tail",
            lambda d: os.truncate(in_copy(d, segment),
                                  os.path.getsize(segment) - 7),
            states[3], "dropped a torn record",
            "if the disk lost data it had confirmed, this is where")
        expect_start(
            "zero tail",
            lambda d: open(in_copy(d, segment), "ab").write(bytes(4096)),
            states[4])
        expect_refusal(
            "checksum of the last record",
            lambda d: flip_byte(in_copy(d, segment),
                                os.path.getsize(segment) - 3),
            os.path.basename(segment), f"offset {last}",
            "fails its checksum", f"truncating the file to {last} bytes")
        expect_refusal(
            "checksum of a middle record",
            lambda d: flip_byte(in_copy(d, segment), SEGMENT_HEADER + 20),
            os.path.basename(segment), f"offset {SEGMENT_HEADER}",
            "fails its checksum")
        expect_refusal(
            "out-of-range file number",
            lambda d: open(os.path.join(
                d, "snapshot-99999999999999999999.snap"), "w").close(),
            "snapshot-99999999999999999999.snap", "does not fit in 64 bits")

        # A graceful restart writes a snapshot; three more Fits go into the
        # next segment; then a crash.
        server = harness.Server(ARGS.normd, state_dir=base)
        require(server.start(), server.log)
        server.stop(signal.SIGTERM)
        require(server.start(), server.log)
        _, stub = connect(server)
        for i in range(3):
            stub.Fit(fit_request("m", 3, seed=10 + i))
        server.stop(signal.SIGKILL)
        snapshot = files(base, "snapshot-")[-1]
        segment = files(base, "wal-")[-1]
        covered = int(os.path.basename(snapshot)[9:29])
        expect_refusal(
            "missing segment",
            lambda d: os.remove(in_copy(d, segment)),
            os.path.basename(segment), "missing", "MANIFEST names it")
        expect_refusal(
            "missing snapshot",
            lambda d: os.remove(in_copy(d, snapshot)),
            os.path.basename(snapshot), "missing", "MANIFEST names it")

        def gap(directory):
            os.remove(in_copy(directory, snapshot))
            os.remove(os.path.join(directory, "MANIFEST"))

        expect_refusal("gap before the log", gap,
                       os.path.basename(segment),
                       f"records #1 to #{covered} are missing")
        # What cannot be detected without the marker: the newest segment
        # removed with it. Start-up says so.
        server = scenario("segment and marker removed", lambda d: (
            os.remove(in_copy(d, segment)),
            os.remove(os.path.join(d, "MANIFEST"))))
        CHECKS.expect(server.start(), "segment and marker removed: refused")
        CHECKS.expect("MANIFEST is missing" in server.log or
                      "/MANIFEST is missing" in server.log,
                      f"no warning that the marker is missing: {server.log}")
        server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def finding7_small_ones():
    CHECKS.begin("7. unparseable requests, ranks, names, reflection")
    token_file = tempfile.NamedTemporaryFile("w", suffix=".token")
    token_file.write("s3cret\n")
    token_file.flush()
    server = harness.Server(ARGS.normd,
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


def main():
    tests = (finding1_overflow_is_refused_and_state_recovers,
             finding2_memory_budget, finding3_idle_streams,
             finding4_garbage_in_streams,
             finding5_rejected_training_step_changes_nothing,
             finding6_recovery_of_crashed_state, finding7_small_ones)
    only = {int(n) for n in ARGS.only.split(",") if n}
    for number, test in enumerate(tests, start=1):
        if not only or number in only:
            CHECKS.run(test)
    return CHECKS.report("red team")


if __name__ == "__main__":
    sys.exit(main())
