"""The score-scale/softcap multipliers each launcher passes its kernel, and the Hopper forward's grid (CPU only:
builds and launches are faked).

The expected values are the launchers' own formulas as they were before score scaling was folded once in
:func:`hf_flashpatch.kernels.fold_scores` (and before every kernel took the one ``ScoreScale`` of
``cuda/score_scale.cuh``): what a kernel multiplies by, worked out from the three values it is passed as
``ScoreScale`` does it, must be the same floats, bit for bit."""

from __future__ import annotations

import dataclasses
import math
import struct

import pytest
import torch

from hf_flashpatch.kernels import backward, decode, forward, tma
from launch_recorder import RecordingKernel

LOG2E = 1.4426950408889634
SCALES = [None, 0.0, 1e-30, 0.125, 1.0 / math.sqrt(64), 0.3, 1.0, 7.5]
SOFTCAPS = [None, 0.0, -0.0, 1e-3, 5.0, 30.0, 50.0]
HEAD_DIM = 64


def bits(values):
    return [struct.pack("<d", float(v)) for v in values]


def old_forward(scale, softcap):
    if scale == 0:
        scale, softcap = 1e-30, 0.0
    if softcap and softcap > 0:
        return softcap * LOG2E, scale / softcap
    return scale * LOG2E, 0.0


def old_decode(scale, softcap):
    if softcap:
        return scale / softcap, softcap * LOG2E
    return scale * LOG2E, 0.0


def old_backward(scale, softcap):
    return scale, scale * LOG2E, scale / softcap if softcap else 0.0, softcap * LOG2E


class _Recorder:
    """Every launch as (entry, args), checked against the kernel's parameter list (tests/launch_recorder.py)."""

    def __init__(self):
        self.launches = []

    @property
    def calls(self):
        return [(entry, args) for entry, _grid, args in self.launches]

    def get_kernel(self, build, entry, device):
        return RecordingKernel(entry, self.launches)


def _default(scale):
    return scale if scale is not None else 1.0 / math.sqrt(HEAD_DIM)


@pytest.fixture
def recorder(monkeypatch):
    rec = _Recorder()
    for mod in (forward, backward, decode):
        monkeypatch.setattr(mod, "get_kernel", rec.get_kernel)
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "_check_supported", lambda q, k, v: None)
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: bytes(128))  # the Hopper body's maps (no driver)
    monkeypatch.setattr(backward.tma, "reduce_descriptor", lambda t: bytes(128))  # and the backward's maps
    monkeypatch.setattr(backward.tma, "stats_descriptor", lambda t, rows: bytes(128))
    monkeypatch.setattr(forward.ForwardConfig, "build", lambda self, arch="sm_90a": None)
    monkeypatch.setattr(decode.DecodeConfig, "build", lambda self, arch="sm_90a": None)
    monkeypatch.setattr(backward.BackwardConfig, "build", lambda self: None)
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    monkeypatch.setattr(backward, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "choose_num_splits", lambda *a, **k: 1)
    decode.decode_plan.cache_clear()  # plans hold the kernels they were made with
    yield rec
    decode.decode_plan.cache_clear()


def _qkv(seqlen=4):
    return [torch.zeros(1, seqlen, 2, HEAD_DIM, dtype=torch.float16) for _ in range(3)]


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("scale", SCALES)
def test_forward_scalars(recorder, scale, softcap):
    q, k, v = _qkv()
    forward._launch(q, k, v, None, None, None, None, scale, False, -1, -1, softcap)
    ((entry, args),) = recorder.calls
    # ..., left, right, ScoreScale (scale_log2, softcap_pre, softcap_log2), total q / k rows, kv heads, sequences,
    # work section, q_box_heads, o_box_heads, leading_rows, then the split round's tail_parts, partials, part_counters
    # and the listed walk's work_list
    scale_log2, softcap_pre, softcap_log2 = args[-15:-12]
    exp2_mul = softcap_log2 if softcap_pre != 0 else scale_log2  # ScoreScale::exp2_mul
    assert bits((exp2_mul, softcap_pre)) == bits(old_forward(_default(scale), softcap))


