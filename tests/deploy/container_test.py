#!/usr/bin/python3
"""Builds the Dockerfile with podman and smoke-runs the image as its user.

There is no Docker engine and no registry on the CI machines (podman instead):
the debian:bookworm base is made once with debootstrap and imported, the image
is built with chroot isolation, and the smoke run chroots into a container's
root file system as the image's non-root user, with the image's entrypoint.
From the host it then checks health, a LayerNorm against numpy in fp64, two
Fits, /metrics, the image's own HEALTHCHECK command, and that the state in
the volume survives a SIGTERM and restart. Prints the image size.

Also a newcomer's first step: docs/clients.md's Python recipe, run as
written (apt-get included, as root, without sudo) in a fresh Debian 12
container that has no python3-wheel, from a copy of client/python and
proto.

Usage: container_test.py --normd BUILD/normd --stubs BUILD/python
         [--image localhost/normd:test] [--work DIR]
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

BASE_IMAGE = "docker.io/library/debian:bookworm"
SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STATE_DIR = "/var/lib/normd"


def run(command, **kwargs):
    """Runs command, failing on a non-zero exit; prints it and its wall time
    (CI's budget: the image build is most of this test)."""
    print("+", " ".join(command), flush=True)
    start = time.monotonic()
    result = subprocess.run(command, check=True, text=True, **kwargs)
    print(f"+ {' '.join(command[:2])}: {time.monotonic() - start:.0f} s",
          flush=True)
    return result


def output(command):
    return subprocess.run(command, check=True, text=True,
                          stdout=subprocess.PIPE).stdout.strip()


def ensure_base_image(work):
    """The local stand-in for Docker Hub's debian:bookworm (made once)."""
    if subprocess.run(["podman", "image", "exists", BASE_IMAGE]).returncode == 0:
        return
    rootfs = os.path.join(work, "rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    run(["debootstrap", "--variant=minbase", "bookworm", rootfs],
        stdout=subprocess.DEVNULL)
    # Like the official image: no package cache, no package lists.
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in os.scandir(os.path.join(rootfs, cache)):
            if entry.is_file():
                os.unlink(entry.path)
    tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."],
                           stdout=subprocess.PIPE)
    run(["podman", "import", "-", BASE_IMAGE], stdin=tar.stdout,
        stdout=subprocess.DEVNULL)
    if tar.wait() != 0:
        raise RuntimeError("tar of the debootstrap root failed")
    shutil.rmtree(rootfs)


def check_config(inspect, failures):
    """The image's metadata: user, ports, volume, healthcheck, entrypoint."""
    config = inspect["Config"]
    expect = {
        "User": "10001:10001",
        "ExposedPorts": {"50051/tcp": {}, "8000/tcp": {}, "9464/tcp": {}},
        "Volumes": {STATE_DIR: {}},
    }
    for key, value in expect.items():
        if config.get(key) != value:
            failures.append(f"config {key} = {config.get(key)!r}, want {value!r}")
    # Docker's layout has it in Config; podman's inspect also at the top.
    health = (config.get("Healthcheck") or inspect.get("Healthcheck") or
              {}).get("Test") or []
    if health[:1] != ["CMD"] or "health" not in health:
        failures.append(f"HEALTHCHECK is {health!r}, want normctl health")
    entrypoint = config.get("Entrypoint") or []
    if not entrypoint or not entrypoint[0].endswith("/normd"):
        failures.append(f"entrypoint is {entrypoint!r}")
    return entrypoint, health[1:]


def check_runtime_contents(root, failures):
    """Only runtime pieces: no compiler, no headers, binaries not writable."""
    for path in ("usr/bin/g++", "usr/bin/cmake", "usr/include/grpcpp",
                 "usr/include/google/protobuf", "src", "build"):
        if os.path.lexists(os.path.join(root, path)):
            failures.append(f"runtime image contains /{path}")
    for binary in ("normd", "normctl"):
        st = os.stat(os.path.join(root, "usr/local/bin", binary))
        if st.st_uid != 0 or st.st_mode & 0o022:
            failures.append(f"/usr/local/bin/{binary} is writable by others")
    st = os.stat(os.path.join(root, STATE_DIR.lstrip("/")))
    if st.st_uid != 10001:
        failures.append(f"{STATE_DIR} is owned by uid {st.st_uid}, not 10001")


