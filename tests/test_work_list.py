"""The listed walk of the masked Hopper forward on the host (hf_flashpatch/kernels/work_list.py): the snake walk with
its last rounds dealt out again. The table deals every work to one CTA, keeps the snake's first rounds as they were,
its makespan is the loads the table gives, and it ends within a light work of the ideal where the snake ends a whole
work past it; the upload is kept (and refused while a CUDA graph captures)."""

import heapq

import pytest
import torch

from hf_flashpatch.kernels import heuristics, work_list


def _weights(seqlen, block_m=128, block_n=128, group=1):
    key_tiles = heuristics.query_tile_key_tiles(seqlen, seqlen, group, block_m, block_n, -1, 0)
    return tuple(n + heuristics.WORK_TILE_OVERHEAD for n in reversed(key_tiles))  # heaviest first


def _lists(walk):
    offsets, works = walk.table[: walk.ctas + 1], walk.table[walk.ctas + 1 :]
    return [list(works[offsets[b] : offsets[b + 1]]) for b in range(walk.ctas)]


def _snake_walk(count, pairs, section, ctas):
    """Each CTA's works in the kernel's snake walk (walk_work, persistent_work), computed here from their formulas."""
    lists = [[] for _ in range(ctas)]
    tiles = count * pairs
    for walk_round in range(-(-tiles // ctas)):
        for b in range(ctas):
            w = walk_round * ctas + (ctas - 1 - b if walk_round % 2 else b)
            if w >= tiles:
                continue
            per_section = section * count
            first = w // per_section * section
            here = min(section, pairs - first)
            m_rev, pair = divmod(w - first * count, here)
            lists[b].append((first + pair) * count + m_rev)
    return lists


SHAPES = [(2048, 128, 128, 1, 132), (4096, 192, 64, 16, 132), (1000, 128, 7, 2, 40), (300, 192, 3, 3, 5)]


@pytest.mark.parametrize("seqlen, block_m, pairs, section, ctas", SHAPES)
def test_the_table_keeps_the_snakes_first_rounds_and_deals_every_work_once(seqlen, block_m, pairs, section, ctas):
    weights = _weights(seqlen, block_m)
    count = len(weights)
    walk = work_list.listed_walk(weights, pairs, section, ctas)
    offsets, works = walk.table[: ctas + 1], walk.table[ctas + 1 :]
    assert offsets[0] == 0 and offsets[-1] == len(works) and list(offsets) == sorted(offsets)
    assert sorted(works) == list(range(count * pairs))
    snake = _snake_walk(count, pairs, section, ctas)
    head_rounds = max(0, count * pairs // ctas - walk.tail_rounds)
    for cta, listed in zip(snake, _lists(walk)):
        assert listed[:head_rounds] == cta[:head_rounds]  # the snake's first rounds, as the kernel walks them
        tail = listed[head_rounds:]
        assert [weights[w % count] for w in tail] == sorted((weights[w % count] for w in tail), reverse=True)
    loads = [sum(weights[w % count] for w in cta) for cta in _lists(walk)]
    assert max(loads) == walk.makespan
    assert work_list.snake_makespan(list(weights), pairs, section, ctas) == max(
        sum(weights[w % count] for w in cta) for cta in snake)  # the decision room's model of the same snake


def test_the_listed_walk_ends_within_a_light_work_of_the_ideal():
    """d128 causal at 1k, 2k, 4k and 8k (2048 works on 132 SMs, a snake of one pair a section) and d64 causal at 2k
    (256 pairs, 64 a section): the listed walk ends within 1 % of the ideal makespan, where the snake ends up to a
    whole work past it (3.1 % at d128)."""
    for seqlen, block_m, pairs, section in [(1024, 128, 256, 1), (2048, 128, 128, 1), (4096, 128, 64, 1),
                                            (8192, 128, 32, 1), (2048, 192, 256, 64)]:  # fmt: skip
        weights = _weights(seqlen, block_m)
        ideal = sum(weights) * pairs / 132
        walk = work_list.listed_walk(weights, pairs, section, 132)
        snake = work_list.snake_makespan(list(weights), pairs, section, 132)
        assert walk.makespan < 1.01 * ideal and walk.makespan < snake, seqlen
        assert walk.tail_rounds in work_list.TAIL_ROUNDS
        if block_m == 128:
            assert snake > 1.03 * ideal


def test_the_model_matches_a_plain_greedy_after_the_snake_head():
    """tailed_snake's makespan is that of a greedy over the sorted rest after the snake's loads, computed here."""
    weights = _weights(3000)
    count, pairs, ctas, tail_rounds = len(weights), 9, 50, 2
    snake = _snake_walk(count, pairs, 1, ctas)
    head = count * pairs // ctas - tail_rounds
    loads = [sum(weights[w % count] for w in cta[:head]) for cta in snake]
    rest = sorted((w for cta in snake for w in cta[head:]), key=lambda w: -weights[w % count])
    free = list(loads)
    heapq.heapify(free)
    for w in rest:
        heapq.heappush(free, heapq.heappop(free) + weights[w % count])
    assert work_list.tailed_snake(weights, pairs, 1, ctas, tail_rounds)[0] == max(free)


def test_fewer_works_than_the_tail_rounds_deal_them_all_longest_first():
    makespan, lists = work_list.tailed_snake((3.0, 1.0), 2, 1, 2, 4)  # works 0 (3), 1 (1), 2 (3), 3 (1)
    assert lists == [[0, 1], [2, 3]] and makespan == 4.0


def test_the_upload_is_kept_and_refused_while_capturing(monkeypatch):
    walk = work_list.listed_walk(_weights(600), 3, 1, 4)
    device = torch.device("cpu")
    table = work_list.on_device(walk, device)
    assert table.dtype == torch.int32 and table.tolist() == list(walk.table)
    assert work_list.on_device(walk, device) is table  # once per table and device
    other = work_list.listed_walk(_weights(600), 3, 1, 4)  # equal, but another object: its own upload
    assert other == walk and work_list.on_device(other, device) is not table
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    fresh = work_list.listed_walk(_weights(700), 3, 1, 4)
    assert work_list.on_device(fresh, torch.device("cuda", 0)) is None  # no copy while a graph captures
    assert (id(fresh.table), 0) not in work_list._UPLOADED


@pytest.mark.parametrize("seqlen, block_m, pairs, section", [shape[:4] for shape in SHAPES] + [(16384, 192, 32, 2)])
def test_the_one_pass_makespan_is_the_tailed_snakes_least(seqlen, block_m, pairs, section):
    """listed_makespan (one pass, every tail) chooses what tailed_snake gives for each tail: the least makespan, the
    fewest tail rounds on a tie; listed_walk builds that walk."""
    weights = _weights(seqlen, block_m)
    each = {k: work_list.tailed_snake(weights, pairs, section, 132, k)[0] for k in work_list.TAIL_ROUNDS}
    least = min(each.values())
    makespan, tail_rounds = work_list.listed_makespan(weights, pairs, section, 132)
    assert makespan == least and tail_rounds == min(k for k, v in each.items() if v == least)
    walk = work_list.listed_walk(weights, pairs, section, 132)
    assert (walk.makespan, walk.tail_rounds) == (makespan, tail_rounds)


# An unmasked walk dealt out on the host (work_list.dealt_walk): a pair's last query tile (m_rev 0) lighter, as where
# it leaves warpgroups idle. (count, pairs, ctas, short, full): d64 2k and 4k at 16k tokens, a partial last round, a
# grid larger than half the works, fewer works than CTAs.
DEALT = [(11, 256, 132, 11.7, 17.0), (22, 128, 132, 17.0, 33.0), (7, 9, 10, 1.0, 4.0), (5, 13, 40, 2.0, 3.0),
         (3, 2, 8, 1.0, 2.0)]


@pytest.mark.parametrize("count, pairs, ctas, short, full", DEALT)
def test_the_dealt_walk_deals_every_work_once_in_order_and_the_tail_heaviest_first(count, pairs, ctas, short, full):
    """Every work once; CTA b's first work is b where there are as many (round 0 as the plain walk's); each CTA's
    works before the dealt-out tail come in the pair-major order (the CTAs running at one time read a few pairs'
    K/V), those after it heaviest first; the makespan is the table's largest load."""
    weights = (short,) + (full,) * (count - 1)
    walk = work_list.dealt_walk(weights, pairs, ctas)
    offsets, works = walk.table[: ctas + 1], walk.table[ctas + 1 :]
    assert walk.ctas == ctas and offsets[0] == 0 and offsets[-1] == len(works) and list(offsets) == sorted(offsets)
    assert sorted(works) == list(range(count * pairs))
    lists = _lists(walk)
    head = max(0, count * pairs // ctas - walk.tail_rounds) * ctas
    for b, cta in enumerate(lists):
        if b < min(ctas, head):
            assert cta[0] == b
        dealt_head = [w for w in cta if w < head]
        assert cta[: len(dealt_head)] == sorted(dealt_head)
        tail = [weights[w % count] for w in cta[len(dealt_head) :]]
        assert tail == sorted(tail, reverse=True)
    assert walk.makespan == max(sum(weights[w % count] for w in cta) for cta in lists)


@pytest.mark.parametrize("count, pairs, ctas, short, full", DEALT)
def test_the_dealt_walk_ends_within_a_work_of_the_ideal_and_never_after_the_plain_walk(count, pairs, ctas, short, full):
    weights = (short,) + (full,) * (count - 1)
    walk = work_list.dealt_walk(weights, pairs, ctas)
    plain = work_list.plain_makespan(weights, pairs, ctas)
    ideal = max(full, sum(weights) * pairs / ctas)
    assert ideal <= walk.makespan <= min(plain, ideal + full)
    # the plain walk's model: work w on CTA w % ctas
    loads = [0.0] * ctas
    for w in range(count * pairs):
        loads[w % ctas] += weights[w % count]
    assert plain == max(loads)


def test_the_dealt_walk_of_the_d64_2k_shape_gives_each_cta_with_a_work_more_short_tiles():
    """d64 2k at 16k tokens: 2816 works on 132 CTAs, 44 of which take 22 works and the rest 21. The plain walk puts
    every short tile on 12 CTAs; dealt out, the CTAs with 22 works hold short ones and the walk ends below 22 full
    works, near the ideal."""
    count, pairs, ctas, short, full = DEALT[0]
    weights = (short,) + (full,) * (count - 1)
    walk = work_list.dealt_walk(weights, pairs, ctas)
    assert work_list.plain_makespan(weights, pairs, ctas) == 22 * full
    for cta in _lists(walk):
        if len(cta) == 22:
            assert sum(1 for w in cta if w % count == 0) >= 3
    assert walk.makespan < 21 * full + short and walk.makespan < 1.01 * sum(weights) * pairs / ctas + full - short
