#!/bin/bash
# call 8 (session 21), draft: the TMA dQ at d64 too (one dS^T buffer to make room), .ab/d64, against main (62765a8)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
D=$ROOT/.ab/d64
mkdir -p $OUT
T0=$(date +%s)
(cd $D && HF_FLASHPATCH_CACHE=/tmp/d1 PYTHONPATH=/tmp/site:$D timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "64 or varlen or window" > $OUT/d64_tests_backward.log 2>&1) &
(cd $D && HF_FLASHPATCH_CACHE=/tmp/d2 PYTHONPATH=/tmp/site:$D timeout 100 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py > $OUT/d64_tests_training.log 2>&1) &
wait
echo "tests took $(( $(date +%s) - T0 )) s"; tail -1 $OUT/d64_tests_*.log
PYTHONPATH=/tmp/site:$ROOT timeout 100 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree d64=$D --only "^bwd d64" --rounds 2 --repeats 20 > $OUT/d64_ab.log 2>&1
tail -4 $OUT/d64_ab.log
HF_FLASHPATCH_CACHE=/tmp/d3 PYTHONPATH=/tmp/site:$D timeout 60 python $D/scripts/bench_backward.py --quick --only training > $OUT/d64_bench_training.log 2>&1
tail -6 $OUT/d64_bench_training.log
echo "total $(( $(date +%s) - T0 )) s"
