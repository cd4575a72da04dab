#!/usr/bin/env bash
# The loopback benchmark: direct / nginx / tokenmeter / tokenmeter --inject-usage, side by side.
#
#   benches/loopback/run.sh [--rounds N] [--only LIST] [--variant 'NAME=BIN FLAGS'] ...
#
# Installs nginx-light when it is missing (Debian), raises the open-files limit to its hard
# limit (the hold scenario keeps 10,000 streams open: two descriptors each in a proxy), then runs
# `cargo bench --bench loopback` with the arguments given. The table is printed and written to
# target/loopback/report.md, every figure of every round to target/loopback/results.json.
# docs/bench.md says what each figure means. A full run takes about 15 minutes.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  echo "loopback: installing nginx-light"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
ulimit -n "$(ulimit -Hn)"
echo "loopback: open files limit $(ulimit -n); load average $(cut -d' ' -f1-3 /proc/loadavg)"
exec cargo bench --locked --bench loopback -- "$@"
