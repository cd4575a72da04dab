#!/usr/bin/env python3
"""The series budget: how many series one tokenmeter exports with one model and traffic in all
nine concurrency bands, family by family, asserted exactly so that a change that adds series
fails here and has to update the budget (docs/fleet.md) on purpose.

On loopback only, in a temporary directory, it starts:
  - `tokenmeter sim` (OpenAI-compatible, fast decode steps so that 320 streams fit a 2-core box),
  - one tokenmeter per set-up in SETUPS in front of it (each with --gpus 1 and the SLO classes
    in SLO, whose targets every request here meets, so the `result` label takes one value),
  - `tokenmeter bench` through each, with one model named (no /v1/models lookup, which would
    be a second model, `unknown`), at 1, 3, 6, 12, 24, 48, 96, 192 and 320 streams in flight:
    the proxy's time-weighted mean in flight lands each level in its own band, `1` to `257+`.
    The tenant set-up (--tenant-from-key) gets one such load per tenant, one after the other,
    each with its own API key, so every tenant has requests in every band.
Then it scrapes each tokenmeter once, checks that every band was reached (a load that missed one
is a failure of the load, said as such), counts the series of every family (a histogram's
buckets, `_sum` and `_count` are its series) grouped by naming scheme (`tokenmeter_`, `vllm:`,
...), and compares them with EXPECTED. It prints the table docs/fleet.md publishes.

What this traffic does not vary, the budget states as bounds (docs/fleet.md, "Series per pod"):
the SLO `result` (6 values), the prompt band of TTFT (7), outcomes and status codes, more
models (each model repeats the per-model families, up to --max-models + 1).

Exits 1 listing each difference. Environment: TOKENMETER_BIN (default
target/release/tokenmeter), BUDGET_LEVEL_SECONDS (default 2: seconds per concurrency level).
"""

import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter

import live_test as lt

REPO = lt.REPO
MODEL = "tokenmeter-sim"
LEVELS = "1,3,6,12,24,48,96,192,320"
BANDS = ["1", "2-4", "5-8", "9-16", "17-32", "33-64", "65-128", "129-256", "257+"]
# Seconds for the proxy to count the last requests after the load has seen them end (a stream
# is recorded when it ends, well under a second here; the rest is for a loaded machine).
COUNTED_DEADLINE_S = 30
# Every request meets both classes (a minute to the first token, 1 token/s): one `result`.
SLO = ["interactive:ttft=60s,tps=1", "batch"]

