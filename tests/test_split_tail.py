"""The chained walk's split last round (``heuristics.split_tail_parts``, ``kernels/tail_split.py``, ``tail_piece``,
``cuda/fwd_split_tail.cuh``; no GPU needed): how the last round's key tiles are shared out over the grid, and where
the forward launches the split with its partials. Layout q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``."""

import pytest
import torch
from launch_recorder import RecordingKernel

from hf_flashpatch.kernels import forward, tma
from hf_flashpatch.kernels.heuristics import (CHAINED_WALK_MAX_KEYS, SPLIT_CHAIN_KEYS, SPLIT_TAIL_MIN_SAVED_TILES,
                                             split_chain_serves, split_tail_parts)
from hf_flashpatch.kernels.tail_split import max_parts, tail_pieces

SMS = 132


@pytest.mark.parametrize("works, ctas, cluster, key_tiles", [
    (2048, 132, 2, 13),    # 8x2k d128 on 132 SMs: 68 works in the last round
    (2048, 132, 2, 26),    # 4x4k
    (2048, 132, 1, 52),    # 2x8k without clusters
    (144, 132, 1, 7),      # 12 works left, fewer key tiles than lanes share
    (160, 132, 2, 1),      # one key tile a work: pieces are whole works
    (133, 132, 1, 3),      # one work left over, cut over three lanes
])  # fmt: skip
def test_every_key_tile_of_the_last_round_once_and_evenly(works, ctas, cluster, key_tiles):
    tail = works % ctas
    groups = tail // cluster
    total = groups * key_tiles
    lanes = min(ctas // cluster, total)  # a key tile a lane at least
    pieces = tail_pieces(total, lanes, key_tiles)
    covered = {}
    for lane, group, first, end, parts in pieces:
        assert 0 <= first < end <= key_tiles and 0 <= group < groups
        for tile in range(first, end):
            assert (group, tile) not in covered, "a key tile computed twice"
            covered[(group, tile)] = lane
    assert len(covered) == total, "a key tile not computed"
    load = [sum(end - first for piece_lane, _, first, end, _ in pieces if piece_lane == lane) for lane in range(lanes)]
    assert max(load) - min(load) <= 1 and max(load) == -(-total // lanes)
    for group in range(groups):  # parts: the lanes that meet the group, each with one piece of it
        meeting = [piece for piece in pieces if piece[1] == group]
        assert len({piece[0] for piece in meeting}) == len(meeting) == meeting[0][4]
    assert max_parts(works, ctas, cluster, key_tiles, 0) == max(piece[4] for piece in pieces)


def test_no_split_where_works_fill_whole_rounds_or_it_saves_little():
    assert split_tail_parts(2112, 132, 2, 52) == 0  # 16 whole rounds
    assert split_tail_parts(100, 132, 1, 52) == 0  # one CTA a work
    assert split_tail_parts(132, 132, 1, 52) == 0
    # 68 works left on 66 lanes: a lane runs 7 of 13 key tiles (saves 6), 14 of 26 (12), 27 of 52 (25)
    assert SPLIT_TAIL_MIN_SAVED_TILES > 6
    assert split_tail_parts(2048, 132, 2, 13) == 0
    assert split_tail_parts(2048, 132, 2, 26) == (3 if SPLIT_TAIL_MIN_SAVED_TILES <= 12 else 0)
    assert split_tail_parts(2048, 132, 2, 52) == 3


@pytest.fixture
def launches(monkeypatch):
    """The forward's launches into a recorder (sm_90a, 132 SMs, maps without a driver): (defines, args) each."""
    built, launched = [], []
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "sm_count", lambda device: SMS)

    def get_kernel(build, entry, device):
        built.append(dict(build.defines))
        kernel = RecordingKernel(entry, launched)
        kernel.resident_clusters = lambda size, threads: SMS // size
        return kernel

    monkeypatch.setattr(forward, "get_kernel", get_kernel)
    monkeypatch.setattr(forward, "aligned", lambda t: t)
    monkeypatch.setattr(forward, "_check_supported", lambda *tensors: None)
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: bytes(128))

    def launch(batch, seqlen, heads, causal=False, entries=None):
        q = k = v = torch.zeros(batch, seqlen, heads, 128, dtype=torch.bfloat16)
        before = len(launched)
        forward._launch(q, k, v, None, None, None, None, None, causal, -1, -1, None)
        if entries is not None:  # the launches' entry points and grids, in order
            entries.extend((entry, grid) for entry, grid, _ in launched[before:])
        return built[-1], launched[-1][2]

    return launch


# FwdParams (forward.py): ..., tail_parts, partials, part_counters, work_list (last)
TAIL_PARTS, PARTIALS, COUNTERS = -4, -3, -2


def test_the_split_chain_serves_the_chains_keys_and_past_them():
    assert SPLIT_CHAIN_KEYS[0] == 1 and SPLIT_CHAIN_KEYS[1] > CHAINED_WALK_MAX_KEYS
    assert split_chain_serves(2048, True) and split_chain_serves(CHAINED_WALK_MAX_KEYS, True)
    assert split_chain_serves(8192, True) and not split_chain_serves(8192, False)
    assert not split_chain_serves(0, True) and not split_chain_serves(SPLIT_CHAIN_KEYS[1] + 1, True)


@pytest.mark.parametrize("batch, seqlen, key_tiles", [(2, 8192, 52), (4, 4096, 26)])
def test_the_chain_splits_a_partial_last_round(launches, batch, seqlen, key_tiles):
    entries = []
    defines, args = launches(batch, seqlen, 16, entries=entries)  # 2048 works: 68 in the last round
    assert defines.get("CHAINED_WALK") == "1" and defines.get("SPLIT_TAIL") == "1"
    # the full rounds, then the pieces as a kernel of their own, over the same grid and parameters
    assert [entry for entry, _ in entries] == [forward._ENTRY_SM90_WS, forward._ENTRY_SM90_WS_PIECES]
    assert entries[0][1] == entries[1][1] == (SMS, 1, 1)
    parts = split_tail_parts(2048, SMS, 2, key_tiles)
    assert args[TAIL_PARTS] == parts == 3  # a group of 52 (26) key tiles can meet three lanes of 26 or 27 (13 or 14)
    values = 128 // 2 + 4  # a lane's accumulators of 16 rows x 128 columns, two rows' maximum and sum
    assert args[PARTIALS].dtype == torch.float32 and args[PARTIALS].numel() == 68 * parts * 8 * values * 32
    counters = args[COUNTERS]
    assert counters.dtype == torch.int32 and counters.numel() == 68 * 8 and not counters.any()


@pytest.mark.parametrize("batch, seqlen, heads, causal, chained", [
    (8, 2048, 16, False, True),                       # the split saves 6 key tiles: the chain without it
    (1, 8192, 33, False, False),                      # 2112 works: 16 whole rounds, work by work
    (8, 2048, 16, True, False),                       # masked: weights differ, no chain
    (1, SPLIT_CHAIN_KEYS[1] + 160, 16, False, False),  # past the split chain's keys: work by work
])  # fmt: skip
def test_no_split_elsewhere(launches, batch, seqlen, heads, causal, chained):
    defines, args = launches(batch, seqlen, heads, causal)
    assert args[TAIL_PARTS] == 0 and args[PARTIALS] is None and args[COUNTERS] is None
    assert "SPLIT_TAIL" not in defines and (defines.get("CHAINED_WALK") == "1") == chained, defines
