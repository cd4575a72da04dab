#!/usr/bin/env python3
"""Live traffic for the deployment checks: a fake OpenAI-compatible upstream and a load client.

Python standard library only (asyncio), so it runs on a fresh machine with nothing installed.

    traffic.py upstream --port 0 --port-file F     # serves /v1/chat/completions until killed
    traffic.py load --target http://127.0.0.1:8080 --duration 40 --concurrency 1,4,12
    traffic.py load ... --duration 600 --step-seconds 10   # a ramp of 10 s steps, stopped by SIGTERM

The upstream streams OpenAI chat.completion chunks (SSE, chunked transfer encoding, one chunk per
token) and the final `usage` chunk when the request asks for it. What it does with a request is
chosen by the request body's `x_test` field, so the client can produce every outcome tokenmeter
counts: `ok` (default), `status:NNN` (an error response), `abort` (the connection is cut
mid-stream: upstream_error), `slow_headers` (headers after 3 s: a 504 timeout behind
`--upstream-timeout 2s`), `bad_json` (one malformed event: parse_errors{reason="invalid_json"}),
`reasoning` (a third of the tokens as `reasoning_content` deltas, then content, a tool-call delta
last, a stall of 5 gaps midway, and usage with `reasoning_tokens`). Every usage report states
half the prompt as `prompt_tokens_details.cached_tokens`, and carries vLLM's per-request `metrics`
(queue two fifths of the wait before the first token, prefill half of it). Like an engine whose
decode step grows with its batch, the gap between tokens grows by `x_slowdown` (5% by default)
for every other stream of the same `x_engine` in flight (the load sends its target, so each
proxy in front of the one upstream sees an engine of its own), so the capacity model has a
slowdown to fit.
The client adds its own `hangup` (closes after a few events: client_disconnect), non-streaming
requests and streaming requests without `include_usage` (token_count_source="counted"), and with
`--classes a,b,` names an SLO class in `x-tokenmeter-class` on each request, picked at random
(an empty name sends no header: the default class), and with `--tenants a,b,` a tenant in
`x-tenant` likewise (an empty name sends none).
"""

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import time
from urllib.parse import urlsplit

# === upstream ===

# Streams in flight per `x_engine`: each engine's decode slows with its own batch.
ACTIVE = {}


