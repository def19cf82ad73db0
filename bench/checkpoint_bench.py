#!/usr/bin/python3
"""Checkpoint import and export: a ResNet-50-shaped checkpoint (torchvision's
resnet50, weights=None: 53 BatchNorm layers among 320 tensors) built here as
a safetensors file and as an ONNX model, imported with normctl
import-checkpoint and exported with export-checkpoint against a normd in
memory. Prints, per case, the file's size, the median wall time over --reps
runs (each under a fresh prefix) and normctl's peak RSS (getrusage of the
child), as JSON lines.

Usage: checkpoint_bench.py --build BUILD_DIR [--reps 5]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "testing"))
import normd_process  # noqa: E402


def run_measured(argv):
    """(seconds, peak RSS in MiB) of one normctl run, which must succeed.
    ru_maxrss of RUSAGE_CHILDREN is the largest child so far: each run is
    measured in a fresh Python child so that earlier runs do not mask it."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
            "t = time.perf_counter() - t\n"
            "if r.returncode: sys.exit(r.stderr)\n"
            "print(t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, *argv], check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[0]), int(out[1]) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    sys.path.insert(0, os.path.join(HERE, "..", "client", "python"))
    sys.path.insert(0, os.path.join(args.build, "python"))
    import torch
    import torchvision
    import normd
    normctl = os.path.join(args.build, "normctl")

    torch.manual_seed(50)
    model = torchvision.models.resnet50(weights=None).eval()
    layers = sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
    with tempfile.TemporaryDirectory() as tmp:
        files = {"safetensors": os.path.join(tmp, "resnet50.safetensors"),
                 "onnx": os.path.join(tmp, "resnet50.onnx")}
        normd.save_safetensors(files["safetensors"], model.state_dict())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, torch.randn(1, 3, 64, 64), files["onnx"],
                              training=torch.onnx.TrainingMode.PRESERVE)
        proc, port, _ = normd_process.start_normd(
            os.path.join(args.build, "normd"))
        server = f"--server=127.0.0.1:{port}"
        try:
            for kind, path in files.items():
                runs = [run_measured([normctl, server, "import-checkpoint",
                                      f"--input={path}",
                                      f"--prefix={kind}{i}"])
                        for i in range(args.reps)]
                print(json.dumps({
                    "case": f"import-checkpoint {kind}",
                    "layers": layers,
                    "file_mib": round(os.path.getsize(path) / 2**20, 1),
                    "seconds": round(statistics.median(r[0] for r in runs), 4),
                    "peak_rss_mib": round(max(r[1] for r in runs), 1)}))
            out = os.path.join(tmp, "out.safetensors")
            runs = [run_measured([normctl, server, "export-checkpoint",
                                  "--prefix=safetensors0", f"--output={out}"])
                    for _ in range(args.reps)]
            print(json.dumps({
                "case": "export-checkpoint",
                "layers": layers,
                "file_mib": round(os.path.getsize(out) / 2**20, 3),
                "seconds": round(statistics.median(r[0] for r in runs), 4),
                "peak_rss_mib": round(max(r[1] for r in runs), 1)}))
        finally:
            proc.terminate()
            proc.wait()


if __name__ == "__main__":
    main()
