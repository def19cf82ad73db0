#!/usr/bin/env python3
"""Old against new: two builds of bench/incache_bench run in turns.

Each round times every row with the old binary and then the new one, row
by row (the order alternates between rounds), so that the two runs of a row
are seconds apart and drift in the shared machine's speed falls on both.
The table gives each row's median over the rounds for both, the median
of the per-round ratios new/old, and the ratio of the two builds' fastest
rounds: the shared machine's noise only ever slows a run down, so the
fastest rounds are the two builds' closest to undisturbed, and that ratio
moves less between runs of the script than the median does.

  bench/old_vs_new.py --baseline=REV [--rounds=7] [--filter=REGEX]
      builds incache_bench at git revision REV (with this checkout's
      bench/incache_bench.cc, so that the rows are the same) in
      build/baseline-REV, and compares it with build/bench/incache_bench.
  bench/old_vs_new.py --old=BIN --new=BIN ...
      compares two binaries built already.

--max_ratio=R exits 1 when a row's median ratio exceeds R. Single thread,
in cache (see incache_bench.cc); NORMD_SIMD_TARGET applies to both.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_baseline(rev):
    """Builds incache_bench at `rev`; returns the binary's path."""
    short = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", rev],
                           check=True, capture_output=True,
                           text=True).stdout.strip()
    tree = os.path.join(ROOT, "build", f"baseline-{short}")
    if not os.path.isdir(tree):
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach",
                        tree, short], check=True)
    shutil.copy(os.path.join(ROOT, "bench", "incache_bench.cc"),
                os.path.join(tree, "bench", "incache_bench.cc"))
    # The baseline's own bench/CMakeLists.txt, plus this checkout's
    # incache_bench target if it has none: today's whole file links
    # libraries an old tree does not look for.
    lists = os.path.join(tree, "bench", "CMakeLists.txt")
    subprocess.run(["git", "-C", tree, "checkout", "--", "bench/CMakeLists.txt"],
                   check=True)
    with open(lists) as f:
        baseline_lists = f.read()
    if "add_executable(incache_bench" not in baseline_lists:
        with open(os.path.join(ROOT, "bench", "CMakeLists.txt")) as f:
            ours = f.read()
        start = ours.index("add_executable(incache_bench")
        end = ours.index(")", ours.index("target_link_libraries(incache_bench"))
        with open(lists, "a") as f:
            f.write("\n" + ours[start:end + 1] + "\n")
    build = os.path.join(tree, "build")
    subprocess.run(["cmake", "-S", tree, "-B", build], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", "incache_bench",
                    "-j", str(os.cpu_count() or 2)], check=True,
                   stdout=subprocess.DEVNULL)
    return os.path.join(build, "bench", "incache_bench")


def run(binary, args, row_filter):
    """Returns {row: ns per value} of one run of the rows row_filter picks."""
    out = subprocess.run(
        [binary, "--benchmark_format=json",
         f"--benchmark_min_time={args.min_time}",
         f"--benchmark_filter={row_filter}"],
        check=True, capture_output=True, text=True).stdout
    rows = {}
    for bench in json.loads(out)["benchmarks"]:
        rows[bench["name"]] = bench["ns_per_value"] * 1e9
    return rows


def row_names(binary, args):
    out = subprocess.run(
        [binary, "--benchmark_list_tests", f"--benchmark_filter={args.filter}"],
        check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", help="git revision of the old build")
    parser.add_argument("--old", help="old incache_bench binary")
    parser.add_argument("--new", default=os.path.join(
        ROOT, "build", "bench", "incache_bench"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min_time", type=float, default=0.2)
    parser.add_argument("--filter", default=".")
    parser.add_argument("--max_ratio", type=float)
    args = parser.parse_args()
    if (args.baseline is None) == (args.old is None):
        parser.error("give --baseline=REV or --old=BIN")
    old = args.old or build_baseline(args.baseline)
    names = [n for n in row_names(args.new, args)
             if n in set(row_names(old, args))]
    runs = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for which in order:
            runs[which].append({})
        for name in names:
            for which in order:
                binary = old if which == "old" else args.new
                runs[which][-1].update(
                    run(binary, args, "^" + re.escape(name) + "$"))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"| row | old ns/value | new ns/value | new/old (median of "
          f"{args.rounds}) | fastest new / fastest old |")
    print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for name in runs["old"][0]:
        if name not in runs["new"][0]:
            continue
        old_ns = [run_[name] for run_ in runs["old"]]
        new_ns = [run_[name] for run_ in runs["new"]]
        ratio = statistics.median(n / o for n, o in zip(new_ns, old_ns))
        worst = max(worst, ratio)
        print(f"| {name} | {statistics.median(old_ns):.3f} | "
              f"{statistics.median(new_ns):.3f} | {ratio:.3f} | "
              f"{min(new_ns) / min(old_ns):.3f} |")
    if args.max_ratio is not None and worst > args.max_ratio:
        print(f"worst ratio {worst:.3f} > {args.max_ratio}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
