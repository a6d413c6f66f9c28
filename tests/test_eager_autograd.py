"""Plain eager training calls the attention forward's body through ``EagerAttentionAutograd`` (a
``torch.autograd.Function`` with the op's own autograd), not through the dispatcher: the same outputs and gradients
as the custom op, the backward's body called directly, an unused lse without a gradient, a second derivative refused,
activation checkpointing unchanged, and the op itself wherever torch needs it (a dispatch mode). On the CPU the
bodies take their torch path.

Layout q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``; varlen ``(T, H, D)`` with ``cu_seqlens``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hf_flashpatch.kernels import backward, forward


def _inputs(seed: int, varlen: bool):
    gen = torch.Generator().manual_seed(seed)
    shape = (37, 6, 32) if varlen else (2, 19, 6, 32)  # GQA 6/2 below
    q = torch.randn(*shape, generator=gen, dtype=torch.float32)
    k, v = (torch.randn(*shape[:-2], 2, 32, generator=gen, dtype=torch.float32) for _ in range(2))
    cu = torch.tensor([0, 11, 37], dtype=torch.int32) if varlen else None
    return [t.requires_grad_() for t in (q, k, v)], cu


def _op_args(q, k, v, cu, causal):
    max_len = 26 if cu is not None else 0
    return (q, k, v, cu, cu, max_len, max_len, 0.3, causal, -1, -1, 0.0, False)


def _eager(q, k, v, cu, causal):
    varlen = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=26, max_seqlen_k=26) if cu is not None else {}
    return forward.attention_forward(q, k, v, **varlen, causal=causal, softmax_scale=0.3, window_left=-1,
                                     window_right=-1, softcap=None, torch_fallback=True)  # fmt: skip


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_eager_training_matches_the_op(varlen, causal):
    (q, k, v), cu = _inputs(1, varlen)
    out, lse = _eager(q, k, v, cu, causal)
    assert type(out.grad_fn).__name__ == "EagerAttentionAutogradBackward"
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2))
    (out * weights).sum().add(lse.square().sum()).backward()  # a gradient into both outputs
    eager_grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    op_out, op_lse = forward.attention_forward_op(*_op_args(q, k, v, cu, causal))
    assert "EagerAttention" not in type(op_out.grad_fn).__name__
    (op_out * weights).sum().add(op_lse.square().sum()).backward()
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    for name, got, want in zip("qkv", eager_grads, (q.grad, k.grad, v.grad)):
        assert torch.equal(got, want), name
        assert got.abs().sum() > 0, name


def test_backward_body_runs_without_the_dispatcher(monkeypatch):
    seen_dlse, dispatched = [], []
    body, op = backward._backward_impl, backward._backward_op

    def recording_body(dout, q, k, v, out, lse, dlse, *rest):
        seen_dlse.append(dlse)
        return body(dout, q, k, v, out, lse, dlse, *rest)

    monkeypatch.setattr(backward, "_backward_impl", recording_body)
    monkeypatch.setattr(backward, "_backward_op", lambda *args: dispatched.append(args) or op(*args))
    (q, k, v), _ = _inputs(3, False)
    out, lse = _eager(q, k, v, None, True)
    out.sum().backward()  # lse unused: its gradient stays None, as the op's does
    out, lse = _eager(q, k, v, None, True)
    lse.sum().backward()  # out unused: the body gets zeros for dout
    assert dispatched == []
    assert seen_dlse[0] is None and seen_dlse[1].shape == lse.shape


def test_second_derivative_is_refused():
    (q, k, v), _ = _inputs(4, False)
    out, _lse = _eager(q, k, v, None, False)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grad_q.sum().backward()


class _RecordingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_dispatch_mode_gets_the_op():
    (q, k, v), _ = _inputs(5, False)
    with _RecordingMode() as mode:
        out, _lse = _eager(q, k, v, None, True)
    assert any(name.startswith("hf_flashpatch.attention_forward") for name in mode.ops), mode.ops[:5]
    assert "EagerAttention" not in type(out.grad_fn).__name__


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(use_reentrant):
    """The fine-tuning scripts' gradient checkpointing: the recomputed forward takes the same path and saves the same
    tensors (non-reentrant checkpointing matches them by order)."""
    from torch.utils.checkpoint import checkpoint

    (q, k, v), _ = _inputs(6, False)

    def loss(q, k, v):
        out, lse = _eager(q, k, v, None, True)
        return out.sin().sum() + lse.sum()

    loss(q, k, v).backward()
    plain = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    checkpoint(loss, q, k, v, use_reentrant=use_reentrant).backward()
    for name, want, t in zip("qkv", plain, (q, k, v)):
        assert torch.equal(t.grad, want), name
