#!/usr/bin/env python3
"""Writes grafana/dashboards/tokenmeter.json, the main tokenmeter dashboard.

The dashboard is generated so that every panel follows the same conventions (datasource variable,
label filters, ids, layout) and a change is one line here rather than a hunt through 2,000 lines
of JSON. The JSON is committed; tests/deploy/check_dashboard.py fails when it differs from what
this script writes. Usage:

    python3 grafana/build_dashboard.py          # rewrite the JSON
    python3 grafana/build_dashboard.py --check  # exit 1 if the committed JSON is stale

Standard library only. Metric names come from crates/tokenmeter/src/metrics/mod.rs (the contract); the checks verify
that every name used here exists there, and that every recorded series a panel reads is recorded by
deploy/prometheus/rules.yml.
"""

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent / "dashboards" / "tokenmeter.json"

DS = {"type": "prometheus", "uid": "${datasource}"}
# Label filters: metrics without a `model` label (gauges of the whole process) get only F.
F = 'namespace=~"$namespace", pod=~"$pod"'
FM = F + ', model=~"$model"'
RI = "$__rate_interval"
# Recorded series (deploy/prometheus/rules.yml) carry namespace and the labels they keep, never
# pod: they are filtered by namespace and model only.
FN = 'namespace=~"$namespace", model=~"$model"'
GPU_S_PER_M_TOKENS = "namespace_tenant_model:tokenmeter_gpu_seconds_per_million_output_tokens:rate5m"
FAILED = 'outcome=~"upstream_error|timeout"'
ALLOCATION = ', basis="allocation"'
USAGE = ', basis="usage"'
NOT_FAILED_BUT_5XX = 'outcome!~"upstream_error|timeout", code=~"5..|429"'


def rate(metric, sel=FM, window=RI):
    return f"rate({metric}{{{sel}}}[{window}])"


def quantile(q, metric, by="", sel=FM, window=RI):
    group = ", ".join([x for x in [by, "le"] if x])
    return f"histogram_quantile({q}, sum by ({group}) ({rate(metric + '_bucket', sel, window)}))"


def target(expr, legend="", ref="A", fmt=None, instant=False):
    t = {"datasource": DS, "refId": ref, "expr": expr, "legendFormat": legend or "__auto", "range": not instant}
    if instant:
        t["instant"] = True
    if fmt:
        t["format"] = fmt
    return t


def targets(*items):
    """(expr, legend) pairs -> targets with refIds A, B, C..."""
    return [target(e, l, chr(ord("A") + i)) for i, (e, l) in enumerate(items)]


def timeseries(title, desc, tgts, unit="short", stack=False, overrides=None, min0=True, thresholds=None):
    custom = {
        "drawStyle": "line",
        "lineWidth": 1,
        "fillOpacity": 15 if stack else 0,
        "showPoints": "never",
        "spanNulls": False,
        "stacking": {"mode": "normal" if stack else "none", "group": "A"},
        "axisPlacement": "auto",
    }
    defaults = {"unit": unit, "custom": custom}
    if min0:
        defaults["min"] = 0
    if thresholds:
        defaults["thresholds"] = thresholds
        custom["thresholdsStyle"] = {"mode": "line+area"}
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }


def stat(title, desc, expr, unit, decimals=None, thresholds=None, instant=False):
    defaults = {"unit": unit, "color": {"mode": "thresholds"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    defaults["thresholds"] = thresholds or {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}
    return {
        "type": "stat",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, instant=instant)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none" if instant else "area",
            "justifyMode": "auto",
            "textMode": "auto",
            "orientation": "auto",
        },
    }


def heatmap(title, desc, metric, unit):
    # rate over $__rate_interval, not increase over $__interval: when $__interval is as short as
    # the scrape interval a window holds one sample and the heatmap would be empty.
    expr = f"sum by (le) (rate({metric}_bucket{{{FM}}}[{RI}]))"
    return {
        "type": "heatmap",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [dict(target(expr, "{{le}}"), format="heatmap")],
        "fieldConfig": {"defaults": {"custom": {"scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential", "exponent": 0.5, "steps": 64},
            "yAxis": {"axisPlacement": "left", "unit": unit},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "yHistogram": True},
            "legend": {"show": True},
            "filterValues": {"le": 1e-9},
        },
    }


