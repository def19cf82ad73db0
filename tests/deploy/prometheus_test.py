#!/usr/bin/python3
"""deploy/prometheus and deploy/grafana against a real Prometheus.

Starts normd (durable, so the state metrics exist) and Debian's prometheus
on loopback with deploy/prometheus's configuration and rules (the target and
intervals rewritten for a short test), drives mixed traffic (native gRPC, and the Open Inference
Protocol over gRPC and REST), then asks
Prometheus' HTTP API: the target is up, the rate of grpc_server_handled_total
matches the client's own count, normd_requests_total counts each front end
under its protocol label, histogram_quantile over
grpc_server_handling_seconds_bucket gives a plausible p99, every alert rule
is loaded and evaluates healthily, and every expression of the Grafana
dashboard evaluates without error (most with data). promtool checks the
rules, the configuration and normd's /metrics. The drift gauges of a model
with a reference reach Prometheus, and promtool's rule tests show
NormdModelInputDrift firing only after kl_max stays above the exported
threshold for 15 minutes, for that model alone.

Usage: prometheus_test.py --normd BUILD/normd --stubs BUILD/python
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

args = normd_process.parse_test_args(__doc__)
import grpc  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402
from normd.v1 import normalizer_pb2 as pb  # noqa: E402
from normd.v1 import normalizer_pb2_grpc as pb_grpc  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
DEPLOY = os.path.join(SOURCE, "deploy")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promtool(*argv, stdin=None):
    result = subprocess.run(["promtool", *argv], input=stdin, text=True,
                            capture_output=True)
    check(result.returncode == 0,
          f"promtool {' '.join(argv)}: {result.stdout}{result.stderr}")


class Prometheus:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}/api/v1/"

    def get(self, path, **params):
        url = self.base + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = e.read()
            try:
                return json.loads(body)
            except ValueError:  # E.g. 503 "Service Unavailable" at start-up.
                return {"status": "error", "error": f"HTTP {e.code}: {body!r}"}

    def query(self, expr):
        """(ok, [values]) of an instant query."""
        reply = self.get("query", query=expr)
        if reply.get("status") != "success":
            return False, reply.get("error")
        return True, [float(r["value"][1]) for r in reply["data"]["result"]]


def oip_traffic(grpc_port, http_port, stop, counter):
    """The same LayerNorm over the Open Inference Protocol, gRPC and REST,
    for the dashboard's OIP panels."""
    from inference import grpc_predict_v2_pb2 as oip
    from inference import grpc_predict_v2_pb2_grpc as oip_grpc
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32",
                                   "shape": [2, 3],
                                   "data": [1, 2, 3, 4, 5, 6]}]}).encode()
    request = oip.ModelInferRequest(model_name="layer_norm")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=[2, 3])
    tensor.contents.fp32_contents.extend([1, 2, 3, 4, 5, 6])
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    stub = oip_grpc.GRPCInferenceServiceStub(channel)
    while not stop.is_set():
        urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{http_port}/v2/models/layer_norm/infer",
            data=body), timeout=10).read()
        stub.ModelInfer(request, timeout=10)
        counter[0] += 2
    channel.close()


def traffic(stub, stop, counter):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    ln = pb.NormalizeRequest(mode=pb.LAYER_NORM, input=pb.Tensor(
        dtype=pb.FLOAT32, shape=x.shape, data=x.tobytes()))
    fit = pb.FitRequest(model="prom", input=ln.input)
    bn = pb.NormalizeRequest(mode=pb.BATCH_NORM, model="prom", input=ln.input)
    bad = pb.NormalizeRequest(mode=pb.LAYER_NORM, input=pb.Tensor(
        dtype=pb.FLOAT32, shape=[3], data=b"\0" * 4))
    calls = [(stub.Normalize, ln), (stub.Fit, fit), (stub.Normalize, bn),
             (stub.Normalize, bad)]
    i = 0
    while not stop.is_set():
        method, request = calls[i % len(calls)]
        try:
            method(request, timeout=10)
        except grpc.RpcError:
            pass
        counter[0] += 1
        i += 1


def start_prometheus(tmp, metrics_port):
    """deploy/prometheus/prometheus.yml, pointed at this normd with
    second-long intervals, run by a real Prometheus (promtool checks the
    configuration first): the process and its API once it answers."""
    with open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    config["rule_files"] = [os.path.join(DEPLOY, "prometheus",
                                         "alerts.yml")]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [
        {"targets": [f"127.0.0.1:{metrics_port}"]}]
    config_file = os.path.join(tmp, "prometheus.yml")
    with open(config_file, "w") as f:
        yaml.safe_dump(config, f)
    promtool("check", "config", config_file)
    prom_port = free_port()
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={config_file}",
         f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = Prometheus(prom_port)
    for _ in range(100):
        try:
            if api.get("status/buildinfo").get("status") == "success":
                break
        except OSError:
            pass
        time.sleep(0.1)
    return prom, api


