#!/bin/bash
# Session 50, call 2: the warpgroups' turns as a build choice (TileShape.warpgroup_turns: the masked d128 walk and
# 192/128; not the chained walk, where call 1 lost at 8x2k), this work tree against main (ab/ab_head, and again as an
# A/A control), then the whole GPU grid on this tree. Call 1's d64 crash was its probe's barrier ids (4 + w met the Q
# rows' barrier 2 + w of warpgroup 2): turns now start at 2 + NUM_WG, and d64 keeps no turns (its masked build spilled).
# Before: mkdir -p ab/ab_head && git archive 9193c68 cuda hf_flashpatch scripts | tar x -C ab/ab_head
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 200 python3 scripts/ab_kernels.py --tree main=ab/ab_head --tree turns=. --tree main_again=ab/ab_head \
  --rounds 3 --only "^fwd d128 (8x2k|4x4k|1x16k) causal$|^fwd d192/128 4x4k causal$" > $OUT/ab_turns.log 2>&1
tail -10 $OUT/ab_turns.log
echo "ab $(( $(date +%s) - START )) s"
bash scripts/gpu_grid.sh $OUT 230
echo "total $(( $(date +%s) - START )) s"
