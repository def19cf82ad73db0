#!/usr/bin/python3
"""The Python client (client/python, package normd) against a real normd,
checked against torch 1.13 and an fp64 numpy reference.

Covers: layer_norm and batch_norm (eval, training, channels-last) vs torch
with dtypes preserved; group_norm, instance_norm (stateless and on a model),
rms_norm and the BERT layer_norm style vs torch / their formulas in fp64,
l2_normalize vs F.normalize and weight_norm vs torch's weight_norm,
with float16 numpy arrays and bfloat16 torch tensors; create_model from a trained torch.nn.BatchNorm2d's
state_dict and back; fit vs fp64 pooled statistics; list/get/reset/delete;
export/import/merge (exact round trip);
errors as NormdError carrying the gRPC code; the x-normd-model header (seen
by a recording gRPC server); the bearer token; and the package itself: a
wheel built from client/python (stubs generated from proto/) installed into
an empty directory and used from there.

Usage: python_client_test.py --normd BUILD/normd --stubs BUILD/python
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from concurrent import futures

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402
from tolerances import (FP32_PRODUCT, FP32_VARIANCE_BAR, FP64_BAR,  # noqa: E402
                        fp32_output_bound, worst_excess)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
args = normd_process.parse_test_args(__doc__)
sys.path.insert(0, os.path.join(SOURCE, "client", "python"))

import grpc  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import normd  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def close(got, want, tol, what):
    """Max abs error of got vs the fp64 reference, relative to its scale."""
    want = np.asarray(want, dtype=np.float64)
    err = np.abs(np.asarray(got, dtype=np.float64) - want).max() / max(
        1.0, np.abs(want).max())
    check(err <= tol, f"{what}: error {err:.3g} > {tol:g}")


def within(got, want, bound, what):
    """Every element of got within its bound of the fp64 reference."""
    excess = worst_excess(got, want, bound)
    check(excess <= 1, f"{what}: error {excess:.3g} times its bound")


def expect_error(code, substring, call, what):
    try:
        call()
    except normd.NormdError as e:
        check(e.code == code and substring in e.details,
              f"{what}: got {e.code} {e.details!r}, want {code} ~{substring!r}")
        return
    failures.append(f"{what}: no error raised")


def test_layer_norm(client):
    rng = np.random.default_rng(1)
    for dtype in (np.float32, np.float64):
        x = (rng.standard_normal((4, 3, 16)) * 3 + 5).astype(dtype)
        w = rng.standard_normal((3, 16)).astype(dtype)
        b = rng.standard_normal((3, 16)).astype(dtype)
        y = client.layer_norm(x, normalized_ndim=2, weight=w, bias=b, eps=1e-3)
        check(y.dtype == dtype and y.shape == x.shape,
              f"layer_norm {dtype}: got {y.dtype} {y.shape}")
        want = torch.nn.functional.layer_norm(
            torch.from_numpy(x.astype(np.float64)), (3, 16),
            torch.from_numpy(w.astype(np.float64)),
            torch.from_numpy(b.astype(np.float64)), eps=1e-3).numpy()
        what = f"layer_norm {np.dtype(dtype).name} vs torch fp64"
        if dtype == np.float32:
            within(y, want, fp32_output_bound(want, b, w), what)
        else:
            close(y, want, FP64_BAR, what)
    # Non-contiguous and big-endian inputs are sent as what they mean.
    x = rng.standard_normal((8, 6))
    close(client.layer_norm(x.T), client.layer_norm(np.ascontiguousarray(x.T)),
          0, "layer_norm of a transposed view")
    close(client.layer_norm(x.astype(">f8")), client.layer_norm(x), 0,
          "layer_norm of big-endian input")
    check(client.layer_norm(np.zeros((0, 4), np.float32)).shape == (0, 4),
          "layer_norm of an empty tensor")


def test_norm_family(client):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, 5, 7, generator=gen, dtype=torch.float64) * 2 + 3
    w = torch.rand(6, generator=gen, dtype=torch.float64) + 0.5
    b = torch.rand(6, generator=gen, dtype=torch.float64) - 0.5
    want = torch.nn.functional.group_norm(x, 3, w, b, 1e-5)
    close(client.group_norm(x.numpy(), 3, weight=w.numpy(), bias=b.numpy()),
          want, FP64_BAR, "group_norm fp64")
    nhwc = x.permute(0, 2, 3, 1).contiguous().float().numpy()
    got = client.group_norm(nhwc, 3, channel_axis=-1)
    check(got.dtype == np.float32, "group_norm keeps float32")
    close(np.moveaxis(got, -1, 1),
          torch.nn.functional.group_norm(torch.from_numpy(nhwc).double()
                                         .permute(0, 3, 1, 2), 3),
          1e-5, "group_norm channels-last")
    close(client.instance_norm(x.numpy()),
          torch.nn.functional.instance_norm(x), FP64_BAR, "instance_norm")
    # InstanceNorm on a model's running statistics, as track_running_stats.
    module = torch.nn.InstanceNorm2d(6, track_running_stats=True).double()
    module.train()
    y = client.instance_norm(x.numpy(), model="py-inst", training=True)
    close(y, module(x).detach(), FP64_BAR, "instance_norm training")
    state = client.get_model("py-inst")
    close(state.running_mean, module.running_mean, FP64_BAR,
          "instance_norm running_mean")
    close(state.running_var, module.running_var, FP64_BAR,
          "instance_norm running_var")
    module.eval()
    close(client.instance_norm(x.numpy(), model="py-inst"),
          module(x).detach(), FP64_BAR, "instance_norm eval")
    rms = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    close(client.rms_norm(x.numpy()), rms, FP64_BAR, "rms_norm")
    bert = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)
    close(client.layer_norm(x.numpy(), style="bert"), bert, FP64_BAR,
          "layer_norm style=bert")
    # 16-bit: float16 numpy in and out, bfloat16 torch in and out.
    half = x.numpy().astype(np.float16)
    got = client.rms_norm(half)
    check(got.dtype == np.float16, "rms_norm keeps float16")
    h = torch.from_numpy(half.astype(np.float64))
    close(got, h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-5),
          2.0 ** -10, "rms_norm float16")
    bf = x.to(torch.bfloat16)
    got = client.layer_norm(bf, normalized_ndim=2)
    check(isinstance(got, torch.Tensor) and got.dtype == torch.bfloat16,
          f"layer_norm keeps torch.bfloat16 (got {type(got)})")
    close(got.double(), torch.nn.functional.layer_norm(bf.double(), (5, 7)),
          2.0 ** -7, "layer_norm bfloat16")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "num_groups",
                 lambda: client.group_norm(x.numpy(), 4),
                 "group_norm with 4 groups of 6 channels")


def test_l2_and_weight_norm(client):
    """l2_normalize vs F.normalize over one dim, a middle dim (moved last and
    back) and a tuple of dims; weight_norm vs torch.nn.utils.weight_norm's
    weight at dims 0, 1, PyTorch's -1 (the whole tensor) and None, with g
    in weight_g's shape and without g."""
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(3, 5, 4, 6, generator=gen, dtype=torch.float64) * 2 + 1
    for dim in (-1, 1, (2, 3), (1, 3)):
        close(client.l2_normalize(x.numpy(), dim=dim),
              torch.nn.functional.normalize(x, dim=dim), FP64_BAR,
              f"l2_normalize dim={dim}")
    got = client.l2_normalize(x.float(), dim=1, eps=1e-3)
    check(isinstance(got, torch.Tensor) and got.dtype == torch.float32,
          "l2_normalize keeps a torch float32 tensor")
    want = torch.nn.functional.normalize(x.float().double(), dim=1, eps=1e-3)
    within(got, want, FP32_PRODUCT * np.abs(want.numpy()),
           "l2_normalize torch float32 dim=1")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "eps",
                 lambda: client.l2_normalize(x.numpy(), eps=0.0),
                 "l2_normalize eps=0")
    for make in (lambda: torch.nn.Linear(6, 5), lambda: torch.nn.Conv2d(4, 8, 3)):
        for dim in (0, 1, -1, None):
            module = torch.nn.utils.weight_norm(make().double(), dim=dim)
            with torch.no_grad():
                module.weight_g.uniform_(0.5, 2.0, generator=gen)
                v, g = module.weight_v.detach(), module.weight_g.detach()
                want = torch._weight_norm(v, g, -1 if dim is None else dim)
            what = f"weight_norm {list(v.shape)} dim={dim}"
            close(client.weight_norm(v.numpy(), g.numpy(), dim=dim), want,
                  FP64_BAR, what)
            got = client.weight_norm(v.float(), g.float(), dim=dim)
            check(isinstance(got, torch.Tensor) and got.dtype == torch.float32,
                  what + " keeps a torch float32 tensor")
            want = torch._weight_norm(v.float().double(), g,
                                      -1 if dim is None else dim)
            within(got, want, FP32_PRODUCT * np.abs(want.numpy()),
                   what + " float32")
            check(np.array_equal(client.weight_norm(v.numpy(), dim=dim),
                                 v.numpy()), what + " without g is v")


