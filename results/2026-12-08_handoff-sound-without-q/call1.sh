#!/bin/bash
# One call (any card), from a checkout of the change: kernel time of main (316293a) and the change (A/B, CUDA graphs),
# then the whole GPU grid on the checkout with the shipped-cubin manifest. Before the call:
#   rm -rf ab && mkdir -p ab/main ab/sound
#   git archive 316293a cuda hf_flashpatch scripts | tar -x -C ab/main && cp -r cuda hf_flashpatch scripts ab/sound/
# Carry .whl and ab. Argument: the call's seconds (default 230: the session's last device time).
START=$(date +%s)
LIMIT=${1:-230}
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
timeout 65 python3 scripts/ab_kernels.py --tree main=ab/main --tree sound=ab/sound --rounds 2 \
  --only 'fwd d128 (8x2k|4x4k|2x8k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -A9 "after round" $OUT/ab.log | grep -E "after|case|graph" | tail -6
echo "ab $(( $(date +%s) - START )) s"
(python3 scripts/check_shipped_cubins.py --write $OUT/shipped_cubins.json --jobs 8 > $OUT/manifest.log 2>&1;
 echo "manifest rc $?" >> $OUT/manifest.log) &
bash scripts/gpu_grid.sh $OUT $(( $(left) - 8 )) > $OUT/grid.log 2>&1
wait
grep -E "rc=|FAILED|grid" $OUT/grid.log | tail -10; tail -1 $OUT/manifest.log
echo "total $(( $(date +%s) - START )) s"
