#!/bin/bash
# call 1 (session 21): the lean backward step (working tree) -- GPU tests, then backward A/B in CUDA graphs
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT /tmp/old /tmp/aa
git archive HEAD cuda hf_flashpatch scripts | tar -x -C /tmp/old
git archive HEAD cuda hf_flashpatch scripts | tar -x -C /tmp/aa
git log -1 --format='HEAD %h %s' > $OUT/head.txt
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv >> $OUT/head.txt
T0=$(date +%s)
HF_FLASHPATCH_CACHE=/tmp/cA timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py > $OUT/tests_backward.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cB timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_value_head_dim_gpu.py tests/gpu/test_training.py tests/gpu/test_sinks_gpu.py > $OUT/tests_vhd_training_sinks.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/cC timeout 300 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_compile_gpu.py > $OUT/tests_compile.log 2>&1 &
wait
echo "tests took $(( $(date +%s) - T0 )) s"
for f in $OUT/tests_*.log; do echo "$f: $(tail -1 $f)"; done
timeout 330 python scripts/ab_kernels.py --tree old=/tmp/old --tree aa=/tmp/aa --tree new=$ROOT --only "^bwd" --rounds 3 --repeats 20 > $OUT/ab_bwd.log 2>&1
tail -12 $OUT/ab_bwd.log
echo "total $(( $(date +%s) - T0 )) s"
