#!/usr/bin/env python3
"""The live test: a real Prometheus scrapes real tokenmeters carrying live traffic, and every
dashboard query and every recording rule must return data.

On loopback only, in a temporary directory, it starts:
  - the traffic upstream (tests/deploy/traffic.py upstream: OpenAI-style SSE with usage, plus
    error statuses, cut streams, slow headers and malformed events on request),
  - two tokenmeters in front of it (pods "vllm-llama-0" with --gpus 2 and --gpu-hour-cost, and
    "vllm-qwen-0" with --gpus auto finding one GPU in NVIDIA_VISIBLE_DEVICES and no cost of its
    own, in namespace "inference"; Prometheus adds those labels from static_configs, as a
    PodMonitor does in Kubernetes), both with the SLO classes in SLO_CLASSES,
  - Prometheus (the Debian package) with a 1 s scrape and evaluation interval and
    deploy/prometheus/rules.yml loaded,
  - two load clients sending concurrent streaming requests with every outcome mixed in, each
    naming one of the classes (or an undeclared one, or none) in x-tokenmeter-class.
After LIVE_TRAFFIC_SECONDS of traffic it checks, through Prometheus's HTTP API (again until all pass,
or CHECKS_DEADLINE_S):
  1. the template variable queries (label_values) list the namespace, pods and models;
  2. every target of every panel, with the template variables substituted both as "All" (.*)
     and as one concrete namespace/pod/model, returns at least one finite value (range queries
     for time series, heatmaps and stats; instant queries for instant targets);
  3. every rule Prometheus loaded evaluates without error, and every recording rule's
     expression and recorded series return a finite value; the KEDA trigger's query and the
     Prometheus adapter's query behind the HPA (deploy/overlays/autoscale-*) return one too;
  4. the SLO and GPU series say what the set-up implies: only declared class labels (the
     undeclared name counts in the default class), the strict class missing TTFT and TPS, the
     objectives as declared, and each pod's GPU count with its source (check_slo_and_gpus);
     the tenants the load names on the pod with --tenant-header, none on the other
     (check_tenants);
  5. the bill for a range: the load stopped, a short burst through both pods between two
     instants at rest, and `tokenmeter cost --prometheus` over them must give each tenant and
     model the GPU-seconds, output tokens and dollars the two proxies' own counters moved,
     within what Prometheus's extrapolation of increase() allows (check_bill, tests/deploy/bill.py);
  6. the vLLM preStop drain hook of deploy/overlays/sidecar-vllm returns only after the streams
     open through tokenmeter have finished (check_drain_hook).
Everything started is stopped at the end, also on failure. Exits 1 listing each failure.

Environment: TOKENMETER_BIN (default target/release/tokenmeter), PROMETHEUS (default
`prometheus` on PATH), LIVE_TRAFFIC_SECONDS (default 40: the least traffic before the checks, so
that the figures they judge (SLO results, goodput) stand on a few hundred requests; after it the
checks run again until they pass or CHECKS_DEADLINE_S has passed).
"""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import bill
import dashboard as dash

REPO = dash.REPO
HERE = Path(__file__).resolve().parent
NAMESPACE = "inference"
# (pod, tokenmeter flags and environment, models, concurrency steps)
# The engine's memory, as a planner states it: the capacity model's memory bounds and series exist
# (the dashboard's limits table reads them). A cache far larger than this load holds.
MEMORY = ["--kv-cache-tokens", "262144", "--max-num-seqs", "256"]
PODS = [
    ("vllm-llama-0", ["--gpus", "2", "--gpu-hour-cost", "1.80", "--tenant-header", "x-tenant", *MEMORY], {},
     "llama-3.1-8b-instruct", "1,4,10"),
    ("vllm-qwen-0", ["--gpus", "auto", *MEMORY], {"NVIDIA_VISIBLE_DEVICES": "GPU-4e1c7a2b"},
     "qwen2.5-7b-instruct,mistral-7b", "2,6"),
]
PRICE = "2.50"
# The upstream's TTFT is 75-225 ms and it streams at 50 tokens/s alone, 5% slower for each other
# stream of the same pod (at 10 streams, 34 tokens/s: the capacity model's slowdown to fit,
# within interactive's floor): interactive and batch are met
# (unless the request fails), strict misses TTFT on most requests and TPS on the rest.
SLO_CLASSES = ["interactive:ttft=1s,tps=20", "strict:ttft=100ms,tps=100,objective=0.99", "batch"]
# The load's class headers: declared ones, an undeclared one (counted in interactive) and none.
LOAD_CLASSES = "interactive,strict,batch,vip,"
# The load's tenants (x-tenant; the empty name sends none): vllm-llama-0 labels them.
LOAD_TENANTS = "team-a,team-b,"

