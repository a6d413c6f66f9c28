#!/bin/bash
# Call 2 cut to what 240 s of device time can hold after a start (about 130 s of command): the accuracy tests
# where call 1 failed (192/128 forward against the oracle, within twice torch's bf16 error) and the d128 forward
# tests (test_forward.py: every length, mha/gqa/mqa, causal and not, against the oracle), then one A/B round of
# the d128 kernel time while time is left. Carry .whl and ab.
# The tree: main with tag s58-held-reference-rounding-draft's cuda/ and hf_flashpatch/kernels/ checked out.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
HF_FLASHPATCH_CACHE=/tmp/cA timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider -x \
  tests/gpu/test_value_head_dim_gpu.py -k "forward_matches_the_oracle or varlen_matches_the_oracle" \
  > $OUT/vdim.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 70 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py \
  > $OUT/forward.log 2>&1 &
wait
tail -1 $OUT/vdim.log; tail -1 $OUT/forward.log; grep -h "^FAILED\|kernel error" $OUT/vdim.log $OUT/forward.log | head
echo "tests $(( $(date +%s) - START )) s"
timeout $(( 125 - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree held=. --rounds 1 \
  --only "^fwd d128 (8x2k|4x4k) (full|causal)$" > $OUT/ab.log 2>&1
grep -A10 "after round 1 of" $OUT/ab.log
echo "total $(( $(date +%s) - START )) s"
