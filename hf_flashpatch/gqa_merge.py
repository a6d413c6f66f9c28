"""Merging the KV heads of a group without throwing the model away: the ``pca`` conversion method.

Mean pooling (``convert.py``'s ``mean``) averages K/V heads as if they lived in one basis. They do
not: each KV head is defined only up to changes of basis that leave every logit unchanged, and heads
trained apart use unrelated ones. This module merges heads *after* choosing, for each, the change of
basis that makes the group agree best, and folds each change into the query / output projections, so
that only the part no change of basis can explain is lost.

The exact changes of basis (one KV head ``j``, the query heads ``h`` that read it):

- **Keys, per RoPE pair.** In transformers' ``rotate_half`` layout, pair ``t`` of a head is the
  complex number ``k_t = k[t] + i·k[t + d/2]`` and RoPE multiplies it by ``e^{i·pos·θ_t}``.
  Multiplying ``k_t`` by any nonzero complex ``z`` commutes with that, and the score
  ``Re Σ_t q_t·conj(k_t)`` is unchanged when every reading query's pair ``t`` is multiplied by
  ``1/conj(z)``. (:func:`check_rope_pairs` verifies the layout on the model at hand.)
- **Values.** Any invertible ``d × d`` map ``A`` on the head's values is undone by right-multiplying
  the ``o_proj`` columns of every reading query head by ``A⁻¹``.

The merge (one layer, one new head replacing a group of ``g`` old heads) is the best one up to those
maps, measured under ``Σ = E[x̂ x̂ᵀ]``, the second moment of the attention input ``x`` after the
input norm with a constant 1 appended (``x̂ = [x, 1]``, so that biases are one more column):

- **Keys.** Write old head ``j``'s pair-``t`` key row as complex ``w_j`` (so ``k_t = w_j·x̂``) and
  ``α_j = Σ_h E|q_{h,t}|²`` for the query energy reading it. Keys are replaced by ``c_j·(w·x̂)`` and
  those queries multiplied by ``conj(c_j)``; that leaves a score error of about
  ``Σ_j α_j E|w_j·x̂ − c_j w·x̂|²`` (when query and key positions are independent, the per-query
  optimal correction is exactly such a complex factor). The minimiser is the top eigenvector ``e``
  of the ``g × g`` Hermitian matrix ``M[j, l] = √(α_j α_l) · w_jᵀ Σ conj(w_l)``:
  ``w = Σ_j conj(e_j) √α_j w_j`` and ``c_j = e_j / √α_j``.
- **Values.** Stack the group's values ``z = [v_1; …; v_g] = W x̂`` (``g·d`` numbers, second moment
  ``G = W Σ Wᵀ``). Query head ``h`` reading ``v_j`` contributes ``O_h v_j = O_h E_j z``. A merged head
  ``T z`` (``T`` is ``d × g·d``) with new columns ``O'_h`` loses ``Σ_h E‖O'_h T z − O_h E_j z‖²``. The
  minimiser is a rank-``d`` truncation: ``Y`` = the top ``d`` eigenvectors of
  ``G^{1/2} blockdiag(Σ_{h→j} O_hᵀ O_h) G^{1/2}``, ``T = Yᵀ G^{−1/2}``, ``O'_h = O_h E_j G^{1/2} Y``.
  The merged value projection ``T W`` is a mix of the group's value rows, so biases follow.

Both are defined up to the exact maps themselves (a complex factor per pair, a ``d × d`` map). That
gauge changes no logit, but it sets the scale of the weights that uptraining starts from. It is fixed
so that the merged head is as strong as the group's heads on average (per-pair key energy; value second
moment ``mean_j E[v_j v_jᵀ]``), turned to be as close as possible to their plain average. The folded
query factors and ``o_proj`` columns then keep the originals' size. For a group of identical heads (an
``expand_kv_heads`` twin) the merge returns the original head and leaves the queries and ``o_proj`` as
they were, so the twin merges back to the original model.
Procrustes alignment followed by a mean (Jin et al. 2024, "Align Attention Heads Before Merging
Them") is a special case: it restricts the maps to rotations and the merge to an average.

Qwen3 normalises each query and key head (``q_norm``, ``k_norm``, one weight shared by all heads)
after the projection and before RoPE. A per-pair factor folded into ``q_proj`` / ``k_proj`` is then
partly undone by the norm, so nothing exact is available on the key side: there keys are mean-pooled
(pre-norm, as ``mean`` does) and queries are left alone, while values are merged exactly as above.

Everything is computed in float64 from float64 statistics and cast back to the weights' dtype once.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from torch import nn

# Eigenvalues of a second moment below this fraction of the largest count as zero: repeated heads
# (the expand_kv_heads twin) make G exactly singular, and its inverse square root must skip them.
_RANK_TOL = 1e-11
# Entries of a merged matrix below this fraction of its largest are float64 round-off, not weights.
_NOISE_FLOOR = 1e-12
# Σ gains this fraction of its mean eigenvalue on every direction (a ridge): directions the calibration
# tokens never reached (a few tokens, one repeated token) still count, a little, so the merge keeps them
# instead of dropping them; an expand_kv_heads twin then merges back exactly whatever the calibration.
_UNSEEN_WEIGHT = 1e-4


@dataclass
class MergedAttention:
    """New weights for one attention module: projections as ``(out, in)`` and biases (None: no bias)."""

    q_weight: torch.Tensor
    q_bias: torch.Tensor | None
    k_weight: torch.Tensor
    k_bias: torch.Tensor | None
    v_weight: torch.Tensor
    v_bias: torch.Tensor | None
    o_weight: torch.Tensor


def check_rope_pairs(model: nn.Module) -> None:
    """Raise unless the model's own RoPE commutes with a complex scaling of pairs ``(t, t + d/2)``.

    Runs the ``apply_rotary_pos_emb`` of the attention module's modeling file with the model's own
    ``rotary_emb`` tables on random vectors: the key merge is exact only for this layout.
    """
    attention = next(m for m in model.modules() if hasattr(m, "k_proj") and hasattr(m, "v_proj"))
    apply = getattr(sys.modules[type(attention).__module__], "apply_rotary_pos_emb", None)
    rotary = next((m for name, m in model.named_modules() if name.endswith("rotary_emb")), None)
    if apply is None or rotary is None:
        raise ValueError(f"{type(attention).__name__}: no apply_rotary_pos_emb / rotary_emb to check the RoPE layout")
    d = attention.head_dim
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 1, 5, d, generator=generator, dtype=torch.float64)  # (B, H, S, D)
    z = torch.randn(d // 2, dtype=torch.complex128, generator=generator)
    device = next(rotary.buffers(), torch.empty(0)).device  # inv_freq lives where the model does
    cos, sin = rotary(x.float().to(device), torch.arange(3, 8, device=device)[None])  # positions 3..7: (1, S, D)
    cos, sin = cos.double().cpu(), sin.double().cpu()

    def scale(t):  # pair t of every vector times z_t, in the rotate_half layout
        return to_real_pairs(to_complex_pairs(t) * z)

    rotated, _ = apply(scale(x), x, cos, sin)
    expected = scale(apply(x, x, cos, sin)[0])
    if not torch.allclose(rotated, expected, atol=1e-9):
        raise ValueError(f"{type(attention).__module__}: RoPE does not rotate pairs (t, t + d/2) (max error "
                         f"{(rotated - expected).abs().max().item():.2e}); the pca merge needs the rotate_half layout")


def to_complex_pairs(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``(…, d, …)`` real -> ``(…, d/2, …)`` complex: pair ``t`` is ``x[t] + i·x[t + d/2]`` along ``dim``."""
    first, second = t.chunk(2, dim=dim)
    return torch.complex(first, second)


