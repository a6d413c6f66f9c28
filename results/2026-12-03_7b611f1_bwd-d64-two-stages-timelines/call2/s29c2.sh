#!/bin/bash
# session 29 call 2: dK / dV and the forward output through shared memory: GPU grids, A/B against 0c6f18d
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s29c2.sh $OUT/; git diff 0c6f18d -- cuda > $OUT/epilogue.diff 2>/dev/null
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not varlen and not window" > $OUT/tests_backward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cD timeout 220 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "varlen or window" > $OUT/tests_backward_varlen_window.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 330 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree new=$ROOT --only "^fwd d128 (8x2k|1x16k)|^fwd d192|^bwd d128|^bwd d64 (8x2k|4x4k)|^bwd d192" --rounds 3 --repeats 20 > $OUT/ab.log 2>&1
tail -24 $OUT/ab.log | grep -E "graph|case"
echo "total $(( $(date +%s) - T0 )) s"
