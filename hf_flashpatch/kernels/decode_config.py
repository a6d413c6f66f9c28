"""Decode kernel configuration as data: the compile-time :class:`DecodeConfig` (the compile-cache key).
The split-KV policy is in :mod:`.heuristics`.

Nothing here launches anything or needs a GPU; ``kernels/decode.py`` builds and launches what these
describe, and the CI compile check enumerates :func:`all_builds`. Layout facts the numbers rest on
(``cuda/decode.cu``): a CTA of ``WARPS`` warps owns ``ROWS_PER_CTA`` query rows of one KV head and each
warp streams ``TILE_KEYS``-key K/V tiles through its own ``stages``-deep pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

from .build import KernelBuild

SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 256)
MAX_ROWS_PER_KV_HEAD = 64  # S_q * group above this goes to the forward kernel
ROWS_PER_CTA = 16  # one mma M tile (cuda/decode.cu kRows)
WARPS = 4
TILE_KEYS = 16

ADDRESSING = {"contiguous": 0, "block_table": 1, "slot": 2}


@dataclass(frozen=True)
class DecodeConfig:
    """Compile-time parameters of one decode kernel build (the compile-cache key). The K/V copy pattern
    (whole-row copies, table entries one tile ahead, page-addressed tiles for block tables) is fixed in
    ``cuda/decode.cu``."""

    head_dim: int
    bf16: bool
    addressing: str  # "contiguous" | "block_table" | "slot"
    softcap: bool
    stages: int = 3  # cp.async pipeline depth per warp

    def build(self, arch: str = "sm_90a") -> KernelBuild:
        defines = (
            ("HEAD_DIM", str(self.head_dim)),
            ("ELEM_BF16", str(int(self.bf16))),
            ("KV_ADDRESSING", str(ADDRESSING[self.addressing])),
            ("SOFTCAP", str(int(self.softcap))),
            ("STAGES", str(self.stages)),
        )
        return KernelBuild("decode.cu", defines, arch)


def all_builds(arch: str = "sm_90a") -> list[KernelBuild]:
    """Every decode build the launchers can request (for the CI compile check), plus kv_append."""
    builds = [
        DecodeConfig(d, bf16, addressing, softcap).build(arch)
        for d in SUPPORTED_HEAD_DIMS
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    return builds + [KernelBuild("kv_append.cu", (), arch)]
