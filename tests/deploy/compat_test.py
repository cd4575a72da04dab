#!/usr/bin/env python3
"""The compat test: vLLM's own dashboard queries against a real Prometheus scraping a
tokenmeter with --compat vllm in front of the simulator, and `promtool check metrics` on the
exposition of every mode.

On loopback only, in a temporary directory, it starts:
  - a `tokenmeter sim` per mode (OpenAI-compatible, continuous batching, stating its queue and
    prefill as vLLM does with --enable-per-request-metrics),
  - one tokenmeter per mode in front of its simulator: plain, --compat vllm, --compat otel and
    --compat vllm,otel (each with --gpu-hour-cost, so that every capacity family can exist),
  - Prometheus (the Debian package) scraping them every second,
  - per mode, `tokenmeter bench` holding STEADY streams until the end, and beside it a second
    one stepping through RAMP: together three concurrencies, which the capacity model needs
    before it fits (crates/tokenmeter/src/capacity/fit.rs, MIN_POINTS).
It waits, with a deadline, until every mode's exposition holds every capacity series
(CAPACITY_SERIES: the families crates/tokenmeter/src/metrics/names.rs names in its `capacity` module, with every label set this set-up
makes), then until each check below passes or its deadline passes. Then:
  1. every panel of vLLM's example dashboard (vllm-project/vllm,
     examples/observability/prometheus_grafana/grafana.json) that concerns latency, tokens,
     lengths, finish reasons or running/waiting requests: the same kind of query (the same
     series, labels and functions, written here with the panel's title) must return a finite
     value; the panels that cannot work must find no series (absent, not faked), and the
     table in docs/compat.md must list every panel with the same verdict;
  2. `--compat otel`: the four GenAI families exist with exactly their label names in the otel
     modes and in no other, their token sums equal tokenmeter's counters, a TTFT median comes;
  3. `promtool check metrics` must pass on a scrape of every mode (plain, vllm, otel,
     vllm+otel, tenant), each with every capacity series in it (a gauge with a `quantile`
     label, which promtool refuses, cannot hide behind a fit that has not happened yet);
  4. the tenant mode (--tenant-header, --tenant-from-key, a cap of 3) holds exactly the tenants
     its crafted requests imply, and the bench's API key appears nowhere in its exposition.
Exits 1 listing each failure. Environment: TOKENMETER_BIN (default target/release/tokenmeter),
PROMETHEUS, PROMTOOL.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import live_test as lt

REPO = lt.REPO
MODEL = "tokenmeter-sim"

# The tokenmeters: name and extra flags. Each is scraped by Prometheus and checked by promtool.
MODES = [
    ("plain", []),
    ("vllm", ["--compat", "vllm"]),
    ("otel", ["--compat", "otel"]),
    ("vllm+otel", ["--compat", "vllm,otel"]),
    ("tenant", ["--tenant-header", "x-tenant", "--tenant-from-key", "--max-tenants", "3"]),
]
# Every mode: one GPU, and a price for it, which the capacity model's cost family needs; the
# engine's memory, which its memory families need (a cache far larger than this load holds).
COMMON_FLAGS = ["--gpus", "1", "--gpu-hour-cost", "2.5", "--kv-cache-tokens", "262144", "--max-num-seqs", "256"]

# The load, per mode. STEADY streams run until the test ends (the vLLM panels read rates over the
# last seconds, so traffic must still flow when they are checked); beside them a second client
# steps through RAMP, RAMP_LEVEL_S each, so the proxy sees STEADY + 1, + 3 and + 6 streams: the
# three concurrencies the capacity model needs for a fit (fit::MIN_POINTS), with 20 token
# samples each (fit::MIN_SAMPLES), spread far enough apart, on a step that grows by 1 ms a
# stream, that the fit's slope stands clear of its noise (capacity::support). At the simulator's
# 10 ms + 1 ms a stream (13-18 ms here) a stream makes 55-75 tokens/s: one level gives a
# concurrency some 500 samples, 25 times what it needs. The 40-token prompts are long enough for the prefill cost
# (capacity::prefill: 32 uncached tokens, 8 requests: the first two seconds).
STEADY = 2
RAMP = "1,3,6"
RAMP_LEVEL_S = 3
# The steady clients' bound; the test stops them long before.
LOAD_BOUND = "600s"
PROMPT_TOKENS, OUTPUT_TOKENS = "40", "48"

# Deadlines, generous on purpose (a loaded 2-core machine): they bound a failure's wait, a pass
# returns as soon as its condition holds. The capacity series come with the first refit after
# the ramp's third level (about 3 x RAMP_LEVEL_S, then up to capacity::REFIT_INTERVAL, 5 s):
# some 15 s, against 120. The checks against Prometheus need a few 1 s scrapes of that traffic,
# which has flowed for those 15 s by then.
CAPACITY_DEADLINE_S = 120
CHECKS_DEADLINE_S = 60

# The capacity families (crates/tokenmeter/src/metrics/names.rs names them, in `capacity`) and every label set each takes in
# this set-up: the default SLO classes (`interactive` with a TTFT target and a tokens/s floor;
# `batch` with neither, so none of its own), one engine, the curve's nine concurrencies, and
# the simulator stating its prefill times (--enable-per-request-metrics), so the prefill cost's
# source is `stated`.
CURVE = ["1", "2", "4", "8", "16", "32", "64", "128", "256"]
CLASS = {"class": "interactive"}
CAPACITY_SERIES = {
    "tokenmeter_capacity_step_seconds": [{"term": t} for t in ("base", "per_sequence")],
    "tokenmeter_capacity_fit_samples": [{}],
    "tokenmeter_capacity_fit_r2": [{}],
    "tokenmeter_capacity_observed_concurrency": [{"bound": b} for b in ("min", "max")],
    "tokenmeter_capacity_max_concurrency": [CLASS],
    "tokenmeter_capacity_output_tokens_per_second": [CLASS],
    "tokenmeter_capacity_output_tokens_per_second_per_gpu": [CLASS],
    "tokenmeter_capacity_cost_per_million_output_tokens": [CLASS],
    "tokenmeter_capacity_curve_tokens_per_second": [
        {"concurrency": c, "kind": k} for c in CURVE for k in ("per_request", "aggregate")],
    "tokenmeter_capacity_utilization": [CLASS],
    "tokenmeter_capacity_tps_floor": [CLASS],
    "tokenmeter_capacity_ttft_target_seconds": [CLASS],
    "tokenmeter_capacity_replicas": [{}],
    "tokenmeter_capacity_limit_concurrency": [
        dict(CLASS, bound=b) for b in ("ttft", "tokens_per_second", "kv_cache", "max_num_seqs")],
    "tokenmeter_capacity_max_request_rate": [CLASS],
    "tokenmeter_capacity_ttft_seconds": [
        {"concurrency": c, "percentile": p} for c in CURVE for p in ("50", "90", "99")],
    "tokenmeter_capacity_prefill_seconds_per_token": [{"source": "stated"}],
    "tokenmeter_capacity_workload_tokens": [{"kind": k} for k in ("prompt", "cached", "output")],
    "tokenmeter_capacity_workload_requests": [{}],
    "tokenmeter_capacity_in_flight": [{}],
    "tokenmeter_capacity_kv_cache_tokens": [{}],
    "tokenmeter_capacity_kv_tokens_per_request": [{}],
    "tokenmeter_capacity_check_concurrency": [{}],
    "tokenmeter_capacity_check_ttft_seconds": [{"source": s} for s in ("predicted", "observed")],
    "tokenmeter_capacity_check_tokens_per_second": [{"source": s} for s in ("predicted", "observed")],
    "tokenmeter_capacity_check_error_ratio": [{"quantity": q} for q in ("ttft", "tokens_per_second")],
    "tokenmeter_capacity_check_trusted": [{}],
    "tokenmeter_capacity_supported": [CLASS],
    # Absent while the model answers, which it must here.
    "tokenmeter_capacity_unsupported": [],
    # How the requests arrived: the bench's closed loops, in step or not as their timing falls.
    "tokenmeter_capacity_arrivals": [],
}

# --compat otel: the families a real Prometheus must hold, with the label names every series
# carries (the OTel Prometheus exporter's spelling of the GenAI conventions v1.41.0), in the
# modes that export them, and in no other.
OTEL_LABELS = {"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model",
               "gen_ai_response_model", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url"}
OTEL_FAMILIES = [
    ("gen_ai_server_time_to_first_token_seconds_bucket", OTEL_LABELS | {"le"}),
    ("gen_ai_server_time_per_output_token_seconds_bucket", OTEL_LABELS | {"le"}),
    ("gen_ai_server_request_duration_seconds_bucket", OTEL_LABELS | {"le", "error_type"}),
    ("gen_ai_client_token_usage_bucket", OTEL_LABELS | {"le", "gen_ai_token_type"}),
]
OTEL_MODES = {"otel", "vllm+otel"}

# --- tenants ---
# Sent to the tenant mode before the load: five names for a cap of three, one invalid value.
# The load then carries an API key, whose id finds the cap full: "other".
TENANT_HEADERS = ["tenant-a", "tenant-b", "tenant-c", "tenant-d", "tenant-e", "not a name"]
TENANT_KEY = "sk-compat-DO-NOT-LABEL-4f1c"
LOAD_FLAGS = {"tenant": ["--api-key", TENANT_KEY]}
TENANTS_EXPECTED = {"tenant-a", "tenant-b", "tenant-c", "other", "invalid"}


def send_tenant_requests(listen):
    import urllib.request
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    for t in TENANT_HEADERS:
        req = urllib.request.Request(f"http://127.0.0.1:{listen}/v1/chat/completions", data=body,
                                     headers={"content-type": "application/json", "x-tenant": t})
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()


def check_tenants(metrics_port, problem):
    _, body = lt.http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    text = body.decode()
    got = set(re.findall(r'^tokenmeter_requests_total\{[^}]*tenant="([^"]*)"', text, re.M))
    if got != TENANTS_EXPECTED:
        problem(f"tenant mode: tokenmeter_requests_total tenants {sorted(got)}, expected {sorted(TENANTS_EXPECTED)}")
    if TENANT_KEY in text or "DO-NOT-LABEL" in text:
        problem("tenant mode: the API key appears in the exposition")


# vLLM's example dashboard, panel by panel: its title, then either the queries it runs (with
# $model_name and $__rate_interval as the dashboard has them) or why it cannot work in front of
# a server through the wire, with the series that must then be absent.
Q = "{model_name=\"$model_name\"}"
RI = "[$__rate_interval]"
VLLM_PANELS = [
    ("E2E Request Latency", [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{Q}{RI})))",
        f"histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{Q}{RI})))",
        f"rate(vllm:e2e_request_latency_seconds_sum{Q}{RI})\n/\nrate(vllm:e2e_request_latency_seconds_count{Q}{RI})",
    ], None),
    ("Token Throughput", [
        f"rate(vllm:prompt_tokens_total{Q}{RI})",
        f"rate(vllm:generation_tokens_total{Q}{RI})",
    ], None),
    ("Inter Token Latency", [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{Q}{RI})))",
        f"histogram_quantile(0.5, sum by(le) (rate(vllm:inter_token_latency_seconds_bucket{Q}{RI})))",
        f"rate(vllm:inter_token_latency_seconds_sum{Q}{RI})\n/\nrate(vllm:inter_token_latency_seconds_count{Q}{RI})",
    ], None),
    ("Scheduler State", [
        f"vllm:num_requests_running{Q}",
        f"vllm:num_requests_waiting{Q}",
    ], None),
    ("Time To First Token Latency", [
        f"histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{Q}{RI})))",
        f"histogram_quantile(0.5, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{Q}{RI})))",
        f"rate(vllm:time_to_first_token_seconds_sum{Q}{RI})\n/\nrate(vllm:time_to_first_token_seconds_count{Q}{RI})",
    ], None),
    # With a known cache size (every mode here states one): the wire's view over it.
    ("Cache Utilization", [
        f"vllm:kv_cache_usage_perc{Q}",
    ], None),
    ("Request Prompt Length", [
        f"sum by(le) (increase(vllm:request_prompt_tokens_bucket{Q}{RI}))",
    ], None),
    ("Request Generation Length", [
        f"sum by(le) (increase(vllm:request_generation_tokens_bucket{Q}{RI}))",
    ], None),
    ("Finish Reason", [
        f"sum by(finished_reason) (increase(vllm:request_success_total{Q}{RI}))",
    ], None),
    # The engine states its queue and prefill in the stream (the simulator runs with
    # --enable-per-request-metrics, as vLLM would): vLLM's own panels read them.
    ("Queue Time", [
        f"rate(vllm:request_queue_time_seconds_sum{Q}{RI})",
    ], None),
    ("Requests Prefill and Decode Time", [
        f"rate(vllm:request_prefill_time_seconds_sum{Q}{RI})",
        f"rate(vllm:request_decode_time_seconds_sum{Q}{RI})",
    ], None),
    ("Max Generation Token in Sequence Group", None, ("vllm:request_max_num_generation_tokens", "a sequence group is the engine's (parallel sampling, n > 1); the wire shows each choice's tokens, not the group's maximum as vLLM counts it")),
]


def fail(msg):
    lt.fail(msg)


def capacity_families_in_source():
    """The family names crates/tokenmeter/src/metrics/names.rs declares in its `capacity` module."""
    text = (REPO / "crates" / "tokenmeter" / "src" / "metrics" / "names.rs").read_text()
    return set(re.findall(r'pub const \w+: &str = "(tokenmeter_capacity_\w+)";', text))


SAMPLE = re.compile(r"^(tokenmeter_capacity_\w+)(?:\{([^}]*)\})? ", re.M)
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def capacity_missing(exposition):
    """The series of CAPACITY_SERIES an exposition lacks, as `family{labels}` strings."""
    present = {(m.group(1), frozenset(LABEL.findall(m.group(2) or "")))
               for m in SAMPLE.finditer(exposition)}

    def show(family, labels):
        return family + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    return [show(family, labels)
            for family, sets in CAPACITY_SERIES.items() for labels in sets
            if (family, frozenset(labels.items())) not in present]


def check_capacity_series(targets, problem):
    """Every mode's exposition holds every capacity series."""
    for name, _, metrics in targets:
        _, body = lt.http_get(f"http://127.0.0.1:{metrics}/metrics")
        text = body.decode()
        missing = capacity_missing(text)
        if missing:
            # What the model said instead: why it cannot answer, and the fit it has.
            said = [line for line in text.splitlines() if line.startswith((
                "tokenmeter_capacity_unsupported", "tokenmeter_capacity_step_seconds",
                "tokenmeter_capacity_observed_concurrency", "tokenmeter_capacity_fit_"))]
            problem(f"[{name}] {len(missing)} capacity series missing: {', '.join(missing[:8])}"
                    f"{' ...' if len(missing) > 8 else ''}; the model said: {'; '.join(said)}")