def smoke(command, chroot, healthcheck, failures):
    """Traffic from the host against normd running in the image."""
    import grpc
    import numpy as np
    from normd.v1 import normalizer_pb2 as pb
    from normd.v1 import normalizer_pb2_grpc as pb_grpc

    proc, port, metrics_port = normd_process.start_normd(
        command, ["--state_dir=" + STATE_DIR])
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.NormalizerStub(channel)
        if not normd_process.is_serving(channel):
            failures.append("health is not SERVING")
        x = np.arange(12, dtype=np.float32).reshape(3, 4) ** 1.5
        reply = stub.Normalize(pb.NormalizeRequest(
            mode=pb.LAYER_NORM, input=pb.Tensor(
                dtype=pb.FLOAT32, shape=x.shape, data=x.tobytes())))
        got = np.frombuffer(reply.output.data, np.float32).reshape(x.shape)
        x64 = x.astype(np.float64)
        want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(
            x64.var(1, keepdims=True) + 1e-5)
        if np.abs(got - want).max() > 1e-5:
            failures.append(f"LayerNorm differs from fp64 by "
                            f"{np.abs(got - want).max()}")
        batches = [np.linspace(-1, 1, 8).reshape(4, 2) + i for i in range(2)]
        for b in batches:
            fit = stub.Fit(pb.FitRequest(model="smoke", input=pb.Tensor(
                dtype=pb.FLOAT64, shape=b.shape, data=b.tobytes())),
                metadata=[("x-normd-model", "smoke")])
        pooled = np.concatenate(batches).mean(0)
        if (fit.model.num_batches_tracked != 2 or
                np.abs(np.array(fit.model.mean) - pooled).max() > 1e-12):
            failures.append(f"Fit state {fit.model}")
        # The Open Inference Protocol's REST from the image (httplib and
        # simdjson are in its runtime libraries): readiness and an infer
        # whose bytes match the gRPC LayerNorm's.
        rest = f"http://127.0.0.1:{proc.http_port}"
        ready = urllib.request.urlopen(f"{rest}/v2/health/ready", timeout=5)
        body = json.dumps({"inputs": [{
            "name": "input", "datatype": "FP32", "shape": list(x.shape),
            "data": x.ravel().tolist()}]}).encode()
        answer = json.load(urllib.request.urlopen(urllib.request.Request(
            f"{rest}/v2/models/layer_norm/infer", data=body), timeout=10))
        if (ready.status != 200 or
                np.asarray(answer["outputs"][0]["data"], np.float32).tobytes()
                != reply.output.data):
            failures.append(f"REST: ready {ready.status}, infer {answer}")
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
        for name in ("grpc_server_handled_total", "normd_wal_syncs_total",
                     "normd_http_requests_total"):
            if name not in metrics:
                failures.append(f"/metrics lacks {name}")
        # The image's own HEALTHCHECK command, inside the image, as its user,
        # pointed at this server's port.
        probe = [a if not a.startswith("--server=") else
                 f"--server=127.0.0.1:{port}" for a in healthcheck]
        result = subprocess.run(chroot + probe, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if result.returncode != 0 or "SERVING" not in result.stdout:
            failures.append(f"HEALTHCHECK {probe}: {result.returncode} "
                            f"{result.stdout!r}")
        channel.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    if code != 0:
        failures.append(f"normd exited {code} on SIGTERM")

    # The volume's state survives a restart.
    proc, port, _ = normd_process.start_normd(
        command, ["--state_dir=" + STATE_DIR])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            state = pb_grpc.NormalizerStub(channel).GetModel(
                pb.GetModelRequest(name="smoke"))
            if state.num_batches_tracked != 2:
                failures.append(f"after restart: {state}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def python_recipe(failures):
    """docs/clients.md's Python install block, as written, in a fresh
    debian:bookworm container (buildah, chroot isolation) as root."""
    import re
    text = open(os.path.join(SOURCE_DIR, "docs", "clients.md")).read()
    section = text.split("\n## Python\n", 1)[1].split("\n## ")[0]
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    container = output(["buildah", "from", "--pull=never", BASE_IMAGE])
    try:
        run(["buildah", "copy", container,
             os.path.join(SOURCE_DIR, "client", "python"),
             "/src/client/python"], stdout=subprocess.DEVNULL)
        run(["buildah", "copy", container, os.path.join(SOURCE_DIR, "proto"),
             "/src/proto"], stdout=subprocess.DEVNULL)
        before = subprocess.run(
            ["buildah", "run", "--isolation=chroot", container, "--",
             "dpkg-query", "-W", "python3-wheel"], capture_output=True)
        if before.returncode == 0:
            failures.append("the fresh container already has python3-wheel")
        script = "set -e\ncd /src\n" + block
        start = time.monotonic()
        done = subprocess.run(
            ["buildah", "run", "--isolation=chroot", container, "--",
             "sh", "-c", script], capture_output=True, text=True,
            timeout=900)
        last = done.stdout.strip().splitlines()[-1:] or [""]
        print(f"python recipe in a fresh container: exit {done.returncode}, "
              f"{last[0]!r}, {time.monotonic() - start:.0f} s", flush=True)
        if done.returncode != 0 or last[0] != "normd client 1.0.0":
            failures.append(f"docs/clients.md's Python recipe in a fresh "
                            f"container: exit {done.returncode}: "
                            f"{done.stdout[-1500:]} {done.stderr[-1500:]}")
    finally:
        subprocess.run(["buildah", "rm", container], stdout=subprocess.DEVNULL)


def main():
    import argparse
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normd", required=True,
                        help="unused; accepted like the other Python tests")
    parser.add_argument("--stubs", required=True)
    parser.add_argument("--image", default="localhost/normd:test")
    parser.add_argument("--work", default=tempfile.gettempdir())
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)

    failures = []
    ensure_base_image(args.work)
    run(["podman", "build", "--isolation=chroot", "--format=docker",
         "-t", args.image, SOURCE_DIR])
    inspect = json.loads(output(["podman", "image", "inspect", args.image]))[0]
    size_mb = inspect["Size"] / 1e6
    print(f"image {args.image}: {size_mb:.0f} MB", flush=True)
    entrypoint, healthcheck = check_config(inspect, failures)

    container = output(["podman", "create", "--no-healthcheck", args.image])
    try:
        root = output(["podman", "mount", container])
        check_runtime_contents(root, failures)
        chroot = ["chroot", "--userspec=10001:10001", root]
        smoke(chroot + entrypoint, chroot, healthcheck, failures)
    finally:
        subprocess.run(["podman", "umount", container], stdout=subprocess.DEVNULL)
        subprocess.run(["podman", "rm", container], stdout=subprocess.DEVNULL)
    python_recipe(failures)
    return normd_process.report(
        failures, f"container: image {size_mb:.0f} MB, smoke run done")


if __name__ == "__main__":
    sys.exit(main())
