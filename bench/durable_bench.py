#!/usr/bin/python3
"""Durable vs in-memory Fit throughput: two normd servers, one with a
--state_dir (every Fit acknowledged only after its fdatasync, group commit),
one without, driven alternately by bench/loadgen --rpc=fit with 16 calls in
flight; medians of --reps runs per case. Prints a JSON line per case with the
ratio durable / in-memory, and the log's records per sync from /metrics.

Usage: durable_bench.py --build BUILD_DIR [--reps 5] [--duration 2]
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "testing"))
import normd_process  # noqa: E402

# name -> Fit input shape (fp32; channels = shape[1]).
CASES = {"fit_4kib": "16,64", "fit_64kib": "32,512", "fit_1mib": "256,1024"}


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()
    m = re.search(rf"^{name} (\S+)$", text.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--duration", type=float, default=2.0)
    args = parser.parse_args()
    normd = os.path.join(args.build, "normd")
    loadgen = os.path.join(args.build, "bench", "loadgen")
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as state_dir:
        servers = {
            "memory": normd_process.start_normd(normd),
            "durable": normd_process.start_normd(
                normd, ["--state_dir=" + state_dir]),
        }
        try:
            for case, shape in CASES.items():
                qps = {name: [] for name in servers}
                syncs0 = metric(servers["durable"][2], "normd_wal_syncs_total")
                records0 = metric(servers["durable"][2],
                                  "normd_wal_records_total")
                for _ in range(args.reps):
                    for name, (_, port, _) in servers.items():
                        out = subprocess.run(
                            [loadgen, f"--target=127.0.0.1:{port}", "--rpc=fit",
                             f"--shape={shape}", f"--model={case}",
                             "--create_model", "--inflight=16",
                             f"--duration={args.duration}", "--warmup=0.3"],
                            capture_output=True, text=True, check=True)
                        qps[name].append(json.loads(out.stdout)["qps"])
                syncs = metric(servers["durable"][2],
                               "normd_wal_syncs_total") - syncs0
                records = metric(servers["durable"][2],
                                 "normd_wal_records_total") - records0
                memory = statistics.median(qps["memory"])
                durable = statistics.median(qps["durable"])
                print(json.dumps({
                    "case": case, "shape": shape, "memory_qps": memory,
                    "durable_qps": durable,
                    "ratio": round(durable / memory, 3),
                    "records_per_sync": round(records / max(syncs, 1), 2)}),
                    flush=True)
        finally:
            for proc, _, _ in servers.values():
                proc.terminate()
                proc.wait(timeout=60)


if __name__ == "__main__":
    main()
