#!/bin/bash
# session 27 call 3: f0e3af3 (backward: the last dQ boxes waited for as read) against fedec8c, and the qtma tree
# (forward d128 Q by the TMA, 40 / 232 registers): backward GPU tests on f0e3af3, forward GPU tests on qtma, A/B.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s27c3.sh $OUT/
T0=$(date +%s)
export PYTHONPATH=/tmp/site:$ROOT
HF_FLASHPATCH_CACHE=/tmp/cA timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
Q=$ROOT/.ab/qtma_tree
(cd $Q && PYTHONPATH=/tmp/site:$Q HF_FLASHPATCH_CACHE=/tmp/cC timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_qtma_forward_core.log 2>&1) &
(cd $Q && PYTHONPATH=/tmp/site:$Q HF_FLASHPATCH_CACHE=/tmp/cD timeout 230 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_qtma_forward_varlen_q_walk.log 2>&1) &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 130 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree new=$ROOT --only "^bwd d(128 8x2k|64 8x2k|128 4x4k full|64 1x16k)" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -6 $OUT/ab_bwd.log | grep graph
timeout 130 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree qtma=$Q --only "^fwd d128 (8x2k|1x16k full|4x4k causal)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -6 $OUT/ab_fwd.log | grep graph
echo "total $(( $(date +%s) - T0 )) s"
