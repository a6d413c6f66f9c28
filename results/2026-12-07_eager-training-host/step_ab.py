"""One line for the package on PYTHONPATH: a host-bound training step (the 4-layer Llama-3.2-1B-shaped model of
bench_training at 128 tokens, one sequence) with sdpa and with hfpatch, in ms, each the fastest of five loops of ten
steps, and their ratio."""
import sys
import time

import torch

sys.path.insert(0, "scripts")
from bench_training import llama_1b, train_step  # noqa: E402

import hf_flashpatch as hfp  # noqa: E402


def fastest_ms(model, loops=5, steps=10):
    for _ in range(3):
        train_step(model, 128)
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            train_step(model, 128)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best * 1e3 / steps


times = {}
for attn in ("sdpa", hfp.ATTN_NAME):
    model = llama_1b(4, attn)
    times[attn] = fastest_ms(model)
    del model
print(sys.argv[1], f"sdpa {times['sdpa']:6.2f} hfpatch {times[hfp.ATTN_NAME]:6.2f} "
      f"ratio {times[hfp.ATTN_NAME] / times['sdpa']:.3f}")
