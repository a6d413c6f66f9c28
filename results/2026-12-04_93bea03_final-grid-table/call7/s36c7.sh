#!/bin/bash
# session 36 call 7: 192/128 with and without the output boxes, in turns in one process (.ab/mla_boxes.py)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p $OUT; cp .ab/s36c7.sh .ab/mla_boxes.py $OUT/
timeout 150 python .ab/mla_boxes.py 2>&1 | tee $OUT/mla_boxes.log