@pytest.mark.parametrize("softcap", SOFTCAPS)
@pytest.mark.parametrize("scale", SCALES)
def test_decode_scalars(recorder, scale, softcap):
    q, k, v = _qkv(1)
    out, lse = torch.empty_like(q), torch.empty(1, 1, 2)
    decode._launch(
        addressing="contiguous", q=q, q_strides=q.stride()[:3], cu_q=None, seqlen_q=1, total_q=1, k=k, v=v,
        k_strides=k.stride()[:3], v_strides=v.stride()[:3], seqlens=None, default_seqlen=1, index=None,
        index_stride=0, page_size=0, cu_k=None, out=out, out_strides=out.stride()[:3], lse=lse,
        lse_strides=lse.stride(), batch=1, heads=2, kv_heads=2, typical_keys=1, softmax_scale=scale,
        softcap=softcap, window_left=-1, window_right=-1,
    )  # fmt: skip
    ((entry, args),) = recorder.calls
    assert entry == "hfp_decode_split"
    # ..., ScoreScale (scale_log2, softcap_pre, softcap_log2), window_left, window_right
    scale_log2, softcap_pre, softcap_log2 = args[-5:-2]
    assert tuple(args[-5:-2]) == tuple(decode._scales(HEAD_DIM, scale, softcap))
    score_mul = softcap_pre if softcap else scale_log2  # ScoreScale::logit2 in the build the launcher chose
    assert bits((score_mul, softcap_log2)) == bits(old_decode(_default(scale), softcap))


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("softcap", [0.0, 1e-3, 5.0, 30.0, 50.0])  # the op passes float(softcap or 0.0)
@pytest.mark.parametrize("scale", [s for s in SCALES if s is not None])  # the op passes a float scale
def test_backward_scalars(recorder, scale, softcap, deterministic):
    q, k, v = _qkv()
    out, dout = torch.zeros_like(q), torch.zeros_like(q)
    lse = torch.zeros(1, 2, 4)
    cfg = backward.BackwardConfig.choose(HEAD_DIM, q.dtype, bool(softcap), "sm_90a", deterministic)
    backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 4, 4, scale, -1, -1, softcap,
                              deterministic)  # fmt: skip
    main = [args for entry, args in recorder.calls if entry in ("bwd_dkdv", "bwd_dkdv_dq_atomic", "bwd_dq")]
    assert main
    for args in main:
        tail = 1 if args is main[0] else 0  # dK/dV takes heavy_first after the 13 scalars
        scalars = args[len(args) - 13 - tail : len(args) - tail]
        assert bits(scalars[5:9]) == bits(old_backward(scale, softcap))


@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_preprocess_gets_the_dq_workspace(recorder, deterministic):
    """bwd_preprocess zeroes the fp32 dQ workspace (no separate memset): it is handed the very tensor the dK/dV
    kernel adds dQ into and bwd_convert_dq reads, a (batch, heads, rows_pad, head_dim) fp32 tensor; the
    deterministic pair has no workspace and the preprocess gets none."""
    q, k, v = _qkv()
    out, dout, lse = torch.zeros_like(q), torch.zeros_like(q), torch.zeros(1, 2, 4)
    cfg = backward.BackwardConfig.choose(HEAD_DIM, q.dtype, False, "sm_90a", deterministic)
    backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 4, 4, 0.125, -1, -1, 0.0,
                              deterministic)  # fmt: skip
    calls = dict(recorder.calls)
    workspace = calls["bwd_preprocess"][6]  # after out, dout, lse, dlse, lse2, D
    if deterministic:
        assert workspace is None
        return
    assert workspace.dtype == torch.float32 and workspace.shape[0] == q.shape[0] and workspace.shape[1] == q.shape[2]
    assert workspace.shape[3] == HEAD_DIM and workspace.shape[2] >= q.shape[1] and workspace.shape[2] % 32 == 0
    assert calls["bwd_dkdv_dq_atomic"][4 + 6] is workspace  # after the four maps: q, k, v, dout, lse2, D
    assert calls["bwd_convert_dq"][0] is workspace
    # one allocation holds the row statistics and, after them, the workspace (16-byte aligned for its TMA map)
    lse2, dvec = calls["bwd_preprocess"][4:6]
    storages = {t.untyped_storage().data_ptr() for t in (workspace, lse2, dvec)}
    assert len(storages) == 1
    assert workspace.data_ptr() >= dvec.data_ptr() + dvec.numel() * 4 and workspace.data_ptr() % 16 == 0
    assert workspace.is_contiguous() and lse2.is_contiguous()


