"""Builds the normd package; the gRPC stubs (normd.v1) are generated from the
repository's proto/ into the build directory, never into the source tree.

Needs protoc and grpc_python_plugin (Debian: protobuf-compiler,
protobuf-compiler-grpc) or the grpcio-tools package. NORMD_PROTO_DIR points
at another proto/ directory.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_DIR = os.environ.get("NORMD_PROTO_DIR",
                           os.path.join(HERE, "..", "..", "proto"))
PROTO = "normd/v1/normalizer.proto"


def protoc_command(out):
    plugin = shutil.which("grpc_python_plugin")
    if shutil.which("protoc") and plugin:
        return ["protoc", f"--plugin=protoc-gen-grpc_python={plugin}",
                f"-I{PROTO_DIR}", f"--python_out={out}",
                f"--grpc_python_out={out}", PROTO]
    return [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}",
            f"--python_out={out}", f"--grpc_python_out={out}", PROTO]


class BuildWithStubs(build_py):
    """build_py, then protoc into build_lib/normd/v1."""

    def run(self):
        super().run()
        out = self.build_lib
        os.makedirs(os.path.join(out, "normd", "v1"), exist_ok=True)
        subprocess.run(protoc_command(out), check=True)
        open(os.path.join(out, "normd", "v1", "__init__.py"), "a").close()

    def find_package_modules(self, package, package_dir):
        # normd.v1 has no source directory: it is generated in run().
        if package == "normd.v1":
            return []
        return super().find_package_modules(package, package_dir)


setup(cmdclass={"build_py": BuildWithStubs},
      package_dir={"normd": "normd", "normd.v1": "normd"})
