"""normd.Client: numpy in, numpy out, over gRPC (see normd/__init__.py)."""

import dataclasses
from typing import Any, Mapping, Optional, Sequence, Union

import grpc
import numpy as np

from normd import modules
from normd.v1 import normalizer_pb2 as pb
from normd.v1 import normalizer_pb2_grpc as pb_grpc

# numpy dtype <-> wire dtype. Elements travel little-endian, row-major.
# bfloat16 has no numpy dtype: it comes from torch tensors (or ml_dtypes
# arrays) and travels as its 16-bit patterns.
_WIRE_DTYPES = {
    np.dtype(np.float32): pb.FLOAT32,
    np.dtype(np.float64): pb.FLOAT64,
    np.dtype(np.float16): pb.FLOAT16,
}
_NUMPY_DTYPES = {wire: dtype for dtype, wire in _WIRE_DTYPES.items()}
_MODEL_HEADER = "x-normd-model"
_GROUP_HEADER = "x-normd-group"


def model_group(name: str) -> str:
    """A model's group: its name up to the first '.' (the whole name if it
    has none). A sharding proxy routes by it, so that the models of a
    checkpoint imported under a prefix (`prefix.<layer>`) share a replica."""
    return name.split(".", 1)[0]
_LAYER_NORM_STYLES = {"pytorch": pb.PYTORCH, "bert": pb.BERT_UNBIASED_STD}


