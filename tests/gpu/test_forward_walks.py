"""The Hopper forward body's walks and their build choices on a real GPU, each against the plain form it replaces:
persistent masked walks against one CTA per tile, leading rows against varlen, Q by the TMA against the math warps'
copy, K/V multicast clusters against the plain walk, output boxes against the threads' stores. Each pair must give the
same bits and match the fp32 oracle. (The chained walk's: ``test_forward_chained_walk.py``.)

Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)`` (varlen: ``(T, H, D)``).
"""

import dataclasses
import math

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

from hf_flashpatch.kernels import forward as forward_module  # noqa: E402
from hf_flashpatch.kernels import tma  # noqa: E402
from hf_flashpatch.kernels.build import device_arch  # noqa: E402
from hf_flashpatch.kernels.heuristics import forward_tile_shape  # noqa: E402
from hf_flashpatch.reference import attention_reference  # noqa: E402

from .forward_checks import check_against_oracle, run_forward  # noqa: E402


def _hand_made_walks(tiles):
    """Work tables (work_list.ListedWalk) of no model over ``tiles`` works: CTAs without works and one with most,
    the works in reverse or odd ones first."""
    from hf_flashpatch.kernels.work_list import ListedWalk

    works, walks = list(range(tiles)), []
    for ctas, cut in [(5, (0, 0, tiles - 3, tiles - 1, tiles)), (3, (tiles, tiles, tiles))]:
        order = works[::-1] if ctas == 5 else works[1::2] + works[::2]
        walks.append(ListedWalk(ctas, 0.0, 0, (0, *cut) + tuple(order)))
    return walks


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("window", [(-1, 0), (300, 0), (200, 37)], ids=["causal", "window300", "window200-37"])
def test_persistent_masked_walks_match_one_cta_per_tile(dims, window):
    """The persistent masked walk (sectioned work order, odd rounds reversed: heuristics.hopper_forward_schedule)
    against one CTA per work tile: every grid size and section (the last one partial, the last round partial) gives
    the same bits, and the one-CTA-per-tile run matches the oracle. GQA, 1050 positions: hundreds of work tiles."""
    from hf_flashpatch.kernels.heuristics import HopperSchedule, forward_tile_shape, query_tile_key_tiles
    from hf_flashpatch.kernels.work_list import listed_walk

    if not forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True,
                                                              dims[1]).wgmma:  # fmt: skip
        pytest.skip("the walk is the Hopper body's")
    torch.manual_seed(7)
    (d, d_v), (left, right) = dims, window
    q = torch.randn(3, 1050, 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(3, 1050, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(3, 1050, 2, d_v, device="cuda", dtype=torch.bfloat16)
    shape = forward_tile_shape(d, "sm_90a", True, d_v)
    tiles = math.ceil(1050 * 4 / shape.block_m) * 2 * 3
    launch = lambda schedule: forward_module._launch(q, k, v, None, None, None, None, None, False, left, right, None,
                                                     schedule=schedule)  # noqa: E731 fmt: skip
    ref_out, ref_lse = launch(HopperSchedule(tiles))
    want, want_lse = attention_reference(q.float(), k.float(), v.float(), window=window)
    assert (ref_out.float() - want).abs().max().item() < 2e-2
    torch.testing.assert_close(ref_lse, want_lse, atol=1e-3, rtol=1e-3)
    for ctas, section in [(132, 1), (132, 2), (100, 4), (77, 5), (tiles // 2 + 1, 3), (131, 6)]:
        out, lse = launch(HopperSchedule(ctas, section))
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), (ctas, section)
    # Listed walks (work_list.ListedWalk): the model's for a few grids and sections, and hand-made tables in which
    # some CTAs have no work and one has most, in orders of no model.
    weights = tuple(float(n + 1) for n in reversed(query_tile_key_tiles(1050, 1050, 4, shape.block_m, shape.block_n,
                                                                        left, right)))  # fmt: skip
    listed = [listed_walk(weights, 6, section, ctas) for ctas, section in ((132, 1), (77, 2), (7, 6))]
    for walk in listed + _hand_made_walks(tiles):
        out, lse = launch(HopperSchedule(walk.ctas, 1, listed=walk))
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), walk.table[: walk.ctas + 1]


def test_a_masked_d128_walk_whose_group_takes_no_query_boxes():
    """A group of 3 does not divide 64, so the masked d128 walk's math warps copy Q and store by threads; its Q thread
    still walks the list, to hand each work's tile to the math warps (fwd_tile_handoff.cuh). Persistent and listed
    walks, CTAs without works and one with most among them, give the bits of one CTA per tile and match the oracle."""
    from hf_flashpatch.kernels.heuristics import HopperSchedule, forward_tile_shape

    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), True)
    if not (shape.wgmma and shape.q_by_tma and shape.tma_output):
        pytest.skip("the masked d128 walk's handed tiles are the Hopper body's")
    torch.manual_seed(11)
    q = torch.randn(2, 1100, 6, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1100, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 1100, 2, 128, device="cuda", dtype=torch.bfloat16)
    tiles = math.ceil(1100 * 3 / shape.block_m) * 2 * 2
    launch = lambda schedule: forward_module._launch(q, k, v, None, None, None, None, None, True, -1, -1, None,
                                                     schedule=schedule)  # noqa: E731 fmt: skip
    ref_out, ref_lse = launch(HopperSchedule(tiles))
    check_against_oracle(ref_out, ref_lse, q, k, v, causal=True)
    for schedule in [HopperSchedule(7, 2), HopperSchedule(tiles // 2 + 1, 1)] + [
        HopperSchedule(walk.ctas, 1, listed=walk) for walk in _hand_made_walks(tiles)
    ]:
        out, lse = launch(schedule)
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), schedule


