"""The chained walk's steady step against the work-by-work key loop, from the sm_90a SASS (CPU only; session 51).

    python results/2026-12-06_chain-step/steady_step.py REV [REV ...]

For each git revision, builds the unmasked d128 forward (bf16, the shipped tile, K/V multicast) chained and work by
work, finds in each the key loop with one S and one P V a step (18 HGMMA), and follows its steady path: the shortest
path from the loop's top to its back edge that passes every HGMMA and every MUFU.EX2 (the branches a steady step
skips: the first step's store, the copy step, a work's switch, the soft-cap and key-length mask). Prints the path's
instructions and static stall cycles (the control bits: cycles the warp waits before its next issue), split at the
S issue, the S wait, the P V issue, the first and last exponential and the P V wait, and how many exponentials come
before the last row maximum (ptxas's softmax order: results/2026-12-05_chain-boundary/softmax_schedule.py). After
the P V wait a warp's stalls delay the next S directly. Needs nvcc and a cuobjdump (on PATH or in triton's wheel).
"""

import bisect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-05_chain-boundary"))
import softmax_schedule as schedule  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import dataclasses, sys
sys.path.insert(0, sys.argv[1])
from hf_flashpatch.kernels.build import compile_cubin
from hf_flashpatch.kernels.forward import ForwardConfig
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES
shape = HOPPER_SHAPES[(128, False)]
if sys.argv[3] == "walk":
    shape = dataclasses.replace(shape, chained_walk=False, **({"split_tail": False} if hasattr(shape, "split_tail") else {}))
config = ForwardConfig.for_problem(128, "bf16", False, shape, arch="sm_90a")
open(sys.argv[2], "wb").write(compile_cubin(config.build("sm_90a"))[0])
"""
BRANCH = re.compile(r"\bBRA\b(?:\.\w+)*\s+(?:!?U?P\w+,\s*)?(0x[0-9a-f]+)")


def key_loop(code):
    """(first, last) index of the innermost loop holding 18 HGMMA: one S and one P V a step."""
    index = {address: i for i, (address, _, _) in enumerate(code)}
    for i, (address, text, _) in enumerate(code):
        target = BRANCH.search(text)
        if target and int(target.group(1), 16) < address:
            first = index[int(target.group(1), 16)]
            if sum("HGMMA" in t for _, t, _ in code[first:i + 1]) == 18:
                return first, i
    raise SystemExit("no loop with 18 HGMMA")


def steady_path(code, first, last):
    """Indices of the shortest forward path first..last that jumps over no HGMMA and no MUFU.EX2 (but those of loops
    nested in the key loop)."""
    index = {address: i for i, (address, _, _) in enumerate(code)}
    nested = set()  # loops inside the key loop (a split work's parts folded: exponentials no step runs)
    for i in range(first, last):
        target = BRANCH.search(code[i][1])
        if target and first < index.get(int(target.group(1), 16), -1) <= i:
            nested.update(range(index[int(target.group(1), 16)], i + 1))
    required = [i for i in range(first, last + 1)
                if ("HGMMA" in code[i][1] or "MUFU.EX2" in code[i][1]) and i not in nested]
    cost, previous = {first: 0}, {first: None}
    for i in range(first, last + 1):
        if i not in cost:
            continue
        text = code[i][1]
        target = BRANCH.search(text)
        successors = []
        if target and index.get(int(target.group(1), 16), -1) > i:
            successors.append(index[int(target.group(1), 16)])
        if not (target and not text.startswith("@")) and "EXIT" not in text:
            successors.append(i + 1)
        for j in successors:
            skipped = bisect.bisect_right(required, i)
            if j <= last and not (skipped < len(required) and required[skipped] < j) and cost[i] + 1 < cost.get(j, 1e9):
                cost[j], previous[j] = cost[i] + 1, i
    path, i = [], last
    while i is not None:
        path.append(i)
        i = previous[i]
    return path[::-1]


def report(name: str, code) -> str:
    path = steady_path(code, *key_loop(code))
    at = [code[i][1] for i in path]
    hgmma = [k for k, t in enumerate(at) if "HGMMA" in t]
    exps = [k for k, t in enumerate(at) if "MUFU.EX2" in t]
    pv_wait = next(k for k, t in enumerate(at) if "DEPBAR.LE gsb0, 0x0" in t)
    cuts = {"top": 0, "S": hgmma[0], "S->PV": hgmma[7] + 1, "PV": hgmma[8], "PV->exp": hgmma[-1] + 1,
            "softmax": exps[0], "->PV wait": exps[-1] + 1, "after PV wait": pv_wait, "": len(path)}  # fmt: skip
    names, bounds = list(cuts), list(cuts.values())
    parts = " ".join(f"{n} {sum(code[path[k]][2] for k in range(a, b))}" for n, a, b in zip(names, bounds, bounds[1:]))
    block = max(schedule.basic_blocks(code[path[0]:path[-1] + 1]), key=lambda b: sum("MUFU.EX2" in t for _, t, _ in b))
    block_exps = [i for i, (_, t, _) in enumerate(block) if "MUFU.EX2" in t]
    maxima = [i for i, (_, t, _) in enumerate(block) if "FMNMX" in t]
    before = sum(e < maxima[-1] for e in block_exps)
    return (f"{name:36s} {len(path):5d} {sum(code[i][2] for i in path):6d}  {parts}  "
            f"EX2 before the last max {before}")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(f"{'revision / walk':36s} {'instr':>5s} {'stalls':>6s}  stalls by part")
    with tempfile.TemporaryDirectory() as work:
        for rev in sys.argv[1:]:
            tree = Path(work) / rev
            tree.mkdir()
            archive = subprocess.run(["git", "archive", rev, "cuda", "hf_flashpatch"], cwd=ROOT, capture_output=True,
                                     check=True).stdout  # fmt: skip
            subprocess.run(["tar", "x", "-C", str(tree)], input=archive, check=True)
            env = dict(os.environ, HF_FLASHPATCH_CACHE=str(Path(work) / f"cache-{rev}"))
            for walk in ("chain", "walk"):
                cubin = Path(work) / f"{rev}-{walk}.cubin"
                subprocess.run([sys.executable, "-c", BUILD, str(tree), str(cubin), walk], check=True, env=env)
                sass = subprocess.run([schedule.cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True,
                                      check=True).stdout  # fmt: skip
                print(report(f"{rev} {walk}", schedule.instructions(sass)), flush=True)


if __name__ == "__main__":
    main()
