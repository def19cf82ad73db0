#!/usr/bin/python3
"""Property: whatever a durable normd accepts, it recovers. Random sequences
of valid and hostile calls (Fit and training steps with values up to 1e300,
CreateModel and ImportModel with extreme counters and statistics, imports of
exports, merges of a state into itself and into others, resets, deletes,
garbage stream messages) run against a real normd with --state_dir and a
small --snapshot_log_bytes (so that snapshots and log rotations happen
often). After every call: a refused call changed nothing, an accepted one
is what the server now holds, and no call fails with a server-side code. At
random points the server is stopped with SIGTERM or SIGKILL and restarted:
every restart must succeed and hold exactly the acknowledged state.

Usage: state_property_test.py --normd BUILD/normd --stubs BUILD/python
           [--seed N] [--seconds S]
A soak: --seconds=3600 (any seed); CI runs a fixed seed for about two
minutes.
"""

import collections
import os
import random
import shutil
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__, [
    ("--seed", {"type": int, "default": 28}),
    ("--seconds", {"type": float, "default": 110.0}),
])
import grpc  # noqa: E402
import numpy as np  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

Code = grpc.StatusCode
# What a refusal may say: the client's fault or a limit, never the server's.
CLIENT_CODES = {Code.INVALID_ARGUMENT, Code.OUT_OF_RANGE,
                Code.FAILED_PRECONDITION, Code.NOT_FOUND, Code.ALREADY_EXISTS,
                Code.RESOURCE_EXHAUSTED}
NAMES = [f"p{i}" for i in range(6)]
SCALES = [1.0] * 4 + [1e3, 1e100, 1e154, 1e200, 1e300]
# Ordinary values mostly, extremes now and then.
COUNTERS = [0] * 4 + [1, 7, 100] * 2 + [hostile.INT64_MAX - 1,
                                          hostile.INT64_MAX]
GENERATIONS = [0] * 4 + [1, 5] * 3 + [hostile.UINT64_MAX - 1,
                                      hostile.UINT64_MAX]
GARBAGE = b"\xff\xff\xff\xff\x0f"


