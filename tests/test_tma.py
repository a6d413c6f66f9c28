"""CPU checks of the TMA plumbing (``hf_flashpatch/kernels/tma.py``, ``cuda/tma.cuh``): the tensor-map
geometry the host encodes for K/V ``(B, S, H, D)`` and varlen ``(T, H, D)``, the refusals that send the
forward to contiguous copies, and where the launch puts a parameter struct that holds a 64-byte aligned
descriptor (the offset read from the cubin, checked against ``cuobjdump``). The encode itself needs the
driver and runs in the GPU tests."""

import dataclasses
import re
import shutil
import struct
import subprocess

import pytest
import torch
from launch_recorder import RecordingKernel

from hf_flashpatch.kernels import forward, forward_maps, tma
from hf_flashpatch.kernels.build import compile_cubin, find_nvcc
from hf_flashpatch.kernels.cubin_symbols import first_parameter_offset
from hf_flashpatch.kernels.sources import kernel_signature


def test_geometry_of_batched_transposed_and_varlen_tensors():
    k = torch.empty(2, 300, 4, 128, dtype=torch.bfloat16)  # (B, S, H, D)
    assert tma.map_geometry(k, 128) == ((128, 4, 300, 2), (256, 1024, 300 * 1024), (64, 1, 128, 1))
    hf = torch.empty(2, 4, 300, 128, dtype=torch.bfloat16).transpose(1, 2)  # transformers' view
    assert tma.map_geometry(hf, 64) == ((128, 4, 300, 2), (300 * 256, 256, 4 * 300 * 256), (64, 1, 64, 1))
    varlen = torch.empty(77, 1, 64, dtype=torch.float16)  # (T, H, D): one head, a batch of one
    dims, strides, _ = tma.map_geometry(varlen, 128)
    assert dims == (64, 1, 77, 1) and strides == (128, 128, 77 * 128)  # size-1 dims: the contiguous strides


def test_layouts_no_map_describes_are_refused_by_name():
    with pytest.raises(tma.TmaUnsupported, match="contiguous columns"):
        tma.map_geometry(torch.empty(2, 30, 4, 64).transpose(2, 3), 64)
    broadcast = torch.empty(1, 30, 1, 64, dtype=torch.bfloat16).expand(-1, -1, 4, -1)  # head stride 0
    with pytest.raises(tma.TmaUnsupported, match=r"strides \(1920, 64, 0, 1\)"):
        tma.descriptor(broadcast, 64)
    with pytest.raises(tma.TmaUnsupported, match="float32"):
        tma.descriptor(torch.empty(1, 30, 4, 64), 64)


def test_the_dq_workspace_map_refuses_what_it_cannot_describe_by_name():
    with pytest.raises(tma.TmaUnsupported, match="float32 tensor, got torch.bfloat16"):
        tma.reduce_descriptor(torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16))
    with pytest.raises(tma.TmaUnsupported, match=r"strides \(65536, 32768, 1, 256\)"):
        tma.reduce_descriptor(torch.zeros(1, 2, 128, 256).transpose(2, 3))


def test_the_row_statistics_map_takes_both_rows_of_a_step_in_one_box(monkeypatch):
    encoded = []
    monkeypatch.setattr(tma, "_encoded", lambda t, *args: encoded.append(args) or b"\7" * 128)
    stats = torch.empty(2, 3, 4, 256)  # (lse2 | D, batch, heads, rows_pad)
    assert tma.stats_descriptor(stats, 64) == b"\7" * 128
    data_type, dims, strides, box, swizzle = encoded[0]
    assert (dims, strides, box) == ((256, 4, 3, 2), (1024, 4096, 12 * 1024), (68, 1, 1, 2))  # from a row % 4 == 0
    assert (data_type, swizzle) == (tma._FLOAT32, tma._SWIZZLE_NONE)  # 256-byte box rows: no 128-byte swizzle
    with pytest.raises(tma.TmaUnsupported, match=r"got torch.float32 shape \(2, 3, 256, 4\) strides \(3072, 1024, 1, 256\)"):
        tma.stats_descriptor(stats.transpose(2, 3), 64)
    with pytest.raises(tma.TmaUnsupported, match="got torch.float16"):
        tma.stats_descriptor(stats.half(), 64)


