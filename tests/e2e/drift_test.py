#!/usr/bin/python3
"""Drift against a real normd, over the wire: the window holds the inputs of
eval and training Normalize (channels-first and channels-last, fp32 and
fp64), Fit, FitStream and OIP REST infer, and its measures equal fp64 numpy
over the union of the observed tensors; the measures are absent below
--drift_min_samples; --drift_sample_every observes every Nth request; the
window expires bucket by bucket; many clients on one model lose nothing;
references are set (checkpoint import, running, pooled, explicit), cleared,
exported, imported, kept by MergeModel and by a restart on --state_dir
(whose window starts empty); malformed SetReference calls are refused with
the field named and change nothing.

normctl drift lists the models by kl_max and shows one model's worst
channels; normctl set-reference and clear-reference set and remove one.

Usage: drift_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
args = normd_process.parse_test_args(__doc__, required=("normctl",))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)),
                                "client", "python"))

import grpc  # noqa: E402
import requests  # noqa: E402
import normd  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402

failures = []
C = 3
EPS = 1e-5


def check(condition, what):
    if not condition:
        failures.append(what)


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))


def expected_measures(values, mr, vr, eps=EPS, threshold=0.1):
    """kl, shift and the summary of fp64 per-channel `values` ([C, n])
    against the reference (mr, vr), as the API defines them."""
    mw = values.mean(axis=1)
    vw = values.var(axis=1)
    a, b = vw + eps, np.asarray(vr) + eps
    d = mw - np.asarray(mr)
    kl = 0.5 * (a / b + b / a - 2) + 0.5 * d * d * (1 / a + 1 / b)
    shift = np.abs(d) / np.sqrt(b)
    return {"kl": kl, "shift": shift, "kl_max": kl.max(),
            "kl_mean": kl.mean(), "shift_max": shift.max(),
            "channels_drifted": int((kl > threshold).sum()),
            "samples": values.shape[1]}


def expect_report(report, want, what, bar):
    if report is None or report.kl_max is None:
        check(False, f"{what}: no measures: {report}")
        return
    check(report.window_samples == want["samples"],
          f"{what}: window_samples {report.window_samples} != "
          f"{want['samples']}")
    for field in ("kl", "shift", "kl_max", "kl_mean", "shift_max"):
        err = rel(getattr(report, field), want[field])
        print(f"{what}: {field} relative error {err:.3g}")
        check(err <= bar, f"{what}: {field} off by {err:.3g} (bar {bar})")
    check(report.channels_drifted == want["channels_drifted"],
          f"{what}: channels_drifted {report.channels_drifted} != "
          f"{want['channels_drifted']}")


def channels_of(x, axis):
    """[C, n] fp64 values of channel axis `axis` of x."""
    return np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(C, -1)


def every_path_is_observed(client, rest_port):
    """Eval and training Normalize, Fit, FitStream and OIP REST infer on a
    model imported from a torch module (its reference: the checkpoint's
    running statistics): the window is their union."""
    import torch
    layer = torch.nn.BatchNorm2d(C)
    with torch.no_grad():
        layer.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        layer.running_var.copy_(torch.tensor([1.0, 4.0, 0.25]))
    module = torch.nn.Sequential(layer)
    client.import_module(module, prefix="net")
    model = client.get_model("net.0")
    ref = model.reference
    check(ref is not None and ref.source == "checkpoint",
          f"import_module sets a checkpoint reference: {ref}")
    check(ref is not None and np.array_equal(ref.mean, [0.5, -1.0, 2.0])
          and np.allclose(ref.var, [1.0, 4.0, 0.25], rtol=0, atol=0),
          f"the reference is the running statistics: {ref}")
    check(model.drift is not None and model.drift.kl_max is None and
          model.drift.window_samples == 0,
          f"an empty window has no measures: {model.drift}")

    rng = np.random.default_rng(5)
    seen = []
    x = rng.normal([0.7, -1.2, 2.5], [1.1, 2.0, 0.6], size=(8, 5, 6, C))
    x = x.transpose(0, 3, 1, 2).astype(np.float32)  # NCHW
    client.batch_norm("net.0", x)
    seen.append(channels_of(x, 1))
    y = rng.normal([0.3, 0.0, 1.0], 1.0, size=(4, 7, C))  # channels-last
    client.batch_norm("net.0", y, channel_axis=-1)
    seen.append(channels_of(y, -1))
    z = rng.normal(1.0, 2.0, size=(16, C, 3)).astype(np.float32)
    client.batch_norm("net.0", z, training=True)
    seen.append(channels_of(z, 1))
    f = rng.normal(-1.0, 0.5, size=(10, C))
    client.fit("net.0", f)
    seen.append(channels_of(f, 1))
    streamed = [rng.normal(0.0, 3.0, size=(6, C)) for _ in range(2)]
    client._stub.FitStream(iter([pb.FitRequest(
        model="net.0", input=pb.Tensor(
            dtype=pb.FLOAT64, shape=list(s.shape),
            data=s.astype("<f8").tobytes())) for s in streamed]),
        metadata=[("x-normd-model", "net.0")])
    seen.extend(channels_of(s, 1) for s in streamed)
    r = rng.normal(2.0, 1.0, size=(9, C)).astype(np.float32)
    got = requests.post(
        f"http://127.0.0.1:{rest_port}/v2/models/net.0/infer",
        json={"inputs": [{"name": "input", "datatype": "FP32",
                          "shape": list(r.shape),
                          "data": r.ravel().tolist()}]}, timeout=30)
    check(got.status_code == 200, f"OIP infer: {got.status_code} {got.text}")
    seen.append(channels_of(r, 1))

    union = np.concatenate(seen, axis=1)
    report = client.drift("net.0")
    # fp32 inputs: the core's statistics bar is 1e-7 relative.
    expect_report(report, expected_measures(union, ref.mean, ref.var),
                  "every path", 1e-6)
    listed = [m for m in client.list_models() if m.name == "net.0"][0]
    check(listed.drift is not None and listed.drift.kl_max == report.kl_max
          and len(listed.drift.kl) == 0,
          f"list_models carries the summary without arrays: {listed.drift}")
    stats = requests.get(
        f"http://127.0.0.1:{rest_port}/v2/models/net.0/stats", timeout=30)
    drift = stats.json()["model_stats"][0].get("drift", {}) \
        if stats.status_code == 200 else {}
    check(drift.get("reference_source") == "checkpoint" and
          drift.get("window_samples") == report.window_samples and
          drift.get("kl_max") == report.kl_max and
          drift.get("kl_mean") == report.kl_mean and
          drift.get("shift_max") == report.shift_max and
          drift.get("channels_drifted") == report.channels_drifted,
          f"OIP statistics carry the drift summary: {stats.text[:400]}")
    everything = requests.get(
        f"http://127.0.0.1:{rest_port}/v2/models/stats", timeout=30).json()
    by_name = {m["name"]: m for m in everything["model_stats"]}
    check("drift" in by_name.get("net.0", {}) and
          "drift" not in by_name.get("layer_norm", {"drift": 1}),
          "every model's statistics: drift on models with a reference only")
    ranked = client.drift()
    check(ranked and ranked[0][0] == "net.0",
          f"drift() ranks models by kl_max: {ranked}")
    return union


def references_are_managed(client):
    """running, pooled and explicit sources; clear; malformed requests
    refused naming the field, with nothing changed."""
    client.create_model("r", C, running_mean=[1, 2, 3], running_var=[1, 1, 2])
    state = client.set_reference("r", "running")
    check(state.reference.source == "running" and
          list(state.reference.mean) == [1, 2, 3],
          f"set_reference running: {state.reference}")
    before = client.get_model("r").generation
    cases = [
        (pb.SetReferenceRequest(model="r"), "INVALID_ARGUMENT", "source"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_EXPLICIT,
                                mean=[0, 0], var=[1, 1]),
         "INVALID_ARGUMENT", "mean"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_EXPLICIT,
                                mean=[0, 0, 0], var=[1, -1, 1]),
         "INVALID_ARGUMENT", "var[1]"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_EXPLICIT,
                                mean=[0, float("nan"), 0], var=[1, 1, 1]),
         "INVALID_ARGUMENT", "mean[1]"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_EXPLICIT,
                                mean=[0, 0, 0], var=[1, float("inf"), 1]),
         "INVALID_ARGUMENT", "var[1]"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_RUNNING,
                                mean=[0, 0, 0]), "INVALID_ARGUMENT", "mean"),
        (pb.SetReferenceRequest(model="r", source=pb.REFERENCE_POOLED),
         "FAILED_PRECONDITION", "source"),
        (pb.SetReferenceRequest(model="nope", source=pb.REFERENCE_RUNNING),
         "NOT_FOUND", "nope"),
    ]
    for request, code, field in cases:
        try:
            client._call("SetReference", request, request.model)
            check(False, f"SetReference {request} was accepted")
        except normd.NormdError as e:
            check(e.code.name == code and field in e.details,
                  f"SetReference {request}: {e.code.name} {e.details}")
    after = client.get_model("r")
    check(after.generation == before and
          list(after.reference.mean) == [1, 2, 3],
          "refused calls change nothing")
    client.fit("r", np.arange(12.0).reshape(4, C))
    state = client.set_reference("r", "pooled")
    want = np.arange(12.0).reshape(4, C)
    check(np.allclose(state.reference.mean, want.mean(axis=0), rtol=1e-15)
          and np.allclose(state.reference.var, want.var(axis=0), rtol=1e-15),
          f"pooled reference: {state.reference}")
    state = client.set_reference("r", "explicit", mean=[0, 0, 0],
                                 var=[1, 2, 3])
    check(state.reference.source == "explicit" and
          list(state.reference.var) == [1, 2, 3],
          f"explicit reference: {state.reference}")
    state = client.clear_reference("r")
    check(state.reference is None and client.drift("r") is None,
          "clear_reference removes it and its drift")
    try:
        client.clear_reference("nope")
        check(False, "clear_reference of an unknown model succeeded")
    except normd.NormdError as e:
        check(e.code.name == "NOT_FOUND", f"clear unknown: {e.code.name}")


def references_travel_with_the_model(client):
    """Export -> import carries the reference bit for bit; merge keeps the
    target's."""
    client.create_model("t", C)
    client.set_reference("t", "explicit", mean=[0.1, 0.2, 0.3],
                         var=[1, 2, 3])
    exported = client.export_model("t")
    client.import_model(exported, name="t-copy")
    copy = client.export_model("t-copy")
    check(copy.reference is not None and
          np.array_equal(copy.reference.mean, exported.reference.mean) and
          copy.reference.set_unix_nanos == exported.reference.set_unix_nanos,
          f"import carries the reference: {copy.reference}")
    client.create_model("u", C)
    client.set_reference("u", "running")
    client.merge_model("u", exported)
    merged = client.get_model("u")
    check(list(merged.reference.mean) == [0, 0, 0] and
          merged.reference.source == "running",
          f"merge keeps the target's reference: {merged.reference}")


