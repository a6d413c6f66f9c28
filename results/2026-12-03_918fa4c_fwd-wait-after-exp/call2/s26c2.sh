#!/bin/bash
# session 26 call 2: the final tree (working tree: n176 + one work walk + one wgmma wrapper): GPU forward tests,
# A/B against main (ada0fb0's kernels) and n176 (call 1's tree), the forward bench against cuDNN.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s26c2.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 120 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_sinks.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
HF_FLASHPATCH_CACHE=/tmp/cA timeout 90 python scripts/bench_forward.py --quick > $OUT/bench_forward_quick.log 2>&1
grep -E "ours/sdpa_cudnn|ours/sdpa " $OUT/bench_forward_quick.log
timeout 110 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree n176=$ROOT/.ab/n176_tree --tree final=$ROOT --only "^fwd d(128|192|64 8x2k|64 1x16k causal gqa4)" --rounds 2 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -14 $OUT/ab_fwd.log | grep graph
echo "total $(( $(date +%s) - T0 )) s"
