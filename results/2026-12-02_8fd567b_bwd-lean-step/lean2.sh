#!/bin/bash
# call 2 (session 21): ncu of the d128 backward kernel (HEAD vs lean), backward A/B in CUDA graphs, cuDNN sweep
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT /tmp/old /tmp/aa
[ -d /tmp/old/cuda ] || git archive 8fd567b cuda hf_flashpatch scripts | tar -x -C /tmp/old
[ -d /tmp/aa/cuda ] || git archive 8fd567b cuda hf_flashpatch scripts | tar -x -C /tmp/aa
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
T0=$(date +%s)
for tree in old new; do
  P=$ROOT; [ $tree = old ] && P=/tmp/old
  HF_FLASHPATCH_CACHE=/tmp/ncu_$tree PYTHONPATH=/tmp/site:$P timeout 150 $NCU --clock-control none --kernel-name regex:bwd_dkdv_dq --launch-skip 1 --launch-count 1 --set full \
    python $ROOT/scripts/profile_kernel.py --head-dim 128 --seqlen 8192 --backward > $OUT/ncu_bwd_d128_full_$tree.txt 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issued Warp Per Scheduler|Executed Ipc A|Registers Per|Shared Memory Throughput|Stall (Wait|Barrier|Long Sc|Short Sc|Math|MIO|GMMA|Dispatch|Not Sel|Branch)" $OUT/ncu_bwd_d128_full_$tree.txt | head -24 | sed "s/^/$tree /"
done
echo "ncu took $(( $(date +%s) - T0 )) s"
timeout 260 python scripts/ab_kernels.py --tree old=/tmp/old --tree aa=/tmp/aa --tree new=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd_graph.log 2>&1
tail -10 $OUT/ab_bwd_graph.log
HF_FLASHPATCH_CACHE=/tmp/bench timeout 150 python scripts/bench_backward.py --quick --only kernels > $OUT/bench_bwd_kernels.log 2>&1
tail -30 $OUT/bench_bwd_kernels.log
echo "total $(( $(date +%s) - T0 )) s"
