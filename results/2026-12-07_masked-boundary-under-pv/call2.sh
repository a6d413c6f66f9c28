#!/bin/bash
# Call 2 (any card; the card is an H200), only if call 1 gained and its tests passed: from a checkout of the
# draft, the whole GPU test grid, the shipped-cubin manifest written with this machine's cuobjdump, and the d128
# causal forward rows sustained against cuDNN with main's kernels (ab/main, as call 1 prepared it) beside the draft's,
# in the same call. Carry .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
(python3 scripts/check_shipped_cubins.py --write $OUT/shipped_cubins.json --jobs 8 > $OUT/manifest.log 2>&1;
 echo "manifest rc $?" >> $OUT/manifest.log) &
bash scripts/gpu_grid.sh $OUT 280 2>&1 | tee $OUT/grid.log
wait
tail -2 $OUT/manifest.log
for tree in draft main; do
  root=$PWD; [ $tree = main ] && root=$PWD/ab/main
  PYTHONPATH=/tmp/site:$root HF_FLASHPATCH_CACHE=/tmp/cS_$tree timeout 100 python3 $root/scripts/bench_sustained.py \
    --seconds 0.6 --rounds 5 --seqlens 2048 4096 8192 --head-dims 128 --masks causal --parts forward \
    > $OUT/sustained_$tree.log 2>&1
  echo "$tree:"; grep forward $OUT/sustained_$tree.log
done
echo "total $(( $(date +%s) - START )) s"
