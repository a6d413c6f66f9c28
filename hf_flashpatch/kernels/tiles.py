"""Tile shapes of the FlashAttention forward kernels (``cuda/fwd.cu``, ``cuda/fwd_hopper.cu``), chosen
in one place.

Layout of the tensors the tiles cover: q ``(batch, seqlen_q, heads, head_dim)``, k/v
``(batch, seqlen_k, kv_heads, head_dim)``. A CTA computes ``block_m`` packed query rows (query
positions x the query heads of one GQA group) against ``block_n`` keys per step; each warp owns
``block_m / num_warps`` rows, i.e. ``block_m / (16 * num_warps)`` m16n8k16 m-tiles.

Two bodies: ``mma`` (``fwd.cu``, mma.sync m16n8k16, any sm_80+ GPU, every head dim) and, on Hopper
(sm_90a) at head dims 64 and 128, ``wgmma`` (``fwd_hopper.cu``: warpgroup MMA, 64 rows per warpgroup,
so ``block_m = 64 * num_warps / 4``). ``HF_FLASHPATCH_FWD_VARIANT`` (read on every call) picks a
named variant of :data:`VARIANTS` for testing and benchmarking; unset, :data:`DEFAULT_VARIANT`.

Every shape below compiles for sm_90a without register spills (checked by
``tests/test_forward_compile.py``); the register counts quoted are ptxas's for the masked bf16 build,
the throughputs those of ``scripts/bench_forward.py --sweep`` on an H200 (``notes/forward.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .build import variant_from_env


@dataclass(frozen=True)
class TileShape:
    block_m: int  # packed query rows per CTA
    block_n: int  # keys per K/V tile
    num_warps: int
    kv_stages: int = 2  # depth of the cp.async K/V ring (2 = double buffering)
    q_in_registers: bool = False  # keep the warp's Q fragments in registers instead of re-reading smem
    qk_prefetch: bool = False  # Q from smem: issue the next k-step's ldmatrix before this step's MMAs
    ctas_per_sm: int = 1  # __launch_bounds__ minimum: caps registers at 64K / (threads * ctas_per_sm)
    wgmma: bool = False  # the Hopper body (fwd_hopper.cu); num_warps = 4 per 64-row warpgroup
    overlap: bool = False  # wgmma body: O += P V of tile i runs during the softmax of tile i + 1 (3 stages)
    warp_specialized: bool = False  # wgmma body: a producer warpgroup (counted in num_warps) streams K/V


# Hopper bodies by name (head dims 64 and 128 on sm_90a); "mma" = the mma.sync table below everywhere.
# A head dim maps to one shape, or to a pair (shape without masking, shape with causal / window masking).
_WGMMA = TileShape(block_m=128, block_n=128, num_warps=8, wgmma=True)
_WGMMA_OVERLAP = TileShape(block_m=128, block_n=128, num_warps=8, kv_stages=3, wgmma=True, overlap=True)
_WGMMA_WS = TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True, warp_specialized=True)
HOPPER_VARIANTS: dict[str, dict[int, TileShape | tuple[TileShape, TileShape]]] = {
    # two consumer warpgroups x 64 rows, 128-key tiles; masked d128 takes the overlapped body, which was
    # faster there at every seqlen (results/2026-11-29_d59d460_final: 192-451 vs 99-439 TFLOP/s causal,
    # 512..16k), while the plain body wins unmasked d128 (441-471 vs 414-461) and d64 either way
    "wgmma": {64: _WGMMA, 128: (_WGMMA, _WGMMA_OVERLAP)},
    # the plain body everywhere: one product at a time, double-buffered K/V
    "wgmma_plain": {64: _WGMMA, 128: _WGMMA},
    # P V of tile i overlapping the softmax of tile i + 1 everywhere (second score buffer, 3 stages)
    "wgmma_overlap": {64: _WGMMA_OVERLAP, 128: _WGMMA_OVERLAP},
    # cuda/fwd_hopper_ws.cu: a producer warpgroup + two math warpgroups, mbarrier hand-off, 3 stages
    "wgmma_ws": {64: _WGMMA_WS, 128: _WGMMA_WS},
    # the measured-fastest body per (head dim, masking), results/2026-12-01_903f257_ws-forward-page-tiles
    # (--quick, TFLOP/s, same process): the warp-specialised body everywhere at d128 (2k / 16k: 513 / 547
    # full, 404 / 586 causal, vs the plain / overlapped bodies' 441 / 476 and 342 / 450) and for masked
    # d64 (292 / 404 vs 276 / 350); unmasked d64 keeps the plain body (436 / 443 vs 358 / 420)
    "hopper": {64: (_WGMMA, _WGMMA_WS), 128: _WGMMA_WS},
}
VARIANTS = ("mma",) + tuple(HOPPER_VARIANTS)
# Variants that have not yet run to completion on a GPU. Benchmarks leave them out of their automatic
# comparisons; tests/gpu/test_forward.py runs them behind a subprocess smoke test with a timeout, so a
# hang fails their tests instead of stalling the suite. (wgmma_ws was here until its first complete run,
# 200 GPU tests passed at 903f257.)
UNVERIFIED_VARIANTS: frozenset[str] = frozenset()
# The variant used when the environment names none. History: "wgmma" (1.2-1.4x the mma body at d64/d128,
# results/2026-11-29_2857bbe_wgmma-forward), then "hopper" (above).
DEFAULT_VARIANT = "hopper"
VARIANT_ENV = "HF_FLASHPATCH_FWD_VARIANT"


def selected_variant() -> str:
    """The forward variant in force: ``HF_FLASHPATCH_FWD_VARIANT`` if set, else :data:`DEFAULT_VARIANT`."""
    return variant_from_env(VARIANT_ENV, DEFAULT_VARIANT, VARIANTS)


def forward_tile_shape(head_dim: int, arch: str = "sm_80", variant: str | None = None,
                       has_mask: bool = False) -> TileShape:  # fmt: skip
    """The tile shape used for ``head_dim`` on ``arch`` (both dtypes; ``has_mask``: causal / window). The
    wgmma bodies serve head dims 64 and 128 on sm_90a; every other case takes the mma.sync table."""
    variant = variant or selected_variant()
    if arch == "sm_90a" and variant in HOPPER_VARIANTS and head_dim in HOPPER_VARIANTS[variant]:
        shape = HOPPER_VARIANTS[variant][head_dim]
        return shape[int(has_mask)] if isinstance(shape, tuple) else shape
    return mma_tile_shape(head_dim)


def mma_tile_shape(head_dim: int) -> TileShape:
    """The mma.sync body's tile shape for ``head_dim`` (both dtypes, masked or not)."""
    if head_dim == 32:
        # Tiny rows: Q fits in 8 registers per thread, so 8 warps x 16 rows with wide 128-key tiles
        # amortise the per-tile softmax and barrier cost.
        return TileShape(block_m=128, block_n=128, num_warps=8, q_in_registers=True)
    if head_dim == 64:
        # flash-attn 2's shape: two m-tiles per warp (32 rows) halve the K/V shared-memory traffic
        # per FLOP, and 128-key tiles halve the per-tile softmax / barrier cost; 255 registers.
        # 295 / 270 TFLOP/s (full / causal, 4k) vs 278 / 257 with 64-key tiles.
        return TileShape(block_m=128, block_n=128, num_warps=4)
    if head_dim == 96:
        # 8 warps x 16 rows, Q in registers (24 regs); the tile's 128 x 12 16-byte chunks divide over 256
        # threads (row-walking loads need chunks per row to divide the threads; 12 does not, see fwd_tile_io).
        return TileShape(block_m=128, block_n=64, num_warps=8, q_in_registers=True)
    if head_dim == 128:
        # flash-attn 2's Hopper shape: 32 rows per warp, 64-key tiles; S (64) + O (128) accumulators
        # leave no room for Q fragments, which are re-read from shared memory each k-step. 255
        # registers; 340 / 292 TFLOP/s (full / causal, 4k) vs 310 / 250 with 32-key tiles.
        return TileShape(block_m=128, block_n=64, num_warps=4)
    if head_dim == 256:
        # O alone is 128 registers per 16 rows: one m-tile per warp, Q re-read from shared memory,
        # 64-row query tiles so two K/V stages still fit (169 KB of shared memory).
        return TileShape(block_m=64, block_n=64, num_warps=4)
    raise ValueError(f"no forward tile shape for head_dim {head_dim}; supported: 32, 64, 96, 128, 256")


