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

# The builds: cuda/decode.cu takes any multiple of 16; these are the head dims of real models, each compiled by the
# CI check (80: Phi-1/1.5/2 and StableLM). Other head dims decode on the padded forward or the torch fallback.
SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128, 256)
# (q/k head dim, v head dim) pairs built besides the equal ones: multi-head latent attention (DeepSeek-V2/V3).
VALUE_HEAD_DIM_PAIRS = ((192, 128),)
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

    head_dim: int  # q / k
    bf16: bool
    addressing: str  # "contiguous" | "block_table" | "slot"
    softcap: bool
    head_dim_v: int | None = None  # v / out where it differs (VALUE_HEAD_DIM_PAIRS); None: head_dim

    def __post_init__(self):
        if self.head_dim_v == self.head_dim:  # one spelling per build: the cache key
            object.__setattr__(self, "head_dim_v", None)
        if not DecodeConfig.served(self.head_dim, self.head_dim_v or self.head_dim):
            raise ValueError(f"no decode build for head dims {self.head_dim} / {self.head_dim_v or self.head_dim}")

    @staticmethod
    def served(head_dim: int, head_dim_v: int) -> bool:
        """Whether a decode build takes q/k rows of ``head_dim`` with v rows of ``head_dim_v``."""
        if head_dim_v == head_dim:
            return head_dim in SUPPORTED_HEAD_DIMS
        return (head_dim, head_dim_v) in VALUE_HEAD_DIM_PAIRS

    def build(self, arch: str = "sm_90a") -> KernelBuild:
        value = (("HEAD_DIM_V", str(self.head_dim_v)),) if self.head_dim_v is not None else ()
        defines = (
            ("HEAD_DIM", str(self.head_dim)),
            *value,
            ("ELEM_BF16", str(int(self.bf16))),
            ("KV_ADDRESSING", str(ADDRESSING[self.addressing])),
            ("SOFTCAP", str(int(self.softcap))),
            ("STAGES", "3"),  # cp.async pipeline depth per warp
        )
        return KernelBuild("decode.cu", defines, arch)


def all_builds(arch: str = "sm_90a") -> list[KernelBuild]:
    """Every decode build the launchers can request (for the CI compile check), plus kv_append."""
    dims = [(d, None) for d in SUPPORTED_HEAD_DIMS] + list(VALUE_HEAD_DIM_PAIRS)
    builds = [
        DecodeConfig(d, bf16, addressing, softcap, head_dim_v=d_v).build(arch)
        for d, d_v in dims
        for bf16 in (True, False)
        for addressing in ADDRESSING
        for softcap in (False, True)
    ]
    return builds + [KernelBuild("kv_append.cu", (), arch)]
