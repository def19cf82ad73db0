"""safetensors files with numpy alone (Debian has no safetensors package).

    normd.save_safetensors("bn.safetensors", module.state_dict())
    module.load_state_dict(normd.load_safetensors("bn.safetensors"),
                           strict=False)

The format: an 8-byte little-endian header length, a JSON header naming
each tensor's dtype, shape and [begin, end) byte offsets, then the data.
Torch tensors are written from their CPU copies; load_safetensors returns
torch tensors when torch is importable (as_torch=False: numpy arrays).
"""

import json
import os
import struct

import numpy as np

_NUMPY_OF = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8",
             "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1",
             "BOOL": "?", "BF16": "<u2"}
_DTYPE_OF = {np.dtype(v).newbyteorder("<").str: k for k, v in _NUMPY_OF.items()
             if k != "BF16"}


def _as_numpy(value):
    """(array, dtype name) of a numpy array or torch tensor."""
    if type(value).__module__.startswith("torch"):
        import torch
        value = value.detach().cpu().contiguous()
        if value.dtype == torch.bfloat16:
            return value.view(torch.int16).numpy().view("<u2"), "BF16"
        value = value.numpy()
    array = np.ascontiguousarray(value)
    key = array.dtype.newbyteorder("<").str
    if array.dtype.name == "bfloat16":  # ml_dtypes
        return array.view("<u2"), "BF16"
    if key not in _DTYPE_OF:
        raise TypeError(f"dtype {array.dtype} has no safetensors dtype")
    return array.astype(key, copy=False), _DTYPE_OF[key]


def save_safetensors(path, tensors, metadata=None):
    """Writes {name: array or tensor} to `path` atomically (a temporary file
    renamed over it)."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, value in tensors.items():
        array, dtype = _as_numpy(value)
        data = array.tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    temporary = f"{path}.tmp-{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(struct.pack("<Q", len(text)) + text)
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def load_safetensors(path, as_torch=True):
    """{name: tensor} of a safetensors file, in the file's dtypes (torch
    tensors when torch is importable and as_torch, else numpy arrays;
    BF16 as torch.bfloat16, or as uint16 bit patterns in numpy)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: not a safetensors file")
    (length,) = struct.unpack("<Q", raw[:8])
    if length > len(raw) - 8:
        raise ValueError(f"{path}: header length {length} past the end")
    header = json.loads(raw[8:8 + length])
    data = memoryview(raw)[8 + length:]
    torch = None
    if as_torch:
        try:
            import torch
        except ImportError:
            torch = None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=_NUMPY_OF[info["dtype"]])
        array = array.reshape(info["shape"]).copy()
        if torch is not None and info["dtype"] == "BF16":
            out[name] = torch.from_numpy(array.view(np.int16)).view(
                torch.bfloat16)
        elif torch is not None:
            out[name] = torch.from_numpy(
                array.astype(array.dtype.newbyteorder("=")))
        else:
            out[name] = array
    return out
