#!/bin/bash
# session 31 call 7: masked forward tiles aligned to the sequence's end: forward grid, A/B, d64 2k causal vs cuDNN
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT; cp .ab/ab_end.sh .ab/vs_cudnn_d64s.py $OUT/
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 95 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "not varlen and not query_rows and not persistent" > $OUT/tests_forward_core.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 95 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_forward.py -k "varlen or query_rows or persistent" > $OUT/tests_forward_varlen_q_walk.log 2>&1 &
wait
for f in $OUT/tests_*.log; do echo "$(basename $f): $(tail -1 $f)"; done
grep -hE "^FAILED|^ERROR" $OUT/tests_*.log | head -6
echo "tests $(( $(date +%s) - T0 )) s"
timeout 85 python scripts/ab_kernels.py --tree base=$ROOT/.ab/base_tree --tree end=$ROOT --only "^fwd d64 (8x2k causal|1x16k causal$|4x4k causal gqa4)|^fwd d128 4x4k causal" --rounds 2 --repeats 20 > $OUT/ab_fwd.log 2>&1
grep -E "after round|graph" $OUT/ab_fwd.log | tail -5
echo "ab $(( $(date +%s) - T0 )) s"
timeout 40 python .ab/vs_cudnn_d64s.py > $OUT/vs_cudnn.log 2>&1
tail -2 $OUT/vs_cudnn.log
echo "total $(( $(date +%s) - T0 )) s"
