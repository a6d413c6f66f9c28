"""Scratch instrumentation of the chained walk (not shipped): patches a copy of the project's cuda/ so that each math
warpgroup's first thread of CTAs 0-7 records clock() at six points of every chained step (loop top, K landed, V
landed, S retired, P V retired, after the boundary's store and Q load), and the producer thread the clock before and
after its wait for each ring tile's K slot; read by chain_timeline.py (results/2026-12-05_chain-boundary).

    python instrument.py TREE
"""

import sys
from pathlib import Path

DECLS = """
constexpr int kTlCtas = 8, kTlSteps = 512;
extern "C" {
__device__ unsigned int hfp_tl_math[kTlCtas][2][kTlSteps][6];
__device__ unsigned int hfp_tl_prod[kTlCtas][kTlSteps][2];
}
#define TLM(k) if (blockIdx.x < kTlCtas && ring < kTlSteps && lane == 0 && (warp_row0 & 63) == 0) \\
  hfp_tl_math[blockIdx.x][warp_row0 >> 6][ring][k] = static_cast<unsigned>(clock());
"""


def patch(path: Path, edits: list[tuple[str, str]]) -> None:
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, (path, old, text.count(old))
        text = text.replace(old, new)
    path.write_text(text)


def main() -> None:
    cuda = Path(sys.argv[1]) / "cuda"
    patch(cuda / "fwd_hopper_ws.cu", [
        ("          if (ring >= KV_STAGES) mbarrier_wait(empty_bars + 8 * slot, (ring / KV_STAGES - 1) & 1);\n",
         "          const bool tl = CHAINED_WALK && blockIdx.x < kTlCtas && ring < kTlSteps && empty_bars == k_empty_bars;\n"
         "          if (tl) hfp_tl_prod[blockIdx.x][ring][0] = static_cast<unsigned>(clock());\n"
         "          if (ring >= KV_STAGES) mbarrier_wait(empty_bars + 8 * slot, (ring / KV_STAGES - 1) & 1);\n"
         "          if (tl) hfp_tl_prod[blockIdx.x][ring][1] = static_cast<unsigned>(clock());\n"),
    ])
    patch(cuda / "fwd_hopper_chain.cuh", [
        ('#include "fwd_hopper_step.cuh"\n', '#include "fwd_hopper_step.cuh"\n' + DECLS),
        ("    const uint32_t k_slot = wait_keys(ring);\n    uint32_t v_barrier",
         "    TLM(0)\n    const uint32_t k_slot = wait_keys(ring);\n    TLM(1)\n    uint32_t v_barrier"),
        ("    mbarrier_wait(v_barrier, v_parity);\n", "    mbarrier_wait(v_barrier, v_parity);\n    TLM(2)\n"),
        ("    wgmma_wait<1>();  // S retired; the P V may still run\n    fence_operands(s_flat);\n",
         "    wgmma_wait<1>();  // S retired; the P V may still run\n    fence_operands(s_flat);\n    TLM(3)\n"),
        ("    wgmma_wait<0>();\n    fence_operands(o_flat);\n    fence_operands(reinterpret_cast",
         "    wgmma_wait<0>();\n    TLM(4)\n    fence_operands(o_flat);\n    fence_operands(reinterpret_cast"),
        ("    more = next_step();\n  }\n", "    TLM(5)\n    more = next_step();\n  }\n"),
    ])


if __name__ == "__main__":
    main()
