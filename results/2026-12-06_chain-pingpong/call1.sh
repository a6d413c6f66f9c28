#!/bin/bash
# Session 50, call 1: the math warpgroups taking turns at issuing a step's products (ping-pong, FA3's warp-scheduler
# barriers: barrier 4 + w is warpgroup w's turn; pingpong.diff on main's tree), in the chained walk (unmasked d128 up
# to 4096 keys) and in the per-work key loop (every other Hopper build), A/B against main at d128 8x2k / 4x4k / 1x16k,
# full and causal; then the GPU checks no GPU has run (session 49's call6.sh) beside the ping-pong tree's forward tests.
# Before, on the development machine (untracked trees under ab/, carried with .whl and .tfnew):
#   mkdir -p ab/ab_head ab/ab_pingpong && git archive HEAD cuda hf_flashpatch scripts | tar x -C ab/ab_head
#   git archive HEAD cuda hf_flashpatch scripts | tar x -C ab/ab_pingpong
#   (cd ab/ab_pingpong && patch -p1 < ../../results/2026-12-06_chain-pingpong/pingpong.diff)
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 280 python3 scripts/ab_kernels.py --tree main=ab/ab_head --tree pingpong=ab/ab_pingpong --rounds 3 \
  --only "^fwd d128 (8x2k|4x4k|1x16k) (full|causal)$" > $OUT/ab_pingpong.log 2>&1
tail -8 $OUT/ab_pingpong.log
echo "ab $(( $(date +%s) - START )) s"
HF_FLASHPATCH_CACHE=/tmp/c1 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_bad_tables.py \
  -k past_the_last > $OUT/padding_rows.log 2>&1 &
HF_FLASHPATCH_CACHE=/tmp/c2 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_forward_walks.py \
  tests/gpu/test_forward_chained_walk.py > $OUT/walks.log 2>&1 &
(cd ab/ab_pingpong && PYTHONPATH=/tmp/site HF_FLASHPATCH_CACHE=/tmp/c3 timeout 200 python3 -m pytest -q \
  -p no:cacheprovider ../../tests/gpu/test_forward_chained_walk.py ../../tests/gpu/test_forward.py \
  ../../tests/gpu/test_forward_walks.py) > $OUT/pingpong_tests.log 2>&1 &
mkdir -p /tmp/tf521 && tar xzf .tfnew/hub.tgz -C /tmp/tf521 && tar xzf .tfnew/hub_deps.tgz -C /tmp/tf521
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/tf521 .tfnew/transformers-5.21.1-*.whl \
  .tfnew/tokenizers-*.whl .tfnew/safetensors-*.whl 2>/dev/null
(export PYTHONPATH=/tmp/tf521:/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c4
 python3 -c "import transformers; print('transformers', transformers.__version__)"
 timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_paged_generate.py) > $OUT/transformers_5_21.log 2>&1 &
wait
for log in padding_rows walks pingpong_tests transformers_5_21; do
  echo "== $log: $(grep -E 'passed|failed|error' $OUT/$log.log | tail -1)"
  grep -E "^(FAILED|ERROR)" $OUT/$log.log | head -5
done
head -1 $OUT/transformers_5_21.log
echo "total $(( $(date +%s) - START )) s"
