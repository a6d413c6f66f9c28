"""The caching allocator during the 16-layer fine-tune step at one 4k sequence, per backend (needs a CUDA GPU).

    python results/2026-12-07_finetune-4k-profile/alloc_check.py

After two warm-up steps, counts over four timed steps the device allocations and frees the caching allocator made
(cudaMalloc / cudaFree; a cudaFree synchronises the device, which would idle the GPU) and its retries, and prints
the steps' wall time. Run from the repository root.
"""

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from bench_training import llama_1b, train_step  # noqa: E402

KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")
for attn in ("sdpa", "hfpatch", "sdpa", "hfpatch"):
    model = llama_1b(16, attn)
    for _ in range(2):
        train_step(model, 4096)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    start = time.perf_counter()
    for _ in range(4):
        train_step(model, 4096)
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / 4 * 1e3
    after = torch.cuda.memory_stats()
    counts = " ".join(f"{key} {after.get(key, 0) - before.get(key, 0)}" for key in KEYS)
    print(f"{attn:8s} step {wall:6.1f} ms  {counts}  peak {after['allocated_bytes.all.peak'] / 2**30:.1f} GiB")
    del model
    torch.cuda.empty_cache()
