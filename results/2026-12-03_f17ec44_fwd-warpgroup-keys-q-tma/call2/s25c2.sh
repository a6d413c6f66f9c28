#!/bin/bash
# session 25 call 2: base = main, q2 = fwd-q-tma2 (Q by the TMA, key loop as main's), q2s = working tree (q2 + each
# warpgroup's own key tiles). GPU tests on q2s (the working tree) and on q2 (.ab/q2_full), then A/B and benches.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s25c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_q2s_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_q2s_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py > $OUT/tests_q2s_vhd_training_sinks_backend.log 2>&1 &
(cd .ab/q2_full && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/cD timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_q2_forward_core.log 2>&1) &
(cd .ab/q2_full && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/cE timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py -k "varlen or query_rows or persistent or value or training" > $OUT/tests_q2_forward_varlen_q_walk_vhd.log 2>&1) &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 220 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree q2=$ROOT/.ab/q2_tree --tree q2s=$ROOT --only "^fwd" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -15 $OUT/ab_fwd.log | grep graph
HF_FLASHPATCH_CACHE=/tmp/cA timeout 90 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick_q2s.log 2>&1
(cd .ab/q2_full && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/cD timeout 90 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick_q2.log 2>&1)
for f in $OUT/bench_forward_quick_*.log; do echo $(basename $f); grep -E "ours/sdpa_cudnn" $f; done
echo "total $(( $(date +%s) - T0 )) s"