# The load clients' --duration: only a bound, the test stops them.
LOAD_BOUND_S = 600
# The bill's traffic: a few seconds of 4 streams a pod, the same models and tenants as the load
# (so every series it moves existed before the range began), only successful requests.
BILL_BURST_S = 4
# How long the checks may keep failing after the least traffic: what they wait for takes a few
# seconds here (a refit every 5 s, 1 s scrapes and rule evaluations); 120 s is for a loaded
# machine, and only a failure waits for it.
CHECKS_DEADLINE_S = 120
# The bill's edges are at rest before it is asked for, so it holds at once; the deadline is for
# a Prometheus slow to commit its last scrape on a loaded machine.
BILL_DEADLINE_S = 30

failures = []
# While a check runs under until_passes, what it fails on is collected here instead.
collecting = None


def fail(msg):
    if collecting is not None:
        collecting.append(msg)
        return
    failures.append(msg)
    print(f"FAIL: {msg}", flush=True)


def collected(fn, *args):
    """A check for until_passes made of a function that reports by fail()."""
    def check(problem):
        global collecting
        outer, collecting = collecting, []
        try:
            fn(*args)
        finally:
            got, collecting = collecting, outer
        for msg in got:
            problem(msg)
    return check


# Ports this test has handed out: the kernel may give the same free port to two bind(0) calls in a
# row, and two of our processes told the same port would fight for it (one exits at start).
_handed_out = set()


