"""Scratch instrumentation of the masked Hopper walk (not shipped): patches a copy of the project's cuda/ so that each
math warpgroup's first thread of CTAs 0-7 of a masked build records clock() at three points of every ring tile (K
landed, S retired, P V retired) and at four of every work (its start, its Q rows landed, its key loop done, its
epilogue done), and the ring index a work starts at; read by walk_timeline.py.

    python instrument.py TREE
"""

import sys
from pathlib import Path

DECLS = """
constexpr int kTlCtas = 8, kTlTiles = 1024, kTlWorks = 64;
extern "C" {
__device__ unsigned int hfp_tl_tile[kTlCtas][2][kTlTiles][3];
__device__ unsigned int hfp_tl_work[kTlCtas][2][kTlWorks][5];
}
#define TL_THREAD (HAS_MASK && blockIdx.x < kTlCtas && lane == 0 && (warp_row0 & 63) == 0)
#define TLT(r, k) if (TL_THREAD && (r) < kTlTiles) \\
  hfp_tl_tile[blockIdx.x][warp_row0 >> 6][r][k] = static_cast<unsigned>(clock());
#define TLW(k) if (TL_THREAD && works < kTlWorks) { \\
  hfp_tl_work[blockIdx.x][warp_row0 >> 6][works][k] = static_cast<unsigned>(clock()); \\
  if ((k) == 0) hfp_tl_work[blockIdx.x][warp_row0 >> 6][works][4] = static_cast<unsigned>(ring); }
"""


def patch(path: Path, edits: list[tuple[str, str]]) -> None:
    """Each edit replaces its one occurrence of `old`; `old` may be a tuple of forms (trees before and after the
    work body became the run_work lambda of tag s67-masked-boundary-draft), of which the tree holds one."""
    text = path.read_text()
    for old, new in edits:
        forms = old if isinstance(old, tuple) else (old,)
        found = [(form, replacement) for form, replacement in zip(forms, new if isinstance(new, tuple) else (new,))
                 if text.count(form) == 1]
        assert len(found) == 1, (path, old)
        text = text.replace(*found[0])
    path.write_text(text)


def main() -> None:
    cuda = Path(sys.argv[1]) / "cuda"
    patch(cuda / "fwd_hopper_ws.cu", [
        ("\nnamespace {\n", "\n" + DECLS + "\nnamespace {\n"),
        (("  for_each_work<kWindowed, kBlockM, BLOCK_N>(p, [&](const QueryTile& tile) {\n",
          "  auto run_work = [&](const QueryTile& tile) {\n"),
         ("  for_each_work<kWindowed, kBlockM, BLOCK_N>(p, [&](const QueryTile& tile) {\n    TLW(0)\n",
          "  auto run_work = [&](const QueryTile& tile) {\n    TLW(0)\n")),
        ("      mbarrier_wait(q_full_bars + 8 * warpgroup, works & 1);  // this warpgroup's 64 Q rows landed\n",
         "      mbarrier_wait(q_full_bars + 8 * warpgroup, works & 1);  // this warpgroup's 64 Q rows landed\n"
         "      TLW(1)\n"),
        ("      const uint32_t slot = wait_slot(k_full_bars, r);\n      if (zero_values) {\n",
         "      const uint32_t slot = wait_slot(k_full_bars, r);\n      TLT(r, 0)\n      if (zero_values) {\n"),
        ("    auto release_keys = [&](int r) {\n", "    auto release_keys = [&](int r) {\n      TLT(r, 1)\n"),
        ("    auto release_values = [&](int r) { release(v_empty_bars, r); };\n",
         "    auto release_values = [&](int r) {\n      TLT(r, 2)\n      release(v_empty_bars, r);\n    };\n"),
        ("    // ---- epilogue (fwd_hopper_step.cuh)", "    TLW(2)\n    // ---- epilogue (fwd_hopper_step.cuh)"),
        ("    ring += num_tiles;\n    ++works;\n", "    TLW(3)\n    ring += num_tiles;\n    ++works;\n"),
    ])


if __name__ == "__main__":
    main()
