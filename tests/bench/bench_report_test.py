#!/usr/bin/python3
"""bench/report.py's ratios, and kernel_bench's paired baselines behind them.

1. Hand-worked JSON: a kernel's ratio to its baseline is the median of each
   repetition's own ratio (kernel_bench's counter baseline_s beside its
   time), not the ratio of the two medians; JSON with only aggregates gives
   the ratio of medians; JSON without baseline_s (older runs) the
   standalone baseline's median.
2. A short real kernel_bench run (Fit and LayerNorm, 3 repetitions): every
   kernel repetition carries a positive baseline_s, and the report prints
   the median of the per-repetition ratios computed here from the same JSON.

No timing is asserted: only that the report computes what the JSON holds.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile


class CheckFailed(Exception):
    """A failed check (raised by expect, which `python3 -O` keeps, unlike
    assert)."""


def expect(condition, what=""):
    if not condition:
        raise CheckFailed(what if isinstance(what, str) else repr(what))


def report(report_py, kernel_json, torch_json):
    out = subprocess.run(
        [sys.executable, report_py, kernel_json, torch_json],
        check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        m = re.match(r"(.+?)\s{2,}([\d.]+)\s+([\d.]+)x (copy bw|sum bw|copy time)",
                     line)
        if m:
            rows[m.group(1).strip()] = (float(m.group(2)), float(m.group(3)))
    return out, rows


def entry(name, ms, kind="iteration", aggregate=None, baseline_ms=None):
    e = {"name": name, "run_name": name, "run_type": kind,
         "real_time": ms * 1e6, "time_unit": "ns"}
    if aggregate:
        e["aggregate_name"] = aggregate
    if baseline_ms is not None:
        e["baseline_s"] = baseline_ms * 1e-3
    return e


def write(tmp, name, data):
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def check_hand_worked(report_py, tmp):
    torch = write(tmp, "torch.json", {"BM_Copy": 0.004})
    fit = "BM_Fit/channels_last:0/manual_time"
    train = "BM_BatchNorm/train:1/channels_last:0/manual_time"
    standalone = [entry("BM_Copy/real_time", 3.0, "aggregate", "median"),
                  entry("BM_ReadSum/real_time", 1.0, "aggregate", "median")]
    # Fit: kernel 2, 4, 8 ms beside baselines 1, 1, 6 ms: ratios 0.5, 0.25,
    # 0.75, median 0.50 (the ratio of the medians, 1/4, would be 0.25).
    # BatchNorm train (time ratio): 6, 4, 9 ms beside 3, 4, 3: 2, 1, 3 -> 2.
    reps = [entry(fit, k, baseline_ms=b) for k, b in ((2, 1), (4, 1), (8, 6))]
    reps += [entry(train, k, baseline_ms=b) for k, b in ((6, 3), (4, 4), (9, 3))]
    medians = [entry(fit, 4, "aggregate", "median", 1),
               entry(train, 6, "aggregate", "median", 3)]
    _, rows = report(report_py, write(tmp, "paired.json", {
        "benchmarks": standalone + reps + medians}), torch)
    expect(rows["Fit NCHW"] == (4.0, 0.5), rows)
    expect(rows["BatchNorm train NCHW"] == (6.0, 2.0), rows)
    # Only aggregates: the ratio of the medians (1 / 4, 6 / 3).
    _, rows = report(report_py, write(tmp, "aggregates.json", {
        "benchmarks": standalone + medians}), torch)
    expect(rows["Fit NCHW"] == (4.0, 0.25), rows)
    expect(rows["BatchNorm train NCHW"] == (6.0, 2.0), rows)
    # No paired baseline: the standalone medians (read-only sum 1 ms, copy 3).
    old = [entry("BM_Fit/channels_last:0/real_time", 2, "aggregate", "median"),
           entry("BM_BatchNorm/train:1/channels_last:0/real_time", 4.5,
                 "aggregate", "median")]
    _, rows = report(report_py, write(tmp, "old.json", {
        "benchmarks": standalone + old}), torch)
    expect(rows["Fit NCHW"] == (2.0, 0.5), rows)
    expect(rows["BatchNorm train NCHW"] == (4.5, 1.5), rows)
    # The unaligned-output reference: its median against the aligned run's
    # (5 / 4 ms = 1.25x), printed only when both are there.
    rows_768 = [entry("BM_LayerNorm/768/manual_time", 4, "aggregate",
                      "median", 3)]
    unaligned = [entry("BM_LayerNormUnaligned/768/manual_time", 5,
                       "aggregate", "median", 3)]
    text, _ = report(report_py, write(tmp, "unaligned.json", {
        "benchmarks": standalone + rows_768 + unaligned}), torch)
    expect(("16 bytes past a cache line (malloc's) 5.00 ms, 1.25x the "
            "aligned time") in text, text)
    text, _ = report(report_py, write(tmp, "no_unaligned.json", {
        "benchmarks": standalone + rows_768}), torch)
    expect("16 bytes past" not in text, text)
    # The bf16 LayerNorm with weight and bias: the median of its paired
    # ratios (2 / 4, 3 / 4, 3 / 5: 0.60), its own median time.
    name = "BM_HalfLayerNormAffine/manual_time"
    affine = [entry(name, k, baseline_ms=b) for k, b in ((4, 2), (4, 3), (5, 3))]
    affine.append(entry(name, 4, "aggregate", "median", 3))
    text, _ = report(report_py, write(tmp, "affine.json", {
        "benchmarks": standalone + affine}), torch)
    expect(("LayerNorm bf16 [B,T,4096] with weight and bias 4.00 ms, 0.60x "
            "copy bw") in text, text)
    # bf16 as 16 requests of 4 MiB: each case's median paired ratio
    # (GroupNorm 4 / 8, 6 / 10, 9 / 9: 0.60; LayerNorm 4 / 5, 4 / 4, 2 / 8:
    # 0.80), printed only when both cases are there.
    def requests(rows, reps):
        name = f"BM_HalfRequests/rows:{rows}/manual_time"
        return ([entry(name, k, baseline_ms=b) for k, b in reps] +
                [entry(name, statistics.median(k for k, _ in reps),
                       "aggregate", "median", 4)])
    group = requests(0, ((8, 4), (10, 6), (9, 9)))
    rows_case = requests(1, ((5, 4), (4, 4), (8, 2)))
    text, _ = report(report_py, write(tmp, "requests.json", {
        "benchmarks": standalone + group + rows_case}), torch)
    expect(("reference: bf16 as 16 requests of 4 MiB (ordinary stores): "
            "GroupNorm(32) NCHW 0.60x, LayerNorm [B,T,4096] 0.80x copy bw"
            ) in text, text)
    text, _ = report(report_py, write(tmp, "one_request.json", {
        "benchmarks": standalone + group}), torch)
    expect("16 requests" not in text, text)


def check_service_pairing(report_py, tmp):
    """Service rows: the median of each repetition's normd / baseline ratio
    (the servers take turns within a repetition), not the ratio of medians;
    NormalizeStream against unary (two cases, not interleaved): the ratio of
    the medians."""
    def server(runs):
        return {"median": statistics.median(runs), "p50_us": 100.0,
                "p99_us": 200.0, "runs": runs}
    # normd 90, 100, 130 beside echo 100, 140, 120: ratios 0.90, 0.714,
    # 1.083, median 0.90 (the medians' ratio: 100 / 120 = 0.83).
    four_mib = {"metric": "mb_per_s", "normd": server([90, 100, 130]),
                "echo": server([100, 140, 120]),
                "peer": server([40, 50, 45]),
                "oip": server([85, 100, 117]),
                "rest_binary": server([45, 40, 65])}
    small = {"metric": "qps", "normd": server([1000, 1000, 1000]),
             "echo": server([1000, 1000, 1000]),
             "peer": server([100, 100, 100]),
             "oip": server([950, 900, 1000]),
             "rest_json": server([700, 600, 800])}
    # The drift row: observed 81, 100, 117 beside 90, 100, 130: 0.9, 1.0,
    # 0.9 -> 0.90, reported without a target.
    batch_norm = dict(four_mib, normd_drift=server([81, 100, 117]))
    stream = {"metric": "qps", "normd": server([1500, 2500, 2100]),
              "echo": server([3000, 3000, 3000])}
    service = write(tmp, "service.json", {
        "cases": {"ln_4mib_unary_4": four_mib, "ln_768_unary_16": small,
                  "bn_eval_4mib_unary_4": batch_norm,
                  "ln_768_stream_16": stream},
        "memory": {}})
    kernel = write(tmp, "kernel_min.json", {"benchmarks": [
        entry("BM_Copy/real_time", 3.0, "aggregate", "median"),
        entry("BM_ReadSum/real_time", 1.0, "aggregate", "median")]})
    torch = write(tmp, "torch_min.json", {"BM_Copy": 0.004})
    text = subprocess.run(
        [sys.executable, report_py, kernel, torch, service], check=True,
        capture_output=True, text=True).stdout
    line = next(l for l in text.splitlines()
                if l.startswith("LayerNorm 4 MiB, 4 in flight"))
    expect(" 0.90x " in line, text)
    line = next(l for l in text.splitlines()
                if l.startswith("LayerNorm 4 MiB vs Python peer"))
    # 90 / 40, 100 / 50, 130 / 45: 2.25, 2.00, 2.89 -> 2.25.
    expect(" 2.25x " in line, text)
    # The OIP against native normd: 85 / 90, 100 / 100, 117 / 130 ->
    # 0.944, 1.0, 0.9 -> 0.94; 0.95, 0.9, 1.0 -> 0.95.
    line = next(l for l in text.splitlines()
                if l.startswith("OIP gRPC raw vs native, LayerNorm 4 MiB"))
    expect(" 0.94x " in line and "MISS" in line, text)
    line = next(l for l in text.splitlines()
                if l.startswith("OIP gRPC raw vs native, [1,768]"))
    expect(" 0.95x " in line and "MISS" not in line, text)
    # REST against native gRPC, paired: 45 / 90, 40 / 100, 65 / 130 ->
    # 0.5, 0.4, 0.5 -> 0.50, under its 0.8; 0.7, 0.6, 0.8 -> 0.70, over its
    # 0.6.
    line = next(l for l in text.splitlines()
                if l.startswith("OIP REST binary vs native, 4 MiB"))
    if not (" 0.50x " in line and ">=0.8" in line and "MISS" in line):
        raise AssertionError(text)
    line = next(l for l in text.splitlines()
                if l.startswith("OIP REST JSON vs native, [1,768]"))
    if not (" 0.70x " in line and ">=0.6" in line and "MISS" not in line):
        raise AssertionError(text)
    line = next(l for l in text.splitlines()
                if l.startswith("BatchNorm eval observed vs not, 4 MiB"))
    expect(" 0.90x " in line and "report" in line and "MISS" not in line,
           text)
    line = next(l for l in text.splitlines()
                if l.startswith("NormalizeStream [1,768] vs unary"))
    expect(" 2.10x " in line, text)  # 2100 / 1000.


def check_real_run(kernel_bench, report_py, tmp):
    out = os.path.join(tmp, "kernel.json")
    subprocess.run(
        [kernel_bench,
         "--benchmark_filter=^BM_(Copy|ReadSum|Fit/channels_last:0|"
         "LayerNorm/4096)/",
         "--benchmark_repetitions=3", "--benchmark_min_time=0.01",
         "--benchmark_display_aggregates_only=true",
         "--benchmark_format=json", f"--benchmark_out={out}"],
        check=True, capture_output=True, env=dict(os.environ,
                                                  NORMD_BENCH_THREADS="2"))
    data = json.load(open(out))["benchmarks"]
    expected = {}
    for name, what, kind in (
            ("BM_Fit/channels_last:0/manual_time", "Fit NCHW", "bw"),
            ("BM_LayerNorm/4096/manual_time", "LayerNorm [B,T,4096]", "bw")):
        reps = [b for b in data
                if b["run_name"] == name and b["run_type"] == "iteration"]
        expect(len(reps) == 3, (name, reps))
        expect(all(b["baseline_s"] > 0 for b in reps), reps)
        expected[what] = statistics.median(
            b["baseline_s"] / (b["real_time"] * 1e-9) for b in reps)
    torch = write(tmp, "torch.json", {"BM_Copy": 0.004})
    text, rows = report(report_py, out, torch)
    for what, ratio in expected.items():
        expect(what in rows, text)
        expect(abs(rows[what][1] - ratio) <= 0.005 + 1e-9, (what, ratio, text))
    print(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kernel_bench", required=True)
    parser.add_argument("--report", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        check_hand_worked(args.report, tmp)
        check_service_pairing(args.report, tmp)
        check_real_run(args.kernel_bench, args.report, tmp)
    print("bench report: OK")


if __name__ == "__main__":
    main()
