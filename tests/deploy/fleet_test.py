#!/usr/bin/env python3
"""The fleet test: several tokenmeter pods, scraped by a real Prometheus that only forwards
(agent mode, remote_write) into VictoriaMetrics, where vmalert evaluates the recording rules;
the rules and the dashboard's own queries must return the fleet's tokens/s, tokens/s per GPU
and percentiles across pods, with the values the load generated.

On loopback only, in a temporary directory, it starts:
  - per pod in PODS, a `tokenmeter sim` (each its own engine, at its own speed) and a tokenmeter
    in front of it with its own --gpus and --gpu-hour-cost,
  - VictoriaMetrics (Debian's `victoria-metrics`, single node) as the central store,
  - Prometheus (Debian's package) in agent mode: it scrapes every pod each second with the
    labels a PodMonitor adds (namespace, pod, container), adds the external label
    `cluster` and remote_writes everything into VictoriaMetrics; it evaluates no rules,
  - vmalert (shipped in the same Debian package) with deploy/prometheus/rules.yml unchanged,
    querying VictoriaMetrics and writing the recorded series back into it, alerts to a sink,
  - `tokenmeter bench` through every pod (a fixed number of streams, one model), for at least
    FLEET_TRAFFIC_SECONDS and until the recordings the checks read are in the store; then the
    test stops it (SIGINT: the streams in flight finish and the bench writes its figures).
The rules run in the central store and not in the Prometheus that scrapes: in a fleet, each
scraping Prometheus sees only its own shard of the pods, and a fleet-wide sum has to be taken
where all the pods' series are (vmalert here; the Thanos or Mimir ruler elsewhere).

Then, against VictoriaMetrics' Prometheus-compatible API (and vmalert's for the rules' health):
  1. every pod's raw series arrived with its labels and the external label;
  2. every rule vmalert loaded is healthy, and every recording rule's series is in the store;
  3. the fleet's tokens/s (`:tokenmeter_output_tokens:rate5m` and the dashboard's "Output
     tokens/s" query) equals the sum of the pods' (`namespace_pod:...`) within 1%, and the sum of
     what the load clients measured within RATE_TOLERANCE;
  4. tokens/s per GPU: the fleet's rule and the dashboard's "Tokens/s per GPU" query equal the
     fleet's tokens/s over the GPUs of all pods (within 1%), each pod's over its own;
  5. percentiles across pods: the per-model p50 of per-request tokens/s and of TTFT (the rules
     and the dashboard's percentile panels) lie between the pods' own p50s, which are apart by
     construction (the pods decode at different speeds), and each pod's p50 is within one
     histogram bucket of its load client's own median;
  6. once the load has stopped, the fleet's token total in the store equals, exactly, the
     tokens the simulators generated, pod by pod;
  7. every other dashboard query runs in VictoriaMetrics without an error (MetricsQL accepts it);
  8. the second case, federation: a cluster's Prometheus (rules.yml loaded) scrapes the same pods
     and a global Prometheus federates its recorded series and the raw token counter: the
     fleet's tokens/s there is the sum of its per-pod recordings, per GPU over the 6 GPUs, the
     per-request p50 between the pods', the token total exactly the simulators';
  9. capacity: a short ramp through every pod (RAMP) gives each pod's capacity model the three
     concurrencies it fits from; once every pod exports tokenmeter_capacity_utilization, the
     capacity recordings (the mean and its 30-minute prediction) must reach the store, and then
     every rule vmalert loaded is healthy with every recorded series in the store (2);
 10. the bill for a range: from an instant at rest before the ramp to one at rest after it,
     `tokenmeter cost --prometheus` against VictoriaMetrics and against the cluster's Prometheus
     must give the GPU-seconds, output tokens and dollars both pods' own counters moved, summed
     over the pods: exactly from VictoriaMetrics, within Prometheus's extrapolation of
     increase() from Prometheus (tests/deploy/bill.py says why).
Each of 6, 8, 9 and 10 waits for its condition (a scrape, a remote write, a rule's evaluation, a
refit), up to a deadline said at its constant, never for a fixed time.
Exits 1 listing each failure. Environment: TOKENMETER_BIN (default target/release/tokenmeter),
PROMETHEUS, VICTORIA_METRICS, VMALERT (default: on PATH), FLEET_TRAFFIC_SECONDS (default 20: the
least load the figures are averaged over).
"""

