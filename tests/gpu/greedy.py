"""Comparing greedy generations of two attention backends in half precision.

Two correct backends can pick different tokens where the top two logits are closer than half
precision resolves; after that the continuations differ completely. A divergence is accepted only at
such a near-tie, judged against the same-precision torch error: the fp32 logit gap between the two
choices must be within twice the max error of transformers' ``sdpa`` run in the model's half dtype
(vs an fp32 run of the same model) at that position.
"""

from __future__ import annotations

import torch


def _last_logits(model, ids: torch.Tensor, attn: str, dtype) -> torch.Tensor:
    model.set_attn_implementation(attn)
    with torch.no_grad():
        return model.to(dtype)(input_ids=ids).logits[0, -1].float()


def first_divergence_is_near_tie(model, context: list[int], got: list[int], want: list[int],
                                 reference: str = "sdpa") -> tuple[bool, str]:  # fmt: skip
    """``context``: the prompt's real tokens; ``got``/``want``: the two generated continuations; ``reference``:
    transformers' attention that judges (``eager`` for architectures without sdpa). The model is left under it."""
    step = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if step is None:
        return (len(got) == len(want), f"lengths {len(got)} vs {len(want)}")
    half = next(model.parameters()).dtype
    ids = torch.tensor([context + got[:step]], device=next(model.parameters()).device)
    exact = _last_logits(model, ids, reference, torch.float32)
    torch_half = _last_logits(model, ids, reference, half)
    model.to(half)
    gap = (exact[got[step]] - exact[want[step]]).abs().item()
    tolerance = 2 * (torch_half - exact).abs().max().item()
    return gap <= tolerance, f"diverges at new token {step}: fp32 logit gap {gap:.3g} vs tolerance {tolerance:.3g}"