def bargauge(title, desc, expr, legend, unit, decimals=None):
    defaults = {"unit": unit, "min": 0, "color": {"mode": "continuous-GrYlRd"}}
    if decimals is not None:
        defaults["decimals"] = decimals
    return {
        "type": "bargauge",
        "title": title,
        "description": desc,
        "datasource": DS,
        "targets": [target(expr, legend, instant=True)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    }


def row(title):
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def right_axis(regex):
    return {
        "matcher": {"id": "byRegexp", "options": regex},
        "properties": [
            {"id": "custom.axisPlacement", "value": "right"},
            {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
            {"id": "custom.lineWidth", "value": 2},
            {"id": "unit", "value": "suffix: tok/s"},
        ],
    }


TOKS = "suffix: tok/s"

# Expressions shared by several panels.
OUT_RATE = f"sum({rate('tokenmeter_output_tokens_total')})"
FAILED_RATIO = (
    f"(sum by (model) ({rate('tokenmeter_requests_total', FM + ', ' + FAILED)}"
    f" or {rate('tokenmeter_requests_total', FM + ', ' + NOT_FAILED_BUT_5XX)})"
    f" or 0 * sum by (model) ({rate('tokenmeter_requests_total')}))"
    f" / sum by (model) ({rate('tokenmeter_requests_total')})"
)
FAILED_RATIO_ALL = (
    f"(sum({rate('tokenmeter_requests_total', FM + ', ' + FAILED)}"
    f" or {rate('tokenmeter_requests_total', FM + ', ' + NOT_FAILED_BUT_5XX)})"
    f" or vector(0))"
    f" / sum({rate('tokenmeter_requests_total')})"
)
# Unit economics: what the selected GPUs cost per million output tokens. GPUs are paid for
# whether they are busy or not, so idle capacity raises the figure, as it should. Each pod's
# GPU-hour price is its own tokenmeter_gpu_hour_cost (--gpu-hour-cost) where it exports one, else
# the gpu_hour_price variable.
def gpu_cost_per_hour(gpus, price):
    """USD per hour of the selected pods' GPUs: per pod, its price times its GPUs, summed."""
    return (f"sum(({price} or 0 * {gpus} + $gpu_hour_price) * {gpus})")


GPUS_NOW = f"sum by (namespace, pod) (tokenmeter_gpus{{{F}}})"
GPUS_RANGE = f"sum by (namespace, pod) (avg_over_time(tokenmeter_gpus{{{F}}}[$__range]))"
PRICE_NOW = f"sum by (namespace, pod) (tokenmeter_gpu_hour_cost{{{F}}})"
PRICE_RANGE = f"sum by (namespace, pod) (avg_over_time(tokenmeter_gpu_hour_cost{{{F}}}[$__range]))"
COST_PER_HOUR = gpu_cost_per_hour(GPUS_NOW, PRICE_NOW)
COST_RANGE_USD = f"{gpu_cost_per_hour(GPUS_RANGE, PRICE_RANGE)} * $__range_s / 3600"
COST_RANGE = (
    f"{COST_RANGE_USD}"
    f" / (sum(increase(tokenmeter_output_tokens_total{{{FM}}}[$__range])) / 1e6 > 0)"
)
COST_RATE = f"{COST_PER_HOUR} / ({OUT_RATE} * 3600 / 1e6 > 0)"

# SLO classes (--slo). Judged: every result but client_disconnect (a client that left before any
# target was missed). Missed: ttft_missed, tps_missed, e2e_missed, error. `or 0 * judged` keeps
# the ratio defined when nothing missed.
SLO = "tokenmeter_slo_requests_total"
JUDGED = 'result!="client_disconnect"'
MISSED = 'result!~"met|client_disconnect"'


def attainment(by, window=RI):
    judged = f"sum by ({by}) ({rate(SLO, FM + ', ' + JUDGED, window)})"
    missed = f"sum by ({by}) ({rate(SLO, FM + ', ' + MISSED, window)})"
    return f"1 - ({missed} or 0 * {judged}) / {judged}"


GOOD_RATE = f"sum({rate('tokenmeter_goodput_output_tokens_total')})"
GOOD_RANGE = f"sum(increase(tokenmeter_goodput_output_tokens_total{{{FM}}}[$__range]))"
COST_GOOD_RANGE = f"{COST_RANGE_USD} / ({GOOD_RANGE} / 1e6 > 0)"
COST_GOOD_RATE = f"{COST_PER_HOUR} / ({GOOD_RATE} * 3600 / 1e6 > 0)"
SLO_NOTE = (
    "Each request is counted once, when it ends, in its SLO class (--slo; the x-tokenmeter-class "
    "header, a rule of --slo-file, else the default class): met, or the first target it missed "
    "(ttft_missed, tps_missed, e2e_missed), error (upstream failure, timeout, non-2xx), or "
    "client_disconnect (left before any target was missed; not judged)."
)

CACHE_READ = FM + ', kind="read"'
# The parts of TTFT the engines state; `other` is observed for every request that states any.
PART = "tokenmeter_time_to_first_token_part_seconds"
PART_OTHER = FM + ', part="other"'

SPEED_NOTE = (
    "Per-request decode speed: (output tokens - 1) / (last token time - first token time), what "
    "one user saw while their answer streamed. Speeds fall as concurrency rises while aggregate "
    "throughput grows: read them next to the concurrency band."
)


def layout():
    """(panel, width, height) in reading order; rows start a new line."""
    return [
        (row("At a glance"), 24, 1),
        (stat("Output tokens/s", "Aggregate output tokens per second, all selected pods and models.", OUT_RATE, TOKS, 0), 3, 4),
        (stat("Tokens/s per GPU", "Output tokens/s divided by the GPUs behind the selected pods (tokenmeter_gpus, from --gpus).",
              f"{OUT_RATE} / sum(tokenmeter_gpus{{{F}}})", TOKS, 1), 3, 4),
        (stat("Requests/s", "Requests per second, every outcome.", f"sum({rate('tokenmeter_requests_total')})", "reqps", 2), 3, 4),
        (stat("Failed requests", "Share of requests that failed upstream: unreachable, cut mid-stream, timed out, 5xx or 429. "
              "Client errors (other 4xx) are not counted.", FAILED_RATIO_ALL, "percentunit", 1,
              {"mode": "absolute", "steps": [{"color": "green", "value": None}, {"color": "orange", "value": 0.01},
                                             {"color": "red", "value": 0.05}]}), 3, 4),
        (stat("TTFT p90", "90th percentile time to first token (queueing + prefill).",
              quantile(0.9, "tokenmeter_time_to_first_token_seconds"), "s", 2), 3, 4),
        (stat("Per-request tok/s p50", SPEED_NOTE, quantile(0.5, "tokenmeter_request_tokens_per_second"), TOKS, 1), 3, 4),
        (stat("In flight", "Requests in flight now: prefill (waiting for the first token) plus decode (streaming).",
              f"sum(tokenmeter_requests_in_flight{{{F}}})", "short", 0), 3, 4),
        (stat("Cost per 1M output tokens", "GPU cost of the selected pods over the time range (GPUs x hours x each "
              "pod's --gpu-hour-cost, else the gpu_hour_price variable) divided by the output tokens they produced, "
              "in millions.",
              COST_RANGE, "currencyUSD", 2, instant=True), 3, 4),

        (row("Speed: per request vs aggregate"), 24, 1),
        (timeseries("Per-request decode speed (p50 / p90 / p99)", SPEED_NOTE + " p99 is the fastest 1%; the slow tail is "
                    "the time per output token p99 in Latency.",
                    targets((quantile(0.5, "tokenmeter_request_tokens_per_second"), "p50"),
                            (quantile(0.9, "tokenmeter_request_tokens_per_second"), "p90"),
                            (quantile(0.99, "tokenmeter_request_tokens_per_second"), "p99")), TOKS), 9, 8),
        (timeseries("Output length (p50 / p90)", "Output tokens per request, beside per-request speed: a speed means "
                    "little without the length of the answers it was measured on. Speed is decode-only (first to "
                    "last token, TTFT left out), so short and long answers can be compared.",
                    targets((quantile(0.5, "tokenmeter_request_output_tokens"), "p50"),
                            (quantile(0.9, "tokenmeter_request_output_tokens"), "p90")), "short"), 6, 8),
        (timeseries("Aggregate output tokens/s", "Output tokens per second by model (from the counter), and tokenmeter's own "
                    "sliding-window gauge (tokenmeter_output_tokens_per_second, all models).",
                    targets((f"sum by (model) ({rate('tokenmeter_output_tokens_total')})", "{{model}}"),
                            (f"sum(tokenmeter_output_tokens_per_second{{{F}}})", "window gauge (all models)")), TOKS), 9, 8),
        (timeseries("Trade-off: per-request speed by concurrency band vs aggregate throughput",
                    "Lines: median per-request decode speed at each concurrency band (left axis). Dashed: aggregate "
                    "output tokens/s (right axis). Batching raises the aggregate while each request slows: this is "
                    "the curve capacity planning reads.",
                    targets((quantile(0.5, "tokenmeter_request_tokens_per_second", by="concurrency"), "p50 @ concurrency {{concurrency}}"),
                            (OUT_RATE, "aggregate tok/s")), TOKS,
                    overrides=[right_axis("aggregate.*")]), 12, 9),
        (bargauge("Median per-request speed by concurrency band", "Over the selected time range. " + SPEED_NOTE,
                  quantile(0.5, "tokenmeter_request_tokens_per_second", by="concurrency", window="$__range"),
                  "{{concurrency}}", TOKS, 1), 6, 9),
        (bargauge("Requests by concurrency band", "Requests that decoded at each concurrency band (time-weighted mean "
                  "requests in flight during their decode), over the selected time range.",
                  f"sum by (concurrency) (increase(tokenmeter_request_tokens_per_second_count{{{FM}}}[$__range]))",
                  "{{concurrency}}", "short", 0), 6, 9),
        (timeseries("Requests in flight by phase", "prefill: sent upstream, no token yet (queued or prefilling). "
                    "decode: tokens streaming.",
                    targets((f"sum by (phase) (tokenmeter_requests_in_flight{{{F}}})", "{{phase}}")), "short", stack=True), 8, 8),
        (timeseries("Output tokens/s per GPU", "Per pod: its output tokens/s over its GPUs (--gpus). All: total tokens "
                    "over total GPUs, so idle GPUs count.",
                    targets((f"sum by (namespace, pod) ({rate('tokenmeter_output_tokens_total')})"
                             f" / sum by (namespace, pod) (tokenmeter_gpus{{{F}}})", "{{namespace}}/{{pod}}"),
                            (f"{OUT_RATE} / sum(tokenmeter_gpus{{{F}}})", "all selected pods")), TOKS), 8, 8),
        (timeseries("Cost per 1M output tokens", "GPU-hour price (each pod's --gpu-hour-cost, else the variable "
                    "gpu_hour_price) x GPUs / output tokens per hour x 1e6. Falls as throughput rises; idle GPUs raise "
                    "it. Per goodput token: only the tokens of requests that met their SLO class's targets count.",
                    targets((COST_RATE, "USD per 1M output tokens"),
                            (COST_GOOD_RATE, "USD per 1M goodput tokens")), "currencyUSD"), 8, 8),

        (row("SLO classes: did users get the speed they were promised?"), 24, 1),
        (timeseries("SLO attainment by class", "Share of each class's judged requests that met every target of "
                    "their class (dashed: the class's objective, tokenmeter_slo_objective). " + SLO_NOTE,
                    targets((attainment("class"), "{{class}}"),
                            (f"max by (class) (tokenmeter_slo_objective{{{F}}})", "objective {{class}}")),
                    "percentunit", overrides=[{
                        "matcher": {"id": "byRegexp", "options": "objective.*"},
                        "properties": [{"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}}],
                    }]), 8, 9),
        (bargauge("SLO attainment by concurrency band", "Over the selected time range, per class and per band of "
                  "the mean requests in flight during each request (the band of tokenmeter_request_tokens_per_second): "
                  "the band at which a class's attainment collapses is the concurrency a pod can serve it at. " + SLO_NOTE,
                  attainment("class, concurrency", "$__range"), "{{class}} @ {{concurrency}}", "percentunit", 2), 8, 9),
        (timeseries("SLO results/s by result", "Why requests missed: per class, the first target missed "
                    "(ttft_missed, tps_missed, e2e_missed), error, or met. " + SLO_NOTE,
                    targets((f"sum by (class, result) ({rate(SLO)})", "{{class}} {{result}}")), "reqps", stack=True), 8, 9),
        (timeseries("Goodput beside throughput", "Output tokens/s of all requests, and of those that met their "
                    "class's targets (goodput, tokenmeter_goodput_output_tokens_total), per class. The gap is GPU "
                    "work that did not serve its purpose.",
                    targets((OUT_RATE, "all output tokens/s"),
                            (f"sum by (class) ({rate('tokenmeter_goodput_output_tokens_total')})", "goodput {{class}}")),
                    TOKS), 12, 8),
        (stat("Goodput share", "Goodput output tokens over all output tokens, over the selected time range.",
              f"({GOOD_RANGE} or vector(0)) / (sum(increase(tokenmeter_output_tokens_total{{{FM}}}[$__range])) > 0)",
              "percentunit", 1, instant=True), 6, 8),
        (stat("Cost per 1M goodput tokens", "GPU cost of the selected pods over the time range divided by the output "
              "tokens of requests that met their targets, in millions: what a useful token costs.",
              COST_GOOD_RANGE, "currencyUSD", 2, instant=True), 6, 8),

        (row("Capacity at SLO"), 24, 1),
        (capacity_curve(), 12, 9),
        (ttft_curve(), 12, 9),
        (timeseries("Fitted per-request speed by concurrency, each class's floor, and now",
                    CAPACITY_NOTE + " Lines: the fitted per-request tokens/s at 1, 2, 4 ... 256 streams per engine. "
                    "Dashed: each class's floor. Thick: the speed the fit predicts at the last minute's requests in "
                    "flight per engine (the operating point); where it meets a floor, that class is at its edge.",
                    targets((f"avg by (concurrency) (tokenmeter_capacity_curve_tokens_per_second{{{F}, kind=\"per_request\"}})",
                             "at {{concurrency}} streams"),
                            (f"max by (class) (tokenmeter_capacity_tps_floor{{{F}}})", "floor {{class}}"),
                            (CAPACITY_NOW, "now {{pod}}")), TOKS,
                    overrides=[dashed("floor .*"), thick("now .*")]), 12, 9),
        (timeseries("Limits per engine by class: TTFT vs tokens/s",
                    CAPACITY_NOTE + " Per class, the requests in flight per engine at which the predicted TTFT still "
                    "meets the class's ttft target (bound ttft) and at which the predicted per-request speed still "
                    "meets its floor (bound tokens_per_second), tokenmeter_capacity_limit_concurrency. The lower "
                    "line binds: it is the class's max concurrency. Thick: requests in flight per engine now "
                    "(tokenmeter_capacity_in_flight, the last minute's mean), per pod.",
                    targets((f"max by (class, bound) (tokenmeter_capacity_limit_concurrency{{{F}}})", "{{class}} {{bound}}"),
                            (IN_FLIGHT_PER_ENGINE, "in flight now {{pod}}")), "short",
                    overrides=[thick("in flight now .*")]), 12, 9),
        (capacity_limits_table(), 12, 8),
        (timeseries("The workload the TTFT predictions assume",
                    "The live mix the model replays: mean prompt, cached and output tokens per request over the "
                    "last 1,024 requests within --capacity-window (tokenmeter_capacity_workload_tokens), per pod. "
                    "A prediction holds for this mix: longer prompts move the TTFT limit down.",
                    targets((f"max by (namespace, pod, kind) (tokenmeter_capacity_workload_tokens{{{F}}})",
                             "{{pod}} {{kind}}")), "short"), 6, 8),
        (timeseries("Prefill cost per uncached prompt token",
                    "The fitted prefill cost (tokenmeter_capacity_prefill_seconds_per_token), per pod; source is "
                    "stated (the engine's own prefill times), wire (TTFTs at the proxy) or none (only short "
                    "prompts: taken as free).",
                    targets((f"max by (namespace, pod, source) (tokenmeter_capacity_prefill_seconds_per_token{{{F}}})",
                             "{{pod}} {{source}}")), "s"), 6, 8),
        (timeseries("Capacity utilization by class", "Requests in flight per engine over the last minute (those "
                    "waiting for their first token too) / the class's binding limit, per pod: 1.0 is the SLO's "
                    "edge, whichever of the TTFT and tokens/s limits binds. The autoscaling examples in deploy/ "
                    "hold it at 0.8; TokenmeterCapacityExhaustionSoon warns when the mean over pods is predicted "
                    "to reach 1.0 within 30 minutes.",
                    targets((f"max by (namespace, pod, class) (tokenmeter_capacity_utilization{{{F}}})",
                             "{{pod}} {{class}}")), "percentunit",
                    thresholds={"mode": "absolute", "steps": [{"color": "transparent", "value": None},
                                                              {"color": "orange", "value": 0.8},
                                                              {"color": "red", "value": 1.0}]}), 6, 8),
        (capacity_fit_table(), 6, 8),
        (timeseries("Predicted vs observed: TTFT p90 where the engine runs now",
                    "The model checks itself: at the last minute's mean requests in flight per engine "
                    "(tokenmeter_capacity_check_concurrency), the TTFT p90 it predicts beside the p90 of the requests "
                    "that finished in that minute (tokenmeter_capacity_check_ttft_seconds), per pod. Apart by more "
                    "than half: the capacity answer is not to be trusted (docs/capacity.md, When the model is off).",
                    targets((f"max by (namespace, pod, source) (tokenmeter_capacity_check_ttft_seconds{{{F}}})",
                             "{{pod}} {{source}}")), "s",
                    overrides=[dashed(".* predicted")]), 12, 8),
        (timeseries("Predicted vs observed: the model's error",
                    "predicted / observed - 1 at the concurrency seen, for TTFT p90 and the median per-request "
                    "tokens/s (tokenmeter_capacity_check_error_ratio), per pod. Red past +-50%: "
                    "tokenmeter_capacity_check_trusted is 0 there, and an autoscaler should hold.",
                    targets((f"max by (namespace, pod, quantity) (tokenmeter_capacity_check_error_ratio{{{F}}})",
                             "{{pod}} {{quantity}}")), "percentunit", min0=False,
                    thresholds={"mode": "absolute", "steps": [{"color": "red", "value": None},
                                                              {"color": "transparent", "value": -0.5},
                                                              {"color": "red", "value": 0.5}]}), 12, 8),
        (bargauge("Max concurrency per engine by class",
                  CAPACITY_NOTE + " The most requests in flight per engine at which the class still holds: the "
                  "smaller of its TTFT and tokens/s limits (tokenmeter_capacity_max_concurrency).",
                  f"max by (class) (tokenmeter_capacity_max_concurrency{{{F}}})", "{{class}}", "short", 0), 8, 8),
        (bargauge("Max request rate per engine by class",
                  CAPACITY_NOTE + " Requests per second per engine at which the class still holds, for services "
                  "that see arrivals rather than a fixed number of users (tokenmeter_capacity_max_request_rate).",
                  f"max by (class) (tokenmeter_capacity_max_request_rate{{{F}}})", "{{class}}", "reqps", 2), 8, 8),
        (bargauge("Cost per 1M output tokens at each class's limit",
                  "With --gpu-hour-cost: the GPUs' cost of a million output tokens when every engine runs at the "
                  "class's max concurrency (tokenmeter_capacity_cost_per_million_output_tokens).",
                  f"max by (class) (tokenmeter_capacity_cost_per_million_output_tokens{{{F}}})", "{{class}}",
                  "currencyUSD", 3), 8, 8),

        (row("Latency"), 24, 1),
        (timeseries("Time to first token (p50 / p90 / p99)", "From the request sent upstream to the first token-bearing event: "
                    "queueing plus prefill. Buckets are vLLM's, so these line up with vllm:time_to_first_token_seconds.",
                    targets((quantile(0.5, "tokenmeter_time_to_first_token_seconds"), "p50"),
                            (quantile(0.9, "tokenmeter_time_to_first_token_seconds"), "p90"),
                            (quantile(0.99, "tokenmeter_time_to_first_token_seconds"), "p99")), "s"), 8, 8),
        (heatmap("Time to first token distribution", "Requests per second in each TTFT bucket.",
                 "tokenmeter_time_to_first_token_seconds", "s"), 8, 8),
        (timeseries("Inter-token latency and time per output token", "Inter-token latency: gap between token-bearing events "
                    "per token carried. Time per output token: per request, decode time / (output tokens - 1); its p99 "
                    "is the slow tail of decode speed.",
                    targets((quantile(0.5, "tokenmeter_inter_token_latency_seconds"), "ITL p50"),
                            (quantile(0.99, "tokenmeter_inter_token_latency_seconds"), "ITL p99"),
                            (quantile(0.5, "tokenmeter_time_per_output_token_seconds"), "TPOT p50"),
                            (quantile(0.99, "tokenmeter_time_per_output_token_seconds"), "TPOT p99")), "s"), 8, 8),
        (timeseries("Request duration (p50 / p90 / p99)", "End to end: request sent upstream to the last byte of the response.",
                    targets((quantile(0.5, "tokenmeter_request_duration_seconds"), "p50"),
                            (quantile(0.9, "tokenmeter_request_duration_seconds"), "p90"),
                            (quantile(0.99, "tokenmeter_request_duration_seconds"), "p99")), "s"), 8, 8),
        (heatmap("Output length distribution", "Requests per second in each output-length bucket (tokens).", "tokenmeter_request_output_tokens", "short"), 8, 8),
        (heatmap("Input length distribution", "Requests per second in each prompt-length bucket (tokens; where the "
                 "stream reports usage).",
                 "tokenmeter_request_input_tokens", "short"), 8, 8),

        (row("Where TTFT goes"), 24, 1),
        (timeseries("Mean TTFT by part", "Where the engine says the wait before the first token went, for the "
                    "requests whose stream states it (vLLM --enable-per-request-metrics, Ollama, llama.cpp): queue, "
                    "model_load and prefill as stated, other = tokenmeter's TTFT less them (the API server, the "
                    "network, the proxy). Each part's total over the requests that state any part, stacked: the "
                    "stack is their mean TTFT.",
                    targets((f"sum by (part) ({rate(PART + '_sum')}) / scalar(sum({rate(PART + '_count', PART_OTHER)}))",
                             "{{part}}")), "s", stack=True), 8, 8),
        (timeseries("TTFT p99 by part", "The slow tail of each part: which part's tail grew when TTFT's did. A part "
                    "counts only the requests that state it.",
                    targets((quantile(0.99, PART, by="part"), "{{part}}")), "s"), 8, 8),
        (timeseries("Timings coverage and mismatches", "Share of requests whose stream stated the engine's timings, "
                    "by engine: how much of the traffic the split speaks for. Mismatches: the share of those whose "
                    "stated parts exceeded tokenmeter's own TTFT (their other part is 0): the server counts from "
                    "another clock, trust TTFT over the parts.",
                    targets((f"sum by (source) ({rate('tokenmeter_engine_timings_requests_total')})"
                             f" / scalar(sum({rate('tokenmeter_requests_total')}))", "{{source}}"),
                            (f"(sum({rate('tokenmeter_engine_timing_mismatch_total')}) or vector(0))"
                             f" / scalar(sum({rate('tokenmeter_engine_timings_requests_total')}))", "mismatches")),
                    "percentunit"), 8, 8),
        (timeseries("Memory pressure: the engine's KV cache",
                    "Beside queue and prefill, the third reason a first token is late: the engine's KV cache, as its "
                    "own metrics state it (--engine-metrics): the share in use (tokenmeter_engine_kv_cache_usage_ratio), "
                    "per pod. Near 100% with requests waiting or preemptions (right), newcomers wait for memory, "
                    "not compute: TokenmeterTTFTMissedOnMemory.",
                    targets((f"max by (namespace, pod) (tokenmeter_engine_kv_cache_usage_ratio{{{F}}})", "{{pod}} usage")),
                    "percentunit", thresholds={"mode": "absolute", "steps": [{"color": "transparent", "value": None},
                                                                          {"color": "orange", "value": 0.95}]}), 12, 8),
        (timeseries("KV cache held: the engine's count and the wire's",
                    "Tokens in the KV cache per pod: as the engine counts them (tokenmeter_engine_kv_cache_usage_ratio x "
                    "tokenmeter_engine_kv_cache_tokens) and as the wire counts them (tokenmeter_kv_cache_wire_tokens: "
                    "the requests in flight, their streamed tokens and the mix's mean uncached prompt). The engine "
                    "below the wire: its prefix cache shares blocks. Above: it preempts and recomputes, or traffic "
                    "tokenmeter does not see reaches it.",
                    targets((f"max by (namespace, pod) (tokenmeter_engine_kv_cache_usage_ratio{{{F}}})"
                             f" * on (namespace, pod) max by (namespace, pod) (tokenmeter_engine_kv_cache_tokens{{{F}}})",
                             "{{pod}} engine"),
                            (f"max by (namespace, pod) (tokenmeter_kv_cache_wire_tokens{{{F}}})", "{{pod}} wire")),
                    "short", overrides=[dashed(".* wire")]), 12, 8),
        (timeseries("Memory pressure: waiting inside the engine, and preemptions",
                    "Requests the engine holds back for a batch slot or memory (tokenmeter_engine_requests_waiting), "
                    "and the sequences it preempts per second for want of KV-cache blocks "
                    "(tokenmeter_engine_preemptions_total), per pod, as the engine's metrics state them.",
                    targets((f"max by (namespace, pod) (tokenmeter_engine_requests_waiting{{{F}}})", "{{pod}} waiting"),
                            (f"sum by (namespace, pod) (rate(tokenmeter_engine_preemptions_total{{{F}}}[$__rate_interval]))",
                             "{{pod}} preemptions/s")), "short"), 12, 8),

        (row("What the wire shows"), 24, 1),
        (timeseries("Time to first token by prompt band (p50)", "TTFT is prefill, and prefill grows with the prompt: "
                    "the median TTFT of each band of prompt tokens (1-256, 257-1k, 1k-4k, 4k-16k, 16k-64k, 64k+; "
                    "unknown when the stream reports no prompt count). A TTFT is observed once its prompt count is "
                    "known, which for OpenAI-style streams is at the final usage report.",
                    targets((quantile(0.5, "tokenmeter_time_to_first_token_seconds", by="prompt"), "{{prompt}}")), "s"), 8, 8),
        (timeseries("Time to first output by kind (p50)", "The first reasoning, content and tool-call output. TTFT is the "
                    "first of any kind; a gateway that waits for content reports the content line as its TTFT, which "
                    "for a reasoning model can be minutes after the first token.",
                    targets((quantile(0.5, "tokenmeter_time_to_first_output_seconds", by="kind"), "{{kind}}")), "s"), 8, 8),
        (timeseries("Reasoning share of output tokens", "Reasoning tokens (usage's reasoning details, else counted "
                    "from reasoning events) over all output tokens, by model.",
                    targets((f"sum by (model) ({rate('tokenmeter_reasoning_tokens_total')})"
                             f" / sum by (model) ({rate('tokenmeter_output_tokens_total')})", "{{model}}")), "percentunit"), 8, 8),
        (timeseries("Tokens per event (p50 / p99)", "Tokens one streamed event carried: above 1 means speculative "
                    "decoding, a stream interval (vLLM --stream-interval) or coalescing upstream.",
                    targets((quantile(0.5, "tokenmeter_tokens_per_event"), "p50"),
                            (quantile(0.99, "tokenmeter_tokens_per_event"), "p99")), "short"), 8, 8),
        (timeseries("Longest stall per request (p50 / p99)", "Per request, the longest gap between two token-bearing "
                    "events (TTFT not counted): what a user sees as \"it froze\".",
                    targets((quantile(0.5, "tokenmeter_request_max_stall_seconds"), "p50"),
                            (quantile(0.99, "tokenmeter_request_max_stall_seconds"), "p99")), "s"), 8, 8),
        (timeseries("Prompt cache: cached tokens/s and hit rate", "Cached prompt tokens per second read from and "
                    "written to the server's prompt cache (where usage reports them), and the read share of all "
                    "prompt tokens (right axis).",
                    targets((f"sum by (kind) ({rate('tokenmeter_cached_input_tokens_total')})", "{{kind}} tokens/s"),
                            (f"sum({rate('tokenmeter_cached_input_tokens_total', CACHE_READ)})"
                             f" / sum({rate('tokenmeter_input_tokens_total')})", "hit rate")), "short",
                    overrides=[{"matcher": {"id": "byName", "options": "hit rate"},
                                "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                               {"id": "unit", "value": "percentunit"}]}]), 8, 8),

        (row("Tenants: who is using the GPUs"), 24, 1),
        (timeseries("Tokens/s by tenant", "Output tokens per second by tenant (--tenant-header, or --tenant-from-key's "
                    "key-... ids): who the GPUs work for. other: tenants beyond --max-tenants; none: requests that "
                    "named no tenant; invalid: a header value that is no tenant name. " + TENANT_NOTE,
                    targets((f"sum by (tenant) ({rate('tokenmeter_output_tokens_total')})", "{{tenant}}")), TOKS,
                    stack=True), 12, 8),
        (timeseries("Per-request tokens/s by tenant (p50)", "Median per-request decode speed of each tenant's "
                    "requests: one tenant slower than the rest at the same concurrency points at its prompts or "
                    "its parameters, not the server. " + TENANT_NOTE,
                    targets((quantile(0.5, "tokenmeter_request_tokens_per_second", by="tenant"), "{{tenant}}")), TOKS), 6, 8),
        (timeseries("TTFT by tenant (p90)", "90th percentile time to first token of each tenant's requests. " + TENANT_NOTE,
                    targets((quantile(0.9, "tokenmeter_time_to_first_token_seconds", by="tenant"), "{{tenant}}")), "s"), 6, 8),

        (row("Who pays: GPU time by tenant and model"), 24, 1),
        (timeseries("GPUs busy for each tenant, and idle", "GPU-seconds per second charged to each tenant's "
                    "requests (docs/cost.md's rule: a decode step's fixed cost shared by its batch, its per-sequence "
                    "cost to each, prefill to the request whose prompt it is), and idle: together they add up to "
                    "--gpus (a request's charge is counted when it ends). " + TENANT_NOTE,
                    targets((f"sum by (tenant) ({rate('tokenmeter_gpu_seconds_total')})", "{{tenant}}"),
                            (f"sum({rate('tokenmeter_gpu_idle_seconds_total', F)})", "idle")), "short",
                    stack=True), 12, 8),
        (timeseries("GPU time by model and phase", "GPU-seconds per second charged by model, prefill (up to the first "
                    "token) and decode.",
                    targets((f"sum by (model, phase) ({rate('tokenmeter_gpu_seconds_total')})", "{{model}} {{phase}}")),
                    "short", stack=True), 6, 8),
        (timeseries("GPU-seconds per million output tokens by tenant", "What a tenant's tokens really cost the GPU: "
                    "long prompts and requests that decode alone cost more per token than short prompts in a full "
                    "batch. " + TENANT_NOTE,
                    targets((f"sum by (tenant) ({rate('tokenmeter_gpu_seconds_total')}) * 1e6 / "
                             f"sum by (tenant) ({rate('tokenmeter_output_tokens_total')})", "{{tenant}}")), "s"), 6, 8),
        (timeseries("Cost per hour by tenant (USD, allocation)", "With --gpu-hour-cost: each tenant's GPU time in "
                    "USD per hour, with the idle time spread over the tenants by their use (OpenCost's allocation "
                    "basis: it adds up to the bill); the usage basis leaves idle out.",
                    targets((f"3600 * sum by (tenant) ({rate('tokenmeter_gpu_cost_usd_total', FM + ALLOCATION)})",
                             "{{tenant}} allocation"),
                            (f"3600 * sum by (tenant) ({rate('tokenmeter_gpu_cost_usd_total', FM + USAGE)})",
                             "{{tenant}} usage")), "currencyUSD"), 8, 8),
        (timeseries("Idle share of the GPUs", "The share of GPU time with no request in flight. Idle is paid for too: "
                    "the allocation basis spreads it over the tenants.",
                    targets((f"sum({rate('tokenmeter_gpu_idle_seconds_total', F)}) / "
                             f"(sum({rate('tokenmeter_gpu_idle_seconds_total', F)}) + sum({rate('tokenmeter_gpu_seconds_total', F)}))",
                             "idle")), "percentunit"), 8, 8),
        (timeseries("GPU-seconds per million output tokens by tenant and model (recorded)",
                    "What each tenant's tokens cost the GPUs on each model, summed over the pods of a namespace: "
                    f"the recording rule {GPU_S_PER_M_TOKENS} of deploy/prometheus/rules.yml, over 5 minutes, "
                    "so it costs the same to draw for one pod or five hundred. Empty where the rules are not "
                    "loaded; the Pod variable does not apply (the recording sums the pods). A tenant with GPU "
                    "time and no output tokens has no line; without a tenant flag a model's line has no tenant.",
                    targets((f"{GPU_S_PER_M_TOKENS}{{{FN}}}", "{{tenant}} {{model}} ({{namespace}})")), "s"), 8, 8),

        (row("Requests and errors"), 24, 1),
        (timeseries("Requests/s by outcome", "complete, client_disconnect (the client went away), upstream_error "
                    "(unreachable or cut mid-stream), timeout.",
                    targets((f"sum by (outcome) ({rate('tokenmeter_requests_total')})", "{{outcome}}")), "reqps", stack=True), 8, 8),
        (timeseries("Requests/s by status code", "HTTP status returned to clients (502/504 when tokenmeter could not get an "
                    "answer from the upstream).",
                    targets((f"sum by (code) ({rate('tokenmeter_requests_total')})", "{{code}}")), "reqps", stack=True), 8, 8),
        (timeseries("Failed request ratio by model", "Failed: unreachable, cut mid-stream, timed out, 5xx or 429. "
                    "The TokenmeterHighErrorRatio alert fires above 5% for 5 minutes.",
                    targets((FAILED_RATIO, "{{model}}")), "percentunit",
                    thresholds={"mode": "absolute", "steps": [{"color": "transparent", "value": None},
                                                              {"color": "red", "value": 0.05}]}), 8, 8),
        (timeseries("Token counts by source", "Where each request's token counts came from: usage (the server's own "
                    "report, exact), token_ids (per-event ids, exact), counted (token-bearing events, approximate: "
                    "ask for stream_options.include_usage).",
                    targets((f"sum by (source) ({rate('tokenmeter_token_count_source_total', F)})", "{{source}}")), "reqps", stack=True), 8, 8),
        (timeseries("Parse errors/s by reason", "Input forwarded untouched but not (fully) read: line_too_long "
                    "(over --max-line-bytes), invalid_json, content_encoding (compressed bodies).",
                    targets((f"sum by (reason) ({rate('tokenmeter_parse_errors_total', F)})", "{{reason}}")), "short"), 8, 8),
        (timeseries("Input and output tokens/s", "Prompt tokens (where reported) and output tokens per second, by model.",
                    targets((f"sum by (model) ({rate('tokenmeter_input_tokens_total')})", "input {{model}}"),
                            (f"sum by (model) ({rate('tokenmeter_output_tokens_total')})", "output {{model}}")), TOKS), 8, 8),
        (table_instances(), 24, 6),
    ]


TENANT_NOTE = (
    "Without --tenant-header or --tenant-from-key the label does not exist and each panel shows one "
    "unnamed line: all traffic."
)

CAPACITY_NOTE = (
    "The live capacity model fits the decode step t(b) = base + per_sequence x b from the traffic "
    "itself (docs/capacity.md); check the fit's samples, r2 and observed concurrency range in the "
    "fit table before trusting an answer outside that range."
)
# Requests in flight per engine over the last minute, per pod, recovered from any class's
# utilization x max concurrency (the binding limit utilization is measured against).
IN_FLIGHT_PER_ENGINE = f"max by (namespace, pod) (tokenmeter_capacity_in_flight{{{F}}})"
# Predicted per-request tok/s at the operating point: 1 / t(requests in flight per engine). The
# fit's concurrency counts decoding streams; with short prompts the two are close, with long
# ones the requests still waiting for their first token make this a little pessimistic.
CAPACITY_NOW = (
    f"1 / (max by (namespace, pod) (tokenmeter_capacity_step_seconds{{{F}, term=\"base\"}})"
    f" + max by (namespace, pod) (tokenmeter_capacity_step_seconds{{{F}, term=\"per_sequence\"}})"
    f" * {IN_FLIGHT_PER_ENGINE})"
)


def dashed(regex):
    return {"matcher": {"id": "byRegexp", "options": regex}, "properties": [
        {"id": "custom.lineStyle", "value": {"fill": "dash", "dash": [10, 10]}},
        {"id": "custom.lineWidth", "value": 2},
    ]}


def thick(regex):
    return {"matcher": {"id": "byRegexp", "options": regex},
            "properties": [{"id": "custom.lineWidth", "value": 4}]}


def capacity_curve():
    """The curve as it stands: per-request (bars) and aggregate tokens/s per engine by concurrency."""
    sel = F + ', kind=\"{}\"'
    tgts = [
        dict(target(f"avg by (concurrency) (tokenmeter_capacity_curve_tokens_per_second{{{sel.format('per_request')}}})",
                    "per-request tok/s", ref="A", fmt="table", instant=True)),
        dict(target(f"avg by (concurrency) (tokenmeter_capacity_curve_tokens_per_second{{{sel.format('aggregate')}}})",
                    "aggregate tok/s per engine", ref="B", fmt="table", instant=True)),
    ]
    return {
        "type": "barchart",
        "title": "The fitted trade-off now: per-request vs aggregate tokens/s per engine",
        "description": CAPACITY_NOTE + " Per concurrency (streams per engine): what one stream gets (1/t(b)) and what "
                       "the engine produces (b/t(b)); concurrencies beyond the observed maximum are extrapolated.",
        "datasource": DS,
        "targets": tgts,
        "transformations": [
            {"id": "joinByField", "options": {"byField": "concurrency", "mode": "outer"}},
            {"id": "convertFieldType", "options": {"conversions": [
                {"targetField": "concurrency", "destinationType": "number"}]}},
            {"id": "sortBy", "options": {"sort": [{"field": "concurrency"}]}},
            {"id": "convertFieldType", "options": {"conversions": [
                {"targetField": "concurrency", "destinationType": "string"}]}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "Time 1": True, "Time 2": True},
                "renameByName": {"Value #A": "per-request tok/s", "Value #B": "aggregate tok/s per engine"},
            }},
        ],
        "fieldConfig": {"defaults": {"unit": TOKS, "min": 0}, "overrides": [
            {"matcher": {"id": "byName", "options": "aggregate tok/s per engine"},
             "properties": [{"id": "custom.axisPlacement", "value": "right"}]},
        ]},
        "options": {"xField": "concurrency", "orientation": "vertical", "showValue": "never",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
    }


def ttft_curve():
    """The predicted TTFT per engine by concurrency, p50 / p90 / p99, beside the tokens/s curve."""
    sel = F + ', percentile=\"{}\"'
    tgts = [
        dict(target(f"avg by (concurrency) (tokenmeter_capacity_ttft_seconds{{{sel.format(p)}}})",
                    f"p{p}", ref=ref, fmt="table", instant=True))
        for ref, p in (("A", "50"), ("B", "90"), ("C", "99"))
    ]
    return {
        "type": "barchart",
        "title": "Predicted TTFT by concurrency per engine (p50 / p90 / p99)",
        "description": CAPACITY_NOTE + " Per concurrency (requests in flight per engine): the time to first token "
                       "the model predicts (tokenmeter_capacity_ttft_seconds) for the live mix of prompt, cached and "
                       "output lengths over --capacity-window: prefill of the uncached prompt, the queue before it "
                       "as prefill load nears what the engine can prefill, and decode steps slowed while it "
                       "prefills. Where a class's ttft target meets its quantile is the class's TTFT limit.",
        "datasource": DS,
        "targets": tgts,
        "transformations": [
            {"id": "joinByField", "options": {"byField": "concurrency", "mode": "outer"}},
            {"id": "convertFieldType", "options": {"conversions": [
                {"targetField": "concurrency", "destinationType": "number"}]}},
            {"id": "sortBy", "options": {"sort": [{"field": "concurrency"}]}},
            {"id": "convertFieldType", "options": {"conversions": [
                {"targetField": "concurrency", "destinationType": "string"}]}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "Time 1": True, "Time 2": True, "Time 3": True},
                "renameByName": {"Value #A": "p50", "Value #B": "p90", "Value #C": "p99"},
            }},
        ],
        "fieldConfig": {"defaults": {"unit": "s", "min": 0}, "overrides": []},
        "options": {"xField": "concurrency", "orientation": "vertical", "showValue": "never",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}},
    }


def capacity_limits_table():
    """Per class: both limits, the one that binds, the max request rate and the utilization now."""
    limit = "tokenmeter_capacity_limit_concurrency"

    def q(expr, ref, by="class"):
        return dict(target(f"max by ({by}) ({expr})", ref=ref, fmt="table", instant=True))
    tgts = [
        q(f'{limit}{{{F}, bound="ttft"}}', "A"),
        q(f'{limit}{{{F}, bound="tokens_per_second"}}', "B"),
        q(f'{limit}{{{F}, bound="kv_cache"}}', "G"),
        q(f'{limit}{{{F}, bound="max_num_seqs"}}', "H"),
        q(f"tokenmeter_capacity_max_concurrency{{{F}}}", "C"),
        q(f"tokenmeter_capacity_max_request_rate{{{F}}}", "D"),
        q(f"tokenmeter_capacity_utilization{{{F}}}", "E"),
        # The bound whose limit is the max concurrency, per pod; the value is how many pods it binds on.
        dict(target(f"count by (class, bound) ({limit}{{{F}}}"
                    f" == on (namespace, pod, class) group_left tokenmeter_capacity_max_concurrency{{{F}}})",
                    ref="F", fmt="table", instant=True)),
    ]
    return {
        "type": "table",
        "title": "Limits per engine by class now: which one binds",
        "description": CAPACITY_NOTE + " Per class, the largest over the selected pods (select one pod to read its "
                       "own): the concurrency limits from TTFT, from tokens/s, from the KV cache and from the engine's "
                       "cap on sequences (the last two where the cache is known), the max concurrency (the smallest), the max request rate, and utilization (in flight / max concurrency). binds: the "
                       "bound whose limit is the max concurrency, and on how many pods. No row: the fit is still "
                       "warming up, or the class has neither target.",
        "datasource": DS,
        "targets": tgts,
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "renameByName": {"Value #A": "TTFT limit", "Value #B": "tokens/s limit",
                                 "Value #C": "max concurrency", "Value #D": "max requests/s",
                                 "Value #E": "utilization", "bound": "binds", "Value #F": "pods",
                                 "Value #G": "KV cache limit", "Value #H": "max-num-seqs limit"},
            }},
        ],
        "fieldConfig": {"defaults": {}, "overrides": [
            {"matcher": {"id": "byRegexp", "options": "TTFT limit|tokens/s limit|KV cache limit|max-num-seqs limit|max concurrency"},
             "properties": [{"id": "decimals", "value": 0}]},
            {"matcher": {"id": "byName", "options": "max requests/s"},
             "properties": [{"id": "unit", "value": "reqps"}, {"id": "decimals", "value": 2}]},
            {"matcher": {"id": "byName", "options": "utilization"},
             "properties": [{"id": "unit", "value": "percentunit"}]},
        ]},
        "options": {"showHeader": True},
    }


def capacity_fit_table():
    """The fit and its quality, one row per pod."""
    def q(expr, ref):
        return dict(target(f"max by (namespace, pod) ({expr})", ref=ref, fmt="table", instant=True))
    tgts = [
        q(f'tokenmeter_capacity_step_seconds{{{F}, term="base"}}', "A"),
        q(f'tokenmeter_capacity_step_seconds{{{F}, term="per_sequence"}}', "B"),
        q(f"tokenmeter_capacity_fit_r2{{{F}}}", "C"),
        q(f"tokenmeter_capacity_fit_samples{{{F}}}", "D"),
        q(f'tokenmeter_capacity_observed_concurrency{{{F}, bound="min"}}', "E"),
        q(f'tokenmeter_capacity_observed_concurrency{{{F}, bound="max"}}', "F"),
    ]
    return {
        "type": "table",
        "title": "Capacity fit quality",
        "description": "Per pod: the fitted step cost (base, per sequence), r2 over the per-concurrency medians, "
                       "the token samples behind it, and the concurrency range it saw (answers outside it are "
                       "extrapolations). No row: the fit is still warming up.",
        "datasource": DS,
        "targets": tgts,
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True},
                "renameByName": {"Value #A": "base", "Value #B": "per sequence", "Value #C": "r2",
                                 "Value #D": "samples", "Value #E": "min conc", "Value #F": "max conc"},
            }},
        ],
        "fieldConfig": {"defaults": {}, "overrides": [
            {"matcher": {"id": "byRegexp", "options": "base|per sequence"}, "properties": [{"id": "unit", "value": "s"}]},
            {"matcher": {"id": "byName", "options": "r2"}, "properties": [{"id": "decimals", "value": 3}]},
        ]},
        "options": {"showHeader": True},
    }


