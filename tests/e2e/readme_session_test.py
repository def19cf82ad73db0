#!/usr/bin/python3
"""Replays the normctl session shown in README.md against a fresh normd.

Every `$ normctl ...` line of the README's session block is run with the built
normctl (stdout and stderr together) and must print exactly what the README
shows, so that the documented session stays true.
"""

import argparse
import re
import shlex
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--normd", required=True)
    parser.add_argument("--normctl", required=True)
    parser.add_argument("--readme", required=True)
    args = parser.parse_args()

    text = open(args.readme, encoding="utf-8").read()
    section = text.split("## A normctl session", 1)[1]
    block = re.search(r"```text\n(.*?)```", section, re.S).group(1)
    steps = []  # (command, expected output)
    for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
        command, _, expected = chunk.partition("\n")
        steps.append((command, expected.rstrip("\n")))

    proc = subprocess.Popen(
        [args.normd, "--bind_address=127.0.0.1", "--port=0", "--metrics_port=-1",
         "--http_port=-1"],
        stderr=subprocess.PIPE, text=True)
    port = re.search(r"serving gRPC on [^ ]*:(\d+)", proc.stderr.readline()).group(1)
    failures = 0
    try:
        for command, expected in steps:
            argv = shlex.split(command)
            assert argv[0] == "normctl", command
            run = subprocess.run(
                [args.normctl, f"--server=127.0.0.1:{port}"] + argv[1:],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                timeout=30)
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
