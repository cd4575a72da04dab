#!/usr/bin/env python3
"""Builds every kustomize overlay and validates what it produces, offline.

1. Build: `kubectl kustomize` (or a `kustomize` binary) when present; tests/deploy/kustomize_lite.py
   otherwise. When a real one is present the lite build must give the same objects, so the
   fallback is proven on every run that can prove it.
2. Schemas: every built Kubernetes object against the JSON schemas of the oldest Kubernetes the
   manifests support (1.30: native sidecars and the preStop `sleep` action are on by default)
   and the newest kubernetes-validate knows, strict (unknown fields are errors). The Prometheus
   Operator objects (PodMonitor, ServiceMonitor, PrometheusRule) against the operator's CRD
   models (cloudcoil-models-prometheus-operator, pydantic), with unknown fields reported too.
3. Wiring that a schema cannot see: selectors that select the pods or Services they are meant
   to, ports that exist, probes on the right endpoints, the GPU count carried to --gpus, a
   grace period long enough for the drain, non-root tokenmeter containers with requests and a
   memory limit.
   The sidecar overlay's one GPU number: with the vLLM container's nvidia.com/gpu limit changed
   to 4 in a copy of deploy/, the built tokenmeter TOKENMETER_GPUS and vLLM's
   TENSOR_PARALLEL_SIZE must both read 4 (the kustomize replacement carries it; the equality
   check alone would pass with both left at 1).
4. Alerts: every alert has a runbook_url whose anchor is a heading of docs/runbook.md.
5. The plain scrape config example passes `promtool check config`.
6. Autoscaling (overlays autoscale-keda and autoscale-hpa): the KEDA ScaledObject against KEDA's
   CRD models (cloudcoil-models-keda), both targets naming the overlay's Deployment, one
   autoscaler per Deployment, the Prometheus trigger's fields, the HPA's metric served by the
   Prometheus adapter rule beside it, every PromQL expression (the trigger's query, the
   adapter's queries with its templates filled in) accepted by promtool, and every metric they
   name one that tokenmeter exports.

TOKENMETER_KUSTOMIZE=lite forces the fallback (to see it work where kubectl exists).

Needs PyYAML, kubernetes-validate, cloudcoil-models-prometheus-operator and cloudcoil-models-keda
(tests/deploy/run.sh
installs them in a virtualenv). Exits 1 listing every problem.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
import kustomize_lite  # noqa: E402

DIRS = ["deploy/base", "deploy/overlays/sidecar-vllm", "deploy/overlays/gateway",
        "deploy/overlays/autoscale-keda", "deploy/overlays/autoscale-hpa"]
OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
KEDA_KINDS = {"ScaledObject"}

problems = []


def problem(msg):
    problems.append(msg)
    print(f"FAIL: {msg}", flush=True)


# === build ===


def real_kustomize():
    if os.environ.get("TOKENMETER_KUSTOMIZE") == "lite":
        return None
    if shutil.which("kubectl"):
        r = subprocess.run(["kubectl", "kustomize", "--help"], capture_output=True)
        if r.returncode == 0:
            return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    return None


def key(doc):
    return (doc.get("kind"), doc.get("metadata", {}).get("name"))


def build_all():
    tool = real_kustomize()
    print(f"check_manifests: building with {' '.join(tool) if tool else 'kustomize_lite.py (no kustomize installed)'}")
    built = {}
    for d in DIRS:
        try:
            lite = kustomize_lite.build(REPO / d)
        except kustomize_lite.Error as e:
            problem(f"{d}: kustomize_lite: {e}")
            lite = None
        if tool:
            r = subprocess.run(tool + [str(REPO / d)], capture_output=True, text=True)
            if r.returncode != 0:
                problem(f"{d}: {' '.join(tool)} failed: {r.stderr.strip()}")
                continue
            docs = [x for x in yaml.safe_load_all(r.stdout) if x]
            if lite is not None:
                a = {key(x): x for x in docs}
                b = {key(x): x for x in lite}
                if a != b:
                    diff = sorted({k for k in set(a) | set(b) if a.get(k) != b.get(k)}, key=str)
                    problem(f"{d}: kustomize_lite differs from {' '.join(tool)} on {diff}")
        else:
            docs = lite or []
        if not docs:
            problem(f"{d}: built nothing")
        built[d] = docs
        print(f"  {d}: {len(docs)} objects: {', '.join(f'{k}/{n}' for k, n in map(key, docs))}")
    return built


# === schemas ===


def k8s_versions():
    import kubernetes_validate.utils as kv

    return ["1.30.0", kv.latest_version()]


def unknown_fields(given, parsed, path=""):
    """Keys present in the input but not in the model's dump: fields the CRD does not have."""
    out = []
    if isinstance(given, dict) and isinstance(parsed, dict):
        for k, v in given.items():
            if k not in parsed:
                out.append(f"{path}.{k}")
            else:
                out += unknown_fields(v, parsed[k], f"{path}.{k}")
    elif isinstance(given, list) and isinstance(parsed, list):
        for i, (a, b) in enumerate(zip(given, parsed)):
            out += unknown_fields(a, b, f"{path}[{i}]")
    return out


