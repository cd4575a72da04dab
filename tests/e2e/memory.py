"""The memory end of the capacity answer against a real vLLM whose KV cache binds first.

The second (byte-alphabet) vLLM runs with a cache of 16 blocks (`--num-gpu-blocks-override`,
`MEMORY_VLLM_ARGS`), so a few long requests fill it. `tokenmeter bench` ramps streams of
about 250 prompt and 490 output tokens through the proxy; meanwhile both servers' `/metrics`
are sampled. Then:

- **checked (gates CI):** tokenmeter's reading of the engine, `tokenmeter_engine_kv_cache_tokens`,
  equals the cache vLLM states on `vllm:cache_config_info` (`num_gpu_blocks x block_size`)
  exactly, and `tokenmeter_engine_preemptions_total` catches up with
  `vllm:num_preemptions_total` within a few of its scrape intervals once the load stops. Both
  are read from the same engine, so they are exact whatever the machine's speed.
- **reported, not gated:** the `chat` class's max concurrency and the bound
  that sets it, against the last level whose requests met the class and the first that did
  not, and the utilization the answer gives at each level. These depend on the timing of a
  CPU model on 2 shared cores; `docs/validation.md` shows them beside vLLM's own cache size,
  waiting queue and preemptions.
"""

import json
import os
import subprocess
import threading
import time
import traceback

import prom

# A cache a few requests fill: 16 blocks (vLLM's CPU block is 128 tokens: 2,048 tokens).
MEMORY_VLLM_ARGS = ["--num-gpu-blocks-override", "16", "--max-model-len", "1024"]
# The class the case is judged by: a first token within 2 s and 5 tokens/s for 90% of requests.
MEMORY_CLASS = "chat:ttft=2s,tps=5,objective=0.9"
MEMORY_LEVELS = (1, 2, 3, 4, 6, 8)
MEMORY_LEVEL_SECONDS = 15
# 100 words come to about 250 prompt tokens with the check's tokenizer (the chat template too).
MEMORY_PROMPT_WORDS = 100
MEMORY_OUTPUT_TOKENS = 490
# tokenmeter reads the engine every 5 s (--engine-metrics-interval) and refits at most every 5 s.
ENGINE_CATCH_UP_S = 30
REFIT_WAIT_S = 5.5


def vllm_cache(snapshot):
    """(num_gpu_blocks, block_size) from `vllm:cache_config_info`, or None."""
    for (n, ls), _ in snapshot.items():
        if n == "vllm:cache_config_info":
            d = dict(ls)
            try:
                return int(d["num_gpu_blocks"]), int(d["block_size"])
            except (KeyError, ValueError):
                return None
    return None


class Sampler(threading.Thread):
    """Samples both servers' /metrics every half second while the ramp runs: the peaks of
    vLLM's queue and cache usage, of tokenmeter's view of the engine and of the wire's."""

    SERIES = {
        "vllm_waiting": ("vllm", "vllm:num_requests_waiting", {}),
        "vllm_running": ("vllm", "vllm:num_requests_running", {}),
        "vllm_kv_usage": ("vllm", "vllm:kv_cache_usage_perc", {}),
        "engine_waiting": ("tm", "tokenmeter_engine_requests_waiting", {}),
        "engine_kv_usage": ("tm", "tokenmeter_engine_kv_cache_usage_ratio", {}),
        "wire_kv_tokens": ("tm", "tokenmeter_kv_cache_wire_tokens", {}),
        "utilization": ("tm", "tokenmeter_capacity_utilization", {"class": "chat"}),
    }

    def __init__(self, urls):
        super().__init__(daemon=True)
        self.urls = {"vllm": urls["vllm_metrics"], "tm": urls["tm_metrics"]}
        self.peaks = {}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            snaps = {}
            for k, url in self.urls.items():
                try:
                    snaps[k] = prom.scrape(url, timeout=5)
                except OSError:
                    snaps[k] = {}
            for key, (src, name, labels) in self.SERIES.items():
                v = prom.sample(snaps[src], name, **labels)
                if v is not None:
                    self.peaks[key] = max(v, self.peaks.get(key, v))
            self.stop.wait(0.5)