# Series per family, by set-up. A histogram with B boundaries has B + 3 series per label set
# (B buckets, +Inf, _sum, _count).
TOKENMETER = {
    # By model and concurrency band: 21 boundaries, 9 bands.
    "tokenmeter_request_tokens_per_second": 24 * 9,
    # By model and prompt band (one band here, `1-256`; 7 at most): 22 boundaries.
    "tokenmeter_time_to_first_token_seconds": 25,
    # By model and kind of output (`content` here; 3 at most).
    "tokenmeter_time_to_first_output_seconds": 25,
    "tokenmeter_time_to_first_byte_seconds": 25,
    "tokenmeter_request_duration_seconds": 24,
    "tokenmeter_inter_token_latency_seconds": 22,
    "tokenmeter_time_per_output_token_seconds": 22,
    "tokenmeter_request_output_tokens": 22,
    "tokenmeter_request_input_tokens": 22,
    "tokenmeter_request_max_stall_seconds": 16,
    "tokenmeter_tokens_per_event": 14,
    # By class, model, band and result: 1 class (the default) x 9 bands x 1 result here.
    "tokenmeter_slo_requests_total": 9,
    "tokenmeter_goodput_output_tokens_total": 1,
    "tokenmeter_slo_objective": 2,
    "tokenmeter_output_tokens_total": 1,
    "tokenmeter_input_tokens_total": 1,
    # By model, code, outcome, api: all complete 200s here.
    "tokenmeter_requests_total": 1,
    # Pre-registered by source: usage, token_ids, counted, tokenizer.
    "tokenmeter_token_count_source_total": 4,
    "tokenmeter_parse_errors_total": 3,
    "tokenmeter_requests_in_flight": 2,
    "tokenmeter_output_tokens_per_second": 1,
    "tokenmeter_output_tokens_per_second_per_gpu": 1,
    "tokenmeter_gpus": 1,
    "tokenmeter_build_info": 1,
    "tokenmeter_start_time_seconds": 1,
    # The live capacity model: the curve at 1, 2, 4 ... 256 by kind; per class with a floor.
    "tokenmeter_capacity_curve_tokens_per_second": 18,
    "tokenmeter_capacity_step_seconds": 2,
    "tokenmeter_capacity_observed_concurrency": 2,
    "tokenmeter_capacity_fit_samples": 1,
    "tokenmeter_capacity_fit_r2": 1,
    "tokenmeter_capacity_max_concurrency": 1,
    "tokenmeter_capacity_output_tokens_per_second": 1,
    "tokenmeter_capacity_output_tokens_per_second_per_gpu": 1,
    "tokenmeter_capacity_utilization": 1,
    "tokenmeter_capacity_tps_floor": 1,
    "tokenmeter_capacity_ttft_target_seconds": 1,
    "tokenmeter_capacity_replicas": 1,
    # The first token's end: both limits of the one class with targets, its arrival rate, the
    # predicted TTFT at 9 concurrencies x 3 percentiles, the prefill cost (one source), the mix
    # (3 kinds and its size) and the requests in flight.
    "tokenmeter_capacity_limit_concurrency": 2,
    "tokenmeter_capacity_max_request_rate": 1,
    "tokenmeter_capacity_ttft_seconds": 27,
    "tokenmeter_capacity_prefill_seconds_per_token": 1,
    "tokenmeter_capacity_workload_tokens": 3,
    "tokenmeter_capacity_workload_requests": 1,
    "tokenmeter_capacity_in_flight": 1,
    # The self-check at the concurrency seen: its concurrency, TTFT and tokens/s (predicted,
    # observed), both errors, and the verdict. (The memory families appear only with a known
    # KV cache: none here.)
    "tokenmeter_capacity_check_concurrency": 1,
    "tokenmeter_capacity_check_ttft_seconds": 2,
    "tokenmeter_capacity_check_tokens_per_second": 2,
    "tokenmeter_capacity_check_error_ratio": 2,
    "tokenmeter_capacity_check_trusted": 1,
    # Whether the one class with targets is answered (1 here, the load ramps through 9 levels;
    # the reason series is absent while it is), and how the requests arrived (one shape).
    "tokenmeter_capacity_supported": 1,
    "tokenmeter_capacity_arrivals": 1,
    # The wire's view of the KV cache the requests in flight hold (once there is a mix).
    "tokenmeter_kv_cache_wire_tokens": 1,
    # The admission caps (--max-in-flight, --max-connections) and the connections closed there;
    # the metrics listener's cap and its sheds. (HTTP/2 connections closed by a limit appear
    # only once one is: none here.)
    "tokenmeter_in_flight_limit": 1,
    "tokenmeter_connections_limit": 1,
    "tokenmeter_connections_refused_total": 1,
    "tokenmeter_metrics_connections_limit": 1,
    "tokenmeter_metrics_connections_shed_total": 1,
    # The engine's own view (--engine-metrics auto, the default), read from the simulator's
    # /metrics: its running and waiting requests and its preemption counter (it states no KV
    # cache without --kv-cache-tokens: with one, the cache's size and usage add 2), and the reads
    # counted by result. Only result="ok" is counted here: a read that fails (a busy machine can
    # time one out) adds a series per result seen, at most 6 (a closed set).
    "tokenmeter_engine_requests_running": 1,
    "tokenmeter_engine_requests_waiting": 1,
    "tokenmeter_engine_preemptions_total": 1,
    "tokenmeter_engine_metrics_scrapes_total": 1,
    # Who pays for the GPU: the charges by model and phase (prefill, decode), idle, and the
    # busy time not charged yet. (The USD counter appears only with --gpu-hour-cost: none here.)
    "tokenmeter_gpu_seconds_total": 2,
    "tokenmeter_gpu_idle_seconds_total": 1,
    "tokenmeter_gpu_unassigned_seconds": 1,
}
VLLM = {
    "vllm:time_to_first_token_seconds": 25,
    "vllm:e2e_request_latency_seconds": 24,
    "vllm:request_decode_time_seconds": 24,
    "vllm:inter_token_latency_seconds": 22,
    "vllm:request_time_per_output_token_seconds": 22,
    "vllm:request_prompt_tokens": 22,
    "vllm:request_generation_tokens": 22,
    "vllm:num_requests_running": 1,
    "vllm:num_requests_waiting": 1,
    "vllm:request_success_total": 1,
    "vllm:prompt_tokens_total": 1,
    "vllm:generation_tokens_total": 1,
}

# --compat otel: the GenAI semantic conventions' recommended boundaries; one operation, provider
# and model here (an `error.type` adds a label set to the duration histogram).
OTEL = {
    "gen_ai_client_token_usage": 2 * 17,  # gen_ai_token_type input and output, 14 boundaries
    "gen_ai_server_request_duration_seconds": 17,
    "gen_ai_server_time_to_first_token_seconds": 19,
    "gen_ai_server_time_per_output_token_seconds": 16,
}

