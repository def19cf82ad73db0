#!/usr/bin/python3
"""Cross-checks a real normd against PyTorch (Debian's python3-torch).

Starts normd on a loopback port, then sends random cases through the Python
gRPC stubs generated from proto/ at build time:
  * LayerNorm: ranks 2-5, normalized_ndim 1..3, fp32/fp64, with and without
    weight/bias, data and values forms, vs torch.nn.functional.layer_norm;
  * BatchNorm training sequences on fresh models (channel axis 1 and -1,
    momentum 0.1 and cumulative average, training Normalize and Fit steps) vs a
    torch.nn.BatchNormXd stepped the same way: output, running_mean,
    running_var, num_batches_tracked;
  * eval after importing a module's state with CreateModel;
  * health for "" and "normd.v1.Normalizer", and server reflection.
Tolerance: 1e-5 relative. PyTorch runs in float64 on exactly the values sent
(float32 inputs upcast): that is PyTorch's semantics with its rounding taken
out. torch's own float32 kernels miss the fp64 answer by more than 1e-5 at
these offsets (e.g. a one-element LayerNorm row gives 1.4e-3 instead of 0,
since its float mean is off by an ulp), while normd computes in fp64 and
rounds once. Run with /usr/bin/python3 (it sees Debian's torch).
"""

import argparse
import random
import sys

import numpy as np
import torch

TOLERANCE = 1e-5


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--normd", required=True, help="path to the normd binary")
    parser.add_argument("--stubs", required=True, help="generated Python stubs dir")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--cases", type=int, default=240,
                        help="minimum number of checked cases")
    return parser.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.stubs)
import grpc  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402
import normd_process  # noqa: E402  (tests/, next to this file)

DTYPES = {pb.FLOAT32: np.float32, pb.FLOAT64: np.float64}


class Failure(Exception):
    pass


def start_normd():
    proc, port, _ = normd_process.start_normd(ARGS.normd)
    return proc, port


def to_tensor_proto(array, dtype, values_form=False):
    t = pb.Tensor(dtype=dtype, shape=list(array.shape))
    np_dtype = DTYPES[dtype]
    if array.size == 0:
        return t
    if values_form:
        t.values.extend(array.astype(np.float64).ravel().tolist())
    else:
        t.data = np.ascontiguousarray(array, dtype=np.dtype(np_dtype).newbyteorder("<")).tobytes()
    return t


def from_tensor_proto(t):
    np_dtype = DTYPES[t.dtype or pb.FLOAT32]
    if len(t.values):
        return np.array(t.values, dtype=np.float64).reshape(t.shape)
    return np.frombuffer(t.data, dtype=np_dtype).reshape(t.shape).astype(np.float64)


def check_close(what, got, want, tol=TOLERANCE):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise Failure(f"{what}: shape {got.shape} != {want.shape}")
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    if err.size and not np.all(err <= tol):
        i = int(np.argmax(err))
        raise Failure(f"{what}: max rel err {err.ravel()[i]:.3g} at {i}: "
                      f"{got.ravel()[i]!r} vs torch {want.ravel()[i]!r}")


def random_shape(rng, rank):
    return [rng.randint(1, 5) if d != 1 else rng.randint(1, 6) for d in range(rank)]


def metadata_for(model):
    return (("x-normd-model", model),) if model else ()


def check_layer_norm(stub, rng, case):
    rank = rng.randint(2, 5)
    k = rng.randint(1, min(3, rank))
    shape = [rng.randint(1, 6) for _ in range(rank)]
    dtype = rng.choice([pb.FLOAT32, pb.FLOAT64])
    np_dtype = DTYPES[dtype]
    x = (np.random.default_rng(case).standard_normal(shape) * rng.uniform(0.1, 10)
         + rng.uniform(-50, 50)).astype(np_dtype)
    normalized = shape[rank - k:]
    req = pb.NormalizeRequest(mode=pb.LAYER_NORM, normalized_ndim=k,
                              input=to_tensor_proto(x, dtype, rng.random() < 0.25),
                              request_id=f"ln{case}")
    weight = bias = None
    if rng.random() < 0.5:
        weight = np.random.default_rng(case + 1).uniform(0.5, 2, normalized).astype(np_dtype)
        req.weight.CopyFrom(to_tensor_proto(weight, dtype))
    if rng.random() < 0.5:
        bias = np.random.default_rng(case + 2).uniform(-1, 1, normalized).astype(np_dtype)
        req.bias.CopyFrom(to_tensor_proto(bias, dtype))
    eps = None
    if rng.random() < 0.3:
        eps = rng.choice([1e-3, 1e-6, 0.1])
        req.eps = eps
    resp = stub.Normalize(req)
    if resp.request_id != f"ln{case}":
        raise Failure("request_id not echoed")
    if resp.output.dtype != dtype or list(resp.output.shape) != shape:
        raise Failure("output dtype/shape differ from the request")
    want = torch.nn.functional.layer_norm(
        torch.from_numpy(x).double(), normalized,
        None if weight is None else torch.from_numpy(weight).double(),
        None if bias is None else torch.from_numpy(bias).double(),
        eps if eps is not None else 1e-5)
    check_close(f"layer_norm shape={shape} k={k} dtype={dtype}",
                from_tensor_proto(resp.output), want.numpy())