def test_the_wgmma_backward_gets_its_load_maps_and_only_d64_d128_the_dq_map(monkeypatch):
    from hf_flashpatch.errors import KernelUnsupported
    from hf_flashpatch.kernels import backward

    encoded = []
    monkeypatch.setattr(backward.tma, "reduce_descriptor", lambda t: encoded.append(("dq", t)) or b"\5" * 128)
    monkeypatch.setattr(backward.tma, "descriptor", lambda t, rows: encoded.append(("bf16", t, rows)) or b"\6" * 128)
    monkeypatch.setattr(backward.tma, "stats_descriptor", lambda t, rows: encoded.append(("stats", t, rows)) or b"\7" * 128)
    dq_accum, stats = torch.zeros(1, 2, 256, 128), torch.zeros(2, 1, 2, 256)
    q = dout = torch.zeros(1, 100, 2, 128, dtype=torch.bfloat16)
    d128 = backward.BackwardConfig.choose(128, torch.bfloat16, False, "sm_90a")
    assert backward._tensor_maps(d128, dq_accum, q, dout, stats) == (b"\5" * 128, b"\6" * 128, b"\6" * 128, b"\7" * 128)
    assert [e[0] for e in encoded] == ["dq", "bf16", "bf16", "stats"] and encoded[-1][2] == d128.wgmma_block_m == 64
    mla = backward.BackwardConfig.choose(192, torch.bfloat16, False, "sm_90a", head_dim_v=128)  # dQ from registers
    assert backward._tensor_maps(mla, dq_accum, q, dout, stats)[0] == tma.NO_DESCRIPTOR
    ampere = backward.BackwardConfig.choose(128, torch.bfloat16, False, "sm_80")  # the mma.sync bodies read none
    encoded.clear()
    assert backward._tensor_maps(ampere, dq_accum, q, dout, stats) == (tma.NO_DESCRIPTOR,) * 4
    empty = torch.zeros(1, 0, 2, 128, dtype=torch.bfloat16)  # no query rows: no step, no map (the driver refuses 0)
    assert backward._tensor_maps(d128, dq_accum, empty, empty, stats) == (tma.NO_DESCRIPTOR,) * 4 and not encoded

    def refuse(t, rows):
        raise tma.TmaUnsupported("refused here")

    monkeypatch.setattr(backward.tma, "descriptor", refuse)
    with pytest.raises(KernelUnsupported, match="map its tensors for the TMA: refused here"):
        backward._tensor_maps(d128, dq_accum, q, dout, stats)


def test_the_backward_takes_its_maps_before_its_flat_list():
    signature = kernel_signature("bwd.cu", "bwd_dkdv_dq_atomic")
    assert signature.names[:5] == ("dq_map", "q_map", "do_map", "stats_map", "q") and signature.letters[:5] == "TTTTP"
    maps = [bytes([i]) * 128 for i in range(1, 5)]
    packed = struct.pack("@" + signature.format, *maps, *[0] * (len(signature.letters) - 4))
    assert packed[:512] == b"".join(maps) and len(packed) == 512 + struct.calcsize("@" + signature.format[16:])


def test_the_forward_parameter_struct_packs_the_descriptors_first():
    signature = kernel_signature("fwd_hopper_ws.cu", "hfp_attention_forward_sm90_ws")
    assert signature.names[:5] == ("k_tma", "v_tma", "q_tma", "o_tma", "q") and signature.letters[:5] == "TTTTP"
    assert signature.names[-7:-4] == ("q_box_heads", "o_box_heads", "leading_rows")
    # the split round's and the listed walk's, last (the other builds' offsets unchanged by them)
    assert signature.names[-4:] == ("tail_parts", "partials", "part_counters", "work_list")
    assert signature.letters[-7:] == "iiiiPPP"
    assert struct.calcsize("@" + signature.format) % 64 == 0  # C pads the struct to its 64-byte alignment
    maps = (b"\1" * 128, b"\2" * 128, b"\3" * 128, b"\4" * 128)
    packed = struct.pack("@" + signature.format, *maps, *[0] * (len(signature.letters) - 4))
    assert packed[:512] == b"".join(maps)


