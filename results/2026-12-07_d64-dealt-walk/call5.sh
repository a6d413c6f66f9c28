#!/bin/bash
# Call 5 (warm): the chained walk without the split (8x2k's build), whose producer walks the changed loop: its steady
# softmax block in both trees (sass_compare.py), and d128 8x2k full in an A/B with an A/A copy, five rounds. Carry
# .whl and ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export PATH=$PATH:/usr/local/cuda/bin:$(python3 -c "import triton,os;print(os.path.dirname(triton.__file__))" 2>/dev/null)/backends/nvidia/bin
mkdir -p $OUT
(python3 results/2026-12-07_d64-dealt-walk/sass_compare.py ab/main ab/new > $OUT/sass.log 2>&1) &
timeout 300 python3 scripts/ab_kernels.py --tree main=ab/main --tree main2=ab/main2 --tree new=ab/new --rounds 5 \
  --only 'fwd d128 8x2k full' > $OUT/ab.log 2>&1
tail -5 $OUT/ab.log
wait
cat $OUT/sass.log
echo "total $(( $(date +%s) - START )) s"