def series_match_the_traffic(api, client_rate):
    """Prometheus's rate of handled calls within 2x of the clients', a
    plausible p99, every front end counted under its protocol, up, normd's
    own series stored and prometheus-cpp's exposer_* dropped. The rate and
    the p99."""
    ok, rate = api.query(
        'sum(rate(grpc_server_handled_total{job="normd",'
        'grpc_service="normd.v1.Normalizer"}[5s]))')
    check(ok and rate and 0.5 * client_rate < rate[0] < 2 * client_rate,
          f"handled rate {rate} vs the client's {client_rate:.0f}/s")
    ok, p99 = api.query(
        'histogram_quantile(0.99, sum by (le) (rate('
        'grpc_server_handling_seconds_bucket{job="normd"}[10s])))')
    check(ok and p99 and 1e-6 < p99[0] < 5,
          f"p99 latency {p99} s is not plausible")
    # Every front end is counted under its protocol, which the
    # alerts and the dashboard split by.
    reply = api.get("query", query=(
        'sum by (protocol) (rate(normd_requests_total'
        '{job="normd"}[5s]))'))
    by_protocol = {r["metric"].get("protocol"): float(r["value"][1])
                   for r in reply.get("data", {}).get("result", [])}
    check(set(by_protocol) == {"grpc", "oip_grpc", "rest"} and
          all(v > 0 for v in by_protocol.values()),
          f"calls by protocol: {by_protocol}")
    ok, up = api.query('up{job="normd"}')
    check(ok and up == [1.0], f"up = {up}")
    # normd's own metrics are stored; prometheus-cpp's exposer_*
    # are dropped at scrape time (docs/flags-and-metrics.md).
    ok, ours = api.query('count({job="normd",__name__=~"normd_.*"})')
    check(ok and ours and ours[0] > 5, f"normd_* series: {ours}")
    ok, exposer = api.query('count({__name__=~"exposer_.*"})')
    check(ok and exposer == [], f"exposer_* series kept: {exposer}")
    return rate, p99


def drift_gauges_reach_prometheus(api):
    """The model with a reference has its normd_model_drift_* series, and
    the threshold is exported."""
    for name in ("kl_max", "kl_mean", "shift_max", "channels_drifted",
                 "window_samples"):
        ok, values = api.query(
            f'normd_model_drift_{name}{{job="normd",model="prom"}}')
        check(ok and len(values) == 1 and values[0] >= 0,
              f"normd_model_drift_{name}: {values}")
    ok, values = api.query('normd_drift_threshold{job="normd"}')
    check(ok and values == [0.1], f"normd_drift_threshold: {values}")
    ok, values = api.query('normd_drift_models_unexported{job="normd"}')
    check(ok and values == [0.0], f"normd_drift_models_unexported: {values}")


def drift_alert_fires_after_fifteen_minutes(tmp):
    """promtool test rules on synthetic series: a model's kl_max at 0.5
    against a threshold of 0.1 fires NormdModelInputDrift at 15 minutes
    and not at 14; a model at 0.01 never does."""
    alerts = os.path.join(DEPLOY, "prometheus", "alerts.yml")
    with open(alerts) as f:
        (rule,) = [r for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                   if r["alert"] == "NormdModelInputDrift"]
    instance = "replica-0:9464"
    annotations = {
        "summary": rule["annotations"]["summary"]
        .replace("{{ $labels.model }}", "resnet.bn1")
        .replace("{{ $labels.instance }}", instance)
        .replace('{{ $value | printf "%.3g" }}', "0.5"),
        "description": rule["annotations"]["description"]
        .replace("{{ $labels.model }}", "resnet.bn1")}
    series = 'job="normd",instance="%s"' % instance
    tests = {
        "rule_files": [alerts],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'normd_model_drift_kl_max{%s,model="resnet.bn1"}'
                 % series, "values": "0.5x40"},
                {"series": 'normd_model_drift_kl_max{%s,model="calm"}'
                 % series, "values": "0.01x40"},
                {"series": 'normd_drift_threshold{%s}' % series,
                 "values": "0.1x40"}],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "NormdModelInputDrift",
                 "exp_alerts": []},
                {"eval_time": "16m", "alertname": "NormdModelInputDrift",
                 "exp_alerts": [{
                     "exp_labels": {"severity": "warning",
                                    "instance": instance,
                                    "model": "resnet.bn1"},
                     "exp_annotations": annotations}]}]}]}
    path = os.path.join(tmp, "drift_alert_test.yml")
    with open(path, "w") as f:
        yaml.safe_dump(tests, f)
    done = subprocess.run(["promtool", "test", "rules", path],
                          capture_output=True, text=True, timeout=60)
    check(done.returncode == 0,
          f"promtool test rules (NormdModelInputDrift): {done.stdout}"
          f"{done.stderr}")


