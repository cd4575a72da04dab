#!/usr/bin/env bash
# The page in a real browser (tests/ui/browser.py): headless Chromium loads it while
# `tokenmeter demo` runs. Installs Debian's chromium when it is missing; screenshots go to
# target/ui/. `tests/ui/run.sh --update-docs` also refreshes docs/ui.png.
set -euo pipefail
cd "$(dirname "$0")/../.."

if ! command -v chromium >/dev/null 2>&1; then
  echo "tests/ui/run.sh: installing chromium"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
command -v python3 >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
}
cargo build --locked --quiet --bin tokenmeter
exec python3 tests/ui/browser.py "$@"
