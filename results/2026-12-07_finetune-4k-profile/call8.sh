#!/bin/bash
# Call 7 found our attention's forward + backward at 1,391 us of host time against SDPA's 317 (H100 host), 1.45 ms
# more a layer in a host-bound model step. This call: the same host measurement with main's package (ab/main) and
# with the working tree's (plain eager training through a torch.autograd.Function around the op's body, the
# backward's body called directly), twice in turns, then the fine-tune rows with the working tree. Carry .whl, ab.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cA
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  for tree in ab/main .; do
    name=$([ "$tree" = . ] && echo new || echo main)
    PYTHONPATH=/tmp/site:$PWD/$tree timeout 60 python3 scripts/profile_host.py --training --calls 200 --top 25 \
      > $OUT/host_${name}_$round.log 2>&1
    echo "== $name round $round"; grep -E "host us/call|fwd\+bwd|step at" $OUT/host_${name}_$round.log
  done
done
PYTHONPATH=/tmp/site:$PWD timeout $(( 200 - ($(date +%s) - START) )) python3 scripts/bench_backward.py --only training \
  > $OUT/training.log 2>&1
grep -E '^(sdpa|hfpatch)' $OUT/training.log
echo "total $(( $(date +%s) - START )) s"