import http.server
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import bill
import dashboard as dash
import live_test as lt

REPO = lt.REPO
NAMESPACE = "inference"
CLUSTER = "ci-east"
MODEL = "llama-3.1-8b-instruct"
# (pod, --gpus, simulator decode step): one engine twice as fast per stream as the other, so
# per-request speed and TTFT differ by pod and a percentile across pods is not any one pod's.
PODS = [
    ("vllm-llama-0", 2, "10ms"),
    ("vllm-llama-1", 4, "20ms"),
]
PRICE = "2.50"
CONCURRENCY = 4
OUTPUT_TOKENS = 64
# The rules' 5-minute rates cover every sample since the load began (the test is shorter), the
# load client's figure the whole load: both are the mean of a steady closed loop, apart by the
# first scrape's delay and the last seconds the snapshot does not see.
RATE_TOLERANCE = 0.10
# Two aggregations of the same series in the same evaluation: only rounding and the one sample
# that may arrive between two queries separate them.
SAME_TOLERANCE = 0.01
# The load clients' --duration: only a bound; the test stops them once it has its snapshot.
LOAD_BOUND_S = 600
# Deadlines (a loaded 2-core machine; a pass returns as soon as its condition holds):
# - the deepest recording chain (a histogram rate, then a quantile over it, each one vmalert
#   evaluation and one remote write later) reaches the store about 5 s into the load here;
SNAPSHOT_DEADLINE_S = 120
# - the last tokens reach the store with the next scrape (1 s) and remote_write batch (1 s), the
#   global Prometheus with the cluster's scrape and its own federation scrape (1 s each);
TOTALS_DEADLINE_S = 60
# - the capacity recordings: the ramp (3 levels of RAMP_LEVEL_S), a refit (at most
#   capacity::REFIT_INTERVAL, 5 s, after a scrape), a scrape and remote write, vmalert's
#   mean, then its prediction over at least two of the mean's samples: some 20 s.
CAPACITY_DEADLINE_S = 120
# - the bill's last samples at rest reach VictoriaMetrics with the next remote_write batch (1 s):
#   the bill is asked for REMOTE_WRITE_S after its range ends, and again until BILL_DEADLINE_S.
REMOTE_WRITE_S = 2
BILL_DEADLINE_S = 30
# The capacity model fits a line through at least three concurrencies (crates/tokenmeter/src/capacity/fit.rs,
# MIN_POINTS, 20 token samples each). The steady load holds CONCURRENCY streams in lockstep:
# it gives one, and others only as its streams start and end, by chance. The ramp gives three,
# far enough apart for the fit's slope to stand clear of its noise (capacity::support), each
# RAMP_LEVEL_S long: at 10-20 ms steps a stream makes 50-100 tokens/s, a level some
# hundred samples or more, five times what a concurrency needs.
RAMP = "1,4,8"
RAMP_LEVEL_S = 3
CAPACITY_RECORDINGS = ["namespace_class:tokenmeter_capacity_utilization:avg",
                       "namespace_class:tokenmeter_capacity_utilization:predict_linear30m"]
# tokenmeter_request_tokens_per_second's and TTFT's bucket boundaries (crates/tokenmeter/src/metrics/buckets.rs).
TPS_BUCKETS = [1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 150, 200, 300, 500, 750, 1000, 2000, 5000, 10000]
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]

fail = lt.fail


class AlertSink(http.server.BaseHTTPRequestHandler):
    """Stands in for Alertmanager: vmalert's notifier posts alerts here; they are counted."""

    posts = 0

    def do_POST(self):  # noqa: N802 - the http.server hook's name
        self.rfile.read(int(self.headers.get("content-length", 0)))
        AlertSink.posts += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_):
        pass


def close(a, b, tol):
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-9)


def one(prom, expr, at):
    """The single finite value of an instant query at `at` (None when there is none)."""
    data = prom.api("query", query=expr, time=at)
    vals = lt.finite_values(data)
    return vals[0] if len(vals) == 1 else None


