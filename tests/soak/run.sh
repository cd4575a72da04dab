#!/usr/bin/env bash
# Soak test (not part of CI): STREAMS concurrent streaming requests through a release
# tokenmeter for DURATION, against a streaming upstream. Samples tokenmeter's RSS, CPU, fds and
# in-flight gauges every INTERVAL into a CSV, then checks: memory flat (last-quarter mean live heap
# within 10% of the second quarter's and under 32 bytes per request over the second half; RSS
# with SOAK_MALLOC_STATS=0), the concurrency was held, gauges back to 0, no non-2xx and
# no errors at the load generator or in tokenmeter's counters. Exits non-zero if a check fails.
#
#   tests/soak/run.sh                 # 1,000 streams for 10 minutes
#   SOAK_DURATION=60 SOAK_STREAMS=200 tests/soak/run.sh
#
# Settings (environment): SOAK_DURATION seconds (600), SOAK_STREAMS (1000), SOAK_TOKENS per
# response (50), SOAK_GAP_MS between tokens (200), SOAK_TTFT_MS (200), SOAK_INTERVAL seconds
# between samples (5), SOAK_NICE (10: it shares the machine), SOAK_OUT (target/soak),
# SOAK_UPSTREAM: `sim` (tokenmeter sim, one decode step every SOAK_GAP_MS for every stream) or
# `python` (upstream.py, a stdlib-only streamer with jittered timing; SOAK_TTFT_MS applies to it),
# SOAK_MALLOC_STATS (1: record glibc malloc_stats() via gdb, and judge memory on the live heap; 0:
# judge RSS), SOAK_MALLOC_EVERY (6: every 6th sample, as gdb stops tokenmeter for ~0.5 s).
# The load generator is wrk and the heap probe gdb (Debian packages, installed when missing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."

duration=${SOAK_DURATION:-600}
streams=${SOAK_STREAMS:-1000}
tokens=${SOAK_TOKENS:-50}
gap_ms=${SOAK_GAP_MS:-200}
ttft_ms=${SOAK_TTFT_MS:-200}
interval=${SOAK_INTERVAL:-5}
niceness=${SOAK_NICE:-10}
out=${SOAK_OUT:-target/soak}
upstream=${SOAK_UPSTREAM:-sim}
malloc_stats=${SOAK_MALLOC_STATS:-1}
mkdir -p "$out"

# tokenmeter holds two sockets a stream (client side and upstream side): raise the soft limit.
hard=$(ulimit -Hn)
if [ "$hard" = unlimited ] || [ "$hard" -gt 65536 ]; then hard=65536; fi
ulimit -n "$hard"
if [ "$hard" -lt $((2 * streams + 256)) ]; then
  echo "soak: open-file limit $hard is too low for $streams streams" >&2
  exit 1
fi
need=()
command -v wrk >/dev/null || need+=(wrk)
if [ "$malloc_stats" = 1 ] && ! command -v gdb >/dev/null; then need+=(gdb); fi
if [ "${#need[@]}" -gt 0 ]; then
  echo "soak: installing ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "soak: building release"
if [ "$malloc_stats" = 1 ]; then
  # malloc_stats() is glibc's: the heap probe reads the system allocator, so this build leaves
  # out the built-in jemalloc (docs/soak.md). It replaces target/release/tokenmeter.
  nice -n "$niceness" cargo build --release --locked --quiet --no-default-features
else
  nice -n "$niceness" cargo build --release --locked --quiet
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port)
proxy_port=$(free_port)
metrics_port=$(free_port)

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

if [ "$upstream" = sim ]; then
  # One decode step every GAP for every running stream, whatever their number.
  nice -n "$niceness" target/release/tokenmeter sim --listen "127.0.0.1:$up_port" \
    --step-base "${gap_ms}ms" --step-per-seq 0ms --max-batch "$((streams * 2))" \
    --output-tokens "$tokens-$tokens" >"$out/upstream.log" 2>&1 &
else
  nice -n "$niceness" python3 "$here/upstream.py" "$up_port" --tokens "$tokens" \
    --gap-ms "$gap_ms" --ttft-ms "$ttft_ms" >"$out/upstream.log" 2>&1 &
fi
up_pid=$!
pids+=("$up_pid")
TOKENMETER_LOG=warn nice -n "$niceness" target/release/tokenmeter \
  --upstream "http://127.0.0.1:$up_port" --listen "127.0.0.1:$proxy_port" \
  --metrics-listen "127.0.0.1:$metrics_port" >"$out/tokenmeter.log" 2>&1 &
tm_pid=$!
pids+=("$tm_pid")

# Both must be up before the load starts (tokenmeter is ready without its upstream, by design).
for _ in $(seq 300); do
  curl -fsS "http://127.0.0.1:$metrics_port/readyz" >/dev/null 2>&1 &&
    (exec 3<>"/dev/tcp/127.0.0.1/$up_port") 2>/dev/null && break
  sleep 0.1
done
curl -fsS "http://127.0.0.1:$metrics_port/readyz" >/dev/null
(exec 3<>"/dev/tcp/127.0.0.1/$up_port") 2>/dev/null || { echo "soak: upstream did not start" >&2; exit 1; }

echo "soak: $streams streams for ${duration}s ($tokens tokens ${gap_ms} ms apart each); output in $out/"
nice -n "$niceness" wrk -t1 -c"$streams" -d"${duration}s" --timeout 120s -s "$here/soak.lua" \
  "http://127.0.0.1:$proxy_port/v1/chat/completions" >"$out/wrk.txt" 2>&1 &
wrk_pid=$!
pids+=("$wrk_pid")

# glibc's malloc_stats() through gdb every SOAK_MALLOC_EVERY-th sample: the live heap, which the
# memory check judges (RSS alone climbs for minutes toward what malloc holds: docs/soak.md).
malloc_args=()
if [ "$malloc_stats" = 1 ]; then
  malloc_args=(--malloc-stats "$out/tokenmeter.log" --malloc-every "${SOAK_MALLOC_EVERY:-6}")
fi
python3 "$here/monitor.py" sample --pid "$tm_pid" --metrics "http://127.0.0.1:$metrics_port/metrics" \
  --csv "$out/samples.csv" --while-pid "$wrk_pid" --interval "$interval" "${malloc_args[@]}"
wait "$wrk_pid" || true
curl -fsS "http://127.0.0.1:$metrics_port/metrics" >"$out/metrics.txt"

# A clean stop: SIGTERM with nothing in flight must exit 0.
kill -TERM "$tm_pid"
tm_rc=0
wait "$tm_pid" || tm_rc=$?
kill -TERM "$up_pid"
wait "$up_pid" || true

echo
cat "$out/wrk.txt"
grep '^upstream ' "$out/upstream.log" || true
echo
rc=0
python3 "$here/monitor.py" check --csv "$out/samples.csv" --wrk "$out/wrk.txt" \
  --scrape "$out/metrics.txt" --streams "$streams" || rc=1
if [ "$tm_rc" = 0 ]; then
  echo "PASS  clean exit: tokenmeter exited 0 on SIGTERM"
else
  echo "FAIL  clean exit: tokenmeter exited $tm_rc on SIGTERM"
  rc=1
fi
exit "$rc"
