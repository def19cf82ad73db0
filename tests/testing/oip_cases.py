"""What the Open Inference Protocol tests over gRPC and REST share: tensor
encodings, the native request an OIP request stands for, the state
fingerprint and a checker. Imported after normd_process.parse_test_args has
put the generated stubs on sys.path."""

import numpy as np
from normd.v1 import normalizer_pb2 as pb

DTYPES = {"FP32": pb.FLOAT32, "FP64": pb.FLOAT64, "FP16": pb.FLOAT16,
          "BF16": pb.BFLOAT16}
MODES = {"layer_norm": pb.LAYER_NORM, "rms_norm": pb.RMS_NORM,
         "group_norm": pb.GROUP_NORM, "instance_norm": pb.INSTANCE_NORM,
         "l2_norm": pb.L2_NORM, "weight_norm": pb.WEIGHT_NORM}


def model_inputs(model):
    """The inputs ModelMetadata lists for a model: L2 takes no affine,
    Weight Norm only its g (`weight`)."""
    return {"l2_norm": ["input"], "weight_norm": ["input", "weight"]}.get(
        model, ["input", "weight", "bias"])


def affine_inputs(model, shape, params, datatype, sample):
    """The affine tensors the stateless matrix sends with FP32 inputs:
    LayerNorm's weight and bias over the normalized dims, Weight Norm's g
    per slice; `sample(mean, shape)` gives their values."""
    if datatype != "FP32":
        return []
    if model == "layer_norm":
        n = shape[-params.get("normalized_ndim", 1):]
        return [(name, datatype, n, sample(mean, n))
                for name, mean in (("weight", 1), ("bias", 0))]
    if model == "weight_norm":
        n = [shape[params.get("channel_axis", 0)]]
        return [("weight", datatype, n, sample(1, n))]
    return []


# (model, shape, parameters) of the stateless matrix.
STATELESS_CASES = [
    ("layer_norm", [4, 3, 8], {"normalized_ndim": 1}),
    ("layer_norm", [2, 5, 6], {"normalized_ndim": 2, "eps": 1e-3}),
    ("layer_norm", [3, 16], {"style": "bert", "eps": "0.001"}),
    ("rms_norm", [5, 12], {}),
    ("group_norm", [2, 6, 5], {"num_groups": 3}),
    ("group_norm", [2, 4, 3, 4], {"num_groups": 2, "channel_axis": -1}),
    ("instance_norm", [2, 3, 7], {}),
    ("instance_norm", [2, 5, 3], {"channel_axis": -1}),
    ("l2_norm", [4, 9], {}),
    ("l2_norm", [2, 3, 5], {"normalized_ndim": 2, "eps": 1e-3}),
    ("weight_norm", [6, 4, 3], {}),
    ("weight_norm", [6, 4, 3], {"channel_axis": -1}),
]


# (datatype, parameters) of the BatchNorm sequence run on a model and on its
# native twin: fits, training, eval, an eps.
BATCH_NORM_STEPS = [("FP32", {"fit": True}), ("FP64", {"training": True}),
                    ("BF16", {}), ("FP16", {"fit": True, "channel_axis": 1}),
                    ("FP32", {"eps": 1e-3}), ("FP16", {"training": True})]


def layer_norm_reference(x, eps=1e-5):
    """LayerNorm over the last axis of `x` in fp64 (numpy)."""
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1,
                                                       keepdims=True) + eps)


def encode(values, datatype):
    """Little-endian bytes of `values` as `datatype` (BF16 rounded to
    nearest even from fp32)."""
    values = np.asarray(values, dtype=np.float64).ravel()
    if datatype == "FP64":
        return values.astype("<f8").tobytes()
    if datatype == "FP16":
        return values.astype("<f2").tobytes()
    bits = values.astype("<f4").view("<u4")
    if datatype == "FP32":
        return bits.tobytes()
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def decode(data, datatype):
    """`encode`'s bytes back as float64 values (flat)."""
    if datatype == "BF16":
        bits = np.frombuffer(data, "<u2").astype("<u4") << 16
        return bits.view("<f4").astype(np.float64)
    kind = {"FP64": "<f8", "FP32": "<f4", "FP16": "<f2"}[datatype]
    return np.frombuffer(data, kind).astype(np.float64)


def native_request(model, tensors, params=None):
    """The normd.v1 NormalizeRequest api.md maps the OIP request to."""
    params = params or {}
    request = pb.NormalizeRequest(request_id="r1")
    if model in MODES:
        request.mode = MODES[model]
    else:
        request.mode = pb.BATCH_NORM
        request.model = model
    for name, datatype, shape, values in tensors:
        tensor = getattr(request, name)
        tensor.dtype = DTYPES[datatype]
        tensor.shape.extend(shape)
        tensor.data = encode(values, datatype)
    for key, value in params.items():
        if key == "style":
            request.layer_norm_style = (pb.PYTORCH if value == "pytorch"
                                        else pb.BERT_UNBIASED_STD)
        elif key == "eps":
            request.eps = float(value)
        elif key != "fit":
            setattr(request, key, value)
    return request


def fingerprint(native):
    models = native.ListModels(pb.ListModelsRequest()).models
    return {m.name: native.GetModel(pb.GetModelRequest(name=m.name))
            .SerializeToString() for m in models}



def infer_parameter(oip, value):
    """`value` as an inference.InferParameter of the module `oip` (the
    generated grpc_predict_v2_pb2): a bool, an int64, a double or a
    string."""
    p = oip.InferParameter()
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    else:
        p.string_param = value
    return p


class Checker:
    """Counts checks and collects the failures."""

    def __init__(self):
        self.failures = []
        self.checks = 0

    def expect(self, condition, what):
        self.checks += 1
        if not condition:
            self.failures.append(what)
