"""One attention forward (+ backward) call on random inputs, for a hardware-counter profiler (needs a GPU).

    ncu --clock-control none --kernel-name regex:bwd_dkdv --launch-skip 1 --launch-count 1 --set full \\
        python scripts/profile_kernel.py --head-dim 64 --seqlen 16384 --causal --backward

Layout: q ``(1, S, H, D)``, k/v ``(1, S, H_kv, D)`` with ``H * D = 2048`` (the benchmark config) and GQA 4.
The call runs twice (the first compiles and loads the kernels: give the profiler ``--launch-skip 1``), so
the profiled launch sees warm caches and a loaded module, as in the benchmark's timed calls.
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--seqlen", type=int, default=16384)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--backward", action="store_true", help="also run the backward pass")
    args = parser.parse_args()

    import hf_flashpatch

    heads = 2048 // args.head_dim
    shape_q = (1, args.seqlen, heads, args.head_dim)  # (B, S, H, D)
    shape_kv = (1, args.seqlen, heads // 4, args.head_dim)  # (B, S, H_kv, D)
    q = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
    k = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
    v = torch.randn(shape_kv, device="cuda", dtype=torch.bfloat16, requires_grad=args.backward)
    dout = torch.randn(shape_q, device="cuda", dtype=torch.bfloat16)
    for _ in range(2):
        out = hf_flashpatch.flash_attn_func(q, k, v, causal=args.causal)
        if args.backward:
            out.backward(dout)
    torch.cuda.synchronize()
    print(f"ran {shape_q} causal={args.causal} backward={args.backward}: out finite {bool(out.isfinite().all())}")


if __name__ == "__main__":
    main()
