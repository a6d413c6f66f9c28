#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: install the missing wheels, compile every shipped kernel
# build, run the GPU tests, run the benchmark against the peers in the same process, and leave the
# logs + bench.json/png in $OUT. Usage (from the project root on the GPU machine):
#   bash scripts/gpu_check.sh [pytest -k expr] [bench args...]
set -uo pipefail
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# Cubins compiled on the development machine (same nvcc) travel in .cubin_cache when carried.
export HF_FLASHPATCH_CACHE=${HF_FLASHPATCH_CACHE:-$PWD/.cubin_cache}
TESTS=${GPU_TESTS:-tests/gpu}
BENCH_ARGS=${BENCH_ARGS:-}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu --format=csv
t0=$(date +%s)
if [ "${SKIP_COMPILE:-0}" != 1 ]; then  # the tests and benchmarks compile what they use anyway
  python3 -m hf_flashpatch.cli doctor --compile 2>&1 | tee "$OUT/doctor.log" | tail -n 25
fi
echo "compile stage: $(( $(date +%s) - t0 )) s"
python3 -m pytest -m gpu $TESTS -q -rs --durations=8 2>&1 | tee "$OUT/gpu_tests.log" | tail -n 40
echo "tests stage done at +$(( $(date +%s) - t0 )) s"
if [ -n "${EXTRA_CMD:-}" ]; then
  bash -c "$EXTRA_CMD" 2>&1 | tee "$OUT/extra.log" | tail -n 30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 scripts/bench.py --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -n 80
fi
echo "total: $(( $(date +%s) - t0 )) s"