# --buckets coarse: each histogram family's label sets as above, at its coarse boundaries + 3
# (Buckets::coarse in crates/tokenmeter/src/metrics/buckets.rs).
COARSE = dict(TOKENMETER, **{
    "tokenmeter_request_tokens_per_second": 13 * 9,
    "tokenmeter_time_to_first_token_seconds": 15,
    "tokenmeter_time_to_first_output_seconds": 15,
    "tokenmeter_time_to_first_byte_seconds": 15,
    "tokenmeter_request_duration_seconds": 14,
    "tokenmeter_inter_token_latency_seconds": 12,
    "tokenmeter_time_per_output_token_seconds": 12,
    "tokenmeter_request_output_tokens": 10,
    "tokenmeter_request_input_tokens": 10,
    "tokenmeter_request_max_stall_seconds": 9,
    "tokenmeter_tokens_per_event": 9,
})

# The families that carry `tenant` with --tenant-header or --tenant-from-key (docs/tenants.md)
# and that this load makes (the reasoning and cached-prompt counters carry it too, but the
# simulator reports neither): each repeats per tenant value (at most --max-tenants, plus the
# allow-list, plus `other`, `none` and `invalid`).
TENANTED = ["tokenmeter_request_tokens_per_second", "tokenmeter_time_to_first_token_seconds",
            "tokenmeter_slo_requests_total", "tokenmeter_goodput_output_tokens_total",
            "tokenmeter_output_tokens_total", "tokenmeter_input_tokens_total", "tokenmeter_requests_total",
            "tokenmeter_gpu_seconds_total"]
TENANTS = ["budget-tenant-a", "budget-tenant-b"]


def with_tenants(n):
    return {f: c * n if f in TENANTED else c for f, c in TOKENMETER.items()}


# (name, flags, {scheme prefix: {family: series}}, API keys: one load after the other, each
# through all 9 bands; none: one load without a key). The default set-up exports every scheme at
# once: --compat adds series under its own prefix and leaves the tokenmeter_* ones as they are
# (compat_test.py's promtool pass and tests/it/compat.rs check that side).
SETUPS = [
    ("default, --compat vllm, --compat otel", ["--compat", "vllm", "--compat", "otel"],
     {"tokenmeter_": TOKENMETER, "vllm:": VLLM, "gen_ai_": OTEL}, [None]),
    (f"--tenant-from-key, {len(TENANTS)} tenants", ["--tenant-from-key"],
     {"tokenmeter_": with_tenants(len(TENANTS))}, TENANTS),
    ("--buckets coarse", ["--buckets", "coarse"], {"tokenmeter_": COARSE}, [None]),
]

SUFFIX = re.compile(r"_(bucket|sum|count)$")


def families(exposition, types):
    """{family: series} of an exposition; a histogram's _bucket/_sum/_count lines are its own."""
    out = Counter()
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name == "tokenmeter_engine_metrics_scrapes_total" and 'result="ok"' not in line:
            continue  # see TOKENMETER: only the steady result is budgeted
        base = SUFFIX.sub("", name)
        out[base if types.get(base) == "histogram" else name] += 1
    return out


def types_of(exposition):
    return {m.group(1): m.group(2) for m in re.finditer(r"^# TYPE (\S+) (\S+)$", exposition, re.M)}


def bands_reached(exposition):
    return {m.group(1) for m in re.finditer(
        r'^tokenmeter_request_tokens_per_second_count\{[^}]*concurrency="([^"]+)"', exposition, re.M)}


