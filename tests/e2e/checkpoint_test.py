#!/usr/bin/python3
"""Whole trained models in and out of a real normd, checked against torch.

Two architectures built offline (torchvision's ResNet-18 and MobileNetV2,
weights=None, seeded, their BatchNorm buffers set to non-trivial values)
and a module of every BatchNorm kind:
- state_dict -> safetensors -> normctl import-checkpoint: every model
  bitwise equal to its layer's buffers; export-checkpoint ->
  load_state_dict(strict=False): eval outputs equal the original's;
- the same through ONNX (torch.onnx.export, TrainingMode.PRESERVE);
- Client.import_module / export_into on BatchNorm1d/2d/3d and SyncBatchNorm;
- Client.recalibrate: "cumulative" against PyTorch's own recalibration
  (reset_running_stats, momentum=None, train(), the same batches, no_grad),
  "pooled" against the fp64 statistics of each layer's inputs;
- bad files (table-driven): each refused naming the file, layer or tensor,
  with nothing created;
- a durable import survives SIGKILL whole;
- the worked session of docs/clients.md "Bring a trained model", as written.

Usage: checkpoint_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl
"""

import copy
import json
import os
import re
import shlex
import struct
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE, "tests", "testing"))
import normd_process  # noqa: E402

args = normd_process.parse_test_args(__doc__, required=("normctl",))
sys.path.insert(0, os.path.join(SOURCE, "client", "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import normd  # noqa: E402

warnings.filterwarnings("ignore")  # torch.onnx's advice on training mode.
torch.set_num_threads(1)
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def bn_layers(module):
    return [(n, m) for n, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def make_trained(net, seed):
    """Gives every BatchNorm layer non-trivial statistics, affine and
    counter (as training would), so that no value is a default."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, m in bn_layers(net):
            if m.running_mean is None:
                continue
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) * 2 + 0.25)
            if m.affine:
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)
            m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,),
                                                          generator=g)))
    return net.eval()


def resnet18():
    torch.manual_seed(18)
    return make_trained(torchvision.models.resnet18(weights=None), 1)


def mobilenet_v2():
    torch.manual_seed(2)
    return make_trained(
        torchvision.models.mobilenet_v2(weights=None, num_classes=10), 2)


class EveryKind(torch.nn.Module):
    """BatchNorm1d, 2d (affine=False; momentum=None), 3d and SyncBatchNorm."""

    def __init__(self):
        super().__init__()
        self.flat = torch.nn.BatchNorm1d(5)
        self.plain = torch.nn.BatchNorm2d(3, affine=False)
        self.cumulative = torch.nn.BatchNorm2d(4, momentum=None, eps=1e-3)
        self.volume = torch.nn.BatchNorm3d(2, momentum=0.01)
        self.synced = torch.nn.SyncBatchNorm(6)
        self.untracked = torch.nn.BatchNorm1d(7, track_running_stats=False)


def run_normctl(port, *argv, cwd=None):
    return subprocess.run([args.normctl, f"--server=127.0.0.1:{port}", *argv],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


def expect_layers_equal(client, module, prefix, what, counters=True):
    """Every layer's model holds exactly the layer's buffers and settings
    (and counter: ONNX has none)."""
    for name, m in bn_layers(module):
        if m.running_mean is None:
            continue
        state = client.get_model(f"{prefix}.{name}" if name else prefix)
        for field, tensor in (("running_mean", m.running_mean),
                              ("running_var", m.running_var)):
            check(np.array_equal(getattr(state, field),
                                 tensor.double().numpy()),
                  f"{what} {name}.{field} differs")
        if m.affine:
            check(np.array_equal(state.weight, m.weight.double().detach()
                                 .numpy()) and
                  np.array_equal(state.bias, m.bias.double().detach().numpy()),
                  f"{what} {name} affine differs")
        check(state.num_batches_tracked == (int(m.num_batches_tracked)
                                            if counters else 0),
              f"{what} {name} counter {state.num_batches_tracked}")
        check(state.eps == m.eps and state.momentum == m.momentum,
              f"{what} {name} eps/momentum {state.eps}/{state.momentum}")


def outputs_equal(a, b, x):
    with torch.no_grad():
        return torch.equal(a.eval()(x), b.eval()(x))


def test_safetensors_round_trip(client, port, tmp, net, prefix, x):
    path = os.path.join(tmp, f"{prefix}.safetensors")
    normd.save_safetensors(path, net.state_dict())
    run = run_normctl(port, "import-checkpoint", f"--input={path}",
                      f"--prefix={prefix}")
    check(run.returncode == 0, f"{prefix} import: {run.stderr}")
    check(f"created {len(bn_layers(net))} models" in run.stdout,
          f"{prefix} import said {run.stdout[:80]!r}")
    expect_layers_equal(client, net, prefix, f"{prefix} (safetensors)")

    out = os.path.join(tmp, f"{prefix}-out.safetensors")
    run = run_normctl(port, "export-checkpoint", f"--prefix={prefix}",
                      f"--output={out}")
    check(run.returncode == 0, f"{prefix} export: {run.stderr}")
    exported = normd.load_safetensors(out)
    for name, m in bn_layers(net):
        for key in ("running_mean", "running_var", "weight", "bias"):
            t = exported[f"{name}.{key}"]
            check(t.dtype == torch.float32 and t.shape == (m.num_features,),
                  f"{prefix} {name}.{key} is {t.dtype} {tuple(t.shape)}")
        t = exported[f"{name}.num_batches_tracked"]
        check(t.dtype == torch.int64 and t.shape == (),
              f"{prefix} {name}.num_batches_tracked is {t.dtype} {t.shape}")
    # Into a copy whose statistics were reset: the original's outputs.
    fresh = copy.deepcopy(net)
    for _, m in bn_layers(fresh):
        m.reset_running_stats()
        torch.nn.init.ones_(m.weight)
        torch.nn.init.zeros_(m.bias)
    result = fresh.load_state_dict(exported, strict=False)
    check(not result.unexpected_keys, f"{prefix}: {result.unexpected_keys}")
    check(outputs_equal(net, fresh, x),
          f"{prefix}: eval outputs differ after export-checkpoint")


def test_onnx(client, port, tmp, net, prefix, x):
    path = os.path.join(tmp, f"{prefix}.onnx")
    torch.onnx.export(net, x, path, training=torch.onnx.TrainingMode.PRESERVE)
    nodes = sum(n.op_type == "BatchNormalization"
                for n in onnx.load(path).graph.node)
    check(nodes == len(bn_layers(net)), f"{prefix}.onnx has {nodes} nodes")
    run = run_normctl(port, "import-checkpoint", f"--input={path}",
                      f"--prefix={prefix}")
    check(run.returncode == 0, f"{prefix} onnx import: {run.stderr}")
    # Momentum 0.1 and eps 1e-5 exactly, though ONNX keeps float32 values.
    expect_layers_equal(client, net, prefix, f"{prefix} (onnx)",
                        counters=False)


def test_modules(client):
    module = make_trained(EveryKind(), 3)
    layers = client.import_module(module, "kinds")
    check([m.name for m in layers] ==
          ["kinds.flat", "kinds.plain", "kinds.cumulative", "kinds.volume",
           "kinds.synced"], f"import_module created {layers}")
    expect_layers_equal(client, module, "kinds", "import_module")
    check(client.get_model("kinds.cumulative").momentum is None,
          "momentum=None is not a cumulative average")
    # Change two models on the server, then write them back into a copy.
    client.fit("kinds.volume", np.arange(48, dtype=np.float32).reshape(
        2, 2, 3, 2, 2), channel_axis=1)
    client.fit("kinds.flat", np.ones((4, 5), np.float32))
    target = EveryKind()
    before = {k: v.clone() for k, v in target.state_dict().items()}
    client.export_into(target, "kinds")
    for name, m in bn_layers(target):
        if m.running_mean is None:
            continue
        state = client.get_model(f"kinds.{name}")
        check(torch.equal(m.running_var, torch.from_numpy(
            state.running_var).float()) and
              int(m.num_batches_tracked) == state.num_batches_tracked,
              f"export_into {name}")
        if m.affine:  # Parameters are not statistics: left as they were.
            check(torch.equal(m.weight, before[f"{name}.weight"]),
                  f"export_into changed {name}.weight")
    # A missing model changes nothing.
    client.delete_model("kinds.synced")
    again = EveryKind()
    try:
        client.export_into(again, "kinds")
        failures.append("export_into without a model succeeded")
    except normd.NormdError as e:
        check("kinds.synced" in e.details, f"export_into error: {e}")
    check(all(torch.equal(v, EveryKind().state_dict()[k])
              for k, v in again.state_dict().items()),
          "a failed export_into changed buffers")


def test_recalibration(client):
    net = resnet18()
    g = torch.Generator().manual_seed(7)
    batches = [torch.randn(4, 3, 32, 32, generator=g) * 1.5 + 0.3
               for _ in range(8)]
    x = torch.randn(2, 3, 32, 32, generator=g)

    reference = copy.deepcopy(net)
    for _, m in bn_layers(reference):
        m.reset_running_stats()
        m.momentum = None
    reference.train()
    inputs = {name: [] for name, _ in bn_layers(reference)}
    hooks = [m.register_forward_pre_hook(
        lambda m, i, name=name: inputs[name].append(i[0].double().clone()))
        for name, m in bn_layers(reference)]
    with torch.no_grad():
        for b in batches:
            reference(b)
    for h in hooks:
        h.remove()
    reference.eval()

    ours = copy.deepcopy(net)
    other_buffers = {k: v.clone() for k, v in ours.state_dict().items()
                     if "running" not in k and "num_batches" not in k}
    client.recalibrate(ours, batches, "recal")
    check(not ours.training and all(not m.training for m in ours.modules()),
          "recalibrate changed the module's mode")
    check(all(torch.equal(ours.state_dict()[k], v)
              for k, v in other_buffers.items()),
          "recalibrate changed parameters or other buffers")
    # Relative to each statistic's scale (its largest magnitude): PyTorch
    # accumulates in float32, and single values near 0 carry its rounding.
    worst = 0.0
    for (name, a), (_, b) in zip(bn_layers(ours), bn_layers(reference)):
        for field in ("running_mean", "running_var"):
            got = getattr(a, field).double()
            want = getattr(b, field).double()
            worst = max(worst, float((got - want).abs().max() /
                                     want.abs().max()))
        check(int(a.num_batches_tracked) == 8, f"{name} counted "
              f"{int(a.num_batches_tracked)}")
    check(worst <= 1e-5, f"cumulative vs PyTorch: relative error {worst:.3g}")
    print(f"recalibrate cumulative vs PyTorch: statistics {worst:.3g}", end="")
    with torch.no_grad():
        out_err = float((ours(x) - reference(x)).abs().max() /
                        reference(x).abs().max())
    check(out_err <= 1e-4, f"recalibrated eval outputs differ by {out_err:.3g}")
    print(f", eval outputs {out_err:.3g} (relative)")

    pooled = copy.deepcopy(net)
    client.recalibrate(pooled, batches, "recal", statistics="pooled",
                       replace=True)
    worst = 0.0
    for name, m in bn_layers(pooled):
        values = torch.cat([i.transpose(0, 1).reshape(i.shape[1], -1)
                            for i in inputs[name]], dim=1)
        want_mean, want_var = values.mean(1), values.var(1, unbiased=False)
        worst = max(worst,
                    float((m.running_mean.double() - want_mean).abs().max() /
                          want_mean.abs().max()),
                    float((m.running_var.double() - want_var).abs().max() /
                          want_var.abs().max()))
    # Stored in float32 buffers: a float32 rounding of the fp64 statistics.
    check(worst <= 1e-7, f"pooled vs fp64: relative error {worst:.3g}")
    print(f"recalibrate pooled vs fp64: {worst:.3g} (relative)")
    # Models of those names exist now: without replace, nothing happens.
    try:
        client.recalibrate(copy.deepcopy(net), batches[:1], "recal")
        failures.append("recalibrate over existing models succeeded")
    except normd.NormdError as e:
        check(e.code.name == "ALREADY_EXISTS", f"recalibrate again: {e}")
    check(client.get_model("recal.bn1").num_batches_tracked == 8,
          "a refused recalibrate changed a model")


def write_header(path, header, data=b""):
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def f32(*values):
    return np.array(values, "<f4").tobytes()


def bad_safetensors_files(tmp, net_file):
    """Damaged or unsuitable safetensors files, as bad_files' cases."""
    p = lambda name: os.path.join(tmp, name)  # noqa: E731
    good = open(net_file, "rb").read()
    cases = []

    def raw(name, data):
        with open(p(name), "wb") as f:
            f.write(data)
        return p(name)

    def st(name, tensors):
        normd.save_safetensors(p(name), tensors)
        return p(name)

    def hand(name, header, data=b""):
        write_header(p(name), header, data)
        return p(name)

    mean = np.zeros(2, np.float32)
    var = np.ones(2, np.float32)
    cases += [
        ("truncated file", raw("cut.safetensors", good[:-8]), [],
         2, "not inside the file"),
        ("header length past the end",
         raw("long.safetensors", struct.pack("<Q", 10 ** 6) + b"{}"), [], 2,
         "runs past the end"),
        ("header over the limit", net_file, ["--max_header_bytes=64"], 2,
         "--max_header_bytes"),
        ("non-JSON header", raw("text.safetensors",
                                struct.pack("<Q", 5) + b"{oops"), [], 2,
         "not valid JSON"),
        ("offsets out of range", hand("range.safetensors", {
            "a.running_mean": {"dtype": "F32", "shape": [2],
                               "data_offsets": [0, 8]},
            "a.running_var": {"dtype": "F32", "shape": [2],
                              "data_offsets": [8, 16]}}, f32(0, 0)), [], 2,
         "tensor 'a.running_var'"),
        ("overlapping offsets", hand("overlap.safetensors", {
            "a.running_mean": {"dtype": "F32", "shape": [2],
                               "data_offsets": [0, 8]},
            "a.running_var": {"dtype": "F32", "shape": [2],
                              "data_offsets": [4, 12]}}, f32(0, 0, 1)), [],
         2, "overlaps"),
        ("dtype, shape and bytes disagree", hand("count.safetensors", {
            "a.running_mean": {"dtype": "F64", "shape": [2],
                               "data_offsets": [0, 8]}}, f32(0, 0)), [], 2,
         "tensor 'a.running_mean'"),
        ("running_mean without running_var",
         st("nomean.safetensors", {"blk.bn.running_mean": mean}), [], 2,
         "layer 'blk.bn': has 'blk.bn.running_mean' but no "
         "'blk.bn.running_var'"),
        ("running_var without running_mean",
         st("novar.safetensors", {"blk.bn.running_var": var}), [], 2,
         "but no 'blk.bn.running_mean'"),
        ("tensors disagree on C",
         st("c.safetensors", {"bn.running_mean": mean, "bn.running_var": var,
                              "bn.weight": np.ones(3, np.float32)}), [], 2,
         "tensor 'bn.weight' has 3 values"),
        ("no BatchNorm layer",
         st("conv.safetensors", {"conv.weight": np.ones((2, 2), np.float32)}),
         [], 2, "no BatchNorm layer found"),
        ("NaN variance",
         st("nan.safetensors", {"bn.running_mean": mean, "bn.running_var":
                                np.array([1, np.nan], np.float32)}), [], 2,
         "tensor 'bn.running_var' has nan at [1]"),
        ("negative variance",
         st("neg.safetensors", {"bn.running_mean": mean, "bn.running_var":
                                np.array([1, -2], np.float32)}), [], 2,
         "tensor 'bn.running_var' has -2 at [1]"),
        ("a name that already exists (other layers valid)", net_file, [], 1,
         "'bad.2.1' already exists"),
        ("a layer name normd refuses",
         st("name.safetensors", {"ok.running_mean": mean, "ok.running_var":
                                 var, "b d.running_mean": mean,
                                 "b d.running_var": var}), [], 1,
         "model 'bad.b d'"),
    ]
    return cases


def bad_other_files(tmp):
    """A pickle, and ONNX models normd cannot take, as bad_files' cases."""
    p = lambda name: os.path.join(tmp, name)  # noqa: E731
    torch.save(torch.nn.BatchNorm2d(2).state_dict(), p("model.pt"))
    cases = [("a .pt file", p("model.pt"), [], 2, "import_module")]
    # ONNX: external data, and statistics computed by the graph.
    from onnx import TensorProto, helper, numpy_helper
    inits = [numpy_helper.from_array(np.ones(2, np.float32), n)
             for n in ("s", "b", "m", "v")]
    node = helper.make_node("BatchNormalization",
                            ["x", "s", "b", "m", "v"], ["y"], name="bn")
    io = ([helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    model = helper.make_model(helper.make_graph([node], "g", *io,
                                                initializer=inits))
    onnx.save_model(model, p("external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin",
                    size_threshold=0)
    cases.append(("ONNX external data", p("external.onnx"), [], 2,
                  "external file 'weights.bin'"))
    computed = helper.make_node("Add", ["m0", "m0"], ["m"])
    model = helper.make_model(helper.make_graph(
        [computed, node], "g", *io,
        initializer=[inits[0], inits[1], inits[3],
                     numpy_helper.from_array(np.ones(2, np.float32), "m0")]))
    onnx.save(model, p("computed.onnx"))
    cases.append(("ONNX statistics not initializers", p("computed.onnx"), [],
                  2, "input_mean 'm' is not an initializer"))
    return cases


def bad_files(tmp, net_file):
    """(name, file, extra flags, exit code, text the error must contain)."""
    return bad_safetensors_files(tmp, net_file) + bad_other_files(tmp)


def test_bad_files(client, port, tmp):
    net_file = os.path.join(tmp, "bad-source.safetensors")
    torch.manual_seed(4)
    small = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4),
        torch.nn.Sequential(torch.nn.Conv2d(4, 4, 1), torch.nn.BatchNorm2d(4)))
    normd.save_safetensors(net_file, small.state_dict())
    client.create_model("bad.2.1", 1)  # Taken: layer "1" may not appear.

    def fingerprint():
        return sorted((m.name, m.generation) for m in client.list_models())

    for what, path, flags, code, text in bad_files(tmp, net_file):
        before = fingerprint()
        run = run_normctl(port, "import-checkpoint", f"--input={path}",
                          "--prefix=bad", *flags)
        check(run.returncode == code and text in run.stderr,
              f"{what}: exit {run.returncode}, {run.stderr.strip()!r}; "
              f"want {code} and {text!r}")
        if code == 2:  # A file error names the file.
            check(path in run.stderr, f"{what}: {run.stderr!r} lacks {path}")
        check(fingerprint() == before, f"{what}: changed the models")


def test_durable_import(tmp):
    """With --state_dir, an imported checkpoint is one log record: after
    SIGKILL and a restart, every layer's model is back, bitwise."""
    net = resnet18()
    path = os.path.join(tmp, "durable.safetensors")
    normd.save_safetensors(path, net.state_dict())
    state_dir = os.path.join(tmp, "state")
    flags = [f"--state_dir={state_dir}"]
    proc, port, _ = normd_process.start_normd(args.normd, flags)
    try:
        run = run_normctl(port, "import-checkpoint", f"--input={path}",
                          "--prefix=durable")
        check(run.returncode == 0, f"durable import: {run.stderr}")
    finally:
        proc.kill()
        proc.wait()
    proc, port, _ = normd_process.start_normd(args.normd, flags)
    try:
        with normd.Client(f"127.0.0.1:{port}") as client:
            check(len(client.list_models()) == len(bn_layers(net)),
                  "after SIGKILL: not every imported model came back")
            expect_layers_equal(client, net, "durable", "after SIGKILL")
    finally:
        proc.terminate()
        proc.wait()


def test_docs_session(port, tmp):
    """docs/clients.md "Bring a trained model", as written: each python
    block run (pointed at this server) and its output compared with the
    text block after it; each `$ normctl` line run and compared."""
    text = open(os.path.join(SOURCE, "docs", "clients.md")).read()
    section = text.split("## Bring a trained model", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"```(python|text)\n(.*?)```", section, re.S)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(SOURCE, "client", "python"), args.stubs]))
    ran = 0
    for i, (kind, body) in enumerate(blocks):
        if kind == "python":
            run = subprocess.run(
                [sys.executable, "-c",
                 body.replace("localhost:50051", f"127.0.0.1:{port}")],
                cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
            want = blocks[i + 1][1] if i + 1 < len(blocks) else ""
            check(run.returncode == 0 and run.stdout == want,
                  f"docs python block {i}: {run.stdout!r} {run.stderr[-500:]}"
                  f" want {want!r}")
            ran += 1
        elif body.startswith("$ "):
            for chunk in re.split(r"^\$ ", body, flags=re.M)[1:]:
                command, _, want = chunk.partition("\n")
                argv = shlex.split(command)
                run = run_normctl(port, *argv[1:], cwd=tmp)
                check(run.returncode == 0 and run.stdout == want,
                      f"docs $ {command}: {run.stdout!r} {run.stderr!r}")
                ran += 1
    check(ran == 6, f"docs session: ran {ran} steps")


def main():
    proc, port, _ = normd_process.start_normd(args.normd)
    try:
        with normd.Client(f"127.0.0.1:{port}") as client, \
                tempfile.TemporaryDirectory() as tmp:
            x = torch.randn(2, 3, 32, 32, generator=torch.Generator()
                            .manual_seed(5))
            for build, prefix in ((resnet18, "resnet18"),
                                  (mobilenet_v2, "mobilenet_v2")):
                net = build()
                test_safetensors_round_trip(client, port, tmp, net, prefix, x)
                test_onnx(client, port, tmp, net, prefix + "-onnx", x)
            test_modules(client)
            test_recalibration(client)
            test_bad_files(client, port, tmp)
            test_durable_import(tmp)
            with tempfile.TemporaryDirectory() as docs_tmp:
                test_docs_session(port, docs_tmp)
    finally:
        proc.terminate()
        proc.wait()
    for f in failures:
        print("FAIL", f)
    print(f"checkpoint: {len(failures)} failures")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
