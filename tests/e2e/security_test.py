#!/usr/bin/python3
"""TLS + client certificates + bearer token from Python (grpcio) against a
real normd, with throwaway openssl certificates (make_test_certs.sh): the
right certificate and token work; a wrong token or none is UNAUTHENTICATED; a
client certificate from another CA, or none, fails the handshake
(UNAVAILABLE); health needs no token.

Usage: security_test.py --normd BUILD/normd --stubs BUILD/python
"""

import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

ARGS = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    failures = []
    with tempfile.TemporaryDirectory() as certs:
        subprocess.run([os.path.join(HERE, "make_test_certs.sh"), certs],
                       check=True)
        cert = lambda name: os.path.join(certs, name)  # noqa: E731
        proc, port, _ = normd_process.start_normd(ARGS.normd, [
            "--tls_cert=" + cert("server.crt"), "--tls_key=" + cert("server.key"),
            "--tls_client_ca=" + cert("ca.crt"),
            "--auth_token_file=" + cert("token")])
        token = read(cert("token")).decode().strip()
        fit = pb.FitRequest(model="py-secure", input=pb.Tensor(
            dtype=pb.FLOAT64, shape=[2, 1], values=[1.0, 2.0]))

        def call(client, metadata):
            creds = grpc.ssl_channel_credentials(
                root_certificates=read(cert("ca.crt")),
                private_key=read(cert(client + ".key")) if client else None,
                certificate_chain=read(cert(client + ".crt")) if client else None)
            with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                try:
                    pb_grpc.NormalizerStub(channel).Fit(
                        fit, metadata=metadata, timeout=5)
                    return grpc.StatusCode.OK
                except grpc.RpcError as e:
                    return e.code()

        try:
            cases = [
                ("client cert + token", "client",
                 [("authorization", "Bearer " + token)], grpc.StatusCode.OK),
                ("client cert, no token", "client", [],
                 grpc.StatusCode.UNAUTHENTICATED),
                ("client cert, wrong token", "client",
                 [("authorization", "Bearer nope")],
                 grpc.StatusCode.UNAUTHENTICATED),
                ("no client cert", None, [("authorization", "Bearer " + token)],
                 grpc.StatusCode.UNAVAILABLE),
                ("client cert of another CA", "rogue-client",
                 [("authorization", "Bearer " + token)],
                 grpc.StatusCode.UNAVAILABLE),
            ]
            for name, client, metadata, want in cases:
                got = call(client, metadata)
                if got != want:
                    failures.append(f"{name}: got {got}, want {want}")
            # Plaintext against the TLS port.
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                try:
                    pb_grpc.NormalizerStub(channel).Fit(fit, timeout=5)
                    failures.append("plaintext: succeeded")
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE:
                        failures.append(f"plaintext: {e.code()}")
            # Health with the certificate but no token: SERVING.
            creds = grpc.ssl_channel_credentials(
                read(cert("ca.crt")), read(cert("client.key")),
                read(cert("client.crt")))
            with grpc.secure_channel(f"127.0.0.1:{port}", creds) as channel:
                if not normd_process.is_serving(channel, service=""):
                    failures.append("health is not SERVING without a token")
                state = pb_grpc.NormalizerStub(channel).GetModel(
                    pb.GetModelRequest(name="py-secure"),
                    metadata=[("authorization", "Bearer " + token)])
                if state.num_batches_tracked != 1:
                    failures.append(f"refused calls changed the model: {state}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return normd_process.report(failures, "security")


if __name__ == "__main__":
    sys.exit(main())
