"""Where the unmasked d128 forward's time goes at short sequences: kernel time over batch and length (session 47).

    python results/2026-12-05_chain-boundary/boundary_sweep.py [--replays 20]

Each shape runs on 160-key tiles work by work ("n160") and by the chained walk ("chain", served at every length
here). Kernel time is the mean call of a CUDA graph of 10 calls (bench_decode's timer), in turns, median of rounds.
Two fits separate the costs (bf16, 16 heads, layout (batch, seqlen, heads, head_dim)):
- at 2048 keys, time over batch 8 / 16 / 32 (16 / 32 / 63 works a CTA at most): the slope is a work's time (13
  key tiles and one work boundary), the intercept the launch's fixed cost (ramp and drain);
- at 2048 works (16k tokens), time over 2k / 4k / 8k / 16k: the slope per key tile of every work (the steady
  step), the intercept the per-work cost beside the key tiles.
"""

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import bench_decode  # noqa: E402
import bench_forward  # noqa: E402
from hf_flashpatch.kernels import heuristics  # noqa: E402

N160 = dataclasses.replace(heuristics.HOPPER_SHAPES[(128, False)], chained_walk=False)
SHAPES = {"n160": N160, "chain": dataclasses.replace(N160, chained_walk=True)}
heuristics.CHAINED_WALK_MAX_KEYS = 1 << 30  # the chain at every length (a measurement, not a dispatch rule)
CASES = [(8, 2048), (16, 2048), (32, 2048), (4, 4096), (2, 8192), (1, 16384)]


def _fit(xs, ys):
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).multi_processor_count, "SMs")
    us = {}
    for batch, seqlen in CASES:
        torch.manual_seed(batch * seqlen)
        q, k, v = (torch.randn(batch, seqlen, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fns = {name: bench_forward._ours(q, k, v, False, shape) for name, shape in SHAPES.items()}
        assert torch.equal(fns["chain"]()[0], fns["n160"]()[0]), "the chained walk changed bits"
        samples = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                samples[name].append(bench_decode._graph_time_us(fn, args.replays))
        for name in fns:
            us[name, batch, seqlen] = statistics.median(samples[name])
        print(f"{batch:3d} x {seqlen:5d}: " + "  ".join(f"{n} {us[n, batch, seqlen]:8.1f} us" for n in fns)
              + f"  chain/n160 {us['chain', batch, seqlen] / us['n160', batch, seqlen]:.3f}", flush=True)
        del q, k, v, fns
    for name in SHAPES:  # a CTA's works come in waves: ceil(works / 132) on an H100 or H200 (132 SMs)
        per_wave, fixed = _fit([16, 32, 63], [us[name, b, 2048] for b in (8, 16, 32)])
        tiles = [-(-s // 160) for s in (2048, 4096, 8192, 16384)]
        per_tile, beside = _fit(tiles, [us[name, b, s] for b, s in ((8, 2048), (4, 4096), (2, 8192), (1, 16384))])
        per_tile, beside = per_tile / 16 * 1e3, beside / 16 * 1e3  # ns a work (16 waves at 2048 works)
        print(f"{name}: 2k: a launch's fixed cost {fixed:5.1f} us, a work {per_wave * 1e3:6.0f} ns"
              f" = 13 key tiles x {per_tile:4.0f} ns + {per_wave * 1e3 - 13 * per_tile:5.0f} ns;"
              f" over lengths at 2048 works: {beside:5.0f} ns a work beside its key tiles")

if __name__ == "__main__":
    main()