def validate_operator(doc, where):
    from cloudcoil.models.prometheus_operator import v1

    model = getattr(v1, doc["kind"])
    try:
        parsed = model.model_validate(doc)
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError, reported whole
        problem(f"{where}: {str(e).splitlines()[0]} ... {e}")
        return
    dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    for f in unknown_fields(doc, dumped):
        problem(f"{where}: unknown field {f} (not in the {doc['kind']} CRD)")


def validate_keda(doc, where):
    from cloudcoil.models.keda import v1alpha1

    model = getattr(v1alpha1, doc["kind"])
    try:
        parsed = model.model_validate(doc)
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError, reported whole
        problem(f"{where}: {str(e).splitlines()[0]} ... {e}")
        return
    dumped = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    for f in unknown_fields(doc, dumped):
        problem(f"{where}: unknown field {f} (not in the {doc['kind']} CRD)")


def validate(built):
    import kubernetes_validate

    versions = k8s_versions()
    n = 0
    for d, docs in built.items():
        for doc in docs:
            where = f"{d}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
            if doc.get("kind") in OPERATOR_KINDS:
                validate_operator(doc, where)
                n += 1
                continue
            if doc.get("kind") in KEDA_KINDS:
                validate_keda(doc, where)
                n += 1
                continue
            for v in versions:
                try:
                    kubernetes_validate.validate(doc, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path = ".".join(str(p) for p in e.path)
                    problem(f"{where}: not valid for Kubernetes {v}: {path}: {e.message}")
                except kubernetes_validate.SchemaNotFoundError as e:
                    problem(f"{where}: {e.message}")
            n += 1
    print(f"  {n} objects validated (Kubernetes {', '.join(versions)}; Prometheus Operator and KEDA CRDs)")


# === wiring ===


def pod_templates(docs):
    for d in docs:
        if d.get("kind") in ("Deployment", "StatefulSet", "DaemonSet"):
            yield d, d["spec"]["template"]


def all_containers(pod):
    spec = pod["spec"]
    return [(c, False) for c in spec.get("containers", [])] + [(c, True) for c in spec.get("initContainers", [])]


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env(container, name):
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def seconds(duration):
    m = re.fullmatch(r"(\d+)(ms|s|m)?", duration or "")
    if not m:
        return None
    n = int(m.group(1))
    return {"ms": n / 1000, "s": n, None: n, "m": n * 60}[m.group(2)]


def check_tokenmeter_container(c, is_init, workload, where):
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if "metrics" not in ports or "http" not in ports:
        problem(f"{where}: tokenmeter needs ports named http and metrics, has {sorted(ports)}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("port") != "metrics":
            problem(f"{where}: {probe} must GET {path} on port metrics, is {get}")
    listen = env(c, "TOKENMETER_METRICS_LISTEN") or "0.0.0.0:9090"
    if ports.get("metrics") != int(listen.rsplit(":", 1)[1]):
        problem(f"{where}: port metrics {ports.get('metrics')} is not TOKENMETER_METRICS_LISTEN {listen}")
    listen = env(c, "TOKENMETER_LISTEN") or "0.0.0.0:8080"
    if ports.get("http") != int(listen.rsplit(":", 1)[1]):
        problem(f"{where}: port http {ports.get('http')} is not TOKENMETER_LISTEN {listen}")
    if not env(c, "TOKENMETER_UPSTREAM"):
        problem(f"{where}: TOKENMETER_UPSTREAM is not set")
    res = c.get("resources", {})
    if not res.get("requests", {}).get("cpu") or not res.get("requests", {}).get("memory") \
            or not res.get("limits", {}).get("memory"):
        problem(f"{where}: tokenmeter needs cpu and memory requests and a memory limit, has {res}")
    sc = dict(workload["spec"]["template"]["spec"].get("securityContext", {}), **c.get("securityContext", {}))
    if not sc.get("runAsNonRoot") or sc.get("allowPrivilegeEscalation", True) or not sc.get("readOnlyRootFilesystem"):
        problem(f"{where}: tokenmeter must run non-root, without privilege escalation, read-only root")
    if not (c.get("image") or "").startswith("tokenmeter:"):
        problem(f"{where}: image {c.get('image')} is not the tokenmeter image with a tag")


def check_wiring(d, docs):
    pods = list(pod_templates(docs))
    services = [x for x in docs if x.get("kind") == "Service"]
    for w, tpl in pods:
        where = f"{d}: {w['kind']}/{w['metadata']['name']}"
        if not matches(w["spec"]["selector"].get("matchLabels"), tpl["metadata"].get("labels", {})):
            problem(f"{where}: selector does not match its own pod template")
        grace = tpl["spec"].get("terminationGracePeriodSeconds", 30)
        for c, is_init in all_containers(tpl):
            cw = f"{where} container {c['name']}"
            names = {p.get("name") for p in c.get("ports", [])}
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if isinstance(port, str) and port not in names:
                    problem(f"{cw}: {probe} port {port!r} is not one of its ports {sorted(names)}")
            if c["name"] != "tokenmeter":
                continue
            check_tokenmeter_container(c, is_init, w, cw)
            drain = seconds(env(c, "TOKENMETER_DRAIN_TIMEOUT") or "30s")
            pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            if is_init:
                # Native sidecar: starts before and stops after the server.
                if c.get("restartPolicy") != "Always":
                    problem(f"{cw}: a sidecar must be an init container with restartPolicy: Always")
                gpus = [x for x, _ in all_containers(tpl) if "nvidia.com/gpu" in x.get("resources", {}).get("limits", {})]
                want = str(gpus[0]["resources"]["limits"]["nvidia.com/gpu"]) if gpus else None
                if env(c, "TOKENMETER_GPUS") != want:
                    problem(f"{cw}: TOKENMETER_GPUS {env(c, 'TOKENMETER_GPUS')!r} is not the pod's GPU limit {want!r}")
                server_stop = [x.get("lifecycle", {}).get("preStop") for x, init in all_containers(tpl) if not init]
                if not any(server_stop):
                    problem(f"{where}: no preStop on the server container to let streams drain")
            else:
                if not pre:
                    problem(f"{cw}: a gateway needs a preStop sleep so endpoints update before the drain")
                if grace <= pre + drain:
                    problem(f"{where}: terminationGracePeriodSeconds {grace} <= preStop {pre} + drain {drain}")
    for s in services:
        where = f"{d}: Service/{s['metadata']['name']}"
        sel = s["spec"].get("selector", {})
        targets = [tpl for _, tpl in pods if matches(sel, tpl["metadata"].get("labels", {}))]
        if not targets:
            problem(f"{where}: selector {sel} selects no pod template in this overlay")
        for tpl in targets:
            for p in s["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                if isinstance(tp, int):
                    ok = any(tp == q["containerPort"] for c, _ in all_containers(tpl) for q in c.get("ports", []))
                else:
                    # Named ports of native sidecars resolve only from Kubernetes 1.32 on.
                    ok = any(tp == q.get("name") for c, init in all_containers(tpl) if not init for q in c.get("ports", []))
                if not ok:
                    problem(f"{where}: targetPort {tp!r} is not a port of the selected pods' (non-init) containers")
        for tpl in targets:
            # Clients must reach tokenmeter, never the server beside it.
            tm = [c for c, _ in all_containers(tpl) if c["name"] == "tokenmeter"]
            if not tm:
                continue
            http = {q["containerPort"] for q in tm[0].get("ports", []) if q.get("name") == "http"}
            client_ports = [p for p in s["spec"]["ports"] if p.get("name") != "metrics"]
            for p in client_ports:
                tp = p.get("targetPort", p["port"])
                if tp not in http and tp != "http":
                    problem(f"{where}: port {p['port']} targets {tp!r}, not tokenmeter's http port {sorted(http)}")
    for m in (x for x in docs if x.get("kind") == "PodMonitor"):
        where = f"{d}: PodMonitor/{m['metadata']['name']}"
        sel = m["spec"]["selector"].get("matchLabels", {})
        targets = [tpl for _, tpl in pods if matches(sel, tpl["metadata"].get("labels", {}))]
        if not targets:
            problem(f"{where}: selects no pod template in this overlay")
        for tpl in targets:
            names = {q.get("name") for c, _ in all_containers(tpl) for q in c.get("ports", [])}
            for ep in m["spec"]["podMetricsEndpoints"]:
                if ep.get("port") not in names:
                    problem(f"{where}: port {ep.get('port')!r} is not a container port name {sorted(names)}")
    for m in (x for x in docs if x.get("kind") == "ServiceMonitor"):
        where = f"{d}: ServiceMonitor/{m['metadata']['name']}"
        sel = m["spec"]["selector"].get("matchLabels", {})
        targets = [s for s in services if matches(sel, s["metadata"].get("labels", {}))]
        if not targets:
            problem(f"{where}: selects no Service in this overlay")
        for s in targets:
            names = {p.get("name") for p in s["spec"]["ports"]}
            for ep in m["spec"]["endpoints"]:
                if ep.get("port") not in names:
                    problem(f"{where}: port {ep.get('port')!r} is not a port name of Service {s['metadata']['name']}")
    for p in (x for x in docs if x.get("kind") == "PodDisruptionBudget"):
        sel = p["spec"]["selector"].get("matchLabels", {})
        if not any(matches(sel, tpl["metadata"].get("labels", {})) for _, tpl in pods):
            problem(f"{d}: PodDisruptionBudget/{p['metadata']['name']} selects no pod template")
    rules = [x for x in docs if x.get("kind") == "PrometheusRule"]
    if d != "deploy/base" and len(rules) != 1:
        problem(f"{d}: expected the base's PrometheusRule, found {len(rules)}")


# === autoscaling ===


def exported_metrics():
    """The metric family names tokenmeter registers (wherever the metrics module keeps them)."""
    src = REPO / "crates" / "tokenmeter" / "src"
    files = [src / "metrics.rs", src / "capacity_metrics.rs"] + sorted((src / "metrics").glob("*.rs"))
    names = set()
    for f in files:
        if f.exists():
            names |= set(re.findall(r'"(tokenmeter_[a-z0-9_]+)"', f.read_text()))
    return names


def promql_names(expr):
    return set(re.findall(r"(?<![:\w])(tokenmeter_[a-z0-9_]+)(?![:\w])", expr))


def adapter_rules(docs, where):
    """The Prometheus adapter rules in the overlay's adapter ConfigMaps."""
    out = []
    for cm in (x for x in docs if x.get("kind") == "ConfigMap"
               and x["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "prometheus-adapter"):
        try:
            cfg = yaml.safe_load(cm.get("data", {}).get("config.yaml", ""))
        except yaml.YAMLError as e:
            problem(f"{where}: ConfigMap/{cm['metadata']['name']}: config.yaml is not YAML: {e}")
            continue
        out += (cfg or {}).get("rules", [])
    return out


def fill_adapter_template(query, series_query, namespace="inference", pod="vllm-0", extra=""):
    # What the adapter substitutes for one pod of one namespace: <<.Series>> is the series' name
    # (not the whole seriesQuery), <<.LabelMatchers>> the namespace and pod matchers (plus the
    # HPA's metric selector, `extra`).
    m = re.match(r"[A-Za-z_:][\w:]*", series_query.strip())
    series = m.group(0) if m else series_query
    matchers = f'namespace="{namespace}",pod="{pod}"' + (f",{extra}" if extra else "")
    return (query.replace("<<.Series>>", series)
                 .replace("<<.LabelMatchers>>", matchers)
                 .replace("<<.GroupBy>>", "pod"))


def check_autoscaling(d, docs, exprs, known):
    """Collects every PromQL expression into `exprs` (checked by promtool afterwards)."""
    deployments = {x["metadata"]["name"] for x in docs if x.get("kind") == "Deployment"}
    targets = []
    for so in (x for x in docs if x.get("kind") == "ScaledObject"):
        where = f"{d}: ScaledObject/{so['metadata']['name']}"
        ref = so["spec"]["scaleTargetRef"]
        targets.append(ref.get("name"))
        if ref.get("kind", "Deployment") != "Deployment" or ref.get("name") not in deployments:
            problem(f"{where}: scaleTargetRef {ref} is not a Deployment of this overlay {sorted(deployments)}")
        if so["spec"].get("minReplicaCount", 0) < 1:
            problem(f"{where}: minReplicaCount must be at least 1 (a GPU pod takes minutes to start)")
        triggers = so["spec"].get("triggers", [])
        if not triggers:
            problem(f"{where}: no triggers")
        for t in triggers:
            md = t.get("metadata", {})
            if t.get("type") != "prometheus":
                problem(f"{where}: trigger type {t.get('type')!r} is not prometheus")
                continue
            for k in ("serverAddress", "query", "threshold"):
                if not md.get(k):
                    problem(f"{where}: the prometheus trigger has no {k}")
            for k in ("threshold", "activationThreshold"):
                try:
                    if k in md and not 0 < float(md[k]) <= 1:
                        problem(f"{where}: {k} {md[k]} is not a utilization in (0, 1]")
                except ValueError:
                    problem(f"{where}: {k} {md[k]!r} is not a number")
            if t.get("metricType", "AverageValue") != "AverageValue":
                problem(f"{where}: the query sums utilization over pods, so metricType must be AverageValue")
            if md.get("ignoreNullValues") != "false":
                problem(f"{where}: ignoreNullValues must be \"false\" so a warming-up fit uses the fallback")
            if "fallback" not in so["spec"]:
                problem(f"{where}: no fallback for a missing series")
            q = md.get("query", "")
            if "tokenmeter_capacity_utilization" not in q or "sum(" not in q.replace(" ", ""):
                problem(f"{where}: the query must sum tokenmeter_capacity_utilization over pods: {q}")
            exprs.append((f"{where} query", q))
    rules = adapter_rules(docs, d)
    served = {}
    for r in rules:
        name = r.get("name", {}).get("as")
        served[name] = r
        for k in ("seriesQuery", "metricsQuery"):
            if not r.get(k):
                problem(f"{d}: adapter rule {name}: no {k}")
        over = r.get("resources", {}).get("overrides", {})
        if over.get("pod", {}).get("resource") != "pod" or over.get("namespace", {}).get("resource") != "namespace":
            problem(f"{d}: adapter rule {name}: pod and namespace labels must map to their resources")
        series = r.get("seriesQuery", "")
        exprs.append((f"{d}: adapter rule {name} seriesQuery", series))
        exprs.append((f"{d}: adapter rule {name} metricsQuery",
                      fill_adapter_template(r.get("metricsQuery", ""), series)))
    for h in (x for x in docs if x.get("kind") == "HorizontalPodAutoscaler"):
        where = f"{d}: HorizontalPodAutoscaler/{h['metadata']['name']}"
        ref = h["spec"]["scaleTargetRef"]
        targets.append(ref.get("name"))
        if ref.get("kind") != "Deployment" or ref.get("name") not in deployments:
            problem(f"{where}: scaleTargetRef {ref} is not a Deployment of this overlay {sorted(deployments)}")
        for m in h["spec"].get("metrics", []):
            if m.get("type") != "Pods":
                problem(f"{where}: expected a Pods metric (per-pod utilization), got {m.get('type')}")
                continue
            name = m["pods"]["metric"]["name"]
            if name not in served:
                problem(f"{where}: metric {name} is served by no adapter rule in this overlay ({sorted(served)})")
            if name not in known:
                problem(f"{where}: metric {name} is not one tokenmeter exports")
            if "class" not in m["pods"]["metric"].get("selector", {}).get("matchLabels", {}):
                problem(f"{where}: utilization is per class; select one with a class label")
    dup = {t for t in targets if targets.count(t) > 1}
    if dup:
        problem(f"{d}: {sorted(dup)} scaled by more than one autoscaler (KEDA makes its own HPA)")


def check_promql(exprs, known):
    """promtool parses each expression (as a recording rule), and each metric it names exists."""
    if not exprs:
        return
    for where, e in exprs:
        for n in promql_names(e) - known:
            problem(f"{where}: {n} is not a metric tokenmeter exports")
    groups = [{"name": "autoscaling", "rules": [{"record": f"check:autoscaling_{i}", "expr": e}
                                                for i, (_, e) in enumerate(exprs)]}]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "autoscaling.yml"
        path.write_text(yaml.safe_dump({"groups": groups}))
        r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        problem(f"promtool rejects an autoscaling query: {r.stdout.strip()} {r.stderr.strip()} "
                f"(queries: {[w for w, _ in exprs]})")
    else:
        print(f"  {len(exprs)} autoscaling queries: promtool check rules ok")


def check_gpu_replacement():
    """The sidecar overlay copies the vLLM container's nvidia.com/gpu limit into tokenmeter's
    TOKENMETER_GPUS (and vLLM's TENSOR_PARALLEL_SIZE): change the limit in a copy and build."""
    overlay = "deploy/overlays/sidecar-vllm"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(REPO / "deploy", Path(tmp) / "deploy")
        dep_path = Path(tmp) / overlay / "deployment.yaml"
        text = dep_path.read_text()
        limit = 'nvidia.com/gpu: "1"'
        if text.count(limit) != 1:
            problem(f"{overlay}/deployment.yaml: expected one {limit!r} to change, found {text.count(limit)}")
            return
        dep_path.write_text(text.replace(limit, 'nvidia.com/gpu: "4"'))
        builds = []
        try:
            builds.append(("kustomize_lite", kustomize_lite.build(Path(tmp) / overlay)))
        except kustomize_lite.Error as e:
            problem(f"{overlay} with 4 GPUs: kustomize_lite: {e}")
        tool = real_kustomize()
        if tool:
            r = subprocess.run(tool + [str(Path(tmp) / overlay)], capture_output=True, text=True)
            if r.returncode != 0:
                problem(f"{overlay} with 4 GPUs: {' '.join(tool)} failed: {r.stderr.strip()}")
            else:
                builds.append((" ".join(tool), [x for x in yaml.safe_load_all(r.stdout) if x]))
    for name, docs in builds:
        for w, tpl in pod_templates(docs):
            containers = {c["name"]: c for c, _ in all_containers(tpl)}
            got = (env(containers.get("tokenmeter", {}), "TOKENMETER_GPUS"),
                   env(containers.get("vllm", {}), "TENSOR_PARALLEL_SIZE"))
            if got != ("4", "4"):
                problem(f"{overlay} built by {name} with nvidia.com/gpu 4: TOKENMETER_GPUS and "
                        f"TENSOR_PARALLEL_SIZE are {got}, not ('4', '4'): the replacement does not carry the limit")
            else:
                print(f"  {overlay} ({name}): nvidia.com/gpu 4 reaches TOKENMETER_GPUS and TENSOR_PARALLEL_SIZE")


# === plain scrape config ===


def check_scrape_config():
    """promtool check config on deploy/prometheus/scrape_configs.yml.

    Debian's Prometheus is built without Kubernetes service discovery, so its promtool rejects
    kubernetes_sd_configs. Where that happens the Kubernetes jobs are checked with the SD block
    swapped for a static target carrying the labels pod discovery would give, which still checks
    everything else (relabelling, job names, rule_files)."""
    src = REPO / "deploy" / "prometheus" / "scrape_configs.yml"
    r = subprocess.run(["promtool", "check", "config", str(src)], capture_output=True, text=True)
    if r.returncode == 0:
        print("  scrape_configs.yml: promtool check config ok")
        return
    if "kubernetes_sd_configs" not in r.stdout + r.stderr:
        problem(f"promtool check config {src.name}: {r.stdout.strip()} {r.stderr.strip()}")
        return
    cfg = yaml.safe_load(src.read_text())
    for job in cfg["scrape_configs"]:
        sd = job.pop("kubernetes_sd_configs", None)
        if sd is None:
            continue
        if [x.get("role") for x in sd] != ["pod"]:
            problem(f"scrape_configs.yml job {job['job_name']}: expected one pod-role discovery")
        job["static_configs"] = [{"targets": ["127.0.0.1:9090"], "labels": {
            "__meta_kubernetes_pod_container_name": "tokenmeter",
            "__meta_kubernetes_pod_container_port_name": "metrics",
            "__meta_kubernetes_pod_phase": "Running",
            "__meta_kubernetes_namespace": "inference",
            "__meta_kubernetes_pod_name": "vllm-0",
        }}]
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(src.parent / "rules.yml", tmp)
        path = Path(tmp) / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        r = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        problem(f"promtool check config {src.name} (Kubernetes SD swapped for static): {r.stdout.strip()} {r.stderr.strip()}")
    else:
        print("  scrape_configs.yml: promtool check config ok (this promtool has no Kubernetes SD: "
              "checked with a static target in its place)")


# === runbooks ===


def anchors(markdown):
    out = set()
    for line in markdown.splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def check_runbooks():
    rules = yaml.safe_load((REPO / "deploy" / "prometheus" / "rules.yml").read_text())
    book = REPO / "docs" / "runbook.md"
    have = anchors(book.read_text()) if book.exists() else set()
    n = 0
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" not in r:
                continue
            n += 1
            url = r.get("annotations", {}).get("runbook_url", "")
            path, _, anchor = url.partition("#")
            if path != "docs/runbook.md" or anchor not in have:
                problem(f"alert {r['alert']}: runbook_url {url!r} is not a heading of docs/runbook.md")
            for k in ("summary", "description"):
                if not r.get("annotations", {}).get(k):
                    problem(f"alert {r['alert']}: no {k} annotation")
            if r.get("labels", {}).get("severity") not in ("critical", "warning"):
                problem(f"alert {r['alert']}: severity must be critical or warning")
    print(f"  {n} alerts have runbook sections")


def main():
    os.chdir(REPO)
    built = build_all()
    validate(built)
    known = exported_metrics()
    exprs = []
    for d, docs in built.items():
        check_wiring(d, docs)
        check_autoscaling(d, docs, exprs, known)
    check_promql(exprs, known)
    check_gpu_replacement()
    check_runbooks()
    check_scrape_config()
    if problems:
        print(f"check_manifests: {len(problems)} problem(s)")
        return 1
    print("check_manifests: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
