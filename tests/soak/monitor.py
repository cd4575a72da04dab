#!/usr/bin/env python3
"""Samples tokenmeter during the soak test, then judges the run (Python stdlib only).

  monitor.py sample --pid PID --metrics URL --csv FILE --while-pid WRK_PID [--interval 5]
                    [--malloc-stats TOKENMETER_STDERR_LOG [--malloc-every 6]]
      Every INTERVAL seconds while the load generator runs, appends a CSV row: tokenmeter's RSS,
      CPU time, open file descriptors and threads (from /proc), the in-flight gauges and request
      counters (from /metrics), and every MALLOC_EVERY-th row glibc's malloc totals (via gdb). When the load stops, it samples every second until both in-flight
      gauges are 0 (at most 60 s), so a leaked gauge shows as a non-zero last row.

  monitor.py check --csv FILE --wrk FILE --scrape FILE --streams N
      Prints the figures and PASS/FAIL for each check; exits 1 if any failed.
"""

import argparse
import csv
import os
import re
import subprocess
import sys
import time
import urllib.request

FIELDS = ["t_s", "phase", "rss_kb", "cpu_s", "fds", "threads", "prefill", "decode",
          "requests", "complete", "client_disconnect", "upstream_error", "timeout",
          "non_200", "output_tokens", "parse_errors", "loadavg",
          "heap_arenas", "heap_system_kb", "heap_in_use_kb"]
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and not line.startswith("#"):
            out.append((m[1], dict(LABEL.findall(m[2] or "")), float(m[3])))
    return out


def total(samples, name, **want):
    return sum(v for n, l, v in samples
               if n == name and all(l.get(k) == w for k, w in want.items()))