class Run:
    def __init__(self, rng, state_dir):
        self.rng = rng
        self.server = hostile.Server(
            ARGS.normd, ["--snapshot_log_bytes=20000"], state_dir=state_dir)
        self.channels = {}  # The channel count each name was first used with.
        self.acked = {}  # name -> ModelState (export) the server acknowledged.
        self.codes = collections.Counter()
        self.failures = []
        self.restarts = collections.Counter()

    def fail(self, what):
        self.failures.append(what)
        print("FAIL", what, flush=True)

    def connect(self):
        channel = grpc.insecure_channel(self.server.target())
        self.channel = channel
        self.stub = pb_grpc.NormalizerStub(channel)

    def export(self, name):
        try:
            return self.stub.ExportModel(pb.ExportModelRequest(name=name))
        except grpc.RpcError as error:
            if error.code() == Code.NOT_FOUND:
                return None
            raise

    # --- random inputs -------------------------------------------------

    def values(self, count):
        scale = self.rng.choice(SCALES)
        return np.random.default_rng(self.rng.getrandbits(32)).normal(
            self.rng.uniform(-3, 3) * scale, scale, count)

    def channel_count(self, name):
        """The model's channel count, now and then a wrong one."""
        if name in self.acked:
            self.channels[name] = self.acked[name].num_features
        self.channels.setdefault(name, self.rng.randint(1, 3))
        if self.rng.random() < 0.05:
            return self.rng.randint(1, 4)
        return self.channels[name]

    def tensor(self, rows, channels):
        return pb.Tensor(dtype=pb.FLOAT64, shape=[rows, channels],
                         data=self.values(rows * channels).astype("<f8")
                         .tobytes())

    def stats(self, channels):
        return [float(v) for v in self.values(channels)]

    def random_state(self, name, channels):
        sample_count = self.rng.choice(COUNTERS)
        state = pb.ModelState(
            name=name, num_features=channels,
            momentum=self.rng.choice([0.0, 0.1, 1.0]),
            cumulative_average=self.rng.random() < 0.3,
            eps=self.rng.choice([1e-5, 1e300]),
            num_batches_tracked=self.rng.choice(COUNTERS),
            sample_count=sample_count,
            running_mean=self.stats(channels),
            running_var=[abs(v) for v in self.stats(channels)],
            generation=self.rng.choice(GENERATIONS))
        if sample_count > 0:
            state.mean[:] = self.stats(channels)
            state.var[:] = [abs(v) for v in self.stats(channels)]
        return state

    # --- operations: each returns the names it may have changed ----------

    def op_fit(self, name):
        channels = self.channel_count(name)
        self.stub.Fit(pb.FitRequest(
            model=name, input=self.tensor(self.rng.randint(1, 4), channels)))

    def op_train(self, name):
        channels = self.channel_count(name)
        self.stub.Normalize(pb.NormalizeRequest(
            model=name, training=True,
            mode=self.rng.choice([pb.BATCH_NORM, pb.INSTANCE_NORM]),
            input=pb.Tensor(dtype=pb.FLOAT64, shape=[2, channels, 2],
                            data=self.values(4 * channels).astype("<f8")
                            .tobytes())))

    def op_create(self, name):
        channels = self.channel_count(name)
        self.stub.CreateModel(pb.CreateModelRequest(
            name=name, num_features=channels,
            num_batches_tracked=self.rng.choice(COUNTERS),
            running_mean=self.stats(channels),
            running_var=[abs(v) for v in self.stats(channels)],
            cumulative_average=self.rng.random() < 0.3))

    def op_import(self, name):
        self.stub.ImportModel(pb.ImportModelRequest(
            model=self.random_state(name, self.channel_count(name))))

    def op_import_export(self, name):
        source = self.rng.choice(NAMES)
        exported = self.export(source)
        if exported is None:
            return
        self.stub.ImportModel(pb.ImportModelRequest(name=name,
                                                    model=exported))

    def op_merge(self, name):
        source = name if self.rng.random() < 0.5 else self.rng.choice(NAMES)
        exported = self.export(source)
        if exported is None:
            exported = self.random_state(source, self.channel_count(name))
        self.stub.MergeModel(pb.MergeModelRequest(name=name, source=exported))

    def op_reset(self, name):
        self.stub.ResetModel(pb.ResetModelRequest(name=name))

    def op_delete(self, name):
        self.stub.DeleteModel(pb.DeleteModelRequest(name=name))

    def op_garbage_stream(self, name):
        channels = self.channel_count(name)
        messages = [pb.FitRequest(model=name, input=self.tensor(2, channels))
                    .SerializeToString() for _ in range(3)]
        messages[self.rng.randrange(3)] = GARBAGE
        self.channel.stream_unary("/normd.v1.Normalizer/FitStream")(
            iter(messages), timeout=30)

    OPS = [(op_fit, 30), (op_train, 15), (op_create, 8), (op_import, 10),
           (op_import_export, 8), (op_merge, 12), (op_reset, 4),
           (op_delete, 4), (op_garbage_stream, 4)]

    # --- the property ---------------------------------------------------

    def step(self):
        op = self.rng.choices([o for o, _ in self.OPS],
                              [w for _, w in self.OPS])[0]
        name = self.rng.choice(NAMES)
        before = {n: self.export(n) for n in NAMES}
        try:
            op(self, name)
            self.codes[(op.__name__, "OK")] += 1
            accepted = True
        except grpc.RpcError as error:
            self.codes[(op.__name__, error.code().name)] += 1
            accepted = False
            if error.code() not in CLIENT_CODES:
                self.fail(f"{op.__name__}({name}): {error.code()} "
                          f"{error.details()}")
            if len((error.details() or "").encode()) >= 1024:
                self.fail(f"{op.__name__}: a message of "
                          f"{len(error.details())} bytes")
        after = {n: self.export(n) for n in NAMES}
        for n in NAMES:
            if after[n] != before[n] and (not accepted or n != name):
                # A refused call changes nothing; an accepted one only its
                # model (a garbage stream applies the steps before it).
                if op is not Run.op_garbage_stream or n != name:
                    self.fail(f"{op.__name__}({name}) "
                              f"{'accepted' if accepted else 'refused'} "
                              f"changed model {n}")
        self.acked = {n: s for n, s in after.items() if s is not None}

    def restart(self):
        sig = self.rng.choice([signal.SIGTERM, signal.SIGKILL])
        self.server.stop(sig)
        self.restarts[sig.name] += 1
        if not self.server.start():
            self.fail(f"restart after {sig.name} failed: "
                      f"{self.server.log[-3000:]}")
            return False
        self.connect()
        names = [m.name for m in
                 self.stub.ListModels(pb.ListModelsRequest()).models]
        recovered = {n: self.export(n) for n in names}
        if recovered != self.acked:
            differ = sorted(n for n in set(recovered) | set(self.acked)
                            if recovered.get(n) != self.acked.get(n))
            self.fail(f"after {sig.name}: models {differ} differ from the "
                      "acknowledged state")
            self.acked = recovered
        return True


def main():
    rng = random.Random(ARGS.seed)
    state_dir = tempfile.mkdtemp(prefix="normd_property_")
    run = Run(rng, state_dir)
    operations = 0
    try:
        if not run.server.start():
            print(run.server.log)
            return 1
        run.connect()
        deadline = time.monotonic() + ARGS.seconds
        while time.monotonic() < deadline and len(run.failures) < 20:
            run.step()
            operations += 1
            if rng.random() < 0.03 and not run.restart():
                break
        run.restart()
    finally:
        hostile.kill_all()
        shutil.rmtree(state_dir, ignore_errors=True)
    print(f"seed {ARGS.seed}: {operations} operations, restarts "
          f"{dict(run.restarts)}, {len(run.acked)} models at the end")
    for (op, code), count in sorted(run.codes.items()):
        print(f"  {op:22} {code:20} {count}")
    print(f"{len(run.failures)} failures")
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