class NormdError(Exception):
    """A call normd (or gRPC) refused; `code` is the grpc.StatusCode and
    `details` the server's message, which names the offending field."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


_REFERENCE_SOURCES = {"running": 1, "pooled": 2, "explicit": 3,
                      "checkpoint": 4}
_SOURCE_NAMES = {v: k for k, v in _REFERENCE_SOURCES.items()}


@dataclasses.dataclass
class Reference:
    """A model's drift reference (see the .proto's DriftReference): what
    its inputs are expected to follow. `source` is "running", "pooled",
    "explicit" or "checkpoint"; `mean`/`var` are empty in list_models."""

    source: str
    set_unix_nanos: int
    mean: np.ndarray
    var: np.ndarray

    @classmethod
    def from_proto(cls, r: "pb.DriftReference") -> "Reference":
        return cls(source=_SOURCE_NAMES.get(r.source, "unspecified"),
                   set_unix_nanos=r.set_unix_nanos,
                   mean=np.array(r.mean, dtype=np.float64),
                   var=np.array(r.var, dtype=np.float64))

    def to_proto(self) -> "pb.DriftReference":
        return pb.DriftReference(source=_REFERENCE_SOURCES[self.source],
                                 set_unix_nanos=self.set_unix_nanos,
                                 mean=self.mean, var=self.var)


@dataclasses.dataclass
class DriftReport:
    """How far a model's recent inputs are from its reference (see the
    .proto's DriftReport). The measures are None while the window holds
    fewer than the server's --drift_min_samples values per channel; `kl`
    and `shift` (per channel) are empty in list_models."""

    reference_source: str
    reference_set_unix_nanos: int
    window_samples: int
    window_seconds: int
    kl_max: Optional[float]
    kl_mean: Optional[float]
    shift_max: Optional[float]
    channels_drifted: Optional[int]
    kl: np.ndarray
    shift: np.ndarray

    @classmethod
    def from_proto(cls, d: "pb.DriftReport") -> "DriftReport":
        def opt(field):
            return getattr(d, field) if d.HasField(field) else None
        return cls(
            reference_source=_SOURCE_NAMES.get(d.reference_source,
                                               "unspecified"),
            reference_set_unix_nanos=d.reference_set_unix_nanos,
            window_samples=d.window_samples, window_seconds=d.window_seconds,
            kl_max=opt("kl_max"), kl_mean=opt("kl_mean"),
            shift_max=opt("shift_max"),
            channels_drifted=opt("channels_drifted"),
            kl=np.array(d.kl, dtype=np.float64),
            shift=np.array(d.shift, dtype=np.float64))


@dataclasses.dataclass
class ModelState:
    """A BatchNorm model's configuration and statistics (see the .proto's
    ModelState). `momentum` is None for a cumulative average; `mean`/`var`
    are the exact pooled statistics (empty until something is fitted)."""

    name: str
    num_features: int
    momentum: Optional[float]
    eps: float
    use_pooled_statistics: bool
    num_batches_tracked: int
    sample_count: int
    running_mean: np.ndarray
    running_var: np.ndarray
    mean: np.ndarray
    var: np.ndarray
    weight: np.ndarray
    bias: np.ndarray
    generation: int
    # Exact pooled sums of squared deviations: set by export_model only.
    pooled_m2: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(0))
    # The drift reference, and the drift against it (get_model and
    # list_models), or None.
    reference: Optional[Reference] = None
    drift: Optional[DriftReport] = None

    def state_dict(self, numpy: bool = False) -> dict:
        """The statistics in torch.nn.BatchNorm*d's state_dict layout.

        When torch can be imported: torch tensors with BatchNorm's dtypes
        (float32 weight, bias, running_mean and running_var; a 0-d int64
        num_batches_tracked), so that `module.load_state_dict(
        state.state_dict())` loads them. With numpy=True (or without torch):
        numpy arrays, the statistics in float64 as the server keeps them."""
        arrays = {
            "weight": self.weight.copy(),
            "bias": self.bias.copy(),
            "running_mean": self.running_mean.copy(),
            "running_var": self.running_var.copy(),
            "num_batches_tracked": np.array(self.num_batches_tracked,
                                            dtype=np.int64),
        }
        if numpy:
            return arrays
        try:
            import torch
        except ImportError:
            return arrays
        return {k: torch.from_numpy(v if k == "num_batches_tracked"
                                    else v.astype(np.float32))
                for k, v in arrays.items()}

    @classmethod
    def from_proto(cls, m: "pb.ModelState") -> "ModelState":
        def arr(values):
            return np.array(values, dtype=np.float64)
        return cls(
            name=m.name, num_features=m.num_features,
            momentum=None if m.cumulative_average else m.momentum,
            eps=m.eps, use_pooled_statistics=m.use_pooled_statistics,
            num_batches_tracked=m.num_batches_tracked,
            sample_count=m.sample_count,
            running_mean=arr(m.running_mean), running_var=arr(m.running_var),
            mean=arr(m.mean), var=arr(m.var), weight=arr(m.weight),
            bias=arr(m.bias), generation=m.generation,
            pooled_m2=arr(m.pooled_m2),
            reference=(Reference.from_proto(m.reference)
                       if m.HasField("reference") else None),
            drift=(DriftReport.from_proto(m.drift)
                   if m.HasField("drift") else None))

    def to_proto(self) -> "pb.ModelState":
        """The state as a normd.v1.ModelState (what import_model and
        merge_model send)."""
        return pb.ModelState(
            name=self.name, num_features=self.num_features,
            momentum=self.momentum or 0.0,
            cumulative_average=self.momentum is None, eps=self.eps,
            use_pooled_statistics=self.use_pooled_statistics,
            num_batches_tracked=self.num_batches_tracked,
            sample_count=self.sample_count,
            running_mean=self.running_mean, running_var=self.running_var,
            mean=self.mean, var=self.var, weight=self.weight, bias=self.bias,
            generation=self.generation, pooled_m2=self.pooled_m2,
            reference=(self.reference.to_proto()
                       if self.reference is not None else None))


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _to_tensor(x: Any, field: str) -> "pb.Tensor":
    if _is_torch(x):
        import torch  # Only when given a torch tensor.
        x = x.detach().cpu().contiguous()
        if x.dtype == torch.bfloat16:
            bits = x.view(torch.int16).numpy().astype("<i2")
            tensor = pb.Tensor(dtype=pb.BFLOAT16, shape=bits.shape)
            if bits.size:
                tensor.data = bits.tobytes()
            return tensor
        x = x.numpy()
    array = np.asarray(x)
    if array.dtype.name == "bfloat16":  # ml_dtypes.bfloat16
        tensor = pb.Tensor(dtype=pb.BFLOAT16, shape=array.shape)
        if array.size:
            tensor.data = np.ascontiguousarray(array).view("<u2").tobytes()
        return tensor
    wire = _WIRE_DTYPES.get(array.dtype.newbyteorder("="))
    if wire is None:
        raise TypeError(
            f"{field}: dtype {array.dtype} is not supported; use float32, "
            f"float64, float16, or torch.bfloat16 (convert with "
            f"x.astype(np.float32))")
    little = np.ascontiguousarray(
        array, dtype=array.dtype.newbyteorder("<"))
    tensor = pb.Tensor(dtype=wire, shape=little.shape)
    if little.size:
        tensor.data = little.tobytes()
    return tensor


def _move_dims(x: Any, source: Sequence[int], destination: Sequence[int]):
    """x (numpy or torch) with dims `source` moved to `destination`."""
    if _is_torch(x):
        import torch
        return torch.movedim(x, tuple(source), tuple(destination))
    return np.moveaxis(x, source, destination)


def _from_tensor(tensor: "pb.Tensor", like: Any = None):
    """The output as numpy, or as a torch tensor when `like` (the input) was
    one; BFLOAT16 outputs come back in the input's bfloat16 type."""
    if _is_torch(like):
        import torch
        if tensor.dtype == pb.BFLOAT16:
            bits = np.frombuffer(tensor.data, dtype="<i2").astype(np.int16)
            return torch.from_numpy(bits.copy()).view(torch.bfloat16).reshape(
                tuple(tensor.shape))
        return torch.from_numpy(np.array(_from_tensor(tensor)))
    if tensor.dtype == pb.BFLOAT16:
        dtype = np.asarray(like).dtype if like is not None else None
        if dtype is None or dtype.name != "bfloat16":
            raise TypeError("output: BFLOAT16 needs a torch or ml_dtypes input")
        return np.frombuffer(tensor.data, dtype="<u2").view(dtype).reshape(
            tuple(tensor.shape))
    dtype = _NUMPY_DTYPES.get(tensor.dtype or pb.FLOAT32)
    if dtype is None:
        raise TypeError(f"output: dtype {pb.DataType.Name(tensor.dtype)} "
                        f"has no numpy equivalent")
    shape = tuple(tensor.shape)
    if tensor.values:
        return np.array(tensor.values, dtype=dtype).reshape(shape)
    return np.frombuffer(tensor.data, dtype=dtype.newbyteorder("<")).astype(
        dtype, copy=False).reshape(shape)


