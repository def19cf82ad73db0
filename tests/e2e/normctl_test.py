#!/usr/bin/python3
"""normctl for real data, against a real normd, checked with numpy in fp64.

.npy in and out (float32 and float64 kept), `fit --input` streaming a file in
chunks over FitStream (progress bar; pooled statistics of the whole file
exact; one Fit step per chunk), `list` as an aligned table, `--json` on every
subcommand, `--help` on every subcommand, the exit codes (0 ok, 1 server
error, 2 usage, 3 unreachable), and clear refusals of .npy files normd cannot
take.

Usage: normctl_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl
"""

import argparse
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402
from tolerances import FP64_BAR, fp32_output_bound, worst_excess  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--normd", required=True)
parser.add_argument("--stubs", required=True)
parser.add_argument("--normctl", required=True)
args = parser.parse_args()

COMMANDS = ["normalize", "fit", "create", "get", "list", "delete", "reset",
            "export", "import", "merge", "health", "import-checkpoint",
            "export-checkpoint"]
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


class Normctl:
    def __init__(self, target):
        self.target = target

    def __call__(self, *argv, server=None):
        return subprocess.run(
            [args.normctl, f"--server={server or self.target}", *argv],
            capture_output=True, text=True, timeout=120)


def layer_norm(x, eps=1e-5):
    x = x.astype(np.float64)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(
        x.var(-1, keepdims=True) + eps)


def test_npy(ctl, tmp):
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal((5, 7)) * 3 + 100).astype(dtype)
        src, dst = os.path.join(tmp, "x.npy"), os.path.join(tmp, "y.npy")
        np.save(src, x)
        run = ctl("normalize", f"--input={src}", f"--output={dst}")
        check(run.returncode == 0, f"normalize .npy: {run.stderr}")
        y = np.load(dst)
        check(y.dtype == dtype and y.shape == x.shape,
              f"output .npy is {y.dtype} {y.shape}")
        want = layer_norm(x)
        bound = (fp32_output_bound(want) if dtype == np.float32 else
                 FP64_BAR * np.maximum(1, np.abs(want)))
        err = worst_excess(y, want, bound)
        check(err <= 1, f"{np.dtype(dtype).name} .npy LayerNorm error "
              f"{err:.3g} times its bound")
    # BatchNorm training on a 3-D .npy, channels at axis 1.
    x = rng.standard_normal((4, 3, 5))
    np.save(src, x)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=batch_norm", "--model=npy-bn", "--training")
    y = np.load(dst)
    mean, var = x.mean((0, 2), keepdims=True), x.var((0, 2), keepdims=True)
    check(run.returncode == 0 and
          np.abs(y - (x - mean) / np.sqrt(var + 1e-5)).max() < FP64_BAR,
          f"batch_norm training .npy: {run.stderr}")


