"""Sustained timing of unmasked d128 forward tile shapes against cuDNN, in turns (session 46).

    python results/2026-12-05_chained-walk/sustained_shapes.py [--seconds 0.6] [--rounds 5]

Shapes (bench_forward's 16k tokens per batch, 16 heads, bf16; each launched explicitly through forward._launch):
n176 (main's unmasked d128 shape) twice (an A/A pair), n160 (the same walk on 160-key tiles) and chain (the chained
walk on them). Prints each shape's speed over cuDNN's, as bench_sustained does. Runs on the tree of commit 94bc81c
(176-key tiles were deleted after call 3: tag forward-176-key-tiles-last).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_forward  # noqa: E402
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms  # noqa: E402
from hf_flashpatch.kernels.heuristics import TileShape  # noqa: E402

N176 = TileShape(block_m=128, block_n=176, num_warps=12, kv_stages=2, wgmma=True, kv_cluster=2, tma_output=True)
N160 = dataclasses.replace(N176, block_n=160)
SHAPES = {"n176": N176, "n176-again": N176, "n160": N160, "chain": dataclasses.replace(N160, chained_walk=True)}
if "--no-176" in sys.argv:  # trees after 31f439e: the 176-key width deleted; n160 twice is the A/A pair
    sys.argv.remove("--no-176")
    SHAPES = {"n160": N160, "n160-again": N160, "chain": SHAPES["chain"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}; {args.rounds} rounds of {args.seconds} s per implementation, in turns")
    for seqlen in args.seqlens:
        batch, heads, q, k, v = bench_forward._inputs(seqlen, 128)
        flops = 4 * batch * heads * seqlen * seqlen * 128
        fns = {"cudnn": bench_forward._sdpa(q, k, v, False, "cudnn")}
        fns.update({name: bench_forward._ours(q, k, v, False, shape) for name, shape in SHAPES.items()})
        assert torch.equal(fns["chain"]()[0], fns["n160"]()[0]), "the chained walk changed bits"
        times = time_rounds(fns, args.rounds, timer=lambda fn: time_sustained_ms(fn, args.seconds))
        cells = []
        for name in SHAPES:
            ratio, low, high = speed_ratio(times[name], times["cudnn"])
            cells.append(f"{name} {ratio:.3f} ({low:.3f}-{high:.3f})")
        tflops = flops / median_ms(times["cudnn"]) / 1e9
        print(f"d128 {seqlen:6d} full  cudnn {tflops:6.1f} TFLOP/s  ours/cudnn: " + "  ".join(cells), flush=True)
        del q, k, v, fns
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