def free_port():
    """A port nothing listens on now, never handed out before by this test. Another process may
    still take it before ours binds it; Procs.start_listening starts again on fresh ports then."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read()


def wait_for(what, check, timeout=20):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, urllib.error.URLError, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what} ({last})")


def until_passes(what, check, deadline_s):
    """Runs `check(problem)` until a run reports no problem, for at most `deadline_s` seconds,
    then reports the last run's problems as failures. For conditions that come true some time
    after the traffic that makes them (a refit, a scrape, a rule's evaluation, a remote write):
    a pass returns as soon as it holds, and only a failure waits for the deadline. Returns the
    seconds it took, or None."""
    started = time.monotonic()
    tries = 0
    while True:
        problems = []
        tries += 1
        check(problems.append)
        if not problems:
            if tries > 1:
                print(f"  {what}: passed on try {tries}, {time.monotonic() - started:.0f} s after the first",
                      flush=True)
            return time.monotonic() - started
        if time.monotonic() - started >= deadline_s:
            print(f"  {what}: {len(problems)} problem(s) left after {deadline_s:.0f} s", flush=True)
            for msg in problems:
                fail(f"{msg} (still so after {deadline_s:.0f} s)")
            return None
        time.sleep(1)


class Procs:
    """Processes this test started; all are stopped, in reverse order, by stop()."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.items = []

    def start(self, name, argv, **kw):
        log = open(os.path.join(self.logdir, name + ".log"), "w")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        self.items.append((name, p, log))
        return p

    def log_tail(self, name, lines=5):
        try:
            with open(os.path.join(self.logdir, name + ".log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:]).strip()
        except OSError:
            return ""

    def start_listening(self, name, argv_for, ports, ready, env=None, tries=3, timeout=20):
        """Starts a server on `ports` fresh ports (`argv_for(*ports)`) and waits until
        `ready(*ports)` holds; returns the ports. A port can be taken by another process between
        free_port() and the server's bind: the server then exits at start saying so, and it is
        started again on fresh ports (at most `tries` times). Any other early exit is a failure
        that quotes the end of the server's log."""
        for attempt in range(1, tries + 1):
            chosen = [free_port() for _ in range(ports)]
            p = self.start(name, argv_for(*chosen), **({"env": env} if env is not None else {}))
            deadline = time.monotonic() + timeout
            last = None
            while time.monotonic() < deadline:
                if p.poll() is not None:
                    break
                try:
                    if ready(*chosen):
                        return chosen
                except (OSError, urllib.error.URLError, ValueError) as e:
                    last = e
                time.sleep(0.2)
            else:
                raise RuntimeError(f"timed out waiting for {name} ({last}); log: {self.log_tail(name)}")
            tail = self.log_tail(name)
            for item in [item for item in self.items if item[1] is p]:
                item[2].close()
                self.items.remove(item)
            if "in use" not in tail.lower() or attempt == tries:
                raise RuntimeError(f"{name} exited at start with {p.returncode}: {tail}")
            print(f"  {name}: a port was taken before it bound ({tail.splitlines()[-1] if tail else ''}); "
                  f"starting it again on fresh ports", flush=True)
        raise AssertionError("unreachable")

    def check_alive(self):
        for name, p, _ in self.items:
            if p.poll() is not None and not name.startswith("load"):
                raise RuntimeError(f"{name} exited early with {p.returncode}; see {self.logdir}/{name}.log")

    def stop(self):
        for name, p, log in reversed(self.items):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            log.close()


class Prom:
    def __init__(self, port):
        self.base = f"http://127.0.0.1:{port}"

    def api(self, path, **params):
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params, doseq=True)
        try:
            _, body = http_get(url, timeout=15)
        except urllib.error.HTTPError as e:
            body = e.read()
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise ValueError(f"{doc.get('errorType')}: {doc.get('error')}")
        return doc["data"]

    def label_values(self, selector, label):
        data = self.api("series", **{"match[]": selector, "start": time.time() - 300, "end": time.time()})
        return sorted({s[label] for s in data if label in s})


def finite_values(data):
    """All finite sample values of a query result (vector, matrix or scalar)."""
    out = []
    rtype, result = data["resultType"], data["result"]
    if rtype == "scalar":
        result = [{"value": result}]
    for series in result if isinstance(result, list) else []:
        samples = series.get("values") or ([series["value"]] if "value" in series else [])
        for _, v in samples:
            f = float(v)
            if math.isfinite(f):
                out.append(f)
    return out


def query(prom, expr, range_query, step):
    now = time.time()
    if range_query:
        data = prom.api("query_range", query=expr, start=now - 30, end=now, step=step)
    else:
        data = prom.api("query", query=expr, time=now)
    return len(data["result"]) if isinstance(data["result"], list) else 1, finite_values(data)


def check_variables(prom, d):
    vs = dash.variables(d)
    got = {}
    for name in ("namespace", "pod", "model"):
        sel, label = dash.parse_label_values(dash.variable_query(vs[name]))
        values = dict(namespace=".*", pod=".*")
        values.update({k: dash.regex_escape(v[0]) for k, v in got.items() if v})
        sel = dash.substitute(sel, values)
        vals = prom.label_values(sel, label)
        got[name] = vals
        print(f"  ${name}: label_values({sel}, {label}) = {vals}")
        if not vals:
            fail(f"variable ${name} lists no values")
    expect_pods = {p for p, *_ in PODS}
    if got.get("namespace") != [NAMESPACE]:
        fail(f"$namespace lists {got.get('namespace')}, expected [{NAMESPACE!r}]")
    if set(got.get("pod", [])) != expect_pods:
        fail(f"$pod lists {got.get('pod')}, expected {sorted(expect_pods)}")
    return got


def check_panels(prom, d, concrete):
    builtins = dict(dash.BUILTINS, gpu_hour_price=PRICE, datasource="prometheus")
    passes = [
        ("All", dict(builtins, namespace=".*", pod=".*", model=".*")),
        (f"{concrete['namespace']}/{concrete['pod']}/{concrete['model']}",
         dict(builtins, **{k: dash.regex_escape(v) for k, v in concrete.items()})),
    ]
    checked = 0
    for pass_name, values in passes:
        for p in dash.panels(d):
            if p.get("type") == "row":
                continue
            for t in p.get("targets", []):
                where = f"[{pass_name}] panel {p['id']} {p['title']!r} target {t['refId']}"
                try:
                    expr = dash.substitute(t["expr"], values)
                except KeyError as e:
                    fail(f"{where}: no value for variable ${e.args[0]}")
                    continue
                range_query = not t.get("instant", False)
                try:
                    n, vals = query(prom, expr, range_query, step=values["__interval"])
                except ValueError as e:
                    fail(f"{where}: query error {e}\n    {expr}")
                    continue
                checked += 1
                if not vals:
                    fail(f"{where}: No data ({n} series, no finite value)\n    {expr}")
    print(f"  {checked} panel queries checked")


def autoscaling_queries(pod):
    """The PromQL the autoscaling examples run: the KEDA trigger's query, and the Prometheus
    adapter's metricsQuery as the adapter fills it in for `pod` and the HPA's class selector."""
    import yaml

    import check_manifests as cm

    out = []
    keda = REPO / "deploy" / "overlays" / "autoscale-keda" / "scaledobject.yaml"
    for t in yaml.safe_load(keda.read_text())["spec"]["triggers"]:
        out.append(("KEDA trigger query", t["metadata"]["query"]))
    hpa_dir = REPO / "deploy" / "overlays" / "autoscale-hpa"
    hpa = yaml.safe_load((hpa_dir / "hpa.yaml").read_text())
    adapter = yaml.safe_load((hpa_dir / "adapter-config.yaml").read_text())
    rules = {r["name"]["as"]: r for r in yaml.safe_load(adapter["data"]["config.yaml"])["rules"]}
    for m in hpa["spec"]["metrics"]:
        metric = m["pods"]["metric"]
        rule = rules[metric["name"]]
        extra = ",".join(f'{k}="{v}"' for k, v in metric.get("selector", {}).get("matchLabels", {}).items())
        out.append((f"adapter query for the HPA's {metric['name']}",
                    cm.fill_adapter_template(rule["metricsQuery"], rule["seriesQuery"], NAMESPACE, pod, extra)))
    return out


def check_autoscaling(prom):
    """Each autoscaling query returns a finite value from the live Prometheus."""
    for what, expr in autoscaling_queries(PODS[0][0]):
        _, vals = query(prom, expr, False, "1s")
        print(f"  {what}: {expr} = {vals[:3]}")
        if not vals:
            fail(f"{what} returns no data: {expr}")


def check_rules(prom):
    groups = prom.api("rules")["groups"]
    n_record = n_alert = 0
    for g in groups:
        for r in g["rules"]:
            if r.get("health") != "ok":
                fail(f"rule {r['name']} in {g['name']}: health {r.get('health')} {r.get('lastError', '')}")
            if r["type"] == "alerting":
                n_alert += 1
                continue
            n_record += 1
            _, vals = query(prom, r["query"], False, "1s")
            if not vals:
                fail(f"recording rule {r['name']} {r.get('labels', {})}: expression returns no data\n    {r['query']}")
            sel = r["name"] + "{" + ",".join(f'{k}="{v}"' for k, v in (r.get("labels") or {}).items()) + "}"
            _, vals = query(prom, sel, False, "1s")
            if not vals:
                fail(f"recorded series {sel} has no data")
    print(f"  {n_record} recording rules and {n_alert} alerts loaded and evaluated")
    if n_record == 0 or n_alert == 0:
        fail("Prometheus loaded no recording rules or no alerts")


def instant(prom, expr):
    """{frozenset(labels): value} of an instant query."""
    return {frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"): float(r["value"][1])
            for r in prom.api("query", query=expr, time=time.time())["result"]}


def check_slo_and_gpus(prom):
    classes = sorted(dict(k)["class"] for k in instant(prom, "count by (class) (tokenmeter_slo_requests_total)"))
    print(f"  class labels: {classes}")
    if classes != ["batch", "interactive", "strict"]:
        fail(f"tokenmeter_slo_requests_total class labels are {classes}, expected the declared batch, interactive, strict")
    results = instant(prom, "sum by (class, result) (tokenmeter_slo_requests_total)")
    got = {(dict(k)["class"], dict(k)["result"]): v for k, v in results.items()}
    print("  results: " + ", ".join(f"{c}/{r}={v:.0f}" for (c, r), v in sorted(got.items())))
    for want in [("interactive", "met"), ("batch", "met"), ("strict", "ttft_missed"), ("strict", "tps_missed"),
                 ("interactive", "error")]:
        if got.get(want, 0) <= 0:
            fail(f"no {want[0]} request with result {want[1]}")
    if got.get(("strict", "met"), 0) > got.get(("strict", "ttft_missed"), 0) + got.get(("strict", "tps_missed"), 0):
        fail("strict met more often than it missed, against a 100 ms TTFT and 100 tok/s floor at 50 tok/s")
    objectives = {dict(k)["class"]: v for k, v in instant(prom, "max by (class) (tokenmeter_slo_objective)").items()}
    if objectives != {"interactive": 0.95, "strict": 0.99, "batch": 0.95}:
        fail(f"tokenmeter_slo_objective is {objectives}")
    gpus = {(dict(k)["pod"], dict(k)["source"]): v for k, v in instant(prom, "tokenmeter_gpus").items()}
    print(f"  gpus: {gpus}")
    if gpus != {("vllm-llama-0", "flag"): 2.0, ("vllm-qwen-0", "nvidia_visible_devices"): 1.0}:
        fail(f"tokenmeter_gpus is {gpus}, expected 2 from the flag and 1 from NVIDIA_VISIBLE_DEVICES")
    cost = {dict(k)["pod"]: v for k, v in instant(prom, "tokenmeter_gpu_hour_cost").items()}
    if cost != {"vllm-llama-0": 1.8}:
        fail(f"tokenmeter_gpu_hour_cost is {cost}, expected 1.8 on vllm-llama-0 only")
    good = instant(prom, "sum(tokenmeter_goodput_output_tokens_total)")
    out = instant(prom, "sum(tokenmeter_output_tokens_total)")
    g, o = sum(good.values()), sum(out.values())
    print(f"  goodput {g:.0f} of {o:.0f} output tokens")
    if not 0 < g < o:
        fail(f"goodput {g} should be above 0 and below the {o} output tokens (strict misses, errors are cut)")


def check_tenants(prom):
    """vllm-llama-0 (--tenant-header x-tenant) labels the load's tenants and requests without
    the header as none; vllm-qwen-0, without the flag, has no tenant label at all."""
    got = {}
    for k in instant(prom, "count by (pod, tenant) (tokenmeter_requests_total)"):
        d = dict(k)
        got.setdefault(d["pod"], set()).add(d.get("tenant", ""))
    print(f"  tenants: {dict(sorted((p, sorted(t)) for p, t in got.items()))}")
    if got.get("vllm-llama-0") != {"team-a", "team-b", "none"}:
        fail(f"vllm-llama-0 tenants are {got.get('vllm-llama-0')}, expected team-a, team-b and none")
    if got.get("vllm-qwen-0") != {""}:
        fail(f"vllm-qwen-0 has tenant labels {got.get('vllm-qwen-0')} without --tenant-header")


def stop(p):
    """Stops a load client (its own process group) if it still runs."""
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait()


def check_bill(procs, prom, tm_bin, targets, loads):
    """5: the bill for a range from Prometheus against the two proxies' counters. The load is
    stopped so the range's edges are at rest (bill.py says why that makes the figures exact up
    to Prometheus's extrapolation); between them, BILL_BURST_S of traffic through both pods."""
    for p in loads.values():
        stop(p)
    pods = {pod: metrics for pod, _, metrics, _, _ in targets}
    start = bill.mark(pods)
    time.sleep(bill.QUIET_S)
    bursts = [procs.start(f"load-bill-{pod}", [
        sys.executable, str(HERE / "traffic.py"), "load", "--target", f"http://127.0.0.1:{listen}",
        "--duration", str(BILL_BURST_S), "--concurrency", "4", "--mix", "ok", "--models", models,
        "--tenants", LOAD_TENANTS, "--seed", str(100 + i),
    ]) for i, (pod, listen, _, models, _) in enumerate(targets)]
    for p in bursts:
        p.wait(timeout=60)
    end = bill.mark(pods)
    said = []

    def check(problem):
        problems, line = bill.check_store("Prometheus", tm_bin, prom.base, start, end, pods, prometheus=True)
        for msg in problems:
            problem(msg)
        said.append(line)

    if until_passes("the bill", check, BILL_DEADLINE_S) is not None:
        print(f"  {said[-1]}", flush=True)
    code, out, err = bill.run_cost(tm_bin, prom.base, start.t, end.t, fmt="table")
    print("\n".join("    " + line for line in (out or err).splitlines()), flush=True)


def in_flight(metrics_port):
    _, body = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("tokenmeter_requests_in_flight{"))


def check_drain_hook(procs, listen, metrics):
    """Runs the vLLM container's preStop hook from deploy/overlays/sidecar-vllm against a
    tokenmeter with streams open: it must return only after the last stream has finished (and
    within about a second of it), which is what lets a pod drain before vLLM gets SIGTERM."""
    import yaml  # the virtualenv of run.sh has it

    dep = yaml.safe_load((REPO / "deploy" / "overlays" / "sidecar-vllm" / "deployment.yaml").read_text())
    server = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"][0]
    cmd = server["lifecycle"]["preStop"]["exec"]["command"]
    if cmd[:2] != ["python3", "-c"] or "127.0.0.1:9090" not in cmd[2]:
        fail(f"vLLM preStop is not the python3 drain hook polling 127.0.0.1:9090: {cmd[:2]}")
        return
    script = cmd[2].replace("127.0.0.1:9090", f"127.0.0.1:{metrics}")
    wait_for("the pod's load to stop", lambda: in_flight(metrics) == 0)
    # Three streams of 300 tokens, 30 ms apart: about 9 s, longer than the hook's 5 s grace.
    streams = procs.start("drain-streams", [
        sys.executable, str(HERE / "traffic.py"), "load", "--target", f"http://127.0.0.1:{listen}",
        "--duration", "0.5", "--concurrency", "3", "--mix", "ok", "--min-tokens", "300",
        "--max-tokens", "300", "--gap-ms", "30", "--ttft-ms", "50", "--models", "drain-test",
    ])
    wait_for("three streams in flight", lambda: in_flight(metrics) >= 3)
    t0 = time.monotonic()
    hook = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    hook_end = time.monotonic()
    left = in_flight(metrics)
    streams.wait(timeout=60)
    streams_end = time.monotonic()
    print(f"  hook returned after {hook_end - t0:.1f}s with {left:.0f} in flight; "
          f"streams done {streams_end - t0:.1f}s after it started")
    if hook.returncode != 0:
        fail(f"drain hook exited {hook.returncode}: {hook.stderr.strip()[-300:]}")
    if left != 0:
        fail(f"drain hook returned with {left} requests still in flight")
    if hook_end - t0 < 6:
        fail(f"drain hook returned after {hook_end - t0:.1f}s, before the streams could finish")
    if streams_end - hook_end > 2.5:
        fail("the streams finished long after the drain hook returned")


def main():
    tm_bin = os.environ.get("TOKENMETER_BIN", str(REPO / "target" / "release" / "tokenmeter"))
    prom_bin = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    traffic_s = float(os.environ.get("LIVE_TRAFFIC_SECONDS", "40"))
    if not os.access(tm_bin, os.X_OK):
        print(f"live_test: {tm_bin} not found: run cargo build --release first", file=sys.stderr)
        return 1
    if not prom_bin:
        print("live_test: prometheus not found (apt-get install -y prometheus)", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="tokenmeter-live-")
    procs = Procs(tmp)
    started = time.monotonic()
    try:
        # Upstream.
        port_file = os.path.join(tmp, "upstream.port")
        procs.start("upstream", [sys.executable, str(HERE / "traffic.py"), "upstream", "--port-file", port_file])
        wait_for("the upstream", lambda: os.path.exists(port_file))
        upstream = f"http://127.0.0.1:{open(port_file).read().strip()}"

        # Two tokenmeters, one per "pod".
        targets = []
        for pod, flags, env, models, steps in PODS:
            clean = {k: v for k, v in os.environ.items() if not k.endswith("_VISIBLE_DEVICES")}
            listen, metrics = procs.start_listening(
                f"tokenmeter-{pod}", lambda listen, metrics, flags=flags: [
                    tm_bin, "--upstream", upstream, "--listen", f"127.0.0.1:{listen}",
                    "--metrics-listen", f"127.0.0.1:{metrics}", *flags,
                    "--upstream-timeout", "2s", "--rate-window", "5s",
                    *[a for c in SLO_CLASSES for a in ("--slo", c)],
                ], 2, lambda _l, m: http_get(f"http://127.0.0.1:{m}/readyz")[0] == 200, env=dict(clean, **env))
            targets.append((pod, listen, metrics, models, steps))

        # Prometheus, scraping both with the labels a PodMonitor would add.
        prom_port = free_port()
        scrape = [
            {"targets": [f"127.0.0.1:{metrics}"], "labels": {"namespace": NAMESPACE, "pod": pod, "container": "tokenmeter"}}
            for pod, _, metrics, _, _ in targets
        ]
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(REPO / "deploy" / "prometheus" / "rules.yml")],
            "scrape_configs": [{"job_name": "tokenmeter", "static_configs": scrape}],
        }
        cfg_path = os.path.join(tmp, "prometheus.yml")
        with open(cfg_path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        procs.start("prometheus", [
            prom_bin, f"--config.file={cfg_path}", f"--storage.tsdb.path={tmp}/data",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ])
        prom = Prom(prom_port)
        wait_for("prometheus", lambda: http_get(f"{prom.base}/-/ready")[0] == 200, timeout=30)

        # Traffic: each load client runs until the test stops it, so rates and gauges are live
        # however long the checks take; its ramp's steps are as long as when it ran for the
        # traffic and 30 s more.
        loads = {}
        for pod, listen, _, models, steps in targets:
            loads[pod] = procs.start(f"load-{pod}", [
                sys.executable, str(HERE / "traffic.py"), "load", "--target", f"http://127.0.0.1:{listen}",
                "--duration", str(LOAD_BOUND_S), "--step-seconds", f"{(traffic_s + 30) / len(steps.split(','))}",
                "--concurrency", steps, "--models", models,
                "--seed", str(len(procs.items)), "--classes", LOAD_CLASSES, "--tenants", LOAD_TENANTS,
            ])
        wait_for("both targets up", lambda: len([r for r in prom.api("query", query="up == 1")["result"]]) == len(targets))
        print(f"live_test: traffic for at least {traffic_s:.0f}s (logs in {tmp})", flush=True)
        deadline = time.monotonic() + traffic_s
        while time.monotonic() < deadline:
            procs.check_alive()
            time.sleep(1)

        def checks():
            procs.check_alive()
            print("live_test: template variables", flush=True)
            got = check_variables(prom, dash.load())
            concrete = {
                "namespace": NAMESPACE,
                "pod": PODS[0][0],
                "model": PODS[0][3].split(",")[0],
            }
            if concrete["model"] not in got.get("model", []):
                fail(f"model {concrete['model']} missing from $model values {got.get('model')}")
            print("live_test: dashboard panels", flush=True)
            check_panels(prom, dash.load(), concrete)
            print("live_test: rules", flush=True)
            check_rules(prom)
            print("live_test: autoscaling queries (deploy/overlays/autoscale-*)", flush=True)
            check_autoscaling(prom)
            print("live_test: SLO classes and GPU sources", flush=True)
            check_slo_and_gpus(prom)
            print("live_test: tenants", flush=True)
            check_tenants(prom)

        # Some answers come a while after the traffic that makes them (the capacity model's fit
        # and first-token replay, a rule over a recording, a 5m window's first rate): the
        # checks run again until they all pass, or CHECKS_DEADLINE_S.
        until_passes("the checks", collected(checks), CHECKS_DEADLINE_S)
        print("live_test: the bill for a range from Prometheus (tokenmeter cost --prometheus)", flush=True)
        check_bill(procs, prom, tm_bin, targets, loads)
        print("live_test: the sidecar's drain hook (vLLM preStop)", flush=True)
        pod, listen, metrics, _, _ = targets[0]
        stop(loads[pod])
        check_drain_hook(procs, listen, metrics)
    except Exception as e:  # noqa: BLE001 - report any setup failure as a test failure
        fail(f"{type(e).__name__}: {e}")
    finally:
        procs.stop()
    elapsed = time.monotonic() - started
    for name in sorted(os.listdir(tmp)):
        if name.startswith("load-") and name.endswith(".log"):
            with open(os.path.join(tmp, name)) as f:
                print(f"  {name[:-4]}: {f.read().strip()[-400:]}")
    if failures:
        print(f"live_test: {len(failures)} failure(s) in {elapsed:.0f}s; logs kept in {tmp}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"live_test: ok in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
