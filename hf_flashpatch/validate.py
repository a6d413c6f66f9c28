"""Input checks for the public API. Every error names what was received."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def _fail(message: str):
    raise ValueError(message)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, packed: bool) -> None:
    """Batched: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``. Packed: q ``(T_q, H, D)``, k/v ``(T_k, H_kv, D)``."""
    names = ("q", "k", "v")
    rank = 3 if packed else 4
    layout = "(total, heads, head_dim)" if packed else "(batch, seqlen, heads, head_dim)"
    for name, t in zip(names, (q, k, v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != rank:
            _fail(f"{name} must be {rank}-D {layout}, got shape {tuple(t.shape)}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        _fail(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape != v.shape:
        _fail(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if not packed and k.shape[0] != q.shape[0]:
        _fail(f"q and k must have the same batch, got {tuple(q.shape)} and {tuple(k.shape)}")
    head_dim = q.shape[-1]
    if k.shape[-1] != head_dim:
        _fail(f"q and k must have the same head_dim, got {tuple(q.shape)} and {tuple(k.shape)}")
    if head_dim == 0 or head_dim > MAX_HEAD_DIM:
        _fail(f"head_dim must be in 1..{MAX_HEAD_DIM}, got {head_dim} (q shape {tuple(q.shape)})")
    heads, kv_heads = q.shape[-2], k.shape[-2]
    if kv_heads == 0 or heads % kv_heads != 0:
        _fail(f"k/v heads must divide q heads (GQA/MQA), got {heads} q heads and {kv_heads} kv heads")


def check_cu_seqlens(cu: torch.Tensor, total: int, name: str, device: torch.device) -> None:
    if cu.dim() != 1 or cu.numel() < 2:
        _fail(f"{name} must be 1-D (num_seqs + 1,), got shape {tuple(cu.shape)}")
    if cu.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {cu.dtype}")
    if cu.device != device:
        _fail(f"{name} must be on {device}, got {cu.device}")


def check_softcap_window(softcap, window) -> None:
    if softcap is not None and softcap < 0:
        _fail(f"softcap must be > 0 or None, got {softcap}")
    if window is not None and not (isinstance(window, (tuple, list)) and len(window) == 2):
        _fail(f"window must be a (left, right) pair (None or -1 = unbounded), got {window!r}")
