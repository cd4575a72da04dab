"""Exact token counts where a stream's events carry several tokens: speculative decoding.

A third vLLM, of the main model, runs with n-gram speculative decoding (`SPEC_VLLM_ARGS`),
started and stopped here. A repetitive prompt at
temperature 0 makes the tiny model loop, vLLM accepts the n-gram drafts, and one SSE event
carries up to `STEP_TOKENS` tokens: counting events undercounts. Two tokenmeters stand in front
of that vLLM, started here:

- `default`: the product's default flags (and `--request-log`). It asks the upstream for usage
  on the client's behalf and strips it again (`--inject-usage`, `auto` by default once the
  upstream is known to be vLLM), so every completed request is exact with no client asking.
- `tokenizer`: the same, with `--tokenizer MODEL_DIR`: prompts are counted at admission and a
  request that ends without usage (a client that left) is counted from its text.

Four sub-phases, each bracketed by scrapes of vLLM and both tokenmeters:

1. completed, through `default`: completions and chat, with and without
   `stream_options.include_usage`, `MAX_TOKENS` tokens each (`ignore_eos`, temperature 0).
   Every request's output in the request log is exactly `MAX_TOKENS`, tokenmeter's totals equal
   vLLM's, the client that did not ask got no usage chunk, and speculative decoding happened
   (vLLM's `spec_decode` counters moved, every stream had fewer events than tokens).
2. completed, through `tokenizer`: the same mix; also the tokenizer's own checks against usage
   and the tokens-per-event histogram with exact per-event counts (mean above 1).
3. left mid-stream, through `default`: `N_ABORTED` clients close after `ABORT_AFTER_BYTES`.
   Without a tokenizer such a request has no usage and is counted by its events: shown, with
   the one ordering that must hold (no more than vLLM generated).
4. left mid-stream, through `tokenizer`: prompts exact against vLLM, aborted ones included;
   output within one engine step (`STEP_TOKENS`) per request of what vLLM generated.
"""

import json
import os
import threading
import time

import clients
import procs
import prom

# n-gram speculative decoding: up to 4 drafted tokens a step, looked up from 2-4-token n-grams of
# the prompt and output so far. On a server of its own: on the main server it also drafted for
# the capacity ramp (`tokenmeter bench` asks for temperature 0, the model loops, every draft was
# accepted), whose fit of one token per sequence per step it then no longer described, and it
# slowed the engine by a fifth to a third where it drafted nothing (README). Eager: no
# torch.compile at start, ready in 30-45 s instead of 55-90 s here.
SPEC_CONFIG = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
SPEC_VLLM_ARGS = ["--enforce-eager", "--speculative-config", json.dumps(SPEC_CONFIG)]
# The most tokens one engine step gives one request: the drafts, all accepted, plus its own.
STEP_TOKENS = SPEC_CONFIG["num_speculative_tokens"] + 1

MAX_TOKENS = 200
# Each (endpoint, asks for usage) case this many times, one request after another.
REPEAT = 2
CASES = [("completions", True), ("completions", False), ("chat", True), ("chat", False)]
N_ABORTED = 5
ABORT_AFTER_BYTES = 1536

PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _prompt(i):
    # A new prefix each request (vLLM's prefix cache would answer a repeat differently), then a
    # loop the tiny model continues and the n-gram drafts predict.
    return f"Request {i} {os.urandom(6).hex()}: " + "one two three four five. " * 20


