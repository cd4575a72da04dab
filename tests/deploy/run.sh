#!/usr/bin/env bash
# tests/deploy/run.sh: the checks for grafana/, deploy/, the Dockerfile and docs/runbook.md.
#
#   1. rules: the PrometheusRule matches rules.yml; `promtool check rules`; the unit tests'
#      group_eval_order names every group in rules.yml's order (rule_order.py); `promtool test
#      rules` (tests/deploy/rules_test.yml: each alert firing and not firing on crafted series).
#   2. static: dashboard structure and metric names (check_dashboard.py); every overlay built
#      and every object validated offline against the Kubernetes and Prometheus Operator
#      schemas, wiring, runbook anchors, the plain scrape config (check_manifests.py); the
#      Dockerfile and .dockerignore (check_dockerfile.py).
#   3. live: `cargo build --release`, then a real Prometheus scrapes two tokenmeters carrying
#      live traffic, and every dashboard query and recording rule must return data; the bill
#      for a range from it (`tokenmeter cost --prometheus`) must be what the two proxies'
#      counters moved (bill.py); the sidecar's drain hook must wait for open streams
#      (live_test.py, about a minute); then
#      vLLM's own dashboard queries against tokenmeter --compat vllm in front of the simulator,
#      and `promtool check metrics` on every mode's exposition, once each holds every capacity
#      series (compat_test.py, ~15 s).
#   4. fleet: the series one pod exports with one model in all 9 concurrency bands, counted
#      family by family against the budget (series_budget.py, ~45 s); several pods scraped by
#      Prometheus in agent mode, remote_write into VictoriaMetrics, the recording rules in
#      vmalert, and the fleet's tokens/s, per GPU and percentiles checked there against the
#      load; beside it, a cluster Prometheus with the rules federated by a global one; the
#      bill for a range from VictoriaMetrics and from the cluster Prometheus, against the two
#      pods' counters (fleet_test.py, ~60 s).
# Each live check waits for what it checks (a fit, a scrape, a rule's evaluation, a remote
# write) up to a deadline, never for a fixed time; a pass returns as soon as it holds.
#
# On a fresh Debian machine it installs what it needs: the prometheus package (prometheus and
# promtool), victoria-metrics (the store and vmalert) and python3-venv with apt, and the
# Python packages in a virtualenv under ${TOKENMETER_DEPLOY_VENV:-~/.cache/tokenmeter/deploy-venv}. kustomize is `kubectl kustomize`
# where kubectl exists; elsewhere tests/deploy/kustomize_lite.py (no Debian/PyPI/npm package of
# kustomize exists). Runs every check, then exits non-zero if any failed.
#
# Environment: TOKENMETER_BIN (skip the build, use this binary), LIVE_TRAFFIC_SECONDS,
# FLEET_TRAFFIC_SECONDS (the least traffic those two judge), BUDGET_LEVEL_SECONDS.
set -uo pipefail
export PYTHONDONTWRITEBYTECODE=1
cd "$(dirname "$0")/../.."
here=tests/deploy

apt_install() {
  echo "tests/deploy: installing $*"
  if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
command -v git >/dev/null 2>&1 || missing+=(git)
# The fleet test's central store and rule evaluator: one Debian package ships both.
command -v victoria-metrics >/dev/null 2>&1 || missing+=(victoria-metrics)
command -v vmalert >/dev/null 2>&1 || missing+=(victoria-metrics)
if ((${#missing[@]})); then
  apt_install $(printf '%s\n' "${missing[@]}" | sort -u) || { echo "tests/deploy: apt-get install failed"; exit 1; }
fi

venv="${TOKENMETER_DEPLOY_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenmeter/deploy-venv}"
py_packages=(PyYAML==6.0.3 kubernetes-validate==1.37.0 cloudcoil-models-prometheus-operator==0.80.1.0 cloudcoil-models-keda==2.16.1.0 dockerfile==3.4.0)
stamp="$venv/.tokenmeter-packages"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "${py_packages[*]}" ]; then
  echo "tests/deploy: preparing $venv"
  if ! python3 -m venv --clear "$venv" 2>/dev/null; then
    apt_install python3-venv python3-pip && python3 -m venv --clear "$venv" ||
      { echo "tests/deploy: cannot create a virtualenv"; exit 1; }
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "${py_packages[@]}" ||
    { echo "tests/deploy: pip install ${py_packages[*]} failed"; exit 1; }
  echo "${py_packages[*]}" >"$stamp"
fi
vpy="$venv/bin/python"

passed=0
failed=0
failures=()
check() {
  local name=$1
  shift
  printf '\n--- %s\n' "$name"
  if "$@"; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    failures+=("$name")
  fi
}

check "rules: PrometheusRule is a copy of rules.yml" python3 $here/sync_rules.py
check "rules: promtool check rules" promtool check rules deploy/prometheus/rules.yml
check "rules: rules_test.yml evaluates every group, in an order that reads recordings after they are made" \
  "$vpy" $here/rule_order.py
check "rules: promtool test rules (each alert firing and not firing)" promtool test rules $here/rules_test.yml
check "dashboard: structure, variables, metric names" python3 $here/check_dashboard.py
check "manifests: overlays build, schemas, wiring, runbooks, scrape config" "$vpy" $here/check_manifests.py
check "image: Dockerfile and .dockerignore" "$vpy" $here/check_dockerfile.py

build_release() {
  if [ -n "${TOKENMETER_BIN:-}" ]; then
    echo "using TOKENMETER_BIN=$TOKENMETER_BIN"
    return 0
  fi
  cargo build --release --locked --bin tokenmeter
}
if check "live: cargo build --release" build_release; then
  check "live: Prometheus scrapes live traffic; every panel and recording rule has data" \
    "$vpy" $here/live_test.py
  check "compat: vLLM's dashboard queries return data; promtool check metrics in every mode" \
    "$vpy" $here/compat_test.py
  check "fleet: series per pod, one model, 9 bands, against the budget" \
    "$vpy" $here/series_budget.py
  check "fleet: Prometheus remote_write into VictoriaMetrics; vmalert's rules and the dashboard there" \
    "$vpy" $here/fleet_test.py
else
  failed=$((failed + 1))
  failures+=("live: not run (build failed)")
fi

echo
for f in "${failures[@]+"${failures[@]}"}"; do echo "FAILED: $f"; done
echo "deploy checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