def by_pod(prom, expr, at):
    return {r["metric"].get("pod"): float(r["value"][1]) for r in prom.api("query", query=expr, time=at)["result"]}


def bucket_of(value, bounds):
    """(lower, upper) boundaries of the bucket a value falls in."""
    lo = 0.0
    for b in bounds:
        if value <= b:
            return lo, b
        lo = b
    return lo, math.inf


def panel_exprs(d, title, values):
    """The dashboard's queries of the panel titled `title`, variables substituted."""
    out = [dash.substitute(t["expr"], values) for p in dash.panels(d) if p.get("title") == title
           for t in p.get("targets", [])]
    if not out:
        raise RuntimeError(f"the dashboard has no panel titled {title!r}")
    return out


def flush(vm):
    """Makes what VictoriaMetrics has received searchable now: it buffers new samples in memory
    for a few seconds before queries see them (fine for dashboards, slow for a test)."""
    lt.http_get(f"{vm.base}/internal/force_flush")


def client_tps(bench_json):
    """What one load client measured: aggregate tokens/s over its whole run."""
    return json.load(open(bench_json))["levels"][0]["aggregate_tps"]


def check_arrival(vm):
    got = vm.api("query", query="tokenmeter_build_info", time=time.time())["result"]
    seen = {(r["metric"].get("namespace"), r["metric"].get("pod"), r["metric"].get("cluster")) for r in got}
    want = {(NAMESPACE, pod, CLUSTER) for pod, *_ in PODS}
    print(f"  tokenmeter_build_info in the store: {sorted(seen)}")
    if seen != want:
        fail(f"raw series in VictoriaMetrics carry {sorted(seen)}, expected {sorted(want)}")


def check_rules(vm, vmalert, problem):
    _, body = lt.http_get(f"{vmalert}/api/v1/rules")
    groups = json.loads(body)["data"]["groups"]
    records = set()
    n_alert = 0
    for g in groups:
        for r in g["rules"]:
            if r.get("lastError"):
                problem(f"vmalert rule {r['name']} in {g['name']}: {r['lastError']}")
            if r["type"] == "recording":
                records.add(r["name"])
            else:
                n_alert += 1
    flush(vm)
    empty = sorted(n for n in records if not lt.finite_values(vm.api("query", query=n, time=time.time())))
    if not records or not n_alert:
        problem("vmalert loaded no recording rules or no alerts")
    for n in empty:
        problem(f"recorded series {n} has no data in VictoriaMetrics")
    return f"{len(records)} recorded series, {n_alert} alerts, in {len(groups)} groups"