def to_real_pairs(t: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Inverse of :func:`to_complex_pairs`."""
    return torch.cat([t.real, t.imag], dim=dim)


def _augmented(linear: nn.Linear, heads: int) -> torch.Tensor:
    """``(heads, d, in + 1)`` float64: each head's rows with its bias as the last column (zeros if none)."""
    weight = linear.weight.detach().double().cpu()  # the merge runs on CPU: small matrices, float64
    bias = linear.bias.detach().double().cpu() if linear.bias is not None else weight.new_zeros(weight.shape[0])
    return torch.cat([weight, bias[:, None]], dim=1).reshape(heads, -1, weight.shape[1] + 1)  # (H, D, in+1)


def _flush(t: torch.Tensor) -> torch.Tensor:
    """Zero the entries below float64 round-off (``_NOISE_FLOOR`` of the largest): the merge turns exact
    zeros into ~1e-16-relative dust, which would make an exact merge (the twin) differ in the last bit."""
    return torch.where(t.abs() < t.abs().max() * _NOISE_FLOOR, torch.zeros_like(t), t)


def _split(augmented: torch.Tensor, like: nn.Linear):
    """``(out, in + 1)`` -> ``(weight, bias or None)`` in ``like``'s dtype and device."""
    weight = _flush(augmented[:, :-1]).to(like.weight.dtype).to(like.weight.device).contiguous()
    bias = _flush(augmented[:, -1]).to(like.weight.dtype).to(like.weight.device).contiguous() \
        if like.bias is not None else None
    return weight, bias


def merge_keys(keys: torch.Tensor, query_energy: torch.Tensor, moment: torch.Tensor):
    """Best rank-1 merge of one group's complex key rows, pair by pair.

    keys: ``(g, P, in + 1)`` complex (``P = d/2`` pairs), query_energy: ``(g, P)`` = ``α``,
    moment: ``(in + 1, in + 1)`` = ``Σ``. Returns ``(merged (P, in + 1), factors (g, P))`` with
    ``keys[j, t] ≈ factors[j, t] · merged[t]``.
    """
    sigma = moment.to(keys.dtype)
    gram = torch.einsum("jti,ik,ltk->tjl", keys, sigma, keys.conj())  # (P, g, g): w_jᵀ Σ conj(w_l)
    root = query_energy.clamp_min(torch.finfo(torch.float64).tiny).sqrt().T  # (P, g)
    weighted = gram * root[:, :, None] * root[:, None, :]  # (P, g, g) Hermitian
    weighted = (weighted + weighted.conj().transpose(1, 2)) / 2  # exact symmetry for eigh
    _, vectors = torch.linalg.eigh(weighted)
    top = vectors[:, :, -1]  # (P, g): eigenvalues ascend
    merged = torch.einsum("tj,tj,jti->ti", top.conj(), root.to(keys.dtype), keys)  # (P, in+1)
    factors = (top / root).T  # (g, P)
    # Gauge: a factor s per pair (merged·s, factors/s) changes nothing. Its length makes the merged key
    # as strong as the group's keys on average (energy-weighted): the folded query factors stay near 1
    # in size, which keeps uptraining stable (a weak merged key and 5x queries diverged at lr 5e-4).
    # Its phase is that of the weighted mean factor (the strongest head's where the mean cancels).
    # Equal heads thereby merge to themselves with factors 1.
    tiny = torch.finfo(torch.float64).tiny
    total_energy = query_energy.sum(0, keepdim=True)  # (1, P)
    weights = query_energy / total_energy.clamp_min(tiny)  # (g, P)
    strength = (weights * torch.diagonal(gram, dim1=1, dim2=2).real.T).sum(0)  # (P,): mean E|k_j|²
    merged_strength = torch.einsum("ti,ik,tk->t", merged, sigma, merged.conj()).real  # (P,): E|w·x̂|²
    mean = (weights * factors).sum(0)  # (P,)
    strongest = factors.gather(0, (weights * factors.abs() ** 2).argmax(0, keepdim=True))[0]  # (P,)
    phase = torch.where(mean.abs() > 1e-3 * factors.abs().max(0).values, mean, strongest)
    scale = phase / phase.abs() * (strength / merged_strength.clamp_min(tiny)).sqrt()
    merged, factors = merged * scale[:, None], factors / scale
    # A pair that no query reads or whose keys are all zero (pruned heads) has no best merge: the ratios above
    # are 0/0. Its plain mean with factors 1 is as good as any merge there and keeps every weight finite.
    degenerate = (total_energy[0] <= tiny) | (strength <= tiny) | (merged_strength <= tiny) \
        | ~torch.isfinite(merged).all(1) | ~torch.isfinite(factors).all(0)  # (P,)
    merged = torch.where(degenerate[:, None], keys.mean(0), merged)
    factors = torch.where(degenerate[None, :], torch.ones_like(factors), factors)
    return merged, factors


def _sqrt_and_inverse(moment: torch.Tensor):
    """``(G^{1/2}, G^{+1/2})`` of a PSD matrix, eigenvalues below ``_RANK_TOL`` of the largest dropped."""
    values, vectors = torch.linalg.eigh((moment + moment.T) / 2)
    keep = values > values.max().clamp_min(0) * _RANK_TOL
    values, vectors = values[keep], vectors[:, keep]
    return (vectors * values.sqrt()) @ vectors.T, (vectors / values.sqrt()) @ vectors.T


def merge_values(values: torch.Tensor, outputs: list[torch.Tensor], moment: torch.Tensor):
    """Best merge of one group's value heads up to a ``d × d`` map, with its ``o_proj`` columns.

    values: ``(g, d, in + 1)`` augmented value rows; outputs: for each old head ``j``, the ``o_proj``
    column blocks ``(Q_j, out, d)`` of the query heads reading it; moment: ``Σ``. Returns
    ``(merged (d, in + 1), new_outputs)`` with ``new_outputs[j]`` shaped like ``outputs[j]``.
    """
    g, d = values.shape[:2]
    stacked = values.reshape(g * d, -1)  # (g·d, in+1): z = stacked @ x̂
    gram = stacked @ moment @ stacked.T  # (g·d, g·d) = G
    root, inverse_root = _sqrt_and_inverse(gram)
    energy = torch.block_diag(*[(o.transpose(1, 2) @ o).sum(0) for o in outputs])  # (g·d, g·d): Σ_h O_hᵀ O_h
    target = root @ energy @ root
    _, vectors = torch.linalg.eigh((target + target.T) / 2)
    top = vectors[:, -d:]  # (g·d, d)
    mix = top.T @ inverse_root  # (d, g·d) = T
    lifted = (root @ top).reshape(g, d, d)  # (g, d, d): E_j G^{1/2} Y
    # Gauge: a map A (merged -> A·merged, O' -> O'·A⁻¹) changes nothing. T z is white (T G Tᵀ = I), so
    # A = C^{1/2} Q gives the merged values the group's mean second moment C = mean_j E[v_j v_jᵀ]: as well
    # conditioned as the heads themselves, which keeps o_proj (and uptraining) tame; the least-squares
    # fit of the plain average instead left singular values of 1e-3 and 50x o_proj columns, and
    # diverged at lr 5e-4. The rotation Q (orthogonal Procrustes) brings the merged head closest to the
    # plain average: mean_j E[v_j (T z)ᵀ] = mean_j E_j G Tᵀ = mean_j E_j G^{1/2} Y. Equal heads thereby
    # merge to themselves (C^{1/2} Q is then exactly the inverse of T's map).
    blocks = gram.reshape(g, d, g, d).diagonal(dim1=0, dim2=2).mean(-1)  # (d, d): C
    c_root, _ = _sqrt_and_inverse(blocks)
    u, _, vh = torch.linalg.svd(c_root @ lifted.mean(0))
    gauge = c_root @ u @ vh  # (d, d): A
    if not torch.linalg.cond(gauge) <= 1e8:  # value heads without any spread (all zero: NaN): the white basis
        gauge = torch.eye(d, dtype=gauge.dtype)
    merged = gauge @ mix @ stacked  # (d, in+1)
    inverse_gauge = torch.linalg.inv(gauge)
    new_outputs = [o @ lifted[j] @ inverse_gauge for j, o in enumerate(outputs)]  # each (Q_j, out, d)
    return merged, new_outputs


def merge_attention(module: nn.Module, moment: torch.Tensor, target: int, *, exact_keys: bool = True
                    ) -> MergedAttention:
    """New weights for one attention module with ``target`` KV heads, from its input's second moment.

    ``moment``: ``(in + 1, in + 1)`` = ``E[x̂ x̂ᵀ]`` of this layer's attention input with 1 appended.
    ``exact_keys=False`` (Qwen3's shared ``k_norm``/``q_norm``) mean-pools the keys and leaves the
    queries alone. Groups are consecutive heads, as ``repeat_kv`` reads them.
    """
    d = module.head_dim
    kv_heads = module.k_proj.out_features // d
    heads = module.q_proj.out_features // d
    group, readers = kv_heads // target, heads // kv_heads  # old KV heads per new one, queries per old KV head
    sigma = moment.double().cpu()
    sigma = sigma + torch.eye(sigma.shape[0], dtype=sigma.dtype) * (_UNSEEN_WEIGHT * sigma.diagonal().mean())
    queries = _augmented(module.q_proj, heads)  # (H, D, in+1)
    keys = _augmented(module.k_proj, kv_heads)  # (H_kv, D, in+1)
    values = _augmented(module.v_proj, kv_heads)  # (H_kv, D, in+1)
    o_weight = module.o_proj.weight.detach().double().cpu()
    outputs = o_weight.reshape(o_weight.shape[0], heads, d).permute(1, 0, 2)  # (H, out, D)
    outputs = outputs.reshape(kv_heads, readers, o_weight.shape[0], d)  # (H_kv, Q, out, D)

    new_keys, new_values, new_outputs = [], [], []
    complex_queries = to_complex_pairs(queries, dim=1)  # (H, P, in+1)
    energy = torch.einsum("hti,ik,htk->ht", complex_queries, sigma.to(complex_queries.dtype),
                          complex_queries.conj()).real  # (H, P): E|q_{h,t}|²
    energy = energy.reshape(kv_heads, readers, -1).sum(1)  # (H_kv, P): α per old KV head and pair
    query_factors = torch.ones(kv_heads, d // 2, dtype=complex_queries.dtype)  # (H_kv, P)
    for new in range(target):
        members = slice(new * group, (new + 1) * group)
        if exact_keys:
            merged, factors = merge_keys(to_complex_pairs(keys[members], dim=1), energy[members], sigma)
            new_keys.append(to_real_pairs(merged, dim=0))  # (D, in+1)
            query_factors[members] = factors.conj()  # q'_t = conj(c_j)·q_t: the score stays Re(q·conj(k_j))
        else:
            new_keys.append(keys[members].mean(0))  # (D, in+1)
        merged, blocks = merge_values(values[members], list(outputs[members]), sigma)
        new_values.append(merged)
        new_outputs.extend(blocks)
    scaled = complex_queries * query_factors.repeat_interleave(readers, 0)[:, :, None]  # (H, P, in+1)
    queries = to_real_pairs(scaled, dim=1).reshape(heads * d, -1)  # (H·D, in+1)
    o_new = torch.cat(new_outputs).permute(1, 0, 2).reshape(o_weight.shape[0], heads * d)  # (out, H·D)
    q_weight, q_bias = _split(queries, module.q_proj)
    k_weight, k_bias = _split(torch.cat(new_keys), module.k_proj)
    v_weight, v_bias = _split(torch.cat(new_values), module.v_proj)
    merged = MergedAttention(q_weight, q_bias, k_weight, k_bias, v_weight, v_bias,
                             _flush(o_new).to(module.o_proj.weight.dtype).to(module.o_proj.weight.device).contiguous())
    for name, weight in vars(merged).items():  # what the degenerate cases above cannot have caught: never write it
        if weight is not None and not torch.isfinite(weight).all():
            raise ValueError(f"the pca merge of {type(module).__name__} gave non-finite {name} (its weights or "
                             "calibration statistics hold inf/NaN?); convert with method='mean'")  # fmt: skip
    return merged
