"""What the last round of works costs: d128 forward time per work at 2048 works (15.52 rounds on 132 SMs) against
shapes of exactly 16 rounds (2112 works) and 12 rounds (1584), ours and cuDNN in turns (sustained timing).

    python probe.py [--seconds 0.5] [--rounds 3]

If a walk pays for the whole last round, time per work at 2048 works is about 1.031x that at 2112 (16 rounds either
way); if it balances the last round, the two match. Shapes: (batch, heads) at each seqlen, bf16, (B, S, H, D).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_forward  # noqa: E402
from bench_timing import median_ms, time_rounds, time_sustained_ms  # noqa: E402

SHAPES = {  # seqlen: [(batch, heads), ...]; works = batch * heads * seqlen / 128
    2048: [(8, 16), (6, 22), (9, 11)],
    4096: [(4, 16), (3, 22)],
    8192: [(2, 16), (1, 33)],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, {sms} SMs; us per work (one 128-row query tile of one head)")
    for causal in (False, True):
        for seqlen, shapes in SHAPES.items():
            if causal and seqlen == 8192:
                continue
            base = {}
            for batch, heads in shapes:
                q, k, v = (torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
                           for _ in range(3))  # (B, S, H, D)
                works = batch * heads * seqlen // 128
                fns = {"ours": bench_forward._ours(q, k, v, causal),
                       "cudnn": bench_forward._sdpa(q, k, v, causal, "cudnn")}  # fmt: skip
                times = time_rounds(fns, args.rounds, timer=lambda fn: time_sustained_ms(fn, args.seconds))
                per_work = {name: median_ms(t) * 1000 / works for name, t in times.items()}
                base = base or per_work
                print(f"{'causal' if causal else 'full':6s} {seqlen:5d} B{batch:<2d} H{heads:<2d} works {works:5d} "
                      f"rounds {works / sms:6.2f}  us/work ours {per_work['ours']:7.3f} cudnn {per_work['cudnn']:7.3f}"
                      f"  ours/cudnn speed {per_work['cudnn'] / per_work['ours']:.3f}  per work vs first row: ours "
                      f"{per_work['ours'] / base['ours']:.3f} cudnn {per_work['cudnn'] / base['cudnn']:.3f}",
                      flush=True)
                del q, k, v, fns
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