def substitute(expr):
    return expr.replace("$model_name", MODEL).replace("$__rate_interval", "10s")


def check_vllm_panels(prom, problem):
    checked = 0
    for title, queries, cannot in VLLM_PANELS:
        for q in queries or []:
            expr = substitute(q)
            try:
                n, vals = lt.query(prom, expr, True, "1s")
            except ValueError as e:
                problem(f"vLLM panel {title!r}: query error {e}\n    {expr}")
                continue
            checked += 1
            if not vals:
                problem(f"vLLM panel {title!r}: No data ({n} series)\n    {expr}")
        if cannot:
            series, _why = cannot
            data = prom.api("series", **{"match[]": series, "start": time.time() - 300, "end": time.time()})
            if data:
                problem(f"vLLM panel {title!r}: {series} should be absent, found {data[:2]}")
    return checked


def check_otel_series(prom, problem):
    """The otel families exist in the otel modes, with exactly their labels, and nowhere else;
    their token sums equal tokenmeter's own counters in the same mode."""
    for family, want in OTEL_FAMILIES:
        data = prom.api("series", **{"match[]": family, "start": time.time() - 300, "end": time.time()})
        modes = {s.get("mode") for s in data}
        if modes != OTEL_MODES:
            problem(f"otel: {family} found in modes {sorted(m for m in modes if m)}, want {sorted(OTEL_MODES)}")
        for s in data:
            # Prometheus drops empty labels (error_type on successes): the rest must be exact.
            got = set(s) - {"__name__", "job", "instance", "mode"}
            if not got <= want or not (want - {"error_type"}) <= got:
                problem(f"otel: {family} labels {sorted(got)}, want {sorted(want)}")
                break
    for mode in sorted(OTEL_MODES):
        sel = f'mode="{mode}"'
        # Both recorded when a request ends (tokenmeter_output_tokens_total moves per event, so
        # under the running load it is ahead by the tokens in flight).
        for kind, own in [("output", "tokenmeter_request_output_tokens_sum"), ("input", "tokenmeter_input_tokens_total")]:
            expr = (f'(sum(gen_ai_client_token_usage_sum{{{sel},gen_ai_token_type="{kind}"}}) or vector(0)) '
                    f'- (sum({own}{{{sel}}}) or vector(0))')
            _, vals = lt.query(prom, expr, False, "1s")
            if not vals or abs(vals[0]) > 0.5:
                problem(f"otel [{mode}]: {kind} token usage differs from {own}: {vals}")
        ttft = (f'histogram_quantile(0.5, sum by(le) (rate(gen_ai_server_time_to_first_token_seconds_bucket{{{sel}}}[10s])))')
        _, vals = lt.query(prom, ttft, True, "1s")
        if not vals:
            problem(f"otel [{mode}]: no TTFT median\n    {ttft}")