async def read_request(reader):
    """Reads one HTTP/1.1 request; returns (method, path, headers, body) or None at EOF."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                break
            body += data[:-2]
    elif "content-length" in headers:
        body = await reader.readexactly(int(headers["content-length"]))
    return method, path, headers, body


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj) -> bytes:
    payload = obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")).encode()
    return b"data: " + payload + b"\n\n"


# What a vLLM's /metrics says of its memory (--engine-metrics auto reads it): a cache of 4,096
# blocks of 16, its usage, waiting requests and preemptions moving with the requests served.
def engine_page(counters):
    n = counters["requests"]
    return (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="4096",engine="0"} 1\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="test-model"}} {(n % 50) / 50}\n'
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="test-model"}} {n % 7}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="test-model"}} {n % 3}\n'
        "# TYPE vllm:num_preemptions_total counter\n"
        f'vllm:num_preemptions_total{{engine="0",model_name="test-model"}} {n // 5}\n'
    ).encode()


async def respond(writer, req, counters):
    method, path, headers, body = req
    if method == "GET" and path == "/metrics":
        page = engine_page(counters)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(page), page))
        await writer.drain()
        return True
    try:
        spec = json.loads(body or b"{}")
    except ValueError:
        spec = {}
    behaviour = spec.get("x_test", "ok")
    model = spec.get("model", "test-model")
    n = int(spec.get("max_tokens", 32))
    ttft = float(spec.get("x_ttft_ms", 100)) / 1000
    gap = float(spec.get("x_gap_ms", 20)) / 1000
    prompt = int(spec.get("x_prompt_tokens", 100))
    engine = str(spec.get("x_engine", model))
    slowdown = float(spec.get("x_slowdown", 0.05))
    counters["requests"] += 1

    if behaviour.startswith("status:"):
        code = int(behaviour.split(":")[1])
        err = json.dumps({"error": {"message": "test error", "code": code}}).encode()
        writer.write(
            b"HTTP/1.1 %d Test\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (code, len(err), err)
        )
        await writer.drain()
        return True
    if behaviour == "slow_headers":
        await asyncio.sleep(3)
    await asyncio.sleep(ttft)
    base = {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model}

    if not spec.get("stream"):
        doc = dict(base, object="chat.completion")
        doc["choices"] = [
            {"index": 0, "message": {"role": "assistant", "content": "tok " * n}, "finish_reason": "length"}
        ]
        doc["usage"] = {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}
        data = json.dumps(doc).encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(data), data)
        )
        await writer.drain()
        return True

    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    role = dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    writer.write(chunk(sse(role)))
    # Pre-encode the token event once: the upstream must not be the bottleneck when measuring.
    token_event = chunk(sse(dict(base, choices=[{"index": 0, "delta": {"content": "tok "}, "finish_reason": None}])))
    reasoning = behaviour == "reasoning"
    thinking = n // 3 if reasoning else 0
    think_event = chunk(sse(dict(base, choices=[{"index": 0, "delta": {"reasoning_content": "hm "}, "finish_reason": None}])))
    tool_event = chunk(sse(dict(base, choices=[{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": "{"}}]}, "finish_reason": None}])))
    ACTIVE[engine] = ACTIVE.get(engine, 0) + 1
    try:
        return await stream_tokens(writer, spec, base, n, gap, slowdown, engine, behaviour, reasoning,
                                   thinking, token_event, think_event, tool_event, prompt, ttft)
    finally:
        ACTIVE[engine] -= 1


async def stream_tokens(writer, spec, base, n, gap, slowdown, engine, behaviour, reasoning, thinking,
                        token_event, think_event, tool_event, prompt, ttft):
    """The token events, the end and the usage report of one streamed response."""
    started = time.monotonic()
    for i in range(n):
        if i:
            step = gap * (1 + slowdown * max(ACTIVE.get(engine, 1) - 1, 0))
            await asyncio.sleep(step * (5 if reasoning and i == n // 2 else 1))
        if i < thinking:
            writer.write(think_event)
        elif reasoning and i == n - 1:
            writer.write(tool_event)
        else:
            writer.write(token_event)
        if behaviour == "bad_json" and i == n // 2:
            writer.write(chunk(b"data: {this is not json\n\n"))
        if behaviour == "abort" and i == n // 2:
            await writer.drain()
            # Cut the connection without the terminating chunk: the body is incomplete.
            writer.transport.abort()
            return False
        await writer.drain()
    done = dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "length"}])
    writer.write(chunk(sse(done)))
    if (spec.get("stream_options") or {}).get("include_usage"):
        usage = dict(base, choices=[], usage={
            "prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n,
            "prompt_tokens_details": {"cached_tokens": prompt // 2},
            "completion_tokens_details": {"reasoning_tokens": thinking},
        })
        # As vLLM with --enable-per-request-metrics states them: two fifths of the wait queued,
        # half of it prefill, the rest outside the engine.
        usage["metrics"] = {
            "queue_time_ms": ttft * 400, "time_to_first_token_ms": ttft * 500,
            "generation_time_ms": (time.monotonic() - started) * 1000,
        }
        writer.write(chunk(sse(usage)))
    writer.write(chunk(sse(b"[DONE]")) + b"0\r\n\r\n")
    await writer.drain()
    return True


async def serve_upstream(args):
    counters = {"requests": 0}

    async def handle(reader, writer):
        try:
            while True:
                try:
                    req = await read_request(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if not await respond(writer, req, counters):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", args.port, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(str(port))
        os.replace(tmp, args.port_file)
    print(f"upstream listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    async with server:
        await server.serve_forever()


# === load client ===

# (weight, behaviour). "hangup" is the client's own doing; the rest are passed to the upstream.
MIX = [
    (60, "ok"),
    (10, "reasoning"),
    (8, "ok_counted"),
    (5, "ok_nonstream"),
    (3, "status:500"),
    (2, "status:503"),
    (2, "status:429"),
    (2, "status:400"),
    (3, "abort"),
    (2, "hangup"),
    (1, "slow_headers"),
    (2, "bad_json"),
]


def pick(rng, mix):
    total = sum(w for w, _ in mix)
    x = rng.uniform(0, total)
    for w, b in mix:
        x -= w
        if x <= 0:
            return b
    return mix[-1][1]


async def one_request(host, port, body, hangup, stats, slo_class="", tenant=""):
    """Sends one request on a new connection and reads the response to its end."""
    data = json.dumps(body).encode()
    extra = b"x-tokenmeter-class: %s\r\n" % slo_class.encode() if slo_class else b""
    extra += b"x-tenant: %s\r\n" % tenant.encode() if tenant else b""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"%scontent-length: %d\r\nconnection: close\r\n\r\n%s" % (host.encode(), extra, len(data), data)
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        stats["status"][status] = stats["status"].get(status, 0) + 1
        events = 0
        while True:
            buf = await reader.read(65536)
            if not buf:
                break
            events += buf.count(b"data: ")
            stats["bytes"] += len(buf)
            if hangup and events >= 3:
                stats["hangups"] += 1
                return
        stats["events"] += events
    except (ConnectionError, asyncio.IncompleteReadError):
        stats["errors"] += 1
    finally:
        writer.close()


async def worker(wid, args, deadline, stats, rng):
    u = urlsplit(args.target)
    host, port = u.hostname, u.port or 80
    models = args.models.split(",")
    classes = args.classes.split(",")
    tenants = args.tenants.split(",")
    # A generator of its own, so --tenants leaves the rest of the load's choices as they were.
    tenant_rng = random.Random(f"{args.seed}-{wid}")
    while time.monotonic() < deadline:
        behaviour = pick(rng, MIX) if args.mix == "mixed" else "ok"
        body = {
            "model": models[rng.randrange(len(models))],
            "messages": [{"role": "user", "content": "measure me"}],
            "stream": behaviour != "ok_nonstream",
            "max_tokens": rng.randint(args.min_tokens, args.max_tokens),
            "x_ttft_ms": rng.uniform(args.ttft_ms * 0.5, args.ttft_ms * 1.5),
            "x_gap_ms": args.gap_ms,
            "x_engine": args.target,
            "x_prompt_tokens": rng.randint(50, 2000),
        }
        if behaviour not in ("ok_counted", "ok_nonstream"):
            body["stream_options"] = {"include_usage": True}
        if behaviour == "reasoning":
            # Long enough that its three kinds and its stall all show.
            body["max_tokens"] = max(body["max_tokens"], 9)
        if behaviour not in ("ok", "ok_counted", "ok_nonstream", "hangup"):
            body["x_test"] = behaviour
        t0 = time.monotonic()
        try:
            slo_class = classes[rng.randrange(len(classes))]
            tenant = tenants[tenant_rng.randrange(len(tenants))]
            await one_request(host, port, body, behaviour == "hangup", stats, slo_class, tenant)
        except OSError:
            stats["errors"] += 1
            await asyncio.sleep(0.1)
        stats["requests"] += 1
        stats["seconds"] += time.monotonic() - t0


async def run_load(args):
    stats = {"requests": 0, "status": {}, "events": 0, "bytes": 0, "hangups": 0, "errors": 0, "seconds": 0.0}
    steps = [int(c) for c in args.concurrency.split(",")]
    step_len = args.step_seconds if args.step_seconds is not None else args.duration / len(steps)
    rng = random.Random(args.seed)
    started = time.monotonic()

    def report(final):
        elapsed = time.monotonic() - started
        out = dict(stats, elapsed=round(elapsed, 2), seconds=round(stats["seconds"], 2), stopped_early=not final)
        out["status"] = {str(k): v for k, v in sorted(stats["status"].items())}
        out["events_per_second"] = round(stats["events"] / elapsed, 1)
        print(json.dumps(out), flush=True)

    def on_term():
        # Stopped before --duration ran out (the live test does this): report what was sent.
        report(final=False)
        os._exit(0)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_term)
    tasks = []
    # Ramp: each step adds workers up to its concurrency; all stop at the end.
    deadline = started + args.duration
    running = 0
    for i, c in enumerate(steps):
        while running < c:
            tasks.append(asyncio.create_task(worker(running, args, deadline, stats, random.Random(rng.random()))))
            running += 1
        if i + 1 < len(steps):
            await asyncio.sleep(step_len)
    await asyncio.gather(*tasks)
    report(final=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("upstream", help="serve a fake OpenAI-compatible streaming upstream")
    up.add_argument("--port", type=int, default=0)
    up.add_argument("--port-file", help="write the bound port here (atomically)")
    ld = sub.add_parser("load", help="send concurrent streaming requests")
    ld.add_argument("--target", required=True, help="e.g. http://127.0.0.1:8080")
    ld.add_argument("--duration", type=float, default=30)
    ld.add_argument("--concurrency", default="4", help="comma-separated steps, e.g. 1,4,12")
    ld.add_argument("--step-seconds", type=float, help="seconds between steps (default: --duration / steps), "
                    "so that a long --duration, as a bound, does not slow the ramp")
    ld.add_argument("--mix", choices=["mixed", "ok"], default="mixed")
    ld.add_argument("--models", default="llama-3.1-8b-instruct,qwen2.5-7b-instruct")
    ld.add_argument("--min-tokens", type=int, default=20)
    ld.add_argument("--max-tokens", type=int, default=80)
    ld.add_argument("--ttft-ms", type=float, default=150)
    ld.add_argument("--gap-ms", type=float, default=20)
    ld.add_argument("--seed", type=int, default=1)
    ld.add_argument("--classes", default="", help="SLO classes for x-tokenmeter-class, e.g. interactive,strict, "
                    "(an empty entry: no header)")
    ld.add_argument("--tenants", default="", help="tenants for x-tenant, e.g. team-a,team-b, "
                    "(an empty entry: no header)")
    args = p.parse_args()
    try:
        asyncio.run(serve_upstream(args) if args.cmd == "upstream" else run_load(args))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
