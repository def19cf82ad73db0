"""torch.nn BatchNorm layers in and out of normd: the work behind
Client.import_module, Client.export_into and Client.recalibrate.

A layer is every torch.nn BatchNorm module (BatchNorm1d/2d/3d, SyncBatchNorm,
any subclass of torch.nn.modules.batchnorm._BatchNorm) that keeps running
statistics; its model is named "<prefix>.<module path>" (the prefix alone
for a bare BatchNorm module), as normctl import-checkpoint names it.
"""

import sys

import numpy as np

from normd.v1 import normalizer_pb2 as pb


def batch_norm_layers(module):
    """[(module path, layer)] of every BatchNorm layer with running
    statistics, in module order."""
    import torch
    return [(name, m) for name, m in module.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            and m.running_mean is not None and m.running_var is not None]


def model_name(prefix, layer):
    return f"{prefix}.{layer}" if layer else prefix


def _values(tensor):
    return tensor.detach().cpu().double().numpy().tolist()


def create_request(prefix, name, layer, fresh):
    """The CreateModelRequest of a layer: its configuration, affine
    parameters and (unless `fresh`: PyTorch's defaults, cumulative average,
    for recalibration) its statistics."""
    request = pb.CreateModelRequest(
        name=model_name(prefix, name), num_features=layer.num_features,
        eps=layer.eps)
    if fresh or layer.momentum is None:
        request.cumulative_average = True
    else:
        request.momentum = layer.momentum
    if layer.affine:
        request.weight.extend(_values(layer.weight))
        request.bias.extend(_values(layer.bias))
    if not fresh:
        request.running_mean.extend(_values(layer.running_mean))
        request.running_var.extend(_values(layer.running_var))
        if layer.num_batches_tracked is not None:
            request.num_batches_tracked = int(layer.num_batches_tracked)
        # The trained statistics are what the model's inputs should follow.
        request.reference_from_checkpoint = True
    return request


def layers_or_raise(module):
    layers = batch_norm_layers(module)
    if not layers:
        raise ValueError(
            f"module: no BatchNorm layer with running statistics in "
            f"{type(module).__name__}")
    return layers


def write_statistics(layers, states, statistics):
    """Copies each state's statistics into its layer's buffers (their own
    dtype and device): running ones, or the exact pooled mean and biased
    variance. Checks every layer first, so that an error changes none."""
    import torch
    for (name, layer), state in zip(layers, states):
        if state.num_features != layer.num_features:
            raise ValueError(
                f"layer '{name}': model '{state.name}' has "
                f"{state.num_features} channels, the layer "
                f"{layer.num_features}")
        if statistics == "pooled" and state.sample_count == 0:
            raise ValueError(
                f"layer '{name}': model '{state.name}' has fitted nothing, "
                f"so it has no pooled statistics")
    with torch.no_grad():
        for (name, layer), state in zip(layers, states):
            mean, var = ((state.mean, state.var) if statistics == "pooled"
                         else (state.running_mean, state.running_var))
            layer.running_mean.copy_(torch.from_numpy(np.asarray(mean)))
            layer.running_var.copy_(torch.from_numpy(np.asarray(var)))
            if layer.num_batches_tracked is not None:
                layer.num_batches_tracked.fill_(state.num_batches_tracked)


def _progress(batches):
    """tqdm over the batches when stderr is a terminal and tqdm is there."""
    if not sys.stderr.isatty():
        return batches
    try:
        from tqdm import tqdm
    except ImportError:
        return batches
    total = len(batches) if hasattr(batches, "__len__") else None
    return tqdm(batches, total=total, desc="recalibrate", unit="batch")


def run_recalibration(client, module, batches, prefix):
    """Runs the module over `batches` (tensors, or tuples whose first item is
    the input, as a DataLoader gives) with every BatchNorm layer on its batch
    statistics, feeding each layer's input to Fit; restores each layer's mode
    and flags however it ends."""
    import torch
    layers = batch_norm_layers(module)
    saved = [(layer.training, layer.track_running_stats)
             for _, layer in layers]
    hooks = []

    def fit_input(name):
        def hook(layer, inputs):
            client.fit(model_name(prefix, name), inputs[0], channel_axis=1)
        return hook

    try:
        for name, layer in layers:
            hooks.append(layer.register_forward_pre_hook(fit_input(name)))
            # Train mode without tracking: the layer normalizes with its
            # batch's statistics, as in PyTorch's own recalibration, and its
            # buffers stay untouched.
            layer.train()
            layer.track_running_stats = False
        with torch.no_grad():
            for batch in _progress(batches):
                module(batch[0] if isinstance(batch, (tuple, list)) else batch)
    finally:
        for hook in hooks:
            hook.remove()
        for (_, layer), (training, tracking) in zip(layers, saved):
            layer.train(training)
            layer.track_running_stats = tracking