def test_batch_norm_from_torch(client):
    """A BatchNorm2d trained in torch, loaded through create_model(state_dict),
    normalizes like it in eval and in training mode (fp64 module as the
    reference)."""
    torch.manual_seed(2)
    module = torch.nn.BatchNorm2d(3, momentum=0.2, eps=1e-4).double()
    with torch.no_grad():
        module.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
        module.bias.copy_(torch.tensor([0.1, 0.2, -0.3]))
    module.train()
    for _ in range(3):
        module(torch.randn(4, 3, 5, 5, dtype=torch.float64) * 2 + 1)
    sd = {k: v.numpy() for k, v in module.state_dict().items()}
    state = client.create_model("py-bn2d", state_dict=sd, momentum=0.2,
                                eps=1e-4)
    check(state.num_features == 3 and state.num_batches_tracked == 3,
          f"create_model from state_dict: {state}")
    close(state.running_var, sd["running_var"], 0, "running_var loaded")
    got_sd = client.get_model("py-bn2d").state_dict(numpy=True)
    for key in ("weight", "bias", "running_mean", "running_var"):
        check(got_sd[key].dtype == np.float64,
              f"state_dict(numpy=True)[{key}] dtype {got_sd[key].dtype}")
        close(got_sd[key], sd[key], 0, f"state_dict()[{key}] round trip")
    check(int(got_sd["num_batches_tracked"]) == 3, "num_batches_tracked")
    # The default: torch tensors with BatchNorm's dtypes, which a float32
    # BatchNorm2d loads as they are (strict: every key, no conversion).
    tensors = client.get_model("py-bn2d").state_dict()
    check(all(isinstance(v, torch.Tensor) for v in tensors.values()) and
          tensors["running_mean"].dtype == torch.float32 and
          tensors["num_batches_tracked"].dtype == torch.int64 and
          tensors["num_batches_tracked"].dim() == 0,
          f"state_dict() types: {[(k, type(v), getattr(v, 'dtype', None)) for k, v in tensors.items()]}")
    loaded = torch.nn.BatchNorm2d(3)
    try:
        loaded.load_state_dict(tensors)
        for key in ("weight", "bias", "running_mean", "running_var"):
            want = module.state_dict()[key].float()
            check(torch.equal(loaded.state_dict()[key], want),
                  f"BatchNorm2d.load_state_dict: {key} is not the float32 "
                  f"of the trained module's")
        check(int(loaded.num_batches_tracked) == 3,
              "BatchNorm2d.load_state_dict: num_batches_tracked")
    except (RuntimeError, TypeError) as e:
        failures.append(f"BatchNorm2d.load_state_dict(state_dict()): {e}")

    x = (torch.randn(2, 3, 4, 4, dtype=torch.float64) * 3 - 2)
    module.eval()
    channel = (1, -1, 1, 1)
    for dtype in (np.float32, np.float64):
        sent = x.numpy().astype(dtype)
        y = client.batch_norm("py-bn2d", sent)
        check(y.dtype == dtype, f"batch_norm eval dtype {y.dtype}")
        # Against the module on the values sent (rounded to dtype).
        want = module(torch.from_numpy(sent.astype(np.float64))).detach()
        what = f"batch_norm eval {np.dtype(dtype).name} vs torch"
        if dtype == np.float32:
            within(y, want.numpy(), fp32_output_bound(
                want.numpy(), module.bias.detach().numpy().reshape(channel),
                module.weight.detach().numpy().reshape(channel)), what)
        else:
            close(y, want, FP64_BAR, what)
    # Channels-last: the same data with C last.
    y = client.batch_norm("py-bn2d", x.permute(0, 2, 3, 1).numpy(),
                          channel_axis=-1)
    close(y, module(x).detach().permute(0, 2, 3, 1).numpy(), FP64_BAR,
          "batch_norm channels-last vs torch")
    # Training: the batch's own statistics, and the running ones updated.
    module.train()
    want = module(x).detach().numpy()
    y = client.batch_norm("py-bn2d", x.numpy(), training=True)
    close(y, want, FP64_BAR, "batch_norm training vs torch")
    after = client.get_model("py-bn2d")
    close(after.running_mean, module.running_mean.numpy(), FP64_BAR,
          "running_mean after training vs torch")
    close(after.running_var, module.running_var.numpy(), FP64_BAR,
          "running_var after training vs torch")
    check(after.num_batches_tracked == 4, "num_batches_tracked after training")


