#!/usr/bin/env python3
"""The page in a real browser: headless Chromium, driven over the DevTools protocol.

Two parts:
1. live: `tokenmeter demo` runs (on free ports; the page's address is the first line it prints,
   which is checked); Chromium loads the page from its metrics listener, waits for
   data, and the test asserts from the DOM that every chart has points, that each line is
   labelled and each axis titled, and that the "now" figures equal those of the /api/summary
   answer the page itself received (read from the browser's network log), generated no more
   than one refresh before the DOM was read. Screenshots at 1280x800 and at phone width
   (390x844) go to target/ui/; with --update-docs the 1280-wide one also goes to docs/ui.png.
2. fixtures: the page's own files served with canned summaries, to show that the SLO section
   and the capacity curve appear when their series exist and are hidden when they do not, and
   that with three classes (limits a few pixels apart) and all four series no text of the
   trade-off chart is drawn over another.

Only the Python standard library is used (a small WebSocket client is below), so the test needs
nothing but python3 and Debian's chromium.
"""

import argparse
import base64
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ASSETS = os.path.join(ROOT, "crates", "tokenmeter", "src", "ui", "assets")

# The page refreshes every REFRESH_S (ui.js REFRESH_MS); its figures may be this old, plus the
# time one fetch and one render take on a loaded 2-core machine.
REFRESH_S = 2.0
RENDER_SLACK_S = 1.5
# The live part waits at most this long for every chart to have points.
DATA_DEADLINE_S = 60.0

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
]

FIGURES = {
    "now-decode": "in_flight_decode",
    "now-prefill": "in_flight_prefill",
    "now-tps": "output_tokens_per_second",
    "now-tps-gpu": "output_tokens_per_second_per_gpu",
    "now-ttft-p50": "ttft_p50_seconds",
    "now-ttft-p99": "ttft_p99_seconds",
    "now-rtps-p50": "request_tokens_per_second_p50",
}
CHARTS = ["chart-tradeoff", "chart-tps", "chart-ttft", "chart-inflight"]


def fail(msg):
    print(f"FAIL: {msg}", flush=True)
    sys.exit(1)


# === a minimal WebSocket client (RFC 6455): text frames, client-side masking ===


