"""One line of host time for the package on PYTHONPATH: the training call (forward + backward through
flash_attn_func), forward._launch, backward._kernel_backward and SDPA's forward + backward (the peer), each the
fastest of five loops of 200 calls (the host's speed moves between periods; the fastest loop is the least
disturbed). GQA 32/8, d64, 1 x 128, causal, bf16, as profile_host.py --training."""
import sys
import time

import torch
import torch.nn.functional as F

import hf_flashpatch as hfp
from hf_flashpatch.kernels import backward, forward

q, k, v = (torch.randn(1, 128, h, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (32, 8, 8))
grad = torch.randn(1, 128, 32, 64, device="cuda", dtype=torch.bfloat16)
sq, sk, sv = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))  # (B, H, S, D)
scale = 64**-0.5
with torch.no_grad():
    out, lse = forward._launch(q, k, v, None, None, 0, 0, scale, True, -1, -1, 0.0)
cfg = backward.check_supported(q, k, v, 0.0)


def fastest_us(fn, calls=200, loops=5):
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(loops):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - start)
    torch.cuda.synchronize()
    return best * 1e6 / calls


rows = {
    "fwd+bwd": lambda: hfp.flash_attn_func(q, k, v, causal=True).backward(grad),
    "_launch": lambda: forward._launch(q, k, v, None, None, 0, 0, scale, True, -1, -1, 0.0),
    "_kernel_backward": lambda: backward._kernel_backward(cfg, grad, q, k, v, out, lse, None, None, None, 128, 128,
                                                          scale, -1, 0, 0.0, False),
    "sdpa fwd+bwd": lambda: F.scaled_dot_product_attention(sq, sk, sv, is_causal=True, enable_gqa=True).backward(
        grad.transpose(1, 2)),
}
print(sys.argv[1], " ".join(f"{name} {fastest_us(fn):7.1f}" for name, fn in rows.items()))
