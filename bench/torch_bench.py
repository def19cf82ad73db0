#!/usr/bin/python3
"""PyTorch timings of the same cases as kernel_bench (fp32, 64 MiB, 2 threads).

Prints one JSON object {case: median seconds}. Run with /usr/bin/python3
(Debian's python3-torch). Case names match kernel_bench's benchmark names.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F

ELEMENTS = (64 << 20) // 4
REPEATS = int(sys.argv[1]) if len(sys.argv) > 1 else 7


def median_seconds(fn):
    fn()  # warm-up
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def main():
    torch.set_num_threads(2)
    torch.manual_seed(1)
    x = torch.randn(ELEMENTS) * 2 + 3
    out = torch.empty_like(x)
    results = {"BM_Copy": median_seconds(lambda: out.copy_(x))}
    for d in (768, 4096):
        t = x[:ELEMENTS // d * d].view(1, ELEMENTS // d, d)
        results[f"BM_LayerNorm/{d}"] = median_seconds(
            lambda t=t, d=d: F.layer_norm(t, (d,)))
        # torch 1.13 has no RMSNorm: the usual composition of its ops.
        results[f"BM_RmsNorm/{d}"] = median_seconds(
            lambda t=t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5))
        results[f"BM_L2Norm/{d}"] = median_seconds(
            lambda t=t: F.normalize(t, dim=-1))
    # The weight torch.nn.utils.weight_norm computes in its pre-forward hook.
    v = x.view(4096, 4096)
    for dim in (0, 1):
        g = torch.full((4096, 1) if dim == 0 else (1, 4096), 1.5)
        results[f"BM_WeightNorm/dim:{dim}"] = median_seconds(
            lambda g=g, dim=dim: torch._weight_norm(v, g, dim))
    # 16-bit rows: 32 Mi elements of [1, T, 4096] (64 MiB, as BM_HalfRows).
    big = torch.cat([x, x]).view(1, -1, 4096)
    # (torch 1.13 has no float16 LayerNorm on the CPU.)
    t = big.to(torch.bfloat16)
    results["BM_HalfRows/float16:0/rms:0"] = median_seconds(
        lambda t=t: F.layer_norm(t, (4096,)))
    results["BM_HalfRows/float16:0/rms:1"] = median_seconds(
        lambda t=t: t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True)
                                    + 1e-5).to(t.dtype))
    for cl, shape in ((0, (32, 64, 128, 128)), (1, (32, 128, 128, 64))):
        g = t.view(shape) if cl == 0 else t.view(shape).permute(0, 3, 1, 2)
        results[f"BM_HalfGroupNorm/channels_last:{cl}"] = median_seconds(
            lambda g=g: F.group_norm(g, 32))
        # bf16 BatchNorm (fp32 running statistics, as torch keeps them).
        for train in (0, 1):
            rm, rv = torch.zeros(64), torch.ones(64)
            results[f"BM_HalfBatchNorm/train:{train}/channels_last:{cl}"] = \
                median_seconds(lambda g=g, rm=rm, rv=rv, train=train:
                               F.batch_norm(g, rm, rv, training=bool(train),
                                            momentum=0.1))
    del big, t
    nchw = x.view(16, 64, 128, 128)
    nhwc = x.view(16, 128, 128, 64).permute(0, 3, 1, 2)  # channels_last strides
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    mean = torch.zeros(64)
    var = torch.ones(64)
    for train in (0, 1):
        for cl, t in ((0, nchw), (1, nhwc)):
            rm, rv = mean.clone(), var.clone()
            results[f"BM_BatchNorm/train:{train}/channels_last:{cl}"] = \
                median_seconds(lambda t=t, rm=rm, rv=rv, train=train:
                               F.batch_norm(t, rm, rv, training=bool(train),
                                            momentum=0.1))
    for cl, t in ((0, nchw), (1, nhwc)):
        results[f"BM_GroupNorm/instance:0/channels_last:{cl}"] = \
            median_seconds(lambda t=t: F.group_norm(t, 32))
        results[f"BM_GroupNorm/instance:1/channels_last:{cl}"] = \
            median_seconds(lambda t=t: F.instance_norm(t))
    json.dump(results, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
