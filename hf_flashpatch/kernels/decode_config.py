"""Decode kernel configuration as data: the compile-time :class:`DecodeConfig` (the compile-cache key),
the named bandwidth variants, and the launch-side split-KV policy.

Nothing here launches anything or needs a GPU; ``kernels/decode.py`` builds and launches what these
describe, and the CI compile check enumerates :func:`all_builds`. Layout facts the numbers rest on
(``cuda/decode.cu``): a CTA of ``WARPS`` warps owns ``ROWS_PER_CTA`` query rows of one KV head and each
warp streams ``TILE_KEYS``-key K/V tiles through its own ``stages``-deep pipeline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .build import KernelBuild, variant_from_env

SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)
MAX_ROWS_PER_KV_HEAD = 64  # S_q * group above this goes to the forward kernel
ROWS_PER_CTA = 16  # one mma M tile (cuda/decode.cu kRows)
WARPS = 4
TILE_KEYS = 16
MIN_KEYS_PER_SPLIT = 256

ADDRESSING = {"contiguous": 0, "block_table": 1, "slot": 2}


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time parameters of one decode kernel variant (the compile-cache key)."""

    head_dim: int
    bf16: bool
    addressing: str  # "contiguous" | "block_table" | "slot"
    softcap: bool
    stages: int = 3  # cp.async pipeline depth per warp
    # Bandwidth variants (cuda/decode.cu header); all False is the original kernel.
    l2_prefetch: bool = False  # cp.async .L2::256B: whole 256-byte rows per DRAM request
    coalesced_loads: bool = False  # each copy instruction covers whole rows (512 consecutive bytes)
    stagger_tiles: bool = False  # CTA-dependent rotation of each warp's tile order
    early_issue: bool = False  # refill the freed slot before waiting: STAGES tiles in flight
    q_in_regs: bool = False  # Q mma fragments held in registers (D <= 128), not re-read per tile
    index_ahead: bool = False  # page / slot table entries loaded one tile early (needs coalesced_loads)
    l2_ahead: bool = False  # entries two tiles early + the next tile's rows prefetched into L2 (needs index_ahead)
    # Block table only (needs coalesced_loads): one table entry per 16-key tile and arithmetic row
    # addresses when pages hold whole tiles, instead of per-key entries and pointer shuffles.
    page_tiles: bool = False
    # Launch side, not compiled: when the grid is split (fewer CTAs than one wave), split so it
    # holds about this many waves (1: the wave-efficiency heuristic alone, choose_num_splits).
    min_waves: int = 1

    def build(self, arch: str = "sm_90a") -> KernelBuild:
        defines = (
            ("HEAD_DIM", str(self.head_dim)),
            ("ELEM_BF16", str(int(self.bf16))),
            ("KV_ADDRESSING", str(ADDRESSING[self.addressing])),
            ("SOFTCAP", str(int(self.softcap))),
            ("STAGES", str(self.stages)),
        )
        # Only switched-on variant macros are passed: the default build keeps its original defines.
        switches = (
            ("L2_PREFETCH", self.l2_prefetch),
            ("COALESCED_LOADS", self.coalesced_loads),
            ("STAGGER_TILES", self.stagger_tiles),
            ("EARLY_ISSUE", self.early_issue),
            ("Q_IN_REGS", self.q_in_regs),
            ("INDEX_AHEAD", self.index_ahead),
            ("L2_AHEAD", self.l2_ahead),
            # Only the block-table form has pages: the other forms' builds stay shared with the variant
            # this one extends. D = 32 keeps the per-key form: with both copy forms ptxas spills 4 bytes
            # in its prologue (the other head dims compile spill-free).
            ("PAGE_TILES", self.page_tiles and self.addressing == "block_table" and self.head_dim != 32),
        )
        defines += tuple((name, "1") for name, on in switches if on)
        return KernelBuild("decode.cu", defines, arch)

    @property
    def shared_bytes(self) -> int:
        # Q tile [16][D] + per warp STAGES x (K tile, V tile) of [16][D], 2-byte elements.
        return 2 * (ROWS_PER_CTA * self.head_dim + WARPS * self.stages * 2 * TILE_KEYS * self.head_dim)


