#!/usr/bin/env python3
"""WebSocket peers from the `websockets` package, for the upgrade tests (tests/it/upgrade.rs).

    peer.py server                 echo every message back; prints the port, then serves
    peer.py client URL [CA_FILE]   sends messages of several sizes, checks each echo, closes;
                                   prints "ok MESSAGES BYTES"

A second, independent WebSocket implementation beside the Rust one the tests also use.
"""

import asyncio
import os
import ssl
import sys

import websockets


def messages():
    rng = __import__("random").Random(7)
    out = ["hello from python", "ünïcödé ✓ 🚀", bytes(range(256))]
    for n in (0, 1, 125, 126, 65535, 65536, 1 << 20):
        out.append(rng.randbytes(n))
    return out


async def echo(ws):
    async for m in ws:
        await ws.send(m)


async def server():
    async with websockets.serve(echo, "127.0.0.1", 0, max_size=None) as s:
        port = s.sockets[0].getsockname()[1]
        print(port, flush=True)
        await asyncio.Future()


async def client(url, ca):
    ctx = None
    if url.startswith("wss://"):
        ctx = ssl.create_default_context(cafile=ca)
    total = 0
    msgs = messages()
    async with websockets.connect(url, ssl=ctx, max_size=None) as ws:
        for m in msgs:
            await ws.send(m)
            back = await ws.recv()
            if back != m:
                sys.exit(f"echo differs for a {type(m).__name__} of {len(m)}")
            total += len(m) if isinstance(m, bytes) else len(m.encode())
    print(f"ok {len(msgs)} {total}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["server"]:
        asyncio.run(server())
    elif sys.argv[1:2] == ["client"]:
        asyncio.run(client(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None))
    else:
        sys.exit(__doc__)