def check_values(vm, d, at, loads):
    """3, 4 and 5: the fleet's figures at `at` (while the load runs) against the pods' and the load's."""
    values = dict(dash.BUILTINS, namespace=".*", pod=".*", model=".*", gpu_hour_price=PRICE,
                  datasource="victoriametrics")
    gpus = {pod: g for pod, g, _ in PODS}
    fleet = one(vm, ":tokenmeter_output_tokens:rate5m", at)
    pods = by_pod(vm, "namespace_pod:tokenmeter_output_tokens:rate5m", at)
    panel = one(vm, panel_exprs(d, "Output tokens/s", values)[0], at)
    client = sum(client_tps(p) for p in loads.values())
    print(f"  fleet tokens/s: rule {fleet}, panel {panel}, pods {pods}, load clients {client:.1f}")
    if fleet is None or panel is None or set(pods) != set(gpus):
        fail(f"fleet tokens/s missing: rule {fleet}, panel {panel}, pods {sorted(pods)}")
        return
    if not close(fleet, sum(pods.values()), SAME_TOLERANCE):
        fail(f"fleet tokens/s {fleet:.1f} is not the sum of the pods' {sum(pods.values()):.1f}")
    if not close(fleet, client, RATE_TOLERANCE):
        fail(f"fleet tokens/s {fleet:.1f} is not the load clients' {client:.1f} within {RATE_TOLERANCE:.0%}")
    if not close(panel, client, RATE_TOLERANCE):
        fail(f"the Output tokens/s panel says {panel:.1f}, the load clients {client:.1f}")
    for pod, path in loads.items():
        c = client_tps(path)
        if not close(pods[pod], c, RATE_TOLERANCE):
            fail(f"{pod}: tokens/s {pods[pod]:.1f}, its load client {c:.1f}")

    per_gpu = one(vm, ":tokenmeter_output_tokens_per_gpu:rate5m", at)
    per_gpu_panel = one(vm, panel_exprs(d, "Tokens/s per GPU", values)[0], at)
    pod_per_gpu = by_pod(vm, "namespace_pod:tokenmeter_output_tokens_per_gpu:rate5m", at)
    want = fleet / sum(gpus.values())
    print(f"  tokens/s per GPU: rule {per_gpu}, panel {per_gpu_panel}, want {want:.2f} "
          f"({fleet:.1f} over {sum(gpus.values())} GPUs); pods {pod_per_gpu}")
    for what, v in [("rule", per_gpu), ("Tokens/s per GPU panel", per_gpu_panel)]:
        if v is None or not close(v, want, SAME_TOLERANCE):
            fail(f"fleet tokens/s per GPU ({what}) is {v}, expected {want:.2f}")
    for pod, g in gpus.items():
        if pod not in pod_per_gpu or not close(pod_per_gpu[pod], pods[pod] / g, SAME_TOLERANCE):
            fail(f"{pod}: tokens/s per GPU {pod_per_gpu.get(pod)}, expected {pods[pod] / g:.2f}")

    for family, rule, title, bounds, key in [
        ("tokenmeter_request_tokens_per_second",
         'namespace_model:tokenmeter_request_tokens_per_second:histogram_quantile_rate5m{quantile="0.5"}',
         "Per-request decode speed (p50 / p90 / p99)", TPS_BUCKETS, "request_tps"),
        ("tokenmeter_time_to_first_token_seconds",
         'namespace_model:tokenmeter_time_to_first_token_seconds:histogram_quantile_rate5m{quantile="0.5"}',
         "Time to first token (p50 / p90 / p99)", TTFT_BUCKETS, "ttft"),
    ]:
        pod_p50 = by_pod(vm, f"histogram_quantile(0.5, sum by (pod, le) (rate({family}_bucket[5m])))", at)
        fleet_p50 = one(vm, rule, at)
        panel_p50 = one(vm, panel_exprs(d, title, values)[0], at)
        print(f"  {family} p50: fleet rule {fleet_p50}, panel {panel_p50}, pods {pod_p50}")
        if fleet_p50 is None or panel_p50 is None or set(pod_p50) != set(gpus):
            fail(f"{family}: p50 missing (rule {fleet_p50}, panel {panel_p50}, pods {sorted(pod_p50)})")
            continue
        lo, hi = min(pod_p50.values()), max(pod_p50.values())
        if bucket_of(lo, bounds) == bucket_of(hi, bounds):
            fail(f"{family}: the pods' p50s {pod_p50} fall in one bucket: the test cannot tell a fleet "
                 "percentile from a pod's")
        for what, v in [("rule", fleet_p50), ("panel", panel_p50)]:
            if not lo <= v <= hi:
                fail(f"{family}: the fleet's p50 ({what}) {v} is not between the pods' {lo} and {hi}")
        for pod, path in loads.items():
            truth = json.load(open(path))["levels"][0][key]["p50"]
            b = bucket_of(pod_p50[pod], bounds)
            if not b[0] <= truth <= b[1]:
                fail(f"{pod}: {family} p50 {pod_p50[pod]:.4g} is in bucket {b}, its load client's "
                     f"median {truth:.4g} is not")


def check_totals(vm, sims, problem):
    """6: after the load, the store's token total per pod is what each simulator generated."""
    flush(vm)
    got = by_pod(vm, "sum by (pod) (tokenmeter_output_tokens_total)", time.time())
    fleet = one(vm, "sum(tokenmeter_output_tokens_total)", time.time())
    want = {}
    for pod, port in sims.items():
        _, body = lt.http_get(f"http://127.0.0.1:{port}/sim/stats")
        s = json.loads(body)
        want[pod] = float(s["output_tokens"])
        if s["cancelled"]:
            problem(f"{pod}: the simulator cancelled {s['cancelled']} requests; the exact total needs none")
    if got != want:
        problem(f"token totals in VictoriaMetrics {got} differ from the simulators' {want}")
    if fleet != sum(want.values()):
        problem(f"the fleet's token total {fleet} is not the simulators' {sum(want.values())}")
    return f"store {got} (fleet {fleet}), simulators {want}"


