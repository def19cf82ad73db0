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


def damaged_state_directories():
    work = tempfile.mkdtemp(prefix="normd_red_team_")
    try:
        base = os.path.join(work, "base")
        server = hostile.Server(ARGS.normd, state_dir=base)
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
            return hostile.Server(ARGS.normd, state_dir=directory)

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
        server = hostile.Server(ARGS.normd, state_dir=base)
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


if __name__ == "__main__":
    sys.exit(hostile.main("damaged state directories", (damaged_state_directories,)))
