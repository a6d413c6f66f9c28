"""Persistent Hopper forward walks dealt out on the host (``FwdParams.work_list``, ``cuda/fwd_geometry.cuh``
``for_each_work``), and the tables' upload: a masked walk's listed form (the snake walk with its last rounds dealt out
again) and an unmasked walk's dealt form (``dealt_walk``: works of unequal modelled time). Whether a launch takes
either is the decision room's (``heuristics.hopper_forward_schedule``).

The snake walk (``walk_work``, ``persistent_work``: sections of ``section`` pairs, within one every pair's query tile
``m_rev`` before any pair's ``m_rev + 1``, rounds of ``ctas`` works, every odd round reversed) gives every CTA the same
number of works, so its last round leaves the CTAs past its works idle through a whole work. The listed walk keeps the
snake's rounds but the last ``tail_rounds`` whole ones and the partial one; their works, heaviest first, go each to the
CTA whose modelled load (a work weighs its key tiles + ``heuristics.WORK_TILE_OVERHEAD``) is least, after its snake
works. The CTAs running at one time read the same pairs' K/V as in the snake walk.

Works are numbered in the pair-major order: pair ``= kv_head + kv_heads x sequence``, a pair's query tiles heaviest
(last) first, work ``w = pair x count + m_rev``. The table, int32: ``ctas + 1`` offsets (CTA ``b`` walks entries
``offsets[b] .. offsets[b + 1] - 1``), then the entries, each a work index, in the order the CTA walks them."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import torch

# The whole rounds before the partial one that the listed walk may deal out again (the model picks the count).
TAIL_ROUNDS = (1, 2, 3, 4)


@dataclass(frozen=True)
class ListedWalk:
    """A listed walk over ``ctas`` CTAs: its modelled makespan (in key tiles), the whole rounds it deals out again
    (``tail_rounds``) and its table (module docstring)."""

    ctas: int
    makespan: float
    tail_rounds: int
    table: tuple[int, ...] = field(repr=False)


def snake_order(count: int, pairs: int, section: int) -> list[int]:
    """The snake walk's works (pair-major indices) in its order: sections of ``section`` pairs, each pair's query
    tiles heaviest first, every pair's ``m_rev`` before any pair's ``m_rev + 1`` (``persistent_work``)."""
    order = []
    for first in range(0, pairs, section):
        for m_rev in range(count):
            order.extend(pair * count + m_rev for pair in range(first, min(pairs, first + section)))
    return order


def _snake_ctas(works: int, ctas: int) -> list[int]:
    """The CTA that takes each of the snake walk's first ``works`` works (``walk_work``: rounds of ``ctas``, odd
    rounds reversed)."""
    taking: list[int] = []
    for walk_round in range(-(-works // ctas)):
        taking.extend(range(ctas - 1, -1, -1) if walk_round % 2 else range(ctas))
    return taking[:works]


def snake_makespan(weights: tuple[float, ...] | list[float], pairs: int, section: int, ctas: int) -> float:
    """The largest modelled load of the ``ctas`` CTAs of the snake walk of ``section`` pairs a section."""
    count = len(weights)
    order = snake_order(count, pairs, section)
    load = [0.0] * ctas
    for b, w in zip(_snake_ctas(len(order), ctas), order):
        load[b] += weights[w % count]
    return max(load)


def _longest_first(load: list[float], weights: list[float]) -> tuple[float, list[int]]:
    """``(makespan, the CTA of each)``: each of ``weights`` (heaviest first) in turn to the CTA of least ``load``
    (the lowest index on a tie), on top of the loads given."""
    free = [(load[b], b) for b in range(len(load))]
    heapq.heapify(free)
    ctas_taking = []
    for weight in weights:
        start, b = heapq.heappop(free)
        heapq.heappush(free, (start + weight, b))
        ctas_taking.append(b)
    return max(t for t, _ in free), ctas_taking


def tailed_snake(weights: tuple[float, ...], pairs: int, section: int, ctas: int,
                 tail_rounds: int) -> tuple[float, list[list[int]]]:  # fmt: skip
    """``(makespan, works per CTA)`` of the snake walk whose works past its first ``rounds - tail_rounds`` whole
    rounds are dealt out again, heaviest first (stable), each to the CTA of least modelled load. ``weights``: a pair's
    query tiles', heaviest first (``m_rev`` order)."""
    count = len(weights)
    order = snake_order(count, pairs, section)
    head = max(0, len(order) // ctas - tail_rounds) * ctas
    lists: list[list[int]] = [[] for _ in range(ctas)]
    load = [0.0] * ctas
    for b, w in zip(_snake_ctas(head, ctas), order):
        lists[b].append(w)
        load[b] += weights[w % count]
    tail = sorted(order[head:], key=lambda w: -weights[w % count])
    makespan, ctas_taking = _longest_first(load, [weights[w % count] for w in tail])
    for w, b in zip(tail, ctas_taking):
        lists[b].append(w)
    return makespan, lists


def listed_makespan(weights: tuple[float, ...], pairs: int, section: int, ctas: int) -> tuple[float, int]:
    """``(makespan, tail_rounds)`` of the listed walk of the snake of ``section`` pairs a section: the count of
    :data:`TAIL_ROUNDS` whose :func:`tailed_snake` makespan is least (the fewest on a tie), in one pass over the
    snake's rounds (a shape's decision weighs every section by it)."""
    count = len(weights)
    order_weights = [weights[w % count] for w in snake_order(count, pairs, section)]
    whole = len(order_weights) // ctas
    taking = _snake_ctas(len(order_weights), ctas)
    load = [0.0] * ctas
    dealt = 0
    best: tuple[float, int] | None = None
    for tail_rounds in sorted(TAIL_ROUNDS, reverse=True):  # the snake's loads grow round by round
        head = max(0, whole - tail_rounds) * ctas
        for i in range(dealt, head):
            load[taking[i]] += order_weights[i]
        dealt = head
        makespan = _longest_first(load, sorted(order_weights[head:], reverse=True))[0]
        if best is None or makespan <= best[0]:
            best = makespan, tail_rounds
    return best


def listed_walk(weights: tuple[float, ...], pairs: int, section: int, ctas: int,
                tail_rounds: int | None = None) -> ListedWalk:  # fmt: skip
    """The listed walk of the snake walk of ``section`` pairs a section over ``ctas`` CTAs, dealing out again
    ``tail_rounds`` whole rounds and the partial one (None: :func:`listed_makespan`'s choice; module docstring)."""
    if tail_rounds is None:
        tail_rounds = listed_makespan(weights, pairs, section, ctas)[1]
    makespan, lists = tailed_snake(weights, pairs, section, ctas, tail_rounds)
    return ListedWalk(ctas, makespan, tail_rounds, _table(lists))


def _table(lists: list[list[int]]) -> tuple[int, ...]:
    """The kernel's table (module docstring) of each CTA's works in walk order."""
    offsets = [0]
    for cta_works in lists:
        offsets.append(offsets[-1] + len(cta_works))
    return tuple(offsets) + tuple(w for cta in lists for w in cta)


def dealt_walk(weights: tuple[float, ...], pairs: int, ctas: int) -> ListedWalk:
    """An unmasked persistent walk dealt out on the host: the pair-major order (``weights``: a pair's query tiles', in
    ``m_rev`` order), each work in turn to the CTA of least modelled load (the lowest index on a tie: round 0 as the
    plain walk's), and its last ``tail_rounds`` whole rounds and the partial one heaviest first (stable), each to the
    CTA of least load, with ``tail_rounds`` of ``(0,) +`` :data:`TAIL_ROUNDS` whose makespan is least (the fewest on a
    tie). A CTA walks its works in the order dealt, so the CTAs running at one time read the same few pairs' K/V as in
    the plain walk (rounds of ``ctas`` consecutive works)."""
    count = len(weights)
    order_weights = [weights[w % count] for w in range(count * pairs)]
    best: tuple[float, list[list[int]], int] | None = None
    for tail_rounds in (0,) + TAIL_ROUNDS:
        head = max(0, len(order_weights) // ctas - tail_rounds) * ctas
        _, taking = _longest_first([0.0] * ctas, order_weights[:head])
        load = [0.0] * ctas
        for w, b in enumerate(taking):
            load[b] += order_weights[w]
        tail = sorted(range(head, len(order_weights)), key=lambda w: -order_weights[w])
        makespan, tail_taking = _longest_first(load, [order_weights[w] for w in tail])
        if best is None or makespan < best[0]:
            lists: list[list[int]] = [[] for _ in range(ctas)]
            for w, b in list(enumerate(taking)) + list(zip(tail, tail_taking)):
                lists[b].append(w)
            best = makespan, lists, tail_rounds
    makespan, lists, tail_rounds = best
    return ListedWalk(ctas, makespan, tail_rounds, _table(lists))


def plain_makespan(weights: tuple[float, ...], pairs: int, ctas: int) -> float:
    """The largest modelled load of the plain (unmasked) walk: work ``w`` of the pair-major order to CTA ``w % ctas``
    (``walk_work``, ``persistent_work`` with no sections)."""
    count = len(weights)
    load = [0.0] * ctas
    for w in range(count * pairs):
        load[w % ctas] += weights[w % count]
    return max(load)


# Uploaded tables by (the table object's id, device index). A table stays for the process's life: a captured CUDA
# graph keeps its address, so freeing it could hand a replay another tensor's memory. One small tensor per listed or
# dealt problem shape (at most 4096 + 133 ints: heuristics.MODELLED_MAX_TILES); the table itself is kept too, so its
# id is never reused.
_UPLOADED: dict[tuple[int, int | None], tuple[tuple[int, ...], torch.Tensor]] = {}


def on_device(walk: ListedWalk, device: torch.device) -> torch.Tensor | None:
    """``walk``'s table on ``device`` (int32), uploaded at its first use; None while the current stream is being
    captured into a CUDA graph and the table is not there yet (a host-to-device copy cannot be captured): that launch
    takes the snake walk, which computes the same bits."""
    key = (id(walk.table), device.index)
    hit = _UPLOADED.get(key)
    if hit is not None:
        return hit[1]
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return None
    table = torch.tensor(walk.table, dtype=torch.int32, device=device)
    return _UPLOADED.setdefault(key, (walk.table, table))[1]  # two threads uploading at once launch with one copy