def _body(endpoint, model, i, usage):
    body = {"model": model, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": _prompt(i)}]
    else:
        body["prompt"] = _prompt(i)
    if usage:
        body["stream_options"] = {"include_usage": True}
    return body


class Proxy:
    """A tokenmeter in front of the phase's vLLM, with its own request log (files named after
    `phase` and `name`: another phase starts its proxies with this too)."""

    def __init__(self, cfg, stack, vllm_url, name, bounds, capacity_class, extra, phase="exact"):
        pport, mport = procs.free_port(), procs.free_port()
        self.name = name
        self.log_path = os.path.join(cfg.out_dir, f"requests-{phase}-{name}.jsonl")
        if os.path.exists(self.log_path):
            os.remove(self.log_path)
        self.server = procs.start_tokenmeter(
            cfg.tokenmeter, vllm_url, pport, mport,
            os.path.join(cfg.out_dir, f"tokenmeter-{phase}-{name}.log"), bounds["ttft"], bounds["tps"],
            capacity_class, request_log=self.log_path, extra=extra,
        )  # fmt: skip
        stack.append(self.server)
        self.url = f"http://127.0.0.1:{pport}"
        self.metrics = f"http://127.0.0.1:{mport}/metrics"
        procs.wait_engine_read(self.metrics)

    def lines(self):
        try:
            with open(self.log_path, "rb") as f:
                return [json.loads(l) for l in f.read().splitlines() if l.strip()]
        except FileNotFoundError:
            return []


class Bracket:
    """Scrapes of vLLM and every proxy before and after a sub-phase (kept as evidence), and the
    request-log lines the proxies wrote in between."""

    def __init__(self, name, vllm_metrics, proxies, out_dir, settle):
        self.name = name
        self.vllm_metrics = vllm_metrics
        self.proxies = proxies
        self.settle = settle
        slug = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
        self.prefix = os.path.join(out_dir, "metrics", slug)
        os.makedirs(os.path.dirname(self.prefix), exist_ok=True)

    def _snap(self, when):
        out = {}
        for who, url in [("vllm", self.vllm_metrics)] + [(p.name, p.metrics) for p in self.proxies]:
            text = prom.fetch(url)
            with open(f"{self.prefix}-{who}-{when}.txt", "w") as f:
                f.write(text)
            out[who] = prom.parse(text)
        return out

    def _settle(self):
        for p in self.proxies:
            self.settle(self.vllm_metrics, p.metrics)

    def __enter__(self):
        self._settle()
        self.before = self._snap("before")
        self.logged = {p.name: len(p.lines()) for p in self.proxies}
        return self

    def __exit__(self, *exc):
        if exc[0] is None:
            self._settle()
            # The request log is written off the request's path: give its writer a moment.
            time.sleep(0.3)
        after = self._snap("after")
        self.delta = {k: prom.Delta(self.before[k], after[k]) for k in after}
        self.lines = {p.name: p.lines()[self.logged[p.name]:] for p in self.proxies}
        return False


def _num(v):
    if v is None:
        return "n/a"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _run_completed(proxy, model):
    recs = []
    i = 0
    for _ in range(REPEAT):
        for endpoint, usage in CASES:
            r = clients.sse_stream(proxy.url, PATHS[endpoint], _body(endpoint, model, i, usage))
            r.update(endpoint=endpoint, asked_usage=usage)
            recs.append(r)
            i += 1
    return recs


def _run_aborted(proxy, model):
    """`N_ABORTED` clients at once, endpoints and usage mixed, each leaving after
    `ABORT_AFTER_BYTES` of the stream."""
    recs = [None] * N_ABORTED

    def one(k):
        endpoint, usage = CASES[k % len(CASES)]
        r = clients.sse_stream(proxy.url, PATHS[endpoint], _body(endpoint, model, 100 + k, usage),
                               close_after=ABORT_AFTER_BYTES)
        r.update(endpoint=endpoint, asked_usage=usage)
        recs[k] = r

    threads = [threading.Thread(target=one, args=(k,)) for k in range(N_ABORTED)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs


def _keep(cfg, name, recs):
    """What each client received, for the record (the text is the model's loop, no secret)."""
    slug = "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")
    with open(os.path.join(cfg.out_dir, f"clients-{slug}.json"), "w") as f:
        json.dump(recs, f, indent=1)


def _spec(vd):
    """vLLM's speculative-decoding counters over a sub-phase."""
    return {
        "drafts": vd.value("vllm:spec_decode_num_drafts_total"),
        "draft_tokens": vd.value("vllm:spec_decode_num_draft_tokens_total"),
        "accepted": vd.value("vllm:spec_decode_num_accepted_tokens_total"),
    }


def completed(checks, phase, br, proxy, recs):
    """The checks of a sub-phase whose requests all ran to the end."""
    v, t = br.delta["vllm"], br.delta[proxy.name]
    lines = br.lines[proxy.name]
    n = len(recs)
    want = n * MAX_TOKENS
    bad = [r for r in recs if r["status"] != 200 or not r["done"]]
    checks.add(phase, "every stream ran to [DONE]", not bad, f"{n - len(bad)} of {n}")
    outs = [l.get("output_tokens") for l in lines]
    checks.add(
        phase,
        f"the request log has one line per request, complete, each with exactly {MAX_TOKENS} output tokens",
        len(lines) == n and all(l.get("outcome") == "complete" for l in lines)
        and all(o == MAX_TOKENS for o in outs),
        f"{len(lines)} lines for {n} requests; outcomes {sorted({l.get('outcome') for l in lines})}; "
        f"output_tokens {sorted(set(outs))}; token_source {sorted({l.get('token_source') for l in lines})}",
    )
    checks.equal(phase, "output tokens exact",
              vllm=v.value("vllm:generation_tokens_total"),
              tokenmeter=t.value("tokenmeter_output_tokens_total"),
              request_log=sum(o or 0 for o in outs), asked=want)
    checks.equal(phase, "input tokens exact",
              vllm=v.value("vllm:prompt_tokens_total"),
              tokenmeter=t.value("tokenmeter_input_tokens_total"),
              request_log=sum(l.get("input_tokens") or 0 for l in lines))
    asked = [r for r in recs if r["asked_usage"]]
    plain = [r for r in recs if not r["asked_usage"]]
    checks.add(
        phase,
        "the clients that asked for usage got it, the others saw no usage chunk",
        all(r["usage"] and r["usage"].get("completion_tokens") == MAX_TOKENS for r in asked)
        and all(r["usage"] is None for r in plain),
        f"{sum(1 for r in asked if r['usage'])} of {len(asked)} asked and got it; "
        f"{sum(1 for r in plain if r['usage'])} of {len(plain)} that did not ask got one",
    )
    sources = t.by_label("tokenmeter_token_count_source_total", "source")
    checks.equal(phase, "every request counted from usage (asked for it where the client did not)",
              usage=sources.get("usage", 0), requests=n)
    # Speculative decoding happened: drafts accepted, and fewer events than tokens in every stream.
    sp = _spec(v)
    events = [r["events"] for r in recs]
    checks.add(
        phase,
        "speculative decoding: vLLM accepted drafted tokens",
        sp["accepted"] > 0,
        f"{_num(sp['accepted'])} of {_num(sp['draft_tokens'])} drafted tokens accepted "
        f"({_num(sp['drafts'])} drafts)",
    )
    checks.add(
        phase,
        "speculative decoding: every stream carried fewer events than tokens",
        all(e < MAX_TOKENS for e in events),
        f"{sum(events)} events for {want} tokens; per stream {min(events)}-{max(events)}",
    )
    hist = t.histogram("tokenmeter_tokens_per_event")
    checks.equal(phase, "tokenmeter saw every event the clients saw",
              tokenmeter=hist.count, clients=sum(events))
    return {
        "requests": n,
        "vllm_out": v.value("vllm:generation_tokens_total"),
        "tm_out": t.value("tokenmeter_output_tokens_total"),
        "vllm_in": v.value("vllm:prompt_tokens_total"),
        "tm_in": t.value("tokenmeter_input_tokens_total"),
        "events": sum(events),
        "tokens": want,
        "spec": sp,
        "per_event": (hist.count, hist.sum),
        "sources": sources,
    }


def aborted(checks, phase, br, proxy, recs, tokenizer):
    """The checks of a sub-phase whose clients all left mid-stream."""
    v, t = br.delta["vllm"], br.delta[proxy.name]
    lines = br.lines[proxy.name]
    left = [r for r in recs if r["left"] and not r["done"]]
    outcomes = t.by_label("tokenmeter_requests_total", "outcome")
    v_done = sum(v.by_label("vllm:request_success_total", "finished_reason").values())
    checks.add(
        phase,
        "every client left mid-stream, and both servers saw it leave",
        len(left) == N_ABORTED and outcomes.get("client_disconnect", 0) == N_ABORTED
        and len(outcomes) == 1 and v_done == 0,
        f"{len(left)} of {N_ABORTED} left after {min(r['bytes'] for r in recs)}-"
        f"{max(r['bytes'] for r in recs)} bytes; tokenmeter outcomes {outcomes}; vLLM completed {_num(v_done)}",
    )
    v_out, t_out = v.value("vllm:generation_tokens_total"), t.value("tokenmeter_output_tokens_total")
    v_in, t_in = v.value("vllm:prompt_tokens_total"), t.value("tokenmeter_input_tokens_total")
    sources = t.by_label("tokenmeter_token_count_source_total", "source")
    row = {"requests": N_ABORTED, "vllm_out": v_out, "tm_out": t_out, "vllm_in": v_in, "tm_in": t_in,
           "events": sum(r["events"] for r in recs), "sources": sources, "spec": _spec(v),
           "client_bytes": [r["bytes"] for r in recs]}
    if not tokenizer:
        # Counted by events: never more than vLLM generated.
        checks.add(phase, "output counted by events, at most what vLLM generated", t_out <= v_out,
                f"tokenmeter {_num(t_out)} <= vLLM {_num(v_out)} (input tokenmeter {_num(t_in)}, vLLM {_num(v_in)}); "
                f"sources {sources}")
        return row
    checks.equal(phase, "input tokens exact, the requests that left included",
              vllm=v_in, tokenmeter=t_in, request_log=sum(l.get("input_tokens") or 0 for l in lines))
    slack = STEP_TOKENS * N_ABORTED
    checks.add(
        phase,
        f"output tokens within one engine step ({STEP_TOKENS}) per request of vLLM's",
        v_out - slack <= t_out <= v_out,
        f"vLLM {_num(v_out)} - {slack} <= tokenmeter {_num(t_out)} <= vLLM (difference {_num(v_out - t_out)})",
    )
    checks.equal(phase, "the requests that left were counted by the tokenizer",
              tokenizer=sources.get("tokenizer", 0), requests=N_ABORTED)
    return row


def tokenizer_checks(checks, phase, br, proxy, n_usage):
    """The tokenizer's own account where usage came: input counts equal to usage, none differ."""
    t = br.delta[proxy.name]
    name = "tokenmeter_tokenizer_checks_total"
    got = {f"{d} {r}": t.value(name, direction=d, result=r)
           for d in ("input", "output") for r in ("equal", "differs")}
    checks.add(
        phase,
        "the tokenizer's prompt count equals usage for every request that reported it",
        got["input equal"] == n_usage and got["input differs"] == 0,
        f"input equal {_num(got['input equal'])} of {n_usage}, differs {_num(got['input differs'])}; "
        f"output equal {_num(got['output equal'])}, differs {_num(got['output differs'])}",
    )
    return got


def serve(cfg, stack, model_dir, model, bounds):
    """The phase's own vLLM, with speculative decoding, warmed up (its first drafted step pays
    a one-off cost of seconds) straight, not through a proxy."""
    port = procs.free_port()
    vllm = procs.start_vllm(
        cfg.vllm_python, model_dir, model, port, os.path.join(cfg.out_dir, "vllm-spec.log"),
        bounds["ttft"], bounds["itl"], extra=SPEC_VLLM_ARGS,
    )  # fmt: skip
    stack.append(vllm)
    print(f"[e2e] vLLM ({model}, speculative decoding) ready in {vllm.ready_after:.0f} s on port {port}", flush=True)
    url = f"http://127.0.0.1:{port}"
    for endpoint in ("completions", "chat"):
        clients.sse_stream(url, PATHS[endpoint], _body(endpoint, model, -1, False))
    return vllm, {"vllm": url, "vllm_metrics": url + "/metrics"}


def phase(cfg, checks, model_dir, model, bounds, capacity_class, stack, settle):
    """Starts the phase's vLLM, runs the four sub-phases, stops it; returns the figures for the
    report."""
    started = time.monotonic()
    vllm, vllm_urls = serve(cfg, stack, model_dir, model, bounds)
    default = Proxy(cfg, stack, vllm_urls["vllm"], "default", bounds, capacity_class, [])
    tok = Proxy(cfg, stack, vllm_urls["vllm"], "tokenizer", bounds, capacity_class, ["--tokenizer", model_dir])
    proxies = [default, tok]
    out = {"max_tokens": MAX_TOKENS, "aborted_after": ABORT_AFTER_BYTES,
           "spec_config": SPEC_CONFIG}

    name = "exact: default flags"
    with Bracket(name, vllm_urls["vllm_metrics"], proxies, cfg.out_dir, settle) as br:
        recs = _run_completed(default, model)
    _keep(cfg, name, recs)
    out["default"] = completed(checks, name, br, default, recs)

    name = "exact: tokenizer"
    with Bracket(name, vllm_urls["vllm_metrics"], proxies, cfg.out_dir, settle) as br:
        recs = _run_completed(tok, model)
    _keep(cfg, name, recs)
    row = completed(checks, name, br, tok, recs)
    row["checks"] = tokenizer_checks(checks, name, br, tok, len(recs))
    # Each event's tokens, with a tokenizer: those whose text ended in it. They add up to the
    # tokenizer's count of the answer, which may differ from usage by a few percent where
    # re-encoding picks another split than the model sampled (then counted in `output differs`).
    count, total = row["per_event"]
    slack = 0 if row["checks"]["output differs"] == 0 else 0.05 * row["tm_out"]
    checks.add(name, "tokens per event: more than one on average, and they add up to the output",
               count > 0 and total / count > 1 and abs(total - row["tm_out"]) <= slack,
               f"{_num(total)} tokens in {_num(count)} events, mean {total / count if count else 0:.2f}; "
               f"output total {_num(row['tm_out'])}"
               + (f" (the answer's re-encoding differed from usage for {_num(row['checks']['output differs'])}"
                  " requests: within 5%)" if slack else ""))
    out["tokenizer"] = row

    name = "exact: left mid-stream, default flags"
    with Bracket(name, vllm_urls["vllm_metrics"], proxies, cfg.out_dir, settle) as br:
        recs = _run_aborted(default, model)
    _keep(cfg, name, recs)
    out["aborted_default"] = aborted(checks, name, br, default, recs, False)

    name = "exact: left mid-stream, tokenizer"
    with Bracket(name, vllm_urls["vllm_metrics"], proxies, cfg.out_dir, settle) as br:
        recs = _run_aborted(tok, model)
    _keep(cfg, name, recs)
    out["aborted_tokenizer"] = aborted(checks, name, br, tok, recs, True)

    for server in (default.server, tok.server, vllm):
        server.stop()
        stack.remove(server)
    out["ready_s"] = vllm.ready_after
    out["seconds"] = time.monotonic() - started
    print(f"[e2e] exact phase took {out['seconds']:.0f} s", flush=True)
    return out
