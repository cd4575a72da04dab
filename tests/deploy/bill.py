"""The bill for a range from a store, held to the proxies' own counters: `tokenmeter cost
--prometheus URL --start S --end E --format json` against the stores live_test.py (Prometheus)
and fleet_test.py (VictoriaMetrics, and a cluster's Prometheus) already run, with two proxies'
series in each.

The truth is each proxy's counters read from its own /metrics at S and at E, their differences
summed over the proxies by tenant and model: GPU-seconds (prefill, decode), output tokens and
dollars on both bases. The range's edges are marked at rest: no request in flight on any proxy
for QUIET_S, two scrape intervals, before an edge is marked, and no traffic for QUIET_S after S.
Then every counter holds still across each edge (charges are counted when a request ends, the
allocation basis at the first scrape after a use), and what a store makes of the range can be
said exactly:
  - VictoriaMetrics' increase() counts from the last sample at or before S to the last at or
    before E: both at rest, so it is the truth itself. Tolerance: 1e-9 relative, float rounding
    (the store keeps a value as a decimal mantissa and exponent; the sums run in another order).
  - Prometheus's increase() takes the samples inside the range, last minus first (both at rest:
    the truth), and extrapolates it from the time between them out to the range's edges, by at
    most the range over that time: per pod, R / (t_last - t_first), read from the pod's raw
    samples in the store. So the truth <= Prometheus's figure <= the sum over the pods of each
    pod's truth times its factor; with 1 s scrapes over a range of R seconds the factor is up
    to R / (R - 2). Each bound with 1e-9 relative for rounding.
A row is a tenant and model with GPU time in the range; the rows must be the truth's, no more,
no fewer (every series the range's traffic moves existed before S: a series born inside the
range would have no sample at rest at S).

Standard library only; it reports problems and never calls a test's fail().
"""

import json
import re
import subprocess
import time
import urllib.parse
import urllib.request

# Two scrape intervals of the deploy checks (1 s): a scrape at rest lands in each.
QUIET_S = 2.0
# How long the proxies may take to finish what is in flight when an edge is marked.
QUIET_DEADLINE_S = 30
# Rounding: see the module doc.
REL = 1e-9
ABS = 1e-9

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
FIELDS = ("prefill", "decode", "output_tokens", "usd_usage", "usd_allocation")
# The json's name of each field.
JSON_FIELD = {"prefill": "prefill_gpu_seconds", "decode": "decode_gpu_seconds",
              "output_tokens": "output_tokens", "usd_usage": "usd_usage", "usd_allocation": "usd_allocation"}


def metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def samples(text):
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            yield m.group(1), dict(LABEL.findall(m.group(2) or "")), float(m.group(3))


def field_of(name, labels):
    """The bill's field a series counts in, or None."""
    if name == "tokenmeter_gpu_seconds_total":
        return labels.get("phase")
    if name == "tokenmeter_output_tokens_total":
        return "output_tokens"
    if name == "tokenmeter_gpu_cost_usd_total":
        return "usd_" + labels.get("basis", "")
    return None


def counters(text):
    """{(tenant, model): {field: value}} of one /metrics page; `all` for a series without a
    tenant, as the command keys it."""
    out = {}
    for name, labels, value in samples(text):
        field = field_of(name, labels)
        if field not in FIELDS:
            continue
        row = out.setdefault((labels.get("tenant", "all"), labels.get("model", "")), dict.fromkeys(FIELDS, 0.0))
        row[field] += value
    return out


def in_flight(text):
    return sum(v for name, _, v in samples(text) if name == "tokenmeter_requests_in_flight")


class Edge:
    """An instant at rest, and each proxy's counters then: {pod: counters}."""

    def __init__(self, t, by_pod):
        self.t = t
        self.by_pod = by_pod


def mark(pods):
    """Waits until nothing is in flight on any proxy of `pods` ({pod: metrics port}), then
    QUIET_S more, and reads the edge: the instant (to the millisecond) and the counters."""
    deadline = time.monotonic() + QUIET_DEADLINE_S
    while any(in_flight(metrics(port)) for port in pods.values()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"requests still in flight {QUIET_DEADLINE_S} s after the load stopped")
        time.sleep(0.2)
    time.sleep(QUIET_S)
    t = round(time.time(), 3)
    edge = Edge(t, {pod: counters(metrics(port)) for pod, port in pods.items()})
    if any(in_flight(metrics(port)) for port in pods.values()):
        raise RuntimeError("a request arrived while an edge of the range was being marked")
    return edge


