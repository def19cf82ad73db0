#!/usr/bin/python3
"""`cmake --install` and find_package(normd CONFIG) from an outside project.

Installs the build tree into an empty prefix, checks the binaries and the
package files are there, builds tests/deploy/install_consumer (a separate CMake
project that only does find_package(normd CONFIG) and links normd::client)
against that prefix, starts the installed normd, and checks the consumer's
LayerNorm and Fit against fp64 worked numbers; the installed normctl asks
for health.

Usage: install_test.py --build BUILD_DIR
"""

import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def check_readme_snippets(failures):
    """The C++ snippets of docs/clients.md are lines of install_consumer."""
    with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs",
                           "clients.md")) as f:
        page = f.read()
    section = page[page.index("## C++"):page.index("## normctl")]
    for language, source in (("cmake", "CMakeLists.txt"), ("cpp", "main.cc")):
        with open(os.path.join(HERE, "install_consumer", source)) as f:
            lines = {line.strip() for line in f}
        block = re.search(rf"```{language}\n(.*?)```", section, re.S)
        if block is None:
            failures.append(f"docs/clients.md: no {language} block under ## C++")
            continue
        for line in block.group(1).splitlines():
            code = re.sub(r"\s*//.*$", "", line).strip()
            if code and code not in lines:
                failures.append(f"docs/clients.md {language} line not in "
                                f"install_consumer/{source}: {line!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    args = parser.parse_args()
    failures = []
    check_readme_snippets(failures)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        subprocess.run(["cmake", "--install", args.build, "--prefix", prefix],
                       check=True, stdout=subprocess.DEVNULL)
        for path in ("bin/normd", "bin/normctl", "lib/libnormd_client.a",
                     "include/normd/client/client.h",
                     "include/normd/normd/v1/normalizer.grpc.pb.h",
                     "lib/cmake/normd/normdConfig.cmake",
                     "lib/cmake/normd/normdConfigVersion.cmake"):
            if not os.path.exists(os.path.join(prefix, path)):
                failures.append(f"not installed: {path}")
        consumer = os.path.join(tmp, "consumer")
        subprocess.run(["cmake", "-S", os.path.join(HERE, "install_consumer"),
                        "-B", consumer, f"-DCMAKE_PREFIX_PATH={prefix}"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", consumer], check=True,
                       stdout=subprocess.DEVNULL)
        proc, port, _ = normd_process.start_normd(
            os.path.join(prefix, "bin", "normd"))
        try:
            out = subprocess.run(
                [os.path.join(consumer, "consumer"), f"127.0.0.1:{port}"],
                capture_output=True, text=True)
            lines = out.stdout.split("\n")
            if out.returncode != 0 or len(lines) < 4:
                failures.append(f"consumer: {out.returncode} {out.stdout!r} "
                                f"{out.stderr!r}")
            else:
                # [1,2,3]: mean 2, biased var 2/3.
                want = [(x - 2) / math.sqrt(2 / 3 + 1e-5) for x in (1, 2, 3)]
                got = [float(v) for v in lines[:3]]
                if max(abs(g - w) for g, w in zip(got, want)) > 1e-12:
                    failures.append(f"consumer LayerNorm {got} vs {want}")
                if lines[3] != "fit mean 2 batches 1":
                    failures.append(f"consumer Fit: {lines[3]!r}")
            health = subprocess.run(
                [os.path.join(prefix, "bin", "normctl"),
                 f"--server=127.0.0.1:{port}", "health"],
                capture_output=True, text=True)
            if health.returncode != 0 or "SERVING" not in health.stdout:
                failures.append(f"installed normctl health: {health.stdout!r}")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return normd_process.report(failures, "install + find_package(normd)")


if __name__ == "__main__":
    sys.exit(main())
