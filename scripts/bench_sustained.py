"""Ours against torch SDPA's cuDNN backend in the sustained regime: the attention rows of the cuDNN table (issue
criteria in the README), each implementation called back to back for ``--seconds`` per round, in turns, ``--rounds``
rounds (``bench_timing.time_sustained_ms``).

    python scripts/bench_sustained.py [--seconds 1.0] [--rounds 5] [--seqlens 2048 16384] [--head-dims 128 64]
                                      [--masks full causal] [--parts forward backward]

Why a second timing: ``bench_forward`` / ``bench_backward`` time about 40 ms of calls per round, each after an L2
flush (``triton.testing.do_bench``), so a round starts from whatever clock the GPU had after the last one. Under a
long tensor-core load the H200's SM clock settles well below its maximum (1680 MHz for the d128 forward at 16k,
1770-1845 for the d128 backward; ``results/2026-12-04_29f4940_power-probe``), which is the state a training run
sees. Both timings are printed side by side in the results that quote them.

Shapes as the quick tables: 16k tokens per batch (batch = 16384 // seqlen), hidden 2048 (heads = 2048 // head_dim),
bf16, seqlens 2k and 16k and head dims 128 and 64 unless given (--seqlens 4096 8192: the lengths between), causal
and not; forward TFLOP/s = 4 B H S^2 D / t, backward (the backward alone, as ``bench_backward``: ours on the forward
kernel's out / lse, cuDNN by autograd on a retained graph) 2.5x that, both halved for causal. A row is the median of
its rounds; the ratio is the median of the per-round ratios, with their range.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_backward  # noqa: E402
import bench_forward  # noqa: E402
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms  # noqa: E402

SEQLENS = (2048, 16384)
HEAD_DIMS = (128, 64)


def _row(part: str, head_dim: int, seqlen: int, causal: bool, fns: dict, flops: float, rounds: int,
         seconds: float) -> str:  # fmt: skip
    times = time_rounds(fns, rounds, timer=lambda fn: time_sustained_ms(fn, seconds))
    ours, cudnn = times["ours"], times["cudnn"]
    ratio, low, high = speed_ratio(ours, cudnn)
    tflops = {name: flops / median_ms(t) / 1e9 for name, t in (("ours", ours), ("cudnn", cudnn))}
    return (f"{part:8s} d{head_dim:<4d} {seqlen:6d} {'causal' if causal else 'full':6s} ours {tflops['ours']:6.1f} "
            f"cudnn {tflops['cudnn']:6.1f} TFLOP/s  ours/cudnn {ratio:.3f} (rounds {low:.3f}-{high:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back seconds per implementation and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seqlens", type=int, nargs="+", default=list(SEQLENS), help="tokens per sequence")
    parser.add_argument("--head-dims", type=int, nargs="+", default=list(HEAD_DIMS))
    parser.add_argument("--masks", nargs="+", choices=("full", "causal"), default=["full", "causal"])
    parser.add_argument("--parts", nargs="+", choices=("forward", "backward"), default=["forward", "backward"])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_sustained needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}; {args.rounds} rounds of {args.seconds} s per implementation, in turns")
    for head_dim in args.head_dims:
        for causal in [mask == "causal" for mask in args.masks]:
            for seqlen in args.seqlens:
                batch, heads, q, k, v = bench_forward._inputs(seqlen, head_dim)
                flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
                if "forward" in args.parts:
                    fns = {"ours": bench_forward._ours(q, k, v, causal),
                           "cudnn": bench_forward._sdpa(q, k, v, causal, "cudnn")}  # fmt: skip
                    print(_row("forward", head_dim, seqlen, causal, fns, flops, args.rounds, args.seconds), flush=True)
                if "backward" in args.parts:
                    dout = torch.randn_like(q)
                    fns = {"ours": bench_backward._ours(q, k, v, dout, causal, False),
                           "cudnn": bench_backward._sdpa(q, k, v, dout, causal, "cudnn")}  # fmt: skip
                    print(_row("backward", head_dim, seqlen, causal, fns, bench_backward.BWD_FLOP_FACTOR * flops,
                               args.rounds, args.seconds), flush=True)  # fmt: skip
                del q, k, v, fns
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
