#!/bin/bash
# call 5 (session 21), draft not landed: a step's dQ reductions issued after the next step's S^T / dP^T (.ab/defer)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
ROOT=$PWD
mkdir -p $OUT /tmp/aa2
rm -rf /tmp/aa2/*; tar -c cuda hf_flashpatch scripts | tar -x -C /tmp/aa2
T0=$(date +%s)
(cd .ab/defer && HF_FLASHPATCH_CACHE=/tmp/cdefer PYTHONPATH=/tmp/site:$PWD timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_backward.py -k "not tiled and not default" > $OUT/defer_tests_backward.log 2>&1)
tail -1 $OUT/defer_tests_backward.log
echo "tests took $(( $(date +%s) - T0 )) s"
PYTHONPATH=/tmp/site:$ROOT timeout 260 python scripts/ab_kernels.py --tree main=$ROOT --tree aa=/tmp/aa2 --tree defer=$ROOT/.ab/defer --only "^bwd d(128|64) " --rounds 3 --repeats 20 > $OUT/defer_ab.log 2>&1
tail -8 $OUT/defer_ab.log
echo "total $(( $(date +%s) - T0 )) s"
