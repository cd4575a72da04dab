#!/usr/bin/env bash
# Runs fuzz targets one after another, each for SECONDS (default 900), at the lowest CPU priority
# with one job and one worker, so a shared machine keeps its other cores.
#   fuzz/run.sh [SECONDS] [TARGET...]        (targets default to all five)
# Logs go to fuzz/logs/<target>.log (libFuzzer's last "#N DONE" line has the executions);
# crashes to fuzz/artifacts/<target>/. Needs cargo-fuzz and a nightly toolchain (or
# RUSTC_BOOTSTRAP=1 on stable, see README.md).
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-900}
shift || true
targets=("$@")
((${#targets[@]})) || targets=(sse ndjson extractors tap inject)
toolchain=${FUZZ_TOOLCHAIN:-+nightly}

[ -n "$(ls -A corpus/sse 2>/dev/null)" ] || ./seed.py || echo "run.sh: no seeds, starting empty"
mkdir -p logs
# -O with debug assertions: optimised, but integer overflow still panics.
nice -n 19 cargo $toolchain fuzz build -O -a
for t in "${targets[@]}"; do
  echo "$(date -Is) fuzzing $t for ${secs}s"
  nice -n 19 cargo $toolchain fuzz run -O -a "$t" -- \
    -jobs=1 -workers=1 -max_total_time="$secs" -dict=stream.dict -max_len=16400 \
    -print_final_stats=1 >"logs/$t.parent.log" 2>&1 || echo "$t: exited non-zero (crash?)"
  mv -f fuzz-0.log "logs/$t.log" 2>/dev/null || true
  grep -a -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units' "logs/$t.log" | tail -2 || true
done