def test_norm_family(ctl, tmp):
    """GroupNorm / InstanceNorm / RMSNorm / L2 / WeightNorm / BERT style
    from .npy, float16
    .npy in and out, and --values with --dtype=bfloat16 (printed back)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 4, 5)) * 2 + 7
    src, dst = os.path.join(tmp, "g.npy"), os.path.join(tmp, "h.npy")
    np.save(src, x)
    g = x.reshape(2, 3, -1)
    want = ((g - g.mean(-1, keepdims=True)) /
            np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=group_norm", "--num_groups=3")
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"group_norm .npy: {run.stderr}")
    i = x.reshape(2, 6, -1)
    want = ((i - i.mean(-1, keepdims=True)) /
            np.sqrt(i.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=instance_norm")
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"instance_norm .npy: {run.stderr}")
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=rms_norm")
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"rms_norm .npy: {run.stderr}")
    want = x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), 1e-12)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=l2_norm")
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"l2_norm .npy: {run.stderr}")
    # weight_norm at dim 1 with g: the norms over every other dim.
    g = np.arange(1.0, 1.0 + x.shape[1])
    norms = np.sqrt((x * x).sum(axis=tuple(d for d in range(x.ndim) if d != 1),
                                keepdims=True))
    want = x / norms * g.reshape([-1 if d == 1 else 1 for d in range(x.ndim)])
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=weight_norm", "--channel_axis=1",
              "--weight=" + ",".join(str(v) for v in g))
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"weight_norm .npy: {run.stderr}")
    want = (x - x.mean(-1, keepdims=True)) / (x.std(-1, ddof=1, keepdims=True)
                                               + 1e-6)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--layer_norm_style=bert")
    check(run.returncode == 0 and np.abs(np.load(dst) - want).max() < FP64_BAR,
          f"layer_norm bert .npy: {run.stderr}")
    # float16 .npy keeps its dtype; error within one float16 rounding.
    half = x.astype(np.float16)
    np.save(src, half)
    run = ctl("normalize", f"--input={src}", f"--output={dst}",
              "--mode=rms_norm")
    y = np.load(dst)
    h = half.astype(np.float64)
    want = h / np.sqrt((h * h).mean(-1, keepdims=True) + 1e-5)
    check(run.returncode == 0 and y.dtype == np.float16 and
          # float16's rounding, after the fp32 kernels' own error.
          np.all(np.abs(y - want) <=
                 2.0 ** -11 * np.abs(want) + fp32_output_bound(want)),
          f"rms_norm float16 .npy: {run.stderr}")
    # bfloat16 from --values: 1 and 3 are exact, LayerNorm gives -1 and 1.
    run = ctl("normalize", "--shape=1,2", "--values=1,3", "--dtype=bfloat16",
              "--json")
    out = json.loads(run.stdout) if run.returncode == 0 else {}
    check(out.get("output", {}).get("dtype") == "BFLOAT16",
          f"bfloat16 --values: {run.stdout} {run.stderr}")
    run = ctl("normalize", "--shape=1,2", "--values=1,3", "--dtype=bfloat16")
    check(run.returncode == 0 and "-1" in run.stdout and "1" in run.stdout,
          f"bfloat16 printed: {run.stdout} {run.stderr}")
    run = ctl("normalize", "--shape=1,4", "--values=1,2,3,4",
              "--mode=group_norm", "--num_groups=3")
    check(run.returncode == 1 and "num_groups" in run.stderr,
          f"bad num_groups: exit {run.returncode} {run.stderr}")
    run = ctl("normalize", "--shape=1,4", "--values=1,2,3,4", "--mode=nope")
    check(run.returncode == 2 and "--mode" in run.stderr,
          f"bad --mode: exit {run.returncode} {run.stderr}")


def test_streaming_fit(ctl, tmp):
    rng = np.random.default_rng(1)
    big = rng.standard_normal((20000, 6)) * np.arange(1, 7) + 1e3
    path = os.path.join(tmp, "big.npy")
    np.save(path, big)
    chunk_bytes = 64 * 1024  # 1365 rows of 48 bytes per step.
    rows_per_step = chunk_bytes // (6 * 8)
    steps = -(-len(big) // rows_per_step)
    run = ctl("fit", "--model=stream", f"--input={path}",
              f"--chunk_bytes={chunk_bytes}", "--progress=always", "--json")
    check(run.returncode == 0, f"fit --input: {run.stderr}")
    state = json.loads(run.stdout)["model"]
    check(state["num_batches_tracked"] == steps and
          state["sample_count"] == len(big),
          f"fit --input counts {state['num_batches_tracked']} "
          f"{state['sample_count']}, want {steps} steps of {len(big)} rows")
    check(np.allclose(state["mean"], big.mean(0), rtol=FP64_BAR, atol=0) and
          np.allclose(state["var"], big.var(0), rtol=FP64_BAR, atol=0),
          "streamed pooled statistics differ from fp64 over the whole file")
    check("100%" in run.stderr and f"{steps} steps" in run.stderr,
          f"no finished progress bar on stderr: {run.stderr[-300:]!r}")
    quiet = ctl("fit", "--model=stream2", f"--input={path}",
                "--progress=never")
    check(quiet.returncode == 0 and quiet.stderr == "" and
          f"{len(big)} rows in" in quiet.stdout,
          f"fit --progress=never: {quiet.stdout!r} {quiet.stderr!r}")


def test_list_table(ctl):
    ctl("create", "--model=a-much-longer-model-name", "--num_features=12")
    run = ctl("list")
    lines = run.stdout.rstrip("\n").split("\n")
    check(run.returncode == 0 and lines[0].split()[:3] == ["NAME", "C",
                                                            "BATCHES"],
          f"list header: {lines[:1]}")
    # Right-aligned numeric columns end at the same offset on every line.
    ends = {line.index(line.split()[1]) + len(line.split()[1])
            for line in lines}
    check(len(ends) == 1, f"list's C column is not aligned:\n{run.stdout}")
    check(any(l.startswith("a-much-longer-model-name ") for l in lines),
          "list lacks the long name")


def test_json_everywhere(ctl, tmp):
    x = os.path.join(tmp, "j.npy")
    np.save(x, np.ones((2, 3), np.float32))
    # A safetensors file of one BatchNorm layer, written by hand.
    header = json.dumps({
        "bn.running_mean": {"dtype": "F32", "shape": [2],
                            "data_offsets": [0, 8]},
        "bn.running_var": {"dtype": "F32", "shape": [2],
                           "data_offsets": [8, 16]}}).encode()
    checkpoint = os.path.join(tmp, "j.safetensors")
    with open(checkpoint, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header +
                np.array([0.5, 1, 2, 3], "<f4").tobytes())
    runs = {
        "normalize": ctl("normalize", f"--input={x}", "--json"),
        "fit": ctl("fit", "--model=j", "--shape=2,2", "--values=1,2,3,4",
                   "--json"),
        "create": ctl("create", "--model=j2", "--num_features=2", "--json"),
        "get": ctl("get", "--model=j", "--json"),
        "list": ctl("list", "--json"),
        "reset": ctl("reset", "--model=j", "--json"),
        "export": ctl("export", "--model=j", "--json"),
        "import": ctl("import", f"--from={ctl.target}", "--from_model=j",
                      "--model=j3", "--json"),
        "merge": ctl("merge", f"--from={ctl.target}", "--from_model=j",
                     "--model=j3", "--json"),
        "delete": ctl("delete", "--model=j", "--json"),
        "health": ctl("health", "--json"),
        "import-checkpoint": ctl("import-checkpoint", f"--input={checkpoint}",
                                 "--prefix=jck", "--json"),
        "export-checkpoint": ctl("export-checkpoint", "--prefix=jck",
                                 f"--output={tmp}/out.safetensors", "--json"),
    }
    check(sorted(runs) == sorted(COMMANDS), "a command lacks a --json case")
    for command, run in runs.items():
        try:
            json.loads(run.stdout)
            check(run.returncode == 0, f"{command} --json: {run.stderr}")
        except ValueError:
            failures.append(f"{command} --json is not JSON: {run.stdout!r}")
    err = ctl("get", "--model=j", "--json")  # Deleted above.
    try:
        check(json.loads(err.stderr)["code"] == "NOT_FOUND",
              f"--json error: {err.stderr}")
    except ValueError:
        failures.append(f"--json error is not JSON: {err.stderr!r}")


def test_help_everywhere(ctl):
    for command in COMMANDS:
        run = ctl(command, "--help")
        check(run.returncode == 0 and
              run.stdout.startswith(f"Usage: normctl {command}") and
              "--json" in run.stdout and "Exit status" in run.stdout,
              f"{command} --help: {run.returncode} {run.stdout[:200]!r}")
    fit = ctl("fit", "--help").stdout
    for flag in ("--input", "--chunk_bytes", "--progress", "--model"):
        check(flag in fit, f"fit --help lacks {flag}")
    check("--num_features" not in fit, "fit --help lists create's flags")
    # normctl's own --help, -h and help: the commands, not Abseil's dump of
    # every flag.
    for flag in ("--help", "-h", "help"):
        run = ctl(flag)
        check(run.returncode == 0 and
              all(f"  {c} " in run.stdout for c in COMMANDS) and
              "Exit status" in run.stdout and "--helpfull" not in run.stdout
              and "Flags from" not in run.stdout,
              f"normctl {flag}: {run.returncode} {run.stdout[-300:]!r}")
    # The server's own --help: every mode and 16-bit dtype, and its one
    # environment variable.
    server_help = subprocess.run([args.normd, "--help"], capture_output=True,
                                 text=True, timeout=60).stdout
    for word in ("LayerNorm", "RMSNorm", "BatchNorm", "GroupNorm",
                 "InstanceNorm", "bfloat16", "float16", "NORMD_SIMD_TARGET"):
        check(word in server_help, f"normd --help lacks {word}")
    # The start-up line ends with the SIMD target; NORMD_SIMD_TARGET picks the target (sse4 and scalar run on every
    # x86-64 CPU), and a target this build or CPU cannot run stops normd
    # with a message naming the variable.
    def start_line(simd_target):
        env = dict(os.environ)
        env.pop("NORMD_SIMD_TARGET", None)
        if simd_target is not None:
            env["NORMD_SIMD_TARGET"] = simd_target
        server = normd_process.Normd(
            args.normd, ["--metrics_port=-1", "--http_port=-1"], env=env)
        serving = server.start()
        code = server.stop() if serving else server.proc.wait()
        # Serving: its exit code is not ours to judge.
        return (server.lines[0] if server.lines else ""), (
            None if serving else code)

    first, _ = start_line(None)
    best = re.search(r"serving gRPC on .*; SIMD target (avx3|avx2|sse4|neon|"
                     r"sve|scalar)$", first.rstrip())
    check(best, f"start line without the target: {first!r}")
    # The best target picked by name, and the fallback every build has (the
    # sanitizer builds leave some targets out: NORMD_SIMD_SKIP).
    for target in ((best.group(1) if best else "scalar"), "scalar"):
        line, _ = start_line(target)
        check(line.rstrip().endswith(f"; SIMD target {target}"),
              f"NORMD_SIMD_TARGET={target}: {line!r}")
    for bad, why in (("avx9", "unknown SIMD target"),
                     ("neon", "not compiled into this build")):
        line, code = start_line(bad)
        check(code == 1 and f"NORMD_SIMD_TARGET={bad}: {why}" in line,
              f"NORMD_SIMD_TARGET={bad}: exit {code}, {line!r}")


def test_exit_codes(ctl, tmp):
    with socket.socket() as s:  # A port nobody listens on.
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    cases = [
        ("usage: unknown command", ctl("frobnicate"), 2),
        ("usage: no input", ctl("normalize"), 2),
        ("usage: bad --progress", ctl("fit", "--model=m", "--input=x.npy",
                                      "--progress=sometimes"), 2),
        ("usage: two inputs", ctl("normalize", "--input=a.npy",
                                  "--values=1", "--shape=1"), 2),
        ("server: unknown model", ctl("get", "--model=nobody"), 1),
        ("server: invalid request", ctl("normalize", "--shape=2",
                                        "--values=1,2",
                                        "--normalized_ndim=4"), 1),
        ("unreachable", ctl("list", "--connect_timeout=1s", server=closed), 3),
        ("usage: --values vs --shape", ctl("normalize", "--shape=2,3",
                                            "--values=1,2,3,4,5"), 2),
        ("usage: --max_message_bytes", ctl("list", "--max_message_bytes=0"),
         2),
    ]
    for what, run, code in cases:
        check(run.returncode == code,
              f"{what}: exit {run.returncode}, want {code} ({run.stderr!r})")
    check("cannot reach" in cases[6][1].stderr, "unreachable message")
    check("INVALID_ARGUMENT" in cases[5][1].stderr and
          "normalized_ndim" in cases[5][1].stderr, "server error message")
    check("--values: 5 values, but --shape=2,3 has 6 elements" in
          cases[7][1].stderr, f"count message: {cases[7][1].stderr!r}")
    check("--max_message_bytes" in cases[8][1].stderr,
          f"--max_message_bytes message: {cases[8][1].stderr!r}")


def closed_port():
    """An address nobody listens on: connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_usage_before_network(ctl):
    """Usage errors exit 2 naming the flag, before any network: against an
    address where a connection is refused (which would exit 3), and fast."""
    closed = closed_port()
    cases = [
        (("--modle=m", "get"), "--modle: unknown flag (did you mean --model?)"),
        (("get", "--modle=m"), "did you mean --model?"),
        (("get",), "--model: required by get"),
        (("delete",), "--model: required by delete"),
        (("export-checkpoint", "--prefix=p"), "--output: required"),
        (("import-checkpoint", "--input=x.safetensors"), "--prefix: required"),
        (("create", "--model=m"), "--num_features: required"),
        (("fit", "--model=m"), "fit: give one of --input, --input_file, "
                               "--values"),
        (("merge", "--model=m", "--state_file=a", "--from=b"),
         "give only one of --state_file, --from"),
        (("normalize", "--shape=2", "--values=1,2", "--prefix=p"),
         "--prefix: not a flag of normalize"),
        (("list", "--timeout=soon"), "--timeout: bad value 'soon'"),
        (("list", "--json=maybe"), "--json: bad value 'maybe'"),
        (("list", "--nomodel"), "--nomodel: unknown flag"),
        (("list", "--group"), "--group: needs a value"),
        (("get", "list", "--model=m"), "one command at a time"),
        (("frobnicate",), "unknown command 'frobnicate'"),
    ]
    for argv, message in cases:
        start = time.monotonic()
        run = ctl(*argv, server=closed)
        took = time.monotonic() - start
        check(run.returncode == 2 and message in run.stderr and took < 5,
              f"usage {argv}: exit {run.returncode} in {took:.1f}s, "
              f"{run.stderr!r} lacks {message!r}")
    run = ctl("list", "--json", "--modle=m", server=closed)
    try:
        check(run.returncode == 2 and "--modle" in
              json.loads(run.stderr)["message"], f"--json usage: {run.stderr}")
    except ValueError:
        failures.append(f"--json usage error is not JSON: {run.stderr!r}")


