#!/usr/bin/python3
"""Prints the kernel table of `make bench`: normd's kernels against the copy /
read-only-sum baselines of the same run and against PyTorch.

Usage: report.py KERNEL_BENCH_JSON TORCH_JSON [SERVICE_JSON]
KERNEL_BENCH_JSON is Google Benchmark's --benchmark_format=json output with
repetitions; TORCH_JSON is torch_bench.py's output; SERVICE_JSON is
service_bench.py's output (a second table).

Times are medians over the repetitions. A kernel's ratio to its baseline is
the median over the repetitions of each one's ratio to the baseline timed
beside it in the same iterations (kernel_bench's TimePaired: the counter
baseline_s), so that the shared machine's drift in memory bandwidth, tens of
percent within seconds, cancels; where the JSON has only aggregates, the
ratio of their medians; where it has no paired baseline (older runs), the
standalone baseline's median.
"""

import json
import statistics
import sys

# (benchmark, what, baseline, target, kind): kind "bw" = bandwidth ratio vs
# baseline must be >= target; "time" = time ratio vs baseline must be <= target.
ROWS = [
    ("BM_LayerNorm/768", "LayerNorm [B,T,768]", "BM_Copy", 0.9, "bw"),
    ("BM_LayerNorm/4096", "LayerNorm [B,T,4096]", "BM_Copy", 0.9, "bw"),
    ("BM_BatchNorm/train:0/channels_last:0", "BatchNorm eval NCHW", "BM_Copy",
     0.9, "bw"),
    ("BM_BatchNorm/train:0/channels_last:1", "BatchNorm eval NHWC", "BM_Copy",
     0.9, "bw"),
    ("BM_BatchNorm/train:1/channels_last:0", "BatchNorm train NCHW", "BM_Copy",
     1.5, "time"),
    ("BM_BatchNorm/train:1/channels_last:1", "BatchNorm train NHWC", "BM_Copy",
     1.5, "time"),
    ("BM_Fit/channels_last:0", "Fit NCHW", "BM_ReadSum", 0.9, "bw"),
    ("BM_Fit/channels_last:1", "Fit NHWC", "BM_ReadSum", 0.9, "bw"),
    ("BM_RmsNorm/768", "RMSNorm [B,T,768]", "BM_Copy", 0.9, "bw"),
    ("BM_RmsNorm/4096", "RMSNorm [B,T,4096]", "BM_Copy", 0.9, "bw"),
    ("BM_L2Norm/768", "L2 norm [B,T,768]", "BM_Copy", 0.9, "bw"),
    ("BM_L2Norm/4096", "L2 norm [B,T,4096]", "BM_Copy", 0.9, "bw"),
    # Two passes over v (its norms, then the output): as BatchNorm training.
    ("BM_WeightNorm/dim:0", "Weight Norm [4096,4096] dim 0", "BM_Copy", 1.5,
     "time"),
    ("BM_WeightNorm/dim:1", "Weight Norm [4096,4096] dim 1", "BM_Copy", 1.5,
     "time"),
    ("BM_GroupNorm/instance:0/channels_last:0", "GroupNorm(32) NCHW", "BM_Copy",
     0.9, "bw"),
    ("BM_GroupNorm/instance:0/channels_last:1", "GroupNorm(32) NHWC", "BM_Copy",
     0.9, "bw"),
    ("BM_GroupNorm/instance:1/channels_last:0", "InstanceNorm NCHW", "BM_Copy",
     0.9, "bw"),
    ("BM_GroupNorm/instance:1/channels_last:1", "InstanceNorm NHWC", "BM_Copy",
     0.9, "bw"),
    ("BM_HalfRows/float16:0/rms:0", "LayerNorm bf16 [B,T,4096]", "BM_Copy",
     0.9, "bw"),
    ("BM_HalfRows/float16:1/rms:0", "LayerNorm fp16 [B,T,4096]", "BM_Copy",
     0.9, "bw"),
    ("BM_HalfRows/float16:0/rms:1", "RMSNorm bf16 [B,T,4096]", "BM_Copy",
     0.9, "bw"),
    ("BM_HalfGroupNorm/channels_last:0", "GroupNorm(32) bf16 NCHW",
     "BM_Copy", 0.9, "bw"),
    ("BM_HalfGroupNorm/channels_last:1", "GroupNorm(32) bf16 NHWC",
     "BM_Copy", 0.9, "bw"),
    ("BM_HalfBatchNorm/train:0/channels_last:0", "BatchNorm bf16 eval NCHW",
     "BM_Copy", 0.9, "bw"),
    ("BM_HalfBatchNorm/train:0/channels_last:1", "BatchNorm bf16 eval NHWC",
     "BM_Copy", 0.9, "bw"),
    ("BM_HalfBatchNorm/train:1/channels_last:0", "BatchNorm bf16 train NCHW",
     "BM_Copy", 1.5, "time"),
    ("BM_HalfBatchNorm/train:1/channels_last:1", "BatchNorm bf16 train NHWC",
     "BM_Copy", 1.5, "time"),
    ("BM_HalfFit/channels_last:0", "Fit bf16 NCHW", "BM_ReadSum", 0.9, "bw"),
    ("BM_HalfFit/channels_last:1", "Fit bf16 NHWC", "BM_ReadSum", 0.9, "bw"),
    # Eval with drift observation against eval alone, paired iteration by
    # iteration (the baseline column is that eval's time).
    ("BM_BatchNormObserved/channels_last:0", "BatchNorm eval + drift NCHW",
     "BM_BatchNorm/train:0/channels_last:0", 1.15, "time"),
    ("BM_BatchNormObserved/channels_last:1", "BatchNorm eval + drift NHWC",
     "BM_BatchNorm/train:0/channels_last:1", 1.15, "time"),
    ("BM_HalfBatchNormObserved/channels_last:0",
     "BatchNorm bf16 eval + drift NCHW",
     "BM_HalfBatchNorm/train:0/channels_last:0", 1.15, "time"),
    ("BM_HalfBatchNormObserved/channels_last:1",
     "BatchNorm bf16 eval + drift NHWC",
     "BM_HalfBatchNorm/train:0/channels_last:1", 1.15, "time"),
]


