#!/usr/bin/python3
"""Recovery of damaged state directories against a real normd: a torn or
zero-filled tail starts with the acknowledged state (and a warning that
does not claim what it cannot know); a checksum failure in the last or a
middle record, a missing segment or snapshot, a gap before the log and an
out-of-range file number stop start-up naming the file and the offset; a
segment removed with the MANIFEST starts with a warning.

Usage: damaged_state_dir_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import shutil
import signal
import struct
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import hostile  # noqa: E402

ARGS = hostile.parse_args(__doc__)
from hostile import CHECKS  # noqa: E402
from hostile_calls import fit_request, require, connect, export  # noqa: E402


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


class Damage:
    """Copies of a state directory `base` under `work`, each damaged, then
    started: expected to start with a state, or to refuse naming what is
    wrong."""

    def __init__(self, work, base):
        self.work = work
        self.base = base

    def copy(self, name, damage):
        directory = os.path.join(self.work, name)
        shutil.copytree(self.base, directory)
        damage(directory)
        return hostile.Server(ARGS.normd, state_dir=directory)

    def in_copy(self, directory, path):
        return os.path.join(directory, os.path.basename(path))

    def expect_start(self, name, damage, want_state, *warnings):
        server = self.copy(name, damage)
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

    def expect_refusal(self, name, damage, *fragments):
        server = self.copy(name, damage)
        started = server.start()
        CHECKS.expect(not started, f"{name}: started")
        if started:
            server.stop()
            return
        for fragment in fragments:
            CHECKS.expect(fragment in server.log,
                          f"{name}: {fragment!r} not in {server.log}")


def fitted_then_killed(base, seeds):
    """Fits of model "m" on `base`, then SIGKILL: each acknowledged state."""
    server = hostile.Server(ARGS.normd, state_dir=base)
    require(server.start(), server.log)
    _, stub = connect(server)
    states = []
    for seed in seeds:
        stub.Fit(fit_request("m", 3, seed=seed))
        states.append(export(stub, "m").SerializeToString())
    server.stop(signal.SIGKILL)
    return states


def damaged_tails_and_records():
    """A torn or zero-filled tail starts with the acknowledged state; a
    checksum failure in the last or a middle record, and a file number past
    64 bits, stop start-up naming the file and the offset."""
    work = tempfile.mkdtemp(prefix="normd_damaged_")
    try:
        base = os.path.join(work, "base")
        states = fitted_then_killed(base, range(5))
        segment = files(base, "wal-")[-1]
        last = record_offsets(segment)[-1]
        damage = Damage(work, base)
        damage.expect_start(
            "torn tail",
            lambda d: os.truncate(damage.in_copy(d, segment),
                                  os.path.getsize(segment) - 7),
            states[3], "dropped a torn record",
            "if the disk lost data it had confirmed, this is where")
        damage.expect_start(
            "zero tail",
            lambda d: open(damage.in_copy(d, segment), "ab").write(bytes(4096)),
            states[4])
        damage.expect_refusal(
            "checksum of the last record",
            lambda d: flip_byte(damage.in_copy(d, segment),
                                os.path.getsize(segment) - 3),
            os.path.basename(segment), f"offset {last}",
            "fails its checksum", f"truncating the file to {last} bytes")
        damage.expect_refusal(
            "checksum of a middle record",
            lambda d: flip_byte(damage.in_copy(d, segment), SEGMENT_HEADER + 20),
            os.path.basename(segment), f"offset {SEGMENT_HEADER}",
            "fails its checksum")
        damage.expect_refusal(
            "out-of-range file number",
            lambda d: open(os.path.join(
                d, "snapshot-99999999999999999999.snap"), "w").close(),
            "snapshot-99999999999999999999.snap", "does not fit in 64 bits")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def missing_files_and_gaps():
    """After a snapshot and more changes: a missing segment or snapshot and
    a gap before the log stop start-up naming what is missing; a segment
    removed with the MANIFEST starts with a warning."""
    work = tempfile.mkdtemp(prefix="normd_damaged_")
    try:
        base = os.path.join(work, "base")
        fitted_then_killed(base, range(5))
        # A graceful restart writes a snapshot; three more Fits go into the
        # next segment; then a crash.
        server = hostile.Server(ARGS.normd, state_dir=base)
        require(server.start(), server.log)
        server.stop(signal.SIGTERM)
        fitted_then_killed(base, range(10, 13))
        snapshot = files(base, "snapshot-")[-1]
        segment = files(base, "wal-")[-1]
        covered = int(os.path.basename(snapshot)[9:29])
        damage = Damage(work, base)
        damage.expect_refusal(
            "missing segment",
            lambda d: os.remove(damage.in_copy(d, segment)),
            os.path.basename(segment), "missing", "MANIFEST names it")
        damage.expect_refusal(
            "missing snapshot",
            lambda d: os.remove(damage.in_copy(d, snapshot)),
            os.path.basename(snapshot), "missing", "MANIFEST names it")

        def gap(directory):
            os.remove(damage.in_copy(directory, snapshot))
            os.remove(os.path.join(directory, "MANIFEST"))

        damage.expect_refusal("gap before the log", gap,
                              os.path.basename(segment),
                              f"records #1 to #{covered} are missing")
        # What cannot be detected without the marker: the newest segment
        # removed with it. Start-up says so.
        server = damage.copy("segment and marker removed", lambda d: (
            os.remove(damage.in_copy(d, segment)),
            os.remove(os.path.join(d, "MANIFEST"))))
        CHECKS.expect(server.start(), "segment and marker removed: refused")
        CHECKS.expect("MANIFEST is missing" in server.log,
                      f"no warning that the marker is missing: {server.log}")
        server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(hostile.main("damaged state directories",
                          (damaged_tails_and_records, missing_files_and_gaps)))
