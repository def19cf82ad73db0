"""The normd.v1 calls the hostile-input tests share: tensors and requests,
a model's whole state (ExportModel), states to import, and a restart that
must recover exactly what was acknowledged. Import after
hostile.parse_args, which makes the generated stubs importable.
"""

import grpc
import numpy as np
from normd.v1 import normalizer_pb2 as pb
from normd.v1 import normalizer_pb2_grpc as pb_grpc

from hostile import CHECKS

Code = grpc.StatusCode
SERVICE = "/normd.v1.Normalizer/"
GARBAGE = b"\xff\xff\xff\xff\x0f"  # A field tag whose varint never ends.


def tensor(shape, values=None, dtype=pb.FLOAT64, seed=0):
    count = int(np.prod(shape))
    if values is None:
        values = np.random.default_rng(seed).normal(2.0, 3.0, count)
    np_type = {pb.FLOAT64: "<f8", pb.FLOAT32: "<f4"}[dtype]
    return pb.Tensor(dtype=dtype, shape=shape,
                     data=np.asarray(values, dtype=np_type).tobytes())


def fit_request(model, channels, rows=4, seed=0, dtype=pb.FLOAT64):
    return pb.FitRequest(model=model,
                         input=tensor([rows, channels], dtype=dtype, seed=seed))


def require(condition, what):
    """Stops the test when `condition` is false. Unlike assert, it stays
    under `python3 -O` (where an assert would not even start the server)."""
    if not condition:
        raise RuntimeError(f"required: {what}")


def connect(server):
    channel = grpc.insecure_channel(
        server.target(),
        options=[("grpc.max_receive_message_length", 256 << 20),
                 ("grpc.max_send_message_length", 256 << 20)])
    return channel, pb_grpc.NormalizerStub(channel)


def export(stub, name):
    """The model's whole state, or None if it does not exist."""
    try:
        return stub.ExportModel(pb.ExportModelRequest(name=name))
    except grpc.RpcError as error:
        if error.code() == Code.NOT_FOUND:
            return None
        raise


def exports(stub):
    names = [m.name for m in stub.ListModels(pb.ListModelsRequest()).models]
    return {name: export(stub, name).SerializeToString() for name in names}


def state(name, channels, **fields):
    """A ModelState to import: defaults for what `fields` leaves out."""
    message = pb.ModelState(name=name, num_features=channels, momentum=0.1,
                            eps=1e-5, running_mean=[0.0] * channels,
                            running_var=[1.0] * channels,
                            weight=[1.0] * channels, bias=[0.0] * channels)
    for key, value in fields.items():
        if isinstance(value, list):
            getattr(message, key)[:] = value
        else:
            setattr(message, key, value)
    return message


def restart_and_compare(server, stub_before, sig, what):
    """Stops `server` with `sig`, starts it again on its state directory and
    checks that it starts and holds exactly what it held; the new stub."""
    before = exports(stub_before)
    server.stop(sig)
    started = server.start()
    CHECKS.expect(started, f"{what}: restart failed: {server.log[-2000:]}")
    if not started:
        return None
    _, stub = connect(server)
    after = exports(stub)
    CHECKS.expect(after == before,
                  f"{what}: recovered {sorted(after)} differs from the "
                  f"acknowledged {sorted(before)}")
    return stub