def main():
    tm_bin = os.environ.get("TOKENMETER_BIN", str(REPO / "target" / "release" / "tokenmeter"))
    level_s = float(os.environ.get("BUDGET_LEVEL_SECONDS", "2"))
    if not os.access(tm_bin, os.X_OK):
        print(f"series_budget: {tm_bin} not found: run cargo build --release first", file=sys.stderr)
        return 1
    tmp = tempfile.mkdtemp(prefix="tokenmeter-budget-")
    procs = lt.Procs(tmp)
    started = time.monotonic()
    rows = []
    try:
        (sim_port,) = procs.start_listening(
            "sim", lambda port: [tm_bin, "sim", "--listen", f"127.0.0.1:{port}", "--model", MODEL,
                                 "--step-base", "2ms", "--step-per-seq", "0.02ms", "--max-batch", "2048"],
            1, lambda port: lt.http_get(f"http://127.0.0.1:{port}/v1/models")[0] == 200)
        targets = []
        for i, (name, flags, expected, _) in enumerate(SETUPS):
            listen, metrics = procs.start_listening(
                f"tokenmeter-{i}", lambda listen, metrics, flags=flags: [
                    tm_bin, "--upstream", f"http://127.0.0.1:{sim_port}", "--listen", f"127.0.0.1:{listen}",
                    "--metrics-listen", f"127.0.0.1:{metrics}", "--gpus", "1", "--no-ui",
                    *[a for c in SLO for a in ("--slo", c)], *flags,
                ], 2, lambda _l, m: lt.http_get(f"http://127.0.0.1:{m}/readyz")[0] == 200)
            targets.append((i, name, listen, metrics, expected))
        def load(i, listen, key):
            return [tm_bin, "bench", "--target", f"http://127.0.0.1:{listen}", "--model", MODEL,
                    "--concurrency", LEVELS, "--duration", f"{level_s}s", "--prompt-tokens", "40",
                    "--output-tokens", "24", "--out", os.path.join(tmp, f"bench-{i}-{key}"),
                    *(["--api-key", key] if key else [])]

        # One load per set-up at a time (the bands are the proxy's own in-flight count), the
        # set-ups side by side.
        queues = {i: list(SETUPS[i][3]) for i, *_ in targets}
        running = {}
        print(f"series_budget: {len(LEVELS.split(','))} levels of {level_s:.0f}s through "
              f"{len(targets)} set-up(s) (logs in {tmp})", flush=True)
        deadline = time.monotonic() + (120 + 30 * level_s) * max(len(q) for q in queues.values())
        while (queues and any(queues.values())) or running:
            for i, _, listen, _, _ in targets:
                if i not in running and queues.get(i):
                    key = queues[i].pop(0)
                    running[i] = procs.start(f"load-{i}-{key}", load(i, listen, key))
            for i, p in list(running.items()):
                if p.poll() is not None:
                    if p.returncode != 0:
                        lt.fail(f"the load exited {p.returncode}; see {tmp}")
                    del running[i]
            if time.monotonic() > deadline:
                raise RuntimeError("the loads did not finish in time")
            time.sleep(0.2)
        for i, name, _, metrics, expected in targets:
            # The proxy records a request when its stream ends, which can be a moment after the
            # client saw the end: scrape until it has counted every request the loads sent (each
            # load's levels, and the one short probe a bench sends before them).
            sent = sum(1 + sum(lv["requests"] + lv["errors"] for lv in json.load(
                open(os.path.join(tmp, f"bench-{i}-{key}", "bench.json")))["levels"]) for key in SETUPS[i][3])
            texts = []

            def counted(problem, metrics=metrics, sent=sent, texts=texts):
                _, body = lt.http_get(f"http://127.0.0.1:{metrics}/metrics")
                texts.append(body.decode())
                got = sum(float(m.group(1)) for m in re.finditer(
                    r"^tokenmeter_requests_total\{[^}]*\} (\S+)$", texts[-1], re.M))
                if got != sent:
                    problem(f"[{name}] the proxy counted {got:.0f} requests, the load sent {sent}")
            lt.until_passes(f"[{name}] requests counted", counted, COUNTED_DEADLINE_S)
            text = texts[-1]
            missing = [b for b in BANDS if b not in bands_reached(text)]
            if missing:
                lt.fail(f"[{name}] the load reached no request in band(s) {missing}: the budget needs all 9 "
                        "(a slow machine? raise BUDGET_LEVEL_SECONDS)")
            got = families(text, types_of(text))
            row = {"setup": name}
            for prefix, want in expected.items():
                have = {f: n for f, n in got.items() if f.startswith(prefix)}
                for f in sorted(set(have) | set(want)):
                    if have.get(f, 0) != want.get(f, 0):
                        lt.fail(f"[{name}] {f}: {have.get(f, 0)} series, expected {want.get(f, 0)} "
                                "(update EXPECTED here and docs/fleet.md on purpose)")
                row[prefix] = sum(have.values())
                print(f"  [{name}] {prefix}*: {row[prefix]} series in {len(have)} families "
                      f"(expected {sum(want.values())})")
            others = {f for f in got if not any(f.startswith(p) for p in expected)}
            if others:
                lt.fail(f"[{name}] series of no expected scheme: {sorted(others)[:5]}")
            rows.append(row)
    except Exception as e:  # noqa: BLE001 - report any setup failure as a test failure
        lt.fail(f"{type(e).__name__}: {e}")
    finally:
        procs.stop()
    schemes = list(dict.fromkeys(p for _, _, e, _ in SETUPS for p in e))
    print("\n| set-up | " + " | ".join(f"`{p}*`" for p in schemes) + " |")
    print("|---|" + "---|" * len(schemes))
    for row in rows:
        print(f"| {row['setup']} | " + " | ".join(str(row.get(p, "")) for p in schemes) + " |")
    elapsed = time.monotonic() - started
    if lt.failures:
        print(f"series_budget: {len(lt.failures)} failure(s) in {elapsed:.0f}s; logs kept in {tmp}")
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"series_budget: ok in {elapsed:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
