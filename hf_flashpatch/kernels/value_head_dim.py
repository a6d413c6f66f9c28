"""A value head dim of its own (multi-head latent attention), or a head dim no build takes, on kernels that take a few
head dims, by exact zero-padding.

MLA models (DeepSeek-V2/V3, GLM-4-MoE-Lite, MiniCPM3, ...) attend with a q/k head dim ``D`` (192 for
DeepSeek-V3: 128 without RoPE + 64 with it) and a value head dim ``D_v`` (128). The forward op
(``hf_flashpatch::attention_forward``) and its backward take every such pair:

- on Hopper at 192/128 the forward kernel takes the pair itself (``cuda/fwd_hopper_ws.cu``,
  :func:`~hf_flashpatch.kernels.heuristics.native_value_head_dim`), and so does the backward (``cuda/bwd_hopper.cuh``,
  :func:`~hf_flashpatch.kernels.heuristics.native_backward_value_head_dim`) but with softcap or
  ``deterministic=True``, whose gradients run on zero-padded inputs (:func:`padded_gradients`);
- every other pair, and other GPUs, run the forward on zero-padded inputs as well (:func:`padded_attention`).

The same route serves one head dim up to 256 that no build takes (16, 48, 80 as in Phi-2 and StableLM, 160, ...;
``D_v = D``): q, k and v are padded to the next build head dim, forward and backward (on Hopper 96 is
skipped: :func:`~hf_flashpatch.kernels.heuristics.padding_head_dims`). The decode kernels take 80
themselves (``decode_config.SUPPORTED_HEAD_DIMS``).

Zero-padding to one kernel head dim ``P`` (:func:`padded_head_dim`: the smallest the forward, or the backward,
kernels take; they differ, 192 being a backward head dim only) is exact:

- q and k get ``P - D`` zero columns: every score ``q . k`` is unchanged, since the added products are
  ``0 * 0``; the softmax, its ``lse`` and the causal/window masks are unchanged too. The scale must be
  the original ``1 / sqrt(D)``, so it is always passed explicitly (``None`` would become ``1 / sqrt(P)``);
- v gets ``P - D_v`` zero columns: the output's first ``D_v`` columns are the attention output, the
  rest are exactly 0 and are sliced off;
- the backward, with ``A`` the attention probabilities: ``dO`` and ``O`` padded with zero columns leave
  ``rowsum(dO * O)`` unchanged; ``dA = dO V^T`` is unchanged (zero columns on both sides), so ``dS`` is;
  ``dQ = dS K``, ``dK = dS^T Q`` and ``dV = A^T dO`` come back with zero padded columns, sliced off.

The cost of the padded parts: the kernel does the work of head dim ``P``, i.e. ``P / D`` times the ``Q K^T``
work and ``P / D_v`` times the ``P V`` work (a 192/128 forward off Hopper pads to 256: 1.33x and 2x; its backward pads
v only, to 192), plus one copy of each padded tensor. Decoding over a cache is served by the decode kernels at ``D_v`` directly
(``cuda/decode.cu`` ``HEAD_DIM_V``), never by padding the whole cache at every step.

Layout: q ``(..., H, D)``, k ``(..., H_kv, D)``, v ``(..., H_kv, D_v)`` (batched ``(batch, seqlen, heads,
head_dim)`` or packed ``(total, heads, head_dim)``); out and dout ``(..., H, D_v)``.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def padded_head_dim(head_dim: int, head_dim_v: int, kernel_head_dims: tuple[int, ...]) -> int:
    """``P``: the smallest of ``kernel_head_dims`` (ascending: the forward's or the backward's) >= both ``D`` and
    ``D_v``; ``max(D, D_v)`` itself when none is that large (the kernels then decline the padded call, which
    takes their torch path)."""
    need = max(head_dim, head_dim_v)
    return next((d for d in kernel_head_dims if d >= need), need)


def _zero_padded(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t (..., d)`` with ``width - d`` zero columns appended; ``t`` itself when it is that wide already (F.pad
    would copy it)."""
    return t if t.shape[-1] == width else F.pad(t, (0, width - t.shape[-1]))


def padded_attention(
    attend: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    kernel_head_dims: tuple[int, ...],
    softmax_scale: float | None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``attend(q', k', v', softmax_scale=scale, **kwargs)`` on zero-padded inputs of one head dim ``P``
    (:func:`padded_head_dim` among ``kernel_head_dims``), returning ``(out (..., H, D_v) contiguous, lse)``.

    ``attend`` is any attention with equal q/k/v head dims that returns ``(out, lse)``: the forward kernel's
    launch, or a torch attention in a test. ``softmax_scale=None`` means ``1 / sqrt(D)``, D being q's
    (not ``P``): see the module docstring for why the result, and its gradient, are exact.
    """
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    if k.shape[-1] != head_dim:
        raise ValueError(f"q and k must share a head dim, got q {tuple(q.shape)} and k {tuple(k.shape)}")
    width = padded_head_dim(head_dim, head_dim_v, kernel_head_dims)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    q_p, k_p, v_p = (_zero_padded(t, width) for t in (q, k, v))  # (..., H or H_kv, P)
    out, lse = attend(q_p, k_p, v_p, softmax_scale=scale, **kwargs)  # out (..., H, P): columns D_v.. are 0
    return out[..., :head_dim_v].contiguous(), lse  # (..., H, D_v)


def padded_gradients(
    backward: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    kernel_head_dims: tuple[int, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of an attention whose v has a head dim of its own, by ``backward(dout', q', k', v',
    out')`` on zero-padded inputs of one head dim ``P`` (:func:`padded_head_dim` among ``kernel_head_dims``);
    ``backward`` closes over the rest (lse, the explicit scale, masks). Returns contiguous gradients of q's, k's
    and v's shapes. dout/out ``(..., H, D_v)``; see the module docstring for why the result is exact."""
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    width = padded_head_dim(head_dim, head_dim_v, kernel_head_dims)
    dq, dk, dv = backward(*(_zero_padded(t, width) for t in (dout, q, k, v, out)))  # each (..., P)
    return dq[..., :head_dim].contiguous(), dk[..., :head_dim].contiguous(), dv[..., :head_dim_v].contiguous()
