"""The real clients of the real-server check: GuideLLM, the `openai` SDK and `curl -N`.

Each returns what the client itself saw, request by request, so the report can set the client's
view beside the server's and the proxy's. Nothing here reads tokenmeter's or vLLM's metrics.
Prompts always differ from one request to the next: vLLM's prefix cache answers a repeated
prompt differently (it held a whole response back until the end in our trials), which is not
the behaviour under test.
"""

import json
import os
import statistics
import subprocess
import threading
import time
import urllib.request
import uuid

from bands import client_mean
from prom import parse, gauge

# === GuideLLM ===


class GuideRun:
    """One GuideLLM benchmark: its requests, as GuideLLM recorded them, and its own summary."""

    def __init__(self, report_path):
        with open(report_path) as f:
            bench = json.load(f)["benchmarks"][0]
        self.duration = bench["duration"]
        self.requests = []
        for status in ("successful", "incomplete", "errored"):
            for r in bench["requests"][status]:
                t = r["info"]["timings"]
                first = t.get("first_token_iteration")
                start = t.get("request_start")
                last = t.get("last_token_iteration")
                out = r.get("output_tokens")
                self.requests.append(
                    {
                        "status": status,
                        "start": start,
                        # Cancelled requests have no request_end; resolve_end is when it let go.
                        "end": t.get("request_end") or t.get("resolve_end"),
                        "first": first,
                        "last": last,
                        # Decode speed as tokenmeter defines it, for every request with one.
                        "tps": (out - 1) / (last - first) if out and out >= 2 and first and last and last > first else None,
                        # Any response byte seen: the request certainly reached the server.
                        "answered": t.get("first_request_iteration") is not None,
                        "ttft_s": (first - start) if first and start else None,
                        "itl_ms": r.get("inter_token_latency_ms"),
                        "output_tokens": r.get("output_tokens"),
                        "prompt_tokens": r.get("prompt_tokens"),
                    }
                )
        # Requests its scheduler still had in process when the run was cut: GuideLLM 0.8.1
        # sometimes leaves these out of its `incomplete` list (a CI run on 2026-12-05 listed 0
        # incomplete with 16 in process), though it cancelled them and the servers saw them go.
        state = bench["scheduler_state"] if isinstance(bench.get("scheduler_state"), dict) else {}
        self.in_process_at_cut = int(state.get("processing_requests") or 0)
        m = bench["metrics"]
        self.reported_ttft_ms = m["time_to_first_token_ms"]["successful"]
        self.reported_itl_ms = m["inter_token_latency_ms"]["successful"]

    def where(self, status):
        return [r for r in self.requests if r["status"] == status]

    def bands(self, band_of):
        """The concurrency band of each request's decode, from the client's own timeline: the
        time-weighted mean number of its requests in flight between that request's first and
        last token (tokenmeter's definition, measured at the other end of the wire)."""
        out = {}
        for r in self.requests:
            if r["tps"] is None:
                continue
            mean = client_mean(self.requests, r["first"], r["last"])
            band = band_of(max(mean, 1.0))
            out[band] = out.get(band, 0) + 1
        return out


def guidellm(bin_dir, target, model_name, tokenizer_dir, streams, seconds, prompt_tokens,
             output_tokens, out_dir, label):
    """Streams chat completions at a fixed concurrency for a fixed time; returns a GuideRun."""
    report = os.path.join(out_dir, f"guidellm-{label}.json")
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            # GuideLLM starts 10 worker processes by default, far too many beside vLLM and the
            # proxy on 2 cores; with one, it let concurrency 16 sag between waves of requests.
            "GUIDELLM__MAX_WORKER_PROCESSES": os.environ.get("E2E_GUIDELLM_WORKERS", "2"),
        }
    )
    argv = [
        os.path.join(bin_dir, "guidellm"), "run",
        "--backend", f"kind=openai_http,target={target},validate_backend=false,model={model_name}",
        "--profile", f"kind=concurrent,streams={streams}",
        "--constraint", f"kind=max_duration,seconds={seconds}",
        "--data", f"kind=synthetic_text,prompt_tokens={prompt_tokens},output_tokens={output_tokens}",
        "--tokenizer", f"kind=hf_auto,model={tokenizer_dir}",
        "--output", f"kind=json,path={report}",
        "--disable-console-interactive",
    ]  # fmt: skip
    log = os.path.join(out_dir, f"guidellm-{label}.log")
    with open(log, "wb") as out:
        rc = subprocess.call(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    if rc != 0 or not os.path.exists(report):
        with open(log, "rb") as f:
            tail = f.read()[-3000:].decode("utf-8", "replace")
        raise RuntimeError(f"guidellm exited with {rc}; log {log}:\n{tail}")
    return GuideRun(report)


# === openai SDK ===


def _nonce():
    return uuid.uuid4().hex[:12]


def _prompt(i):
    return f"Request {i} {_nonce()}: tell me about the quick brown fox and the lazy dog."


def sdk_requests(base_url, model, endpoint, mode, n, max_tokens):
    """`n` requests with the `openai` SDK. endpoint: chat | completions. mode: usage (stream
    with include_usage), plain (stream without it), token_ids (stream, vLLM's return_token_ids,
    no usage), or json (not streamed). `ignore_eos` makes each produce exactly max_tokens.
    Returns one dict per request: content-bearing events seen and the usage reported, if any."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    out = []
    for i in range(n):
        extra = {"ignore_eos": True}
        kwargs = {"model": model, "max_tokens": max_tokens}
        if mode != "json":
            kwargs["stream"] = True
        if mode == "usage":
            kwargs["stream_options"] = {"include_usage": True}
        if mode == "token_ids":
            extra["return_token_ids"] = True
        kwargs["extra_body"] = extra
        rec = {"events": 0, "usage_out": None, "usage_in": None, "ttft_s": None}
        t0 = time.perf_counter()
        if endpoint == "chat":
            resp = client.chat.completions.create(
                messages=[{"role": "user", "content": _prompt(i)}], **kwargs
            )
        else:
            resp = client.completions.create(prompt=_prompt(i), **kwargs)
        if mode == "json":
            rec["usage_out"] = resp.usage.completion_tokens
            rec["usage_in"] = resp.usage.prompt_tokens
            rec["events"] = None
        else:
            for chunk in resp:
                for c in chunk.choices:
                    text = c.delta.content if endpoint == "chat" else c.text
                    if text:
                        rec["events"] += 1
                        if rec["ttft_s"] is None:
                            rec["ttft_s"] = time.perf_counter() - t0
                if chunk.usage is not None:
                    rec["usage_out"] = chunk.usage.completion_tokens
                    rec["usage_in"] = chunk.usage.prompt_tokens
        out.append(rec)
    return out


# === curl ===


def curl_stream(url, model, max_tokens, log_path):
    """One streamed chat completion with `curl -N` (no buffering): returns the events seen,
    the usage reported and whether the stream ended with [DONE]."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _prompt(0)}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    argv = [
        "curl", "-sS", "-N", "--fail", "--max-time", "120",
        "-H", "Content-Type: application/json",
        "-d", json.dumps(body), url + "/v1/chat/completions",
    ]  # fmt: skip
    raw = subprocess.run(argv, check=True, capture_output=True).stdout
    with open(log_path, "wb") as f:
        f.write(raw)
    events, usage, done = 0, None, False
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        chunk = json.loads(data)
        for c in chunk.get("choices", []):
            if (c.get("delta") or {}).get("content"):
                events += 1
        if chunk.get("usage"):
            usage = chunk["usage"]
    return {"events": events, "usage": usage, "done": done, "bytes": len(raw)}


