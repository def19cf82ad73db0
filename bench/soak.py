#!/usr/bin/python3
"""Soak: sends --requests small calls (LayerNorm [1,768], BatchNorm eval and
Fit of [16,64], in rotation, 16 in flight, through bench/loadgen) to one
normd and reports its RSS after the warm-up (the first --warmup_fraction of
the calls) and at the end. Fails (exit 1) if RSS grew by more than
--max_drift (default 5%) after the warm-up: a leak or unbounded cache.

Usage: soak.py --build BUILD_DIR [--requests 1000000] [--state_dir DIR]
Prints one JSON line.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tests", "testing"))
import normd_process  # noqa: E402

PHASES = [
    ["--shape=1,768"],
    ["--shape=16,64", "--mode=batch_norm", "--model=soak-eval"],
    ["--shape=16,64", "--rpc=fit", "--model=soak-fit"],
]


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--requests", type=int, default=1000000)
    parser.add_argument("--warmup_fraction", type=float, default=0.2)
    parser.add_argument("--max_drift", type=float, default=0.05)
    parser.add_argument("--phase_seconds", type=float, default=1.0)
    parser.add_argument("--durable", action="store_true",
                        help="run normd with a temporary --state_dir")
    args = parser.parse_args()
    loadgen = os.path.join(args.build, "bench", "loadgen")
    with tempfile.TemporaryDirectory() as state_dir:
        flags = ["--state_dir=" + state_dir] if args.durable else []
        proc, port, _ = normd_process.start_normd(
            os.path.join(args.build, "normd"), flags)
        try:
            sent, phase, warm_rss = 0, 0, None
            while sent < args.requests:
                case = PHASES[phase % len(PHASES)]
                argv = [loadgen, f"--target=127.0.0.1:{port}", "--inflight=16",
                        f"--duration={args.phase_seconds}", "--warmup=0",
                        *case, "--create_model"]
                out = subprocess.run(argv, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.exit(f"soak: {' '.join(argv)}: {out.stderr}")
                sent += json.loads(out.stdout)["calls"]
                phase += 1
                if warm_rss is None and sent >= args.warmup_fraction * args.requests:
                    warm_rss = rss_kib(proc.pid)
            end_rss = rss_kib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    drift = (end_rss - warm_rss) / warm_rss
    print(json.dumps({"requests": sent, "rss_after_warmup_kib": warm_rss,
                      "rss_end_kib": end_rss, "drift": round(drift, 4),
                      "max_drift": args.max_drift,
                      "exit_code": proc.returncode}))
    return 0 if drift <= args.max_drift and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