def short_name(run_name):
    return run_name.replace("/real_time", "").replace("/manual_time", "")


def medians(path):
    """Median time (s) per benchmark, and its paired baseline ratios: a list
    of (kernel s, baseline s) per repetition, or one pair of medians."""
    data = json.load(open(path))
    times, pairs, median_pairs = {}, {}, {}
    for b in data["benchmarks"]:
        name = short_name(b["run_name"])
        if b.get("error_occurred"):
            continue
        if b.get("aggregate_name") == "median":
            times[name] = b["real_time"] * 1e-9
            if "baseline_s" in b:
                median_pairs[name] = [(b["real_time"] * 1e-9, b["baseline_s"])]
        elif b.get("run_type", "iteration") == "iteration" and "baseline_s" in b:
            pairs.setdefault(name, []).append(
                (b["real_time"] * 1e-9, b["baseline_s"]))
    for name, p in median_pairs.items():
        pairs.setdefault(name, p)
    return times, pairs


# The AVX2 time of a kernel row over its AVX-512 (AVX3) time, each AVX2
# iteration paired with an AVX3 one in the same process (kernel_bench's
# counter avx2_s): at most this for fp32 rows, and for 16-bit rows (names
# with "Half").
AVX2_FP32_TARGET = 1.3
AVX2_HALF_TARGET = 1.6


def target_table(path):
    """Per row: the median over repetitions of AVX2 / AVX3 time. Returns the
    number of rows over their target, or None without paired targets."""
    data = json.load(open(path))
    ratios, first, second = {}, {}, {}
    for b in data["benchmarks"]:
        if (b.get("error_occurred") or "avx2_s" not in b or
                b.get("run_type", "iteration") != "iteration"):
            continue
        name = short_name(b["run_name"])
        ratios.setdefault(name, []).append(b["avx2_s"] / (b["real_time"] * 1e-9))
        first.setdefault(name, []).append(b["real_time"] * 1e-6)
        second.setdefault(name, []).append(b["avx2_s"] * 1e3)
    if not ratios:
        return None
    print(f"{'row (64 MiB, 2 threads)':44} {'avx3 ms':>8} {'avx2 ms':>8} "
          f"{'avx2/avx3':>9} {'target':>7}")
    misses = 0
    for name, r in ratios.items():
        ratio = statistics.median(r)
        target = AVX2_HALF_TARGET if "Half" in name else AVX2_FP32_TARGET
        ok = ratio <= target
        misses += not ok
        print(f"{name:44} {statistics.median(first[name]):8.2f} "
              f"{statistics.median(second[name]):8.2f} {ratio:9.2f} "
              f"{'<=' + str(target):>7}{'' if ok else '  MISS'}")
    print(f"{misses} of {len(ratios)} rows over their AVX2 target")
    return misses


