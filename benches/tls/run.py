#!/usr/bin/env python3
"""The cost of TLS on tokenmeter's upstream side, per chunk, against plain HTTP, in one run.

    benches/tls/run.py [--rounds N] [--requests N] [--concurrency N] [--output-tokens N]

Three tokenmeters (release build) forward to one `tokenmeter sim` through one nginx, which
listens three ways: plain HTTP, TLS with HTTP/1.1 only, and TLS with HTTP/2 by ALPN. Only the
hop from tokenmeter to nginx differs between them, so:

- tokenmeter's own CPU time per chunk (utime + stime from /proc, the chunks counted by the
  client) shows what TLS costs tokenmeter: decrypting each chunk, and the handshakes;
- the client's ITL and TTFT (`tokenmeter bench`) show the latency it adds end to end, with
  nginx's encryption of each chunk included.

The tokenmeters are pinned to core 0; nginx, the simulator and the load to core 1. The rounds
alternate the targets (rotating their order), and the report gives per-round ratios to the plain
target and their medians: the machine is shared, so only same-round ratios are compared. The
certificates are made with the openssl command (a Debian package) in a temporary directory.
Writes target/tls-bench/report.md and results.json.
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / "target" / "release" / "tokenmeter"
OUT = ROOT / "target" / "tls-bench"
TICKS = os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, proc, name, limit=20.0):
    start = time.time()
    while time.time() - start < limit:
        if proc.poll() is not None:
            sys.exit(f"{name} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{name} did not listen on {port}")


def cpu_seconds(pid):
    # Fields 14 and 15 of /proc/PID/stat (after the parenthesised command name).
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def make_certs(d):
    def run(*args):
        subprocess.run(["openssl", *args], check=True, cwd=d, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=tokenmeter bench ca")
    run("req", *ec, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=localhost")
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run("x509", "-req", "-in", "tls.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "tls.crt", "-days", "2", "-extfile", "san.ext")


def nginx_conf(d, sim, plain, h1, h2):
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body;
  proxy_temp_path {d}/proxy;
  fastcgi_temp_path {d}/fastcgi;
  uwsgi_temp_path {d}/uwsgi;
  scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
  upstream sim {{ server 127.0.0.1:{sim}; keepalive 256; }}
  ssl_certificate {d}/tls.crt;
  ssl_certificate_key {d}/tls.key;
  ssl_protocols TLSv1.3;
  server {{ listen 127.0.0.1:{plain}; include {d}/proxy.conf; }}
  server {{ listen 127.0.0.1:{h1} ssl; include {d}/proxy.conf; }}
  server {{ listen 127.0.0.1:{h2} ssl http2; include {d}/proxy.conf; }}
}}
"""


