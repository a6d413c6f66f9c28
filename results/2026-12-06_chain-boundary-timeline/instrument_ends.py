"""Scratch instrumentation (not shipped): instrument.py's step clocks with room for 1024 ring tiles (a 2x8k walk's
pieces lie past 512), plus each math warpgroup's marks around its walk's end, for every CTA: (0) the whole works'
walk returned, (4) the pieces' walk reached its folds, (1) the pieces' walk returned, (2) its last boxes were read,
(3) the walk began; each as clock() and the low word of %globaltimer (ns, comparable across SMs).

    python instrument_ends.py TREE
"""

import sys
from pathlib import Path

import instrument

ENDS = """
constexpr int kTlEndCtas = 160;
extern "C" __device__ unsigned int hfp_tl_end[kTlEndCtas][2][5][2];
#define TLE(k) if (blockIdx.x < kTlEndCtas && lane == 0 && (warp_row0 & 63) == 0) { \\
  unsigned int ns_; asm volatile("mov.u32 %0, %%globaltimer_lo;" : "=r"(ns_)); \\
  hfp_tl_end[blockIdx.x][warp_row0 >> 6][k][0] = static_cast<unsigned>(clock()); \\
  hfp_tl_end[blockIdx.x][warp_row0 >> 6][k][1] = ns_; }
"""


def main() -> None:
    tree = Path(sys.argv[1])
    instrument.main()
    cuda = tree / "cuda"
    instrument.patch(cuda / "fwd_hopper_chain.cuh", [
        ("constexpr int kTlCtas = 8, kTlSteps = 512;\n", "constexpr int kTlCtas = 8, kTlSteps = 1024;\n" + ENDS),
        ("    for (int piece = start.works; folds != 0; ++piece, folds >>= 1) {\n",
         "    TLE(4)\n    for (int piece = start.works; folds != 0; ++piece, folds >>= 1) {\n"),
    ])
    instrument.patch(cuda / "fwd_hopper_ws.cu", [
        ("  if constexpr (kChainedWalk) {  // one key loop over every work (fwd_hopper_chain.cuh)\n",
         "  if constexpr (kChainedWalk) {  // one key loop over every work (fwd_hopper_chain.cuh)\n    TLE(3)\n"),
        ("wait_keys, release_at);\n    if (kSplitTail", "wait_keys, release_at);\n    TLE(0)\n    if (kSplitTail"),
        ("wait_keys, release_at, whole);\n    bulk_wait_read<0>();  // the shared memory stays until the last boxes were read\n",
         "wait_keys, release_at, whole);\n    TLE(1)\n    bulk_wait_read<0>();  // the shared memory stays until the last"
         " boxes were read\n    TLE(2)\n"),
    ])


if __name__ == "__main__":
    main()