def check_federation(glob, vm, at):
    """8: the second case, federation. A cluster's Prometheus evaluates the rules over its own
    pods; a global Prometheus federates the recorded series (and the raw token counter) from it.
    Its fleet figures must be the sums of its per-pod ones, its percentile between the pods', and
    its token total the simulators'. (Its 5-minute rates are not the store's here: Prometheus
    divides an increase by the whole window, so a rate over a series younger than 5 minutes
    reads low until the window is full; VictoriaMetrics divides by the time the samples span.)"""
    fed = one(glob, ":tokenmeter_output_tokens:rate5m", at)
    stored = one(glob, "sum(namespace_pod:tokenmeter_output_tokens:rate5m)", at)
    per_gpu = one(glob, ":tokenmeter_output_tokens_per_gpu:rate5m", at)
    p50 = one(glob, 'namespace_model:tokenmeter_request_tokens_per_second:histogram_quantile_rate5m{quantile="0.5"}', at)
    pods = by_pod(vm, "histogram_quantile(0.5, sum by (pod, le) (rate(tokenmeter_request_tokens_per_second_bucket[5m])))", at)
    print(f"  federated: fleet tokens/s {fed} (sum of its pods' {stored}), per GPU {per_gpu}, "
          f"per-request p50 {p50} (pods {pods})")
    if fed is None or stored is None or not fed > 0 or not close(fed, stored, SAME_TOLERANCE):
        fail(f"federated fleet tokens/s {fed} is not the sum of its pods' {stored}")
    elif per_gpu is None or not close(per_gpu, fed / sum(g for _, g, _ in PODS), SAME_TOLERANCE):
        fail(f"federated tokens/s per GPU {per_gpu} is not {fed:.1f} over the GPUs")
    if p50 is None or not pods or not min(pods.values()) <= p50 <= max(pods.values()):
        fail(f"federated per-request p50 {p50} is not between the pods' {pods}")


def check_federated_total(glob, sims, problem):
    """8, after the load: the global Prometheus's token total is the simulators'."""
    got = one(glob, "sum(tokenmeter_output_tokens_total)", time.time())
    want = 0.0
    for port in sims.values():
        want += float(json.loads(lt.http_get(f"http://127.0.0.1:{port}/sim/stats")[1])["output_tokens"])
    if got != want:
        problem(f"the federated token total {got} is not the simulators' {want}")
    return f"federated token total {got}, simulators {want}"


def check_capacity(vm, problem):
    """9: every pod's capacity utilization, and the two recordings over it, are in the store."""
    flush(vm)
    pods = by_pod(vm, "tokenmeter_capacity_utilization", time.time())
    missing = sorted(p for p, *_ in PODS if p not in pods)
    if missing:
        problem(f"no tokenmeter_capacity_utilization from {missing} in the store (no capacity fit yet: "
                "see their /metrics, tokenmeter_capacity_observed_concurrency)")
    for rec in CAPACITY_RECORDINGS:
        if not lt.finite_values(vm.api("query", query=rec, time=time.time())):
            problem(f"recorded series {rec} has no data in VictoriaMetrics")
    return f"utilization {pods}"


def check_all_panels(vm, d, at):
    """7: every dashboard query runs in VictoriaMetrics (MetricsQL) without an error."""
    values = dict(dash.BUILTINS, namespace=".*", pod=".*", model=".*", gpu_hour_price=PRICE,
                  datasource="victoriametrics")
    n = empty = 0
    for p in dash.panels(d):
        for t in p.get("targets", []):
            expr = dash.substitute(t["expr"], values)
            try:
                data = vm.api("query_range", query=expr, start=at - 30, end=at, step="5s")
            except ValueError as e:
                fail(f"panel {p['title']!r} {t['refId']}: VictoriaMetrics refused the query: {e}\n    {expr}")
                continue
            n += 1
            empty += not lt.finite_values(data)
    print(f"  {n} dashboard queries ran in VictoriaMetrics ({empty} without data here: features this "
          "fleet does not use, e.g. reasoning, prompt cache, failures)")


