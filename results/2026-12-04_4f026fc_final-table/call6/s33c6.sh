#!/bin/bash
# session 33 call 6: the fine-tune rows of session 32's tree (fdc74f9) and of this one, in turns, same machine
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
ROOT=$PWD
mkdir -p $OUT; cp .ab/s33c6.sh $OUT/
T0=$(date +%s)
for round in 1 2; do
  for tree in tree32 head; do
    dir=$ROOT/.ab/tree32; [ $tree = head ] && dir=$ROOT
    PYTHONPATH=/tmp/site:$dir PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/c_$tree timeout 200 python $dir/scripts/bench_backward.py --only training > $OUT/training_${tree}_r$round.log 2>&1
    echo "round $round $tree: $(grep -E '^hfpatch/sdpa' $OUT/training_${tree}_r$round.log | awk '{print $3, $5, $7, $8}' | tr '\n' ' ')"
  done
done
echo "total $(( $(date +%s) - T0 )) s"