def check_compat_table():
    """docs/compat.md's table of vLLM panels names every panel, with the verdict this test holds."""
    text = (REPO / "docs" / "compat.md").read_text()
    for title, queries, cannot in VLLM_PANELS:
        row = next((line for line in text.splitlines() if line.startswith(f"| {title} |")), None)
        if row is None:
            fail(f"docs/compat.md: no row for vLLM panel {title!r}")
            continue
        verdict = row.split("|")[2].strip()
        want = "works" if queries and not cannot else ("partly" if queries else "cannot")
        if verdict != want:
            fail(f"docs/compat.md: vLLM panel {title!r} says {verdict!r}, the test holds {want!r}")


# promtool's linter reserves ':' for recording rules and flags every vLLM name for it (vLLM's own
# /metrics gets the same lines). That one message, for a `vllm:` name, is the only one allowed.
COLON_LINT = re.compile(r"^vllm:[a-z0-9_]+ metric names should not contain ':'$")


def check_promtool(promtool, name, metrics_port):
    _, body = lt.http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    # The exposition promtool reads must hold every capacity series, or a bad one could pass
    # unseen (the wait before made them exist; a fit does not go away within its window).
    missing = capacity_missing(body.decode())
    if missing:
        fail(f"promtool check metrics [{name}]: the exposition lacks {len(missing)} capacity series: "
             f"{', '.join(missing[:8])}")
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True)
    lines = [l.strip() for l in (r.stdout + r.stderr).decode().splitlines() if l.strip()]
    colon = [l for l in lines if COLON_LINT.match(l)]
    other = [l for l in lines if not COLON_LINT.match(l)]
    ok = r.returncode == 0 or (colon and not other)
    print(f"  promtool check metrics [{name}]: {'ok' if ok else 'FAILED'} ({len(body)} bytes"
          f"{f', {len(colon)} vllm: names flagged for their colon' if colon else ''})")
    if not ok:
        # promtool says a problem once per series: each line once, with how often it came.
        said = {line: other.count(line) for line in other}
        fail(f"promtool check metrics [{name}]: " + "\n    ".join(
            f"{line}{f' ({n} series)' if n > 1 else ''}" for line, n in list(said.items())[-20:]))


