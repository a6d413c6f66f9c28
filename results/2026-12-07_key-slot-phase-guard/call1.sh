#!/bin/bash
# Call 1 (any card): the K slot's own barriers. Before: `rm -rf ab && mkdir -p ab/main ab/new && git archive HEAD cuda
# hf_flashpatch | tar -x -C ab/main && git apply results/2026-12-07_key-slot-phase-guard/draft_key_slot_phase_guard.diff
# && cp -r cuda hf_flashpatch ab/new/`. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
(python3 results/2026-12-07_d64-dealt-walk/sass_compare.py ab/main ab/new > $OUT/sass.log 2>&1) &
HF_FLASHPATCH_CACHE=/tmp/cT timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py \
  tests/gpu/test_forward_walks.py > $OUT/forward_tests.log 2>&1
tail -3 $OUT/forward_tests.log
wait
cat $OUT/sass.log
timeout 280 python3 scripts/ab_kernels.py --tree main=ab/main --tree new=ab/new --rounds 5 \
  --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -A12 "after round 5" $OUT/ab.log | grep -E "case|graph"
echo "total $(( $(date +%s) - START )) s"
