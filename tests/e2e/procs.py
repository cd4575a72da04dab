"""Starting and stopping the servers of the real-server check: vLLM and tokenmeter.

Each server runs in its own session (process group), started here, so stopping it reaches its
children too (vLLM forks an engine process and a worker) without touching anything else on
the machine. Every server is stopped on the way out, whatever happened, through
`Servers.__exit__`. All traffic stays on 127.0.0.1, on ports the kernel hands out.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request


class Failed(Exception):
    """A server did not come up: the message says which and shows its log tail."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, timeout=2):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except Exception:
        return None


def _tail(path, n=40):
    try:
        with open(path, "rb") as f:
            return b"\n".join(f.read().splitlines()[-n:]).decode("utf-8", "replace")
    except OSError:
        return "(no log)"


class Server:
    def __init__(self, name, argv, env, log, health_url, startup_timeout):
        self.name = name
        self.log = log
        self.health_url = health_url
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait(startup_timeout)

    def _wait(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(
                    f"{self.name} exited with {self.proc.returncode} during startup; "
                    f"log {self.log}:\n{_tail(self.log)}"
                )
            if _get(self.health_url) == 200:
                self.ready_after = time.monotonic() - self.started
                return
            time.sleep(0.5)
        self.stop()
        raise Failed(f"{self.name} not ready after {timeout:.0f} s; log {self.log}:\n{_tail(self.log)}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self, grace=20):
        """SIGTERM to the server's process group, SIGKILL after `grace` seconds."""
        if self.proc.poll() is not None:
            return
        pgid = self.proc.pid  # start_new_session: the group id is the server's own pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def start_vllm(python, model_dir, name, port, log, ttft_buckets, itl_buckets, timeout=420,
               otlp=None, extra=()):
    """vLLM's OpenAI server on loopback, with our histogram boundaries.

    `--custom-histogram-buckets` gives vLLM's TTFT and per-token histograms the same fine
    boundaries tokenmeter uses, so the two servers' percentiles come from identical bins.
    """
    env = dict(os.environ)
    env.update(
        {
            # Nothing may be fetched: the model, tokenizer and everything else are local.
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            # Otherwise vLLM's internal messaging binds to the machine's external address.
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    buckets = {"time_to_first_token": ttft_buckets, "inter_token_latency": itl_buckets}
    # On a GPU host the engine's work is not the CPU's: the clients and the proxy never wait
    # for it to be scheduled. Here vLLM's engine computes on the same 2 cores, and at full load
    # it kept the clients' event loops waiting for a core for 10-20 ms, time that only the
    # client's clock sees. A lower priority for vLLM (engine and HTTP server alike) puts that
    # wait back where a GPU host has it: inside the server, before any view's clock stops.
    argv = [
        "nice", "-n", os.environ.get("E2E_VLLM_NICE", "10"),
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model", model_dir,
        "--served-model-name", name,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", "2048",
        "--custom-histogram-buckets", json.dumps(buckets),
        # The engine's own queue, prefill and generation time on each usage chunk: tokenmeter
        # splits its TTFT by them, and the check holds them against the wire.
        "--enable-per-request-metrics",
    ]  # fmt: skip
    if otlp:
        # vLLM's own spans, OTLP over HTTP/protobuf to the same receiver as tokenmeter's:
        # the engine's span must land in the caller's trace, under tokenmeter's.
        env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        argv += ["--otlp-traces-endpoint", otlp + "/v1/traces"]
    argv += list(extra)
    return Server(
        f"vLLM ({name})", argv, env, log, f"http://127.0.0.1:{port}/health", timeout
    )


def wait_engine_read(metrics_url, timeout=30):
    """Waits until tokenmeter has read the upstream's /metrics once: from then on it knows the
    upstream is vLLM, and `--inject-usage auto` asks for usage where a client did not."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(metrics_url, timeout=5) as r:
                text = r.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.startswith("tokenmeter_engine_metrics_scrapes_total{") and 'result="ok"' in line:
                if float(line.rsplit(" ", 1)[1]) >= 1:
                    return
        if time.monotonic() > deadline:
            raise Failed(f"tokenmeter ({metrics_url}) did not read the upstream's /metrics within {timeout} s")
        time.sleep(0.2)


def start_tokenmeter(binary, upstream, port, metrics_port, log, ttft_buckets, tps_buckets,
                     capacity_class, otlp=None, request_log=None, slos=(), extra=()):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENMETER_")}
    # One debug line per request (outcome, tokens, decode time, mean in flight, band; never
    # content) so a disagreement can be traced to the requests behind it.
    # The pool's debug lines say when a request was sent again after a server's idle close.
    env["TOKENMETER_LOG"] = os.environ.get(
        "E2E_TOKENMETER_LOG", "info,tokenmeter::meter=debug,tokenmeter::proxy::pool=debug"
    )
    csv = lambda xs: ",".join(repr(x) for x in xs)  # noqa: E731
    argv = [
        binary,
        "--upstream", upstream,
        "--listen", f"127.0.0.1:{port}",
        "--metrics-listen", f"127.0.0.1:{metrics_port}",
        "--buckets-ttft", csv(ttft_buckets),
        "--buckets-tps", csv(tps_buckets),
        # The default classes, plus one whose floor the capacity fit's answer can be read for
        # inside the concurrencies the check runs (validate.py, CAPACITY_CLASS).
        "--slo", "interactive:ttft=1s,tps=20",
        "--slo", "batch",
        "--slo", f"{capacity_class[0]}:tps={capacity_class[1]:g}",
    ]  # fmt: skip
    for slo in slos:
        argv += ["--slo", slo]
    if otlp:
        argv += ["--otlp-endpoint", otlp]
    if request_log:
        argv += ["--request-log", request_log]
    argv += list(extra)
    return Server(
        "tokenmeter", argv, env, log, f"http://127.0.0.1:{metrics_port}/readyz", 30
    )


class Receiver:
    """The test OTLP receiver (tests/otlp/receiver.py) on `port`: each span it decodes is one
    JSON line in `out`. Runs under vLLM's Python, which has opentelemetry-proto (a dependency of
    the OTLP exporter install.sh adds)."""

    def __init__(self, python, script, port, out, timeout=30):
        self.name = "OTLP receiver"
        self.out = out
        with open(out, "wb") as f:
            self.proc = subprocess.Popen(
                [python, script, str(port)],
                stdout=f,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise Failed(f"the OTLP receiver exited during startup:\n{_tail(out)}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise Failed(f"the OTLP receiver did not listen within {timeout} s:\n{_tail(out)}")

    def spans(self):
        """Every span decoded so far."""
        out = []
        with open(self.out, "rb") as f:
            for line in f.read().splitlines():
                if line.startswith(b"{"):
                    out.append(json.loads(line))
        return out

    def stop(self, grace=5):
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(grace)
