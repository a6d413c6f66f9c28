"""How ptxas scheduled the chained walk's steady softmax, per revision (CPU only; session 48).

    python results/2026-12-05_chain-boundary/softmax_schedule.py REV [REV ...]

For each git revision, builds the unmasked d128 forward that the chained walk serves (sm_90a, bf16, the shipped
tile), disassembles it, and finds the chained loop (the loop with 18 HGMMA: one S and one P V a step) and in it the
basic block with the step's 82 MUFU.EX2 (the unmasked, uncapped softmax). Prints its length, the sum of its static
stall counts (the control bits of each instruction: cycles the warp waits before its next issue), where the row
maxima (FMNMX) and the exponentials (MUFU.EX2) lie in it, and how many exponentials come before the last maximum.
In main's schedule the first row's exponentials run while the second row's maximum is still being reduced. Needs
nvcc and a cuobjdump (on PATH or in triton's wheel).
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = """
import sys
sys.path.insert(0, sys.argv[1])
from hf_flashpatch.kernels.build import compile_cubin
from hf_flashpatch.kernels.forward import ForwardConfig
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES
config = ForwardConfig.for_problem(128, "bf16", False, HOPPER_SHAPES[(128, False)], arch="sm_90a")
assert config.chained_walk, config
open(sys.argv[2], "wb").write(compile_cubin(config.build("sm_90a"))[0])
"""
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x[0-9a-f]{16} \*/")
CONTROL = re.compile(r"^\s*/\* (0x[0-9a-f]{16}) \*/")


def cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def instructions(sass: str) -> list[tuple[int, str, int]]:
    """(address, text, static stall) per instruction: on sm_90 the stall count is bits 41-44 of the second word."""
    lines, out = sass.splitlines(), []
    for i, line in enumerate(lines):
        found = INSTRUCTION.search(line)
        if found:
            control = int(CONTROL.match(lines[i + 1]).group(1), 16) >> 41
            out.append((int(found.group(1), 16), found.group(2), control & 15))
    return out


def chained_loop(code):
    index = {address: i for i, (address, _, _) in enumerate(code)}
    for i, (address, text, _) in enumerate(code):
        back = re.search(r"\bBRA\b\s+(0x[0-9a-f]+)", text)
        if back and int(back.group(1), 16) < address:
            body = code[index[int(back.group(1), 16)]:i + 1]
            if sum("HGMMA" in t for _, t, _ in body) == 18:
                return body
    raise SystemExit("no loop with 18 HGMMA: not the chained walk's build")


def basic_blocks(body):
    block = []
    for entry in body:
        block.append(entry)
        if re.search(r"\bBRA\b|BSYNC|EXIT|BAR\.SYNC|WARPGROUP\.DEPBAR", entry[1]):
            yield block
            block = []
    if block:
        yield block


def report(rev: str, work: Path) -> str:
    tree, cubin = work / rev, work / f"{rev}.cubin"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", rev, "cuda", "hf_flashpatch"], cwd=ROOT, capture_output=True,
                             check=True).stdout  # fmt: skip
    subprocess.run(["tar", "x", "-C", str(tree)], input=archive, check=True)
    env = dict(os.environ, HF_FLASHPATCH_CACHE=str(work / f"cache-{rev}"))
    subprocess.run([sys.executable, "-c", BUILD, str(tree), str(cubin)], check=True, env=env)
    sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    block = max(basic_blocks(chained_loop(instructions(sass))), key=lambda b: sum("MUFU.EX2" in t for _, t, _ in b))
    exps = [i for i, (_, t, _) in enumerate(block) if "MUFU.EX2" in t]
    maxima = [i for i, (_, t, _) in enumerate(block) if "FMNMX" in t]
    return (f"{rev:28s} {len(block):6d} {sum(s for _, _, s in block):6d} {maxima[0]:4d}-{maxima[-1]:<4d}"
            f" {exps[0]:4d}-{exps[-1]:<4d} {sum(e < maxima[-1] for e in exps):6d}")


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(f"{'revision':28s} {'instr':>6s} {'stalls':>6s} {'FMNMX':>9s} {'MUFU.EX2':>9s} {'EX2 before last max':>6s}")
    with tempfile.TemporaryDirectory() as work:
        for rev in sys.argv[1:]:
            print(report(rev, Path(work)), flush=True)


if __name__ == "__main__":
    main()
