#!/bin/bash
# session 27 call 6 (diagnostic): the d128 Q_BY_TMA builds (40 / 232 registers) with the math warps' own Q copy
# (q_box_heads 0) against bc78496: is the register split what unmasked d128 and 16k causal lose to?
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT
cp .ab/s27c6.sh $OUT/
timeout 125 python scripts/ab_kernels.py --tree main=$ROOT/.ab/main_tree --tree regs232=$ROOT/.ab/regs232_tree --only "^fwd d128 (1x16k|8x2k)" --rounds 2 --repeats 20 > $OUT/ab_fwd.log 2>&1
tail -6 $OUT/ab_fwd.log | grep graph