class WebSocket:
    def __init__(self, url, timeout=30.0):
        assert url.startswith("ws://"), url
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = (
            f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            head += chunk
        head, _, self.buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise ConnectionError(head.decode(errors="replace"))

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send_frame(self, opcode, payload):
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def send(self, text):
        self._send_frame(0x1, text.encode())

    def recv(self):
        message = b""
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if opcode == 0x9:
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("closed by the browser")
            message += payload
            if b0 & 0x80:
                return message.decode()


# === DevTools protocol ===


class Browser:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tokenmeter-chromium-")
        exe = shutil.which("chromium") or shutil.which("chromium-browser")
        if not exe:
            fail("chromium is not installed (tests/ui/run.sh installs it)")
        self.proc = subprocess.Popen(
            [exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.dir}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = os.path.join(self.dir, "DevToolsActivePort")
        deadline = time.time() + 30
        while not os.path.exists(port_file) or not open(port_file).read().strip():
            if time.time() > deadline or self.proc.poll() is not None:
                fail("chromium did not start its DevTools endpoint")
            time.sleep(0.1)
        port = open(port_file).read().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = WebSocket(page["webSocketDebuggerUrl"])
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        my_id = self.next_id
        self.ws.send(json.dumps({"id": my_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def viewport(self, width, height, mobile=False):
        self.call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=mobile,
        )

    def screenshot(self, path, full=False):
        params = {"format": "png"}
        if full:
            size = self.eval("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
            params["clip"] = {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        print(f"screenshot: {os.path.relpath(path, ROOT)}")

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


# What the page shows, read from the DOM in one script so it is one moment.
READ_DOM = """(() => {
  const figures = {};
  for (const dd of document.querySelectorAll('.figures dd.value')) {
    figures[dd.id] = { value: dd.getAttribute('data-value'), text: dd.textContent };
  }
  const charts = {};
  for (const c of document.querySelectorAll('.chart')) {
    const series = {};
    for (const g of c.querySelectorAll('g.series')) series[g.dataset.series] = g.querySelectorAll('.pt').length;
    charts[c.id] = {
      points: c.querySelectorAll('.pt').length,
      series: series,
      lineLabels: Array.from(c.querySelectorAll('text.line-label')).map((t) => t.textContent),
      axisTitles: Array.from(c.querySelectorAll('text.axis-title')).map((t) => t.textContent),
      refLabels: Array.from(c.querySelectorAll('text.ref-label')).map((t) => t.textContent),
      // Every text's box as drawn: [text, left, top, right, bottom].
      textBoxes: Array.from(c.querySelectorAll('svg text')).map((t) => {
        const r = t.getBoundingClientRect();
        return [t.textContent, r.left, r.top, r.right, r.bottom];
      }),
    };
  }
  const rows = (id) => Array.from(document.querySelectorAll('#' + id + ' tbody tr')).map((tr) =>
    Array.from(tr.cells).map((td) => td.textContent));
  return {
    now_ms: Date.now(),
    generated: document.body.getAttribute('data-generated'),
    refreshes: Number(document.body.getAttribute('data-refreshes') || 0),
    status: document.getElementById('status').textContent,
    figures: figures,
    split: {
      hidden: document.getElementById('now-split').hidden,
      text: document.getElementById('now-split').textContent,
      parts: JSON.parse(document.getElementById('now-split').getAttribute('data-parts') || '[]'),
    },
    charts: charts,
    sloHidden: document.getElementById('slo').hidden,
    slo: Array.from(document.querySelectorAll('#slo-table tbody tr')).map((tr) => ({
      cls: tr.getAttribute('data-class'),
      attainment: tr.querySelector('.attainment').getAttribute('data-value'),
    })),
    outcomes: rows('outcomes-table'),
    sources: rows('sources-table'),
    scrollWidth: document.documentElement.scrollWidth,
  };
})()"""


def summaries_seen(browser, seen):
    """Reads the bodies of the api/summary answers the page received since the last call."""
    events, browser.events = browser.events, []
    for e in events:
        if e["method"] == "Network.responseReceived" and e["params"]["response"]["url"].endswith("/api/summary"):
            seen.setdefault("pending", []).append(e["params"]["requestId"])
    for request_id in seen.pop("pending", []):
        try:
            body = browser.call("Network.getResponseBody", requestId=request_id)["body"]
        except RuntimeError:
            # Not finished loading yet: try again on the next call.
            seen.setdefault("pending", []).append(request_id)
            continue
        s = json.loads(body)
        seen[str(s["generated_unix_ms"])] = s


def check_split(dom, summary):
    """The TTFT split under the figures: shown exactly when the summary has one, with its parts."""
    want = [[p["part"], p["mean_seconds"]] for p in summary["now"].get("ttft_parts", [])]
    split = dom["split"]
    if split["hidden"] != (not want):
        fail(f"TTFT split hidden={split['hidden']} but the summary's parts are {want}")
    if split["parts"] != want:
        fail(f"TTFT split shows {split['parts']}, its api/summary said {want}")
    for part, _ in want:
        if part.replace("_", " ") not in split["text"]:
            fail(f"TTFT split text {split['text']!r} does not name {part}")
    return bool(want)


def check_figures(dom, summary):
    check_split(dom, summary)
    now = summary["now"]
    for fig, field in FIGURES.items():
        want = now[field]
        got = dom["figures"][fig]
        if want is None:
            if got["value"] != "" or got["text"] != "–":
                fail(f"{fig}: summary has no value but the page shows {got}")
            continue
        if got["value"] == "" or float(got["value"]) != float(want):
            fail(f"{fig}: the page holds {got['value']!r}, its api/summary said {want!r}")
        shown = float(got["text"].replace(",", ""))
        scale = 1000.0 if "ttft" in fig else 1.0
        # The text is the value rounded for reading: within 0.5% or one unit of its last digit.
        if abs(shown - want * scale) > max(0.005 * abs(want * scale), 0.051):
            fail(f"{fig}: the page shows {got['text']!r} for {want!r}")


def overlapping_texts(chart):
    """The pairs of a chart's texts whose boxes intersect (by more than rounding)."""
    boxes = [b for b in chart["textBoxes"] if b[3] > b[1] and b[4] > b[2]]
    out = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if min(a[3], b[3]) - max(a[1], b[1]) > 0.5 and min(a[4], b[4]) - max(a[2], b[2]) > 0.5:
                out.append((a, b))
    return out


def check_charts(dom, require_series):
    for c in CHARTS:
        chart = dom["charts"].get(c)
        if not chart or chart["points"] == 0:
            fail(f"{c} has no points: {chart}")
        # No label is drawn over another (a limit's over a series name read "interactivemodel:").
        clash = overlapping_texts(chart)
        if clash:
            fail(f"{c}: texts drawn over each other: {clash}")
        if not chart["axisTitles"]:
            fail(f"{c} has no axis titles")
        drawn = [s for s, n in chart["series"].items() if n > 0]
        if len(chart["lineLabels"]) < len(drawn):
            fail(f"{c}: {len(drawn)} series drawn but only labels {chart['lineLabels']}")
    for c, series in require_series.items():
        for s in series:
            if dom["charts"][c]["series"].get(s, 0) < 1:
                fail(f"{c}: series {s} has no points: {dom['charts'][c]['series']}")


def data_ready(dom):
    c = dom["charts"]
    return (
        dom["refreshes"] > 0
        and all(c.get(k, {}).get("points", 0) > 0 for k in CHARTS)
        and c["chart-tradeoff"]["series"].get("per_request", 0) >= 3
        and c["chart-tradeoff"]["series"].get("aggregate", 0) >= 3
        and c["chart-ttft"]["series"].get("ttft_p50", 0) >= 3
    )


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read()


# === part 1: the live demo ===


def live(binary, out, update_docs):
    env = dict(os.environ, TOKENMETER_UI_SAMPLE_PERIOD="1s", TOKENMETER_RATE_WINDOW="2s", TOKENMETER_LOG="warn")
    env.pop("TOKENMETER_NO_UI", None)
    demo = subprocess.Popen(
        [binary, "demo", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
         "--max-concurrency", "32", "--step", "2s", "--duration", "90s"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    browser = None
    try:
        # The demo prints the page's address first.
        first = demo.stdout.readline().strip()
        prefix, suffix = "Open ", "/ in a browser: tokenmeter's live page."
        if not (first.startswith(prefix) and first.endswith(suffix)):
            fail(f"the demo's first line is not the page's address: {first!r}")
        base = first[len(prefix):-len(suffix)]
        # Keep reading its table, so it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in demo.stdout], daemon=True).start()
        deadline = time.time() + 30
        while True:
            try:
                get(f"{base}/healthz")
                break
            except OSError:
                if time.time() > deadline or demo.poll() is not None:
                    fail("the demo's metrics listener did not come up")
                time.sleep(0.2)
        if b"<title>tokenmeter</title>" not in get(f"{base}/"):
            fail("GET / is not the page")
        browser = Browser()
        browser.call("Network.enable")
        browser.call("Page.enable")
        browser.viewport(1280, 800)
        browser.call("Page.navigate", url=f"{base}/")
        started = time.time()
        seen = {}
        dom = None
        while time.time() - started < DATA_DEADLINE_S:
            time.sleep(1.0)
            dom = browser.eval(READ_DOM)
            if data_ready(dom):
                break
        else:
            fail(f"no full data within {DATA_DEADLINE_S:.0f}s: {json.dumps(dom)[:2000]}")
        print(f"live: data after {time.time() - started:.1f}s, {dom['refreshes']} refreshes")
        # Two more checks a refresh apart, each against the answer the page had received.
        for _ in range(2):
            time.sleep(REFRESH_S)
            dom = browser.eval(READ_DOM)
            summaries_seen(browser, seen)
            summary = seen.get(dom["generated"])
            if summary is None:
                fail(f"the page shows generated={dom['generated']}, not among its answers {sorted(seen)}")
            age = dom["now_ms"] / 1000 - summary["generated_unix_ms"] / 1000
            if not -0.5 <= age <= REFRESH_S + RENDER_SLACK_S:
                fail(f"the page's figures are {age:.2f}s old, more than one refresh ({REFRESH_S}s)")
            check_figures(dom, summary)
            # The demo's simulator states its queue and prefill as vLLM does: the split shows.
            if not check_split(dom, summary):
                fail(f"no TTFT split on the page during the demo: {summary['now']}")
            check_charts(dom, {"chart-tradeoff": ["per_request", "aggregate"], "chart-inflight": ["decode"]})
            if dom["sloHidden"] != (summary["slo"] is None):
                fail(f"SLO section hidden={dom['sloHidden']} but summary slo={summary['slo']!r}")
            want = [[o["name"]] for o in summary["outcomes"]]
            if [r[:1] for r in dom["outcomes"]] != want:
                fail(f"outcomes table {dom['outcomes']} is not {want}")
            if "cannot" in dom["status"]:
                fail(f"status: {dom['status']}")
            print(f"live: figures equal api/summary generated {age:.2f}s before the DOM was read")
        # The page's own answer agrees with a direct fetch of /api/summary on what cannot move
        # between the two (the bands the trade-off chart shows, in order).
        direct = json.loads(get(f"{base}/api/summary"))
        if [b["band"] for b in direct["tradeoff"]["bands"]][: len(summary["tradeoff"]["bands"])] != [
            b["band"] for b in summary["tradeoff"]["bands"]
        ]:
            fail("the bands of a direct api/summary differ from the page's")
        browser.screenshot(os.path.join(out, "page-1280x800.png"))
        browser.screenshot(os.path.join(out, "page-1280-full.png"), full=True)
        if update_docs:
            shutil.copy(os.path.join(out, "page-1280-full.png"), os.path.join(ROOT, "docs", "ui.png"))
            print("screenshot: docs/ui.png")
        browser.viewport(390, 844, mobile=True)
        time.sleep(REFRESH_S + 0.5)
        dom = browser.eval(READ_DOM)
        if dom["scrollWidth"] > 390 + 1:
            fail(f"at phone width the page scrolls sideways ({dom['scrollWidth']}px)")
        check_charts(dom, {})
        browser.screenshot(os.path.join(out, "page-phone.png"), full=True)
    finally:
        if browser:
            browser.close()
        demo.terminate()
        try:
            demo.wait(timeout=20)
        except subprocess.TimeoutExpired:
            demo.kill()


# === part 2: canned summaries, with and without the optional sections ===


def fixture(variant):
    """A canned summary: "bare" (no optional section), "full" (every one, one class) or
    "classes" (three classes whose limits lie a few pixels apart and two floors close together,
    to show that no label is drawn over another)."""
    with_optional = variant != "bare"
    now = int(time.time() * 1000)
    bands = [("1", 1.0, 70.0, 70.0), ("2-4", 2.83, 64.0, 190.0), ("5-8", 6.32, 55.0, 330.0)]
    s = {
        "version": "fixture",
        "generated_unix_ms": now,
        "sample_period_seconds": 5.0,
        "history_span_seconds": 600.0,
        "now": {
            "in_flight_prefill": 1.0, "in_flight_decode": 6.0, "output_tokens_per_second": 330.5,
            "output_tokens_per_second_per_gpu": 165.25, "gpus": 2.0,
            "window": {"from_unix_ms": now - 60000, "seconds": 60.0},
            "ttft_requests": 40.0, "ttft_p50_seconds": 0.0425, "ttft_p99_seconds": 0.31,
            "request_tps_requests": 40.0, "request_tokens_per_second_p50": 55.5,
            "ttft_split_requests": 0.0, "ttft_parts": [],
        },
        "slo": None,
        "tradeoff": {
            "bands": [
                {"band": b, "concurrency": c, "requests": 10.0, "per_request_p50": p, "per_request_p90": p,
                 "aggregate_samples": 3, "aggregate_tokens_per_second": a, "aggregate_mean_in_flight": c}
                for b, c, p, a in bands
            ],
            "capacity_curve": {},
            "max_concurrency": {},
        },
        "history": [
            {"unix_ms": now - 5000 * (10 - i), "output_tokens_per_second": 30.0 * i,
             "ttft_p50_seconds": 0.04, "ttft_p99_seconds": 0.3, "in_flight_prefill": 1.0, "in_flight_decode": i}
            for i in range(10)
        ],
        "outcomes": [{"name": "complete", "requests": 9.0}, {"name": "timeout", "requests": 1.0}],
        "codes": [{"name": "200", "requests": 10.0}],
        "token_sources": [{"name": "usage", "requests": 10.0}],
        "totals": {"requests": 10.0, "output_tokens": 1000.0, "input_tokens": 500.0},
    }
    if with_optional:
        s["now"]["ttft_split_requests"] = 30.0
        s["now"]["ttft_parts"] = [
            {"part": "queue", "requests": 30.0, "mean_seconds": 0.012},
            {"part": "model_load", "requests": 2.0, "mean_seconds": 0.004},
            {"part": "prefill", "requests": 30.0, "mean_seconds": 0.021},
            {"part": "other", "requests": 30.0, "mean_seconds": 0.003},
        ]
        s["slo"] = [
            {"class": "interactive", "objective": 0.95,
             "window": {"requests": 10.0, "met": 6.0, "attainment": 0.75, "results": {"met": 6.0, "ttft_missed": 2.0, "client_disconnect": 2.0}},
             "since_start": {"requests": 10.0, "met": 6.0, "attainment": 0.75, "results": {}}},
            {"class": "batch", "objective": None,
             "window": {"requests": 0.0, "met": 0.0, "attainment": None, "results": {}},
             "since_start": {"requests": 0.0, "met": 0.0, "attainment": None, "results": {}}},
        ]
        s["tradeoff"]["capacity_curve"] = {
            "per_request": [{"concurrency": c, "tokens_per_second": 1 / (0.01 + 0.0005 * c)} for c in (1, 2, 4, 8, 16)],
            "aggregate": [{"concurrency": c, "tokens_per_second": c / (0.01 + 0.0005 * c)} for c in (1, 2, 4, 8, 16)],
        }
        s["tradeoff"]["max_concurrency"] = {"interactive": 30.0}
        s["tradeoff"]["floors"] = [{"class": "interactive", "tokens_per_second": 40.0}]
    if variant == "classes":
        s["tradeoff"]["max_concurrency"] = {"interactive": 30.0, "agent": 28.0, "batch": 32.0}
        s["tradeoff"]["floors"] = [
            {"class": "interactive", "tokens_per_second": 40.0},
            {"class": "agent", "tokens_per_second": 38.0},
            {"class": "batch", "tokens_per_second": 10.0},
        ]
        s["tradeoff"]["limits"] = {
            "interactive": {"ttft": 30.0, "tokens_per_second": 80.0},
            "agent": {"ttft": 90.0, "tokens_per_second": 28.0},
            "batch": {"tokens_per_second": 200.0, "kv_cache": 32.0},
        }
    return s


def fixtures():
    state = {"summary": None}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            files = {"/": ("index.html", "text/html"), "/ui.js": ("ui.js", "text/javascript"),
                     "/ui.css": ("ui.css", "text/css")}
            if self.path == "/api/summary":
                state["summary"]["generated_unix_ms"] = int(time.time() * 1000)
                body, ctype = json.dumps(state["summary"]).encode(), "application/json"
            elif self.path in files:
                name, ctype = files[self.path]
                body = open(os.path.join(ASSETS, name), "rb").read()
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    browser = Browser()
    try:
        browser.viewport(1280, 800)
        for variant in ("bare", "full", "classes"):
            with_optional = variant != "bare"
            state["summary"] = fixture(variant)
            browser.call("Page.navigate", url=f"http://127.0.0.1:{server.server_address[1]}/")
            deadline = time.time() + 15
            while True:
                time.sleep(0.3)
                dom = browser.eval(READ_DOM)
                if dom["refreshes"] > 0:
                    break
                if time.time() > deadline:
                    fail("the fixture page never rendered")
            check_figures(dom, state["summary"])
            check_charts(dom, {"chart-tradeoff": ["per_request", "aggregate"]})
            series = dom["charts"]["chart-tradeoff"]["series"]
            refs = dom["charts"]["chart-tradeoff"]["refLabels"]
            if with_optional:
                if dom["sloHidden"]:
                    fail("the SLO section is hidden although the summary has classes")
                got = [(r["cls"], r["attainment"]) for r in dom["slo"]]
                if got != [("interactive", "0.75"), ("batch", "")]:
                    fail(f"SLO rows {got}")
                if series.get("model_per_request") != 5 or series.get("model_aggregate") != 5:
                    fail(f"capacity curve not drawn: {series}")
                if not any("floor" in r for r in refs) or not any("max 30" in r for r in refs):
                    fail(f"floor and max-concurrency lines not labelled: {refs}")
            else:
                if not dom["sloHidden"]:
                    fail("the SLO section shows although the summary has none")
                if "model_per_request" in series or "model_aggregate" in series or refs:
                    fail(f"capacity drawn without a curve: {series} {refs}")
            if variant == "classes":
                if sorted(s for s, n in series.items() if n > 0) != sorted(
                    ["per_request", "aggregate", "model_per_request", "model_aggregate"]
                ):
                    fail(f"not all four series drawn: {series}")
                want = ["agent: max 28", "interactive: max 30 (TTFT binds)", "batch: max 32 (KV cache binds)"]
                if [r for r in refs if ": max" in r] != want:
                    fail(f"class limits labelled {refs}, not {want}")
                if sum("floor" in r for r in refs) != 3:
                    fail(f"three floors, labels {refs}")
                # check_charts above found no two texts of the chart over each other.
            print(f"fixtures: {variant}: ok")
            browser.screenshot(os.path.join(ROOT, "target", "ui", f"fixture-{variant}.png"), full=True)
    finally:
        browser.close()
        server.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "tokenmeter"))
    p.add_argument("--out", default=os.path.join(ROOT, "target", "ui"))
    p.add_argument("--update-docs", action="store_true", help="also write docs/ui.png")
    p.add_argument("--fixtures-only", action="store_true", help="only the canned summaries (no binary needed)")
    a = p.parse_args()
    t0 = time.time()
    fixtures()
    if not a.fixtures_only:
        live(a.binary, a.out, a.update_docs)
    print(f"browser test took {time.time() - t0:.1f}s")
    print(f"browser: {1 if a.fixtures_only else 2} passed, 0 failed")


if __name__ == "__main__":
    main()
