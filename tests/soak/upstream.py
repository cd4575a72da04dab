#!/usr/bin/env python3
"""A small OpenAI-compatible streaming upstream for the soak test (Python stdlib only).

Answers every request on keep-alive HTTP/1.1 connections with a chat.completions event stream:
a first-token delay, TOKENS content chunks GAP apart (both jittered so a thousand streams do not
tick in lockstep), a usage chunk and [DONE]. It stands in for `tokenmeter sim` until that exists,
and prints what it served when it gets SIGTERM or SIGINT.

Usage: upstream.py PORT [--tokens 50] [--gap-ms 200] [--ttft-ms 200]
"""

import argparse
import asyncio
import json
import random
import signal

stats = {"connections": 0, "requests": 0, "completed": 0, "client_gone": 0}


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(obj) -> bytes:
    return chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def read_request(reader):
    """Reads one request; returns False at a clean end of the connection."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return False
    length, chunked = 0, False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return True


async def respond(writer, args):
    tokens = args.tokens
    base = {"id": "chatcmpl-soak", "object": "chat.completion.chunk", "model": "soak-model"}
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    await asyncio.sleep(args.ttft_ms / 1000 * random.uniform(0.5, 1.5))
    writer.write(event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    await writer.drain()
    gap = args.gap_ms / 1000 * random.uniform(0.8, 1.2)
    for i in range(tokens):
        if i:
            await asyncio.sleep(gap)
        writer.write(event({**base, "choices": [{"index": 0, "delta": {"content": f" t{i}"}}]}))
        await writer.drain()
    writer.write(event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
    usage = {"prompt_tokens": 9, "completion_tokens": tokens, "total_tokens": tokens + 9}
    writer.write(event({**base, "choices": [], "usage": usage}))
    writer.write(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()


async def handle(reader, writer, args):
    stats["connections"] += 1
    try:
        while await read_request(reader):
            stats["requests"] += 1
            await respond(writer, args)
            stats["completed"] += 1
    except (ConnectionError, asyncio.IncompleteReadError):
        stats["client_gone"] += 1
    finally:
        writer.close()


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("port", type=int)
    p.add_argument("--tokens", type=int, default=50)
    p.add_argument("--gap-ms", type=float, default=200)
    p.add_argument("--ttft-ms", type=float, default=200)
    args = p.parse_args()
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, args), "127.0.0.1", args.port, backlog=4096
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"upstream listening on 127.0.0.1:{args.port}", flush=True)
    await stop.wait()
    # Streams still open are cut here on purpose; their cancellation is not worth a traceback.
    loop.set_exception_handler(lambda _loop, _ctx: None)
    server.close()
    print("upstream " + " ".join(f"{k}={v}" for k, v in stats.items()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
