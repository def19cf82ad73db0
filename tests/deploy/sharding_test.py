#!/usr/bin/python3
"""Model-sharded replicas behind HAProxy (deploy/haproxy/haproxy.cfg), on
loopback: three normd replicas, each with its own --state_dir, and Debian's
HAProxy routing on the x-normd-model header that the clients send.

1. 30 models x Fits from several clients through the proxy: each model's
   state exists on exactly one replica and its num_batches_tracked equals the
   acknowledged Fits; responses name their replica (x-normd-replica);
   LayerNorm (no header) spreads over all replicas (per-replica metrics).
2. One replica is killed (SIGKILL) while the clients keep fitting (until
   each of its models has succeeded again): only its models move (the
   fraction is measured), their clients see UNAVAILABLE and then success,
   never another code; the other models never fail or move.
3. It restarts on its state directory: its models' statistics are back
   (every acknowledged Fit) and its models route back to it.
4. The Fits that landed elsewhere meanwhile are folded back with
   `normctl merge --from` through the proxy (and deleted where they were):
   every model is on one replica again with every acknowledged Fit.
5. Checkpoints stay together: `normctl import-checkpoint` through the proxy
   puts each checkpoint's layers (P.<layer>, one group) on one replica, the
   replica every later call of each layer reaches; `normctl list --group`
   and `export-checkpoint` through the proxy see them all and the export
   round-trips bit for bit; a CreateModels call with names of two groups is
   refused with INVALID_ARGUMENT and creates nothing anywhere.

Usage: sharding_test.py --normd BUILD/normd --stubs BUILD/python
         --normctl BUILD/normctl [--haproxy /usr/sbin/haproxy]
         --haproxy_cfg deploy/haproxy/haproxy.cfg
"""

import argparse
import collections
import csv
import io
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--normd", required=True)
parser.add_argument("--stubs", required=True)
parser.add_argument("--normctl", required=True)
parser.add_argument("--haproxy", default="haproxy")
parser.add_argument("--haproxy_cfg", required=True)
args = parser.parse_args()
sys.path.insert(0, args.stubs)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "client",
                                "python"))

import grpc  # noqa: E402

import normd  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

MODELS = [f"model-{i:02d}" for i in range(30)]
CLIENTS = 6
CHECK_INTER = "300ms"  # HAProxy health-check interval (fall 2, rise 2).
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
    return condition


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    failures.append(f"timed out waiting for {what}")
    return False


class Replica:
    """One normd on a fixed port with its own state directory."""

    def __init__(self, index, root):
        self.name = f"normd-{index}"
        self.port = free_port()
        self.http_port = free_port()
        self.state_dir = os.path.join(root, self.name)
        self.proc = None
        self.metrics_port = None

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self.proc, _, self.metrics_port = normd_process.start_normd(
            args.normd, [f"--state_dir={self.state_dir}",
                          f"--http_port={self.http_port}"], port=self.port)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def models(self):
        """name -> num_batches_tracked, asked of this replica directly."""
        with normd.Client(self.target) as c:
            return {m.name: m.num_batches_tracked for m in c.list_models()}

    def handled(self, method):
        """grpc_server_handled_total{grpc_method=method, grpc_code=OK}."""
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/metrics",
            timeout=10).read().decode()
        for line in text.splitlines():
            if (line.startswith("grpc_server_handled_total{") and
                    f'grpc_method="{method}"' in line and
                    'grpc_code="OK"' in line):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


