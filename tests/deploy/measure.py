#!/usr/bin/env python3
"""Measures tokenmeter's CPU and memory under a stated streaming load, for sizing the
Kubernetes requests and limits in deploy/ (docs/deploy.md, "Resources", has the figures).

Not part of the test run: it takes as long as you ask. It starts the traffic upstream, a release
tokenmeter in front of it and the load client, then samples the tokenmeter process from /proc
once a second: CPU (utime + stime), resident memory (VmRSS) and its peak (VmHWM).

    cargo build --release
    python3 tests/deploy/measure.py --concurrency 64 --gap-ms 20 --seconds 30

Prints one JSON line: the load asked for and achieved (token events/s the client received),
tokenmeter's mean and peak CPU in cores, and its RSS at idle, mean and peak under load.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def mem_kib(pid):
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0])
    return out


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--gap-ms", type=float, default=20, help="time between tokens of one stream")
    p.add_argument("--tokens", type=int, default=300, help="output tokens per request (about)")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--bin", default=str(REPO / "target" / "release" / "tokenmeter"))
    args = p.parse_args()

    tmp = tempfile.mkdtemp(prefix="tokenmeter-measure-")
    procs = []
    try:
        port_file = os.path.join(tmp, "port")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "traffic.py"), "upstream", "--port-file", port_file],
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        while not os.path.exists(port_file):
            time.sleep(0.1)
        listen, metrics = free_port(), free_port()
        tm = subprocess.Popen([args.bin, "--upstream", f"http://127.0.0.1:{open(port_file).read()}",
                               "--listen", f"127.0.0.1:{listen}", "--metrics-listen", f"127.0.0.1:{metrics}"],
                              stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(tm)
        time.sleep(1)
        idle = mem_kib(tm.pid)["VmRSS"]
        load = subprocess.Popen([sys.executable, str(HERE / "traffic.py"), "load", "--target", f"http://127.0.0.1:{listen}",
                                 "--duration", str(args.seconds), "--concurrency", str(args.concurrency), "--mix", "ok",
                                 "--min-tokens", str(int(args.tokens * 0.8)), "--max-tokens", str(int(args.tokens * 1.2)),
                                 "--gap-ms", str(args.gap_ms), "--ttft-ms", "100"],
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(load)
        # Skip the ramp-up: the first few seconds have fewer streams open.
        time.sleep(min(5, args.seconds / 4))
        samples = []
        last_t, last_cpu = time.monotonic(), cpu_seconds(tm.pid)
        while load.poll() is None:
            time.sleep(1)
            if load.poll() is not None:
                break
            t, c = time.monotonic(), cpu_seconds(tm.pid)
            m = mem_kib(tm.pid)
            samples.append(((c - last_cpu) / (t - last_t), m["VmRSS"]))
            last_t, last_cpu = t, c
        client = json.loads(load.stdout.read().strip().splitlines()[-1])
        hwm = mem_kib(tm.pid)["VmHWM"]
        scrape = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics").read().decode()
        tokens = sum(float(line.rsplit(" ", 1)[1]) for line in scrape.splitlines()
                     if line.startswith("tokenmeter_output_tokens_total{"))
        cpus = sorted(s[0] for s in samples[:-1] or samples)
        rss = [s[1] for s in samples]
        print(json.dumps({
            "load": {"concurrency": args.concurrency, "gap_ms": args.gap_ms, "tokens_per_request": args.tokens,
                     "seconds": args.seconds},
            "achieved": {"token_events_per_second": client["events_per_second"], "requests": client["requests"],
                         "status": client["status"], "tokens_metered": tokens},
            "tokenmeter": {
                "cpu_cores_mean": round(sum(cpus) / len(cpus), 3),
                "cpu_cores_p90": round(cpus[int(len(cpus) * 0.9)], 3),
                "cpu_cores_max": round(cpus[-1], 3),
                "rss_mib_idle": round(idle / 1024, 1),
                "rss_mib_mean": round(sum(rss) / len(rss) / 1024, 1),
                "rss_mib_peak": round(hwm / 1024, 1),
            },
        }))
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
