"""What a work costs beside its key tiles in the masked Hopper walks (heuristics.WORK_TILE_OVERHEAD, 1 key tile in the
schedule model): 2048 works of one query tile each (bottom-right causal: the tile sees k key tiles, the last its
diagonal), k = 1, 2, 4, 8, 16, kernel time in CUDA graphs; a line through T(k) gives the overhead in key tiles
(intercept / slope). d128 (128-row tiles, 16 heads) and d64 (192-row tiles, 32 heads).

    python overhead_probe.py [--rounds 3]
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "2026-12-07_d64-dealt-walk"))
from walk_probe import graph_ms, rand  # noqa: E402

from hf_flashpatch.kernels import forward  # noqa: E402
from hf_flashpatch.kernels.heuristics import forward_tile_shape  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    for d, heads in ((128, 16), (64, 32)):
        rows = forward_tile_shape(d, "sm_90a", True).block_m
        batch = 2048 // heads
        points = []
        for k in (1, 2, 4, 8, 16):
            keys = 128 * k
            q, kk, v = rand(batch, rows, heads, d), rand(batch, keys, heads, d), rand(batch, keys, heads, d)
            call = lambda: forward._launch(q, kk, v, None, None, None, None, None, True, -1, 0, None)  # noqa: E731
            t = statistics.median(graph_ms(call) for _ in range(args.rounds))
            points.append((k, t * 1e3))
            del q, kk, v
        n = len(points)
        mean_k = sum(k for k, _ in points) / n
        mean_t = sum(t for _, t in points) / n
        slope = sum((k - mean_k) * (t - mean_t) for k, t in points) / sum((k - mean_k) ** 2 for k, _ in points)
        intercept = mean_t - slope * mean_k
        fit = max(abs(t - (intercept + slope * k)) / t for k, t in points)
        print(f"d{d} causal, {rows}-row tiles, 2048 one-tile works: " + ", ".join(f"k={k} {t:.1f} us" for k, t in points))
        print(f"  T(k) = {intercept:.1f} + {slope:.1f} k us (worst residual {fit:.1%}): a work's overhead "
              f"{intercept / slope:.2f} key tiles")


if __name__ == "__main__":
    main()