class Proxy:
    """Debian's HAProxy with the repository's configuration."""

    def __init__(self, replicas):
        self.port = free_port()
        self.rest_port = free_port()
        self.stats_port = free_port()
        env = dict(os.environ,
                   NORMD_PROXY_BIND=f"127.0.0.1:{self.port}",
                   NORMD_PROXY_REST_BIND=f"127.0.0.1:{self.rest_port}",
                   NORMD_STATS_BIND=f"127.0.0.1:{self.stats_port}",
                   NORMD_CHECK_INTER=CHECK_INTER)
        for i, r in enumerate(replicas):
            env[f"NORMD_REPLICA_{i}"] = r.target
            env[f"NORMD_REST_REPLICA_{i}"] = f"127.0.0.1:{r.http_port}"
        haproxy = shutil.which(args.haproxy)
        if haproxy is None:
            raise RuntimeError(f"{args.haproxy} not found: apt-get install "
                               "haproxy (make test installs it)")
        self.proc = subprocess.Popen(
            [haproxy, "-db", "-f", args.haproxy_cfg], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.log = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stdout:
            self.log.append(line)

    @property
    def target(self):
        return f"127.0.0.1:{self.port}"

    def server_status(self):
        """server name -> HAProxy's status (UP, DOWN, ...)."""
        try:
            text = urllib.request.urlopen(
                f"http://127.0.0.1:{self.stats_port}/stats;csv",
                timeout=5).read().decode()
        except OSError:
            return {}
        rows = csv.DictReader(io.StringIO(text.lstrip("# ")))
        return {(r["pxname"], r["svname"]): r["status"] for r in rows
                if r["pxname"] in ("normd", "normd_rest") and
                r["svname"].startswith("normd-")}

    def rest(self, method, path, body=None):
        """(status, x-normd-replica) of a REST call through the proxy."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}{path}", data=body,
            method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.headers["x-normd-replica"]
        except urllib.error.HTTPError as e:
            return e.code, e.headers["x-normd-replica"]

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


def batch(rng):
    return rng.standard_normal((4, 3)) * 2 + 5


class FitLoad:
    """CLIENTS threads, each with its own channel to the proxy, fitting the
    models in shuffled rounds; records every outcome with its time."""

    def __init__(self, target, rounds=None, duration=None):
        self.target = target
        self.rounds = rounds
        self.stop_at = None if duration is None else time.monotonic() + duration
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.acked = collections.Counter()
        self.outcomes = collections.defaultdict(list)  # model -> [(t, code)]
        self.threads = [threading.Thread(target=self._run, args=(i,))
                        for i in range(CLIENTS)]

    def start(self):
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stopping.set()
        self.join()

    def join(self):
        for t in self.threads:
            t.join()

    def recovered(self, models, since):
        """Whether each model has an OK after `since` and after its last
        failure."""
        with self.lock:
            for m in models:
                after = [(t, code) for t, code in self.outcomes[m]
                         if t > since]
                if not after or after[-1][1] != grpc.StatusCode.OK:
                    return False
        return True

    def _run(self, index):
        rng = np.random.default_rng(index)
        order = random.Random(index)
        with normd.Client(self.target, timeout=20) as client:
            done = 0
            while not self.stopping.is_set():
                if self.rounds is not None and done >= self.rounds:
                    return
                models = list(MODELS)
                order.shuffle(models)
                for m in models:
                    try:
                        client.fit(m, batch(rng))
                        code = grpc.StatusCode.OK
                    except normd.NormdError as e:
                        code = e.code
                    with self.lock:
                        self.outcomes[m].append((time.monotonic(), code))
                        if code == grpc.StatusCode.OK:
                            self.acked[m] += 1
                done += 1


def placement(replicas, skip=()):
    """model -> [replica names holding it], and (replica, model) -> batches."""
    where = collections.defaultdict(list)
    batches = {}
    for r in replicas:
        if r.name in skip:
            continue
        for m, n in r.models().items():
            where[m].append(r.name)
            batches[(r.name, m)] = n
    return where, batches


def checkpoint_layers(seed, count=8):
    """A state_dict of `count` BatchNorm layers, as numpy float32 / int64."""
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(count):
        layer = f"layer{i // 2}.{i % 2}.bn"
        c = 4 + i
        tensors[f"{layer}.running_mean"] = rng.standard_normal(c).astype(
            np.float32)
        tensors[f"{layer}.running_var"] = (rng.random(c) + 0.5).astype(
            np.float32)
        tensors[f"{layer}.weight"] = rng.standard_normal(c).astype(np.float32)
        tensors[f"{layer}.bias"] = rng.standard_normal(c).astype(np.float32)
        tensors[f"{layer}.num_batches_tracked"] = np.array(seed + i, np.int64)
    return tensors


def normctl(*argv):
    return subprocess.run([args.normctl, *argv], capture_output=True,
                          text=True, timeout=120)


def test_checkpoints(proxy, replicas, tmp):
    prefixes = [f"ckpt{i}" for i in range(6)]
    files = {}
    for i, prefix in enumerate(prefixes):
        files[prefix] = os.path.join(tmp, f"{prefix}.safetensors")
        normd.save_safetensors(files[prefix], checkpoint_layers(i))
        run = normctl(f"--server={proxy.target}", "import-checkpoint",
                      f"--input={files[prefix]}", f"--prefix={prefix}")
        check(run.returncode == 0, f"import-checkpoint {prefix} through the "
                                   f"proxy: {run.stderr}")
    where, _ = placement(replicas)
    home = {}
    for prefix in prefixes:
        layers = sorted(m for m in where if m.startswith(prefix + "."))
        holders = {r for m in layers for r in where[m]}
        check(len(layers) == 8 and len(holders) == 1 and
              all(len(where[m]) == 1 for m in layers),
              f"{prefix}: {len(layers)} layers on {sorted(holders)}, not "
              f"whole on one replica")
        home[prefix] = holders.pop() if len(holders) == 1 else None
    print("checkpoints per replica:",
          dict(collections.Counter(home.values())))
    check(len(set(home.values())) >= 2,
          f"6 checkpoints all hashed to one replica: {home}")
    # Every layer's later calls reach its checkpoint's replica: a Fit
    # through the proxy lands there (num_batches_tracked + 1) and the
    # response names it.
    stub = pb_grpc.NormalizerStub(grpc.insecure_channel(proxy.target))
    by_name = {r.name: r for r in replicas}
    for prefix in prefixes[:3]:
        before = by_name[home[prefix]].models() if home[prefix] else {}
        names = [m for m in before if m.startswith(prefix + ".")]
        for m in names:
            with normd.Client(proxy.target) as client:
                c = client.get_model(m).num_features
                client.fit(m, np.ones((2, c), np.float32))
            _, call = stub.GetModel.with_call(
                pb.GetModelRequest(name=m), timeout=10,
                metadata=[("x-normd-model", m), ("x-normd-group", prefix)])
            replica = dict(call.initial_metadata()).get("x-normd-replica")
            check(replica == home[prefix],
                  f"{m}: answered by {replica}, checkpoint on {home[prefix]}")
        after = by_name[home[prefix]].models() if home[prefix] else {}
        check(names and all(after[m] == before[m] + 1 for m in names),
              f"{prefix}: Fits through the proxy did not all land on "
              f"{home[prefix]}")
    # list --group and export-checkpoint through the proxy see the whole
    # checkpoint; the export is the imported file's statistics, exactly.
    for prefix in prefixes[3:]:
        run = normctl(f"--server={proxy.target}", "list", f"--group={prefix}",
                      "--json")
        listed = ([m["name"] for m in json.loads(run.stdout)["models"]]
                  if run.returncode == 0 else run.stderr)
        check(len(listed) == 8 and all(n.startswith(prefix + ".")
                                       for n in listed),
              f"list --group={prefix} through the proxy: {listed}")
        out = os.path.join(tmp, f"{prefix}-out.safetensors")
        run = normctl(f"--server={proxy.target}", "export-checkpoint",
                      f"--prefix={prefix}", f"--output={out}")
        check(run.returncode == 0 and "wrote 8 models" in run.stdout,
              f"export-checkpoint {prefix} through the proxy: {run.stdout} "
              f"{run.stderr}")
        if run.returncode == 0:
            want = checkpoint_layers(prefixes.index(prefix))
            got = normd.load_safetensors(out)
            check(sorted(got) == sorted(want) and all(
                np.array_equal(np.asarray(got[k]), want[k]) for k in want),
                f"{prefix}: exported checkpoint differs from the imported")
    # Names of two groups in one CreateModels: refused by the proxy, nothing
    # created; a group header that does not match the names: refused by the
    # replica it reaches.
    before, _ = placement(replicas)
    mixed = [pb.CreateModelRequest(name="mixa.bn", num_features=2),
             pb.CreateModelRequest(name="mixb.bn", num_features=2)]
    with normd.Client(proxy.target) as client:
        try:
            client.create_models(mixed)
            failures.append("two groups in one CreateModels: accepted")
        except normd.NormdError as e:
            check(e.code == grpc.StatusCode.INVALID_ARGUMENT and
                  "x-normd-group" in e.details,
                  f"two groups through the proxy: {e.code} {e.details}")
    try:
        stub.CreateModels(pb.CreateModelsRequest(models=mixed), timeout=10,
                          metadata=[("x-normd-group", "mixa")])
        failures.append("CreateModels routed by mixa with mixb.bn: accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and
              "models[1].name: 'mixb.bn' is in group 'mixb'" in e.details(),
              f"mismatched group header: {e.code()} {e.details()}")
    after, _ = placement(replicas)
    check(after == before, "a refused CreateModels created models")
    # Straight to one replica, several groups in one call are fine.
    with normd.Client(replicas[0].target) as client:
        check(len(client.create_models(mixed)) == 2,
              "two groups straight to a replica")


def fits_land_on_one_replica(proxy, replicas):
    """Fits from several clients: each model on exactly one replica, with
    every acknowledged Fit. Its owner by model, and the Fits
    acknowledged."""
    load = FitLoad(proxy.target, rounds=4).start()
    load.join()
    acked_a = dict(load.acked)
    check(sum(acked_a.values()) == CLIENTS * 4 * len(MODELS),
          f"every Fit acknowledged: {sum(acked_a.values())}")
    where, batches = placement(replicas)
    owner = {}
    for m in MODELS:
        if check(len(where[m]) == 1,
                 f"{m} is on {where[m]}, not exactly one replica"):
            owner[m] = where[m][0]
            check(batches[(owner[m], m)] == acked_a[m],
                  f"{m}: num_batches_tracked {batches[(owner[m], m)]} "
                  f"!= {acked_a[m]} acknowledged Fits")
    counts = collections.Counter(owner.values())
    print("models per replica:", dict(sorted(counts.items())))
    return owner, acked_a, counts


def calls_route_by_model(proxy, replicas, owner):
    """Answers name the replica that answered; a model's REST calls reach
    the replica its gRPC calls reach; LayerNorm spreads over every
    replica, in gRPC and in REST."""
    channel = grpc.insecure_channel(proxy.target)
    stub = pb_grpc.NormalizerStub(channel)
    for m in MODELS[:5]:
        _, call = stub.GetModel.with_call(
            pb.GetModelRequest(name=m), timeout=10,
            metadata=[("x-normd-model", m)])
        header = dict(call.initial_metadata()).get("x-normd-replica")
        check(header == owner.get(m),
              f"{m}: x-normd-replica {header}, lives on {owner.get(m)}")
    # REST calls of a model (name in the path) reach the replica its gRPC
    # calls reach; the built-in models' REST calls spread.
    for m in MODELS:
        path = f"/v2/models/{urllib.parse.quote(m, safe='')}"
        check(proxy.rest("GET", path + "/ready") == (200, owner.get(m)),
              f"{m}: REST ready through the proxy "
              f"{proxy.rest('GET', path + '/ready')}, lives on "
              f"{owner.get(m)}")
    document = (b'{"inputs": [{"name": "input", "datatype": "FP32", '
                b'"shape": [2, 2], "data": [1, 2, 3, 4]}]}')
    answered = collections.Counter(
        proxy.rest("POST", "/v2/models/layer_norm/infer", document)
        for _ in range(30))
    print("REST LayerNorm answers (of 30):", dict(answered))
    check(len(answered) == 3 and all(code == 200 for code, _ in answered),
          f"REST LayerNorm spread: {answered}")
    # LayerNorm spreads over every replica.
    before = {r.name: r.handled("Normalize") for r in replicas}
    with normd.Client(proxy.target) as c:
        for _ in range(60):
            c.layer_norm(np.ones((2, 8), np.float32))
    spread = {r.name: r.handled("Normalize") - before[r.name]
              for r in replicas}
    print("LayerNorm calls per replica (of 60):", spread)
    check(sum(spread.values()) == 60 and min(spread.values()) >= 10,
          f"LayerNorm spread: {spread}")
    channel.close()


def killing_a_replica_moves_only_its_models(proxy, replicas, owner, acked_a,
                                            victim):
    """The replica killed while clients fit: only its models fail, with
    UNAVAILABLE, until the proxy marks it down; then they succeed on the
    next replica of the ring, and no other model moves. The Fits
    acknowledged meanwhile, the UNAVAILABLE answers by model, where each
    of its models went, and the survivors' batches."""
    victims_models = {m for m in MODELS if owner.get(m) == victim.name}
    load = FitLoad(proxy.target).start()
    time.sleep(0.5)
    killed_at = time.monotonic()
    victim.kill()
    wait_for(lambda: proxy.server_status().get(("normd", victim.name)) not in
             (None, "UP"), 10, "HAProxy to mark the killed replica down")
    # Keep fitting until every one of its models has succeeded after its
    # last failure: a fixed pause is too short when a slow (sanitizer)
    # build's clients have not come round to a model again yet.
    wait_for(lambda: load.recovered(victims_models, killed_at), 60,
             "every model of the killed replica to succeed again")
    load.stop()
    unavailable = collections.Counter()
    recovery = {}
    for m in MODELS:
        after = [(t, code) for t, code in load.outcomes[m]
                 if t >= killed_at - 0.2]
        codes = {code for _, code in load.outcomes[m]}
        check(codes <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE},
              f"{m}: codes other than OK/UNAVAILABLE: {codes}")
        unavailable[m] = sum(code == grpc.StatusCode.UNAVAILABLE
                             for _, code in load.outcomes[m])
        if m not in victims_models:
            check(unavailable[m] == 0,
                  f"{m} (not on the killed replica) failed "
                  f"{unavailable[m]} times")
            continue
        check(after and after[-1][1] == grpc.StatusCode.OK,
              f"{m}: no success after the kill")
        last_error = max([t for t, code in after
                          if code != grpc.StatusCode.OK], default=None)
        ok_after = [t for t, code in after if code == grpc.StatusCode.OK
                    and t > killed_at]
        if ok_after:
            recovery[m] = ok_after[0] - killed_at
        check(last_error is None or any(t > last_error for t in ok_after),
              f"{m}: UNAVAILABLE not followed by success")
    survivors = [r for r in replicas if r is not victim]
    where_b, batches_b = placement(survivors)
    moved = {m for m in MODELS if where_b.get(m) != [owner.get(m)]}
    fallback = {}
    for m in MODELS:
        if m in victims_models:
            if check(len(where_b[m]) == 1,
                     f"{m} (moved) is on {where_b[m]}"):
                fallback[m] = where_b[m][0]
        else:
            check(where_b[m] == [owner.get(m)],
                  f"{m} moved from {owner.get(m)} to {where_b[m]}")
            check(batches_b[(owner.get(m), m)] ==
                  acked_a[m] + load.acked[m],
                  f"{m}: batches {batches_b.get((owner.get(m), m))} != "
                  f"acknowledged {acked_a[m] + load.acked[m]}")
    print(f"killed {victim.name}: {len(moved)}/{len(MODELS)} models moved "
          f"({len(moved) / len(MODELS):.0%}); "
          f"{sum(unavailable.values())} UNAVAILABLE answers over "
          f"{sum(len(v) for v in load.outcomes.values())} Fits; first "
          f"success after the kill within "
          f"{max(recovery.values(), default=0):.2f} s")
    check(moved == victims_models,
          f"moved {sorted(moved)} != the killed replica's "
          f"{sorted(victims_models)}")
    return dict(load.acked), unavailable, fallback, batches_b