def normctl(target, *argv):
    done = subprocess.run([args.normctl, f"--server={target}", *argv],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def normctl_shows_and_sets_references(target, client):
    """`drift` ranks by kl_max, `drift --model` prints the summary and the
    worst channels (by kl, at most ten), `set-reference` and
    `clear-reference` change the reference; bad flags are usage errors."""
    client.create_model("calm", C)
    client.set_reference("calm", "running")
    client.batch_norm("calm", np.random.default_rng(1).normal(
        0, 1, size=(2000, C)))
    report = client.drift("net.0")
    code, out, err = normctl(target, "drift")
    lines = out.splitlines()
    check(code == 0 and lines[0].split()[:4] ==
          ["NAME", "REFERENCE", "SAMPLES", "KL_MAX"] and
          lines[1].split()[0] == "net.0" and
          any(line.split()[0] == "calm" for line in lines[2:]),
          f"normctl drift: {code} {out} {err}")
    code, out, err = normctl(target, "drift", "--model=net.0")
    worst = int(np.argmax(report.kl))
    rows = [line.split() for line in out.splitlines()]
    table = rows.index(["CHANNEL", "KL", "SHIFT"]) if [
        "CHANNEL", "KL", "SHIFT"] in rows else None
    check(code == 0 and "reference: checkpoint" in out and
          f"kl_max: {report.kl_max:.4g}" in out and table is not None and
          rows[table + 1][0] == str(worst) and len(rows) - table - 1 == C,
          f"normctl drift --model: {code} {out} {err}")
    code, out, err = normctl(target, "--json", "drift", "--model=net.0")
    check(code == 0 and abs(float(json.loads(out)["kl_max"]) -
                            report.kl_max) <= 1e-12 * report.kl_max,
          f"normctl --json drift --model: {code} {out[:300]} {err}")
    code, out, err = normctl(target, "set-reference", "--model=calm",
                             "--from=pooled")
    check(code == 1 and "FAILED_PRECONDITION" in err,
          f"set-reference --from=pooled with nothing fitted: {code} {err}")
    client.fit("calm", np.ones((4, C)))
    code, out, err = normctl(target, "set-reference", "--model=calm",
                             "--from=pooled")
    check(code == 0 and client.get_model("calm").reference.source ==
          "pooled", f"set-reference --from=pooled: {code} {err}")
    code, out, err = normctl(target, "set-reference", "--model=calm",
                             "--from=sideways")
    check(code == 2 and "--from" in err,
          f"set-reference --from=sideways: {code} {err}")
    code, out, err = normctl(target, "clear-reference", "--model=calm")
    check(code == 0 and client.get_model("calm").reference is None,
          f"clear-reference: {code} {err}")
    code, out, err = normctl(target, "drift", "--model=calm")
    check(code == 1 and "no drift reference" in err,
          f"drift of a model without a reference: {code} {err}")


def concurrent_clients_lose_nothing(target):
    """8 threads x 25 eval calls on one model: every value is counted."""
    setup = normd.Client(target)
    setup.create_model("busy", C)
    setup.set_reference("busy", "running")
    x = np.ones((5, C), np.float32)

    def work():
        with normd.Client(target) as c:
            for _ in range(25):
                c.batch_norm("busy", x)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    samples = setup.drift("busy").window_samples
    check(samples == 8 * 25 * 5,
          f"concurrent observations: {samples} != {8 * 25 * 5}")
    setup.close()


def sampling_minimum_and_expiry():
    """--drift_sample_every=2, --drift_min_samples=20, and a window of 2
    buckets of 1 s."""
    flags = ["--drift_sample_every=2", "--drift_min_samples=20",
             "--drift_buckets=2", "--drift_bucket_seconds=1"]
    with normd_process.serving(args.normd, flags) as proc:
        with normd.Client(f"127.0.0.1:{proc.grpc_port}") as client:
            client.create_model("s", C)
            client.set_reference("s", "running")
            x = np.zeros((4, C))
            # Align to a fresh bucket so the four calls share a window.
            time.sleep(1 - time.time() % 1 + 0.05)
            for _ in range(4):
                client.batch_norm("s", x)
            report = client.drift("s")
            check(report.window_samples == 8,
                  f"every 2nd of 4 calls of 4 rows: {report.window_samples}")
            check(report.kl_max is None,
                  f"below --drift_min_samples no measures: {report}")
            for _ in range(6):
                client.batch_norm("s", x)
            report = client.drift("s")
            check(report.window_samples == 20 and report.kl_max is not None,
                  f"at --drift_min_samples measures appear: {report}")
            check(report.window_seconds == 2, f"window_seconds: {report}")
            time.sleep(2.2)
            report = client.drift("s")
            check(report.window_samples == 0 and report.kl_max is None,
                  f"the window expires: {report}")
            client.batch_norm("s", x)
            client.reset_model("s")
            check(client.drift("s").window_samples == 0,
                  "ResetModel empties the window")


def restart_keeps_the_reference():
    with tempfile.TemporaryDirectory() as state_dir:
        server = normd_process.Normd(args.normd,
                                     [f"--state_dir={state_dir}",
                                      "--drift_min_samples=1"])
        check(server.start(), "normd with --state_dir starts")
        with normd.Client(server.target()) as client:
            client.create_model("d", C)
            client.set_reference("d", "explicit", mean=[1, 2, 3],
                                 var=[4, 5, 6])
            client.batch_norm("d", np.zeros((3, C)))
            check(client.drift("d").window_samples == 3, "observed")
        server.stop()
        check(server.start(), "normd restarts on its state_dir")
        with normd.Client(server.target()) as client:
            state = client.get_model("d")
            check(state.reference is not None and
                  list(state.reference.var) == [4, 5, 6] and
                  state.reference.source == "explicit",
                  f"the reference survives a restart: {state.reference}")
            check(state.drift.window_samples == 0,
                  "the window starts empty after a restart")
        server.stop()


def main():
    with normd_process.serving(args.normd, ["--drift_min_samples=1"]) as proc:
        target = f"127.0.0.1:{proc.grpc_port}"
        with normd.Client(target) as client:
            every_path_is_observed(client, proc.http_port)
            normctl_shows_and_sets_references(target, client)
            references_are_managed(client)
            references_travel_with_the_model(client)
        concurrent_clients_lose_nothing(target)
    sampling_minimum_and_expiry()
    restart_keeps_the_reference()
    return normd_process.report(failures, "drift")


if __name__ == "__main__":
    sys.exit(main())