def test_listed_walk_under_cuda_graph_capture():
    """A listed walk whose table is not on the GPU yet when a CUDA graph captures the launch takes the snake walk
    (work_list.on_device: no host-to-device copy while capturing); once uploaded, a capture takes the list. Both
    replays give the eager launch's bits."""
    from hf_flashpatch.kernels import work_list
    from hf_flashpatch.kernels.heuristics import HopperSchedule, query_tile_key_tiles

    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), True)
    if not shape.wgmma:
        pytest.skip("the walk is the Hopper body's")
    torch.manual_seed(5)
    q = torch.randn(2, 1500, 8, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 1500, 8, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 1500, 8, 128, device="cuda", dtype=torch.bfloat16)
    weights = tuple(float(n + 1) for n in reversed(query_tile_key_tiles(1500, 1500, 1, shape.block_m, shape.block_n,
                                                                        -1, 0)))  # fmt: skip
    walk = work_list.listed_walk(weights, 16, 1, 40)
    schedule = HopperSchedule(40, 1, listed=walk)
    launch = lambda: forward_module._launch(q, k, v, None, None, None, None, None, True, -1, -1, None,
                                            schedule=schedule)  # noqa: E731 fmt: skip
    want_out, want_lse = forward_module._launch(q, k, v, None, None, None, None, None, True, -1, -1, None,
                                                schedule=HopperSchedule(16 * 12))  # one CTA per tile fmt: skip
    for uploaded in (False, True):
        assert ((id(walk.table), q.device.index) in work_list._UPLOADED) == uploaded
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: the kernel's build, outside the capture, by the snake walk
            forward_module._launch(q, k, v, None, None, None, None, None, True, -1, -1, None,
                                   schedule=HopperSchedule(40, 1))  # fmt: skip
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out, lse = launch()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), uploaded
        if not uploaded:
            launch()  # eager: uploads the table
            assert (id(walk.table), q.device.index) in work_list._UPLOADED


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("varlen", [False, True], ids=["batched", "varlen"])
def test_unmasked_listed_walks_match_one_cta_per_tile(dims, varlen):
    """An unmasked persistent walk dealt out on the host (work_list.dealt_walk, the decision room's where a pair's last
    tile leaves warpgroups idle; hand-made tables too: CTAs without works, one with most, orders of no model) against
    one CTA per work tile: the same bits, and the oracle. GQA 8/2, 1030 positions: a pair's last tile has 88 rows on
    d64's 192-row tiles (two of three warpgroups busy), 24 on 128-row ones (one of two). The batched d128 problem takes
    the chained walk, which has no list (forward._launch refuses one), so d128 runs varlen only: work by work."""
    from hf_flashpatch.kernels.heuristics import HopperSchedule
    from hf_flashpatch.kernels.work_list import dealt_walk

    (d, d_v) = dims
    shape = forward_tile_shape(d, device_arch(torch.device("cuda")), False, d_v)
    if not shape.wgmma:
        pytest.skip("the walk is the Hopper body's")
    if shape.chained_walk and not varlen:
        pytest.skip("batched, unmasked d128 takes the chained walk")
    torch.manual_seed(17)
    batch, seqlen = 3, 1030
    q = torch.randn(batch, seqlen, 8, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, 2, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, 2, d_v, device="cuda", dtype=torch.bfloat16)
    if varlen:  # (T, H, D), the batch's sequences packed
        cu = torch.arange(0, (batch + 1) * seqlen, seqlen, device="cuda", dtype=torch.int32)
        args = (q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, seqlen, seqlen)
    else:
        args = (q, k, v, None, None, None, None)
    count = math.ceil(seqlen * 4 / shape.block_m)
    tiles = count * 2 * batch
    launch = lambda schedule: forward_module._launch(*args, None, False, -1, -1, None,
                                                     schedule=schedule)  # noqa: E731 fmt: skip
    ref_out, ref_lse = launch(HopperSchedule(tiles))
    want, want_lse = attention_reference(q.float(), k.float(), v.float())
    assert (ref_out.reshape(want.shape).float() - want).abs().max().item() < 2e-2
    lse_rows = ref_lse.reshape(8, batch, seqlen).transpose(0, 1) if varlen else ref_lse  # (B, H, S_q)
    torch.testing.assert_close(lse_rows, want_lse, atol=1e-3, rtol=1e-3)
    weights = (3.0,) + (5.0,) * (count - 1)  # the last tile (m_rev 0) lighter
    walks = [dealt_walk(weights, 2 * batch, ctas) for ctas in (132, 40, 7)]
    for walk in walks + _hand_made_walks(tiles):
        out, lse = launch(HopperSchedule(walk.ctas, 0, listed=walk))
        assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse), walk.table[: walk.ctas + 1]
    out, lse = launch(HopperSchedule(40))  # and the plain walk of fewer CTAs than works
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (6, 2)], ids=["g1", "g4", "g3"])
@pytest.mark.parametrize("window", [(-1, 0), (200, 37)], ids=["causal", "window200-37"])
def test_leading_rows_change_no_bit(dims, heads, window):
    """A masked batched walk starts a sequence's first query tile heuristics.leading_rows before it (the rows before
    the sequence computed by no warpgroup, or discarded); a varlen batch starts each sequence's tiles at its first
    row. Lengths whose last tile is short by none, one or two 64-row warpgroups: every batch row equals its sequence
    in the varlen batch (a store to a row before the second sequence would land in the first's), and the run matches
    the oracle. Bit for bit where each row sees the same key tiles either way: without a window's lower bound, and
    where a warpgroup computes only its own rows' key tiles (own_key_tiles). Else a tile's key range follows its first
    and last row, so a row may also see a key tile wholly below its window; that tile moves no maximum, but the online
    softmax's correction exp2(fma(max, scale, -max * scale)) carries the product's rounding error, so the row's sum
    may move by an fp32 ulp (cuda/fwd_softmax.cuh; the exact form cost d64 causal 3-6 %: notes/forward.md)."""
    from hf_flashpatch.kernels.heuristics import leading_rows

    shape = forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True, dims[1])
    if not shape.wgmma:
        pytest.skip("the walk is the Hopper body's")
    torch.manual_seed(11)
    (d, d_v), (h, h_kv) = dims, heads
    group = h // h_kv
    seqlens = [1, 50, 100, 130, 170, 260, 383, 700]
    leads = {leading_rows(s * group, shape.block_m) for s in seqlens}
    assert leads == set(range(0, shape.block_m, 64)), leads  # every lead the tile allows
    for seqlen in seqlens:
        q = torch.randn(2, seqlen, h, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, seqlen, h_kv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(2, seqlen, h_kv, d_v, device="cuda", dtype=torch.bfloat16)
        out, lse = run_forward(q, k, v, window=window)
        cu = torch.tensor([0, seqlen, 2 * seqlen], device="cuda", dtype=torch.int32)
        packed, packed_lse = run_forward(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), window=window,
                                         cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=seqlen,
                                         max_seqlen_k=seqlen)  # (2 S, H, D_v) fmt: skip
        batch_lse = lse.transpose(0, 1).flatten(1, 2)  # (B, H, S) -> (H, B S)
        if window[0] < 0 or shape.own_key_tiles:
            assert torch.equal(out.flatten(0, 1), packed), seqlen
            assert torch.equal(batch_lse, packed_lse), seqlen
        else:  # an fp32 ulp or two of the sum: the LSE's, and at most one bf16 ulp of the output
            torch.testing.assert_close(batch_lse, packed_lse, rtol=2e-6, atol=0, msg=f"{seqlen}")
            torch.testing.assert_close(out.flatten(0, 1), packed, rtol=2**-7, atol=1e-6, msg=f"{seqlen}")
        want, want_lse = attention_reference(q.float(), k.float(), v.float(), window=window)
        assert (out.float() - want).abs().max().item() < 2e-2, seqlen
        seen = ~torch.isneginf(want_lse)
        torch.testing.assert_close(lse[seen], want_lse[seen], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("dims", [(128, 128), (64, 64), (192, 128)], ids=["d128", "d64", "d192-128"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 4), (8, 2), (16, 2), (6, 2)], ids=["g1", "g2", "g4", "g8", "g3"])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (200, 37)], ids=["full", "causal", "window200-37"])
