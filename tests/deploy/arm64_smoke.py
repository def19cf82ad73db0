#!/usr/bin/env python3
"""The ARM64 normd under qemu gives the x86 normd's bytes.

Starts the host's normd and the cross-built ARM64 normd (qemu-user-static,
once as a NEON CPU and once as `-cpu max`, which has SVE), and sends both,
from the host's normctl over loopback: Normalize in float32 LayerNorm and
L2 norm, bfloat16 GroupNorm channels-last and Weight Norm, and float16
RMSNorm, and a Fit whose model
is then read back and used by a BatchNorm Normalize. Output bytes and model
statistics must be identical. Used by `make test-arm64`.

  arm64_smoke.py --normd build/normd --normctl build/normctl \
      --normd_arm64 build-arm64/normd
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "testing"))
import normd_process  # noqa: E402

# qemu CPU models and the SIMD target normd must report on each.
CPUS = (("cortex-a72", "neon"), ("max", "sve"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normd", required=True)
    parser.add_argument("--normctl", required=True)
    parser.add_argument("--normd_arm64", required=True)
    parser.add_argument("--qemu", default="/usr/bin/qemu-aarch64-static")
    args = parser.parse_args()
    failures = []
    rng = np.random.default_rng(5)
    with tempfile.TemporaryDirectory() as tmp:
        def path(name):
            return os.path.join(tmp, name)

        # Odd sizes (tails on every target), an offset of 1e4 for fp32.
        inputs = {
            "f32": (rng.normal(1e4, 3.0, (5, 3, 37)).astype(np.float32),
                    "float32"),
            "bf16": ((rng.normal(0.5, 2.0, (2, 6, 7, 12)).astype(np.float32)
                      .view(np.uint32) >> 16).astype(np.uint16), "bfloat16"),
            "f16": (rng.normal(0.0, 3.0, (9, 70)).astype(np.float16)
                    .view(np.uint16), "float16"),
        }
        for name, (array, _) in inputs.items():
            array.tofile(path(name + ".bin"))

        def shape(name):
            return ",".join(str(d) for d in inputs[name][0].shape)

        def calls(server, tag):
            """Runs every call against `server`; returns {what: bytes}."""
            def ctl(*flags):
                run = subprocess.run(
                    [args.normctl, f"--server={server}", *flags],
                    capture_output=True, text=True, timeout=300)
                if run.returncode != 0:
                    failures.append(f"{tag}: normctl {flags}: {run.stderr}")
                return run.stdout

            results = {}
            for name, mode, extra in (
                    ("f32", "layer_norm", []),
                    ("bf16", "group_norm", ["--num_groups=2",
                                            "--channel_axis=-1"]),
                    ("f16", "rms_norm", []),
                    ("f32", "l2_norm", ["--normalized_ndim=2"]),
                    ("bf16", "weight_norm", ["--channel_axis=1",
                                             "--weight=1,2,3,4,5,6"])):
                out = path(f"{tag}-{name}.out")
                ctl("normalize", f"--input_file={path(name + '.bin')}",
                    f"--shape={shape(name)}", f"--dtype={inputs[name][1]}",
                    f"--mode={mode}", f"--output_file={out}", *extra)
                results[f"{name} {mode}"] = (open(out, "rb").read()
                                             if os.path.exists(out) else b"")
            ctl("fit", "--model=m", f"--input_file={path('f32.bin')}",
                f"--shape={shape('f32')}", "--dtype=float32")
            model = ctl("get", "--model=m", "--json")
            results["fit"] = json.loads(model) if model else None
            out = path(f"{tag}-bn.out")
            ctl("normalize", "--mode=batch_norm", "--model=m",
                f"--input_file={path('f32.bin')}", f"--shape={shape('f32')}",
                f"--output_file={out}")
            results["batch_norm"] = (open(out, "rb").read()
                                     if os.path.exists(out) else b"")
            return results

        def run_on(command, tag, target=None):
            proc, port, _ = normd_process.start_normd(command)
            try:
                if target and not proc.serving_line.rstrip().endswith(
                        f"SIMD target {target}"):
                    failures.append(f"{tag}: not on {target}: "
                                    f"{proc.serving_line!r}")
                return calls(f"127.0.0.1:{port}", tag)
            finally:
                proc.terminate()
                proc.wait(timeout=120)

        expected = run_on(args.normd, "x86")
        for what, value in expected.items():
            if not value:
                failures.append(f"x86: no result for {what}")
        for cpu, target in CPUS:
            got = run_on([args.qemu, "-cpu", cpu, args.normd_arm64],
                         f"arm64-{cpu}", target)
            for what, value in expected.items():
                if got.get(what) != value:
                    failures.append(f"arm64 ({cpu}, {target}): {what} differs "
                                    f"from x86")
            print(f"arm64 {cpu} ({target}): {len(got)} results compared")
    return normd_process.report(failures, "arm64 smoke")


if __name__ == "__main__":
    sys.exit(main())