def rfc3339(t):
    ms = round(t * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


def run_cost(tm_bin, url, start, end, fmt="json", end_as_rfc3339=False):
    """`tokenmeter cost --prometheus url` over [start, end]: (exit code, stdout, stderr)."""
    end_arg = rfc3339(end) if end_as_rfc3339 else f"{end:.3f}"
    r = subprocess.run([tm_bin, "cost", "--prometheus", url, "--start", f"{start:.3f}", "--end", end_arg,
                        "--format", fmt], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def window(start, end):
    return f"{round((end - start) * 1000)}ms"


def prometheus_factors(base, start, end, pods):
    """Per pod, the range over the time between its first and last samples in it, read from
    the store's raw samples of the idle counter (every series of a scrape shares its
    timestamps)."""
    q = urllib.parse.urlencode({"query": f"tokenmeter_gpu_idle_seconds_total[{window(start, end)}]",
                                "time": f"{end:.3f}"})
    with urllib.request.urlopen(f"{base}/api/v1/query?{q}", timeout=15) as r:
        result = json.loads(r.read())["data"]["result"]
    # In whole milliseconds, as the store keeps them: a unix time in float seconds is off by up
    # to 1.2e-7 s, over a range of seconds a relative 1e-8, more than the rounding allowed.
    out = {}
    for series in result:
        pod = series["metric"].get("pod")
        ms = [round(float(t) * 1000) for t, _ in series["values"]]
        if pod in pods and len(ms) >= 2 and ms[-1] > ms[0]:
            out[pod] = round((end - start) * 1000) / (ms[-1] - ms[0])
    return out


def truth(start, end, pods):
    """{(tenant, model): {field: [difference per pod]}} over the rows with GPU time."""
    out = {}
    for pod in pods:
        before, after = start.by_pod.get(pod, {}), end.by_pod.get(pod, {})
        for key, row in after.items():
            was = before.get(key, dict.fromkeys(FIELDS, 0.0))
            per = out.setdefault(key, {f: {} for f in FIELDS})
            for f in FIELDS:
                per[f][pod] = row[f] - was[f]
    return {k: v for k, v in out.items() if sum(v["prefill"].values()) + sum(v["decode"].values()) > 0}


def check(kind, bill, start, end, pods, factors=None):
    """Problems of the json `bill` against the proxies' counters at the edges. `factors`: per
    pod, Prometheus's largest extrapolation (None: VictoriaMetrics, exact)."""
    problems = []
    want = truth(start, end, pods)
    if bill.get("start") != rfc3339(start.t) or bill.get("end") != rfc3339(end.t):
        problems.append(f"{kind}: the bill says {bill.get('start')} to {bill.get('end')}, "
                        f"the range was {rfc3339(start.t)} to {rfc3339(end.t)}")
    got = {(r["tenant"], r["model"]): r for r in bill.get("rows", [])}
    if set(got) != set(want):
        problems.append(f"{kind}: rows {sorted(got)}, the proxies' counters moved in {sorted(want)}")
    for key in sorted(set(got) & set(want)):
        for f in FIELDS:
            value = got[key][JSON_FIELD[f]]
            exact = sum(want[key][f].values())
            # No dollars anywhere (no --gpu-hour-cost): the bill says none, the counters none.
            if value is None and f.startswith("usd") and exact == 0:
                continue
            high = exact if factors is None else sum(v * factors[p] for p, v in want[key][f].items())
            lo, hi = exact - REL * abs(exact) - ABS, high + REL * abs(high) + ABS
            if value is None or not lo <= value <= hi:
                per_pod = {p: round(v, 6) for p, v in want[key][f].items()}
                problems.append(f"{kind}: {key} {JSON_FIELD[f]} is {value}, the proxies' counters moved "
                                f"{exact} ({per_pod}); allowed {lo} to {hi}")
    return problems


def check_store(kind, tm_bin, url, start, end, pods, prometheus):
    """Runs the command against the store at `url` over [start, end] and checks its bill;
    (problems, a line saying what was compared). `prometheus`: the store extrapolates."""
    code, out, err = run_cost(tm_bin, url, start.t, end.t, end_as_rfc3339=not prometheus)
    if code != 0:
        return [f"{kind}: tokenmeter cost exited {code}: {err.strip()}"], ""
    try:
        bill = json.loads(out)
    except ValueError as e:
        return [f"{kind}: tokenmeter cost printed no json ({e}): {out[:300]}"], ""
    factors = None
    if prometheus:
        factors = prometheus_factors(url, start.t, end.t, pods)
        if set(factors) != set(pods):
            return [f"{kind}: no raw samples of every pod in the range ({sorted(factors)})"], ""
    problems = check(kind, bill, start, end, pods, factors)
    rows = {f"{r['tenant']}/{r['model']}": round(r["gpu_seconds"], 3) for r in bill.get("rows", [])}
    want = truth(start, end, pods)
    ratios = [r["gpu_seconds"] / w for r in bill.get("rows", [])
              if (w := sum(sum(want.get((r["tenant"], r["model"]), {}).get(f, {}).values())
                           for f in ("prefill", "decode"))) > 0]
    said = (f"{kind}: {end.t - start.t:.1f} s range, GPU-seconds by tenant/model {rows}; "
            f"the store's over the counters' {min(ratios, default=0):.6f} to {max(ratios, default=0):.6f}"
            + (f" (extrapolation allows up to {max(factors.values()):.4f} per pod)" if factors else ""))
    return problems, said