def table_instances():
    tgts = [
        dict(target(f"max by (namespace, pod, version) (tokenmeter_build_info{{{F}}})", ref="A", fmt="table", instant=True)),
        dict(target(f"max by (namespace, pod, source) (tokenmeter_gpus{{{F}}})", ref="B", fmt="table", instant=True)),
        dict(target(f"time() - max by (namespace, pod) (tokenmeter_start_time_seconds{{{F}}})", ref="C", fmt="table", instant=True)),
    ]
    return {
        "type": "table",
        "title": "tokenmeter instances",
        "description": "One row per tokenmeter process: version, GPUs (--gpus) and where that number came from "
                       "(source: flag, nvidia_visible_devices, cuda_visible_devices, file, default), and uptime.",
        "datasource": DS,
        "targets": tgts,
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "Value #A": True},
                "renameByName": {"Value #B": "GPUs", "source": "GPUs from", "Value #C": "uptime"},
            }},
        ],
        "fieldConfig": {"defaults": {}, "overrides": [
            {"matcher": {"id": "byName", "options": "uptime"}, "properties": [{"id": "unit", "value": "s"}]},
        ]},
        "options": {"showHeader": True},
    }


def variables():
    def query_var(name, label, query):
        return {
            "name": name,
            "label": label,
            "type": "query",
            "datasource": DS,
            "definition": query,
            "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2,
            "includeAll": True,
            "allValue": ".*",
            "multi": True,
            "sort": 1,
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "options": [],
            "hide": 0,
            "regex": "",
        }

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1, "regex": ""},
        query_var("namespace", "Namespace", "label_values(tokenmeter_build_info, namespace)"),
        query_var("pod", "Pod", 'label_values(tokenmeter_build_info{namespace=~"$namespace"}, pod)'),
        query_var("model", "Model", 'label_values(tokenmeter_requests_total{namespace=~"$namespace", pod=~"$pod"}, model)'),
        {"name": "gpu_hour_price", "label": "GPU-hour price (USD)", "type": "textbox", "query": "2.50",
         "current": {"text": "2.50", "value": "2.50"}, "options": [{"selected": True, "text": "2.50", "value": "2.50"}],
         "hide": 0,
         "description": "What one GPU costs per hour, for the cost per million output tokens of pods that do "
                        "not export their own (--gpu-hour-cost)."},
    ]


def build():
    panels, x, y, line_h, next_id = [], 0, 0, 0, 1
    for panel, w, h in layout():
        if panel["type"] == "row" or x + w > 24:
            x, y = 0, y + line_h
            line_h = 0
        panel = dict(panel, id=next_id, gridPos={"h": h, "w": w, "x": x, "y": y})
        next_id += 1
        panels.append(panel)
        if panel["type"] == "row":
            y += h
            continue
        x += w
        line_h = max(line_h, h)
    return {
        "uid": "tokenmeter-main",
        "title": "tokenmeter: LLM inference",
        "description": "TTFT, per-request and aggregate tokens/s at stated concurrency, errors and cost, from tokenmeter.",
        "tags": ["tokenmeter", "llm", "inference"],
        "editable": True,
        "graphTooltip": 1,
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "schemaVersion": 39,
        "version": 1,
        "links": [],
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True, "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard",
        }]},
        "templating": {"list": variables()},
        "panels": panels,
    }


def render():
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main():
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python3 grafana/build_dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
