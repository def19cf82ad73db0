"""Python client for the normd tensor normalization server.

    import numpy as np, normd
    with normd.Client("localhost:50051") as client:
        y = client.layer_norm(np.random.rand(4, 8).astype(np.float32))

The generated gRPC stubs live in the subpackage normd.v1 (built from the
repository's proto/ when the package is built; never committed).
"""

# normd.v1 may come from another directory on sys.path (a build tree's
# generated stubs): let this package span every `normd` directory.
__path__ = __import__("pkgutil").extend_path(__path__, __name__)

from normd.client import Client, ModelState, NormdError  # noqa: E402
from normd.safetensors import load_safetensors, save_safetensors  # noqa: E402

__all__ = ["Client", "ModelState", "NormdError", "load_safetensors",
           "save_safetensors"]
__version__ = "1.0.0"
