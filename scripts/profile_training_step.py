"""Where a fine-tuning step's GPU time goes, per attention backend (needs a CUDA GPU).

    python scripts/profile_training_step.py [--layers 4] [--seqlen 4096] [--attn sdpa,sdpa[flash],hfpatch]

Builds the Llama-3.2-1B-shaped model of ``bench_training.py`` (random bf16 weights, ``layers`` layers), runs
one warm-up step and one profiled forward + backward step of one sequence, and prints per backend: the
step's wall time, the summed time of its GPU kernels (wall minus busy = the GPU idling, e.g. on host
syncs), the attention kernels' share, and the kernels with the most total time (ten, or ``--top``) with their launch
counts. ``sdpa[flash]`` holds SDPA to its flash backend; plain ``sdpa`` lets torch choose, as a user's run does.
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_training import llama_1b, train_step  # noqa: E402

ATTENTION_KERNEL_HINTS = ("flash", "fmha", "attention", "hfp_", "bwd_", "cudnn", "sdpa")


def _context(name: str):
    if name == "sdpa[flash]":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    return nullcontext()


def profile(name: str, layers: int, seqlen: int, top: int = 10) -> None:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    attn = "sdpa" if name.startswith("sdpa") else name
    model = llama_1b(layers, attn)
    with _context(name):
        train_step(model, seqlen)  # warm-up: kernel loads, allocator
        torch.cuda.synchronize()
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            train_step(model, seqlen)
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3
    kernels, launches = {}, {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name] = kernels.get(event.name, 0.0) + event.time_range.elapsed_us() / 1e3  # ms
            launches[event.name] = launches.get(event.name, 0) + 1
    busy = sum(kernels.values())
    attention = sum(ms for kname, ms in kernels.items() if any(h in kname.lower() for h in ATTENTION_KERNEL_HINTS))
    print(f"\n== {name}: {layers} layers, seqlen {seqlen}: step {wall_ms:.1f} ms wall, {busy:.1f} ms of kernels "
          f"(GPU idle {wall_ms - busy:.1f} ms), attention kernels {attention:.1f} ms, "
          f"{sum(launches.values())} GPU operations")  # fmt: skip
    for kname, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {ms:8.2f} ms  {launches[kname]:5d}x  {kname[:100]}")
    del model
    torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--attn", default="sdpa,sdpa[flash],hfpatch")
    parser.add_argument("--top", type=int, default=10, help="how many of the kernels with the most time to list")
    args = parser.parse_args()
    for backend in args.attn.split(","):
        profile(backend, args.layers, args.seqlen, args.top)