def restarted_replica_takes_its_models_back(proxy, replicas, owner, victim,
                                            acked, unavailable, fallback,
                                            batches_b):
    """The killed replica restarted on its state directory: it holds what
    was acknowledged there, and its models route back to it while their
    stray copies stay as they were. The Fits acknowledged after it."""
    victims_models = {m for m in MODELS if owner.get(m) == victim.name}
    acked_a, acked_b = acked
    victim.start()
    wait_for(lambda: proxy.server_status().get(("normd", victim.name)) == "UP", 30,
             "HAProxy to see the restarted replica UP")
    restored = victim.models()
    check(set(restored) == victims_models,
          f"restarted replica holds {sorted(restored)}")
    for m in victims_models:
        # Acknowledged before the kill: durable. In flight at the kill
        # (answered UNAVAILABLE): may or may not have been applied.
        fallback_batches = batches_b.get((fallback.get(m), m), 0)
        on_owner_acked = acked_a[m] + acked_b.get(m, 0) - fallback_batches
        check(on_owner_acked <= restored.get(m, -1) <=
              on_owner_acked + unavailable[m],
              f"{m}: restarted with {restored.get(m)} batches, "
              f"acknowledged there {on_owner_acked} "
              f"(+{unavailable[m]} unanswered)")
    load = FitLoad(proxy.target, rounds=1).start()
    load.join()
    check(sum(load.acked.values()) == CLIENTS * len(MODELS),
          "every Fit after the restart acknowledged")
    where_c, batches_c = placement(replicas)
    for m in victims_models:
        check(batches_c.get((victim.name, m)) ==
              restored.get(m, 0) + CLIENTS,
              f"{m} did not route back to {victim.name}")
        check(batches_c.get((fallback.get(m), m)) ==
              batches_b.get((fallback.get(m), m)),
              f"{m}: its stray copy on {fallback.get(m)} changed")
    return dict(load.acked)


