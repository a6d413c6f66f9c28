"""Tile shapes of the FlashAttention forward kernel (``cuda/fwd.cu``), chosen in one place.

Layout of the tensors the tiles cover: q ``(batch, seqlen_q, heads, head_dim)``, k/v
``(batch, seqlen_k, kv_heads, head_dim)``. A CTA computes ``block_m`` packed query rows (query
positions x the query heads of one GQA group) against ``block_n`` keys per step; each warp owns
``block_m / num_warps`` rows, i.e. ``block_m / (16 * num_warps)`` m16n8k16 m-tiles.

Every shape below compiles for sm_90a without register spills (checked by
``tests/test_forward_compile.py``); the register counts quoted are ptxas's for the masked bf16 build,
the throughputs those of ``scripts/bench_forward.py --sweep`` on an H200 (``notes/forward.md``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TileShape:
    block_m: int  # packed query rows per CTA
    block_n: int  # keys per K/V tile
    num_warps: int
    kv_stages: int = 2  # depth of the cp.async K/V ring (2 = double buffering)
    q_in_registers: bool = False  # keep the warp's Q fragments in registers instead of re-reading smem
    qk_prefetch: bool = False  # Q from smem: issue the next k-step's ldmatrix before this step's MMAs
    ctas_per_sm: int = 1  # __launch_bounds__ minimum: caps registers at 64K / (threads * ctas_per_sm)


def forward_tile_shape(head_dim: int) -> TileShape:
    """The tile shape used for ``head_dim`` (both dtypes, masked or not)."""
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
    ),
    128: (
        TileShape(block_m=128, block_n=64, num_warps=4),
        TileShape(block_m=128, block_n=32, num_warps=4),
        TileShape(block_m=128, block_n=32, num_warps=4, qk_prefetch=True),
        TileShape(block_m=128, block_n=32, num_warps=4, kv_stages=3),
        TileShape(block_m=128, block_n=32, num_warps=4, kv_stages=3, qk_prefetch=True),
        TileShape(block_m=128, block_n=64, num_warps=8, q_in_registers=True),
    ),
}
