#!/usr/bin/python3
"""deploy/k8s: each kustomization renders, every object validates against
the Kubernetes and prometheus-operator schemas (tests/k8s/validate.mjs, npm
packages kubernetes-models and @kubernetes-models/prometheus-operator), and
the manifests keep the promises schemas cannot check: native gRPC probes,
named ports, requests and limits, a locked-down securityContext matching the
image's user, the StatefulSet's pod the same as the Deployment's, state on
a PersistentVolumeClaim, and the PrometheusRule equal to
deploy/prometheus/alerts.yml; the sharded overlay: HAProxy with the same
routing and gRPC health checks as deploy/haproxy/haproxy.cfg (haproxy -c
passes), one DNS slot per StatefulSet ordinal, no gRPC port around the proxy.

Usage: k8s_test.py (kubectl and node on PATH; `npm ci` done in tests/k8s)
"""

import json
import os
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
    check(ports == {"grpc": 50051, "metrics": 9464}, f"{name}: ports {ports}")
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
    check(ports == {"grpc": 50051, "metrics": 9464},
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
    """Section header line -> its lines (comments and blank lines dropped)."""
    sections, current = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if not line.startswith(" "):
            current = line.strip()
            sections[current] = []
        elif current is not None:
            sections[current].append(line.strip())
    return sections


def check_sharded(kinds, durable_stateful):
    """The sharded overlay: the durable StatefulSet scaled out, HAProxy in
    front with deploy/haproxy/haproxy.cfg's routing and health checks, the
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
          {"grpc": "grpc", "metrics": "metrics"},
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
    with tempfile.NamedTemporaryFile("w", suffix=".cfg") as f:
        f.write(cfg)
        f.flush()
        out = subprocess.run(
            ["haproxy", "-c", "-f", f.name], capture_output=True, text=True,
            env=dict(os.environ, POD_NAMESPACE="normd"))
        check(out.returncode == 0, f"sharded: haproxy -c: {out.stdout}"
                                   f"{out.stderr}")
    # The same routing, checks and defaults as deploy/haproxy/haproxy.cfg.
    with open(os.path.join(SOURCE, "deploy", "haproxy", "haproxy.cfg")) as f:
        loopback = haproxy_sections(f.read())
    sharded = haproxy_sections(cfg)
    check(sharded.get("defaults") == loopback["defaults"],
          "sharded: haproxy.cfg defaults differ from deploy/haproxy's")
    routing = [line for line in loopback["backend normd"]
               if not line.startswith(("server ", "default-server"))]
    check([line for line in sharded.get("backend normd", [])
           if not line.startswith(("server-template", "default-server"))] ==
          routing, "sharded: haproxy.cfg routing/health checks differ from "
                   "deploy/haproxy/haproxy.cfg's")
    slots = [line.split() for line in sharded.get("backend normd", [])
             if line.startswith("server-template")]
    service = stateful["spec"]["serviceName"]
    check(len(slots) >= replicas and all(
        slot[1] == "normd-" and slot[2] == f"{i}-{i}" and
        slot[3].strip('"').startswith(f"normd-{i}.{service}.")
        for i, slot in enumerate(slots)),
        f"sharded: proxy slots must be normd-<i>.{service}. for each "
        f"ordinal: {slots}")
    binds = {line.split()[1].rsplit(":", 1)[1]
             for name in ("frontend normd", "frontend stats")
             for line in sharded.get(name, []) if line.startswith("bind ")}
    check(binds == {str(p["containerPort"]) for p in container["ports"]},
          f"sharded: proxy binds {binds} vs container ports")


def main():
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
    return normd_process.report(failures, "k8s manifests")


if __name__ == "__main__":
    sys.exit(main())
