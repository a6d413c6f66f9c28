#!/bin/bash
# call 4 (session 22): the fine-tune shape (one sequence, 32/8 heads, d64) with the loads by the TMA against main
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
PYTHONPATH=/tmp/site:$ROOT timeout 300 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree tma_loads=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -12 $OUT/ab_bwd.log
for tree in main tma_loads main tma_loads; do
  D=$ROOT; [ $tree = main ] && D=$ROOT/.ab/main_tree
  (cd $D && HF_FLASHPATCH_CACHE=/tmp/c_$tree PYTHONPATH=/tmp/site:$D timeout 100 python $D/scripts/bench_backward.py --quick --only training > $OUT/training_$tree.log 2>&1)
  echo "$tree: $(grep -E '^(sdpa|hfpatch) ' $OUT/training_$tree.log | awk '{print $1, $3, $5}' | tr '\n' ' ')"
  cat $OUT/training_$tree.log >> $OUT/training_all.log
done
echo "total $(( $(date +%s) - T0 )) s"