def test_refused_connection_is_quick(ctl):
    """A refused connection exits 3 at once, not after --connect_timeout."""
    closed = closed_port()
    for argv in (("list",), ("get", "--model=m"),
                 ("list", "--connect_timeout=30s")):
        start = time.monotonic()
        run = ctl(*argv, server=closed)
        took = time.monotonic() - start
        check(run.returncode == 3 and took < 1.5 and
              f"cannot reach {closed}" in run.stderr,
              f"refused {argv}: exit {run.returncode} after {took:.2f}s "
              f"{run.stderr!r}")


def test_local_file_errors(ctl, tmp):
    """A file normctl cannot write or read is named, exit 2, no gRPC code."""
    missing_dir = os.path.join(tmp, "no-such-dir")
    cases = [
        (("normalize", "--shape=1,2", "--values=1,3",
          f"--output={missing_dir}/y.npy"), f"{missing_dir}/y.npy"),
        (("normalize", "--shape=1,2", "--values=1,3",
          f"--output_file={missing_dir}/y.bin"), f"{missing_dir}/y.bin"),
        (("export-checkpoint", "--prefix=jck",
          f"--output={missing_dir}/c.safetensors"), missing_dir),
        (("normalize", f"--input={missing_dir}/x.npy"), f"{missing_dir}/x.npy"),
        (("import", f"--state_file={missing_dir}/s.json"),
         f"{missing_dir}/s.json"),
    ]
    ctl("fit", "--model=jck.bn", "--shape=2,2", "--values=1,2,3,4")
    ctl("create", "--model=localio", "--num_features=2")
    cases.append((("export", "--model=localio",
                   f"--state_file={missing_dir}/m.json"),
                  f"{missing_dir}/m.json"))
    codes = ("UNAVAILABLE", "NOT_FOUND", "INVALID_ARGUMENT", "UNKNOWN",
             "INTERNAL")
    for argv, path in cases:
        run = ctl(*argv)
        check(run.returncode == 2 and path in run.stderr and
              not any(code in run.stderr for code in codes),
              f"local error {argv}: exit {run.returncode} {run.stderr!r}")
    ctl("delete", "--model=jck.bn")
    ctl("delete", "--model=localio")


