#!/bin/bash
# session 28 call 1: the one-warpgroup d128 backward draft (grid, A/B, bench) + call 6's register diagnostic
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD W=$ROOT/.ab/onewg_tree
mkdir -p $OUT; cp .ab/s28c1.sh $OUT/
(cd $W && PYTHONPATH=/tmp/site:$W HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1) &
(cd $W && PYTHONPATH=/tmp/site:$W HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1) &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
export PYTHONPATH=/tmp/site:$ROOT
timeout 120 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree onewg=$W --only "^bwd d128" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -8 $OUT/ab_bwd.log | grep graph
timeout 150 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree regs232=$ROOT/.ab/regs232_tree --only "^fwd d128 (1x16k|8x2k)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -8 $OUT/ab_fwd.log | grep graph
(cd $W && PYTHONPATH=/tmp/site:$W timeout 90 python scripts/bench_backward.py --quick --only kernels --head-dims 128 > $OUT/bench_bwd_d128.log 2>&1)
grep -E "^(ours|sdpa_cudnn|ours/sdpa_cudnn) " $OUT/bench_bwd_d128.log