PROXY_CONF = """location / {
  proxy_pass http://sim;
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--smoke", action="store_true", help="one short round")
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.requests, args.concurrency, args.output_tokens = 1, 8, 4, 16
    if not BIN.exists():
        sys.exit(f"{BIN} is missing: cargo build --release --locked --bin tokenmeter")
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(nginx).exists():
        sys.exit("nginx is missing: apt-get install nginx-light")
    if not shutil.which("openssl"):
        sys.exit("openssl is missing: apt-get install openssl")
    OUT.mkdir(parents=True, exist_ok=True)
    procs = []
    work = Path(tempfile.mkdtemp(prefix="tokenmeter-tls-bench-"))

    def start(cmd, core, name, port, env=None):
        p = subprocess.Popen(["taskset", "-c", str(core), *cmd], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
        procs.append(p)
        wait_port(port, p, name)
        return p

    try:
        make_certs(work)
        for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"]:
            (work / sub).mkdir()
        sim, plain, h1, h2 = (free_port() for _ in range(4))
        # A fast simulator: 1 ms decode steps, so one stream is 1,000 chunks/s.
        start([str(BIN), "sim", "--listen", f"127.0.0.1:{sim}", "--step-base", "1ms",
               "--step-per-seq", "0ms", "--prefill-per-token", "0ms"], 1, "sim", sim)
        (work / "proxy.conf").write_text(PROXY_CONF)
        (work / "nginx.conf").write_text(nginx_conf(work, sim, plain, h1, h2))
        start([nginx, "-p", str(work), "-e", str(work / "error.log"), "-c",
               str(work / "nginx.conf")], 1, "nginx", plain)
        targets = {
            "http": f"http://127.0.0.1:{plain}",
            "https-h1": f"https://localhost:{h1}",
            "https-h2": f"https://localhost:{h2}",
        }
        running = {}
        for name, up in targets.items():
            port, mport = free_port(), free_port()
            cmd = [str(BIN), "--upstream", up, "--listen", f"127.0.0.1:{port}",
                   "--metrics-listen", f"127.0.0.1:{mport}", "--gpus", "1"]
            if up.startswith("https"):
                cmd += ["--upstream-ca", str(work / "ca.pem")]
            p = start(cmd, 0, name, port, {"TOKENMETER_LOG": "warn"})
            running[name] = (p, port)

        rounds = []
        names = list(targets)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            row = {}
            for name in order:
                p, port = running[name]
                out = work / f"bench-{name}-{r}"
                before = cpu_seconds(p.pid)
                subprocess.run(
                    ["taskset", "-c", "1", str(BIN), "bench", "--target",
                     f"http://127.0.0.1:{port}", "--concurrency", str(args.concurrency),
                     "--requests", str(args.requests), "--output-tokens",
                     str(args.output_tokens), "--out", str(out)],
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                cpu = cpu_seconds(p.pid) - before
                level = json.loads((out / "bench.json").read_text())["levels"][0]
                if level["errors"]:
                    sys.exit(f"{name}: {level['errors']} errors: {level['error_kinds']}")
                chunks = level["output_tokens"]
                row[name] = {
                    "cpu_us_per_chunk": cpu * 1e6 / chunks,
                    "chunks": chunks,
                    "itl_p50_ms": level["itl"]["p50"] * 1e3,
                    "itl_p99_ms": level["itl"]["p99"] * 1e3,
                    "ttft_p50_ms": level["ttft"]["p50"] * 1e3,
                    "ttft_p10_ms": level["ttft"]["p10"] * 1e3,
                    "agg_tps": level["aggregate_tps"],
                }
            rounds.append(row)
            print(f"round {r + 1}: " + ", ".join(
                f"{n} {row[n]['cpu_us_per_chunk']:.2f} us/chunk" for n in names), flush=True)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)

    def med(name, key):
        return statistics.median(r[name][key] for r in rounds)

    def ratio(name, key):
        # A smoke run can take less CPU than one clock tick.
        return statistics.median(
            r[name][key] / r["http"][key] if r["http"][key] else float("nan") for r in rounds)

    lines = [
        f"{args.rounds} rounds of {args.requests} requests x {args.output_tokens} tokens at "
        f"concurrency {args.concurrency}; medians, and the median of same-round ratios to http",
        "",
        "| upstream | CPU us/chunk | ratio | ITL p99 ms | TTFT p10 ms | TTFT p50 ms | agg tok/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for n in names:
        lines.append(
            f"| {n} | {med(n, 'cpu_us_per_chunk'):.2f} | {ratio(n, 'cpu_us_per_chunk'):.2f} | "
            f"{med(n, 'itl_p99_ms'):.2f} | {med(n, 'ttft_p10_ms'):.2f} | "
            f"{med(n, 'ttft_p50_ms'):.2f} | {med(n, 'agg_tps'):.0f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    (OUT / "report.md").write_text(report)
    (OUT / "results.json").write_text(json.dumps({"settings": vars(args), "rounds": rounds},
                                                 indent=1))


if __name__ == "__main__":
    main()
