#!/bin/bash
# session 25 call 3: base = main, q2s = fwd-q2-skip (Q by the K/V producer thread + each warpgroup's own key tiles),
# q3s = working tree (a producer thread of its own for Q). GPU tests on q3s, A/B, bench.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s25c3.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py > $OUT/tests_vhd_training_sinks_backend.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 200 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree q2s=$ROOT/.ab/q2s_tree --tree q3s=$ROOT --only "^fwd" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -15 $OUT/ab_fwd.log | grep graph
HF_FLASHPATCH_CACHE=/tmp/cA timeout 80 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick.log 2>&1
grep -E "ours/sdpa_cudnn|ours/sdpa " $OUT/bench_forward_quick.log
echo "total $(( $(date +%s) - T0 )) s"
