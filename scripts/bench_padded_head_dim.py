"""Head dims no wgmma body takes (80: Phi-2 and StableLM; 96: Phi-3-mini), against torch SDPA's cuDNN backend in
the same run: the call zero-padded to 96 (80's width before; 96 as it is: the mma.sync bodies) beside the same call
zero-padded to 128 (the Hopper wgmma bodies), which decides the padding width on Hopper
(``heuristics.padding_head_dims``).

    python scripts/bench_padded_head_dim.py [--seconds 0.5] [--rounds 5] [--seqlen 4096]

Shapes as ``bench_sustained``: 16k tokens per batch, hidden 2048 (heads = 2048 // head_dim), bf16, causal and not;
TFLOP/s counted at the model's head dim (4 B H S^2 D forward, 2.5x that backward, halved for causal), so padding
shows as lost speed. Each implementation is called back to back for ``--seconds`` per round, in turns. The padded
calls include their pad and slice copies, as the ops run them (:mod:`hf_flashpatch.kernels.value_head_dim`). Each
row also prints the largest difference of each width's out (forward) or dq (backward) from cuDNN's.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_backward  # noqa: E402
import bench_forward  # noqa: E402
from bench_timing import median_ms, speed_ratio, time_rounds, time_sustained_ms  # noqa: E402

HEAD_DIMS = (80, 96)
WIDTHS = (96, 128)  # the mma.sync bodies' head dim, the wgmma bodies'


def _forward_at(width, q, k, v, causal):
    """The forward kernel on q, k, v zero-padded to ``width``: ``() -> (out, lse)``."""
    from hf_flashpatch.kernels import forward
    from hf_flashpatch.kernels.value_head_dim import padded_attention

    def launch(q_p, k_p, v_p, softmax_scale):  # (B, S, H, width) each
        return forward._launch(q_p, k_p, v_p, None, None, 0, 0, softmax_scale, causal, -1, 0 if causal else -1, 0.0)

    return lambda: padded_attention(launch, q, k, v, kernel_head_dims=(width,), softmax_scale=None)


def _backward_at(width, q, k, v, dout, causal):
    """The backward kernel alone at ``width`` (the body the heuristics give that head dim), on the forward's out / lse:
    ``() -> (dq, dk, dv)``."""
    from hf_flashpatch.kernels import backward
    from hf_flashpatch.kernels.build import device_arch
    from hf_flashpatch.kernels.value_head_dim import padded_gradients

    out, lse = _forward_at(width, q, k, v, causal)()
    cfg = backward.BackwardConfig.choose(width, q.dtype, False, device_arch(q.device))
    scale, seqlen = 1.0 / math.sqrt(q.shape[-1]), q.shape[1]

    def run(dout_p, q_p, k_p, v_p, out_p):  # (B, S, H, width) each
        return backward._kernel_backward(cfg, dout_p, q_p, k_p, v_p, out_p, lse, None, None, None, seqlen, seqlen,
                                         scale, -1, 0 if causal else -1, 0.0, False)  # fmt: skip

    return lambda: padded_gradients(run, dout, q, k, v, out, kernel_head_dims=(width,))


def _largest_differences(fns: dict, reference) -> str:
    """``name |diff|`` of each width's first result (out, or dq) from ``reference``'s."""
    want = reference.float()
    return " ".join(f"{name} {(fn()[0].float() - want).abs().max().item():.2e}" for name, fn in fns.items())


def _row(part, head_dim, seqlen, causal, fns, flops, rounds, seconds) -> str:
    times = time_rounds(fns, rounds, timer=lambda fn: time_sustained_ms(fn, seconds))
    cells = []
    for name in fns:
        if name == "cudnn":
            continue
        ratio, low, high = speed_ratio(times[name], times["cudnn"])
        cells.append(f"{name} {flops / median_ms(times[name]) / 1e9:6.1f} ({ratio:.3f}, {low:.3f}-{high:.3f})")
    cudnn = flops / median_ms(times["cudnn"]) / 1e9
    return (f"{part:8s} d{head_dim:<3d} {seqlen:6d} {'causal' if causal else 'full':6s} cudnn {cudnn:6.1f}  "
            + "  ".join(cells) + "  TFLOP/s (x cudnn, rounds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="back-to-back seconds per implementation and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seqlen", type=int, default=4096)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_padded_head_dim needs a CUDA GPU")
    print(f"{torch.cuda.get_device_name()}; {args.rounds} rounds of {args.seconds} s per implementation, in turns")
    seqlen = args.seqlen
    for head_dim in HEAD_DIMS:
        for causal in (False, True):
            batch, heads, q, k, v = bench_forward._inputs(seqlen, head_dim)
            flops = 4 * batch * heads * seqlen * seqlen * head_dim / (2 if causal else 1)
            fns = {f"pad{w}": _forward_at(w, q, k, v, causal) for w in WIDTHS}
            cudnn = bench_forward._sdpa(q, k, v, causal, "cudnn")
            diffs = _largest_differences(fns, cudnn().transpose(1, 2))  # (B, H, S, D) -> (B, S, H, D)
            fns["cudnn"] = cudnn
            print(_row("forward", head_dim, seqlen, causal, fns, flops, args.rounds, args.seconds), flush=True)
            print(f"  |out - cudnn| {diffs}")
            dout = torch.randn_like(q)
            fns = {f"pad{w}": _backward_at(w, q, k, v, dout, causal) for w in WIDTHS}
            cudnn = bench_backward._sdpa(q, k, v, dout, causal, "cudnn")
            diffs = _largest_differences(fns, cudnn()[0].transpose(1, 2))  # dq (B, H, S, D) -> (B, S, H, D)
            fns["cudnn"] = cudnn
            print(_row("backward", head_dim, seqlen, causal, fns, bench_backward.BWD_FLOP_FACTOR * flops, args.rounds,
                       args.seconds), flush=True)  # fmt: skip
            print(f"  |dq - cudnn| {diffs}")
            del q, k, v, dout, fns
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
