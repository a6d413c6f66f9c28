#!/bin/bash
# One call (any card), from a checkout of the change: kernel time of main (99fe4ce) and the handed tiles (A/B, CUDA
# graphs), the change's timeline, the whole GPU grid (the forward's tests among them) with the shipped-cubin
# manifest, and the d128 causal forward sustained against cuDNN beside main's kernels. Before the call (from the checkout):
#   rm -rf ab && mkdir -p ab/main ab/hand ab/tl
#   git archive 99fe4ce cuda hf_flashpatch scripts | tar -x -C ab/main
#   cp -r cuda hf_flashpatch scripts ab/hand/ && cp -r cuda hf_flashpatch ab/tl/
#   python3 results/2026-12-07_masked-walk-timeline/instrument.py ab/tl
# Carry .whl and ab. Argument: the call's seconds (default 590; the grid and the sustained rows take what is left).
START=$(date +%s)
LIMIT=${1:-590}
left() { echo $(( LIMIT - ($(date +%s) - START) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 130 python3 scripts/ab_kernels.py --tree main=ab/main --tree hand=ab/hand --rounds 3 \
  --only 'fwd d128 (8x2k|4x4k|2x8k|1x16k) causal$|fwd d128 8x2k full' > $OUT/ab.log 2>&1
grep -A12 "after round" $OUT/ab.log | grep -E "after|case|graph" | tail -6
echo "ab $(( $(date +%s) - START )) s"
for n in 2048; do
  HF_FLASHPATCH_CACHE=/tmp/cTL PYTHONPATH=/tmp/site timeout 40 python3 results/2026-12-07_masked-walk-timeline/walk_timeline.py \
    ab/tl $n $OUT/raw_$n.npz > $OUT/timeline_$n.log 2>&1
  tail -7 $OUT/timeline_$n.log
done
echo "timeline $(( $(date +%s) - START )) s"
[ $(left) -gt 150 ] || { echo "no time for the grid"; exit 0; }
(python3 scripts/check_shipped_cubins.py --write $OUT/shipped_cubins.json --jobs 8 > $OUT/manifest.log 2>&1;
 echo "manifest rc $?" >> $OUT/manifest.log) &
bash scripts/gpu_grid.sh $OUT $(( $(left) - 70 )) > $OUT/grid.log 2>&1
wait
grep -E "rc=|passed|failed" $OUT/grid.log | tail -8; tail -1 $OUT/manifest.log
for tree in hand main; do
  [ $(left) -gt 30 ] || break
  root=$PWD/ab/$tree
  PYTHONPATH=/tmp/site:$root HF_FLASHPATCH_CACHE=/tmp/cS_$tree timeout $(( $(left) / 2 - 5 )) python3 $root/scripts/bench_sustained.py \
    --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 --head-dims 128 --masks causal --parts forward \
    > $OUT/sustained_$tree.log 2>&1
  echo "$tree:"; grep forward $OUT/sustained_$tree.log
done
echo "total $(( $(date +%s) - START )) s"
