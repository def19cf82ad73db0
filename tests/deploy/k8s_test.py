#!/usr/bin/python3
"""deploy/k8s: each kustomization renders, every object validates against
the Kubernetes and prometheus-operator schemas (tests/k8s/validate.mjs, npm
packages kubernetes-models and @kubernetes-models/prometheus-operator), and
the manifests keep the promises schemas cannot check: native gRPC probes
(HTTP ones on the REST port in overlays/http-probes),
deploy/kserve's InferenceServices, REST and gRPC (their PodSpecs validated
as Pods; their args, ports and scraping annotations against `normd --help`),
named ports, requests and limits, a locked-down securityContext matching the
image's user, the StatefulSet's pod the same as the Deployment's, state on
a PersistentVolumeClaim, and the PrometheusRule equal to
deploy/prometheus/alerts.yml; the sharded overlay: HAProxy configured by
deploy/haproxy/haproxy.cfg itself (haproxy -c passes under the pod's
environment), one DNS slot per StatefulSet ordinal, no gRPC port around the
proxy.

Usage: k8s_test.py --normd BUILD/normd (kubectl and node on PATH; `npm ci`
done in tests/k8s)
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), "testing"))  # normd_process
import normd_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))
K8S = os.path.join(SOURCE, "deploy", "k8s")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def render(kustomization):
    out = subprocess.run(["kubectl", "kustomize", kustomization],
                         capture_output=True, text=True)
    if out.returncode != 0:
        failures.append(f"kubectl kustomize {kustomization}: {out.stderr}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def validate(name, objects):
    out = subprocess.run(["node", os.path.join(HERE, "k8s", "validate.mjs")],
                         input=json.dumps(objects), capture_output=True,
                         text=True)
    print(out.stdout, end="")
    check(out.returncode == 0, f"{name}: schema validation failed "
                               f"{out.stdout}{out.stderr}")


def by_kind(objects):
    kinds = {}
    for o in objects:
        kinds.setdefault(o["kind"], []).append(o)
    return kinds


def check_pod(name, pod):
    """What the issue asks of every normd pod."""
    security = pod.get("securityContext", {})
    check(security.get("runAsNonRoot") is True and
          security.get("runAsUser") == 10001,
          f"{name}: pod must run as non-root uid 10001 (the image's user)")
    (container,) = pod["containers"]
    c_security = container.get("securityContext", {})
    check(c_security.get("readOnlyRootFilesystem") is True and
          c_security.get("allowPrivilegeEscalation") is False and
          c_security.get("capabilities", {}).get("drop") == ["ALL"],
          f"{name}: container securityContext {c_security}")
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    check(ports == {"grpc": 50051, "http": 8000, "metrics": 9464},
          f"{name}: ports {ports}")
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        grpc_probe = container.get(probe, {}).get("grpc", {})
        check(grpc_probe.get("port") == 50051,
              f"{name}: {probe} is not a native gRPC probe on 50051")
    check(container["readinessProbe"]["grpc"].get("service") ==
          "normd.v1.Normalizer",
          f"{name}: readiness must ask for normd.v1.Normalizer")
    resources = container.get("resources", {})
    check(resources.get("requests", {}).get("cpu") and
          resources.get("requests", {}).get("memory") and
          resources.get("limits", {}).get("memory"),
          f"{name}: requests/limits {resources}")
    return container


def check_common(name, kinds):
    (service,) = [s for s in kinds.get("Service", [])
                  if s["metadata"]["name"] == "normd"]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    check(ports == {"grpc": 50051, "http": 8000, "metrics": 9464},
          f"{name}: Service ports {ports}")
    check(len(kinds.get("PodDisruptionBudget", [])) == 1, f"{name}: no PDB")
    (monitor,) = kinds.get("ServiceMonitor", [{}])
    check([e.get("port") for e in monitor.get("spec", {}).get(
        "endpoints", [])] == ["metrics"], f"{name}: ServiceMonitor endpoints")
    (rule,) = kinds.get("PrometheusRule", [{}])
    with open(os.path.join(SOURCE, "deploy", "prometheus", "alerts.yml")) as f:
        alerts = yaml.safe_load(f)
    check(rule.get("spec") == alerts,
          f"{name}: PrometheusRule differs from deploy/prometheus/alerts.yml")


def haproxy_sections(text):
    """Section header line -> its lines (comments, blank lines and the
    conditional blocks' .if/.else/.endif lines dropped: both branches'
    lines are kept)."""
    sections, current = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ".")):
            continue
        if not line.startswith(" "):
            current = line.strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line.strip())
    return sections


def check_sharded(kinds, durable_stateful):
    """The sharded overlay: the durable StatefulSet scaled out, HAProxy in
    front configured by deploy/haproxy/haproxy.cfg, the
    replicas found by their stable DNS names, and no way around the proxy."""
    validate("sharded", [o for os_ in kinds.values() for o in os_])
    (stateful,) = kinds.get("StatefulSet", [None])
    replicas = stateful["spec"]["replicas"]
    check(replicas >= 3, f"sharded: StatefulSet replicas {replicas}")
    check(dict(stateful["spec"], replicas=1) == durable_stateful["spec"],
          "sharded: the StatefulSet differs from the durable one beyond "
          "its replica count")
    services = {s["metadata"]["name"]: s for s in kinds.get("Service", [])}
    headless = services.get(stateful["spec"]["serviceName"], {})
    check(headless.get("spec", {}).get("clusterIP") == "None",
          "sharded: the StatefulSet's Service must be headless")
    check([p["name"] for p in services["normd"]["spec"]["ports"]] ==
          ["metrics"], "sharded: Service normd must not offer gRPC (clients "
                       "would bypass the proxy)")
    (proxy,) = [d for d in kinds.get("Deployment", [])
                if d["metadata"]["name"] == "normd-proxy"]
    pod = proxy["spec"]["template"]
    entry = services.get("normd-proxy", {}).get("spec", {})
    check(entry.get("selector") and all(
        pod["metadata"]["labels"].get(k) == v
        for k, v in entry["selector"].items()),
        "sharded: Service normd-proxy does not select the proxy pods")
    check({p["name"]: p["targetPort"] for p in entry.get("ports", [])} ==
          {"grpc": "grpc", "http": "http", "metrics": "metrics"},
          f"sharded: normd-proxy ports {entry.get('ports')}")
    (container,) = pod["spec"]["containers"]
    c_security = container.get("securityContext", {})
    check(pod["spec"].get("securityContext", {}).get("runAsNonRoot") is True
          and c_security.get("readOnlyRootFilesystem") is True and
          c_security.get("capabilities", {}).get("drop") == ["ALL"],
          "sharded: the proxy pod must be locked down")
    check(container.get("readinessProbe") and container.get("livenessProbe"),
          "sharded: the proxy needs probes")
    env = {e["name"]: e for e in container.get("env", [])}
    check(env.get("POD_NAMESPACE", {}).get("valueFrom", {}).get(
        "fieldRef", {}).get("fieldPath") == "metadata.namespace",
        "sharded: POD_NAMESPACE must come from the downward API")
    (config_map,) = [c for c in kinds.get("ConfigMap", [])
                     if c["metadata"]["name"].startswith("normd-haproxy")]
    (volume,) = [v for v in pod["spec"]["volumes"] if "configMap" in v]
    check(volume["configMap"]["name"] == config_map["metadata"]["name"],
          "sharded: the proxy does not mount the generated ConfigMap")
    cfg = config_map["data"]["haproxy.cfg"]
    # The one configuration: deploy/haproxy/haproxy.cfg itself, with its
    # replicas found through DNS under the pod's environment.
    with open(os.path.join(SOURCE, "deploy", "haproxy", "haproxy.cfg")) as f:
        check(cfg == f.read(), "sharded: the ConfigMap's haproxy.cfg is not "
                               "deploy/haproxy/haproxy.cfg")
    pod_env = container_env(container, {"POD_NAMESPACE": "normd"})
    check(pod_env.get("NORMD_REPLICA_DNS", "").startswith(
        f"{stateful['spec']['serviceName']}.normd.svc."),
        f"sharded: NORMD_REPLICA_DNS {pod_env.get('NORMD_REPLICA_DNS')!r} "
        "must name the StatefulSet's headless Service")
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(cfg)
        f.flush()
        out = subprocess.run(["haproxy", "-c", "-f", f.name],
                             capture_output=True, text=True,
                             env=dict(os.environ, **pod_env))
        check(out.returncode == 0, f"sharded: haproxy -c: {out.stdout}"
                                   f"{out.stderr}")
    # One slot per ordinal, in both backends (the same hash ring: a
    # model's calls of both protocols reach one replica).
    sections = haproxy_sections(cfg)
    for backend, port in (("backend normd", 50051),
                          ("backend normd_rest", 8000)):
        slots = [line.split() for line in sections.get(backend, [])
                 if line.startswith("server-template")]
        check(len(slots) >= replicas and all(
            slot[1] == "normd-" and slot[2] == f"{i}-{i}" and
            slot[3] == f'"normd-{i}.${{NORMD_REPLICA_DNS}}:{port}"'
            for i, slot in enumerate(slots)),
            f"sharded: {backend} slots must be normd-<i>.$NORMD_REPLICA_DNS:"
            f"{port} for each ordinal: {slots}")
    binds = {expand(line.split()[1], pod_env).rsplit(":", 1)[1]
             for name in ("frontend normd", "frontend normd_rest",
                          "frontend stats")
             for line in sections.get(name, []) if line.startswith("bind ")}
    check(binds == {str(p["containerPort"]) for p in container["ports"]},
          f"sharded: proxy binds {binds} vs container ports")


def container_env(container, downward):
    """A container's environment as the kubelet sets it: `downward` for the
    values from fieldRefs, $(NAME) references to earlier ones expanded."""
    env = {}
    for e in container.get("env", []):
        if "valueFrom" in e:
            env[e["name"]] = downward[e["name"]]
        else:
            env[e["name"]] = re.sub(r"\$\((\w+)\)",
                                    lambda m: env.get(m.group(1), m.group(0)),
                                    e["value"])
    return env


def expand(word, env):
    """An HAProxy word with "${NAME-default}" as HAProxy expands it."""
    return re.sub(r"\$\{(\w+)(?:-([^}]*))?\}",
                  lambda m: env.get(m.group(1), m.group(2) or ""),
                  word.strip('"'))


def check_http_probes(deployed):
    """overlays/http-probes: the base with HTTP probes on the REST port's
    health endpoints instead of gRPC ones, nothing else changed."""
    kinds = by_kind(render(os.path.join(K8S, "overlays", "http-probes")))
    validate("http-probes", [o for os_ in kinds.values() for o in os_])
    (deployment,) = kinds.get("Deployment", [None])
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    paths = {probe: container.get(probe, {}).get("httpGet", {})
             for probe in ("startupProbe", "livenessProbe", "readinessProbe")}
    check(paths == {"startupProbe": {"path": "/v2/health/live",
                                     "port": "http"},
                    "livenessProbe": {"path": "/v2/health/live",
                                      "port": "http"},
                    "readinessProbe": {"path": "/v2/health/ready",
                                       "port": "http"}},
          f"http-probes: probes {paths}")
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    check({k: v for k, v in container.items() if k not in probes} ==
          {k: v for k, v in deployed.items() if k not in probes},
          "http-probes: the container differs from the base's beyond its "
          "probes")


# The fields KServe's v1beta1 PredictorSpec adds to a PodSpec
# (ComponentExtensionSpec) that the manifest uses; the rest must be a valid
# PodSpec.
KSERVE_EXTENSION_FIELDS = {"minReplicas", "maxReplicas", "scaleMetric",
                           "scaleTarget"}


def normd_flags(normd):
    """The flag names `normd --help` lists."""
    text = subprocess.run([normd, "--help"], capture_output=True, text=True,
                          timeout=60).stdout
    return set(re.findall(r"^\s+--(\w+) ", text, re.M))


def check_kserve(deployed, flags):
    """deploy/kserve's two InferenceServices: KServe's schema is not on npm,
    so each PodSpec part is validated as a Pod against kubernetes-models and
    the KServe fields by hand. Both run the base's container, serve the
    stateless modes only (--max_models=0) and autoscale, with KServe's
    Prometheus scraping annotations naming normd's --metrics_port. The REST
    one serves --http_port on its one port with HTTP probes; the gRPC one
    --port on a port named h2c (KServe's rule for gRPC) with gRPC probes.
    Every arg is a flag `normd --help` lists."""
    names = set()
    for protocol in ("rest", "grpc"):
        what = f"kserve {protocol}"
        with open(os.path.join(SOURCE, "deploy", "kserve",
                               f"inferenceservice-{protocol}.yaml")) as f:
            isvc = yaml.safe_load(f)
        metadata = isvc.get("metadata", {})
        names.add(metadata.get("name"))
        check(isvc.get("apiVersion") == "serving.kserve.io/v1beta1" and
              isvc.get("kind") == "InferenceService" and metadata.get("name"),
              f"{what}: {isvc.get('apiVersion')} {isvc.get('kind')}")
        predictor = isvc["spec"]["predictor"]
        extension = {k: v for k, v in predictor.items()
                     if k in KSERVE_EXTENSION_FIELDS}
        check(set(isvc["spec"]) == {"predictor"} and
              extension.get("scaleMetric") in ("cpu", "memory",
                                               "concurrency", "rps") and
              1 <= extension.get("minReplicas", 0) < extension.get(
                  "maxReplicas", 0), f"{what}: must autoscale: {extension}")
        pod = {k: v for k, v in predictor.items()
               if k not in KSERVE_EXTENSION_FIELDS}
        validate(what, [{"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": "normd-predictor"},
                         "spec": pod}])
        (container,) = pod["containers"]
        args = dict(a[2:].split("=", 1) for a in container["args"])
        unknown = set(args) - flags
        check(not unknown and all(a.startswith("--") and "=" in a
                                  for a in container["args"]),
              f"{what}: args normd does not know: {sorted(unknown)}")
        check(args.get("max_models") == "0",
              f"{what}: an autoscaled replica must keep no models "
              f"(--max_models=0): {container['args']}")
        annotations = metadata.get("annotations", {})
        check(annotations.get("serving.kserve.io/enable-prometheus-scraping")
              == "true" and annotations.get("prometheus.kserve.io/port") ==
              args.get("metrics_port") and
              annotations.get("prometheus.kserve.io/path") == "/metrics",
              f"{what}: scraping annotations {annotations} vs "
              f"--metrics_port={args.get('metrics_port')}")
        (port,) = container["ports"]
        number = port["containerPort"]
        if protocol == "rest":
            check(args.get("http_port") == str(number) and
                  port.get("name") in (None, "http1"),
                  f"{what}: --http_port vs port {port}")
            probes = {"readinessProbe": {"httpGet": {
                "path": "/v2/health/ready", "port": number}},
                "livenessProbe": {"httpGet": {"path": "/v2/health/live",
                                              "port": number}}}
        else:
            check(args.get("port") == str(number) and
                  port.get("name") == "h2c",
                  f"{what}: --port vs port {port} (KServe needs h2c)")
            probes = {"readinessProbe": {"grpc": {
                "port": number, "service": "normd.v1.Normalizer"}},
                "livenessProbe": {"grpc": {"port": number}}}
        for probe, want in probes.items():
            got = {k: v for k, v in container.get(probe, {}).items()
                   if k in ("httpGet", "grpc")}
            check(got == want, f"{what}: {probe} {container.get(probe)}")
        for key in ("image", "resources", "securityContext", "volumeMounts"):
            check(container.get(key) == deployed.get(key),
                  f"{what}: container {key} differs from the base's")
        check(pod.get("securityContext", {}).get("runAsUser") == 10001 and
              pod["securityContext"].get("runAsNonRoot") is True,
              f"{what}: pod must run as uid 10001, non-root")
    check(len(names) == 2, f"kserve: the two need two names: {names}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--normd", required=True)
    args = parser.parse_args()
    base = by_kind(render(os.path.join(K8S, "base")))
    durable = by_kind(render(os.path.join(K8S, "overlays", "durable")))
    for name, kinds in (("base", base), ("durable", durable)):
        validate(name, [o for os_ in kinds.values() for o in os_])
        check_common(name, kinds)

    (deployment,) = base.get("Deployment", [None])
    check("HorizontalPodAutoscaler" in base, "base: no HPA")
    (hpa,) = base["HorizontalPodAutoscaler"]
    check(hpa["spec"]["scaleTargetRef"]["kind"] == "Deployment",
          "base: HPA must scale the Deployment")
    deployed = check_pod("base", deployment["spec"]["template"]["spec"])

    check("Deployment" not in durable and
          "HorizontalPodAutoscaler" not in durable,
          "durable: the Deployment and HPA must be removed")
    (stateful,) = durable.get("StatefulSet", [None])
    pod = stateful["spec"]["template"]["spec"]
    container = check_pod("durable", pod)
    claims = [c["metadata"]["name"]
              for c in stateful["spec"].get("volumeClaimTemplates", [])]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    check(claims == ["state"] and "state" in mounts,
          f"durable: state volume claims {claims}, mounts {mounts}")
    check(f"--state_dir={mounts.get('state')}" in container["args"],
          f"durable: args {container['args']} lack --state_dir on the volume")
    # The StatefulSet's pod is the Deployment's plus the state volume.
    same = dict(container, args=[a for a in container["args"]
                                 if not a.startswith("--state_dir=")],
                volumeMounts=[m for m in container["volumeMounts"]
                              if m["name"] != "state"])
    check(same == deployed, "durable: the StatefulSet's container differs "
                            "from the Deployment's beyond the state volume")
    check(dict(pod, containers=[]) ==
          dict(deployment["spec"]["template"]["spec"], containers=[]),
          "durable: the StatefulSet's pod differs from the Deployment's")
    check_sharded(by_kind(render(os.path.join(K8S, "overlays", "sharded"))),
                  stateful)
    check_http_probes(deployed)
    check_kserve(deployed, normd_flags(args.normd))
    return normd_process.report(failures, "k8s manifests")


if __name__ == "__main__":
    sys.exit(main())