def test_json_numbers(ctl, tmp):
    """--json: shapes and counts are numbers, a printed tensor's data the
    element values (fp64 LayerNorm reference), and no data when the tensor
    went to --output."""
    x = np.array([[1, 2, 4], [-3, 0, 9]], np.float32)
    run = ctl("normalize", "--shape=2,3",
              "--values=" + ",".join(str(v) for v in x.ravel()), "--json")
    out = json.loads(run.stdout)["output"]
    check(out["shape"] == [2, 3], f"--json shape: {out.get('shape')!r}")
    data = np.array(out["data"], np.float64)
    want = layer_norm(x).ravel()
    check(data.shape == (6,) and
          worst_excess(data, want, fp32_output_bound(want)) <= 1,
        f"--json data {out.get('data')!r} vs fp64 {layer_norm(x).ravel()}")
    half = np.array([[1, 3]], np.float16)
    src = os.path.join(tmp, "half.npy")
    np.save(src, half)
    out = json.loads(ctl("normalize", f"--input={src}", "--json").stdout)
    want = layer_norm(half).astype(np.float16).ravel().tolist()
    check(out["output"]["dtype"] == "FLOAT16" and
          out["output"]["data"] == want,
          f"--json float16 data: {out}")
    dst = os.path.join(tmp, "y.npy")
    out = json.loads(ctl("normalize", f"--input={src}", f"--output={dst}",
                         "--json").stdout)
    check(out["output"]["shape"] == [1, 2] and "data" not in out["output"],
          f"--json with --output: {out}")
    fit = json.loads(ctl("fit", "--model=jnum", "--shape=2,2",
                         "--values=1,2,3,5", "--json").stdout)["model"]
    check(fit["num_batches_tracked"] == 1 and fit["sample_count"] == 2 and
          fit["num_features"] == 2 and fit["mean"] == [2, 3.5],
          f"--json fit counts: {fit}")
    listed = json.loads(ctl("list", "--json").stdout)["models"]
    check(any(m["name"] == "jnum" and m["generation"] >= 1 for m in listed),
          f"--json list: {listed}")
    ctl("delete", "--model=jnum")


