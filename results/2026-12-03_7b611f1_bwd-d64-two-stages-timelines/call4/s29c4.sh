#!/bin/bash
# session 29 call 4: d64 forward works through a ring in shared memory: forward grid, A/B against eb6c82e
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/s29c4.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_training_sinks.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
echo "tests $(( $(date +%s) - T0 )) s"
timeout 200 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree ring=$ROOT --only "^fwd d64" --rounds 3 --repeats 20 > $OUT/ab_fwd_d64.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd_d64.log | tail -12
echo "total $(( $(date +%s) - T0 )) s"
