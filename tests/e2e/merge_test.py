#!/usr/bin/python3
"""Mergeable statistics across servers: data fitted in parts on three normd
servers, then merged into one with `normctl merge` (straight from another
server with --from, and through an exported JSON file), equals fitting all of
it on a fourth server: pooled mean and variance within 1e-12 relative of the
fp64 reference and of the one-server model, counts exact; for a
cumulative_average model the running statistics too. `normctl export` and
`import` copy a model between servers bit for bit (and rename it);
create_only refuses to overwrite.

Usage: merge_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
args = normd_process.parse_test_args(__doc__, required=("normctl",))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client",
                                "python"))

import normd  # noqa: E402

failures = []
C = 4


def check(condition, what):
    if not condition:
        failures.append(what)


def normctl(server, *argv):
    done = subprocess.run([args.normctl, f"--server={server}", *argv],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.abs(want)))


def batches_of_part(part, count):
    """[16, C, 5] batches; each part has its own offset and spread, so the
    parts' means differ by far more than their spreads."""
    rng = np.random.default_rng(10 + part)
    return [rng.standard_normal((16, C, 5)) * (1 + part) + 1e3 * (part + 1)
            for _ in range(count)]


def parts_merge_to_the_whole(targets, clients, every, tmp):
    """Model m's parts on servers 1 and 2 merged into server 0's, straight
    from a server and through an exported JSON file (normctl); cma's with
    the Python client: the pooled statistics equal fp64 over every batch
    and one server's that fitted them all, and cma's cumulative running
    statistics equal that server's too. The exported file's path."""
    # m: server 1 merged straight from its server; server 2 through
    # an exported file.
    code, out, err = normctl(targets[0], "merge", "--model=m",
                             f"--from={targets[1]}")
    check(code == 0, f"normctl merge --from: {code} {err}")
    state_file = os.path.join(tmp, "m-part2.json")
    code, out, err = normctl(targets[2], "export", "--model=m",
                             f"--state_file={state_file}")
    check(code == 0, f"normctl export: {code} {err}")
    exported = json.load(open(state_file))
    check(len(exported.get("pooled_m2", [])) == C,
          f"exported JSON carries pooled_m2: {sorted(exported)}")
    code, out, err = normctl(targets[0], "--json", "merge",
                             "--model=m", f"--state_file={state_file}")
    check(code == 0, f"normctl merge --state_file: {code} {err}")
    check(code != 0 or json.loads(out)["sample_count"] ==
        10 * 16 * 5, f"merge prints the merged model: {out[:200]}")
    # cma: with the Python client.
    for p in (1, 2):
        clients[0].merge_model("cma", clients[p].export_model("cma"))

    reference = np.concatenate([b.transpose(1, 0, 2).reshape(C, -1)
                                for b in every], axis=1)
    ref_mean = reference.astype(np.longdouble).mean(axis=1)
    ref_var = ((reference - ref_mean[:, None]) ** 2).mean(axis=1)
    for name in ("m", "cma"):
        merged = clients[0].export_model(name)
        whole = clients[3].export_model(name)
        check(merged.num_batches_tracked == 10 ==
              whole.num_batches_tracked,
              f"{name}: num_batches_tracked {merged.num_batches_tracked}"
              f" vs {whole.num_batches_tracked}")
        check(merged.sample_count == 10 * 16 * 5 ==
              whole.sample_count,
              f"{name}: sample_count {merged.sample_count}")
        for what, got, want in (
                ("mean vs fp64", merged.mean, ref_mean),
                ("var vs fp64", merged.var, ref_var),
                ("mean vs one server", merged.mean, whole.mean),
                ("var vs one server", merged.var, whole.var)):
            err = rel(got, want)
            print(f"{name} pooled {what}: max relative error "
                  f"{err:.3g}")
            check(err <= 1e-12, f"{name} pooled {what}: {err:.3g}")
    merged = clients[0].export_model("cma")
    whole = clients[3].export_model("cma")
    for field in ("running_mean", "running_var"):
        err = rel(getattr(merged, field), getattr(whole, field))
        print(f"cma {field} vs one server: {err:.3g}")
        check(err <= 1e-12, f"cma {field}: {err:.3g}")
    return state_file