def _cuobjdump_parameter_offset(cubin: bytes, entry: str, tmp_path) -> int:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    elf = subprocess.run([shutil.which("cuobjdump"), "-elf", str(path)], capture_output=True, text=True).stdout
    section = elf[elf.rindex(f".nv.info.{entry}"):]  # the section's body (the header table names it first)
    return int(re.search(r"EIATTR_KPARAM_INFO.*?Ordinal\s*:\s*0x0\s+Offset\s*:\s*(0x[0-9a-f]+)", section, re.S).group(1), 16)


@pytest.mark.skipif(find_nvcc() is None or shutil.which("cuobjdump") is None, reason="needs nvcc and cuobjdump")
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_launch_starts_the_parameter_struct_where_the_cubin_puts_it(arch, tmp_path):
    """The forward struct holds 64-byte aligned descriptors, so its place in the parameter bank is aligned
    past the bank's start: the launch must leave those bytes empty (it read 48 bytes too early once)."""
    entries = {"fwd.cu": forward._ENTRY, "fwd_hopper_ws.cu": forward._ENTRY_SM90_WS}
    for build in {b.source: b for b in forward.all_builds(arch)}.values():
        entry = entries[build.source]
        cubin, _ = compile_cubin(build)
        offset = first_parameter_offset(cubin, entry)
        assert offset == _cuobjdump_parameter_offset(cubin, entry, tmp_path), (arch, build.source)
        assert offset % 16 == 0 and offset < 64
    # the backward's dK/dV kernel with dQ atomics: dQ's 64-byte aligned map first, then the flat list
    from hf_flashpatch.kernels.backward import BackwardConfig

    cubin, _ = compile_cubin(BackwardConfig.choose(128, torch.bfloat16, False, arch).build())
    offset = first_parameter_offset(cubin, "bwd_dkdv_dq_atomic")
    assert offset == _cuobjdump_parameter_offset(cubin, "bwd_dkdv_dq_atomic", tmp_path)
    assert offset % 16 == 0 and offset < 64


def test_no_keys_need_no_map_and_an_unmappable_copy_is_refused_by_name(monkeypatch):
    """Empty K/V: the kernel issues no copy, so no map is encoded (the driver refuses a dim of 0). A layout the
    driver refuses even as a contiguous copy raises KernelUnsupported (the torch fallback then serves)."""
    from hf_flashpatch.errors import KernelUnsupported

    config = forward.ForwardConfig.for_problem(128, "bf16", True, arch="sm_90a")
    assert config.wgmma

    def refuse(t, rows):
        raise tma.TmaUnsupported(f"refused {tuple(t.shape)}")

    monkeypatch.setattr(tma, "descriptor", refuse)
    empty = torch.empty(2, 0, 4, 128, dtype=torch.bfloat16)
    assert forward_maps.kv_maps(config, empty, empty)[2:] == (tma.NO_DESCRIPTOR, tma.NO_DESCRIPTOR)
    k = torch.empty(2, 30, 4, 128, dtype=torch.bfloat16)
    with pytest.raises(KernelUnsupported, match=r"cannot map k/v for the TMA: refused \(2, 30, 4, 128\)"):
        forward_maps.kv_maps(config, k, k)


