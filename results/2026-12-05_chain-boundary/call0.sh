#!/bin/bash
# session 47, call 0 (run from branch wip/masked-chain-2 = tag s47-masked-chain-measured, where its scripts are).
# Prepared in session 46 for the next device session (branch wip/masked-chain; not run): the chained walk with its
# steady step written once for a work's later key tiles (nested loops: a work's first step is its own instantiation),
# and the same chain on masked walks. Its GPU tests (unmasked and masked), the causal d128 shapes and the unmasked
# ones (160-key tiles work by work, twice, against the chain, up to 16k: does the leaner step stop losing at 16k?).
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 150 python3 -m pytest -q tests/gpu/test_forward_chained_walk.py > $OUT/tests_chain.log 2>&1; tail -4 $OUT/tests_chain.log
timeout 100 python3 results/2026-12-05_chained-walk/sustained_masked_shapes.py --seconds 0.5 --rounds 5 > $OUT/sustained_masked_shapes.log 2>&1
tail -3 $OUT/sustained_masked_shapes.log
timeout 150 python3 results/2026-12-05_chained-walk/sustained_shapes.py --no-176 --seconds 0.5 --rounds 5 --seqlens 2048 4096 16384 > $OUT/sustained_shapes.log 2>&1
tail -4 $OUT/sustained_shapes.log
echo "total $(( $(date +%s) - START )) s"
