#!/usr/bin/python3
"""The Python server a user might write instead of running normd: grpcio +
PyTorch, implementing normd.v1.Normalizer's Normalize for LAYER_NORM and
BATCH_NORM eval (channel axis 1, statistics from CreateModel). It is the
service benchmark's competitor; it is not a second implementation of normd.

Usage: torch_server.py --stubs BUILD/python [--port 0] [--threads 2]
Prints "serving gRPC on 127.0.0.1:PORT" on stderr once it listens.
"""

import argparse
import sys
import threading
import warnings
from concurrent import futures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stubs", required=True,
                        help="directory with normd/v1/normalizer_pb2*.py")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2,
                        help="torch.set_num_threads")
    parser.add_argument("--workers", type=int, default=10,
                        help="grpc thread pool size")
    args = parser.parse_args()
    sys.path.insert(0, args.stubs)

    import grpc
    import torch
    import torch.nn.functional as F
    from normd.v1 import normalizer_pb2 as pb
    from normd.v1 import normalizer_pb2_grpc as pb_grpc

    torch.set_num_threads(args.threads)
    # torch.frombuffer on immutable request bytes: read-only use is fine.
    warnings.filterwarnings("ignore", message=".*non-writable.*")
    dtypes = {pb.FLOAT32: torch.float32, pb.DATA_TYPE_UNSPECIFIED: torch.float32,
              pb.FLOAT64: torch.float64}

    class Normalizer(pb_grpc.NormalizerServicer):
        def __init__(self):
            self.models = {}
            self.lock = threading.Lock()

        def CreateModel(self, request, context):
            c = request.num_features
            mean = torch.tensor(list(request.running_mean) or [0.0] * c,
                                dtype=torch.float64)
            var = torch.tensor(list(request.running_var) or [1.0] * c,
                               dtype=torch.float64)
            eps = request.eps if request.HasField("eps") else 1e-5
            with self.lock:
                if request.name in self.models:
                    context.abort(grpc.StatusCode.ALREADY_EXISTS, request.name)
                self.models[request.name] = (mean, var, eps)
            return pb.ModelState(name=request.name, num_features=c, eps=eps)

        def Normalize(self, request, context):
            t = request.input
            shape = list(t.shape)
            x = torch.frombuffer(t.data, dtype=dtypes[t.dtype]).reshape(shape)
            if request.mode == pb.LAYER_NORM:
                k = request.normalized_ndim or 1
                eps = request.eps if request.HasField("eps") else 1e-5
                y = F.layer_norm(x, shape[-k:], eps=eps)
            elif request.mode == pb.BATCH_NORM and not request.training:
                with self.lock:
                    model = self.models.get(request.model)
                if model is None:
                    context.abort(grpc.StatusCode.NOT_FOUND, request.model)
                mean, var, eps = model
                y = F.batch_norm(x, mean.to(x.dtype), var.to(x.dtype),
                                 training=False, eps=eps)
            else:
                context.abort(grpc.StatusCode.UNIMPLEMENTED,
                              "the peer does LAYER_NORM and BATCH_NORM eval")
            return pb.NormalizeResponse(
                output=pb.Tensor(dtype=t.dtype, shape=shape,
                                 data=y.numpy().tobytes()),
                request_id=request.request_id)

    limit = 64 << 20
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers),
        options=[("grpc.max_receive_message_length", limit),
                 ("grpc.max_send_message_length", limit),
                 ("grpc.so_reuseport", 0)])
    pb_grpc.add_NormalizerServicer_to_server(Normalizer(), server)
    port = server.add_insecure_port(f"127.0.0.1:{args.port}")
    server.start()
    print(f"torch_server: serving gRPC on 127.0.0.1:{port}", file=sys.stderr,
          flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