def met(level, ttft_s, tps):
    """Whether a bench level's requests met the class (90% within 2 s, 90% at 5 tok/s or more)."""
    t = level.get("ttft") or {}
    r = level.get("request_tps") or {}
    if t.get("p90") is None or r.get("p10") is None:
        return None
    return t["p90"] <= ttft_s and r["p10"] >= tps


def _engine_reads(tm_url, vllm_url, want_cache, timeout):
    """Waits until tokenmeter's engine view shows the cache and the preemptions vLLM states."""
    deadline = time.monotonic() + timeout
    while True:
        t, v = prom.scrape(tm_url), prom.scrape(vllm_url)
        got = {
            "cache": prom.sample(t, "tokenmeter_engine_kv_cache_tokens"),
            "preemptions": prom.sample(t, "tokenmeter_engine_preemptions_total"),
            "vllm_preemptions": prom.gauge(v, "vllm:num_preemptions_total"),
            "scrapes_ok": prom.gauge(t, "tokenmeter_engine_metrics_scrapes_total", result="ok"),
        }
        if (got["cache"] == want_cache and got["preemptions"] == got["vllm_preemptions"]) or (
            time.monotonic() > deadline
        ):
            return got
        time.sleep(1)


def ramp(cfg, urls, model, out_dir, settle):
    """`tokenmeter bench` through the proxy at each level, then waits for both servers to idle."""
    argv = [
        cfg.tokenmeter, "bench",
        "--target", urls["proxy"],
        "--model", model,
        "--concurrency", ",".join(str(c) for c in MEMORY_LEVELS),
        "--duration", f"{MEMORY_LEVEL_SECONDS}s",
        "--prompt-tokens", str(MEMORY_PROMPT_WORDS),
        "--output-tokens", str(MEMORY_OUTPUT_TOKENS),
        "--out", out_dir,
    ]  # fmt: skip
    with open(os.path.join(out_dir, "bench.log"), "wb") as log:
        rc = subprocess.call(argv, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    if rc != 0:
        raise RuntimeError(f"tokenmeter bench exited with {rc} (log {out_dir}/bench.log)")
    settle(urls["vllm_metrics"], urls["tm_metrics"], timeout=120)


def phase(cfg, checks, urls, model, settle):
    """Runs the case and returns its row for the report (docs/validation.md)."""
    started = time.monotonic()
    out_dir = os.path.join(cfg.out_dir, "memory")
    os.makedirs(out_dir, exist_ok=True)
    row = {
        "levels": list(MEMORY_LEVELS),
        "level_seconds": MEMORY_LEVEL_SECONDS,
        "prompt_words": MEMORY_PROMPT_WORDS,
        "output_tokens": MEMORY_OUTPUT_TOKENS,
        "class": MEMORY_CLASS,
        "vllm_args": " ".join(MEMORY_VLLM_ARGS),
    }
    v0 = prom.scrape(urls["vllm_metrics"])
    cache = vllm_cache(v0)
    row["vllm_cache"] = cache
    want = cache[0] * cache[1] if cache else None
    row["vllm_preemptions_before"] = prom.gauge(v0, "vllm:num_preemptions_total")
    first = _engine_reads(urls["tm_metrics"], urls["vllm_metrics"], want, ENGINE_CATCH_UP_S)
    checks.add(
        "memory",
        "tokenmeter reads vLLM's KV cache size exactly",
        want is not None and first["cache"] == want,
        f"vLLM cache_config_info {cache[0] if cache else '?'} blocks x {cache[1] if cache else '?'} "
        f"tokens = {want}; tokenmeter_engine_kv_cache_tokens {first['cache']} "
        f"({first['scrapes_ok']:.0f} engine reads ok)",
    )

    sampler = Sampler(urls)
    sampler.start()
    try:
        ramp(cfg, urls, model, out_dir, settle)
    except Exception as e:  # the case is reported, not gated: say what stopped it
        row["error"] = "".join(traceback.format_exception_only(e)).strip()
        print(f"[e2e] memory case (reported only) failed: {row['error']}", flush=True)
    finally:
        sampler.stop.set()
        sampler.join(10)
    row["peaks"] = sampler.peaks

    after = _engine_reads(urls["tm_metrics"], urls["vllm_metrics"], want, ENGINE_CATCH_UP_S)
    row["vllm_preemptions"] = after["vllm_preemptions"] - row["vllm_preemptions_before"]
    row["engine_preemptions"] = after["preemptions"]
    checks.add(
        "memory",
        "tokenmeter's count of the engine's preemptions catches up with vLLM's",
        after["preemptions"] is not None and after["preemptions"] == after["vllm_preemptions"],
        f"vllm:num_preemptions_total {after['vllm_preemptions']:.0f} "
        f"({row['vllm_preemptions']:.0f} in the ramp), tokenmeter_engine_preemptions_total "
        f"{after['preemptions']}",
    )

    time.sleep(REFIT_WAIT_S)
    text = prom.fetch(urls["tm_metrics"])
    with open(os.path.join(out_dir, "after.txt"), "w") as f:
        f.write(text)
    snap = prom.parse(text)
    limits = {
        dict(ls)["bound"]: v
        for (n, ls), v in snap.items()
        if n == "tokenmeter_capacity_limit_concurrency" and dict(ls).get("class") == "chat"
    }
    row["limits"] = limits
    row["max_concurrency"] = prom.sample(snap, "tokenmeter_capacity_max_concurrency", **{"class": "chat"})
    row["kv_cache_tokens"] = prom.sample(snap, "tokenmeter_capacity_kv_cache_tokens")
    row["kv_per_request"] = prom.sample(snap, "tokenmeter_capacity_kv_tokens_per_request")

    try:
        with open(os.path.join(out_dir, "bench.json")) as f:
            levels = json.load(f)["levels"]
    except (OSError, ValueError, KeyError):
        levels = []
    row["measured"] = []
    for lv in levels:
        t, r = lv.get("ttft") or {}, lv.get("request_tps") or {}
        inp = (lv.get("input_tokens_per_request") or {}).get("p50")
        out = (lv.get("output_tokens_per_request") or {}).get("p50")
        row["measured"].append(
            {"c": lv["concurrency"], "requests": lv["requests"], "errors": lv["errors"],
             "mean_c": lv.get("mean_concurrency"), "ttft_p50": t.get("p50"),
             "ttft_p90": t.get("p90"), "ttft_p99": t.get("p99"), "tps_p10": r.get("p10"),
             "met": met(lv, 2.0, 5.0), "prompt": inp, "output": out}
        )  # fmt: skip

    # Reported, not gated (gate.py, MEMORY_CASE): it rests on a CPU model's timing.
    # The edge: the highest level that met the class, and the first above it that missed (a
    # lone miss below it, a level of a few requests on a busy machine, is shown in the table).
    last_met = max((m["c"] for m in row["measured"] if m["met"]), default=None)
    first_missed = min(
        (m["c"] for m in row["measured"] if m["met"] is False and m["c"] > (last_met or 0)),
        default=None,
    )
    row["last_met"], row["first_missed"] = last_met, first_missed
    mx = row["max_concurrency"]
    binds = min(limits, key=lambda b: limits[b]) if limits else None
    row["binds"] = binds
    lo, hi = last_met or 1, first_missed or max(MEMORY_LEVELS)
    checks.add(
        "memory",
        "chat's max concurrency between the last level that met the class and the first that missed",
        mx is not None and lo <= mx <= hi,
        f"max_concurrency {mx} (binds: {binds}; limits {limits}); last met {last_met}, "
        f"first missed {first_missed}",
    )
    over = [c for c in MEMORY_LEVELS if c > hi]
    high = [c for c in (6, 8) if mx and c / mx > 1]
    checks.add(
        "memory",
        "utilization above 1 at 6 and 8 streams",
        mx is not None and high == [6, 8],
        f"at 6 streams {6 / mx:.2f}, at 8 {8 / mx:.2f} (levels past the edge: {over})"
        if mx
        else "no max_concurrency",
    )
    row["seconds"] = time.monotonic() - started
    print(f"[e2e] memory case took {row['seconds']:.0f} s", flush=True)
    return row