def test_fit_and_models(client):
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((5, 4)) * (i + 1) + 1e3 for i in range(3)]
    for b in batches:
        state = client.fit("py-fit", b.astype(np.float32))
    every = np.concatenate([b.astype(np.float32).astype(np.float64)
                            for b in batches])
    check(state.num_batches_tracked == 3 and state.sample_count == 15,
          f"fit counts: {state.num_batches_tracked} {state.sample_count}")
    close(state.mean, every.mean(0), FP64_BAR, "pooled mean vs fp64")
    # fp32 data: variances within docs/api.md's bar (1e-7 relative), the
    # fp32 lanes of the channels-last statistics.
    check(np.allclose(state.var, every.var(0), rtol=FP32_VARIANCE_BAR, atol=0),
          f"pooled var {state.var} vs {every.var(0)}")
    names = [m.name for m in client.list_models()]
    check("py-fit" in names and "py-bn2d" in names, f"list_models: {names}")
    # One group: the name G and the names G.*, nothing else.
    for name in ("pyg", "pyg.layer1.bn", "pyg.bn2", "pyg2.bn"):
        client.create_model(name, 2)
    group = [m.name for m in client.list_models(group="pyg")]
    check(group == ["pyg", "pyg.bn2", "pyg.layer1.bn"],
          f"list_models(group='pyg'): {group}")
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "group",
                 lambda: client.list_models(group="pyg.bn2"),
                 "list_models of a name with a '.'")
    for name in ("pyg", "pyg.layer1.bn", "pyg.bn2", "pyg2.bn"):
        client.delete_model(name)
    # export -> import under another name: the same state, bit for bit; a
    # merge of it into the original doubles the data (same mean, same var).
    exported = client.export_model("py-fit")
    check(exported.pooled_m2.size == 4 and np.allclose(
        exported.pooled_m2, every.var(0) * 15, rtol=FP32_VARIANCE_BAR, atol=0),
        f"export pooled_m2: {exported.pooled_m2}")
    copy = client.import_model(exported, name="py-fit-copy")
    for field in ("running_mean", "running_var", "mean", "var", "weight"):
        check(np.array_equal(getattr(copy, field), getattr(state, field)),
              f"import_model {field} bit for bit")
    check(copy.name == "py-fit-copy" and copy.generation == state.generation,
          f"import_model name/generation: {copy.name} {copy.generation}")
    expect_error(grpc.StatusCode.ALREADY_EXISTS, "create_only",
                 lambda: client.import_model(exported, name="py-fit-copy",
                                             create_only=True),
                 "import_model create_only")
    doubled = client.merge_model("py-fit-copy", exported)
    check(doubled.sample_count == 30 and doubled.num_batches_tracked == 6,
          f"merge counts: {doubled.sample_count} {doubled.num_batches_tracked}")
    close(doubled.mean, every.mean(0), FP64_BAR, "merged pooled mean")
    close(doubled.var, every.var(0), FP32_VARIANCE_BAR, "merged pooled var")
    client.delete_model("py-fit-copy")
    reset = client.reset_model("py-fit")
    check(reset.num_batches_tracked == 0 and reset.mean.size == 0 and
          np.all(reset.running_var == 1), f"reset_model: {reset}")
    client.delete_model("py-fit")
    expect_error(grpc.StatusCode.NOT_FOUND, "py-fit",
                 lambda: client.get_model("py-fit"), "get after delete")
    cumulative = client.create_model("py-cma", 2, momentum=None)
    check(cumulative.momentum is None, "momentum=None is a cumulative average")