def models_copy_exactly_between_servers(targets, clients, state_file):
    """import --from another server, and --state_file: bit for bit, the
    generation kept, renamed; --create_only refuses a taken name."""
    # export/import between servers: bit for bit, renamed.
    code, out, err = normctl(targets[3], "import", "--model=m-copy",
                             f"--from={targets[0]}", "--from_model=m")
    check(code == 0, f"normctl import --from: {code} {err}")
    copy = clients[3].export_model("m-copy")
    original = clients[0].export_model("m")
    for field in ("running_mean", "running_var", "mean", "var",
                  "pooled_m2", "weight", "bias"):
        check(np.array_equal(getattr(copy, field),
                             getattr(original, field)),
              f"import --from: {field} differs")
    check(copy.generation == original.generation,
          f"import keeps the generation: {copy.generation}")
    code, out, err = normctl(targets[1], "import",
                             f"--state_file={state_file}",
                             "--create_only")
    check(code == 1 and "ALREADY_EXISTS" in err,
          f"import --create_only over m: {code} {err}")
    code, out, err = normctl(targets[1], "import",
                             f"--state_file={state_file}",
                             "--model=from-file")
    check(code == 0, f"normctl import --state_file: {code} {err}")
    from_file = clients[1].export_model("from-file")
    part2 = clients[2].export_model("m")
    check(np.array_equal(from_file.pooled_m2, part2.pooled_m2) and
          np.array_equal(from_file.running_var, part2.running_var),
          "JSON file round trip is exact")


def bad_sources_are_refused(targets, tmp):
    """A merge without a source, a missing file, an unreachable server, a
    missing model and a malformed file: each its exit code and a message
    naming what is wrong."""
    code, out, err = normctl(targets[1], "merge", "--model=m")
    check(code == 2 and "give one of --state_file, --from"
          in err, f"merge without a source: {code} {err}")
    code, out, err = normctl(targets[1], "import",
                             "--state_file=/nonexistent/m.json")
    check(code == 2 and "--state_file" in err,
          f"import of a missing file: {code} {err}")
    code, out, err = normctl(targets[1], "merge", "--model=m",
                             "--from=127.0.0.1:1",
                             "--connect_timeout=1s")
    check(code == 3 and "cannot reach --from" in err,
          f"merge --from an unreachable server: {code} {err}")
    code, out, err = normctl(targets[1], "merge", "--model=m",
                             f"--from={targets[2]}",
                             "--from_model=nobody")
    check(code == 1 and "NOT_FOUND" in err and targets[2] in err,
          f"merge --from a missing model: {code} {err}")
    bad = os.path.join(tmp, "bad.json")
    with open(bad, "w") as f:
        f.write("{\"num_features\": \"x\"}")
    code, out, err = normctl(targets[1], "merge", "--model=m",
                             f"--state_file={bad}")
    check(code == 2 and "not a model state" in err,
          f"merge of a malformed file: {code} {err}")


def main():
    servers = [normd_process.start_normd(args.normd) for _ in range(4)]
    targets = [f"127.0.0.1:{port}" for _, port, _ in servers]
    clients = [normd.Client(t) for t in targets]
    parts = [batches_of_part(p, n) for p, n in enumerate((3, 5, 2))]
    every = [b for part in parts for b in part]
    try:
        # Parts on servers 0-2; everything on server 3.
        for name, momentum in (("m", 0.1), ("cma", None)):
            for c in clients:
                c.create_model(name, C, momentum=momentum)
        for p, part in enumerate(parts):
            for b in part:
                for name in ("m", "cma"):
                    clients[p].fit(name, b)
        for b in every:
            for name in ("m", "cma"):
                clients[3].fit(name, b)
        with tempfile.TemporaryDirectory() as tmp:
            state_file = parts_merge_to_the_whole(targets, clients, every, tmp)
            models_copy_exactly_between_servers(targets, clients, state_file)
            bad_sources_are_refused(targets, tmp)
    finally:
        for c in clients:
            c.close()
        for proc, _, _ in servers:
            proc.terminate()
            proc.wait(timeout=60)
    return normd_process.report(failures, "merge across servers")


if __name__ == "__main__":
    sys.exit(main())
