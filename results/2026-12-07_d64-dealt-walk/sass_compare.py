"""The forward builds' SASS in two trees (the walk's list read by every unmasked build now): per build,
instructions, HGMMA, R2UR and local-memory ones, whether each function's code is the same, and for the chained build
its steady softmax block (softmax_schedule.py's reading: length, static stalls, exponentials before the last maximum).

    python sass_compare.py TREE_A TREE_B      # e.g. ab/main ab/new; needs nvcc and a cuobjdump
"""
import hashlib
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("schedule", HERE.parent / "2026-12-05_chain-boundary" / "softmax_schedule.py")
schedule = importlib.util.module_from_spec(spec)
spec.loader.exec_module(schedule)

BUILD = """
import dataclasses, sys
sys.path.insert(0, sys.argv[1])
from hf_flashpatch.kernels.build import compile_cubin
from hf_flashpatch.kernels.forward import ForwardConfig
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES, HOPPER_VALUE_HEAD_DIM_SHAPES
chained = ForwardConfig.for_problem(128, "bf16", False, HOPPER_SHAPES[(128, False)], arch="sm_90a")
configs = {
    "d128 chained": chained,
    "d128 chained unsplit": dataclasses.replace(chained, split_tail=False),
    "d128 work by work": dataclasses.replace(chained, chained_walk=False, split_tail=False),
    "d64 full": ForwardConfig.for_problem(64, "bf16", False, HOPPER_SHAPES[(64, False)], arch="sm_90a"),
    "d64 causal": ForwardConfig.for_problem(64, "bf16", True, HOPPER_SHAPES[(64, True)], arch="sm_90a"),
    "d128 causal": ForwardConfig.for_problem(128, "bf16", True, HOPPER_SHAPES[(128, True)], arch="sm_90a"),
    "192/128 full": ForwardConfig.for_problem(192, "bf16", False, HOPPER_VALUE_HEAD_DIM_SHAPES[(192, 128)],
                                              arch="sm_90a", head_dim_v=128),
}
for name, config in configs.items():
    open(sys.argv[2] + "/" + name.replace(" ", "_").replace("/", "-") + ".cubin", "wb").write(
        compile_cubin(config.build("sm_90a"))[0])
"""


def functions(cubin: Path) -> dict[str, str]:
    sass = subprocess.run([schedule.cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    return dict(re.findall(r"Function : (\w+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S))


def main() -> None:
    trees = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as work:
        sass = {}
        for tree in trees:
            out = Path(work) / Path(tree).name
            out.mkdir()
            env = dict(os.environ, HF_FLASHPATCH_CACHE=str(Path(work) / f"cache-{out.name}"))
            subprocess.run([sys.executable, "-c", BUILD, str(Path(tree).resolve()), str(out)], check=True, env=env)
            sass[tree] = {c.stem: functions(c) for c in sorted(out.glob("*.cubin"))}
        print(f"{'build / function':60s} {'same':>5s} " + " ".join(f"{t:>28s}" for t in trees))
        for build in sass[trees[0]]:
            for name, code_a in sass[trees[0]][build].items():
                codes = [sass[t][build].get(name, "") for t in trees]
                strip = [hashlib.sha256(re.sub(r"/\*[0-9a-f]{4,}\*/", "", c).encode()).hexdigest() for c in codes]
                cells = []
                for code in codes:
                    ops = schedule.instructions(code)
                    count = lambda op: sum(op in text for _, text, _ in ops)  # noqa: E731
                    cells.append(f"{len(ops):6d} i {count('HGMMA'):3d} H {count('R2UR'):3d} R {count('LDL') + count('STL'):2d} L")
                print(f"{build + ' ' + name[-40:]:60s} {str(strip[0] == strip[1]):>5s} " + " ".join(f"{c:>28s}" for c in cells))
                if build.startswith("d128_chained") and "pieces" not in name:
                    for tree, code in zip(trees, codes):
                        ops = schedule.instructions(code)
                        block = max(schedule.basic_blocks(schedule.chained_loop(ops)),
                                    key=lambda b: sum("MUFU.EX2" in t for _, t, _ in b))
                        exps = [i for i, (_, t, _) in enumerate(block) if "MUFU.EX2" in t]
                        maxima = [i for i, (_, t, _) in enumerate(block) if "FMNMX" in t]
                        print(f"    {tree}: steady softmax block {len(block)} instructions, "
                              f"{sum(s for _, _, s in block)} static stalls, "
                              f"{sum(e < maxima[-1] for e in exps)} exponentials before the last maximum")


if __name__ == "__main__":
    main()