VARIANT_ENV = "HF_FLASHPATCH_DECODE_VARIANT"
# name -> DecodeConfig fields it sets. "default" is the GPU-verified original; the others are
# candidates to be measured (scripts/bench_decode.py --sweep) before becoming the default.
VARIANTS: dict[str, dict[str, bool | int]] = {
    "default": {},
    "prefetch": {"l2_prefetch": True},
    "coalesced": {"coalesced_loads": True},
    "stagger": {"stagger_tiles": True},
    "early": {"early_issue": True},
    "qregs": {"q_in_regs": True},
    "fast_nostagger": {"l2_prefetch": True, "coalesced_loads": True, "early_issue": True, "q_in_regs": True},
    "fast": {
        "l2_prefetch": True, "coalesced_loads": True, "stagger_tiles": True, "early_issue": True, "q_in_regs": True
    },
    # Candidates for paged 16 at 16x32768 (the one shape under 0.95x cuDNN with "coalesced"), all on
    # top of the coalesced loads: the table read off the copy's critical path, one more tile in
    # flight through L2, and more split-KV CTAs (about 2 or 4 waves instead of one) for the shapes
    # that split.
    "ahead": {"coalesced_loads": True, "index_ahead": True},
    "ahead_l2": {"coalesced_loads": True, "index_ahead": True, "l2_ahead": True},
    "waves2": {"coalesced_loads": True, "min_waves": 2},
    "waves4": {"coalesced_loads": True, "min_waves": 4},
    "ahead_waves2": {"coalesced_loads": True, "index_ahead": True, "min_waves": 2},
    "ahead_waves4": {"coalesced_loads": True, "index_ahead": True, "min_waves": 4},
    # Candidates for the paged forms' remaining gap to the contiguous one (paged 16 / 256 sat 1-3 %
    # under contiguous at every shape): per-key pointer shuffles off the copy path (page_tiles), and Q
    # fragments in registers (a third of the per-tile ldmatrix reads) now that the loads are coalesced
    # (the earlier q_in_regs measurements were on the uncoalesced copy pattern, or mixed with L2 hints).
    "pages_waves2": {"coalesced_loads": True, "index_ahead": True, "page_tiles": True, "min_waves": 2},
    "pages_qregs_waves2": {
        "coalesced_loads": True, "index_ahead": True, "page_tiles": True, "q_in_regs": True, "min_waves": 2
    },
    "ahead_qregs_waves2": {"coalesced_loads": True, "index_ahead": True, "q_in_regs": True, "min_waves": 2},
}


# The variant used when the environment names none. History: "coalesced" (512-byte coalesced row loads)
# won the first sweep (results/2026-11-29_9cf0ea0_backward-decode-variants: 4.45 / 4.36 / 4.41 TB/s
# contiguous / paged 16 / paged 256 at 64x4096 against the original's 3.29 / 3.31 / 3.40). Its one cell
# under 0.95x cuDNN, paged 16 at 16x32768 (0.938), rose to 0.952 with "ahead_waves2" (page ids read one
# tile early, split grids of about two waves) in results/2026-11-29_19dc1b8_wgmma-backward-decode-candidates;
# every other cell moved by less than 0.7 % (contiguous 16x32768: 0.974 -> 0.968). Then "pages_waves2" (one
# table read per tile, no pointer shuffles) in results/2026-12-01_903f257_ws-forward-page-tiles (5 interleaved
# rounds): paged 16 / 256 at 16x32768 0.957 / 0.962 of cuDNN against ahead_waves2's 0.952 / 0.957 in the same
# passes, 128x2048 paged 16 0.975 vs 0.960, every other cell equal or up to +0.8 %.
DEFAULT_VARIANT = "pages_waves2"


def selected_variant() -> str:
    """The variant named by ``$HF_FLASHPATCH_DECODE_VARIANT`` (unset or empty: ``DEFAULT_VARIANT``)."""
    return variant_from_env(VARIANT_ENV, DEFAULT_VARIANT, VARIANTS)


def variant_config(head_dim: int, bf16: bool, addressing: str, softcap: bool, variant: str) -> DecodeConfig:
    return DecodeConfig(head_dim, bf16, addressing, softcap, **VARIANTS[variant])


def all_builds(arch: str = "sm_90a") -> list[KernelBuild]:
    """Every decode build the launchers can request (for the CI compile check), plus kv_append.
    Variants that differ only on the launch side (``min_waves``) share builds; each build is listed once."""
    builds = [
        variant_config(d, bf16, addressing, softcap, variant).build(arch)
        for variant in VARIANTS
        for d in SUPPORTED_HEAD_DIMS
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    return list(dict.fromkeys(builds)) + [KernelBuild("kv_append.cu", (), arch)]


# ------------------------------------------------------------------------------------ split-KV policy


def ctas_per_sm(config: DecodeConfig) -> int:
    """Resident CTAs per SM: shared memory bound (228 KB/SM, 1 KB reserved per CTA), at most 4."""
    return max(1, min(4, (228 * 1024) // (config.shared_bytes + 1024)))


def choose_num_splits(ctas: int, typical_keys: int, sm_count: int, resident_per_sm: int, min_waves: int = 1) -> int:
    """Split-KV factor. Already a full wave of CTAs: 1 (splitting only adds the combine pass).
    Otherwise the smallest split whose wave efficiency (CTAs / slots of the last wave) is within 5%
    of the best reachable, with at least ``MIN_KEYS_PER_SPLIT`` keys per split so the per-warp
    pipelines have a few tiles each. ``min_waves > 1`` (a launch-side variant) also asks the split
    grid for at least 90% of ``min_waves`` waves, so the block scheduler can even out CTAs that
    finish at different times instead of the whole grid draining at once."""
    slots = sm_count * resident_per_sm
    if ctas >= slots:
        return 1
    max_splits = max(1, min(64, typical_keys // MIN_KEYS_PER_SPLIT))

    def efficiency(s: int) -> float:
        n = ctas * s
        return n / (math.ceil(n / slots) * slots)

    best = max(efficiency(s) for s in range(1, max_splits + 1))
    enough_waves = (lambda s: ctas * s >= 0.9 * min_waves * slots) if min_waves > 1 else (lambda s: True)
    fitting = [s for s in range(1, max_splits + 1) if efficiency(s) >= 0.95 * best and enough_waves(s)]
    return fitting[0] if fitting else max_splits