def proc(pid):
    """RSS (KiB), CPU seconds, open fds and threads of a process, from /proc."""
    status = open(f"/proc/{pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status)[1])
    threads = int(re.search(r"Threads:\s+(\d+)", status)[1])
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu, len(os.listdir(f"/proc/{pid}/fd")), threads


def malloc_stats(pid, log):
    """glibc malloc's own account of tokenmeter's heap: (arenas, system KiB, in-use KiB).

    gdb attaches for about half a second and calls malloc_stats(), which prints to tokenmeter's
    stderr (LOG); the last block there is this call's. "system" is what malloc holds from the
    kernel (heap and mmap), "in use" is what the program has allocated and not freed: the live
    heap. RSS rising while "in use" is flat is the allocator keeping memory, not a leak.
    """
    with open(log, "rb") as f:
        f.seek(0, os.SEEK_END)
        start = f.tell()
    subprocess.run(["gdb", "-p", str(pid), "-batch", "-nx", "-ex", "call (void)malloc_stats()"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60, check=False)
    with open(log, "rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    total = text.rsplit("Total (incl. mmap):", 1)
    if len(total) != 2:
        return "", "", ""
    nums = re.findall(r"= +(\d+)", total[1])
    return len(re.findall(r"^Arena \d+:", total[0], re.M)), int(nums[0]) // 1024, int(nums[1]) // 1024


def row(pid, metrics, t0, phase):
    rss, cpu, fds, threads = proc(pid)
    s = parse(urllib.request.urlopen(metrics, timeout=10).read().decode())
    req = "tokenmeter_requests_total"
    return {
        "t_s": round(time.monotonic() - t0, 1), "phase": phase, "rss_kb": rss,
        "cpu_s": round(cpu, 2), "fds": fds, "threads": threads,
        "prefill": total(s, "tokenmeter_requests_in_flight", phase="prefill"),
        "decode": total(s, "tokenmeter_requests_in_flight", phase="decode"),
        "requests": total(s, req),
        "complete": total(s, req, outcome="complete"),
        "client_disconnect": total(s, req, outcome="client_disconnect"),
        "upstream_error": total(s, req, outcome="upstream_error"),
        "timeout": total(s, req, outcome="timeout"),
        "non_200": total(s, req) - total(s, req, code="200"),
        "output_tokens": total(s, "tokenmeter_output_tokens_total"),
        "parse_errors": total(s, "tokenmeter_parse_errors_total"),
        # The machine is shared: the 1-minute load average says how contended the run was.
        "loadavg": float(open("/proc/loadavg").read().split()[0]),
    }


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def sample(a):
    t0 = time.monotonic()
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        n = 0
        while alive(a.while_pid):
            r = row(a.pid, a.metrics, t0, "load")
            if a.malloc_stats and n % a.malloc_every == 0:
                r["heap_arenas"], r["heap_system_kb"], r["heap_in_use_kb"] = malloc_stats(
                    a.pid, a.malloc_stats)
            n += 1
            w.writerow(r)
            f.flush()
            time.sleep(a.interval)
        end = time.monotonic() + 60
        while True:
            r = row(a.pid, a.metrics, t0, "after")
            w.writerow(r)
            f.flush()
            if (r["prefill"] == 0 and r["decode"] == 0) or time.monotonic() > end:
                break
            time.sleep(1)


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def check(a):
    rows = list(csv.DictReader(open(a.csv)))
    load = [r for r in rows if r["phase"] == "load"]
    wrk = dict(kv.split("=") for kv in open(a.wrk).read().split("WRK ", 1)[1].split())
    s = parse(open(a.scrape).read())
    req = "tokenmeter_requests_total"
    results = []

    def verdict(name, ok, detail):
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")

    q = len(load) // 4

    def quarters(rows, field):
        """Mean of FIELD over the 2nd and the last quarter of the load, and their ratio."""
        q2 = [float(r[field]) for r in rows[q:2 * q] if r[field]]
        q4 = [float(r[field]) for r in rows[3 * q:] if r[field]]
        return mean(q2), mean(q4), (mean(q4) / mean(q2) if q2 and q4 else float("nan"))

    def growth(field):
        """(bytes, requests) grown over the second half, between its first and last values."""
        half = [r for r in load[len(load) // 2:] if r.get(field)]
        if len(half) < 2:
            return float("nan"), 0
        return ((float(half[-1][field]) - float(half[0][field])) * 1024,
                float(half[-1]["requests"]) - float(half[0]["requests"]))

    def slope(field):
        """Bytes per request of FIELD over the second half, as the median of the slopes between
        every two samples (Theil-Sen): a leak's rate, which a burst of allocations caught at
        either end of the half (one happens at about 32,000 requests, docs/soak.md) can't sway."""
        half = [(float(r["requests"]), float(r[field]) * 1024)
                for r in load[len(load) // 2:] if r.get(field)]
        slopes = sorted((y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(half)
                        for x2, y2 in half[i + 1:] if x2 != x1)
        if not slopes:
            return float("nan")
        mid = len(slopes) // 2
        return slopes[mid] if len(slopes) % 2 else (slopes[mid - 1] + slopes[mid]) / 2

    print(f"samples: {len(load)} under load over {load[-1]['t_s']} s, {len(rows) - len(load)} after")
    q2, q4, ratio = quarters(load, "rss_kb")
    rss = [float(r["rss_kb"]) / 1024 for r in load]
    print(f"rss MiB: min {min(rss):.1f}  max {max(rss):.1f}  2nd-quarter mean {q2 / 1024:.1f}"
          f"  last-quarter mean {q4 / 1024:.1f}  ratio {ratio:.3f}")
    # A leak grows with the work done; an allocator's high-water mark does not. Bytes per request
    # over the second half of the run tell them apart.
    grown, served = growth("rss_kb")
    print(f"rss growth over the second half: {grown / 2**20:+.1f} MiB for {served:.0f} requests"
          f" ({grown / max(served, 1):+.0f} bytes per request)")
    # With malloc_stats() recorded (SOAK_MALLOC_STATS=1, the default), the verdict is on the live
    # heap: RSS also counts pages of long-allocated buffers touched for the first time, and it
    # climbs for minutes toward what malloc holds while the live heap is flat (docs/soak.md).
    heap = [r for r in load if r.get("heap_in_use_kb")]
    if len(heap) >= 8:
        h2, h4, hratio = quarters(load, "heap_in_use_kb")
        hgrown, hserved = growth("heap_in_use_kb")
        per_request = slope("heap_in_use_kb")
        system = max(float(r["heap_system_kb"]) for r in heap) / 1024
        print(f"malloc in use MiB (live heap): 2nd-quarter mean {h2 / 1024:.1f}  last-quarter mean"
              f" {h4 / 1024:.1f}  ratio {hratio:.3f};  over the second half {hgrown / 2**20:+.2f} MiB"
              f" for {hserved:.0f} requests, median slope {per_request:+.1f} bytes per request")
        print(f"malloc system MiB (held from the kernel): max {system:.1f}  (arenas:"
              f" {max(int(r['heap_arenas']) for r in heap)})")
        # 32 bytes is glibc's smallest chunk on 64-bit: one leaked object per request fails.
        verdict("memory flat", hratio <= 1.10 and per_request < 32,
                f"live heap: last-quarter mean {hratio:.3f}x the 2nd quarter's (limit 1.10),"
                f" {per_request:+.1f} bytes per request over the second half (limit 32)")
    else:
        verdict("memory flat", ratio <= 1.10,
                f"last-quarter mean RSS is {ratio:.3f}x the 2nd quarter's (limit 1.10; no malloc"
                " stats recorded, so RSS, which climbs for minutes before it settles: docs/soak.md)")
    steady = load[q:]
    flight = [float(r["prefill"]) + float(r["decode"]) for r in steady]
    print(f"in flight (after the first quarter): min {min(flight):.0f}  mean {mean(flight):.0f}"
          f"  max {max(flight):.0f}")
    cpu = (float(load[-1]["cpu_s"]) - float(load[0]["cpu_s"])) / max(
        float(load[-1]["t_s"]) - float(load[0]["t_s"]), 1e-9)
    print(f"tokenmeter cpu: {cpu * 100:.0f}% of one core on average;  fds max"
          f" {max(int(r['fds']) for r in load)};  threads max {max(int(r['threads']) for r in load)}")
    loads = [float(r["loadavg"]) for r in load]
    print(f"machine load average (1 min, {os.cpu_count()} cores): min {min(loads):.1f}"
          f"  mean {mean(loads):.1f}  max {max(loads):.1f}")
    secs = int(wrk["duration_us"]) / 1e6
    print(f"wrk: {wrk['requests']} responses in {secs:.0f} s ({int(wrk['requests']) / secs:.1f}/s),"
          f" {int(wrk['bytes']) / 2**20:.0f} MiB, latency p50 {wrk['p50_ms']} ms p99 {wrk['p99_ms']} ms")
    out_tok = total(s, "tokenmeter_output_tokens_total")
    print(f"tokenmeter: {total(s, req):.0f} requests, {total(s, req, outcome='complete'):.0f} complete,"
          f" {total(s, req, outcome='client_disconnect'):.0f} client_disconnect (cut when the load"
          f" stopped), {out_tok:.0f} output tokens ({out_tok / secs:.0f}/s)")

    verdict("concurrency held", mean(flight) >= 0.9 * a.streams,
            f"mean {mean(flight):.0f} streams in flight, wanted >= {0.9 * a.streams:.0f}")
    last = rows[-1]
    verdict("gauges back to 0", float(last["prefill"]) == 0 and float(last["decode"]) == 0,
            f"prefill {last['prefill']}, decode {last['decode']} at t={last['t_s']} s")
    errs = {k: int(wrk[k]) for k in ("non2xx", "connect", "read", "write", "timeout")}
    verdict("load generator saw no errors", not any(errs.values()), str(errs))
    non200 = total(s, req) - total(s, req, code="200")
    bad = {"non_200": non200,
           "upstream_error": total(s, req, outcome="upstream_error"),
           "timeout": total(s, req, outcome="timeout"),
           "parse_errors": total(s, "tokenmeter_parse_errors_total")}
    verdict("tokenmeter counted no errors", not any(bad.values()), str(bad))
    cut = total(s, req, outcome="client_disconnect")
    verdict("only the streams open at the end were cut", cut <= a.streams,
            f"{cut:.0f} client_disconnect <= {a.streams}")
    verdict("every response counted", total(s, req, outcome="complete") >= int(wrk["requests"]),
            f"{total(s, req, outcome='complete'):.0f} complete >= {wrk['requests']} wrk responses")
    return 0 if all(results) else 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("--pid", type=int, required=True)
    s.add_argument("--metrics", required=True)
    s.add_argument("--csv", required=True)
    s.add_argument("--while-pid", type=int, required=True)
    s.add_argument("--interval", type=float, default=5)
    s.add_argument("--malloc-stats", metavar="LOG",
                   help="also record glibc malloc_stats() (via gdb) into the CSV; LOG is tokenmeter's stderr")
    s.add_argument("--malloc-every", type=int, default=6, help="every Nth sample (gdb pauses it)")
    c = sub.add_parser("check")
    c.add_argument("--csv", required=True)
    c.add_argument("--wrk", required=True)
    c.add_argument("--scrape", required=True)
    c.add_argument("--streams", type=int, required=True)
    a = p.parse_args()
    sys.exit(sample(a) if a.cmd == "sample" else check(a))


if __name__ == "__main__":
    main()
