"""A workload recorded through tokenmeter, then replayed by the clients users replay traces with.

With `--workload-log FILE` tokenmeter writes one line per finished request in the Mooncake trace
format: `timestamp` (ms from the first arrival), `input_length`, `output_length` and, with
`--tokenizer`, `hash_ids` (the prompt cut in blocks of 512 tokens; a block's id is the same
wherever the same prefix recurs). vLLM's benchmark (`--dataset-name timed_trace`) and GuideLLM
(`--profile kind=replay` with the `mooncake` data kind) read that format. On the main server:

1. **record**: a tokenmeter with `--workload-log FILE --tokenizer MODEL_DIR` (and a request log)
   in front of vLLM, and an open-loop load through it: `N_REQUESTS` streamed `/v1/completions`
   sent one every `SPACING_S`, short (`SHORT_TOKENS` prompt tokens, `SHORT_MAX` output tokens)
   and long (`LONG_TOKENS`, `LONG_MAX`) in turn, the long ones sharing their first
   `SHARED_TOKENS` tokens, each prompt `STEP_TOKENS` longer than the one before; `ignore_eos`,
   temperature 0. Checked: one line per request, paired by prompt length (no two requests' usage
   is the same; the order they reach the proxy is not the order they were sent on a busy machine,
   and a pairing by time swapped two of them once), `input_length` equal to vLLM's usage,
   `output_length` to `max_tokens`, `ceil(input_length / 512)` hash ids, the long prompts' first
   id shared and no other id shared, every line complete and exact, the lines in arrival order.
2. **vLLM's bench** replays the trace through a second, plain tokenmeter with `--request-log`.
   It sends each prompt as token ids and names each request after its line (`x-request-id`,
   `REQUEST_ID_PREFIX` + the line's index), so the request log pairs exactly: one request per
   line, each with the line's output and input lengths, and the totals equal vLLM's.
3. **GuideLLM** replays it through the same tokenmeter: one request per line, and the output
   lengths the trace's (as a multiset: it sends no request id, and a late start can swap the
   first arrivals). Its prompts are text (its token blocks decoded, which vLLM encodes again,
   a token or two shorter), so its input lengths are shown, not checked.

Counts and lengths are exact and checked. Arrival times, recorded and replayed, are shown beside
the trace's: the replays' timing on 2 shared cores is not what is under test.

If tokenmeter's trace comes up short (step 1's checks fail), the replays still run, on the trace
the client writes of the same load (its own send times, vLLM's usage, hash ids computed here as
tokenmeter defines them), so one failure does not hide the others.
"""

import collections
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import threading
import time

import clients
import exact

PHASE = "replay"
BLOCK = 512
N_REQUESTS = 12
SPACING_S = 0.2
SHORT_TOKENS, SHORT_MAX = 600, 16
LONG_TOKENS, LONG_MAX = 1100, 32
# Each prompt this much longer than the one before: no two alike, which pairs lines to requests.
# More than the overshoot of `Prompts.grow` (one word, a few tokens); 11 steps keep the short
# prompts in two blocks (about 800 tokens at most) and the long ones in three (about 1320).
STEP_TOKENS = 20
# More than a block: the long prompts' first block is the same, their second differs.
SHARED_TOKENS = 700
REQUEST_ID_PREFIX = "replay-"

# vLLM's own benchmark client, from its virtualenv (its `vllm` console script fails to start there).
VLLM_BENCH = (
    "import argparse, sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "p = argparse.ArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line "
    "end member law car city community name president team minute idea kid body information back "
    "parent face others level office door health person art war history party result change morning "
    "reason research girl guy moment air teacher force education"
).split()


# === the load ===