def test_output_rows_get_a_map_of_group_heads_per_box_when_batched_and_the_group_divides_16(monkeypatch):
    """With a shape's tma_output (unmasked d128's, 192/128's), each math warp stores its 16 packed output rows in one
    box per 64 columns: group heads x 16 / group positions. Varlen problems (a box could cross into the next
    sequence), other groups, an unmappable output, shapes without it and the mma.sync body get no map and
    o_box_heads 0: the threads store their rows. The boxes need the Q rows copied by the math warps, or (masked d128,
    Q by the TMA) 128 x 128 tiles, whose last K slot stages them."""
    boxes = forward.ForwardConfig.for_problem(128, "bf16", False, arch="sm_90a")
    assert boxes.tma_output and not boxes.q_by_tma  # the shipped unmasked d128 shape (heuristics.HOPPER_SHAPES)
    masked = forward.ForwardConfig.for_problem(128, "bf16", True, arch="sm_90a")
    assert masked.tma_output and masked.q_by_tma  # staged in the last K slot
    masked_d64 = forward.ForwardConfig.for_problem(64, "bf16", True, arch="sm_90a")
    ampere = forward.ForwardConfig.for_problem(128, "bf16", False, arch="sm_80")
    out = torch.empty(2, 40, 32, 128, dtype=torch.bfloat16)  # (B, S, H, D_v)
    encoded = []
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: encoded.append((rows, box_heads)) or b"o" * 128)
    for group in (1, 2, 4, 8, 16):
        assert forward_maps.output_map(boxes, out, group, varlen=False, q_box_heads=0) == (b"o" * 128, group)
        assert encoded[-1] == (16 // group, group)
    calls = len(encoded)
    for group in (3, 6, 32):
        assert forward_maps.output_map(boxes, out, group, varlen=False, q_box_heads=0) == (tma.NO_DESCRIPTOR, 0)
    assert forward_maps.output_map(boxes, out[0], 2, varlen=True, q_box_heads=0) == (tma.NO_DESCRIPTOR, 0)
    assert forward_maps.output_map(masked_d64, out, 2, varlen=False, q_box_heads=2) == (tma.NO_DESCRIPTOR, 0)
    assert forward_maps.output_map(ampere, out, 2, varlen=False, q_box_heads=0) == (tma.NO_DESCRIPTOR, 0)
    assert len(encoded) == calls
    assert forward_maps.output_map(masked, out, 2, varlen=False, q_box_heads=2) == (b"o" * 128, 2)
    # Q by the TMA without a query map: the K slot's wait on the "Q empty" barriers would never end; threads store
    assert forward_maps.output_map(masked, out, 2, varlen=False, q_box_heads=0) == (tma.NO_DESCRIPTOR, 0)
    with pytest.raises(ValueError, match="the output boxes not staged, with the Q rows copied or .staged in a K slot"):
        dataclasses.replace(masked_d64, tma_output=True)  # masked d64: Q by the TMA on 192-row tiles
    with pytest.raises(ValueError, match="the output boxes and the K/V multicast are the wgmma body.s"):
        dataclasses.replace(ampere, tma_output=True)
    assert dict(boxes.build().defines)["TMA_OUTPUT"] == "1" and dict(masked.build().defines)["TMA_OUTPUT"] == "1"
    assert "TMA_OUTPUT" not in dict(masked_d64.build().defines)

    def refuse(t, rows, box_heads=1):
        raise tma.TmaUnsupported("refused here")

    monkeypatch.setattr(tma, "descriptor", refuse)
    assert forward_maps.output_map(boxes, out, 4, varlen=False, q_box_heads=0) == (tma.NO_DESCRIPTOR, 0)


def test_query_rows_get_a_map_of_group_heads_per_box_when_the_group_divides_64(monkeypatch):
    """With a shape's q_by_tma, the Hopper body's producer loads a math warpgroup's 64 packed query rows (GQA heads
    fastest) in one box per 64 columns: group heads x 64 / group positions. Other groups, an unmappable q, shapes
    without it and the mma.sync body get no map and q_box_heads 0: the math warps copy their rows."""
    hopper = forward.ForwardConfig.for_problem(64, "bf16", True, arch="sm_90a")
    assert hopper.q_by_tma  # the shipped d64 shape (heuristics.HOPPER_SHAPES)
    copying = dataclasses.replace(hopper, q_by_tma=False)  # a Hopper shape whose math warps copy Q (unmasked d128's)
    ampere = forward.ForwardConfig.for_problem(128, "bf16", True, arch="sm_80")
    q = torch.empty(2, 40, 8, 128, dtype=torch.bfloat16).transpose(1, 2)  # (B, S=8, H=40, D) view of (B, 40, 8, D)
    assert tma.map_geometry(q, 16, 4)[2] == (tma.BOX_COLUMNS, 4, 16, 1)
    encoded = []
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: encoded.append((rows, box_heads)) or b"m" * 128)
    for group in (1, 2, 4, 8, 16, 32, 64):
        assert forward_maps.query_map(hopper, q, group) == (b"m" * 128, group)
        assert encoded[-1] == (64 // group, group)
    calls = len(encoded)
    for group in (3, 5, 6, 7, 12):
        assert forward_maps.query_map(hopper, q, group) == (tma.NO_DESCRIPTOR, 0)
    assert forward_maps.query_map(ampere, q, 4) == (tma.NO_DESCRIPTOR, 0) and len(encoded) == calls
    assert forward_maps.query_map(copying, q, 4) == (tma.NO_DESCRIPTOR, 0) and len(encoded) == calls
    for field in ("q_by_tma", "own_key_tiles", "staged_output", "chained_walk", "warpgroup_turns"):  # mma.sync: none
        with pytest.raises(ValueError, match="Q by the TMA, own key tiles, the staged output, the output boxes and the K/V multicast are the wgmma body's"):
            dataclasses.replace(ampere, **{field: True})
    with pytest.raises(ValueError, match="the staged output at a v head dim of 128 with the Q rows copied"):
        dataclasses.replace(hopper, staged_output=True)  # d64, Q by the TMA: neither fits
    # the choices are build defines (the kernel compiles only what its shape takes)
    assert dict(hopper.build().defines)["Q_BY_TMA"] == "1" and dict(copying.build().defines)["Q_BY_TMA"] == "0"
    assert dict(hopper.build().defines)["OWN_KEY_TILES"] == str(int(hopper.own_key_tiles))

    def refuse(t, rows, box_heads=1):
        raise tma.TmaUnsupported("refused here")

    monkeypatch.setattr(tma, "descriptor", refuse)
    assert forward_maps.query_map(hopper, q, 4) == (tma.NO_DESCRIPTOR, 0)


def test_a_masked_walk_with_an_unmappable_q_stores_its_output_by_threads(monkeypatch):
    """The masked d128 walk loads Q by the TMA and stages its output boxes in the last K slot, behind the other
    warpgroup's "Q empty" barrier, which only a launch with a query map arms. A q the driver cannot map (refused
    here; a broadcast stride on a GPU) launches with neither map: the math warps copy Q and the threads store, with
    the masked walk's leading rows (which boxes forbid). Layout q ``(B, S, H, D)``."""
    launched = []
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "sm_count", lambda device: 132)
    monkeypatch.setattr(forward, "get_kernel", lambda build, entry, device: RecordingKernel(entry, launched))
    monkeypatch.setattr(forward, "_check_supported", lambda *tensors: None)
    q = torch.zeros(4, 1000, 16, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(4, 1000, 16, 128, dtype=torch.bfloat16)

    def refuse_q(t, rows, box_heads=1):
        if t.data_ptr() == q.data_ptr():
            raise tma.TmaUnsupported("q refused here")
        return b"m" * 128

    for descriptor, armed in ((lambda t, rows, box_heads=1: b"m" * 128, True), (refuse_q, False)):
        monkeypatch.setattr(tma, "descriptor", descriptor)
        forward._launch(q, k, v, None, None, None, None, None, True, -1, -1, None)
        entry, grid, args = launched[-1]
        assert grid[0] == 132  # a walk: 4 x 16 pairs of 8 query tiles
        q_tma, o_tma = args[2], args[3]  # k_tma, v_tma, q_tma, o_tma lead the parameters
        assert (q_tma != tma.NO_DESCRIPTOR, o_tma != tma.NO_DESCRIPTOR) == (armed, armed)
