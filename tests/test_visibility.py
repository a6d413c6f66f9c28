"""cuda/visibility.cuh, the one definition of which keys a query sees in every kernel (forward, backward,
decode), checked on the CPU: its functions are host code too, so nvcc builds a small host program that
evaluates them over every query, key and tile of small problems, and the answers are compared with the
fp32 oracle's mask (hf_flashpatch/reference/masks.py). No GPU needed; skipped without nvcc."""

from __future__ import annotations

import itertools
import subprocess

import pytest
import torch

from hf_flashpatch.kernels.build import find_nvcc
from hf_flashpatch.kernels.sources import cuda_source_dir
from hf_flashpatch.reference.masks import visibility_mask

# (seqlen_q, seqlen_k): square, fewer queries than keys (decode-like, bottom-right aligned), more queries
# than keys (rows that see nothing), a single query, and empty sides.
SHAPES = [(5, 5), (3, 7), (7, 3), (1, 6), (6, 1), (4, 0), (0, 4)]
WINDOWS = [(-1, -1), (-1, 0), (2, 0), (0, 0), (1, 2), (-1, 3), (4, -1), (0, -1)]  # (left, right), -1 unbounded

_PROGRAM = r"""
#include <cstdio>
#include "visibility.cuh"
using namespace hfp;
int main() {
  int sq, sk, left, right;
  while (std::scanf("%d %d %d %d", &sq, &sk, &left, &right) == 4) {
    const Visibility vis = visibility(sq, sk, left, right);
    for (int i = 0; i <= sq; ++i)
      for (int j = 0; j <= sk; ++j) std::printf("%d", vis.visible(i, j) ? 1 : 0);
    std::printf("\n");
    for (int i = 0; i < sq; ++i) {  // a row's keys as the forward's masks and the decode compute them
      const RowKeyRange r = row_key_range<true>(i, vis.w, sk);
      std::printf("%d %d ", r.lo, r.hi);
    }
    std::printf("\n");
    for (int a = 0; a <= sq; ++a)  // rows [a, b) against keys [c, d): all visible, query and key ranges
      for (int b = a + 1; b <= sq; ++b)
        for (int c = 0; c <= sk; ++c)
          for (int d = c + 1; d <= sk; ++d) {
            const int2 q = vis.query_range(c, d), k = vis.key_range(a, b);
            std::printf("%d %d %d %d %d ", vis.tile_all_visible(a, b, c, d) ? 1 : 0, q.x, q.y, k.x, k.y);
          }
    std::printf("\n");
  }
}
"""


@pytest.fixture(scope="module")
def visibility_program(tmp_path_factory):
    nvcc = find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found")
    folder = tmp_path_factory.mktemp("visibility")
    (folder / "probe.cu").write_text(_PROGRAM)
    subprocess.run([nvcc, "-std=c++17", f"-I{cuda_source_dir()}", "-o", str(folder / "probe"), str(folder / "probe.cu")],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return folder / "probe"


def _rows_that_see(mask: torch.Tensor, c: int, d: int) -> set[int]:
    return {int(i) for i in torch.nonzero(mask[:, c:d].any(dim=1)).flatten()}


def _keys_seen(mask: torch.Tensor, a: int, b: int) -> set[int]:
    return {int(j) for j in torch.nonzero(mask[a:b].any(dim=0)).flatten()}


def test_visibility_header_matches_the_reference_mask(visibility_program):
    cases = list(itertools.product(SHAPES, WINDOWS))
    stdin = "".join(f"{sq} {sk} {left} {right}\n" for (sq, sk), (left, right) in cases)
    lines = subprocess.run([str(visibility_program)], input=stdin, capture_output=True, text=True, check=True).stdout
    lines = lines.split("\n")
    for n, ((sq, sk), (left, right)) in enumerate(cases):
        grid, rows, tiles = lines[3 * n], lines[3 * n + 1].split(), lines[3 * n + 2].split()
        mask = visibility_mask(sq, sk, left, right)  # (sq, sk)
        padded = torch.zeros(sq + 1, sk + 1, dtype=torch.bool)  # out-of-range queries and keys see nothing
        padded[:sq, :sk] = mask
        assert [c == "1" for c in grid] == padded.flatten().tolist(), (sq, sk, left, right)
        for i in range(sq):
            lo, hi = int(rows[2 * i]), int(rows[2 * i + 1])
            assert {j for j in range(sk) if mask[i, j]} == set(range(lo, hi)), (sq, sk, left, right, i)
        values = iter(int(v) for v in tiles)
        for a in range(sq + 1):
            for b in range(a + 1, sq + 1):
                for c in range(sk + 1):
                    for d in range(c + 1, sk + 1):
                        all_visible, q0, q1, k0, k1 = (next(values) for _ in range(5))
                        case = (sq, sk, left, right, a, b, c, d)
                        assert bool(all_visible) == bool(mask[a:b, c:d].all()), case
                        assert set(range(q0, q1)) == _rows_that_see(mask, c, d), case
                        assert set(range(k0, k1)) == _keys_seen(mask, a, b), case