def test_errors(client):
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, "normalized_ndim",
                 lambda: client.layer_norm(np.ones((2, 3)), normalized_ndim=5),
                 "normalized_ndim > rank")
    expect_error(grpc.StatusCode.NOT_FOUND, "nobody",
                 lambda: client.batch_norm("nobody", np.ones((2, 3))),
                 "eval on an unknown model")
    expect_error(grpc.StatusCode.ALREADY_EXISTS, "py-bn2d",
                 lambda: client.create_model("py-bn2d", 3), "create twice")
    try:
        client.layer_norm(np.ones((2, 3), dtype=np.int32))
        failures.append("int32 input: no TypeError")
    except TypeError as e:
        check("int32" in str(e), f"TypeError names the dtype: {e}")


def test_model_header():
    """Every call that names a model sends it as x-normd-model (and only
    those): a recording server stands in for normd."""
    seen = []

    def record(method, response):
        def handler(request, context):
            headers = dict(context.invocation_metadata())
            seen.append((method, headers.get("x-normd-model")))
            return response
        return grpc.unary_unary_rpc_method_handler(
            handler, request_deserializer=lambda b: b,
            response_serializer=lambda m: m.SerializeToString())

    handlers = {
        "Normalize": record("Normalize", pb.NormalizeResponse(
            output=pb.Tensor(dtype=pb.FLOAT32, shape=[0]))),
        "Fit": record("Fit", pb.FitResponse()),
        "GetModel": record("GetModel", pb.ModelState()),
        "DeleteModel": record("DeleteModel", pb.DeleteModelResponse()),
        "ResetModel": record("ResetModel", pb.ModelState()),
        "CreateModel": record("CreateModel", pb.ModelState()),
        "ListModels": record("ListModels", pb.ListModelsResponse()),
        "ExportModel": record("ExportModel", pb.ModelState(name="m7")),
        "ImportModel": record("ImportModel", pb.ModelState()),
        "MergeModel": record("MergeModel", pb.ModelState()),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("normd.v1.Normalizer", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with normd.Client(f"127.0.0.1:{port}") as c:
            c.batch_norm("m1", np.ones((2, 1), np.float32))
            c.fit("m2", np.ones((2, 1)))
            c.get_model("m3")
            c.reset_model("m4")
            c.delete_model("m5")
            c.create_model("m6", 1)
            c.layer_norm(np.ones((1,), np.float32))
            c.list_models()
            state = c.export_model("m7")
            c.import_model(state)
            c.import_model(state, name="m8")
            c.merge_model("m9", state)
    finally:
        server.stop(None)
    want = [("Normalize", "m1"), ("Fit", "m2"), ("GetModel", "m3"),
            ("ResetModel", "m4"), ("DeleteModel", "m5"),
            ("CreateModel", "m6"), ("Normalize", None), ("ListModels", None),
            ("ExportModel", "m7"), ("ImportModel", "m7"),
            ("ImportModel", "m8"), ("MergeModel", "m9")]
    check(seen == want, f"x-normd-model headers: {seen}")


def test_token():
    with tempfile.TemporaryDirectory() as tmp:
        token_file = os.path.join(tmp, "token")
        with open(token_file, "w") as f:
            f.write("s3cret\n")
        proc, port, _ = normd_process.start_normd(
            args.normd, ["--auth_token_file=" + token_file])
        try:
            with normd.Client(f"127.0.0.1:{port}", token="s3cret") as c:
                check(c.layer_norm(np.ones((1, 2))).shape == (1, 2),
                      "call with the token")
            with normd.Client(f"127.0.0.1:{port}") as c:
                expect_error(grpc.StatusCode.UNAUTHENTICATED, "authorization",
                             lambda: c.list_models(), "call without token")
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def test_wheel(port):
    """pip builds a wheel from client/python (stubs generated from proto/),
    installs it into an empty directory, and that copy talks to normd."""
    with tempfile.TemporaryDirectory() as tmp:
        # Build from a copy: an in-tree build would leave files behind.
        shutil.copytree(os.path.join(SOURCE, "client", "python"),
                        os.path.join(tmp, "client", "python"))
        shutil.copytree(os.path.join(SOURCE, "proto"),
                        os.path.join(tmp, "proto"))
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        built = subprocess.run(
            pip + ["wheel", "--no-deps", "--no-build-isolation", "-w",
                   os.path.join(tmp, "dist"),
                   os.path.join(tmp, "client", "python")],
            capture_output=True, text=True)
        if built.returncode != 0:
            failures.append("pip wheel failed: " + built.stderr[-2000:])
            return
        wheels = os.listdir(os.path.join(tmp, "dist"))
        site = os.path.join(tmp, "site")
        subprocess.run(pip + ["install", "--no-deps", "--target", site,
                              os.path.join(tmp, "dist", wheels[0])],
                       check=True, capture_output=True)
        program = (
            "import json, numpy as np, normd, sys\n"
            f"assert normd.__file__.startswith({site!r}), normd.__file__\n"
            f"c = normd.Client('127.0.0.1:{port}')\n"
            "y = c.layer_norm(np.array([[1, 2, 3]], np.float32))\n"
            "print(y.dtype, json.dumps(y.tolist()))\n")
        env = dict(os.environ, PYTHONPATH=site)
        ran = subprocess.run([sys.executable, "-c", program], env=env,
                             capture_output=True, text=True, cwd=tmp)
        if ran.returncode != 0 or not ran.stdout.startswith("float32 "):
            failures.append(f"installed wheel: {ran.stdout!r} "
                            f"{ran.stderr[-1500:]!r}")
            return
        # [1,2,3]: mean 2, var 2/3 -> (x-2)/sqrt(2/3+1e-5).
        want = (np.array([[1, 2, 3]]) - 2) / np.sqrt(2 / 3 + 1e-5)
        within(json.loads(ran.stdout.split(" ", 1)[1]), want,
               fp32_output_bound(want), "installed wheel's layer_norm vs fp64")


def clients_page_section(name, end):
    """The text of docs/clients.md from `## name` to `## end`."""
    with open(os.path.join(SOURCE, "docs", "clients.md")) as f:
        page = f.read()
    return page[page.index(f"## {name}"):page.index(f"## {end}")]


def test_docs_snippet(port):
    """The Python block of docs/clients.md, run as written (pointed at this
    server) twice in a row: it prints what the page says both times."""
    import re
    section = clients_page_section("Python", "Node")
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace("localhost:50051", f"127.0.0.1:{port}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(SOURCE, "client", "python"), args.stubs]))
    for run in ("first", "second"):
        ran = subprocess.run([sys.executable, "-c", code], env=env,
                             capture_output=True, text=True)
        check(ran.returncode == 0 and
              ran.stdout == "float32 (4, 8) 1\nNOT_FOUND\n",
              f"docs/clients.md snippet, {run} run: {ran.stdout!r} "
              f"{ran.stderr[-1500:]!r}")


def test_venv_recipe():
    """docs/clients.md's install recipe for Debian 12, run as written from a
    copy of the repository's client/python and proto, apart from apt-get
    (the packages it names must be installed; the container test runs it
    all in a fresh Debian) and the package index (pip gets --no-index:
    everything must come from Debian's packages). client/python/README.md
    gives the same recipe."""
    import re
    section = clients_page_section("Python", "Node")
    block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
    readme = open(os.path.join(SOURCE, "client", "python", "README.md")).read()
    check(f"```sh\n{block}```" in readme,
          "client/python/README.md's recipe differs from docs/clients.md's")
    lines = [line for line in block.splitlines() if line.strip()]
    install = lines[2].split()
    check(len(lines) == 6 and install[:3] == ["$SUDO", "apt-get", "install"]
          and "python3-wheel" in install and
          lines[3].startswith("/usr/bin/python3 -m venv"),
          f"docs/clients.md recipe: {block!r}")
    lines = lines[3:]
    for package in install[4:]:
        installed = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package],
            capture_output=True, text=True).stdout
        check(installed.startswith("install ok installed"),
              f"recipe package {package} is not installed")
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(SOURCE, "client", "python"),
                        os.path.join(tmp, "client", "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info"))
        shutil.copytree(os.path.join(SOURCE, "proto"),
                        os.path.join(tmp, "proto"))
        for line in lines:
            argv = shlex.split(line)
            if argv[0].endswith("pip"):
                argv.append("--no-index")
            argv[0] = {"python3": "/usr/bin/python3"}.get(argv[0], argv[0])
            ran = subprocess.run(argv, cwd=tmp, capture_output=True, text=True)
            check(ran.returncode == 0,
                  f"recipe: {line}: {ran.stdout[-800:]} {ran.stderr[-1500:]}")
            if ran.returncode != 0:
                return
        check(ran.stdout == "normd client 1.0.0\n",
              f"recipe's last line printed {ran.stdout!r}")


def main():
    proc, port, _ = normd_process.start_normd(args.normd)
    try:
        with normd.Client(f"127.0.0.1:{port}", timeout=30) as client:
            test_layer_norm(client)
            test_norm_family(client)
            test_l2_and_weight_norm(client)
            test_batch_norm_from_torch(client)
            test_fit_and_models(client)
            test_errors(client)
        test_wheel(port)
        test_docs_snippet(port)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    test_venv_recipe()
    test_model_header()
    test_token()
    return normd_process.report(failures, "python client")


if __name__ == "__main__":
    sys.exit(main())