def main():
    normd, paired = medians(sys.argv[1])
    # LayerNorm rows of D floats fill 64 MiB only up to a multiple of D.
    elements = (64 << 20) // 4
    sizes = {f"{kernel}/{d}": (elements // d * d) / elements
             for kernel in ("BM_LayerNorm", "BM_RmsNorm", "BM_L2Norm")
             for d in (768, 4096)}
    torch = json.load(open(sys.argv[2]))
    print(f"{'case (64 MiB, 2 threads; fp32 unless named)':34} {'normd ms':>9} "
          f"{'vs baseline':>18} {'target':>8} {'torch ms':>9} "
          f"{'torch/normd':>11}")
    misses = 0
    for name, what, base, target, kind in ROWS:
        t = normd.get(name)
        if t is None:
            continue
        pairs = paired.get(name) or [(t, normd[base])]
        if kind == "bw":
            ratio = statistics.median(b / k for k, b in pairs) * sizes.get(
                name, 1.0)
            shown = f"{ratio:.2f}x {'copy' if base == 'BM_Copy' else 'sum'} bw"
            ok = ratio >= target
            goal = f">={target}"
        else:
            ratio = statistics.median(k / b for k, b in pairs)
            against = "copy" if base == "BM_Copy" else "eval"
            shown = f"{ratio:.2f}x {against} time"
            ok = ratio <= target
            goal = f"<={target}"
        tt = torch.get(name)
        speedup = f"{tt / t:.2f}x" if tt else "-"
        torch_ms = f"{tt * 1e3:.2f}" if tt else "-"  # torch has no Fit.
        misses += not ok
        print(f"{what:34} {t * 1e3:9.2f} {shown:>18} {goal:>8} "
              f"{torch_ms:>9} {speedup:>11}{'' if ok else '  MISS'}")
    print(f"baselines: copy {normd['BM_Copy'] * 1e3:.2f} ms "
          f"({64 / 1024 / normd['BM_Copy']:.1f} GiB/s), read-only sum "
          f"{normd['BM_ReadSum'] * 1e3:.2f} ms; torch copy "
          f"{torch['BM_Copy'] * 1e3:.2f} ms")
    if "BM_StreamCopy" in normd and "BM_TwoPassFloor" in normd:
        print(f"reference: streaming-store copy "
              f"{normd['BM_StreamCopy'] * 1e3:.2f} ms; two-pass floor over "
              f"4 MiB samples {normd['BM_TwoPassFloor'] * 1e3:.2f} ms")
    unaligned = normd.get("BM_LayerNormUnaligned/768")
    if unaligned and "BM_LayerNorm/768" in normd:
        print(f"reference: LayerNorm [B,T,768] into an output 16 bytes past a "
              f"cache line (malloc's) {unaligned * 1e3:.2f} ms, "
              f"{unaligned / normd['BM_LayerNorm/768']:.2f}x the aligned time")
    affine = paired.get("BM_HalfLayerNormAffine")
    if affine:
        ratio = statistics.median(b / k for k, b in affine)
        print(f"reference: LayerNorm bf16 [B,T,4096] with weight and bias "
              f"{normd['BM_HalfLayerNormAffine'] * 1e3:.2f} ms, "
              f"{ratio:.2f}x copy bw")
    requests = [(paired.get(f"BM_HalfRequests/rows:{r}"), what)
                for r, what in ((0, "GroupNorm(32) NCHW"),
                                (1, "LayerNorm [B,T,4096]"))]
    if all(p for p, _ in requests):
        print("reference: bf16 as 16 requests of 4 MiB (ordinary stores): " +
              ", ".join(f"{what} {statistics.median(b / k for k, b in p):.2f}x"
                        for p, what in requests) + " copy bw")
    print(f"{misses} of {len(ROWS)} kernel targets missed")
    print()
    if target_table(sys.argv[1]) is None:
        print("no per-target rows: the CPU lacks AVX-512 or AVX2, or "
              "NORMD_SIMD_TARGET picked one")
    if len(sys.argv) > 3:
        print()
        service_table(json.load(open(sys.argv[3])))


# (case, label, numerator, denominator, target): ratio of medians.
SERVICE_ROWS = [
    ("ln_4mib_unary_4", "LayerNorm 4 MiB, 4 in flight", "normd", "echo", 0.9),
    ("ln_768_unary_16", "LayerNorm [1,768], 16 in flight", "normd", "echo",
     0.9),
    ("bn_eval_4mib_unary_4", "BatchNorm eval 4 MiB NCHW, 4 in flight",
     "normd", "echo", 0.9),
    ("ln_768_unary_16", "LayerNorm [1,768] vs Python peer", "normd", "peer",
     5.0),
    ("ln_4mib_unary_4", "LayerNorm 4 MiB vs Python peer", "normd", "peer",
     2.0),
    ("bn_eval_4mib_unary_4", "BatchNorm eval 4 MiB vs Python peer", "normd",
     "peer", 2.0),
    # Drift observation's cost through the service (api.md, "Drift").
    ("bn_eval_4mib_unary_4", "BatchNorm eval observed vs not, 4 MiB",
     "normd_drift", "normd", None),
    ("ln_4mib_unary_4", "OIP gRPC raw vs native, LayerNorm 4 MiB", "oip",
     "normd", 0.95),
    ("ln_768_unary_16", "OIP gRPC raw vs native, [1,768]", "oip", "normd",
     0.9),
    # The REST forms against native gRPC (api.md, "The front door").
    ("ln_4mib_unary_4", "OIP REST binary vs native, 4 MiB", "rest_binary",
     "normd", 0.8),
    ("ln_768_unary_16", "OIP REST JSON vs native, [1,768]", "rest_json",
     "normd", 0.6),
]


def paired_ratio(num, den):
    """The median of the per-repetition ratios num / den when both servers
    ran every repetition (service_bench.py runs them in turn within each), so
    that drift between repetitions cancels; else the ratio of the medians."""
    a, b = num.get("runs"), den.get("runs")
    if a and b and len(a) == len(b):
        return statistics.median(x / y for x, y in zip(a, b))
    return num["median"] / den["median"]


def service_table(service):
    cases = service["cases"]
    print(f"{'service (loopback, fp32)':40} {'normd':>10} {'baseline':>10} "
          f"{'ratio':>7} {'target':>7}  p50/p99 ms (normd)")
    misses = 0
    rows = list(SERVICE_ROWS)
    rows.append(("ln_768_stream_16", "NormalizeStream [1,768] vs unary",
                 "stream", "unary", 2.0))
    for case, label, num, den, target in rows:
        c = cases[case]
        unit = "QPS" if c["metric"] == "qps" else "MB/s"
        if num == "stream":
            # Two cases, run minutes apart: not paired.
            n, d = c["normd"], cases["ln_768_unary_16"]["normd"]
            base = "unary"
            ratio = n["median"] / d["median"]
        elif num not in c or den not in c:
            continue  # A run from before this row's server was measured.
        else:
            n, d = c[num], c[den]
            base = den
            ratio = paired_ratio(n, d)
        ok = target is None or ratio >= target
        misses += not ok
        print(f"{label:40} {n['median']:>10.0f} {d['median']:>10.0f} "
              f"{ratio:>6.2f}x "
              f"{'report' if target is None else '>=' + str(target):>7}  "
              f"{n['p50_us'] / 1e3:.2f}/{n['p99_us'] / 1e3:.2f}  "
              f"({unit}; baseline {base}){'' if ok else '  MISS'}")
    print(f"{misses} of {sum(r[4] is not None for r in rows)} service "
          "targets missed")
    for name, m in service["memory"].items():
        print(f"memory {name:6}: idle RSS {m['idle_rss_mb']:.0f} MB, peak "
              f"{m['peak_rss_mb']:.0f} MB, {m['growth_per_mb_in_flight']:.2f}"
              f" MB of peak RSS growth per MB in flight (4 MiB x 4 calls)")


if __name__ == "__main__":
    main()