def every_alert_rule_evaluates(api):
    """Every rule of alerts.yml loaded healthy and its expression evaluates.
    The rules."""
    # Every alert rule loaded and evaluated without error.
    rules = api.get("rules")["data"]["groups"]
    loaded = {r["name"]: r for g in rules for r in g["rules"]}
    with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as f:
        wanted = [r for g in yaml.safe_load(f)["groups"]
                  for r in g["rules"]]
    for rule in wanted:
        got = loaded.get(rule["alert"])
        check(got is not None and got.get("health") == "ok",
              f"rule {rule['alert']}: {got}")
        ok, _ = api.query(rule["expr"])
        check(ok, f"rule {rule['alert']} does not evaluate: {_}")
    return wanted


def every_dashboard_expression_has_data(api):
    """Every panel's expression of the Grafana dashboard, with its
    variables filled in, evaluates with data. How many there are, and with
    data."""
    # Every dashboard expression, with Grafana's variables filled in.
    with open(os.path.join(DEPLOY, "grafana",
                           "normd-dashboard.json")) as f:
        dashboard = json.load(f)
    with_data = 0
    exprs = [t["expr"] for p in dashboard["panels"]
             for t in p["targets"]]
    for expr in exprs:
        concrete = (expr.replace("$__rate_interval", "10s")
                    .replace("$job", "normd")
                    .replace("$instance", ".*"))
        ok, values = api.query(concrete)
        check(ok, f"dashboard expression fails: {expr}: {values}")
        with_data += bool(ok and values)
    check(with_data == len(exprs),
          f"only {with_data} of {len(exprs)} dashboard expressions "
          f"have data")
    return len(exprs), with_data


def main():
    promtool("check", "rules", os.path.join(DEPLOY, "prometheus", "alerts.yml"))
    with tempfile.TemporaryDirectory() as tmp:
        drift_alert_fires_after_fifteen_minutes(tmp)
        proc, port, metrics_port = normd_process.start_normd(
            args.normd, ["--state_dir=" + os.path.join(tmp, "state"),
                         "--drift_min_samples=1"])
        prom = None
        try:
            metrics = urllib.request.urlopen(
                f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
            promtool("check", "metrics", stdin=metrics)
            prom, api = start_prometheus(tmp, metrics_port)
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            stub = pb_grpc.NormalizerStub(channel)
            # The traffic's model, with a drift reference.
            stub.CreateModel(pb.CreateModelRequest(name="prom",
                                                   num_features=16))
            stub.SetReference(pb.SetReferenceRequest(
                model="prom", source=pb.REFERENCE_RUNNING))
            stop, counter = threading.Event(), [0]
            threads = [threading.Thread(target=traffic,
                                        args=(stub, stop, counter))
                       for _ in range(4)]
            threads.append(threading.Thread(
                target=oip_traffic,
                args=(port, proc.http_port, stop, [0])))
            for t in threads:
                t.start()
            time.sleep(12)
            start_count, start = counter[0], time.monotonic()
            time.sleep(5)
            client_rate = (counter[0] - start_count) / (
                time.monotonic() - start)
            rate, p99 = series_match_the_traffic(api, client_rate)
            drift_gauges_reach_prometheus(api)
            wanted = every_alert_rule_evaluates(api)
            exprs, with_data = every_dashboard_expression_has_data(api)
            stop.set()
            for t in threads:
                t.join()
            channel.close()
            print(f"client {client_rate:.0f} calls/s, Prometheus rate "
                  f"{rate}, p99 {p99}, {len(wanted)} rules, {exprs} "
                  f"dashboard expressions ({with_data} with data)")
        finally:
            if prom is not None:
                prom.terminate()
                prom.wait(timeout=30)
            proc.terminate()
            proc.wait(timeout=60)
    return normd_process.report(failures, "prometheus")


if __name__ == "__main__":
    sys.exit(main())