class Prompts:
    """Prompts of about a given number of tokens, counted with the model's own tokenizer (the
    one vLLM and tokenmeter's `--tokenizer` read; it adds the BOS token, as vLLM does)."""

    def __init__(self, model_dir, seed):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
        self.rng = random.Random(seed)

    def ids(self, text):
        return self.tok.encode(text).ids

    def grow(self, head, tokens):
        """`head` and then random words: the shortest such text of at least `tokens` tokens."""
        words = [self.rng.choice(WORDS) for _ in range(tokens)]
        lo, hi = 0, len(words)
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self.ids(" ".join([head] + words[:mid]))) >= tokens:
                hi = mid
            else:
                lo = mid + 1
        return " ".join([head] + words[:lo])


def plan(model_dir):
    """The load: short and long prompts in turn, the long ones behind one shared prefix; a new
    run tag each time (nothing here is in vLLM's prefix cache before the load)."""
    tag = os.urandom(4).hex()
    prompts = Prompts(model_dir, tag)
    shared = prompts.grow(f"Shared context {tag}:", SHARED_TOKENS)
    load = []
    for i in range(N_REQUESTS):
        long = i % 2 == 1
        if long:
            text = prompts.grow(f"{shared} Question {i}:", LONG_TOKENS + STEP_TOKENS * i)
        else:
            text = prompts.grow(f"Request {i} {tag}:", SHORT_TOKENS + STEP_TOKENS * i)
        load.append({"i": i, "long": long, "prompt": text, "max_tokens": LONG_MAX if long else SHORT_MAX,
                     "at_s": i * SPACING_S})  # fmt: skip
    return prompts, load


