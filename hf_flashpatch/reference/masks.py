"""Which keys a query may see: the one definition of causal / sliding-window visibility.

Layout convention used across hf_flashpatch: queries and keys are indexed from the start of their
own sequence. Query ``i`` of a sequence with ``seqlen_q`` queries and ``seqlen_k`` keys sits at key
position ``i + (seqlen_k - seqlen_q)`` ("bottom-right" alignment: the queries are the last tokens,
as in decoding with a KV cache and in flash-attn >= 2.1).

``window = (left, right)``: query ``i`` sees key ``j`` iff
``i + offset - left <= j <= i + offset + right``; ``None`` on a side means unbounded.
Causal is ``right = 0``. transformers' ``sliding_window=W`` is ``left = W - 1``.
"""

from __future__ import annotations

import torch


def normalize_window(window, causal: bool) -> tuple[int, int]:
    """Return ``(left, right)`` with -1 meaning unbounded; causal clamps ``right`` to 0."""
    if window is None:
        left, right = -1, -1
    else:
        if not (isinstance(window, (tuple, list)) and len(window) == 2):
            raise ValueError(f"window must be a (left, right) pair of ints or None, got {window!r}")
        left = -1 if window[0] is None or window[0] < 0 else int(window[0])
        right = -1 if window[1] is None or window[1] < 0 else int(window[1])
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return left, right


def visibility_mask(
    seqlen_q: int, seqlen_k: int, left: int, right: int, device=None, q_range=None, k_range=None
) -> torch.Tensor:
    """Bool ``(seqlen_q, seqlen_k)``: True where query i may attend to key j (bottom-right aligned).

    ``q_range=(q0, q1)`` / ``k_range=(k0, k1)`` return only that tile, ``(q1 - q0, k1 - k0)``.
    """
    offset = seqlen_k - seqlen_q
    q0, q1 = q_range or (0, seqlen_q)
    k0, k1 = k_range or (0, seqlen_k)
    qpos = torch.arange(q0, q1, device=device)[:, None] + offset  # (tile_q, 1) key-space position
    kpos = torch.arange(k0, k1, device=device)[None, :]  # (1, tile_k)
    mask = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= kpos >= qpos - left
    if right >= 0:
        mask &= kpos <= qpos + right
    return mask
