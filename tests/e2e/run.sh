#!/usr/bin/env bash
# The real-server check: tokenmeter in front of a real vLLM (CPU), driven by GuideLLM, the
# `openai` SDK and `curl -N`, compared with vLLM's and the clients' own figures.
# Writes docs/validation.md and exits non-zero on any disagreement. See tests/e2e/README.md.
#
# Environment (all optional):
#   TOKENMETER_E2E_PREFIX   cache for virtualenvs and models (default /opt/tokenmeter-e2e)
#   TOKENMETER_E2E_OUT      logs and raw client reports (default target/e2e)
#   TOKENMETER_E2E_REPORT   the markdown report (default docs/validation.md)
#   E2E_SECONDS             seconds per GuideLLM level (default 15)
#   E2E_MODEL_ARGS          make_model.py size flags (default "--hidden 512 --layers 4 --heads 8")
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
PREFIX=${TOKENMETER_E2E_PREFIX:-/opt/tokenmeter-e2e}
OUT=${TOKENMETER_E2E_OUT:-$REPO/target/e2e}
REPORT=${TOKENMETER_E2E_REPORT:-$REPO/docs/validation.md}
MODEL_ARGS=${E2E_MODEL_ARGS:---hidden 512 --layers 4 --heads 8}
export TOKENMETER_E2E_PREFIX=$PREFIX

log() { echo "[e2e $(date +%H:%M:%S)] $*" >&2; }
die() { echo "[e2e] FAIL: $*" >&2; echo "e2e: 0 passed, 1 failed"; exit 1; }
t0=$(date +%s)

# Never skip silently: a missing prerequisite is a failure with its name.
for tool in curl cargo python3; do
  command -v "$tool" >/dev/null || die "'$tool' is not installed"
done
python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' || die "python3 >= 3.10 is needed"

log "installing (skipped when cached) into $PREFIX"
bash "$HERE/install.sh" || die "installing vLLM / GuideLLM failed"

# Models are cached by the generator's own content and flags: changing either rebuilds.
build_model() { # build_model NAME FLAGS...
  local name=$1; shift
  local key
  key=$( { cat "$HERE/make_model.py"; echo "$*"; } | sha256sum | cut -c1-16)
  local dir="$PREFIX/models/$name-$key"
  if [ ! -f "$dir/.ok" ]; then
    log "building model $name ($*)"
    rm -rf "$dir"; mkdir -p "$PREFIX/models"
    HF_HUB_OFFLINE=1 "$PREFIX/vllm/bin/python" "$HERE/make_model.py" "$dir" "$@" > "$dir.json" \
      || die "building the model $name failed"
    touch "$dir/.ok"
  fi
  echo "$dir"
}
# shellcheck disable=SC2086 # MODEL_ARGS is a list of flags
MODEL=$(build_model tiny $MODEL_ARGS)
# shellcheck disable=SC2086
BYTES_MODEL=$(build_model tiny-bytes $MODEL_ARGS --full-byte-alphabet)

log "building tokenmeter (release)"
(cd "$REPO" && cargo build --release --quiet) || die "cargo build --release failed"

mkdir -p "$OUT" "$(dirname "$REPORT")"
log "running the check (vLLM starts take 30-120 s each)"
set +e
"$PREFIX/clients/bin/python" "$HERE/validate.py" \
  --tokenmeter "$REPO/target/release/tokenmeter" \
  --vllm-python "$PREFIX/vllm/bin/python" \
  --clients-bin "$PREFIX/clients/bin" \
  --model "$MODEL" --bytes-model "$BYTES_MODEL" --model-info "$MODEL.json" \
  --out-dir "$OUT" --report "$REPORT" --repo "$REPO" \
  --seconds "${E2E_SECONDS:-15}"
rc=$?
set -e
log "done in $(( $(date +%s) - t0 )) s (exit $rc); report $REPORT, logs in $OUT"
exit $rc