def send(url, model, load):
    """Open loop: each request on its own connection at its time, whatever the others are doing.
    Returns what each client saw (usage, events, [DONE]), its send time from the first's, and how
    long it took."""
    recs = [None] * len(load)
    t0 = time.monotonic() + 0.2

    def one(r):
        time.sleep(max(0.0, t0 + r["at_s"] - time.monotonic()))
        sent = time.monotonic()
        body = {
            "model": model, "prompt": r["prompt"], "max_tokens": r["max_tokens"], "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        }  # fmt: skip
        try:
            rec = clients.sse_stream(url, "/v1/completions", body)
        except Exception as e:  # recorded: the checks fail on it
            rec = {"status": None, "done": False, "usage": None, "error": f"{type(e).__name__}: {e}"}
        rec.pop("text", None)
        rec.update(sent_s=sent - t0, took_s=time.monotonic() - sent)
        recs[r["i"]] = rec

    threads = [threading.Thread(target=one, args=(r,)) for r in load]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs


# === traces ===


def read_lines(path):
    """Every complete line of a JSON-lines file (one being written may end mid-line)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return []
    return [json.loads(l) for l in raw.split(b"\n")[:-1] if l.strip()]


def hash_ids(ids, table):
    """The ids of a prompt's blocks as tokenmeter's design defines them: one per block of `BLOCK`
    tokens (the last may be partial), the same integer wherever the same prefix (every token up
    to the block's end) recurs, numbered in order of first sight."""
    return [table.setdefault(tuple(ids[:end]), len(table)) for end in range(BLOCK, len(ids) + BLOCK, BLOCK)]


def client_trace(prompts, model, load, recs, path):
    """The same load's trace as the client can write it: its send times, vLLM's usage, its own
    durations; the replays' input when the binary writes none."""
    table = {}
    first = min(rec["sent_s"] for rec in recs)
    with open(path, "w") as f:
        for r, rec in sorted(zip(load, recs), key=lambda x: x[1]["sent_s"]):
            usage = rec.get("usage") or {}
            line = {
                "timestamp": round(1000 * (rec["sent_s"] - first)),
                "input_length": usage.get("prompt_tokens"),
                "output_length": usage.get("completion_tokens"),
                "hash_ids": hash_ids(prompts.ids(r["prompt"]), table),
                "duration": round(1000 * rec["took_s"]),
                "model": model,
                "outcome": "complete" if rec.get("done") else "client_disconnect",
                "exact": True,
            }  # fmt: skip
            f.write(json.dumps(line, separators=(",", ":")) + "\n")
    return read_lines(path)


# === the replay clients ===


def vllm_bench(cfg, url, model, trace_path, n, out_dir):
    """vLLM's bench replaying the trace at its timestamps (ms: `--timed-trace-sec-multiplier`
    0.001) in file order; no ready-check request (it would send the first line once more)."""
    result = "replay-vllm-bench.json"
    argv = [
        cfg.vllm_python, "-c", VLLM_BENCH,
        "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--tokenizer", cfg.model,
        "--dataset-name", "timed_trace", "--dataset-path", trace_path,
        "--timed-trace-sec-multiplier", "0.001", "--timed-trace-chunk-hash-size", str(BLOCK),
        "--num-prompts", str(n), "--ready-check-timeout-sec", "0",
        "--request-id-prefix", REQUEST_ID_PREFIX, "--temperature", "0", "--disable-tqdm",
        "--save-result", "--save-detailed", "--result-dir", out_dir, "--result-filename", result,
    ]  # fmt: skip
    _run("vLLM's bench", argv, os.path.join(out_dir, "replay-vllm-bench.log"))
    with open(os.path.join(out_dir, result)) as f:
        return json.load(f)


def guidellm(cfg, url, model, trace_path, out_dir):
    """GuideLLM replaying the trace. It reads timestamps (and `duration`) in seconds: the data's
    `time_scale` 0.001 turns tokenmeter's ms into seconds; without it the second request waits
    200 s (the run looks stalled after its first request). It sorts the trace by timestamp
    itself. `/v1/completions`: the prompt is sent as is, no chat template around it."""
    report = os.path.join(out_dir, "replay-guidellm.json")
    if os.path.exists(report):
        os.remove(report)
    data = {"kind": "mooncake", "source": {"kind": "json_file", "path": trace_path},
            "hash_id_block_size": BLOCK, "time_scale": 0.001}  # fmt: skip
    argv = [
        os.path.join(cfg.clients_bin, "guidellm"), "run",
        "--backend", f"kind=openai_http,target={url},validate_backend=false,model={model},"
                     "request_format=/v1/completions",
        "--profile", "kind=replay",
        "--data", json.dumps(data),
        "--tokenizer", f"kind=hf_auto,model={cfg.model}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    env = {"GUIDELLM__MAX_WORKER_PROCESSES": os.environ.get("E2E_GUIDELLM_WORKERS", "2")}
    _run("GuideLLM", argv, os.path.join(out_dir, "replay-guidellm.log"), env)
    with open(report) as f:
        bench = json.load(f)["benchmarks"][0]
    out = []
    for r in bench["requests"]["successful"]:
        t = r["info"]["timings"]
        out.append({
            "timestamp_s": r["info"]["settings"].get("relative_timestamp"),
            "late_s": (t["request_start"] - t["targeted_start"]) if t.get("request_start") and t.get("targeted_start") else None,
            "output_tokens": (r.get("output_metrics") or {}).get("text_tokens"),
            "input_tokens": (r.get("input_metrics") or {}).get("text_tokens"),
        })  # fmt: skip
    return {"successful": out, "errored": len(bench["requests"]["errored"]),
            "incomplete": len(bench["requests"]["incomplete"])}  # fmt: skip


def _run(what, argv, log, env=None):
    full = dict(os.environ)
    full.update(OFFLINE)
    full.update(env or {})
    with open(log, "wb") as out:
        rc = subprocess.call(argv, env=full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             timeout=600)  # fmt: skip
    if rc != 0:
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode("utf-8", "replace")
        raise RuntimeError(f"{what} exited with {rc}; log {log}:\n{tail}")


# === checks ===


def _arrival(line):
    """When a request-log line's request reached the proxy (unix seconds): it is written at the
    end, `duration_seconds` after the arrival."""
    end = datetime.datetime.fromisoformat(line["time"].replace("Z", "+00:00")).timestamp()
    return end - (line.get("duration_seconds") or 0.0)


def spacing(arrived_ms, trace_ms):
    """How far each arrival is from its line's timestamp, in ms, on a schedule anchored where
    the median arrival sits (a first request sent late then shows as late, not every other one
    as early): the median and the largest, and each."""
    if not arrived_ms or len(arrived_ms) != len(trace_ms):
        return None
    anchor = statistics.median(a - t for a, t in zip(arrived_ms, trace_ms))
    errs = [a - t - anchor for a, t in zip(arrived_ms, trace_ms)]
    return {"median_ms": statistics.median(abs(e) for e in errs), "max_ms": max(abs(e) for e in errs),
            "errors_ms": [round(e) for e in errs]}  # fmt: skip


def _lens(xs):
    """Values and how often each came: `600 x6, 1100 x6`."""
    key = lambda kv: (not isinstance(kv[0], (int, float)), kv[0] if isinstance(kv[0], (int, float)) else 0, str(kv[0]))  # noqa: E731
    return ", ".join(f"{k} x{n}" for k, n in sorted(collections.Counter(xs).items(), key=key)) or "none"


def check_load(checks, name, load, recs):
    """The recorded load itself: every request answered in full, with usage."""
    bad = [r["i"] for r, rec in zip(load, recs)
           if rec.get("status") != 200 or not rec.get("done") or not rec.get("usage")
           or rec["usage"].get("completion_tokens") != r["max_tokens"]]  # fmt: skip
    checks.add(name, "every request of the load ran to [DONE] with its max_tokens, and got usage", not bad,
               f"{len(load) - len(bad)} of {len(load)}; prompt tokens (usage) "
               f"{_lens([(rec.get('usage') or {}).get('prompt_tokens') for rec in recs])}"
               + (f"; failed: {[(i, recs[i].get('status'), recs[i].get('error')) for i in bad]}" if bad else ""))


def check_trace(checks, name, lines, load, recs, model):
    """Step 1: the trace tokenmeter wrote, against what the load sent and vLLM reported."""
    n = len(load)
    checks.equal(name, "the workload log has one line per request", workload_log=len(lines), requests=n)
    # Paired by prompt length: each request's usage is its own (STEP_TOKENS apart).
    usage = [(rec.get("usage") or {}).get("prompt_tokens") for rec in recs]
    distinct = None not in usage and len(set(usage)) == n
    checks.add(name, "the load's prompt lengths (usage) are all different, which pairs each line to its request",
               distinct, f"prompt tokens {_lens(usage)}")  # fmt: skip
    by_len = {u: i for i, u in enumerate(usage)}
    tl = [None] * n
    unpaired = []
    for l in lines:
        i = by_len.get(l.get("input_length"))
        if i is None or tl[i] is not None:
            unpaired.append(l.get("input_length"))
        else:
            tl[i] = l
    missing = [i for i in range(n) if tl[i] is None]
    checks.add(name, "each line's input_length is vLLM's prompt tokens for that request (usage)",
               distinct and not unpaired and not missing,
               f"{n - len(missing)} of {n} requests have a line of their length; input_length "
               f"{_lens([l.get('input_length') for l in lines])}"
               + (f"; lines of no request's length: {unpaired}" if unpaired else "")
               + (f"; requests without a line (request, usage): {[(i, usage[i]) for i in missing]}" if missing else ""))  # fmt: skip
    pairs = [(r, rec, l) for r, rec, l in zip(load, recs, tl) if l is not None]
    tl = [l for l in tl if l is not None]
    bad_out = [(r["i"], l.get("output_length"), r["max_tokens"]) for r, _, l in pairs
               if l.get("output_length") != r["max_tokens"]]  # fmt: skip
    checks.add(name, "each line's output_length is the request's max_tokens", len(tl) == n and not bad_out,
               f"{len(tl) - len(bad_out)} of {n} equal; output_length {_lens([l.get('output_length') for l in tl])}"
               + (f"; differ (request, line, max_tokens): {bad_out}" if bad_out else ""))
    stamps = [l.get("timestamp", -1) for l in lines]
    checks.add(name, "the lines are in arrival order, the first at timestamp 0",
               bool(stamps) and stamps == sorted(stamps) and stamps[0] == 0, f"timestamps (ms) {stamps}")
    bad_h = [(r["i"], l.get("input_length"), len(l.get("hash_ids") or [])) for r, _, l in pairs
             if not isinstance(l.get("input_length"), int)
             or len(l.get("hash_ids") or []) != math.ceil(l["input_length"] / BLOCK)]  # fmt: skip
    checks.add(name, f"each line has ceil(input_length / {BLOCK}) hash ids", len(tl) == n and not bad_h,
               f"{len(tl) - len(bad_h)} of {n}; hash ids per line {_lens([len(l.get('hash_ids') or []) for l in tl])}"
               + (f"; wrong (request, input_length, ids): {bad_h}" if bad_h else ""))
    longs = [l for r, _, l in pairs if r["long"]]
    firsts = {(l.get("hash_ids") or [None])[0] for l in longs}
    seen = collections.Counter(h for l in tl for h in (l.get("hash_ids") or []))
    shared = {h: c for h, c in seen.items() if c > 1}
    ok = len(firsts) == 1 and None not in firsts and shared == {next(iter(firsts)): len(longs)}
    checks.add(name, "the long prompts share their first hash id, and no other id recurs", ok,
               f"first ids of the {len(longs)} long prompts {sorted(firsts, key=str)}; ids seen more than once "
               f"{shared or 'none'} ({len(seen)} distinct ids)")
    bad_o = [(l.get("outcome"), l.get("exact"), l.get("model")) for l in tl
             if l.get("outcome") != "complete" or l.get("exact") is not True or l.get("model") != model]  # fmt: skip
    checks.add(name, "every line is complete, exact, with the model", len(tl) == n and not bad_o,
               f"{len(tl) - len(bad_o)} of {n}" + (f"; otherwise: {bad_o}" if bad_o else ""))
    sent = [1000 * rec["sent_s"] for rec in recs]
    return spacing([l.get("timestamp") for l in tl], sent) if len(tl) == n else None


def _replayed(br, proxy):
    return [l for l in br.lines[proxy.name] if l.get("method") == "POST"]


def _totals(checks, name, br, proxy, lines, trace, inputs):
    v, t = br.delta["vllm"], br.delta[proxy.name]
    checks.equal(name, "output tokens exact", vllm=v.value("vllm:generation_tokens_total"),
                 tokenmeter=t.value("tokenmeter_output_tokens_total"),
                 request_log=sum(l.get("output_tokens") or 0 for l in lines),
                 trace=sum(l["output_length"] for l in trace))  # fmt: skip
    if inputs:
        checks.equal(name, "input tokens exact", vllm=v.value("vllm:prompt_tokens_total"),
                     tokenmeter=t.value("tokenmeter_input_tokens_total"),
                     request_log=sum(l.get("input_tokens") or 0 for l in lines),
                     trace=sum(l["input_length"] for l in trace))  # fmt: skip
    return {
        "vllm_out": v.value("vllm:generation_tokens_total"), "vllm_in": v.value("vllm:prompt_tokens_total"),
        "tm_out": t.value("tokenmeter_output_tokens_total"), "tm_in": t.value("tokenmeter_input_tokens_total"),
        "prefix_hits": v.value("vllm:prefix_cache_hits_total"),
    }  # fmt: skip


def check_bench(checks, name, br, proxy, trace, bench):
    """Step 2: vLLM's bench, paired line by line through the request ids it sends."""
    n = len(trace)
    lines = _replayed(br, proxy)
    outcomes = collections.Counter(l.get("outcome") for l in lines)
    checks.add(name, "one request per trace line, each complete (the request log and the bench's own count)",
               len(lines) == n and outcomes == {"complete": n} and bench.get("completed") == n
               and not bench.get("failed"),
               f"request log {len(lines)} ({dict(outcomes)}), the bench completed {bench.get('completed')} "
               f"(failed {bench.get('failed')}), trace {n} lines")  # fmt: skip
    by_line = {}
    for l in lines:
        rid = l.get("request_id") or ""
        if rid.startswith(REQUEST_ID_PREFIX) and rid[len(REQUEST_ID_PREFIX):].isdigit():
            by_line[int(rid[len(REQUEST_ID_PREFIX):])] = l
    bad_out = [(k, tl["output_length"], (by_line.get(k) or {}).get("output_tokens")) for k, tl in enumerate(trace)
               if (by_line.get(k) or {}).get("output_tokens") != tl["output_length"]]  # fmt: skip
    checks.add(name, "each replayed request's output tokens equal its line's output_length", not bad_out,
               f"{n - len(bad_out)} of {n} lines (paired by request id); output {_lens([l.get('output_tokens') for l in lines])}"
               + (f"; differ (line, trace, replayed): {bad_out}" if bad_out else ""))
    bad_in = [(k, tl["input_length"], (by_line.get(k) or {}).get("input_tokens")) for k, tl in enumerate(trace)
              if (by_line.get(k) or {}).get("input_tokens") != tl["input_length"]]  # fmt: skip
    checks.add(name, "each replayed request's input tokens equal its line's input_length (sent as token ids)",
               not bad_in,
               f"{n - len(bad_in)} of {n} lines; input {_lens([l.get('input_tokens') for l in lines])}"
               + (f"; differ (line, trace, replayed): {bad_in}" if bad_in else ""))
    row = _totals(checks, name, br, proxy, lines, trace, inputs=True)
    row.update(requests=len(lines), client_completed=bench.get("completed"))
    if len(by_line) == n:
        row["spacing"] = spacing([1000 * _arrival(by_line[k]) for k in range(n)], [tl["timestamp"] for tl in trace])
    return row


def check_guidellm(checks, name, br, proxy, trace, g):
    """Step 3: GuideLLM, whose requests carry no id: counts, and output lengths as a multiset."""
    n = len(trace)
    lines = _replayed(br, proxy)
    outcomes = collections.Counter(l.get("outcome") for l in lines)
    ok = g["successful"]
    checks.add(name, "one request per trace line, each complete (the request log)",
               len(lines) == n and outcomes == {"complete": n},
               f"request log {len(lines)} ({dict(outcomes)}), trace {n} lines; GuideLLM's own report: "
               f"{len(ok)} successful, {g['incomplete']} incomplete, {g['errored']} errored (shown: GuideLLM 0.8.1 "
               "can end its run before it has read the last request's completion, and then leaves it out)")  # fmt: skip
    got = sorted(l.get("output_tokens") or 0 for l in lines)
    want = sorted(tl["output_length"] for tl in trace)
    checks.add(name, "the replayed requests' output tokens are the trace's output lengths", got == want,
               f"replayed {_lens(got)}; trace {_lens(want)}")
    row = _totals(checks, name, br, proxy, lines, trace, inputs=False)
    # Its text prompts, encoded again by vLLM: shown against the trace.
    ins = sorted(l.get("input_tokens") or 0 for l in lines)
    row.update(requests=len(lines), client_completed=len(ok), inputs=_lens(ins),
               input_diff=[a - b for a, b in zip(ins, sorted(tl["input_length"] for tl in trace))])  # fmt: skip
    if len(lines) == n:
        row["spacing"] = spacing(sorted(1000 * _arrival(l) for l in lines), sorted(tl["timestamp"] for tl in trace))
    late = [r["late_s"] for r in ok if r["late_s"] is not None]
    row["client_late_ms"] = (1000 * statistics.median(late), 1000 * max(late)) if late else None
    return row


# === the phase ===


def phase(cfg, checks, urls, stack, model, bounds, capacity_class, settle):
    """Records the load through a tokenmeter with `--workload-log`, checks the trace, replays it
    with vLLM's bench and GuideLLM through a second tokenmeter; returns the report's figures."""
    started = time.monotonic()
    out = {"requests": N_REQUESTS, "spacing_ms": 1000 * SPACING_S, "block": BLOCK,
           "short": (SHORT_TOKENS, SHORT_MAX), "long": (LONG_TOKENS, LONG_MAX), "shared": SHARED_TOKENS,
           "step": STEP_TOKENS}  # fmt: skip
    wl_path = os.path.join(cfg.out_dir, "workload.jsonl")
    if os.path.exists(wl_path):
        os.remove(wl_path)
    extra = ["--tokenizer", cfg.model, "--workload-log", wl_path]

    recorder = exact.Proxy(cfg, stack, urls["vllm"], "record", bounds, capacity_class, extra, phase=PHASE)
    prompts, load = plan(cfg.model)
    name = f"{PHASE}: record"
    with exact.Bracket(name, urls["vllm_metrics"], [recorder], cfg.out_dir, settle) as br:
        recs = send(recorder.url, model, load)
    with open(os.path.join(cfg.out_dir, "clients-replay-record.json"), "w") as f:
        json.dump(recs, f, indent=1)
    check_load(checks, name, load, recs)
    client_path = os.path.join(cfg.out_dir, "workload-client.jsonl")
    client_trace(prompts, model, load, recs, client_path)
    v, t = br.delta["vllm"], br.delta[recorder.name]
    out["record"] = {"prefix_hits": v.value("vllm:prefix_cache_hits_total"),
                     "vllm_out": v.value("vllm:generation_tokens_total"), "vllm_in": v.value("vllm:prompt_tokens_total"),
                     "tm_out": t.value("tokenmeter_output_tokens_total"), "tm_in": t.value("tokenmeter_input_tokens_total"),
                     "prompt_tokens": _lens([(r.get("usage") or {}).get("prompt_tokens") for r in recs])}  # fmt: skip
    # The writer holds lines 30 s to put them in arrival order; a clean stop writes them all
    # after the drain.
    recorder.server.stop()
    lines = read_lines(wl_path)
    out["record"]["spacing"] = check_trace(checks, name, lines, load, recs, model)
    trace_path, out["trace"] = wl_path, "tokenmeter's --workload-log"
    if len(lines) != len(load):
        # Failed above; the replays still run, on a trace with a line per request.
        trace_path = client_path
        out["trace"] = f"the client's (tokenmeter's workload log had {len(lines)} lines for {len(load)} requests)"
    stack.remove(recorder.server)
    trace = read_lines(trace_path)
    out["trace_lines"] = len(trace)

    plain = exact.Proxy(cfg, stack, urls["vllm"], "replay", bounds, capacity_class, [], phase=PHASE)
    name = f"{PHASE}: vLLM bench"
    t0 = time.monotonic()
    with exact.Bracket(name, urls["vllm_metrics"], [plain], cfg.out_dir, settle) as br:
        bench = vllm_bench(cfg, plain.url, model, trace_path, len(trace), cfg.out_dir)
    out["bench"] = check_bench(checks, name, br, plain, trace, bench)
    out["bench"]["seconds"] = time.monotonic() - t0

    name = f"{PHASE}: GuideLLM"
    t0 = time.monotonic()
    with exact.Bracket(name, urls["vllm_metrics"], [plain], cfg.out_dir, settle) as br:
        g = guidellm(cfg, plain.url, model, trace_path, cfg.out_dir)
    out["guidellm"] = check_guidellm(checks, name, br, plain, trace, g)
    out["guidellm"]["seconds"] = time.monotonic() - t0

    plain.server.stop()
    stack.remove(plain.server)
    out["seconds"] = time.monotonic() - started
    print(f"[e2e] replay phase took {out['seconds']:.0f} s", flush=True)
    return out