def test_query_rows_by_the_tma_equal_the_math_warps_copy(monkeypatch, dims, heads, window):
    """With q_by_tma (the d64 shape's; forced here at every head dim the kernel serves), the Hopper body's producer
    loads each math warpgroup's 64 packed query rows by the TMA (a box of group heads x 64 / group positions) when
    the group divides 64; the math warps copy them otherwise. Both give the same bits, batched and varlen (whose
    boxes run into the next sequence's rows), and match the oracle; a group of 3 takes the copy."""
    if not forward_tile_shape(dims[0], device_arch(torch.device("cuda")), True,
                                                              dims[1]).wgmma:  # fmt: skip
        pytest.skip("the Hopper body's Q load")
    torch.manual_seed(3)
    (d, d_v), (n_heads, n_kv), (left, right) = dims, heads, window
    group = n_heads // n_kv
    seqlens = [1, 70, 239, 1023, 130]
    cu = torch.tensor([0] + seqlens, device="cuda").cumsum(0).int()
    q = torch.randn(sum(seqlens), n_heads, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(sum(seqlens), n_kv, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(sum(seqlens), n_kv, d_v, device="cuda", dtype=torch.bfloat16)
    real_query_map = forward_module.query_map
    heads_per_box = []

    def recording(config, q_, group_):
        found = real_query_map(config, q_, group_)
        heads_per_box.append(found[1])
        return found

    def copied_by_the_math_warps(config, q_, group_):
        return tma.NO_DESCRIPTOR, 0

    masked = left >= 0 or right >= 0
    shape = dataclasses.replace(forward_tile_shape(d, "sm_90a", masked, d_v), q_by_tma=True, kv_cluster=1,
                                tma_output=False, chained_walk=False, split_tail=False)  # boxes and the chain need Q rows copied

    def launch(varlen):
        if varlen:
            return forward_module._launch(q, k, v, cu, cu, max(seqlens), max(seqlens), None, False, left, right, None,
                                          shape=shape)  # fmt: skip
        return forward_module._launch(q[None, 70:1400], k[None, 70:1400], v[None, 70:1400], None, None, None, None,
                                      None, False, left, right, None, shape=shape)  # fmt: skip

    for varlen in (False, True):
        monkeypatch.setattr(forward_module, "query_map", recording)
        out, lse = launch(varlen)
        monkeypatch.setattr(forward_module, "query_map", copied_by_the_math_warps)
        want, want_lse = launch(varlen)
        assert heads_per_box[-1] == (group if 64 % group == 0 else 0), heads_per_box
        assert torch.equal(out, want) and torch.equal(lse, want_lse), (varlen, group)
    ref, ref_lse = attention_reference(q[None, 70:1400].float(), k[None, 70:1400].float(), v[None, 70:1400].float(),
                                       window=window)  # fmt: skip
    batched, batched_lse = launch(False)
    assert (batched.float() - ref).abs().max().item() < 2e-2
    torch.testing.assert_close(batched_lse, ref_lse, atol=1e-3, rtol=1e-3)


def test_a_masked_walk_with_a_q_the_driver_cannot_map(monkeypatch):
    """A q with a broadcast batch (stride 0) gets no tensor map. The masked d128 walk loads Q by the TMA and stages its
    output boxes in a K slot; with no query map it copies Q by its math warps and stores by threads
    (forward_maps.output_map), while its Q thread only hands the works' tiles over (waiting on the warpgroups' "Q
    empty" barriers all the same). The launch ends, gives the bits of a contiguous q (which takes both maps) and
    matches the oracle."""
    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), True)
    if not (shape.wgmma and shape.q_by_tma and shape.tma_output):
        pytest.skip("the masked d128 walk's output boxes in a K slot are the Hopper body's")
    torch.manual_seed(5)
    q = torch.randn(1, 1000, 16, 128, device="cuda", dtype=torch.bfloat16).expand(4, -1, -1, -1)
    k = torch.randn(4, 1000, 16, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(4, 1000, 16, 128, device="cuda", dtype=torch.bfloat16)
    real_output_map, maps = forward_module.output_map, []

    def recording(config, out, group, varlen, q_box_heads):
        found = real_output_map(config, out, group, varlen, q_box_heads)
        maps.append((q_box_heads, found[1]))
        return found

    monkeypatch.setattr(forward_module, "output_map", recording)
    launch = lambda q_: forward_module._launch(q_, k, v, None, None, None, None, None, True, -1, -1, None)  # noqa: E731
    out, lse = launch(q)
    torch.cuda.synchronize()
    assert maps[-1] == (0, 0)  # neither the query map nor the output boxes
    want, want_lse = launch(q.contiguous())
    assert maps[-1] == (1, 1)  # Q by the TMA, boxes in the K slot
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    check_against_oracle(out, lse, q, k, v, causal=True)


@pytest.mark.parametrize("case", [(2, 2048, 16, 16), (1, 1000, 8, 2), (3, 1000, 6, 1), (2, 300, 4, 4), (2, 250, 4, 4),
                                  (5, 64, 12, 3)],
                         ids=["2k-mha", "gqa4-partial-tile", "mqa-odd-tiles", "mha-odd-tiles", "one-round", "kv3-short"])  # fmt: skip
def test_kv_multicast_clusters_equal_the_plain_walk(monkeypatch, case):
    """The unmasked d128 shape's K/V multicast (clusters of two CTAs sharing every K/V tile: TileShape.kv_cluster,
    heuristics.clustered_schedule) against the same walk without it: the same bits, matching the oracle; it runs
    clustered exactly where each (kv head, sequence) pair has an even number of query tiles (else the plain build),
    and the GPU holds all the walk's CTAs as clusters at once. (Without the split last round, whose parts depend on
    the grid's lanes: test_forward_split_tail.py.)"""
    shape = dataclasses.replace(forward_tile_shape(128, device_arch(torch.device("cuda")), False), split_tail=False)
    if shape.kv_cluster == 1:
        pytest.skip("the K/V multicast is the Hopper body's, unmasked d128")
    batch, seqlen, heads, kv_heads = case
    torch.manual_seed(11)
    q = torch.randn(batch, seqlen, heads, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, kv_heads, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, kv_heads, 128, device="cuda", dtype=torch.bfloat16)
    clusters = []
    real_get_kernel = forward_module.get_kernel

    def recording_get_kernel(build, entry, *args, **kwargs):
        kernel = real_get_kernel(build, entry, *args, **kwargs)
        clusters.append(int(dict(build.defines).get("KV_CLUSTER", 1)))
        return kernel

    monkeypatch.setattr(forward_module, "get_kernel", recording_get_kernel)
    launch = lambda tile_shape: forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None,
                                                       shape=tile_shape)  # noqa: E731 fmt: skip
    out, lse = launch(shape)
    even = math.ceil(seqlen * heads // kv_heads / shape.block_m) % 2 == 0
    assert clusters[-1] == (2 if even else 1), (clusters, even)
    plain, plain_lse = launch(dataclasses.replace(shape, kv_cluster=1))
    assert clusters[-1] == 1
    assert torch.equal(out, plain) and torch.equal(lse, plain_lse)
    check_against_oracle(out, lse, q, k, v, causal=False)


@pytest.mark.parametrize("case", [(2, 2048, 16, 16), (2, 113, 8, 4), (1, 1, 16, 1), (3, 250, 6, 2), (2, 1023, 32, 2),
                                  (1, 300, 6, 2), (2, 200, 12, 4), (1, 500, 32, 1)],
                         ids=["2k-mha", "g2-partial", "g16-one-row", "g3", "g16-odd", "g3-one-round", "g3-short",
                              "g32"])  # fmt: skip
@pytest.mark.parametrize("dims", [(128, 128), (192, 128)], ids=["d128", "d192-128"])
def test_output_boxes_equal_the_threads_stores(monkeypatch, case, dims):
    """With tma_output (the unmasked d128 and the 192/128 shapes'), each math warp stages its 16 output rows in its Q
    rows and stores them with the TMA (a box of group heads x 16 / group positions) where the problem is batched and
    the group divides 16; else its threads store them. Both give the same bits, match the oracle, and leave no row
    unwritten (the allocator is NaN-filled); varlen problems and groups of 3 or 32 take the threads' stores. (Without
    the chain's split last round, which only the chain takes: test_forward_split_tail.py.)"""
    d, d_v = dims
    shape = dataclasses.replace(forward_tile_shape(d, device_arch(torch.device("cuda")), False, d_v), split_tail=False)
    if not shape.tma_output:
        pytest.skip("the output boxes are the Hopper body's")
    batch, seqlen, heads, kv_heads = case
    group = heads // kv_heads
    torch.manual_seed(12)
    q = torch.randn(batch, seqlen, heads, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, seqlen, kv_heads, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(batch, seqlen, kv_heads, d_v, device="cuda", dtype=torch.bfloat16)
    boxes = []
    real_output_map = forward_module.output_map

    def recording(config, out, group_, varlen, q_box_heads):
        found = real_output_map(config, out, group_, varlen, q_box_heads)
        boxes.append(found[1])
        return found

    monkeypatch.setattr(forward_module, "output_map", recording)
    launch = lambda tile_shape: forward_module._launch(q, k, v, None, None, None, None, None, False, -1, -1, None,
                                                       shape=tile_shape)  # noqa: E731 fmt: skip
    out, lse = launch(shape)
    assert boxes[-1] == (group if 16 % group == 0 else 0), (boxes, group)
    stored, stored_lse = launch(dataclasses.replace(shape, tma_output=False, chained_walk=False, split_tail=False))
    assert boxes[-1] == 0
    assert torch.equal(out, stored) and torch.equal(lse, stored_lse)
    assert not out.isnan().any(), "unwritten or NaN output elements"
    if d == d_v:
        check_against_oracle(out, lse, q, k, v, causal=False)
    else:
        ref, ref_lse = attention_reference(q.float(), k.float(), v.float())
        assert (out.float() - ref).abs().max().item() < 2e-2
        torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-3)
    cu = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * seqlen
    packed, packed_lse = forward_module._launch(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, seqlen,
                                                seqlen, None, False, -1, -1, None, shape=shape)  # fmt: skip
    assert boxes[-1] == 0  # varlen: a box could cross into the next sequence
    assert torch.equal(packed, out.flatten(0, 1))


def test_the_device_holds_a_full_grid_of_multicast_clusters():
    """The driver's count of co-resident clusters of the multicast build (kernels/clusters.py) covers one CTA per
    SM, so the persistent walk keeps every SM; a count of 0 would mean the query failed and every call fell back."""
    from hf_flashpatch.kernels.build import get_kernel, sm_count

    shape = forward_tile_shape(128, device_arch(torch.device("cuda")), False)
    if shape.kv_cluster == 1:
        pytest.skip("the K/V multicast is the Hopper body's, unmasked d128")
    config = forward_module.ForwardConfig.for_problem(128, "bf16", False, shape, "sm_90a")
    kernel = get_kernel(config.build("sm_90a"), config.entry, torch.device("cuda"))
    resident = kernel.resident_clusters(shape.kv_cluster, config.threads)
    sms = sm_count(0)
    assert resident * shape.kv_cluster >= sms - sms % shape.kv_cluster, (resident, sms)
