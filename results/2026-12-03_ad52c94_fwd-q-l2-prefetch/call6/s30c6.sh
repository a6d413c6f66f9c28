#!/bin/bash
# session 30 call 6: the work-start timeline with the first K wait, base (ad52c94) and the math warps' L2 prefetch draft
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s30c6.sh .ab/tl2.py $OUT/
for t in tl_tree tl_pf; do
  echo "## $t" | tee -a $OUT/timelines.log
  (cd .ab/$t && PYTHONPATH=/tmp/site:$PWD HF_FLASHPATCH_CACHE=/tmp/c$t timeout 150 python ../tl2.py >> $OUT/timelines.log 2>&1)
done
cat $OUT/timelines.log | tail -14
