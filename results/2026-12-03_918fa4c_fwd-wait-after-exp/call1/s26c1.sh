#!/bin/bash
# session 26 call 1: main / wait / resc / split / n176 (working tree) forward A/B, GPU forward tests on n176 and walk, e5a2f16 + walk vs main on d64.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s26c1.sh $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py tests/gpu/test_backend_gpu.py > $OUT/tests_vhd_training_sinks_backend.log 2>&1 &
(cd .ab/walk_tree && HF_FLASHPATCH_CACHE=/tmp/cD PYTHONPATH=/tmp/site:$PWD timeout 170 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or persistent or causal" > $OUT/tests_walk_forward.log 2>&1) &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -8
timeout 300 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree wait=$ROOT/.ab/wait_tree --tree resc=$ROOT/.ab/resc_tree --tree split=$ROOT/.ab/split_tree --tree n176=$ROOT --only "^fwd d(128|192|64 8x2k|64 4x4k causal|64 1x16k causal gqa4)" --rounds 3 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -30 $OUT/ab_fwd.log | grep graph
timeout 150 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree e5a2f16=$ROOT/.ab/e5_tree --tree walk=$ROOT/.ab/walk_tree --only "^fwd d64 (1x16k|8x2k|4x4k causal$)" --rounds 3 --repeats 20 > $OUT/ab_d64.log 2>&1
tail -10 $OUT/ab_d64.log | grep graph
echo "total $(( $(date +%s) - T0 )) s"
