#!/usr/bin/python3
"""Replays the normctl and curl sessions shown in README.md against a fresh
normd.

Every `$ normctl ...` line of the README's normctl session is run with the
built normctl (stdout and stderr together), and every `$ curl ...` line of
its Open Inference Protocol session with curl (localhost:8000 pointed at the
server's REST port); each must print exactly what the README shows, so that
the documented sessions stay true.
"""

import argparse
import re
import shlex
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))
import normd_process  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--normd", required=True)
    parser.add_argument("--normctl", required=True)
    parser.add_argument("--readme", required=True)
    args = parser.parse_args()

    text = open(args.readme, encoding="utf-8").read()
    steps = []  # (command, expected output)
    for heading in ("## A normctl session",
                    "## The Open Inference Protocol with curl"):
        section = text.split(heading, 1)[1]
        block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, expected = chunk.partition("\n")
            steps.append((command, expected.rstrip("\n")))

    proc, port, _ = normd_process.start_normd(args.normd,
                                              ["--metrics_port=-1"])
    http_port = proc.http_port
    failures = 0
    try:
        for command, expected in steps:
            argv = shlex.split(command)
            if argv[0] == "curl":
                argv = ["curl"] + [a.replace("localhost:8000",
                                             f"127.0.0.1:{http_port}")
                                   for a in argv[1:]]
            elif argv[0] != "normctl":
                raise RuntimeError(f"README session: not normctl or curl: "
                                   f"{command}")
            else:
                argv = [args.normctl, f"--server=127.0.0.1:{port}"] + argv[1:]
            run = subprocess.run(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, timeout=30)
            got = run.stdout.rstrip("\n")
            if got != expected:
                failures += 1
                print(f"FAIL $ {command}\n--- README\n{expected}\n--- got\n{got}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(f"{len(steps) - failures} passed, {failures} failed")
    return 1 if failures or not steps else 0


if __name__ == "__main__":
    sys.exit(main())
