"""Timing shared by the benchmarks: the implementations of one shape timed in turns, several rounds.

A GPU's clock follows its temperature and power draw over seconds, so two timings taken one after the other
compare two clock states: on the H200 the 16k rows' ratio to cuDNN moved by about 7 % between runs of the same
kernels. Timing every implementation of a shape once per round, ``ROUNDS`` rounds in turn, gives each the same
conditions. A row reports the median of its rounds; a ratio reports the median of the per-round ratios and their
range (``spread``), which says how far one reading can be trusted.
"""

from __future__ import annotations

import statistics
from typing import Callable

ROUNDS = 5


def time_ms(fn: Callable[[], object]) -> float:
    """Median milliseconds of ``fn`` over about 40 ms of calls (``triton.testing.do_bench``)."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def time_sustained_ms(fn: Callable[[], object], seconds: float = 1.0) -> float:
    """Mean milliseconds of ``fn`` called back to back for about ``seconds`` (no cache flush between calls), one
    pair of CUDA events around the whole window: the clock state of a long training or generation run, where the
    GPU's clock has settled under the load (``time_ms`` times about 40 ms of calls, each after an L2 flush). The
    window is queued without synchronising inside it (the call count comes from a synchronised estimate first), so
    the GPU does not wait on the host's next launch between calls."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per_call_s = (time.perf_counter() - began) / 3
    calls = max(4, int(seconds / per_call_s))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def time_rounds(fns: dict[str, Callable[[], object]], rounds: int = ROUNDS,
                timer: Callable[[Callable[[], object]], float] | None = None) -> dict[str, list[float] | Exception]:  # fmt: skip
    """``{name: milliseconds of each round}``, the names timed in turn in every round (by ``timer``, ``time_ms``
    unless given); an implementation that raises (a peer backend missing for this shape) maps to its exception and
    is not timed again."""
    timer = timer or time_ms
    times: dict[str, list[float] | Exception] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            if isinstance(times[name], Exception):
                continue
            try:
                times[name].append(timer(fn))
            except Exception as exc:  # noqa: BLE001 - reported by the caller as the row's error
                times[name] = exc
    return times


def median_ms(rounds: list[float]) -> float:
    return statistics.median(rounds)


def speed_ratio(mine: list[float], theirs: list[float]) -> tuple[float, float, float]:
    """(median, lowest, highest) over the rounds of ``theirs / mine`` milliseconds: > 1 where mine is faster."""
    ratios = [t / m for m, t in zip(mine, theirs)]
    return statistics.median(ratios), min(ratios), max(ratios)
