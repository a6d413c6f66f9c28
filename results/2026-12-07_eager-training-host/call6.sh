#!/bin/bash
# diag.py: the launches' streams and threads, the collector's runs, the training call's host time with the collector
# off and with the backward on the calling thread; call 6 adds diag_thread.py. Carry .whl. About 60 s.
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_FLASHPATCH_CACHE=/tmp/cA
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 results/2026-12-07_eager-training-host/diag.py 2>&1 | grep -v -i warn | tee $OUT/diag.log
timeout 120 python3 results/2026-12-07_eager-training-host/diag_thread.py 2>&1 | grep -v -i warn | tee $OUT/diag_thread.log
