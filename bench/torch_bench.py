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
    json.dump(results, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