# Alternatives the benchmark times against the default (``scripts/bench_forward.py --sweep``).
CANDIDATE_SHAPES: dict[int, tuple[TileShape, ...]] = {
    64: (
        TileShape(block_m=128, block_n=128, num_warps=4),
        TileShape(block_m=128, block_n=64, num_warps=4),
        TileShape(block_m=128, block_n=64, num_warps=4, qk_prefetch=True),
        TileShape(block_m=128, block_n=64, num_warps=4, q_in_registers=True),
        TileShape(block_m=128, block_n=64, num_warps=4, kv_stages=3),
        TileShape(block_m=128, block_n=64, num_warps=8, wgmma=True),
        TileShape(block_m=128, block_n=64, num_warps=8, kv_stages=3, wgmma=True, overlap=True),
    ),
    128: (
        TileShape(block_m=128, block_n=64, num_warps=4),
        TileShape(block_m=128, block_n=32, num_warps=4),
        TileShape(block_m=128, block_n=32, num_warps=4, qk_prefetch=True),
        TileShape(block_m=128, block_n=32, num_warps=4, kv_stages=3),
        TileShape(block_m=128, block_n=32, num_warps=4, kv_stages=3, qk_prefetch=True),
        TileShape(block_m=128, block_n=64, num_warps=8, q_in_registers=True),
        TileShape(block_m=128, block_n=64, num_warps=8, wgmma=True),
        TileShape(block_m=128, block_n=64, num_warps=8, kv_stages=3, wgmma=True, overlap=True),
        TileShape(block_m=64, block_n=128, num_warps=4, wgmma=True),
    ),
}
