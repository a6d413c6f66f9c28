"""The online-softmax state that every tiled kernel carries, in plain torch.

For one query row and the keys seen so far, with scaled (soft-capped) scores ``s_j``:

- ``m``: running maximum of ``s_j`` (``-inf`` while no key has been seen);
- ``d``: running denominator, ``sum_j exp(s_j - m)``;
- ``o``: running *unnormalised* output, ``sum_j exp(s_j - m) * v_j``.

Invariant after any number of ``update``/``merge`` calls: ``o / d`` is the softmax-weighted mean of
the values seen and ``m + log(d)`` is their log-sum-exp. A NaN score makes its row's ``m``, ``d`` and
``o`` NaN (``torch.maximum`` propagates it), and the row normalises to NaN, as torch's softmax does. The CUDA kernels keep the same three fields
in registers (forward), or per split in global memory (split-KV decode, combined by ``merge``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SoftmaxState:
    o: torch.Tensor  # (..., D_v) fp32, unnormalised output (D_v: the values' head dim)
    m: torch.Tensor  # (...,)   fp32, running max score
    d: torch.Tensor  # (...,)   fp32, running sum of exp(score - m)

    @classmethod
    def empty(cls, shape, head_dim: int, device=None) -> "SoftmaxState":
        return cls(
            o=torch.zeros(*shape, head_dim, dtype=torch.float32, device=device),
            m=torch.full(shape, float("-inf"), dtype=torch.float32, device=device),
            d=torch.zeros(shape, dtype=torch.float32, device=device),
        )

    def update(self, scores: torch.Tensor, values: torch.Tensor) -> None:
        """Fold in one tile of N keys. scores ``(..., M, N)`` fp32 (``-inf`` = masked) for the
        state's M query rows; values ``(..., N, D_v)``, broadcast over the leading dims."""
        m_new = torch.maximum(self.m, scores.amax(dim=-1))
        # Rows that have still seen nothing keep m = -inf; use 0 as the shift there so that
        # exp(-inf - 0) = 0 instead of exp(nan).
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        rescale = torch.exp(self.m - shift)  # (...,) shrinks the old accumulator to the new max
        p = torch.exp(scores - shift.unsqueeze(-1))  # (..., N)
        self.o = self.o * rescale.unsqueeze(-1) + torch.matmul(p, values)  # (..., M, D_v)
        self.d = self.d * rescale + p.sum(dim=-1)
        self.m = m_new

    def merge(self, other: "SoftmaxState") -> "SoftmaxState":
        """Combine two states over disjoint key sets (the split-KV combine step)."""
        m = torch.maximum(self.m, other.m)
        shift = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        a, b = torch.exp(self.m - shift), torch.exp(other.m - shift)
        return SoftmaxState(
            o=self.o * a.unsqueeze(-1) + other.o * b.unsqueeze(-1), m=m, d=self.d * a + other.d * b
        )

    def normalize(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(out, lse)``; rows that saw no key give ``out = 0``, ``lse = -inf``; rows with a NaN
        score give NaN (``d != 0`` holds for NaN, where ``d > 0`` would turn it into "no key seen")."""
        seen = self.d != 0
        out = torch.where(seen.unsqueeze(-1), self.o / self.d.clamp_min(1e-30).unsqueeze(-1), 0.0)
        lse = torch.where(seen, self.m + torch.log(self.d.clamp_min(1e-30)), float("-inf"))
        return out, lse