@pytest.mark.parametrize("causal, varlen, ctas, section", [(False, False, 132, 0), (True, False, 132, 0),
                                                           (False, True, 176, 0), (True, True, 176, 0)])  # fmt: skip
def test_hopper_forward_grid(recorder, causal, varlen, ctas, section):
    """One CTA per SM where every work tile weighs the same (unmasked, fixed length) and, causal at fixed length,
    where the schedule model deals the tiles out evenly (here d64's 22 tiles per pair, a pair a section, its last
    rounds dealt out again by the host's list: work section 0, the list's indices being pair-major); one CTA per work
    tile for varlen. d64 on Hopper: 192-row tiles, so 4096 rows x 4 heads are 22 x 4
    work tiles per sequence, 16 pairs."""
    if varlen:
        q, k, v = (torch.zeros(8192, 4, HEAD_DIM, dtype=torch.float16) for _ in range(3))  # (T, H, D), two sequences
        cu = torch.tensor([0, 4096, 8192], dtype=torch.int32)
        forward._launch(q, k, v, cu, cu, 4096, 4096, None, causal, -1, -1, None)
    else:
        q, k, v = (torch.zeros(4, 4096, 4, HEAD_DIM, dtype=torch.float16) for _ in range(3))  # (B, S, H, D)
        forward._launch(q, k, v, None, None, None, None, None, causal, -1, -1, None)
    ((_entry, grid, args),) = recorder.launches
    work_list = args[-1]  # FwdParams' last: the listed walk's table (work_list.py), None for every other walk
    if causal and not varlen:
        assert work_list.dtype == torch.int32 and work_list.numel() == ctas + 1 + 22 * 16
        assert sorted(work_list[ctas + 1 :].tolist()) == list(range(22 * 16))  # every work once
    else:
        assert work_list is None
    args = args[:-4]  # the split round's (tail_parts, partials, part_counters) and the work list
    assert grid == (ctas, 1, 1) and args[-4] == section  # FwdParams.work_section (q_box_heads, o_box_heads follow)
    # FwdParams.leading_rows: a causal batched walk's first tile leads its sequence by the last tile's shortfall (4096
    # rows on 192-row tiles: 22 tiles, the last of 64 rows, so the first starts 128 rows early); none unmasked or varlen
    assert args[-1] == (128 if causal and not varlen else 0)


def test_clustered_schedule_decisions():
    """The K/V multicast's clusters (heuristics.clustered_schedule) only where the CTAs of a cluster take one pair's
    works with the same key tiles in every round, and where the GPU holds the whole grid as clusters at once; the
    co-residency is asked last (it loads the clustered build)."""
    from hf_flashpatch.kernels.heuristics import HopperSchedule, clustered_schedule

    asked = []

    def resident(count):
        return lambda: asked.append(count) or count

    walk = HopperSchedule(132)
    assert clustered_schedule(walk, 2, 16, False, False, resident(66)) == HopperSchedule(132, kv_cluster=2)
    assert clustered_schedule(HopperSchedule(64), 2, 16, False, False, resident(66)).kv_cluster == 2  # one round
    assert asked == [66, 66]
    assert clustered_schedule(walk, 2, 15, False, False, resident(66)) == walk  # odd query tiles: pairs would split
    assert clustered_schedule(walk, 2, 16, True, False, resident(66)) == walk  # masked: key tiles differ per work
    assert clustered_schedule(walk, 2, 16, False, True, resident(66)) == walk  # varlen: the same
    assert clustered_schedule(HopperSchedule(131), 2, 16, False, False, resident(66)) == HopperSchedule(131)  # odd grid
    assert clustered_schedule(walk, 1, 16, False, False, resident(66)) == walk  # a shape without the multicast
    assert asked == [66, 66]  # none of those asked the driver
    assert clustered_schedule(walk, 2, 16, False, False, resident(65)) == walk  # 130 CTAs at once: a second wave
    assert clustered_schedule(walk, 2, 16, False, False, resident(0)) == walk  # the driver could not tell
    # a walk handed in with clusters of its own is decided afresh: plain where the pairs would split
    assert clustered_schedule(HopperSchedule(132, kv_cluster=2), 2, 15, False, False, resident(66)) == walk


