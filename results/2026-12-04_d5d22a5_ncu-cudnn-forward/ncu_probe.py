"""Probe: one forward call of ours or cuDNN's at an issue-14 shape, for ncu (two warm-up calls, then the profiled one).

Usage: python ncu_probe.py {ours|cudnn} HEAD_DIM BATCH SEQLEN {full|causal}
"""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

impl, d, batch, seqlen, mask = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
causal = mask == "causal"
heads = 2048 // d
torch.manual_seed(0)
q, k, v = (torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if impl == "ours":
    import hf_flashpatch
    call = lambda: hf_flashpatch.flash_attn_func(q, k, v, causal=causal)  # noqa: E731
else:
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))  # (B, H, S, D) views, as the model hands them to sdpa

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
for _ in range(3):
    out = call()
torch.cuda.synchronize()
print(impl, d, batch, seqlen, mask, "finite", bool(torch.isfinite(out).all()))
