#!/bin/bash
# call 3 (session 21): where a backward step's time goes (clock64 timeline of one CTA, scratch instrumentation in
# .ab/tl), and the fine-tune tokens/s with the lean backward (working tree)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
T0=$(date +%s)
(cd .ab/tl && HF_FLASHPATCH_CACHE=/tmp/tl PYTHONPATH=/tmp/site:$PWD timeout 150 python timeline.py) > $OUT/timeline.log 2>&1
cat $OUT/timeline.log | tail -60
echo "timeline took $(( $(date +%s) - T0 )) s"
#HF_FLASHPATCH_CACHE=/tmp/bench PYTHONPATH=/tmp/site:$ROOT timeout 240 python scripts/bench_backward.py --quick --only training > $OUT/bench_training.log 2>&1
tail -15 $OUT/bench_training.log
echo "total $(( $(date +%s) - T0 )) s"
