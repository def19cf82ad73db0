#!/usr/bin/python3
"""docs/drift.md's worked example, run as written against a fresh normd:
its Python blocks in order, in one process (their own asserts check that
kl_max rises on shifted images and falls after recalibration, and the
example prints what Prometheus shows), then `normctl drift`, which must
rank resnet.bn1's drift and print its worst channels.

Usage: drift_example_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl --source SOURCE_DIR
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

args = normd_process.parse_test_args(__doc__, required=("normctl", "source"))
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def main():
    with open(os.path.join(args.source, "docs", "drift.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    check(len(blocks) == 2, f"docs/drift.md has {len(blocks)} Python blocks")
    script = "\n".join(blocks)
    with normd_process.serving(args.normd) as proc:
        target = f"127.0.0.1:{proc.grpc_port}"
        env = dict(os.environ,
                   NORMD_TARGET=target,
                   NORMD_METRICS=f"http://127.0.0.1:{proc.metrics_port}"
                                 "/metrics",
                   PYTHONPATH=os.pathsep.join(
                       [os.path.join(args.source, "client", "python"),
                        args.stubs]))
        done = subprocess.run([sys.executable, "-c", script], env=env,
                              capture_output=True, text=True, timeout=600)
        print(done.stdout, done.stderr)
        check(done.returncode == 0,
              f"the example fails: {done.returncode} {done.stderr[-2000:]}")
        check('Prometheus: normd_model_drift_kl_max{model="resnet.bn1"}'
              in done.stdout, "the example shows the Prometheus gauge")
        listed = subprocess.run([args.normctl, f"--server={target}", "drift"],
                                capture_output=True, text=True, timeout=60)
        print(listed.stdout)
        rows = [line.split() for line in listed.stdout.splitlines()]
        check(listed.returncode == 0 and rows and rows[0][:2] ==
              ["NAME", "REFERENCE"] and
              any(r[0] == "resnet.bn1" and r[1] == "running" for r in rows),
              f"normctl drift lists resnet.bn1: {listed.stdout} "
              f"{listed.stderr}")
        one = subprocess.run([args.normctl, f"--server={target}", "drift",
                              "--model=resnet.bn1"],
                             capture_output=True, text=True, timeout=60)
        print(one.stdout)
        check(one.returncode == 0 and "CHANNEL" in one.stdout and
              len(one.stdout.split("CHANNEL")[1].splitlines()) == 11,
              f"normctl drift --model shows ten channels: {one.stdout}")
    return normd_process.report(failures, "docs/drift.md example")


if __name__ == "__main__":
    sys.exit(main())
