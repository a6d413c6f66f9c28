"""Multi-head latent attention (DeepSeek-V3: q/k head dim 192, v 128) against torch's SDPA in the same run.

    python scripts/bench.py --only mla [--quick]

The rows of the three parts that time the pair, in one call: the forward (``bench_forward.run_value_head_dim``:
the native 192/128 kernel on Hopper), the training route's backward (``bench_backward.run_value_head_dim``:
``flash_attn_func`` forward + backward, the backward kernels on zero-padded inputs) and the decode
(``bench_decode.value_head_dim_rows``: the decode kernel reading v at 128 columns). ``run(results, quick)``
appends one dict per measurement (the ``scripts/bench.py`` protocol).
"""

from __future__ import annotations


def run(results: list, quick: bool = False) -> None:
    import bench_backward
    import bench_decode
    import bench_forward

    bench_forward.run_value_head_dim(results, quick)
    bench_backward.run_value_head_dim(results, quick)
    bench_decode.value_head_dim_rows(results, quick)