def stray_copies_merge_back(proxy, replicas, owner, fallback, acked,
                            unavailable):
    """normctl merge through the proxy folds each stray copy into its
    model, and delete removes it: every model on one replica with every
    acknowledged Fit."""
    by_name = {r.name: r for r in replicas}
    for m, f in sorted(fallback.items()):
        done = subprocess.run(
            [args.normctl, f"--server={proxy.target}", "merge",
             f"--model={m}", f"--from={by_name[f].target}"],
            capture_output=True, text=True, timeout=60)
        check(done.returncode == 0, f"merge {m} from {f}: {done.stderr}")
        done = subprocess.run(
            [args.normctl, f"--server={by_name[f].target}", "delete",
             f"--model={m}"], capture_output=True, text=True, timeout=60)
        check(done.returncode == 0, f"delete {m} on {f}: {done.stderr}")
    where_d, batches_d = placement(replicas)
    for m in MODELS:
        total = sum(a.get(m, 0) for a in acked)
        if check(where_d[m] == [owner.get(m)],
                 f"after the merge-back {m} is on {where_d[m]}"):
            got = batches_d[(owner[m], m)]
            check(total <= got <= total + unavailable[m],
                  f"{m}: {got} batches after the merge-back, "
                  f"{total} acknowledged (+{unavailable[m]} unanswered)")
    print("merge-back: every model on one replica with every "
          "acknowledged Fit")