# === raw SSE streams, read to the end or left after a set number of bytes ===


def sse_stream(url, path, body, close_after=None, timeout=120):
    """POSTs `body` (a dict, sent with `"stream": true`) to `url + path` and reads the SSE
    response as a plain HTTP client would. With `close_after`, the client closes the connection
    as soon as it holds that many body bytes (a client that leaves mid-stream); otherwise it reads
    to the end. Returns the status, the bytes read, the content-bearing events (`text` or
    `delta.content` not empty) and their text, the usage chunk if one came, whether `[DONE]`
    came, and whether the client left early."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    rec = {"status": None, "bytes": 0, "events": 0, "text": "", "usage": None, "done": False, "left": False}
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        raw = b""
        while True:
            if close_after is not None and len(raw) >= close_after:
                rec["left"] = True
                break
            chunk = resp.read1(4096)
            if not chunk:
                break
            raw += chunk
    finally:
        # Closing with response bytes unread: the proxy sees the connection go (a reset).
        conn.close()
    rec["bytes"] = len(raw)
    text = raw.decode("utf-8", "replace")
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            rec["done"] = True
            continue
        try:
            chunk = json.loads(data)
        except ValueError:  # the last line of a stream left mid-event
            continue
        for c in chunk.get("choices") or []:
            text = c.get("text") or (c.get("delta") or {}).get("content")
            if text:
                rec["events"] += 1
                rec["text"] += text
        if chunk.get("usage"):
            rec["usage"] = chunk["usage"]
    return rec


# === in-flight sampling ===


class InFlightSampler:
    """Reads tokenmeter's in-flight gauge every `interval` seconds in a thread."""

    def __init__(self, metrics_url, interval=0.05):
        self.url = metrics_url
        self.interval = interval
        self.samples = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self.url, timeout=5) as r:
                    text = r.read().decode()
                lines = "\n".join(
                    l for l in text.splitlines() if l.startswith("tokenmeter_requests_in_flight")
                )
                self.samples.append(gauge(parse(lines), "tokenmeter_requests_in_flight"))
            except OSError:
                pass
            self._stop.wait(self.interval)

    def summary(self):
        s = self.samples
        busy = [x for x in s if x > 0]
        return {
            "n": len(s),
            "max": max(s) if s else None,
            # The phase includes GuideLLM's own start-up, when nothing is in flight.
            "busy_mean": statistics.fmean(busy) if busy else None,
        }


# === one keep-alive connection, requests timed ===


def timed_requests(url, model, pauses, max_tokens=4):
    """Streamed chat completions, one after another on one keep-alive connection (Python's
    http.client), each sent `pause` seconds after the previous one ended. Returns per request
    the pause, the status, whether the stream ended with [DONE], and the time to its first
    body byte."""
    import http.client
    import urllib.parse

    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": _prompt(1)}],
        "max_tokens": max_tokens,
        "stream": True,
    })  # fmt: skip
    out = []
    for pause in [0.0] + list(pauses):
        time.sleep(pause)
        rec = {"pause_s": pause, "status": None, "done": False, "ttfb_s": None, "error": None}
        t0 = time.perf_counter()
        try:
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            rec["status"] = resp.status
            first = resp.read1(65536)
            rec["ttfb_s"] = time.perf_counter() - t0
            raw = first + resp.read()
            rec["done"] = b"data: [DONE]" in raw
        except Exception as e:  # recorded: the check fails on it
            rec["error"] = f"{type(e).__name__}: {e}"
            conn.close()
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        out.append(rec)
    conn.close()
    return out[1:]
