#!/bin/bash
# Where the host time of a training call goes: scripts/profile_host.py --training with the pieces' rows (forward
# without and with grad, forward._launch, backward._kernel_backward, one launch, torch.empty, the capability query,
# SDPA's forward without and with grad), twice. Carry .whl. About 90 s.
START=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cA
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do
  timeout 100 python3 scripts/profile_host.py --training --calls 300 --top 40 > $OUT/host_$round.log 2>&1
  echo "== round $round"; sed -n '/^form/,$p' $OUT/host_$round.log
done
echo "total $(( $(date +%s) - START )) s"
