"""The benchmarks' interleaved timing (``scripts/bench_timing.py``): rounds in turns, failures kept apart, ratios
as medians of per-round ratios. The clock is replaced by a scripted one, so no GPU is needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_timing  # noqa: E402


def test_rounds_run_in_turns_and_a_failing_peer_is_dropped(monkeypatch):
    calls = []
    clock = {"ours": iter([1.0, 1.2, 1.1]), "peer": iter([2.0, 2.6, 2.2])}

    def fake_time_ms(fn):
        name = fn()
        calls.append(name)
        if name == "broken":
            raise RuntimeError("no such backend")
        return next(clock[name])

    monkeypatch.setattr(bench_timing, "time_ms", fake_time_ms)
    fns = {"ours": lambda: "ours", "peer": lambda: "peer", "broken": lambda: "broken"}
    times = bench_timing.time_rounds(fns, rounds=3)
    assert calls == ["ours", "peer", "broken", "ours", "peer", "ours", "peer"]  # turns; the failure not retried
    assert times["ours"] == [1.0, 1.2, 1.1] and times["peer"] == [2.0, 2.6, 2.2]
    assert isinstance(times["broken"], RuntimeError) and "no such backend" in str(times["broken"])
    assert bench_timing.median_ms(times["ours"]) == 1.1
    ratio, low, high = bench_timing.speed_ratio(times["ours"], times["peer"])
    assert (low, ratio, high) == pytest.approx((2.0, 2.0, 2.6 / 1.2))  # per round: 2.0, 2.1667, 2.0


def test_a_given_timer_times_every_round_in_turns(monkeypatch):
    """``time_rounds(..., timer=)`` (the sustained benchmark's back-to-back windows) replaces ``time_ms``."""
    monkeypatch.setattr(bench_timing, "time_ms", lambda fn: pytest.fail("the default timer ran"))
    seen = []
    times = bench_timing.time_rounds({"ours": lambda: 1, "peer": lambda: 2}, rounds=2,
                                     timer=lambda fn: seen.append(fn()) or 0.5 * fn())  # fmt: skip
    assert seen == [1, 2, 1, 2] and times == {"ours": [0.5, 0.5], "peer": [1.0, 1.0]}
