"""The host's copy of the chained walk's split last round (``cuda/fwd_geometry.cuh`` ``TailSplit`` /
``tail_piece``): which key tiles of the last round's works each cluster takes, and the partials a launch passes
(``FwdParams.tail_parts`` / ``partials`` / ``part_counters``, ``cuda/fwd_split_tail.cuh``). Whether a launch splits is
the decision room's (``heuristics.split_tail_parts``, ``split_chain_serves``)."""

from __future__ import annotations

import functools

import torch


def tail_pieces(total: int, lanes: int, key_tiles: int) -> list[tuple[int, int, int, int, int]]:
    """Every piece of a split last round of ``total`` key tiles (its groups' ``key_tiles`` each, group after group)
    over ``lanes <= total`` lanes, lane l taking positions ``[l total / lanes, (l + 1) total / lanes)``: ``(lane,
    group, first, end, parts)`` tuples, the group's key tiles ``first .. end - 1`` in walk order, and how many lanes
    share that group (each lane has a key tile at least, so they are consecutive)."""

    def start(lane: int) -> int:
        return lane * total // lanes

    def lane_of(x: int) -> int:
        return ((x + 1) * lanes - 1) // total

    pieces = []
    for lane in range(lanes):
        begin, end = start(lane), start(lane + 1)
        x = begin
        while x < end:
            group = x // key_tiles
            x_end = min(end, (group + 1) * key_tiles)
            parts = lane_of((group + 1) * key_tiles - 1) - lane_of(group * key_tiles) + 1
            pieces.append((lane, group, x - group * key_tiles, x_end - group * key_tiles, parts))
            x = x_end
    return pieces


@functools.lru_cache(maxsize=256)  # once per problem shape; a launch reads it
def max_parts(works: int, ctas: int, kv_cluster: int, key_tiles: int, min_saved_tiles: int) -> int:
    """The most parts a work of the split last round has (the partials' second dimension), or 0: no partial last
    round, or a lane would still run more than ``key_tiles - min_saved_tiles`` of its key tiles. The last round's
    ``works % ctas`` works come in groups of ``kv_cluster`` (a cluster's CTAs take one group: the same key tiles);
    ``U`` = groups x ``key_tiles`` positions over ``L = min(ctas // kv_cluster, U)`` lanes."""
    tail = works % ctas if works > ctas else 0
    if tail == 0 or key_tiles == 0:
        return 0
    total = tail // kv_cluster * key_tiles
    lanes = min(ctas // kv_cluster, total)
    if key_tiles - -(-total // lanes) < min_saved_tiles or total * lanes >= 1 << 31:  # the kernel's 32-bit positions
        return 0
    return max(piece[4] for piece in tail_pieces(total, lanes, key_tiles))


def partials(tail_parts: int, works: int, ctas: int, math_warps: int, value_dim: int,
             device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(partials, part_counters)`` of a launch that splits (``tail_parts > 0``): each math warp's part of a split
    work, (tail works, tail_parts, math warps, values, 32) fp32, a value being one accumulator register of a lane (16
    rows x ``value_dim`` over 32 lanes) or a row's maximum or partial sum; and the parts written per (tail work, math
    warp), zeroed."""
    tail = works % ctas
    values = value_dim // 2 + 4
    return (torch.empty(tail * tail_parts * math_warps * values * 32, dtype=torch.float32, device=device),
            torch.zeros(tail * math_warps, dtype=torch.int32, device=device))  # fmt: skip