def batch_norm_module(rank, channels, momentum):
    """A float64 BatchNormXd for an input of `rank`."""
    cls = {2: torch.nn.BatchNorm1d, 3: torch.nn.BatchNorm1d,
           4: torch.nn.BatchNorm2d, 5: torch.nn.BatchNorm3d}[rank]
    return cls(channels, momentum=momentum).double()


def torch_batch_norm(module, x, axis):
    """Applies a (channels-first) module to x with the channel axis `axis`."""
    t = torch.from_numpy(x).double()
    if axis == 1:
        return module(t).detach().numpy()
    moved = torch.movedim(t, -1, 1)
    return torch.movedim(module(moved), 1, -1).detach().numpy()


def check_model_state(what, state, module):
    check_close(f"{what} running_mean", list(state.running_mean),
                module.running_mean.double().numpy())
    check_close(f"{what} running_var", list(state.running_var),
                module.running_var.double().numpy())
    if state.num_batches_tracked != int(module.num_batches_tracked):
        raise Failure(f"{what} num_batches_tracked {state.num_batches_tracked} "
                      f"!= {int(module.num_batches_tracked)}")


def check_training_sequence(stub, rng, case):
    """Returns the number of steps checked."""
    rank = rng.randint(2, 5)
    axis = rng.choice([1, -1])
    channels = rng.randint(1, 5)
    dtype = rng.choice([pb.FLOAT32, pb.FLOAT64])
    np_dtype = DTYPES[dtype]
    cumulative = rng.random() < 0.3
    momentum = None if cumulative else 0.1
    module = batch_norm_module(rank, channels, momentum)
    with torch.no_grad():
        # Values exactly representable in float32, as they are sent in dtype.
        module.weight.copy_(module.weight.uniform_(0.5, 2).float().double())
        module.bias.copy_(module.bias.uniform_(-1, 1).float().double())
    module.train()
    name = f"py-train-{case}"
    if cumulative:
        stub.CreateModel(pb.CreateModelRequest(name=name, num_features=channels,
                                               cumulative_average=True),
                         metadata=metadata_for(name))
    steps = rng.randint(2, 4)
    for step in range(steps):
        shape = [rng.randint(2, 4) for _ in range(rank)]
        if axis == 1:
            shape[1] = channels
        else:
            shape[-1] = channels
        gen = np.random.default_rng(case * 100 + step)
        x = (gen.standard_normal(shape) * gen.uniform(0.5, 5)
             + gen.uniform(-20, 20)).astype(np_dtype)
        what = (f"case {case} step {step} rank={rank} axis={axis} C={channels} "
                f"dtype={dtype} cumulative={cumulative}")
        with torch.no_grad():
            want = torch_batch_norm(module, x, axis)
        if rng.random() < 0.7:
            req = pb.NormalizeRequest(mode=pb.BATCH_NORM, model=name, training=True,
                                      input=to_tensor_proto(x, dtype))
            if axis != 1 or rng.random() < 0.5:
                req.channel_axis = axis
            req.weight.CopyFrom(to_tensor_proto(module.weight.detach().numpy(), dtype))
            req.bias.CopyFrom(to_tensor_proto(module.bias.detach().numpy(), dtype))
            resp = stub.Normalize(req, metadata=metadata_for(name))
            check_close(what + " output", from_tensor_proto(resp.output), want)
            state = resp.model
        else:
            req = pb.FitRequest(model=name, input=to_tensor_proto(x, dtype),
                                channel_axis=axis)
            state = stub.Fit(req, metadata=metadata_for(name)).model
        check_model_state(what, state, module)
    return steps