def main():
    root = tempfile.mkdtemp(prefix="normd_sharding_")
    replicas = [Replica(i, root) for i in range(3)]
    by_name = {r.name: r for r in replicas}
    proxy = None
    try:
        for r in replicas:
            r.start()
        proxy = Proxy(replicas)
        if not wait_for(lambda: set(proxy.server_status().values()) == {"UP"}
                        and len(proxy.server_status()) == 6, 30,
                        "HAProxy to see three replicas UP (gRPC and REST)"):
            return 1
        owner, acked_a, counts = fits_land_on_one_replica(proxy, replicas)
        calls_route_by_model(proxy, replicas, owner)
        # The replica with the most models is killed, then restarted.
        victim = by_name[counts.most_common(1)[0][0]]
        acked_b, unavailable, fallback, batches_b = (
            killing_a_replica_moves_only_its_models(proxy, replicas, owner,
                                                    acked_a, victim))
        acked_c = restarted_replica_takes_its_models_back(
            proxy, replicas, owner, victim, (acked_a, acked_b), unavailable,
            fallback, batches_b)
        stray_copies_merge_back(proxy, replicas, owner, fallback,
                                (acked_a, acked_b, acked_c), unavailable)
        test_checkpoints(proxy, replicas, root)
    finally:
        if proxy:
            proxy.stop()
            if failures:
                print("".join(proxy.log[-30:]))
        for r in replicas:
            r.stop()
        shutil.rmtree(root, ignore_errors=True)
    return normd_process.report(failures, "sharding behind HAProxy")


if __name__ == "__main__":
    sys.exit(main())