def main():
    tm_bin = os.environ.get("TOKENMETER_BIN", str(REPO / "target" / "release" / "tokenmeter"))
    prom_bin = os.environ.get("PROMETHEUS") or shutil.which("prometheus")
    promtool = os.environ.get("PROMTOOL") or shutil.which("promtool")
    if not os.access(tm_bin, os.X_OK) or not prom_bin or not promtool:
        print("compat_test: needs target/release/tokenmeter, prometheus and promtool", file=sys.stderr)
        return 1
    declared = capacity_families_in_source()
    if declared != set(CAPACITY_SERIES):
        fail(f"CAPACITY_SERIES lists {sorted(set(CAPACITY_SERIES) - declared)} that crates/tokenmeter/src/metrics/names.rs "
             f"does not name and lacks {sorted(declared - set(CAPACITY_SERIES))}: say which series each takes here")
        return 1
    tmp = tempfile.mkdtemp(prefix="tokenmeter-compat-")
    procs = lt.Procs(tmp)
    started = time.monotonic()
    try:
        targets = []
        for name, flags in MODES:
            # A simulator per mode, so each proxy's concurrency is its engine's batch (a shared
            # one mixes every mode's streams into each step, which blurs the slope the capacity
            # model must see clear of its noise to answer), whose step visibly grows with it.
            (sim_port,) = procs.start_listening(
                f"sim-{name}", lambda port: [tm_bin, "sim", "--listen", f"127.0.0.1:{port}", "--model", MODEL,
                                             "--step-base", "10ms", "--step-per-seq", "1ms",
                                             "--enable-per-request-metrics"],
                1, lambda port: lt.http_get(f"http://127.0.0.1:{port}/v1/models")[0] == 200)
            listen, metrics = procs.start_listening(
                f"tokenmeter-{name}", lambda listen, metrics, flags=flags: [
                    tm_bin, "--upstream", f"http://127.0.0.1:{sim_port}", "--listen", f"127.0.0.1:{listen}",
                    "--metrics-listen", f"127.0.0.1:{metrics}", *COMMON_FLAGS, *flags,
                ], 2, lambda _l, m: lt.http_get(f"http://127.0.0.1:{m}/readyz")[0] == 200)
            targets.append((name, listen, metrics))
        for name, listen, _ in targets:
            if name == "tenant":
                send_tenant_requests(listen)
        prom_port = lt.free_port()
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [{"job_name": "tokenmeter", "static_configs": [
                {"targets": [f"127.0.0.1:{m}"], "labels": {"mode": name}} for name, _, m in targets]}],
        }
        cfg_path = os.path.join(tmp, "prometheus.yml")
        with open(cfg_path, "w") as f:
            json.dump(config, f)
        procs.start("prometheus", [prom_bin, f"--config.file={cfg_path}", f"--storage.tsdb.path={tmp}/data",
                                   f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"])
        prom = lt.Prom(prom_port)
        lt.wait_for("prometheus", lambda: lt.http_get(f"{prom.base}/-/ready")[0] == 200, timeout=30)
        for name, listen, _ in targets:
            for load, levels, duration in [("load", str(STEADY), LOAD_BOUND),
                                           ("load-ramp", RAMP, f"{RAMP_LEVEL_S}s")]:
                procs.start(f"{load}-{name}", [
                    tm_bin, "bench", "--target", f"http://127.0.0.1:{listen}", "--concurrency", levels,
                    "--duration", duration, "--prompt-tokens", PROMPT_TOKENS, "--output-tokens", OUTPUT_TOKENS,
                    "--out", os.path.join(tmp, f"bench-{load}-{name}"), *LOAD_FLAGS.get(name, []),
                ])
        print(f"compat_test: {STEADY} streams per mode, and a ramp of {RAMP} beside them (logs in {tmp})",
              flush=True)

        def capacity(problem):
            procs.check_alive()
            check_capacity_series(targets, problem)
        took = lt.until_passes("capacity series", capacity, CAPACITY_DEADLINE_S)
        if took is not None:
            print(f"  every capacity series in every mode after {took:.0f} s", flush=True)
        print("compat_test: vLLM's dashboard", flush=True)
        counted = []
        took = lt.until_passes("vLLM's dashboard",
                               lambda problem: counted.append(check_vllm_panels(prom, problem)),
                               CHECKS_DEADLINE_S)
        if took is not None:
            print(f"  {counted[-1]} vLLM dashboard queries checked over {len(VLLM_PANELS)} panels", flush=True)
        check_compat_table()
        print("compat_test: OpenTelemetry names", flush=True)
        if lt.until_passes("otel", lambda problem: check_otel_series(prom, problem), CHECKS_DEADLINE_S) is not None:
            print(f"  otel: {len(OTEL_FAMILIES)} families in {sorted(OTEL_MODES)} only; token sums equal "
                  "tokenmeter's", flush=True)
        print("compat_test: promtool check metrics", flush=True)
        for name, _, metrics in targets:
            check_promtool(promtool, name, metrics)
            if name == "tenant":
                if lt.until_passes("tenants", lambda problem, m=metrics: check_tenants(m, problem),
                                   CHECKS_DEADLINE_S) is not None:
                    print(f"  tenant values: {sorted(TENANTS_EXPECTED)}", flush=True)
    except Exception as e:  # noqa: BLE001 - report any setup failure as a test failure
        fail(f"{type(e).__name__}: {e}")
    finally:
        procs.stop()
    elapsed = time.monotonic() - started
    if lt.failures:
        print(f"compat_test: {len(lt.failures)} failure(s) in {elapsed:.0f}s; logs kept in {tmp}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"compat_test: ok in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