def check_eval_after_import(stub, rng, case):
    rank = rng.randint(2, 5)
    axis = rng.choice([1, -1])
    channels = rng.randint(1, 6)
    dtype = rng.choice([pb.FLOAT32, pb.FLOAT64])
    np_dtype = DTYPES[dtype]
    module = batch_norm_module(rank, channels, 0.1)
    module.eps = rng.choice([1e-5, 1e-3])
    with torch.no_grad():
        module.running_mean.uniform_(-3, 3)
        module.running_var.uniform_(0.2, 4)
        module.weight.uniform_(0.5, 2)
        module.bias.uniform_(-1, 1)
        module.num_batches_tracked.fill_(rng.randint(0, 100))
    module.eval()
    name = f"py-import-{case}"
    state = module.state_dict()
    stub.CreateModel(pb.CreateModelRequest(
        name=name, num_features=channels, eps=module.eps,
        running_mean=state["running_mean"].double().tolist(),
        running_var=state["running_var"].double().tolist(),
        weight=state["weight"].double().tolist(),
        bias=state["bias"].double().tolist(),
        num_batches_tracked=int(state["num_batches_tracked"])),
        metadata=metadata_for(name))
    shape = [rng.randint(1, 4) for _ in range(rank)]
    shape[1 if axis == 1 else -1] = channels
    x = (np.random.default_rng(case).standard_normal(shape) * 3).astype(np_dtype)
    req = pb.NormalizeRequest(mode=pb.BATCH_NORM, model=name, training=False,
                              input=to_tensor_proto(x, dtype), channel_axis=axis)
    resp = stub.Normalize(req, metadata=metadata_for(name))
    with torch.no_grad():
        want = torch_batch_norm(module, x, axis)
    check_close(f"eval import case {case} rank={rank} axis={axis}",
                from_tensor_proto(resp.output), want)
    check_model_state(f"eval import case {case}", resp.model, module)


def check_health_and_reflection(channel):
    # grpc.health.v1 by hand (the package name "grpc" is grpcio's own, so no
    # stubs): HealthCheckRequest{service} is field 1; SERVING is status 1,
    # encoded 0x08 0x01.
    check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                request_serializer=None, response_deserializer=None)
    for service in (b"", b"normd.v1.Normalizer"):
        request = (b"\x0a" + bytes([len(service)]) + service) if service else b""
        reply = check(request)
        if reply != b"\x08\x01":
            raise Failure(f"health {service!r}: {reply!r}, want SERVING")
    # grpc.reflection.v1alpha ServerReflectionRequest{list_services: ""} is
    # field 7, an empty string: bytes 0x3a 0x00.
    reflect = channel.stream_stream(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        request_serializer=None, response_deserializer=None)
    reply = b"".join(reflect(iter([b"\x3a\x00"])))
    for name in (b"normd.v1.Normalizer", b"grpc.health.v1.Health"):
        if name not in reply:
            raise Failure(f"reflection does not list {name!r}: {reply!r}")


def main():
    torch.set_num_threads(1)
    rng = random.Random(ARGS.seed)
    proc, port = start_normd()
    checked = 0
    failures = []
    try:
        channel = grpc.insecure_channel(
            f"127.0.0.1:{port}",
            options=[("grpc.max_receive_message_length", 64 << 20)])
        grpc.channel_ready_future(channel).result(timeout=20)
        stub = pb_grpc.NormalizerStub(channel)
        check_health_and_reflection(channel)
        checked += 1
        case = 0
        while checked < ARGS.cases:
            case += 1
            kind = case % 4
            try:
                if kind in (0, 1):
                    check_layer_norm(stub, rng, case)
                    checked += 1
                elif kind == 2:
                    checked += check_training_sequence(stub, rng, case)
                else:
                    check_eval_after_import(stub, rng, case)
                    checked += 1
            except (Failure, grpc.RpcError) as e:
                failures.append(f"case {case}: {e}")
                checked += 1
        channel.close()
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
    for f in failures:
        print("FAIL", f)
    if code != 0:
        failures.append(f"normd exited {code} on SIGTERM")
    print(f"pytorch_crosscheck: torch {torch.__version__}, "
          f"{checked} cases, {len(failures)} failures")
    print(f"{checked - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