def _vector(values: Any, field: str) -> list:
    if values is None:
        return []
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{field}: expected a 1-D array, got shape "
                         f"{array.shape}")
    return array.tolist()


class Client:
    """A connection to one normd server. Thread-safe: gRPC channels are, and
    the client keeps no other state. Every method raises NormdError with the
    server's gRPC code on failure.

    target: "host:port". credentials: grpc.ssl_channel_credentials(...) for
    TLS/mTLS (None = plaintext). token: bearer token for --auth_token_file.
    timeout: seconds per call (None = no deadline). options: extra channel
    arguments; message size limits default to 64 MiB like the server's.
    """

    def __init__(self, target: str, *, credentials=None,
                 token: Optional[str] = None,
                 timeout: Optional[float] = None,
                 options: Sequence = ()):
        limits = [("grpc.max_send_message_length", 64 << 20),
                  ("grpc.max_receive_message_length", 64 << 20)]
        options = limits + list(options)
        if credentials is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, credentials,
                                                options=options)
        self._stub = pb_grpc.NormalizerStub(self._channel)
        self._token = token
        self._timeout = timeout

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- Normalization ------------------------------------------------------

    # Every method takes x as a numpy array (float32/64/16) or a torch
    # tensor (also bfloat16) and returns the same kind, dtype and shape.

    def layer_norm(self, x, normalized_ndim: int = 1, weight=None, bias=None,
                   eps: Optional[float] = None,
                   style: str = "pytorch") -> np.ndarray:
        """torch.nn.functional.layer_norm over the last `normalized_ndim`
        dims. style="bert": the BERT / Annotated-Transformer variant,
        weight * (x - mean) / (unbiased std + eps) + bias, eps default 1e-6."""
        if style not in _LAYER_NORM_STYLES:
            raise ValueError(f"style: {style!r} is not one of "
                             f"{sorted(_LAYER_NORM_STYLES)}")
        request = pb.NormalizeRequest(
            mode=pb.LAYER_NORM, input=_to_tensor(x, "x"),
            normalized_ndim=normalized_ndim,
            layer_norm_style=_LAYER_NORM_STYLES[style])
        self._affine(request, weight, bias, eps)
        return _from_tensor(self._call("Normalize", request).output, x)

    def rms_norm(self, x, normalized_ndim: int = 1, weight=None, bias=None,
                 eps: Optional[float] = None) -> np.ndarray:
        """RMSNorm over the last `normalized_ndim` dims:
        x / sqrt(mean(x^2) + eps) * weight (+ bias); eps default 1e-5."""
        request = pb.NormalizeRequest(
            mode=pb.RMS_NORM, input=_to_tensor(x, "x"),
            normalized_ndim=normalized_ndim)
        self._affine(request, weight, bias, eps)
        return _from_tensor(self._call("Normalize", request).output, x)

    def l2_normalize(self, x, dim: Union[int, Sequence[int]] = -1,
                     eps: Optional[float] = None):
        """torch.nn.functional.normalize(x, p=2, dim=dim, eps=eps):
        x / max(||x||_2, eps), the norm over `dim` (one dim or several; eps
        default 1e-12). A zero row stays zero. The server normalizes
        trailing dims: others are moved last for the call and back after
        it."""
        rank = len(x.shape)
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if rank == 0 or not dims:
            raise ValueError("dim: x needs rank >= 1 and dim at least one "
                             f"dim (x has shape {tuple(x.shape)})")
        for d in dims:
            if not -rank <= d < rank:
                raise ValueError(f"dim: {d} is out of range for rank {rank}")
        resolved = sorted({d % rank for d in dims})
        if len(resolved) != len(dims):
            raise ValueError(f"dim: {dims} names a dim twice")
        trailing = list(range(rank - len(resolved), rank))
        moved = resolved != trailing
        request = pb.NormalizeRequest(
            mode=pb.L2_NORM,
            input=_to_tensor(_move_dims(x, resolved, trailing) if moved else x,
                             "x"),
            normalized_ndim=len(resolved))
        self._affine(request, None, None, eps)
        out = _from_tensor(self._call("Normalize", request).output, x)
        return _move_dims(out, trailing, resolved) if moved else out

    def weight_norm(self, v, g=None, dim: Optional[int] = 0):
        """The weight torch.nn.utils.weight_norm computes from v and g:
        g * v / ||v||_2, the norm over every dim but `dim` (PyTorch's
        default 0). g: shape [v.shape[dim]] or PyTorch's weight_g shape (1
        in the other dims); None is PyTorch's initial g = ||v||, so the
        result is v. dim=None, or -1 as PyTorch reads it, takes the norm of
        the whole tensor (g a scalar). A slice whose norm is 0 gives NaN,
        as in PyTorch."""
        if dim is None or dim == -1:
            flat = v.reshape(1, -1)
            gain = None if g is None else np.asarray(
                g.detach().cpu() if _is_torch(g) else g).reshape(1)
            return self.weight_norm(flat, gain, 0).reshape(tuple(v.shape))
        request = pb.NormalizeRequest(mode=pb.WEIGHT_NORM,
                                      input=_to_tensor(v, "v"),
                                      channel_axis=dim)
        if g is not None:
            request.weight.CopyFrom(_to_tensor(g, "g"))
        return _from_tensor(self._call("Normalize", request).output, v)

    def group_norm(self, x, num_groups: int, channel_axis: int = 1,
                   weight=None, bias=None,
                   eps: Optional[float] = None) -> np.ndarray:
        """torch.nn.functional.group_norm: statistics per (sample, group of
        C / num_groups channels). channel_axis=-1 for channels-last data."""
        request = pb.NormalizeRequest(
            mode=pb.GROUP_NORM, input=_to_tensor(x, "x"),
            num_groups=num_groups, channel_axis=channel_axis)
        self._affine(request, weight, bias, eps)
        return _from_tensor(self._call("Normalize", request).output, x)

    def instance_norm(self, x, channel_axis: int = 1, weight=None, bias=None,
                      eps: Optional[float] = None, model: Optional[str] = None,
                      training: bool = False) -> np.ndarray:
        """torch.nn.InstanceNorm*d: statistics per (sample, channel). With
        `model`, the model's running statistics are used as PyTorch's
        track_running_stats=True does: training=True normalizes with the
        instance statistics and updates them, training=False (eval) uses
        them."""
        request = pb.NormalizeRequest(
            mode=pb.INSTANCE_NORM, input=_to_tensor(x, "x"),
            channel_axis=channel_axis, model=model or "", training=training)
        self._affine(request, weight, bias, eps)
        return _from_tensor(self._call("Normalize", request, model).output, x)

    def batch_norm(self, model: str, x, training: bool = False,
                   channel_axis: int = 1, weight=None, bias=None,
                   eps: Optional[float] = None) -> np.ndarray:
        """BatchNorm with model `model`'s statistics (training=False, like
        module.eval()) or with the batch's own, updating the model
        (training=True, like module.train()). channel_axis=-1 for
        channels-last."""
        request = pb.NormalizeRequest(
            mode=pb.BATCH_NORM, model=model, input=_to_tensor(x, "x"),
            training=training, channel_axis=channel_axis)
        self._affine(request, weight, bias, eps)
        return _from_tensor(self._call("Normalize", request, model).output, x)

    # -- Models -------------------------------------------------------------

    def fit(self, model: str, x, channel_axis: int = 1) -> ModelState:
        """Folds batch x into model `model`'s statistics (created with C =
        x.shape[channel_axis] if new); returns the model after the update."""
        request = pb.FitRequest(model=model, input=_to_tensor(x, "x"),
                                channel_axis=channel_axis)
        return ModelState.from_proto(self._call("Fit", request, model).model)

    def create_model(self, name: str, num_features: Optional[int] = None, *,
                     state_dict: Optional[Mapping[str, Any]] = None,
                     momentum: Optional[float] = 0.1, eps: float = 1e-5,
                     running_mean=None, running_var=None, weight=None,
                     bias=None, num_batches_tracked: int = 0,
                     use_pooled_statistics: bool = False) -> ModelState:
        """Creates a model. `state_dict` takes a torch.nn.BatchNorm*d
        state_dict's entries as numpy arrays (weight, bias, running_mean,
        running_var, num_batches_tracked; e.g. {k: v.numpy() for k, v in
        bn.state_dict().items()}); explicit arguments override it.
        momentum=None is PyTorch's cumulative moving average. num_features
        defaults to the length of the given statistics."""
        sd = dict(state_dict or {})
        running_mean = sd.get("running_mean") if running_mean is None \
            else running_mean
        running_var = sd.get("running_var") if running_var is None \
            else running_var
        weight = sd.get("weight") if weight is None else weight
        bias = sd.get("bias") if bias is None else bias
        if not num_batches_tracked and "num_batches_tracked" in sd:
            num_batches_tracked = int(np.asarray(sd["num_batches_tracked"]))
        request = pb.CreateModelRequest(
            name=name, eps=eps,
            running_mean=_vector(running_mean, "running_mean"),
            running_var=_vector(running_var, "running_var"),
            weight=_vector(weight, "weight"), bias=_vector(bias, "bias"),
            num_batches_tracked=num_batches_tracked,
            use_pooled_statistics=use_pooled_statistics)
        if num_features is None:
            lengths = {len(v) for v in (request.running_mean,
                                        request.running_var, request.weight,
                                        request.bias) if len(v)}
            if len(lengths) != 1:
                raise ValueError(
                    "num_features: give it, or statistics of one length "
                    f"(got lengths {sorted(lengths)})")
            num_features = lengths.pop()
        request.num_features = num_features
        if momentum is None:
            request.cumulative_average = True
        else:
            request.momentum = momentum
        return ModelState.from_proto(self._call("CreateModel", request, name))

    def get_model(self, name: str) -> ModelState:
        return ModelState.from_proto(
            self._call("GetModel", pb.GetModelRequest(name=name), name))

    def list_models(self, group: Optional[str] = None) -> list:
        """Every model, or with `group` only the models `group` and
        `group.*` (routed to the replica that holds them behind a sharding
        proxy); without the per-channel arrays (empty here)."""
        response = self._call("ListModels",
                              pb.ListModelsRequest(group=group or ""),
                              group=group)
        return [ModelState.from_proto(m) for m in response.models]

    def delete_model(self, name: str) -> None:
        self._call("DeleteModel", pb.DeleteModelRequest(name=name), name)

    def reset_model(self, name: str) -> ModelState:
        """Running statistics back to mean 0 / var 1, counts 0, pooled
        statistics cleared; configuration, weight and bias kept."""
        return ModelState.from_proto(
            self._call("ResetModel", pb.ResetModelRequest(name=name), name))

    def export_model(self, name: str) -> ModelState:
        """The model's complete state (with the exact pooled_m2), for
        import_model / merge_model on this or another server."""
        return ModelState.from_proto(
            self._call("ExportModel", pb.ExportModelRequest(name=name), name))

    def import_model(self, state: ModelState, name: Optional[str] = None,
                     create_only: bool = False) -> ModelState:
        """Creates or replaces a model from an exported state (under `name`
        if given); create_only: ALREADY_EXISTS instead of replacing."""
        target = name or state.name
        request = pb.ImportModelRequest(model=state.to_proto(),
                                        name=name or "",
                                        create_only=create_only)
        return ModelState.from_proto(
            self._call("ImportModel", request, target))

    def merge_model(self, name: str, source: ModelState) -> ModelState:
        """Folds an exported state into model `name` (pooled statistics by
        Chan's formula, counts added, running statistics averaged by batch
        counts; the model's configuration kept)."""
        request = pb.MergeModelRequest(name=name, source=source.to_proto())
        return ModelState.from_proto(self._call("MergeModel", request, name))

    def set_reference(self, name: str, source: str = "running", *,
                      mean=None, var=None) -> ModelState:
        """Sets model `name`'s drift reference: its running statistics as
        they are now ("running"), its exact pooled ones ("pooled"), or the
        given per-channel `mean` and `var` ("explicit"). Its inputs are then
        observed and compared with it (drift())."""
        if source not in ("running", "pooled", "explicit"):
            raise ValueError(
                f"source: {source!r} is not running, pooled or explicit")
        if (source == "explicit") != (mean is not None or var is not None):
            raise ValueError("mean and var go with source='explicit' only")
        request = pb.SetReferenceRequest(
            model=name, source=_REFERENCE_SOURCES[source])
        if source == "explicit":
            request.mean.extend(_vector(mean, "mean"))
            request.var.extend(_vector(var, "var"))
        return ModelState.from_proto(
            self._call("SetReference", request, name))

    def clear_reference(self, name: str) -> ModelState:
        """Removes model `name`'s drift reference."""
        return ModelState.from_proto(self._call(
            "ClearReference", pb.ClearReferenceRequest(model=name), name))

    def drift(self, name: Optional[str] = None):
        """Model `name`'s DriftReport (None without a reference); without
        a name, [(name, DriftReport)] of every model with a reference, the
        largest kl_max first (those without measures last)."""
        if name is not None:
            return self.get_model(name).drift
        reports = [(m.name, m.drift) for m in self.list_models()
                   if m.drift is not None]
        reports.sort(key=lambda item: (item[1].kl_max is None,
                                       -(item[1].kl_max or 0.0), item[0]))
        return reports

    def create_models(self, requests: Sequence["pb.CreateModelRequest"]
                      ) -> list:
        """Creates every model of `requests` (normd.v1.CreateModelRequest
        messages) or none: if one is invalid or its name is taken, nothing
        is created. Returns the models without their per-channel arrays.
        Routed by the group the names share; a sharding proxy refuses names
        of several groups (INVALID_ARGUMENT)."""
        requests = list(requests)
        groups = {model_group(r.name) for r in requests}
        response = self._call("CreateModels",
                              pb.CreateModelsRequest(models=requests),
                              group=groups.pop() if len(groups) == 1 else None)
        return [ModelState.from_proto(m) for m in response.models]

    # -- torch modules ------------------------------------------------------

    def import_module(self, module, prefix: str) -> list:
        """Creates one model per BatchNorm layer of a torch module
        (BatchNorm1d/2d/3d, SyncBatchNorm; those with running statistics),
        named "<prefix>.<module path>", with its statistics, affine
        parameters, eps and momentum (None: cumulative average), all or
        none. Returns the models created (without per-channel arrays)."""
        layers = modules.layers_or_raise(module)
        return self.create_models(
            [modules.create_request(prefix, name, layer, fresh=False)
             for name, layer in layers])

    def export_into(self, module, prefix: str,
                    statistics: str = "running") -> None:
        """Writes models "<prefix>.<module path>" back into the module's
        BatchNorm buffers (running_mean, running_var, num_batches_tracked;
        their dtypes and devices kept). statistics="pooled" writes the exact
        pooled mean and (biased) variance instead of the running ones. Every
        model is fetched and checked before any buffer changes."""
        if statistics not in ("running", "pooled"):
            raise ValueError(f"statistics: {statistics!r} is not 'running' "
                             f"or 'pooled'")
        layers = modules.layers_or_raise(module)
        states = [self.get_model(modules.model_name(prefix, name))
                  for name, _ in layers]
        modules.write_statistics(layers, states, statistics)

    def recalibrate(self, module, batches, prefix: str,
                    statistics: str = "cumulative",
                    replace: bool = False) -> list:
        """Re-estimates every BatchNorm layer's statistics from scratch over
        `batches` (AdaBN-style recalibration) and writes them into the
        module.

        Fresh models "<prefix>.<module path>" are created (all or none;
        replace=True deletes existing ones of those names first). The module
        then runs over the batches (tensors, or tuples whose first item is
        the input) under no_grad with its BatchNorm layers on their batch
        statistics, as PyTorch's own recalibration does, and each layer's
        input is fed to Fit. statistics="cumulative" gives PyTorch's
        momentum=None running statistics; "pooled" the exact mean and
        (biased) variance of everything each layer saw, which PyTorch
        cannot. The module's modes and other buffers are left as they
        were. A progress bar (tqdm) shows on a terminal. Returns the models
        after the calibration."""
        if statistics not in ("cumulative", "pooled"):
            raise ValueError(f"statistics: {statistics!r} is not "
                             f"'cumulative' or 'pooled'")
        layers = modules.layers_or_raise(module)
        names = [modules.model_name(prefix, name) for name, _ in layers]
        if replace:
            for name in names:
                try:
                    self.delete_model(name)
                except NormdError as e:
                    if e.code != grpc.StatusCode.NOT_FOUND:
                        raise
        self.create_models(
            [modules.create_request(prefix, name, layer, fresh=True)
             for name, layer in layers])
        modules.run_recalibration(self, module, batches, prefix)
        states = [self.get_model(name) for name in names]
        modules.write_statistics(
            layers, states,
            "running" if statistics == "cumulative" else "pooled")
        return states

    # -- Internals ----------------------------------------------------------

    @staticmethod
    def _affine(request, weight, bias, eps) -> None:
        if weight is not None:
            request.weight.CopyFrom(_to_tensor(weight, "weight"))
        if bias is not None:
            request.bias.CopyFrom(_to_tensor(bias, "bias"))
        if eps is not None:
            request.eps = eps

    def _call(self, method: str, request, model: Optional[str] = None,
              group: Optional[str] = None):
        metadata = []
        if model:
            metadata.append((_MODEL_HEADER, model))
            group = model_group(model)
        if group:
            metadata.append((_GROUP_HEADER, group))
        if self._token is not None:
            metadata.append(("authorization", "Bearer " + self._token))
        try:
            return getattr(self._stub, method)(
                request, timeout=self._timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise NormdError(e.code(), e.details() or "") from None
