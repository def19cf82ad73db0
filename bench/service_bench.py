#!/usr/bin/python3
"""Service benchmark of `make bench`: normd against the raw gRPC echo baseline
(bench/echo_server, normd's transport settings) and the Python peer
(bench/peers/torch_server.py), all driven by the same load generator
(bench/loadgen) over loopback in one run. Runs are interleaved (echo, normd,
peer, echo, ...) and the median of --reps is reported with every run, so
slow phases of a noisy machine hit every server alike; report.py takes each
ratio as the median of the repetitions' own ratios.

Usage: service_bench.py --build BUILD_DIR [--reps 3] [--duration 2]
Writes JSON to stdout: {"cases": {...}, "memory": {...}}.
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

# name -> (loadgen args, servers, metric). Shapes are fp32: 4 MiB is
# [16,128,512] for LayerNorm and [16,64,32,32] (NCHW) for BatchNorm. "oip"
# is normd again, called through the Open Inference Protocol's ModelInfer
# (raw contents) instead of Normalize; "rest_json" and "rest_binary" the
# same LayerNorm over the protocol's REST form on normd's --http_port (JSON
# numbers, or Triton's binary data both ways; a connection per call in
# flight); "normd_drift" normd's BatchNorm eval of a model with a drift
# reference (every request observed) instead of one without.
CASES = {
    "ln_768_unary_16": (["--shape=1,768", "--inflight=16"],
                        ["echo", "normd", "oip", "rest_json", "peer"], "qps"),
    "ln_4mib_unary_4": (["--shape=16,128,512", "--inflight=4"],
                        ["echo", "normd", "oip", "rest_binary", "peer"],
                        "mb_per_s"),
    "bn_eval_4mib_unary_4": (["--shape=16,64,32,32", "--mode=batch_norm",
                              "--inflight=4"],
                             ["echo", "normd", "normd_drift", "peer"],
                             "mb_per_s"),
    "ln_768_stream_16": (["--shape=1,768", "--inflight=16", "--rpc=stream"],
                         ["echo", "normd"], "qps"),
}


def start(argv, pattern):
    """Starts a server, returns (process, port) once it logs its port."""
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(pattern, line)
        if m:
            proc.serving_line = line
            # Keep draining its log so that it can never block on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(m.group(1))
    proc.kill()
    sys.exit(f"service_bench: {argv[0]} did not start")


def rss_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def loadgen(build, port, args, duration, create_model):
    argv = [f"{build}/bench/loadgen", f"--target=127.0.0.1:{port}",
            f"--duration={duration}", "--warmup=0.5"] + args
    if create_model:
        argv.append("--create_model")
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"service_bench: {' '.join(argv)} failed: {out.stderr}")
    return json.loads(out.stdout)


def check_peer_agrees(stubs, normd_port, peer_port):
    """The peer must compute what normd computes, or the race is moot."""
    sys.path.insert(0, stubs)
    import grpc
    from normd.v1 import normalizer_pb2 as pb
    from normd.v1 import normalizer_pb2_grpc as pb_grpc
    x = np.random.default_rng(1).normal(3, 2, (4, 768)).astype(np.float32)
    request = pb.NormalizeRequest(
        mode=pb.LAYER_NORM,
        input=pb.Tensor(dtype=pb.FLOAT32, shape=x.shape, data=x.tobytes()))
    outputs = []
    for port in (normd_port, peer_port):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = pb_grpc.NormalizerStub(channel).Normalize(request)
            outputs.append(np.frombuffer(reply.output.data, np.float32))
    if not np.allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5):
        sys.exit("service_bench: the Python peer disagrees with normd")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", required=True)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--server_flag", action="append", default=[],
                        help="extra flag for normd and the echo server "
                        "(repeatable), e.g. --server_flag=--malloc_arenas=0")
    args = parser.parse_args()
    build = os.path.abspath(args.build)
    bench_dir = os.path.dirname(os.path.abspath(__file__))

    servers = {}
    servers["echo"] = start([f"{build}/bench/echo_server", "--port=0"] +
                            args.server_flag,
                            r"serving gRPC on [^ ]*:(\d+)")
    servers["normd"] = start(
        [f"{build}/normd", "--bind_address=127.0.0.1", "--port=0",
         "--metrics_port=0", "--http_port=0"] + args.server_flag,
        r"serving gRPC on [^ ]*:(\d+)")
    http_port = re.search(r"REST on [^ ]*:(\d+)",
                          servers["normd"][0].serving_line).group(1)
    servers["peer"] = start(
        ["/usr/bin/python3", f"{bench_dir}/peers/torch_server.py",
         f"--stubs={build}/python", "--port=0"],
        r"serving gRPC on [^ ]*:(\d+)")
    try:
        check_peer_agrees(f"{build}/python", servers["normd"][1],
                          servers["peer"][1])
        idle_rss = {name: rss_kib(p.pid, "VmRSS")
                    for name, (p, _) in servers.items()}
        results = {}
        for case, (case_args, names, metric) in CASES.items():
            runs = {name: [] for name in names}
            for rep in range(args.reps):
                for name in names:
                    bn = "--mode=batch_norm" in case_args
                    via_normd = name in ("oip", "rest_json", "rest_binary")
                    extra = ([f"--rpc={name}",
                              f"--http_target=127.0.0.1:{http_port}"]
                             if via_normd else [])
                    if name == "normd_drift":
                        extra = ["--model=bench_drift", "--set_reference"]
                    r = loadgen(build,
                                servers["normd" if via_normd or
                                        name == "normd_drift" else name][1],
                                case_args + extra,
                                args.duration, bn and name != "echo" and
                                rep == 0)
                    runs[name].append(r)
            results[case] = {
                "metric": metric,
                **{name: {
                    "median": statistics.median(r[metric] for r in rs),
                    "p50_us": statistics.median(r["p50_us"] for r in rs),
                    "p99_us": statistics.median(r["p99_us"] for r in rs),
                    "runs": [r[metric] for r in rs]}
                   for name, rs in runs.items()}}
        # Peak RSS growth over idle, per MB that was in flight at most
        # (4 calls x 4 MiB requests, plus their 4 MiB responses).
        in_flight_mb = 4 * 2 * 4 * 1.048576
        memory = {name: {
            "idle_rss_mb": idle_rss[name] / 1024,
            "peak_rss_mb": rss_kib(p.pid, "VmHWM") / 1024,
            "growth_per_mb_in_flight":
                (rss_kib(p.pid, "VmHWM") - idle_rss[name]) / 1024 /
                in_flight_mb}
            for name, (p, _) in servers.items()}
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    json.dump({"cases": results, "memory": memory}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
