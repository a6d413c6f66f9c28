"""The decision room: which kernel body and tiles serve a call, for forward, backward and decode.

Shipped configurations only, one function per family, a comment on each branch (FlashAttention-3's
``tile_size.h`` / ``heuristics.h`` are the model). The frozen config dataclasses that key the compile
cache stay with their kernels (``forward.ForwardConfig``, ``backward.BackwardConfig``,
``decode_config.DecodeConfig``); this module decides their fields and imports none of them at module
level. Benchmarks and tests that need another configuration pass it explicitly to the kernel layer
(``forward._launch(..., shape)``, ``backward._kernel_backward(cfg, ...)``). Why each choice won, with
its results folder: ``notes/``.

- forward: :func:`forward_tile_shape` (``cuda/fwd.cu``, ``cuda/fwd_hopper_ws.cu``);
- backward: :func:`backward_tiles` (``cuda/bwd.cu`` with ``bwd_default.cuh`` / ``bwd_tiled.cuh`` /
  ``bwd_hopper.cuh``), :func:`native_backward_value_head_dim`;
- decode: :func:`choose_num_splits` and :func:`ctas_per_sm` (``cuda/decode.cu``; its compile-time
  configuration has no choice left but dtype, head dim, addressing and softcap).

:func:`forward_config`, :func:`backward_config` and :func:`decode_config` give the config a problem
gets, for callers that enumerate problems (``scripts/check_shipped_cubins.py``).

Forward tiles: q ``(batch, seqlen_q, heads, head_dim)``, k/v ``(batch, seqlen_k, kv_heads, head_dim)``.
A CTA computes ``block_m`` packed query rows (query positions x the query heads of one GQA group)
against ``block_n`` keys per step; each warp owns ``block_m / num_warps`` rows, i.e.
``block_m / (16 * num_warps)`` m16n8k16 m-tiles. Two bodies: ``mma`` (``fwd.cu``, mma.sync m16n8k16,
any sm_80+ GPU, every head dim) and, on Hopper (sm_90a) at head dims 64 and 128 (and 192 / 128),
``wgmma``: the warp-specialised ``fwd_hopper_ws.cu``, warpgroup MMA on two or three math warpgroups of 64 rows
and a producer warpgroup streaming K/V with the TMA (counted in ``num_warps``: ``block_m = 64 * (num_warps / 4 - 1)``).
Every shipped shape compiles without register spills (``tests/test_*_compile.py``).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass

from . import tail_split
from .work_list import ListedWalk, dealt_walk, listed_makespan, listed_walk, plain_makespan, snake_makespan

# ============================================================================================ forward


@dataclass(frozen=True)
class TileShape:
    block_m: int  # packed query rows per CTA
    block_n: int  # keys per K/V tile
    num_warps: int
    kv_stages: int = 2  # depth of the cp.async K/V ring (2 = double buffering)
    q_in_registers: bool = False  # keep the warp's Q fragments in registers instead of re-reading smem
    wgmma: bool = False  # the Hopper body (fwd_hopper_ws.cu): 4 warps per 64-row math warpgroup + 4 producer warps
    q_by_tma: bool = False  # wgmma body: a producer thread loads the math warpgroups' Q rows (else they copy them)
    own_key_tiles: bool = False  # wgmma body: a math warpgroup computes only the key tiles its own rows see
    staged_output: bool = False  # wgmma body: the output leaves through the warpgroup's Q rows (needs Q copied)
    kv_cluster: int = 1  # wgmma body: CTAs of a cluster sharing each K/V tile by a TMA multicast (1: none)
    tma_output: bool = False  # wgmma body: each warp's output rows by the TMA from its Q rows (needs Q copied)
    chained_walk: bool = False  # wgmma body: one key loop over all of a warpgroup's works (unmasked, output boxes)
    warpgroup_turns: bool = False  # wgmma body, walked work by work: the math warpgroups take turns at issuing products
    split_tail: bool = False  # wgmma body, the chained walk: a partial last round's works split by key tiles


# The Hopper body (head dims 64 and 128 on sm_90a): a producer warpgroup streaming K/V with the TMA into a ring
# of key tiles (K and V on barriers of their own), and math warpgroups of 64 rows each, every key tile's softmax
# under the previous tile's P V (FA3's intra-warpgroup overlap). (head dim, masked) -> shape.
# - d128: two math warpgroups at 240 registers. Unmasked: 160-key tiles in two stages, where two Q tiles fit beside
#   the ring (225 KB) for the chained walk (chained_walk: one key loop over a warpgroup's works where
#   chained_walk_serves, the same tiles work by work elsewhere; as fast as FlashAttention-3's 176-key tile there).
#   Masked: 128-key tiles in three stages (masked 176-key tiles spilled) and Q by the TMA from a producer thread
#   (the split then 40 / 232 registers) where a CTA walks several works (forward_tile_shape); the unmasked build does
#   not gain from it (notes/forward.md, decision log). The masked math warpgroups take turns at issuing their
#   products (warpgroup_turns; not the chained walk, 192/128 or d64: notes/forward.md, decision log), and each
#   math warp stores its output rows by TMA boxes staged in the K slot of its work's last key tile (tma_output; the
#   Q rows may already hold the next work's Q). Unmasked, two CTAs of a cluster share each K/V tile by a TMA
#   multicast (kv_cluster=2: half the L2 traffic) where clustered_schedule allows it, else the same shape's plain
#   build; each math warp stores its output rows with the TMA from its Q rows (tma_output; batched, groups dividing
#   16).
# - d64: three math warpgroups (192 rows; FA3's d64 tile): the 512-thread pool gives each math thread 160 registers
#   (32 + 3 x 160), and one K/V tile serves 1.5x the rows; two stages unmasked, three masked (a causal work's first tiles
#   come sooner). Its Q rows come by the TMA from a producer thread, issued as soon as a warpgroup's last S retired, and
#   a warpgroup computes only the key tiles its 64 rows see (a causal diagonal crosses a 192-row tile over two or three
#   128-key tiles). At d128, as at 192/128, the own key tiles' prologue cost more than it saved.
HOPPER_SHAPES: dict[tuple[int, bool], TileShape] = {
    (128, False): TileShape(block_m=128, block_n=160, num_warps=12, kv_stages=2, wgmma=True, kv_cluster=2,
                            tma_output=True, chained_walk=True, split_tail=True),
    (128, True): TileShape(block_m=128, block_n=128, num_warps=12, kv_stages=3, wgmma=True, q_by_tma=True,
                           warpgroup_turns=True, tma_output=True),
    (64, False): TileShape(block_m=192, block_n=128, num_warps=16, kv_stages=2, wgmma=True, q_by_tma=True,
                           own_key_tiles=True),
    (64, True): TileShape(block_m=192, block_n=128, num_warps=16, kv_stages=3, wgmma=True, q_by_tma=True,
                          own_key_tiles=True),
}
# (q/k head dim, v head dim) -> shape, for a v head dim of its own (multi-head latent attention: DeepSeek-V3's
# 192 / 128) on sm_90a, masked or not: the warp-specialised body with 64-key tiles, whose three stages of
# 192-wide K and 128-wide V fit in shared memory with the 192-wide Q tile (168 KB; 128-key tiles would need
# 289 KB); its math warps copy their Q rows, and store their output by TMA boxes from them (tma_output) as unmasked
# d128's do. Other pairs, and other GPUs, take the exact zero-padding route (hf_flashpatch/kernels/value_head_dim.py).
HOPPER_VALUE_HEAD_DIM_SHAPES: dict[tuple[int, int], TileShape] = {
    (192, 128): TileShape(block_m=128, block_n=64, num_warps=12, kv_stages=3, wgmma=True, tma_output=True),
}


def native_value_head_dim(head_dim: int, head_dim_v: int, arch: str) -> bool:
    """Whether a forward kernel takes q/k at ``head_dim`` and v at ``head_dim_v != head_dim`` on ``arch``."""
    return arch == "sm_90a" and (head_dim, head_dim_v) in HOPPER_VALUE_HEAD_DIM_SHAPES


@functools.lru_cache(maxsize=None)  # a few (head dim, arch, mask) keys; called on every launch
def forward_tile_shape(head_dim: int, arch: str = "sm_80", has_mask: bool = False, head_dim_v: int | None = None,
                       one_cta_per_tile: bool = False) -> TileShape:  # fmt: skip
    """The tile shape used for ``head_dim`` on ``arch`` (both dtypes; ``has_mask``: causal / window; ``head_dim_v``:
    v's head dim where it differs, see :data:`HOPPER_VALUE_HEAD_DIM_SHAPES`; ``one_cta_per_tile``: the Hopper walk
    :func:`hopper_forward_schedule` chose gives every CTA one work tile). The wgmma bodies serve head dims 64 and
    128 on sm_90a; every other case takes the mma.sync table."""
    if head_dim_v is not None and head_dim_v != head_dim:
        if not native_value_head_dim(head_dim, head_dim_v, arch):
            raise ValueError(f"no forward kernel takes head dims {head_dim} / {head_dim_v} on {arch}")
        return HOPPER_VALUE_HEAD_DIM_SHAPES[(head_dim, head_dim_v)]
    if arch == "sm_90a" and (head_dim, has_mask) in HOPPER_SHAPES:
        shape = HOPPER_SHAPES[(head_dim, has_mask)]
        if one_cta_per_tile and shape.q_by_tma and shape.block_m == 128:
            # Q by the TMA pays by loading the next work's Q under this one's last products; a CTA with one work
            # has none, and with two math warpgroups the Q thread's registers cost the math threads 8 (232, not
            # 240): the math warps copy Q themselves. Its Q rows are then free at the end, and the output leaves
            # through them in 16-byte stores of whole rows, so the CTA is done (and the next one starts) sooner; a
            # walking CTA, whose stores overlap its next work, lost 0-4 % by it (notes/forward.md, decision log).
            return dataclasses.replace(shape, q_by_tma=False, staged_output=True, tma_output=False)
        return shape
    return mma_tile_shape(head_dim)


@dataclass(frozen=True)
class HopperSchedule:
    """The Hopper forward's grid and work order (``fwd_hopper_ws.cu``: CTA ``b`` takes tile ``b`` of every round of
    ``ctas`` work tiles, masked builds in reverse every odd round; ``section``: pairs per section of the work order,
    0 for pair-major, see ``fwd_geometry.cuh`` ``persistent_work``; ``listed``: the works dealt out by the host,
    ``work_list.ListedWalk`` (a masked walk's listed form, or an unmasked walk's ``dealt_walk``), whose launch falls
    back to the ``section`` walk while its table cannot be uploaded)."""

    ctas: int
    section: int = 0
    kv_cluster: int = 1  # CTAs per cluster sharing each K/V tile (TileShape.kv_cluster; see clustered_schedule)
    listed: ListedWalk | None = None

    def one_cta_per_tile(self, tiles: int) -> bool:
        """Whether every CTA of this walk over ``tiles`` work tiles takes one."""
        return self.ctas >= tiles


# The L2 (50 MB on the H200) holds the K/V of the pairs a sectioned walk has in flight with room to spare.
SECTION_KV_BYTES = 32 << 20
# Cost of a work tile beside its key tiles, in key tiles (its Q copy, the first K/V's latency, its epilogue).
WORK_TILE_OVERHEAD = 1.0
# A persistent masked walk (the snake's sections) serves where the model puts its makespan this far under that of one
# CTA per tile.
PERSISTENT_WALK_GAIN = 0.98
# The snake walk serving a shape takes its listed form (its last rounds dealt out again: work_list.listed_walk) where
# the model puts that this far under the snake's makespan.
LISTED_WALK_GAIN = 0.995
# A work tile whose last warpgroups have no rows (a pair's last query tile, where block_m does not divide its packed
# rows) leaves them idle in builds that skip a warpgroup's key tiles outside its rows (TileShape.own_key_tiles: d64's
# three math warpgroups), and the busy ones share the SM's tensor cores, exponentials and issue among fewer warps:
# (busy, math warpgroups) -> the share of a full work's time such a work takes. Measured on d64 (H100, 2816 one-tile
# works over 2048 and 4096 keys: results/2026-12-07_d64-dealt-walk); a pair not listed weighs as a full work.
BUSY_WARPGROUPS_WORK_SHARE = {(1, 3): 0.69, (2, 3): 0.80}
# Masked problems with more work tiles than this take one CTA per tile without consulting the model: its host cost
# grows with the tiles (about 20 ms at this many, once per shape), and with many rounds the hardware's order is
# already within a tile of the ideal (every larger shape measured chose it).
MODELLED_MAX_TILES = 4096


def leading_rows(packed_rows: int, block_m: int) -> int:
    """The rows by which a sequence's first query tile starts before the sequence in a masked walk of the Hopper
    forward (``FwdParams::leading_rows``, cuda/fwd_geometry.cuh: tile m holds packed rows ``m * block_m - lead ..``):
    the last tile's shortfall of rows, in whole 64-row math warpgroups. The tile short of rows is then the first,
    which sees the fewest keys under a causal mask, and every warpgroup of the heaviest tile has rows (2048 rows on
    d64's 192-row tiles: the last tile had 128 rows, one warpgroup waiting while two ran its 16 key tiles)."""
    return (block_m - packed_rows % block_m) % block_m // 64 * 64


@functools.lru_cache(maxsize=256)
def hopper_forward_schedule(seqlen_q: int, seqlen_k: int, group: int, block_m: int, block_n: int, left: int,
                            right: int, pairs: int, sms: int, varlen: bool, pair_kv_bytes: int,
                            rowless_warpgroups_idle: bool = False) -> HopperSchedule:  # fmt: skip
    """Grid and work order of the Hopper forward: ``pairs`` (kv head, sequence) pairs of ``ceil(seqlen_q * group /
    block_m)`` query tiles each (packed rows: positions x the group's query heads), ``block_n``-key tiles, the folded
    window ``(left, right)`` (-1: unbounded; masked when either is >= 0), on ``sms`` SMs (one CTA each).

    - Varlen: tiles of different sequences weigh differently in ways the host does not know: one CTA per tile, the
      hardware handing each SM the next (pair-major, heaviest first).
    - Unmasked, fixed length: persistent CTAs (one per SM) save a prologue and an epilogue per tile: ``min(tiles,
      sms)``. Every tile sees the same keys, so the plain walk (CTA b takes work b of every round) is balanced, except
      where a pair's last tile leaves warpgroups without rows idle (``rowless_warpgroups_idle``: the build skips their
      key tiles, ``TileShape.own_key_tiles``) and so takes less time (:data:`BUSY_WARPGROUPS_WORK_SHARE`): there the
      works are dealt out on the host (``work_list.dealt_walk``: the short tiles to the CTAs with a work more) where
      that ends ``LISTED_WALK_GAIN`` under the plain walk.
    - Masked (causal / window), fixed length: persistent with the sectioned order and the snake walk where a model
      of the schedule (each tile weighs the key tiles it sees + ``WORK_TILE_OVERHEAD``) gives a makespan at least
      2 % under that of one CTA per tile (the hardware's next-free-SM order), over sections of 1, 2, 4, ... pairs
      whose K/V (``pair_kv_bytes`` each) fit ``SECTION_KV_BYTES``; else, and past ``MODELLED_MAX_TILES`` tiles, one
      CTA per tile. (A fixed stride over the pair-major order can hand one CTA every heaviest tile: d64 at 4k, 22
      tiles per pair divide 132 SMs, 1.49x the time; the reversed odd rounds and the section order avoid it.) A snake
      walk takes its listed form (``work_list.listed_walk``: its last rounds' works dealt out again on the host,
      heaviest first, each to the CTA the model frees first) where that ends ``LISTED_WALK_GAIN`` under it, and the
      sections are weighed by the walk that runs.
    """
    count = -(-seqlen_q * group // block_m)
    tiles = count * pairs
    if varlen:
        return HopperSchedule(tiles)
    if left < 0 and right < 0:
        if not rowless_warpgroups_idle or tiles <= sms or tiles > MODELLED_MAX_TILES:
            return HopperSchedule(min(tiles, sms))
        return _unmasked_schedule(seqlen_q * group, count, -(-seqlen_k // block_n), block_m, pairs, sms)
    if tiles > MODELLED_MAX_TILES:
        return HopperSchedule(tiles)
    key_tiles = query_tile_key_tiles(seqlen_q, seqlen_k, group, block_m, block_n, left, right)
    return _masked_schedule(key_tiles, pairs, sms, pair_kv_bytes)


def query_tile_key_tiles(seqlen_q: int, seqlen_k: int, group: int, block_m: int, block_n: int, left: int,
                         right: int) -> tuple[int, ...]:  # fmt: skip
    """How many ``block_n``-key tiles each ``block_m``-row query tile of one (kv head, sequence) pair computes in a
    masked walk: the host's copy of ``visible_key_tiles`` (``cuda/fwd_geometry.cuh``), which the schedule model
    weighs. Packed rows are positions x the group's query heads; tile m's rows start at ``m * block_m -
    leading_rows`` (:func:`leading_rows`); bottom-right alignment (query i sits at key ``i + seqlen_k - seqlen_q``);
    the folded window ``(left, right)``, -1 unbounded. A tile's keys run from its first row's lowest visible key to
    its last row's highest, so it computes every key tile any of its rows sees and no other."""
    shift = seqlen_k - seqlen_q
    lead = leading_rows(seqlen_q * group, block_m)
    key_tiles = []
    for m in range(-(-seqlen_q * group // block_m)):
        first = max(0, m * block_m - lead) // group + shift
        last = min(seqlen_q - 1, ((m + 1) * block_m - lead - 1) // group) + shift
        lo = max(0, first - left) if left >= 0 else 0
        hi = min(seqlen_k, last + right + 1) if right >= 0 else seqlen_k
        key_tiles.append(max(0, -(-hi // block_n) - lo // block_n) if hi > lo else 0)
    return tuple(key_tiles)


def clustered_schedule(walk: HopperSchedule, kv_cluster: int, query_tiles: int, masked: bool, varlen: bool,
                       resident_clusters: Callable[[], int]) -> HopperSchedule:  # fmt: skip
    """``walk`` in clusters of ``kv_cluster`` CTAs that share each K/V tile (a TMA multicast, ``TileShape.kv_cluster``)
    where that serves, else ``walk`` itself. The CTAs of a cluster take works b, b + 1, ... of every round and load
    every key tile in lock step, so their works must be one (kv head, sequence) pair's with the same key tiles: a
    fixed-length unmasked problem (every query tile sees every key) whose pairs have a multiple of ``kv_cluster``
    query tiles (``query_tiles``), on a grid of whole clusters. ``resident_clusters()``: how many clusters the GPU
    runs at once (``build.Kernel.resident_clusters``, asked last: it loads the clustered build); where they hold
    fewer CTAs than the walk's grid, the plain walk keeps its CTAs (a second wave of clusters would cost more than
    the multicast saves)."""
    plain = walk if walk.kv_cluster == 1 else dataclasses.replace(walk, kv_cluster=1)  # a given walk's is not read
    if kv_cluster == 1 or masked or varlen or query_tiles % kv_cluster or walk.ctas % kv_cluster:
        return plain
    if resident_clusters() * kv_cluster < walk.ctas:
        return plain
    return dataclasses.replace(walk, kv_cluster=kv_cluster)


# The split last round pays where it saves at least this many key tiles of the round's time: a key tile of the round
# costs about 2 us, the split its pieces' kernel, first Q copies and steps, the parts' writes and the fold (about
# 18 us at 4x4k, where it saves 13: 0.995 of the kernel time, H100; results/2026-12-06_split-pieces-kernel). At 8x2k
# it would save 6.
SPLIT_TAIL_MIN_SAVED_TILES = 12


def split_tail_parts(works: int, ctas: int, kv_cluster: int, key_tiles: int) -> int:
    """The split last round of an unmasked persistent walk (``TileShape.split_tail``): 0 where ``works`` fill whole
    rounds of ``ctas`` (or the walk has one CTA a work), or where the split saves fewer than
    :data:`SPLIT_TAIL_MIN_SAVED_TILES` key tiles of that round; else the most parts one work of the round is cut into
    (``tail_split.max_parts``: the round's works in groups of ``kv_cluster``, their ``key_tiles`` each shared out over
    the clusters). A whole last round costs the SMs that have no work an idle work's time (about 2 % of a 2048-work
    walk on 132 SMs: ``results/2026-12-06_round-quantization``); split, it ends once every lane ran its share."""
    return tail_split.max_parts(works, ctas, kv_cluster, key_tiles, SPLIT_TAIL_MIN_SAVED_TILES)


# The chained walk (TileShape.chained_walk, cuda/fwd_hopper_chain.cuh) removes a work's boundary costs (first S
# alone, last P V alone, stores, Q wait), but its step is a little longer than the work-by-work loop's: it pays
# where works are short. Beyond this many keys the same tiles walk work by work (the same bits either way;
# notes/forward.md, decision log).
CHAINED_WALK_MAX_KEYS = 4096
# The chained walk with its split last round (TileShape.split_tail: the full rounds, then the pieces as a kernel of
# their own) serves keys in this range where the split pays (split_tail_parts), in place of the chain without it
# (its full rounds' SASS is that chain's) or, past CHAINED_WALK_MAX_KEYS, of the same tiles work by work.
SPLIT_CHAIN_KEYS = (1, 8192)


def split_chain_serves(seqlen_k: int, output_boxes: bool) -> bool:
    """Whether a launch with ``seqlen_k`` keys may take the chained walk with its split last round (where
    :func:`split_tail_parts` finds one that pays): output boxes and keys within :data:`SPLIT_CHAIN_KEYS`."""
    return output_boxes and SPLIT_CHAIN_KEYS[0] <= seqlen_k <= SPLIT_CHAIN_KEYS[1]


def chain_form(config, seqlen_k: int, output_boxes: bool, works: int, ctas: int):
    """A chained forward config's form for one launch (``forward.ForwardConfig``, returned replaced): the chain with
    its split last round where that serves and pays (:func:`split_chain_serves`, :func:`split_tail_parts`), the chain
    without it where the chain serves (:func:`chained_walk_serves`), else the same tiles work by work (the same bits as
    the chain without the split)."""
    key_tiles = -(-seqlen_k // config.block_n)
    if (config.split_tail and split_chain_serves(seqlen_k, output_boxes)
            and split_tail_parts(works, ctas, config.kv_cluster, key_tiles)):  # fmt: skip
        return config
    if chained_walk_serves(seqlen_k, output_boxes):
        return dataclasses.replace(config, split_tail=False)
    return dataclasses.replace(config, chained_walk=False, split_tail=False)


def chained_walk_serves(seqlen_k: int, output_boxes: bool) -> bool:
    """Whether a launch of a shape with ``chained_walk`` runs the chained walk: its works store by output boxes
    (batched, a group dividing 16: ``forward_maps.output_map``), each sees a key, and they see at most
    :data:`CHAINED_WALK_MAX_KEYS` keys."""
    return output_boxes and 0 < seqlen_k <= CHAINED_WALK_MAX_KEYS


def _unmasked_schedule(packed_rows: int, count: int, key_tiles: int, block_m: int, pairs: int,
                       sms: int) -> HopperSchedule:  # fmt: skip
    """A fixed-length unmasked walk over ``sms`` CTAs whose pairs' last query tile may leave warpgroups idle
    (:func:`hopper_forward_schedule`): the plain walk, or its works dealt out on the host where that pays."""
    busy = -(-(packed_rows - (count - 1) * block_m) // 64)  # the last tile's warpgroups with rows
    share = BUSY_WARPGROUPS_WORK_SHARE.get((busy, block_m // 64), 1.0)
    plain = HopperSchedule(sms)
    if share == 1.0:
        return plain
    full = key_tiles + WORK_TILE_OVERHEAD
    weights = (share * full,) + (full,) * (count - 1)  # m_rev order: the last tile first
    dealt = dealt_walk(weights, pairs, sms)
    if dealt.makespan < LISTED_WALK_GAIN * plain_makespan(weights, pairs, sms):
        return dataclasses.replace(plain, listed=dealt)
    return plain


def _masked_schedule(tile_key_tiles: tuple[int, ...], pairs: int, sms: int, pair_kv_bytes: int) -> HopperSchedule:
    weights = [n + WORK_TILE_OVERHEAD for n in reversed(tile_key_tiles)]  # a pair's tiles, heaviest (last) first
    count = len(weights)
    tiles = count * pairs
    if tiles <= sms:
        return HopperSchedule(tiles)  # one round: every tile its own CTA either way
    free = [0.0] * sms  # one CTA per tile: the next tile (pair-major) to the SM that frees first
    heapq.heapify(free)
    for _pair in range(pairs):
        for weight in weights:
            heapq.heappush(free, heapq.heappop(free) + weight)
    best, best_time, best_tail = HopperSchedule(tiles), max(free), None
    section = 1
    while section <= pairs and section * pair_kv_bytes <= SECTION_KV_BYTES:
        time, tail_rounds = snake_makespan(weights, pairs, section, sms), None
        listed_time, listed_tail = listed_makespan(tuple(weights), pairs, section, sms)
        if listed_time < LISTED_WALK_GAIN * time:
            time, tail_rounds = listed_time, listed_tail
        if time < PERSISTENT_WALK_GAIN * best_time:  # fewer pairs a section (K/V in flight) unless 2 % shorter
            best, best_time, best_tail = HopperSchedule(sms, section), time, tail_rounds
        section *= 2
    if best_tail is None:
        return best
    # its launch falls back to the snake itself while the table cannot be uploaded
    return dataclasses.replace(best, listed=listed_walk(tuple(weights), pairs, best.section, sms, best_tail))


def mma_tile_shape(head_dim: int) -> TileShape:
    """The mma.sync body's tile shape for ``head_dim`` (both dtypes, masked or not)."""
    if head_dim == 32:
        # Tiny rows: Q fits in 8 registers per thread, so 8 warps x 16 rows with wide 128-key tiles
        # amortise the per-tile softmax and barrier cost.
        return TileShape(block_m=128, block_n=128, num_warps=8, q_in_registers=True)
    if head_dim == 64:
        # flash-attn 2's shape: two m-tiles per warp (32 rows) halve the K/V shared-memory traffic
        # per FLOP, and 128-key tiles halve the per-tile softmax / barrier cost; 255 registers.
        return TileShape(block_m=128, block_n=128, num_warps=4)
    if head_dim == 96:
        # 8 warps x 16 rows, Q in registers (24 regs); the tile's 128 x 12 16-byte chunks divide over 256
        # threads (row-walking loads need chunks per row to divide the threads; 12 does not, see fwd_tile_io).
        return TileShape(block_m=128, block_n=64, num_warps=8, q_in_registers=True)
    if head_dim == 128:
        # flash-attn 2's Hopper shape: 32 rows per warp, 64-key tiles; S (64) + O (128) accumulators
        # leave no room for Q fragments, which are re-read from shared memory each k-step. 255
        # registers.
        return TileShape(block_m=128, block_n=64, num_warps=4)
    if head_dim == 256:
        # O alone is 128 registers per 16 rows: one m-tile per warp, Q re-read from shared memory,
        # 64-row query tiles so two K/V stages still fit (169 KB of shared memory).
        return TileShape(block_m=64, block_n=64, num_warps=4)
    raise ValueError(f"no forward tile shape for head_dim {head_dim}; supported: 32, 64, 96, 128, 256")


# ============================================================================================ padding

# Where no build takes a call's head dim (or its v's: value_head_dim.py), the call is zero-padded to the next head
# dim of this set, forward and backward alike. On Hopper 96 is left out: 80 and 96 run 1.4-2x faster padded to 128 on
# the wgmma bodies than at 96 on the mma.sync bodies (results/2026-12-05_83621b1_decode80-hopper-pad128).
HOPPER_SKIPPED_PADDING_HEAD_DIMS = (96,)


def padding_head_dims(built: tuple[int, ...], arch: str | None, deterministic: bool = False) -> tuple[int, ...]:
    """The head dims of ``built`` (a kernel family's, ascending) that a call is zero-padded to on ``arch`` (None: no
    GPU). A deterministic backward keeps 96: its one body (the per-warp ``default``) serves 128 no faster."""
    if arch == "sm_90a" and not deterministic:
        return tuple(d for d in built if d not in HOPPER_SKIPPED_PADDING_HEAD_DIMS)
    return built


# =========================================================================================== backward

BACKWARD_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # 192: the padded backward of 192/128 (value_head_dim.py)
# (q/k head dim, v head dim) pairs the Hopper backward body takes itself (cuda/bwd_hopper.cuh: 64 keys x (192 + 128)
# dK / dV columns per warpgroup in registers, each 64-query step in two sub-steps of 32). Without softcap and
# non-deterministic only: the softcap build spills (24 bytes), and the deterministic pair takes one head dim. Those,
# other pairs and other GPUs take the exact zero-padding route (value_head_dim.py: v padded to 192).
HOPPER_BACKWARD_VALUE_HEAD_DIMS = ((192, 128),)


def native_backward_value_head_dim(head_dim: int, head_dim_v: int, arch: str, softcap: bool = False,
                                   deterministic: bool = False) -> bool:  # fmt: skip
    """Whether a backward kernel takes q/k at ``head_dim`` and v at ``head_dim_v != head_dim`` itself."""
    return (arch == "sm_90a" and (head_dim, head_dim_v) in HOPPER_BACKWARD_VALUE_HEAD_DIMS and not softcap
            and not deterministic)  # fmt: skip


def backward_tiles(head_dim: int, softcap: bool, arch: str = "sm_90a", deterministic: bool = False,
                   head_dim_v: int | None = None) -> dict:  # fmt: skip
    """``BackwardConfig`` fields (besides head dim, dtype, softcap, arch) for a call (``head_dim_v``: v's head dim
    where it differs and :func:`native_backward_value_head_dim` holds). Registers are the
    limit: dK and dV accumulate in registers for the whole block, 2 * 16 * head_dim / 32 fp32 per
    thread per warp. ``bwd_dkdv``: ``num_warps`` warps in ``num_warps / d_split`` groups of 16 keys;
    ``bwd_dq`` (deterministic only): ``dq_warps * 16`` query rows, ``dq_block_n`` keys per step."""
    if head_dim_v is not None and head_dim_v != head_dim:
        if not native_backward_value_head_dim(head_dim, head_dim_v, arch, softcap, deterministic):
            raise ValueError(f"no backward kernel takes head dims {head_dim} / {head_dim_v} on {arch} (softcap "
                             f"{softcap}, deterministic {deterministic})")  # fmt: skip
        # The Hopper body: two warpgroups of 64 keys, 64-query steps (two sub-steps of 32), one dS^T buffer.
        return dict(block_m=64, body="wgmma", wgmma_block_m=64, head_dim_v=head_dim_v)
    if head_dim == 256:
        # 128 dK/dV registers per warp-row would not fit: two warps share 16 keys, each owning half
        # of D (S and dP are computed by both), and bwd_dq takes 64-row tiles to fit its smem.
        base = dict(block_m=32 if softcap else 64, d_split=2, dq_block_n=32, dq_warps=4)
    elif head_dim == 192:
        # As 256 (one warp spills 504 bytes), with 96 columns per warp: dQ in two 48-column chunks.
        base = dict(block_m=64, d_split=2, dq_block_n=32, dq_warps=4, dq_chunk=48)
    elif softcap and head_dim >= 128:
        # softcap keeps 1 - tanh^2 per score in registers: halve the query step to stay spill-free.
        base = dict(block_m=32)
    elif head_dim == 96:
        # two warps share a query row group's 96 dQ columns: 48 each, one pass (chunks must divide it)
        base = dict(block_m=64, dq_chunk=48)
    else:
        base = dict(block_m=64)
    if deterministic or head_dim not in (64, 128):
        # The per-warp 16-key body: the only one with the dQ-free dK/dV kernel + dQ kernel pair that makes
        # the result bit-identical run to run, and the only body for head dims 32, 96, 192 and 256.
        return dict(base, body="default")
    if arch == "sm_90a":
        # Hopper: every GEMM on warpgroup MMA, three Q/dO stages handed over by mbarriers; d64 takes
        # 128-query steps (half the per-step synchronisation per FLOP), d128 64 (registers).
        return dict(base, body="wgmma", wgmma_block_m=128 if head_dim == 64 else 64)
    # Other GPUs: FA2's 2-D warp tiling; d64 with 128-query steps (FA2's d64 tile, 182 KB of shared
    # memory), d128 with 64 (and k-loop unroll 1 with softcap: unroll 2 spills 8 bytes there).
    return dict(base, body="tiled", tiled_block_m=128 if head_dim == 64 else 64,
                tiled_unroll=1 if head_dim == 128 and softcap else 2)  # fmt: skip


# ============================================================================================= decode

MIN_KEYS_PER_SPLIT = 256  # each split gives the per-warp pipelines a few 16-key tiles
# A split grid asks for about this many waves, so the block scheduler can even out CTAs that finish at
# different times instead of the whole grid draining at once.
MIN_WAVES = 2


def ctas_per_sm(shared_bytes: int) -> int:
    """Resident CTAs per SM of a kernel with ``shared_bytes`` of dynamic shared memory: shared memory bound
    (228 KB/SM, 1 KB reserved per CTA), at most 4."""
    return max(1, min(4, (228 * 1024) // (shared_bytes + 1024)))


def choose_num_splits(ctas: int, typical_keys: int, sm_count: int, resident_per_sm: int, min_waves: int = 1) -> int:
    """Split-KV factor. Already a full wave of CTAs: 1 (splitting only adds the combine pass).
    Otherwise the smallest split whose wave efficiency (CTAs / slots of the last wave) is within 5%
    of the best reachable, with at least ``MIN_KEYS_PER_SPLIT`` keys per split so the per-warp
    pipelines have a few tiles each, and (``min_waves > 1``) at least 90% of ``min_waves`` waves."""
    slots = sm_count * resident_per_sm
    if ctas >= slots:
        return 1
    max_splits = max(1, min(64, typical_keys // MIN_KEYS_PER_SPLIT))

    def efficiency(s: int) -> float:
        n = ctas * s
        return n / (math.ceil(n / slots) * slots)

    best = max(efficiency(s) for s in range(1, max_splits + 1))
    enough_waves = (lambda s: ctas * s >= 0.9 * min_waves * slots) if min_waves > 1 else (lambda s: True)
    fitting = [s for s in range(1, max_splits + 1) if efficiency(s) >= 0.95 * best and enough_waves(s)]
    return fitting[0] if fitting else max_splits


# ============================================================================ configs of whole problems


def forward_config(head_dim: int, dtype: str, has_mask: bool, arch: str, head_dim_v: int | None = None,
                   one_cta_per_tile: bool = False):  # fmt: skip
    """The ``ForwardConfig`` the forward launches for a problem (``dtype``: "bf16" / "fp16"; ``one_cta_per_tile``:
    the Hopper walk's, see :func:`forward_tile_shape`)."""
    from .forward import ForwardConfig

    shape = forward_tile_shape(head_dim, arch, has_mask, head_dim_v, one_cta_per_tile)
    return ForwardConfig.for_problem(head_dim, dtype, has_mask, shape, arch=arch, head_dim_v=head_dim_v)


def backward_config(head_dim: int, dtype, softcap: bool, arch: str, deterministic: bool = False,
                    head_dim_v: int | None = None):  # fmt: skip
    """The ``BackwardConfig`` the backward launches for a problem (``dtype``: a torch dtype; ``head_dim_v``: v's,
    where it differs and a kernel takes the pair)."""
    from .backward import BackwardConfig

    return BackwardConfig.choose(head_dim, dtype, softcap, arch, deterministic, head_dim_v=head_dim_v)


def decode_config(head_dim: int, bf16: bool, addressing: str, softcap: bool, head_dim_v: int | None = None):
    """The ``DecodeConfig`` the decode launches for a problem (``head_dim_v``: v's, where it differs)."""
    from .decode_config import DecodeConfig

    return DecodeConfig(head_dim, bf16, addressing, softcap, head_dim_v=head_dim_v)