def test_help_is_per_command(ctl):
    """Each command's --help lists its own flags only, each described as
    that command reads it (no other command named in its flags)."""
    common = {"server", "timeout", "connect_timeout", "max_message_bytes",
              "json", "tls_ca", "tls_cert", "tls_key", "token_file"}
    own = {
        "get": {"model"}, "delete": {"model"}, "reset": {"model"},
        "list": {"group"}, "health": {"service"},
        "export": {"model", "state_file"},
        "export-checkpoint": {"prefix", "output"},
        "import-checkpoint": {"input", "prefix", "momentum",
                              "cumulative_average", "eps",
                              "max_header_bytes"},
    }
    for command in COMMANDS:
        text = ctl(command, "--help").stdout
        flags_part = text.split("\nFlags:\n", 1)[-1].split(
            "\nCommon flags:\n")[0] if "\nFlags:\n" in text else ""
        listed = set(re.findall(r"^  --(\w+) \(default", text, re.M))
        if command in own:
            check(listed == own[command] | common,
                  f"{command} --help lists {sorted(listed - common)}")
        for other in COMMANDS:
            if other != command and re.search(
                    rf"(?<![\w-]){re.escape(other)}(?![\w-])", flags_part):
                failures.append(f"{command} --help's flags name {other}")
    normalize = ctl("normalize", "--help").stdout
    check("safetensors" not in normalize and "--prefix" not in normalize,
          "normalize --help describes import-checkpoint's flags")


