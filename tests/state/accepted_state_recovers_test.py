#!/usr/bin/python3
"""What the server accepts, it recovers, against a real normd with a state
directory: counters (num_batches_tracked, sample_count, generation) and
statistics that a change would overflow are refused with OUT_OF_RANGE
naming the field, and change nothing; large finite states merge and
import back; every acknowledged state survives SIGTERM and SIGKILL.

Usage: accepted_state_recovers_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import signal
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from hostile import CHECKS  # noqa: E402
from hostile_calls import (Code, tensor, fit_request, require, connect,
                           export, state, restart_and_compare)  # noqa: E402


def counters_past_their_limit_are_refused(stub):
    """num_batches_tracked, sample_count and generation at their limits:
    the change that would pass them is OUT_OF_RANGE naming the counter, and
    changes nothing."""
    # CreateModel(num_batches_tracked = INT64_MAX), then Fit: it used to
    # answer OK with the counter wrapped, and the restart refused.
    stub.CreateModel(pb.CreateModelRequest(
        name="created", num_features=2,
        num_batches_tracked=hostile.INT64_MAX))
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
        "imported", 2, sample_count=hostile.INT64_MAX, mean=[0.0, 1.0],
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

    # The generation counter.
    stub.ImportModel(pb.ImportModelRequest(model=state(
        "old", 2, generation=hostile.UINT64_MAX)))
    CHECKS.expect_error(lambda: stub.Fit(fit_request("old", 2)),
                        Code.OUT_OF_RANGE, "generation",
                        what="Fit past generation = UINT64_MAX")
    CHECKS.expect_error(lambda: stub.ResetModel(
        pb.ResetModelRequest(name="old")), Code.OUT_OF_RANGE,
        "generation", what="Reset past generation = UINT64_MAX")


def statistics_that_overflow_are_refused(stub):
    """Large finite states merge and import back; a merge, an import or a
    first Fit whose statistics would leave fp64's range is refused and
    changes or creates nothing."""
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
    # A first Fit that creates a model and is refused creates nothing.
    CHECKS.expect_error(
        lambda: stub.Fit(pb.FitRequest(model="fresh", input=tensor(
            [2, 1], [1e300, -1e300]))),
        Code.INVALID_ARGUMENT, "input", what="Fit whose moments overflow")
    CHECKS.expect(export(stub, "fresh") is None,
                  "a refused first Fit created model 'fresh'")


def overflowing_changes_are_refused_and_accepted_states_recover():
    """The refusals above on a durable normd, then every acknowledged state
    as it was after SIGTERM and after SIGKILL."""
    with tempfile.TemporaryDirectory() as state_dir:
        server = hostile.Server(ARGS.normd, state_dir=state_dir)
        require(server.start(), server.log)
        _, stub = connect(server)

        counters_past_their_limit_are_refused(stub)
        statistics_that_overflow_are_refused(stub)
        stub.Fit(fit_request("normal", 3))
        stub = restart_and_compare(server, stub, signal.SIGTERM,
                                   "after SIGTERM")
        if stub is not None:
            stub.Fit(fit_request("normal", 3, seed=1))
            stub = restart_and_compare(server, stub, signal.SIGKILL,
                                       "after SIGKILL")
        server.stop()


if __name__ == "__main__":
    sys.exit(hostile.main("accepted state recovers", (
        overflowing_changes_are_refused_and_accepted_states_recover,)))