def test_leading_rows_move_the_short_tile_first():
    """heuristics.leading_rows (FwdParams.leading_rows): a masked walk's first tile of a sequence starts before it by
    the last tile's shortfall in whole 64-row warpgroups, so the tile count stays and only the first tile lacks a
    warpgroup's rows; the schedule model weighs the led tiles (the first sees the fewest keys)."""
    from hf_flashpatch.kernels import heuristics

    assert heuristics.leading_rows(2048, 192) == 64  # 10 2/3 tiles: the last had 128 rows
    assert heuristics.leading_rows(4096, 192) == 128  # the last had 64 rows
    assert heuristics.leading_rows(2048, 128) == 0 and heuristics.leading_rows(1, 128) == 64
    for block_m in (128, 192):
        for packed in range(1, 1000):
            lead = heuristics.leading_rows(packed, block_m)
            assert lead % 64 == 0 and 0 <= lead < block_m
            assert -(-(packed + lead) // block_m) == -(-packed // block_m)  # the same tiles
            assert (-(packed + lead)) % block_m < 64  # the last tile short of less than a warpgroup


def test_a_listed_walk_is_refused_for_the_chained_walk(recorder):
    """The chained walk's math warps walk rounds (chain_work) while its producer would follow a list: a schedule with
    one is refused before any launch, and the same schedule without it launches."""
    from hf_flashpatch.kernels import work_list
    from hf_flashpatch.kernels.heuristics import HopperSchedule

    q, k, v = (torch.zeros(8, 2048, 16, 128, dtype=torch.float16) for _ in range(3))  # (B, S, H, D): 2048 works
    walk = work_list.dealt_walk((1.0,) * 16, 128, 132)
    with pytest.raises(RuntimeError, match="listed walk chosen for a chained build"):
        forward._launch(q, k, v, None, None, None, None, None, False, -1, -1, None,
                        schedule=HopperSchedule(132, listed=walk))  # fmt: skip
    assert recorder.launches == []
    forward._launch(q, k, v, None, None, None, None, None, False, -1, -1, None, schedule=HopperSchedule(132))
    ((_entry, grid, args),) = recorder.launches
    assert grid == (132, 1, 1) and args[-1] is None


def test_hopper_forward_schedule_decisions():
    """The decision room's choices for the Hopper forward's grid, from its schedule model: persistent and balanced
    where the model finds a walk 2 % under one CTA per tile, K/V of a section within the L2 budget."""
    from hf_flashpatch.kernels import heuristics, work_list

    def schedule(seqlen, block_m, pairs, left=-1, right=0, varlen=False, kv_bytes=1 << 20):
        return heuristics.hopper_forward_schedule(seqlen, seqlen, 1, block_m, 128, left, right, pairs, 132, varlen,
                                                  kv_bytes)  # fmt: skip

    assert schedule(2048, 128, 128, right=-1) == heuristics.HopperSchedule(132)  # unmasked: persistent, pair-major
    # unmasked d64 2k, 32 heads x 8 sequences: a pair's last tile has 128 of 192 rows. Where the build leaves a
    # warpgroup without rows idle, the works are dealt out (short tiles to the CTAs with a work more) within a short
    # tile of the ideal, 2 % under the plain walk; 2 x 8k (43 tiles a pair, 2752 works) gains nothing from it
    d64 = heuristics.hopper_forward_schedule(2048, 2048, 1, 192, 128, -1, -1, 256, 132, False, 1 << 20, True)
    assert (d64.ctas, d64.section) == (132, 0) and d64.listed.ctas == 132
    short = heuristics.BUSY_WARPGROUPS_WORK_SHARE[(2, 3)] * (16 + heuristics.WORK_TILE_OVERHEAD)
    weights = (short,) + (16 + heuristics.WORK_TILE_OVERHEAD,) * 10
    ideal = sum(weights) * 256 / 132
    assert d64.listed.makespan < min(ideal + short, 0.98 * work_list.plain_makespan(weights, 256, 132))
    assert heuristics.hopper_forward_schedule(2048, 2048, 1, 192, 128, -1, -1, 256, 132, False, 1 << 20,
                                              False) == heuristics.HopperSchedule(132)  # fmt: skip
    assert heuristics.hopper_forward_schedule(8192, 8192, 1, 192, 128, -1, -1, 64, 132, False, 1 << 20,
                                              True) == heuristics.HopperSchedule(132)  # fmt: skip
    assert schedule(2048, 128, 4, right=-1) == heuristics.HopperSchedule(64)  # fewer tiles than SMs
    assert schedule(2048, 128, 128, varlen=True) == heuristics.HopperSchedule(16 * 128)  # varlen: one CTA per tile
    assert schedule(512, 128, 8) == heuristics.HopperSchedule(32)  # one round: one CTA per tile
    listed = schedule(2048, 128, 128)  # d128 2k causal: the snake over pairs, its last rounds dealt out again
    assert (listed.ctas, listed.section, listed.listed.ctas) == (132, 1, 132)
    weights = [m + 1 + heuristics.WORK_TILE_OVERHEAD for m in reversed(range(16))]  # 16 tiles a pair: m + 1 key tiles
    assert listed.listed.makespan < 1.01 * sum(weights) * 128 / 132
    # d64 4k causal, 22 tiles a pair: the snake of 16 pairs a section ends 2.9 % past the ideal, of one pair 11 %;
    # their listed forms both within 1.2 %, so the walk keeps the fewest pairs' K/V in flight
    d64 = schedule(4096, 192, 64)
    assert (d64.ctas, d64.section, d64.listed is not None) == (132, 1, True)
    assert schedule(16384, 128, 16) == heuristics.HopperSchedule(128 * 16)  # no walk beats the hardware's order
    assert schedule(2048, 128, 512) == heuristics.HopperSchedule(16 * 512)  # past MODELLED_MAX_TILES: not modelled
    # 4 MB of K/V a pair: no section of 16 pairs (64 MB); a snake of up to 8 ends 11 % past the ideal, behind one CTA
    # per tile, but its listed form within 1 %
    assert schedule(4096, 192, 64, kv_bytes=4 << 20) == schedule(4096, 192, 64, kv_bytes=1 << 20)
    assert schedule(4096, 192, 64, kv_bytes=64 << 20).ctas == 22 * 64  # not even one pair's K/V in the budget
    assert schedule(2048, 128, 128).one_cta_per_tile(16 * 128) is False
    assert schedule(16384, 128, 16).one_cta_per_tile(128 * 16) and schedule(512, 128, 8).one_cta_per_tile(32)
    # the model: the snake deals 2k causal tiles (section 1: pair-major) out within 3.2 % of the ideal makespan
    ideal = sum(weights) * 128 / 132
    assert work_list.snake_makespan(weights, 128, 1, 132) / ideal < 1.032


@pytest.mark.parametrize("window", [(-1, 0), (300, 0), (200, 37), (0, 0), (5, -1)], ids=str)
@pytest.mark.parametrize("lengths", [(1050, 1050), (113, 1023), (1023, 239), (1, 1), (2048, 2048)], ids=str)
@pytest.mark.parametrize("group, block_m, block_n", [(1, 128, 128), (4, 128, 160), (3, 192, 128), (8, 128, 64)])
def test_query_tile_key_tiles_are_the_tiles_its_rows_see(window, lengths, group, block_m, block_n):
    """The schedule model's key tiles per query tile (the host's copy of the kernel's visible_key_tiles) are exactly
    the key tiles holding a key that one of the tile's rows sees, by the oracle's visibility mask, with the masked
    walk's leading rows: the model weighs what the kernel computes."""
    from hf_flashpatch.kernels import heuristics
    from hf_flashpatch.reference.masks import visibility_mask

    (left, right), (seqlen_q, seqlen_k) = window, lengths
    got = heuristics.query_tile_key_tiles(seqlen_q, seqlen_k, group, block_m, block_n, left, right)
    visible = visibility_mask(seqlen_q, seqlen_k, left, right)  # (S_q, S_k)
    lead = heuristics.leading_rows(seqlen_q * group, block_m)
    want = []
    for m in range(len(got)):
        rows = range(max(0, m * block_m - lead), min(seqlen_q * group, (m + 1) * block_m - lead))  # packed rows
        positions = sorted({row // group for row in rows})
        keys = visible[positions].any(dim=0).nonzero().flatten()  # keys any of the tile's rows sees
        want.append(len({int(key) // block_n for key in keys}))
    assert len(got) == -(-seqlen_q * group // block_m)
    assert got == tuple(want)


@pytest.mark.parametrize("head_dim, masked", [(128, True), (128, False), (64, True), (64, False)])
def test_hopper_forward_shape_follows_the_walk(head_dim, masked):
    """Q by the TMA serves a walk of several works per CTA; with one CTA per work tile the two-math-warpgroup shape
    (masked d128, whose Q thread costs the math threads registers) has its math warps copy Q and its output leave
    through the Q rows (not by output boxes staged in a K slot), every other field unchanged, and both builds are
    shipped. d64 (three math warpgroups) and unmasked d128 keep one shape."""
    from hf_flashpatch.kernels import forward, heuristics

    walking = heuristics.forward_tile_shape(head_dim, "sm_90a", masked)
    one_each = heuristics.forward_tile_shape(head_dim, "sm_90a", masked, one_cta_per_tile=True)
    if (head_dim, masked) == (128, True):
        assert walking.q_by_tma and not one_each.q_by_tma
        assert one_each.staged_output and not walking.staged_output
        assert walking.tma_output and not one_each.tma_output
        assert dataclasses.replace(one_each, q_by_tma=True, staged_output=False, tma_output=True) == walking
    else:
        assert one_each == walking
    builds = forward.all_builds("sm_90a")
    for shape in (walking, one_each):
        config = forward.ForwardConfig.for_problem(head_dim, "bf16", masked, shape, arch="sm_90a")
        assert config.build("sm_90a") in builds



@pytest.mark.parametrize("sms, walks", [(16, True), (132, False)])
def test_masked_d128_launch_takes_the_q_thread_only_on_a_walk(recorder, monkeypatch, sms, walks):
    """Causal d128, 8 (sequence, head) pairs of 8 query tiles: on 16 SMs the schedule walks (16 CTAs, sectioned),
    and the launch takes the Q-thread build (its box heads > 0); on 132 SMs every tile gets a
    CTA and the math warps copy Q (box heads 0)."""
    monkeypatch.setattr(forward, "sm_count", lambda device: sms)
    built = []
    monkeypatch.setattr(forward.ForwardConfig, "build", lambda self, arch="sm_90a": built.append(self))
    q, k, v = (torch.zeros(2, 1024, 4, 128, dtype=torch.float16) for _ in range(3))  # (B, S, H, D)
    forward._launch(q, k, v, None, None, None, None, None, True, -1, -1, None)
    ((_entry, grid, args),) = recorder.launches
    assert (grid[0] < 64) == walks
    assert built[0].q_by_tma == walks and (args[-7] > 0) == walks  # FwdParams.q_box_heads (6 fields follow)