def main():
    tm_bin = os.environ.get("TOKENMETER_BIN", str(REPO / "target" / "release" / "tokenmeter"))
    prom_bin = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    vm_bin = os.environ.get("VICTORIA_METRICS") or shutil.which("victoria-metrics")
    vmalert_bin = os.environ.get("VMALERT") or shutil.which("vmalert")
    traffic_s = float(os.environ.get("FLEET_TRAFFIC_SECONDS", "20"))
    if not os.access(tm_bin, os.X_OK) or not prom_bin or not vm_bin or not vmalert_bin:
        print("fleet_test: needs target/release/tokenmeter, prometheus, victoria-metrics and vmalert "
              "(apt-get install prometheus victoria-metrics)", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="tokenmeter-fleet-")
    procs = lt.Procs(tmp)
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AlertSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    started = time.monotonic()
    try:
        vm_port = lt.free_port()
        procs.start("victoria-metrics", [
            vm_bin, f"-storageDataPath={tmp}/vm", f"-httpListenAddr=127.0.0.1:{vm_port}",
            "-retentionPeriod=1d", "-loggerLevel=WARN",
            # Queries see a sample as soon as it is written (default: 30 s later), uncached.
            "-search.latencyOffset=1s", "-search.disableCache",
        ])
        vm = lt.Prom(vm_port)
        lt.wait_for("victoria-metrics", lambda: lt.http_get(f"{vm.base}/health")[0] == 200, timeout=30)

        sims, targets = {}, []
        for pod, gpus, step in PODS:
            (sim_port,) = procs.start_listening(
                f"sim-{pod}", lambda port, step=step: [
                    tm_bin, "sim", "--listen", f"127.0.0.1:{port}", "--model", MODEL, "--step-base", step,
                    # A step that visibly grows with the batch (5-10% a stream): the slope the
                    # capacity model must see clear of its noise to answer (capacity::support).
                    "--step-per-seq", "1ms"],
                1, lambda port: lt.http_get(f"http://127.0.0.1:{port}/v1/models")[0] == 200)
            listen, metrics = procs.start_listening(
                f"tokenmeter-{pod}", lambda listen, metrics, gpus=gpus, sim_port=sim_port: [
                    tm_bin, "--upstream", f"http://127.0.0.1:{sim_port}", "--listen", f"127.0.0.1:{listen}",
                    "--metrics-listen", f"127.0.0.1:{metrics}", "--gpus", str(gpus), "--gpu-hour-cost", PRICE,
                    "--no-ui",
                ], 2, lambda _l, m: lt.http_get(f"http://127.0.0.1:{m}/readyz")[0] == 200)
            sims[pod] = sim_port
            targets.append((pod, listen, metrics))

        prom_port = lt.free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "external_labels": {"cluster": CLUSTER}},
            "scrape_configs": [{"job_name": "tokenmeter", "static_configs": [
                {"targets": [f"127.0.0.1:{m}"], "labels": {"namespace": NAMESPACE, "pod": pod, "container": "tokenmeter"}}
                for pod, _, m in targets]}],
            "remote_write": [{
                "url": f"http://127.0.0.1:{vm_port}/api/v1/write",
                "queue_config": {"batch_send_deadline": "1s", "max_samples_per_send": 5000},
            }],
        }
        cfg_path = os.path.join(tmp, "prometheus.yml")
        with open(cfg_path, "w") as f:
            json.dump(config, f)
        procs.start("prometheus", [
            prom_bin, "--enable-feature=agent", f"--config.file={cfg_path}", f"--storage.agent.path={tmp}/agent",
            f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn",
        ])
        lt.wait_for("prometheus", lambda: lt.http_get(f"http://127.0.0.1:{prom_port}/-/ready")[0] == 200, timeout=30)

        # The second case: a cluster's Prometheus with the rules, federated by a global one.
        cluster_port, global_port = lt.free_port(), lt.free_port()
        cluster_cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s",
                       "external_labels": {"cluster": CLUSTER}},
            "rule_files": [str(REPO / "deploy" / "prometheus" / "rules.yml")],
            "scrape_configs": config["scrape_configs"],
        }
        global_cfg = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{
                "job_name": "federate", "honor_labels": True, "metrics_path": "/federate",
                "params": {"match[]": ['{__name__=~"namespace.*:tokenmeter_.*|:tokenmeter_.*"}',
                                       '{__name__="tokenmeter_output_tokens_total"}']},
                "static_configs": [{"targets": [f"127.0.0.1:{cluster_port}"]}],
            }],
        }
        for name, port, cfg in [("prometheus-cluster", cluster_port, cluster_cfg),
                                ("prometheus-global", global_port, global_cfg)]:
            path = os.path.join(tmp, f"{name}.yml")
            with open(path, "w") as f:
                json.dump(cfg, f)
            procs.start(name, [prom_bin, f"--config.file={path}", f"--storage.tsdb.path={tmp}/{name}",
                               f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"])
        glob = lt.Prom(global_port)
        for port in (cluster_port, global_port):
            lt.wait_for("prometheus", lambda p=port: lt.http_get(f"http://127.0.0.1:{p}/-/ready")[0] == 200, timeout=30)

        vmalert_port = lt.free_port()
        procs.start("vmalert", [
            vmalert_bin, f"-rule={REPO / 'deploy' / 'prometheus' / 'rules.yml'}",
            f"-datasource.url=http://127.0.0.1:{vm_port}", f"-remoteWrite.url=http://127.0.0.1:{vm_port}",
            f"-notifier.url=http://127.0.0.1:{sink.server_address[1]}", "-evaluationInterval=1s",
            "-remoteWrite.flushInterval=1s", f"-httpListenAddr=127.0.0.1:{vmalert_port}", "-loggerLevel=WARN",
        ])
        vmalert = f"http://127.0.0.1:{vmalert_port}"
        lt.wait_for("vmalert", lambda: lt.http_get(f"{vmalert}/-/healthy")[0] == 200, timeout=30)
        lt.wait_for("every pod in the store", lambda: len(vm.api(
            "query", query="tokenmeter_build_info", time=time.time())["result"]) == len(PODS), timeout=30)

        def bench(pod, listen, name, levels, duration):
            out = os.path.join(tmp, f"{name}-{pod}")
            p = procs.start(f"{name}-{pod}", [
                tm_bin, "bench", "--target", f"http://127.0.0.1:{listen}", "--model", MODEL,
                "--concurrency", levels, "--duration", duration,
                "--prompt-tokens", "40", "--output-tokens", str(OUTPUT_TOKENS), "--out", out,
            ])
            return p, os.path.join(out, "bench.json")

        loads, load_procs = {}, []
        for pod, listen, _ in targets:
            p, loads[pod] = bench(pod, listen, "load", str(CONCURRENCY), f"{LOAD_BOUND_S}s")
            load_procs.append(p)
        load_start = time.time()
        print(f"fleet_test: {len(PODS)} pods, {CONCURRENCY} streams each for at least {traffic_s:.0f}s "
              f"(logs in {tmp})", flush=True)
        # The snapshot `at` is taken while the load runs, at least traffic_s into it, once the
        # deepest recording chain has data there: recorded series built on recorded series
        # reach the store some seconds after their inputs (per level: one evaluation, one
        # remote_write flush, and the store's in-memory buffer, which vmalert's own queries wait
        # for). `at` is 2 s before the query that finds it: a scrape (1 s) and remote_write's
        # batch (1 s), so the raw series have their samples up to it. Then the load is stopped.
        deepest = 'namespace_model:tokenmeter_request_tokens_per_second:histogram_quantile_rate5m{quantile="0.5"}'
        at = None
        while at is None:
            procs.check_alive()
            if any(p.poll() is not None for p in load_procs):
                raise RuntimeError(f"a load client ended before the snapshot; see {tmp}")
            flush(vm)
            now = time.time()
            if lt.finite_values(vm.api("query", query=deepest, time=now - 2)):
                if now - load_start >= traffic_s:
                    at = now - 2
                    print(f"  snapshot {at - load_start:.1f}s after the load began", flush=True)
                    break
            elif now - load_start > traffic_s + SNAPSHOT_DEADLINE_S:
                fail(f"{deepest} had no data {traffic_s + SNAPSHOT_DEADLINE_S:.0f} s after the load began")
                at = now - 2
                break
            time.sleep(0.5)
        for p in load_procs:
            p.send_signal(signal.SIGINT)
        for p in load_procs:
            # Interrupted, the bench lets its streams finish (under 2 s) and writes its figures.
            p.wait(timeout=60)
            if p.returncode not in (0, 130):
                raise RuntimeError(f"a load client exited {p.returncode}; see {tmp}")

        flush(vm)
        d = dash.load()
        print("fleet_test: series in the store", flush=True)
        check_arrival(vm)
        print("fleet_test: the fleet's figures from the rules and the dashboard", flush=True)
        check_values(vm, d, at, loads)
        print("fleet_test: every dashboard query in VictoriaMetrics", flush=True)
        check_all_panels(vm, d, at)
        print("fleet_test: exact token totals", flush=True)
        said = []
        if lt.until_passes("token totals", lambda problem: said.append(check_totals(vm, sims, problem)),
                           TOTALS_DEADLINE_S) is not None:
            print(f"  output tokens: {said[-1]}", flush=True)
        print("fleet_test: the second case, federation", flush=True)
        check_federation(glob, vm, at)
        if lt.until_passes("federated total", lambda problem: said.append(check_federated_total(glob, sims, problem)),
                           TOTALS_DEADLINE_S) is not None:
            print(f"  {said[-1]}", flush=True)
        # Last, as it adds tokens: the ramp that gives each pod's capacity model its fit. It is
        # the bill's traffic too: the range starts at rest before it and ends at rest after it.
        pods = {pod: m for pod, _, m in targets}
        bill_start = bill.mark(pods)
        time.sleep(bill.QUIET_S)
        print(f"fleet_test: capacity (a ramp of {RAMP} streams through every pod)", flush=True)
        ramps = [bench(pod, listen, "load-ramp", RAMP, f"{RAMP_LEVEL_S}s")[0] for pod, listen, _ in targets]
        took = lt.until_passes("capacity recordings", lambda problem: said.append(check_capacity(vm, problem)),
                               CAPACITY_DEADLINE_S)
        if took is not None:
            print(f"  {', '.join(CAPACITY_RECORDINGS)} in the store {took:.0f}s after the ramp began; "
                  f"{said[-1]}", flush=True)
        print("fleet_test: vmalert's rules", flush=True)
        if lt.until_passes("vmalert's rules", lambda problem: said.append(check_rules(vm, vmalert, problem)),
                           TOTALS_DEADLINE_S) is not None:
            print(f"  vmalert: {said[-1]}", flush=True)
        print("fleet_test: the bill for the ramp's range (tokenmeter cost --prometheus)", flush=True)
        for p in ramps:
            p.wait(timeout=60)
        bill_end = bill.mark(pods)
        time.sleep(REMOTE_WRITE_S)
        for kind, url, extrapolates in [("VictoriaMetrics", vm.base, False),
                                        ("the cluster's Prometheus", f"http://127.0.0.1:{cluster_port}", True)]:
            def check(problem, kind=kind, url=url, extrapolates=extrapolates):
                flush(vm)
                problems, line = bill.check_store(kind, tm_bin, url, bill_start, bill_end, pods, extrapolates)
                for msg in problems:
                    problem(msg)
                said.append(line)
            if lt.until_passes(f"the bill from {kind}", check, BILL_DEADLINE_S) is not None:
                print(f"  {said[-1]}", flush=True)
    except Exception as e:  # noqa: BLE001 - report any setup failure as a test failure
        fail(f"{type(e).__name__}: {e}")
    finally:
        procs.stop()
        sink.shutdown()
    elapsed = time.monotonic() - started
    if lt.failures:
        print(f"fleet_test: {len(lt.failures)} failure(s) in {elapsed:.0f}s; logs kept in {tmp}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"fleet_test: ok in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
