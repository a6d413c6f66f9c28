"""Where the forward launches the chained walk (``heuristics.chained_walk_serves``; no GPU needed): unmasked d128 on
sm_90a, batched with output boxes, 1 to CHAINED_WALK_MAX_KEYS keys; the same 160-key tiles work by work elsewhere.
Layout q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``; varlen ``(T, H, D)``."""

import pytest
import torch
from launch_recorder import RecordingKernel

from hf_flashpatch.kernels import forward, tma
from hf_flashpatch.kernels.heuristics import CHAINED_WALK_MAX_KEYS, chained_walk_serves


@pytest.fixture
def builds(monkeypatch):
    """The builds the forward asks for, launched into a recorder (sm_90a, 132 SMs, maps without a driver)."""
    built, launched = [], []
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "sm_count", lambda device: 132)

    def get_kernel(build, entry, device):
        built.append(dict(build.defines))
        kernel = RecordingKernel(entry, launched)
        kernel.resident_clusters = lambda size, threads: 132 // size  # the H200 holds a full grid of pairs
        return kernel

    monkeypatch.setattr(forward, "get_kernel", get_kernel)
    monkeypatch.setattr(forward, "aligned", lambda t: t)
    monkeypatch.setattr(forward, "_check_supported", lambda *tensors: None)
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: bytes(128))
    return built


def _launch(batch, seqlen_q, seqlen_k, heads, kv_heads, causal=False, varlen=False):
    q = torch.zeros(batch, seqlen_q, heads, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(batch, seqlen_k, kv_heads, 128, dtype=torch.bfloat16)
    if varlen:
        cu = torch.arange(batch + 1, dtype=torch.int32) * seqlen_q
        return forward._launch(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, seqlen_q, seqlen_k, None,
                               causal, -1, -1, None)  # fmt: skip
    return forward._launch(q, k, v, None, None, None, None, None, causal, -1, -1, None)


@pytest.mark.parametrize("case, chained", [
    ((8, 2048, 2048, 16, 16), True),                                # 16k tokens at 2k: chained
    ((1, 300, CHAINED_WALK_MAX_KEYS, 8, 2), True),                  # the longest keys it takes
    ((1, 300, CHAINED_WALK_MAX_KEYS + 1, 8, 2), False),             # longer: work by work
    ((2, 250, 250, 6, 2), False),                                   # a group of 3: no output boxes
    ((2, 2048, 2048, 32, 1), False),                                # a group of 32: no output boxes
])  # fmt: skip
def test_chained_walk_where_it_serves(builds, case, chained):
    _launch(*case)
    defines = builds[-1]
    assert defines["BLOCK_N"] == "160" and defines["HAS_MASK"] == "0"
    assert (defines.get("CHAINED_WALK") == "1") == chained, defines


def test_varlen_and_masked_walks_do_not_chain(builds):
    _launch(3, 500, 500, 8, 8, varlen=True)  # a box could cross into the next sequence
    assert builds[-1]["BLOCK_N"] == "160" and "CHAINED_WALK" not in builds[-1]
    _launch(8, 2048, 2048, 16, 16, causal=True)
    assert builds[-1]["HAS_MASK"] == "1" and "CHAINED_WALK" not in builds[-1]


def test_chained_walk_serves_needs_boxes_and_keys():
    assert chained_walk_serves(1, True) and chained_walk_serves(CHAINED_WALK_MAX_KEYS, True)
    assert not chained_walk_serves(0, True)  # a work without a key tile
    assert not chained_walk_serves(2048, False)
    assert not chained_walk_serves(CHAINED_WALK_MAX_KEYS + 1, True)


def test_chained_walk_loads_q_by_warp_boxes(builds, monkeypatch):
    """The chain's launch passes q's map of 16-row boxes (a warp's rows: group heads x 16 / group positions) as q_tma;
    a q the driver cannot map runs the same tiles work by work."""
    maps = []

    def descriptor(t, rows, box_heads=1):
        maps.append((t.shape, rows, box_heads))
        return bytes(128)

    monkeypatch.setattr(tma, "descriptor", descriptor)
    _launch(8, 2048, 2048, 16, 4)  # group 4
    assert builds[-1].get("CHAINED_WALK") == "1"
    q_maps = [(rows, heads) for shape, rows, heads in maps if shape[2] == 16]  # q's and out's (16 heads)
    assert (16 // 4, 4) in q_maps and q_maps.count((16 // 4, 4)) == 2  # the output's and the chain's Q boxes

    def refuse_q(t, rows, box_heads=1):
        if t.shape[2] == 16 and t.data_ptr() == refuse_q.q_ptr:
            raise tma.TmaUnsupported("q refused here")
        return bytes(128)

    q = torch.zeros(8, 2048, 16, 128, dtype=torch.bfloat16)
    kv = torch.zeros(8, 2048, 4, 128, dtype=torch.bfloat16)
    refuse_q.q_ptr = q.data_ptr()
    monkeypatch.setattr(tma, "descriptor", refuse_q)
    forward._launch(q, kv, kv, None, None, None, None, None, False, -1, -1, None)
    assert "CHAINED_WALK" not in builds[-1] and builds[-1]["BLOCK_N"] == "160"
