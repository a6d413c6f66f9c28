"""Inputs at an address that is not 16-byte aligned, yet contiguous (``x[1:]`` of a flat buffer, viewed): the kernels
read 16-byte chunks and TMA boxes, so the launch copies such tensors to a fresh allocation first. The forward and
backward, and the decode's q, must give exactly what the same values at an aligned address give, by the kernels.

Layouts: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``.
"""

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch as hfp  # noqa: E402
from hf_flashpatch.kernels import backward, forward  # noqa: E402


def _unaligned_copy(t: torch.Tensor) -> torch.Tensor:
    """The values of ``t``, contiguous, starting 2 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    moved = flat[1:].view(t.shape)
    moved.copy_(t)
    assert moved.is_contiguous() and moved.data_ptr() % 16 == 2
    return moved


@pytest.fixture
def kernel_launches(monkeypatch):
    calls = []
    real_forward, real_backward = forward._launch, backward._kernel_backward
    monkeypatch.setattr(forward, "_launch", lambda *a, **kw: calls.append("forward") or real_forward(*a, **kw))
    monkeypatch.setattr(backward, "_kernel_backward",
                        lambda *a, **kw: calls.append("backward") or real_backward(*a, **kw))  # fmt: skip
    return calls


@pytest.mark.parametrize("heads, kv_heads, head_dim", [(8, 8, 128), (8, 2, 64), (4, 1, 64)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True])
def test_unaligned_inputs_give_the_aligned_results(heads, kv_heads, head_dim, causal, kernel_launches):
    torch.manual_seed(0)
    shapes = ((2, 239, heads, head_dim), (2, 239, kv_heads, head_dim), (2, 239, kv_heads, head_dim))
    q, k, v = (torch.randn(s, device="cuda", dtype=torch.bfloat16) for s in shapes)
    dout = torch.randn(2, 239, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    results = []
    for move in (lambda t: t.clone(), _unaligned_copy):
        leaves = [move(t).requires_grad_() for t in (q, k, v)]
        out = hfp.flash_attn_func(*leaves, causal=causal)
        out.backward(move(dout))
        results.append((out.detach(), *(t.grad for t in leaves)))
    for aligned_result, unaligned_result in zip(*results):
        assert torch.isfinite(aligned_result).all() and torch.equal(aligned_result, unaligned_result)
    assert kernel_launches == ["forward", "backward"] * 2  # the kernels served both, no fallback


def test_decode_with_an_unaligned_q_gives_the_aligned_result():
    torch.manual_seed(0)
    q = torch.randn(4, 1, 8, 128, device="cuda", dtype=torch.bfloat16)  # (B, 1, H, D)
    k, v = (torch.randn(4, 1023, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))  # (B, S, H_kv, D)
    lens = torch.tensor([1, 113, 1023, 700], dtype=torch.int32, device="cuda")
    want = hfp.flash_attn_with_kvcache(q, k, v, lens)
    got = hfp.flash_attn_with_kvcache(_unaligned_copy(q), k, v, lens)
    assert torch.isfinite(want).all() and torch.equal(want, got)
