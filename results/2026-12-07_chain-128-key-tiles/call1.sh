#!/bin/bash
# Call 1 (any card): the masked walk's timeline (../2026-12-07_masked-walk-timeline/call1.sh, into $OUT/timeline),
# then the unmasked d128 walk on 128-key tiles against main (A/B, CUDA graphs). Before the call: ab/tl as the
# timeline's README says; ab/main and ab/n128 from `git archive HEAD cuda hf_flashpatch scripts`, ab/n128 with
# HOPPER_SHAPES[(128, False)].block_n = 128. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
ROOT=$OUT
OUT=$ROOT/timeline bash results/2026-12-07_masked-walk-timeline/call1.sh 2>&1 | tail -40
echo "timeline done $(( $(date +%s) - START )) s"
mkdir -p $ROOT/ab
timeout $(( ${1:-560} - ($(date +%s) - START) )) python3 scripts/ab_kernels.py --tree main=ab/main --tree n128=ab/n128 \
  --rounds 3 --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) full' > $ROOT/ab/ab.log 2>&1
tail -14 $ROOT/ab/ab.log
echo "total $(( $(date +%s) - START )) s"