def test_large_message(tmp):
    """A tensor over the 64 MiB default goes through with --max_message_bytes
    raised on both sides, and is refused naming the limit without it."""
    limit = 100_000_000
    proc, port, _ = normd_process.start_normd(
        args.normd, [f"--max_message_bytes={limit}"])
    try:
        ctl = Normctl(f"127.0.0.1:{port}")
        rng = np.random.default_rng(5)
        x = (rng.standard_normal((17, 1 << 20)) * 2 + 3).astype(np.float32)
        src, dst = os.path.join(tmp, "big.npy"), os.path.join(tmp, "big_y.npy")
        np.save(src, x)  # 68 MiB of float32.
        run = ctl("normalize", f"--input={src}", f"--output={dst}",
                  f"--max_message_bytes={limit}")
        check(run.returncode == 0, f"68 MiB normalize: {run.stderr}")
        if run.returncode == 0:
            want = layer_norm(x[::4])
            err = worst_excess(np.load(dst)[::4], want, fp32_output_bound(want))
            check(err <= 1, f"68 MiB LayerNorm error {err:.3g} times its bound")
        run = ctl("normalize", f"--input={src}", f"--output={dst}")
        check(run.returncode == 1 and "RESOURCE_EXHAUSTED" in run.stderr,
              f"68 MiB without --max_message_bytes: {run.returncode} "
              f"{run.stderr!r}")
        os.remove(src)
        os.remove(dst)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_bad_npy(ctl, tmp):
    cases = {
        "fortran": (np.asfortranarray(np.ones((3, 4))), "Fortran"),
        "bigendian": (np.ones((3, 4), dtype=">f4"), ">f4"),
        "int": (np.ones((3, 4), dtype=np.int32), "<i4"),
    }
    for name, (array, message) in cases.items():
        path = os.path.join(tmp, name + ".npy")
        np.save(path, array)
        for command in (["normalize"], ["fit", "--model=bad"]):
            run = ctl(*command, f"--input={path}")
            check(run.returncode == 2 and message in run.stderr and
                  path in run.stderr,
                  f"{command[0]} {name}.npy: {run.returncode} {run.stderr!r}")
    truncated = os.path.join(tmp, "truncated.npy")
    np.save(truncated, np.ones((10, 4)))
    with open(truncated, "r+b") as f:
        f.truncate(os.path.getsize(truncated) - 8)
    run = ctl("fit", "--model=bad", f"--input={truncated}")
    check(run.returncode == 2 and "bytes" in run.stderr,
          f"truncated .npy: {run.stderr!r}")
    # An empty array whose other dimensions multiply past int64 (found by
    # the fuzzer: the row size overflowed): refused as too large.
    empty = os.path.join(tmp, "empty_overflow.npy")
    header = (b"{'descr': '<f4', 'fortran_order': False, "
              b"'shape': (0, 4007000000000, 2000002000), }")
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    with open(empty, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") +
                header)
    for command in (["normalize"], ["fit", "--model=bad"]):
        run = ctl(*command, f"--input={empty}")
        check(run.returncode == 2 and "too large" in run.stderr and
              empty in run.stderr,
              f"{command[0]} empty_overflow.npy: {run.returncode} "
              f"{run.stderr!r}")
    # A header length of 4 GiB in a 70-byte file: refused as truncated
    # without allocating what the header claims (the run's own peak RSS).
    huge = os.path.join(tmp, "huge_header.npy")
    with open(huge, "wb") as f:
        f.write(b"\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr': '<f4', "
                b"'fortran_order': False, 'shape': (2,), }\n")
    for command in (["normalize"], ["fit", "--model=bad"]):
        with tempfile.TemporaryFile(mode="w+") as err:
            proc = subprocess.Popen(
                [args.normctl, f"--server={ctl.target}", *command,
                 f"--input={huge}"], stdout=subprocess.DEVNULL, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            err.seek(0)
            stderr = err.read()
        check(proc.returncode == 2 and "truncated header" in stderr and
              usage.ru_maxrss < 1024 * 1024,
              f"{command[0]} with a 4 GiB header length: exit "
              f"{proc.returncode}, peak RSS {usage.ru_maxrss} KiB, {stderr!r}")


def test_readme_commands(ctl, tmp):
    """The README's .npy commands, run as written (with --server added) in a
    directory holding the files they name."""
    readme_path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "README.md")
    with open(readme_path) as f:
        readme = f.read()
    section = readme[readme.index("Real data comes in"):]
    block = section[section.index("```sh\n") + 6:section.index("```\n", 6)]
    work = os.path.join(tmp, "readme")
    os.makedirs(work)
    rng = np.random.default_rng(2)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((3, 5)))
    np.save(os.path.join(work, "activations.npy"),
            rng.standard_normal((1000, 2)).astype(np.float32))
    commands = [shlex.split(line.split("#")[0]) for line in block.splitlines()
                if line.startswith("normctl ")]
    check(len(commands) == 2, f"README .npy block: {block!r}")
    for argv in commands:
        run = subprocess.run([os.path.abspath(args.normctl),
                              f"--server={ctl.target}",
                              *argv[1:]], capture_output=True, text=True,
                             cwd=work, timeout=120)
        check(run.returncode == 0, f"README: {' '.join(argv)}: {run.stderr}")
    y = np.load(os.path.join(work, "y.npy"))
    check(y.dtype == np.float64 and y.shape == (3, 5),
          f"README's y.npy is {y.dtype} {y.shape}")
    # docs/clients.md's commands for the other modes, on an NCHW x.npy.
    with open(os.path.join(os.path.dirname(readme_path), "docs",
                           "clients.md")) as f:
        page = f.read()
    section = page[page.index("## normctl"):]
    block = section[section.index("```sh\n") + 6:section.index("```\n", 6)]
    commands = [shlex.split(line) for line in block.splitlines()
                if line.startswith("normctl ")]
    check(len(commands) == 6, f"docs/clients.md modes block: {block!r}")
    modes = os.path.join(tmp, "readme-modes")
    os.makedirs(modes)
    x = rng.standard_normal((2, 8, 3, 3))
    np.save(os.path.join(modes, "x.npy"), x)
    for argv in commands:
        run = subprocess.run([os.path.abspath(args.normctl),
                              f"--server={ctl.target}", *argv[1:]],
                             capture_output=True, text=True, cwd=modes,
                             timeout=120)
        check(run.returncode == 0, f"README: {' '.join(argv)}: {run.stderr}")
    # The last one written to y.npy is RMSNorm over the last dim.
    y = np.load(os.path.join(modes, "y.npy"))
    want = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    check(np.abs(y - want).max() < FP64_BAR, "docs/clients.md rms_norm y.npy")
    # unit.npy: each sample of unit length; w.npy: each out-channel's slice
    # scaled to norm g = 0.5, 2.
    norms = np.sqrt((x * x).sum((1, 2, 3), keepdims=True))
    check(np.abs(np.load(os.path.join(modes, "unit.npy")) - x / norms).max()
          < 1e-12, "docs/clients.md l2_norm unit.npy")
    g = np.array([0.5, 2.0]).reshape(2, 1, 1, 1)
    check(np.abs(np.load(os.path.join(modes, "w.npy")) - g * x / norms).max()
          < 1e-12, "docs/clients.md weight_norm w.npy")
    # Its export/import/merge block, with A = this server, B = a second one.
    rest = section[section.index("```\n", 6) + 4:]
    block = rest[rest.index("```sh\n") + 6:rest.index("```\n", 6)]
    commands = [shlex.split(line.split("#")[0]) for line in block.splitlines()
                if line.startswith("normctl ")]
    check(len(commands) == 4 and "export" in commands[0],
          f"README export block: {block!r}")
    check(ctl("fit", "--model=m", "--shape=4,2", "--values=1,2,3,4,5,6,7,9")
          .returncode == 0, "fit m for the README export block")
    other, other_port, _ = normd_process.start_normd(args.normd)
    b = f"127.0.0.1:{other_port}"
    try:
        for argv in commands:
            argv = [a.replace("=B:50051", "=" + b).replace(
                "=A:50051", "=" + ctl.target).replace("--server=B", "--server=" + b)
                for a in argv[1:]]
            if not any(a.startswith("--server=") for a in argv):
                argv.insert(0, f"--server={ctl.target}")
            run = subprocess.run([os.path.abspath(args.normctl), *argv],
                                 capture_output=True, text=True, cwd=modes,
                                 timeout=120)
            check(run.returncode == 0, f"README: {argv}: {run.stderr}")
        got = json.loads(ctl("get", "--model=m", "--json").stdout)
        check(got["sample_count"] == 8 and got["num_batches_tracked"] == 2,
              f"README merge doubled m: {got}")
        copy = json.loads(ctl("get", "--model=m", "--json", server=b).stdout)
        check(copy["mean"] == got["mean"] and copy["sample_count"] == 4,
              f"README import on B: {copy}")
    finally:
        other.terminate()
        other.wait(timeout=60)


def main():
    proc, port, _ = normd_process.start_normd(args.normd)
    try:
        ctl = Normctl(f"127.0.0.1:{port}")
        with tempfile.TemporaryDirectory() as tmp:
            test_npy(ctl, tmp)
            test_norm_family(ctl, tmp)
            test_streaming_fit(ctl, tmp)
            test_list_table(ctl)
            test_json_everywhere(ctl, tmp)
            test_help_everywhere(ctl)
            test_exit_codes(ctl, tmp)
            test_usage_before_network(ctl)
            test_refused_connection_is_quick(ctl)
            test_local_file_errors(ctl, tmp)
            test_json_numbers(ctl, tmp)
            test_help_is_per_command(ctl)
            test_bad_npy(ctl, tmp)
            test_large_message(tmp)
            test_readme_commands(ctl, tmp)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return normd_process.report(failures, "normctl")


if __name__ == "__main__":
    sys.exit(main())
