#!/bin/bash
# The A/B's trees from the committed tree (run on this machine before the call; they travel as `ab`, gitignored):
# ab/main as committed; ab/copiedq: the masked d128 walk with its math warps copying Q (232 -> 240 registers a math
# thread) and its output by boxes from those Q rows; ab/pertile: one CTA per work tile for every masked problem of
# more than 1024 work tiles (the issue's 2k-8k causal problems have 2048), the form 16k takes.
set -e
rm -rf ab && mkdir -p ab/main
git archive HEAD cuda hf_flashpatch | tar -x -C ab/main
cp -r ab/main ab/copiedq && cp -r ab/main ab/pertile
python3 - <<'PY'
from pathlib import Path
path = Path("ab/copiedq/hf_flashpatch/kernels/heuristics.py")
text = path.read_text()
old = "(128, True): TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True, q_by_tma=True,"
assert text.count(old) == 1
path.write_text(text.replace(old, old.replace("q_by_tma=True", "q_by_tma=False")))
path = Path("ab/pertile/hf_flashpatch/kernels/heuristics.py")
text = path.read_text()
assert text.count("MODELLED_MAX_TILES = 4096") == 1
path.write_text(text.replace("MODELLED_MAX_TILES = 4096", "MODELLED_MAX_TILES = 1024"))
PY
diff -r ab/main ab/copiedq | grep '^[<>]'
diff -r ab/main ab/pertile | grep '^[<>]'
