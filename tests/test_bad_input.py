"""Inputs that used to give silent wrong answers (issue 18, items 4-8 and the window/softcap types of
item 9), on CPU: each gets the clear error or the defined result. Layout (batch, seqlen, heads, head_dim);
varlen (total, heads, head_dim). The CUDA side of the same contracts: tests/gpu/test_bad_tables.py."""

from fractions import Fraction
import math
import re
from pathlib import Path
import subprocess

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch import validate
from hf_flashpatch.reference import attention_reference, varlen_attention_reference

INF, NAN = float("inf"), float("nan")


def _qkv(b=2, sq=9, sk=13, h=4, hk=2, d=16):
    return torch.randn(b, sq, h, d), torch.randn(b, sk, hk, d), torch.randn(b, sk, hk, d)


def _paged_inputs(batch=2, num_pages=6, page_size=4):
    q = torch.randn(batch, 1, 4, 16)
    pages_k, pages_v = torch.randn(num_pages, page_size, 2, 16), torch.randn(num_pages, page_size, 2, 16)
    table = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)[:batch]
    lens = torch.tensor([9, 12], dtype=torch.int32)[:batch]
    return q, pages_k, pages_v, table, lens


def _call_each_api(**kwargs):
    """Every public function once with the same keyword arguments (q/k/v valid)."""
    q, k, v = _qkv()
    yield lambda: hfp.flash_attn_func(q, k, v, **kwargs)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    yield lambda: hfp.flash_attn_varlen_func(q[0], k[0, :9], v[0, :9], cu, cu, 5, 5, **kwargs)
    yield lambda: hfp.flash_attn_with_kvcache(q[:, :1], k, v, **kwargs)
    qp, pk, pv, table, lens = _paged_inputs()
    yield lambda: hfp.flash_attn_paged_decode(qp, pk, pv, table, lens, **kwargs)


# --------------------------------------------------------------------------- 4: softcap inf / nan, scale nan / inf


@pytest.mark.parametrize("return_lse", [False, True])
def test_softcap_inf_means_no_cap(return_lse):
    q, k, v = _qkv()
    capped = hfp.flash_attn_func(q, k, v, causal=True, softcap=INF, return_lse=True)
    plain = hfp.flash_attn_func(q, k, v, causal=True, return_lse=True)
    torch.testing.assert_close(capped, plain)  # not all zeros with lse -inf
    out = hfp.flash_attn_func(q, k, v, causal=True, softcap=INF, return_lse=return_lse)
    torch.testing.assert_close(out[0] if return_lse else out, plain[0])
    qp, pk, pv, table, lens = _paged_inputs()
    torch.testing.assert_close(hfp.flash_attn_paged_decode(qp, pk, pv, table, lens, softcap=INF),
                               hfp.flash_attn_paged_decode(qp, pk, pv, table, lens))  # fmt: skip
    ref, ref_lse = attention_reference(q, k, v, causal=True, softcap=INF)  # the oracle agrees
    torch.testing.assert_close(ref, plain[0], atol=1e-5, rtol=1e-5)
    huge = hfp.flash_attn_func(q, k, v, causal=True, softcap=10**400)  # past fp32 too: no cap, not an OverflowError
    torch.testing.assert_close(huge, plain[0])


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(softcap=NAN), ValueError, r"softcap must be >= 0 .* got nan"),
        (dict(softcap=-1.0), ValueError, r"softcap must be >= 0 .* got -1.0"),
        (dict(softmax_scale=NAN), ValueError, r"softmax_scale must be finite .* got nan"),
        (dict(softmax_scale=INF), ValueError, r"softmax_scale must be finite .* got inf"),
        (dict(softmax_scale=-INF), ValueError, r"softmax_scale must be finite .* got -inf"),
        (dict(softmax_scale="0.1"), TypeError, r"softmax_scale must be a float or None, got str '0.1'"),
        # other numbers.Real types used to pass the check and fail inside torch without naming the argument
        (dict(softmax_scale=Fraction(1, 3)), TypeError, r"softmax_scale must be a float or None, got Fraction"),
        (dict(softcap=Fraction(3, 2)), TypeError, r"softcap must be a float or None, got Fraction"),
        (dict(softmax_scale=10**400), ValueError, r"softmax_scale must be finite in fp32"),  # was an OverflowError
    ],
)
def test_nan_softcap_and_non_finite_scale_are_errors_everywhere(kwargs, error, match):
    for call in _call_each_api(**kwargs):
        with pytest.raises(error, match=match):
            call()


# --------------------------------------------------------------------------- 5: softmax_scale = 0.0 means 0


def test_softmax_scale_zero_is_a_uniform_average():
    q, k, v = _qkv(sq=1)
    out = hfp.flash_attn_func(q, k, v, softmax_scale=0.0, softcap=30.0, return_lse=True)[0]
    mean = v.mean(dim=1, keepdim=True).repeat_interleave(2, dim=2)  # (B, 1, H, D): every key weighs the same
    torch.testing.assert_close(out, mean, atol=1e-5, rtol=1e-5)


def test_forward_kernel_launch_takes_zero_scale_as_zero(monkeypatch):
    """The GPU forward launch used ``scale if scale else 1/sqrt(D)``: 0.0 became the default there while
    decode, backward and the fallback used 0. Recorded on CPU by stubbing the kernel and the device."""
    from hf_flashpatch.kernels import decode, forward
    from hf_flashpatch.kernels.sources import kernel_signature
    from launch_recorder import RecordingKernel

    launched = []
    monkeypatch.setattr(forward, "_check_supported", lambda *a: None)
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_80")
    monkeypatch.setattr(forward, "get_kernel", lambda build, entry, device: RecordingKernel(entry, launched))
    monkeypatch.setattr(forward, "aligned", lambda t: t)
    q, k, v = (t.bfloat16() for t in _qkv(d=64))
    names = kernel_signature("fwd.cu", forward._ENTRY).names
    for scale, expect in ((0.0, 0.0), (None, math.log2(math.e) / 8.0), (0.5, 0.5 * math.log2(math.e))):
        forward._launch(q, k, v, None, None, 0, 0, scale, False, -1, -1, 0.0)
        _entry, _grid, args = launched[-1]
        assert dict(zip(names, args))["scores.scale_log2"] == pytest.approx(expect), scale
    assert decode._scales(64, 0.0, None) == (0.0, 0.0, 0.0)  # decode agrees (and always did)


# --------------------------------------------------------------------------- 6: cu_seqlens contents


def _varlen(cu_q, cu_k=None, total_q=12, total_k=12, max_q=16, max_k=16, **kwargs):
    q, k, v = torch.randn(total_q, 4, 16), torch.randn(total_k, 2, 16), torch.randn(total_k, 2, 16)
    cu_q = torch.tensor(cu_q, dtype=torch.int32)
    cu_k = cu_q if cu_k is None else torch.tensor(cu_k, dtype=torch.int32)
    return hfp.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


@pytest.mark.parametrize(
    "cu_q,cu_k,match",
    [
        ([0, 8, 4, 12], None, r"cu_seqlens_q must be non-decreasing, got cu_seqlens_q\[2\] = 4 after "
                              r"cu_seqlens_q\[1\] = 8 \(values \[0, 8, 4, 12\]\)"),
        ([2, 6, 10, 12], None, r"cu_seqlens_q must start at 0, got cu_seqlens_q\[0\] = 2"),
        ([-4, 4, 8, 12], None, r"cu_seqlens_q must start at 0, got cu_seqlens_q\[0\] = -4"),
        ([0, 4, 8, 12], [0, 4, 8, 20], r"cu_seqlens_k ends at 20 but k has only 12 rows"),
        ([0, 4, 8, 14], None, r"cu_seqlens_q ends at 14 but q has only 12 rows"),
    ],
)
def test_invalid_cu_seqlens_are_errors(cu_q, cu_k, match):
    with pytest.raises(ValueError, match=match):
        _varlen(cu_q, cu_k)
    with pytest.raises(ValueError, match=match):  # CPU tables are checked even when the caller opts out
        _varlen(cu_q, cu_k, check_inputs=False)


def test_max_seqlen_must_cover_the_longest_sequence():
    with pytest.raises(ValueError, match=r"max_seqlen_q = 5 is less than sequence 1's 7 rows"):
        _varlen([0, 3, 10, 12], max_q=5)
    with pytest.raises(TypeError, match=r"max_seqlen_k must be an int >= 0, got float 7.5"):
        _varlen([0, 3, 10, 12], max_k=7.5)
    with pytest.raises(ValueError, match=r"max_seqlen_q must be >= 0, got -1"):
        _varlen([0, 3, 10, 12], max_q=-1)


def test_valid_tables_and_tail_padding_still_work():
    q, k, v = torch.randn(12, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    cu = torch.tensor([0, 4, 4, 10], dtype=torch.int32)  # an empty sequence; rows 10, 11 are padding
    out, lse = hfp.flash_attn_varlen_func(q, k, v, cu, cu, 6, 6, causal=True, return_lse=True)
    ref, ref_lse = varlen_attention_reference(q, k, v, cu, cu, causal=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert (out[10:] == 0).all() and (lse[:, 10:] == -INF).all()


# --------------------------------------------------------------------------- 7: page tables and lengths


@pytest.mark.parametrize(
    "table,lens,match",
    [
        ([[3, -1, 0], [5, 2, 4]], [9, 12], r"page_table\[0, 1\] = -1 is not a page of this pool \(valid: 0..5\)"),
        ([[3, 1, 0], [5, 2, 6]], [9, 12], r"page_table\[1, 2\] = 6 is not a page of this pool"),
        ([[3, 1, 0], [5, 2, 4]], [9, 13], r"sequence 1 has 13 tokens = 4 pages of 4, but page_table has only 3 col"),
        ([[3, 1, 0], [5, 2, 4]], [-1, 12], r"seqlens_k\[0\] = -1 is negative"),
    ],
)
def test_invalid_page_tables_are_errors(table, lens, match):
    q, pk, pv, _, _ = _paged_inputs()
    table, lens = torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    for check_inputs in (True, False):  # CPU tables: always checked
        with pytest.raises(ValueError, match=match):
            hfp.flash_attn_paged_decode(q, pk, pv, table, lens, check_inputs=check_inputs)


def test_pages_past_the_length_are_never_read_so_never_checked():
    q, pk, pv, _, _ = _paged_inputs()
    table = torch.tensor([[3, 1, -7], [5, 2, 99]], dtype=torch.int32)  # third column unused by both rows
    lens = torch.tensor([8, 8], dtype=torch.int32)
    out = hfp.flash_attn_paged_decode(q, pk, pv, table, lens)
    expect = hfp.flash_attn_paged_decode(q, pk, pv, table[:, :2].contiguous(), lens)
    torch.testing.assert_close(out, expect)


@pytest.mark.parametrize("length,match", [(-3, r"cache_seqlens\[1\] = -3 is outside \[0, 13\]"),
                                          (999, r"cache_seqlens\[1\] = 999 is outside \[0, 13\]")])
def test_invalid_cache_seqlens_are_errors(length, match):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=match):
        hfp.flash_attn_with_kvcache(q[:, :1], k, v, torch.tensor([5, length], dtype=torch.int32))
    with pytest.raises(TypeError, match=r"cache_seqlens must be int32 or int64, got torch.float32"):
        hfp.flash_attn_with_kvcache(q[:, :1], k, v, torch.tensor([5.0, 6.0]))


def test_content_check_policy(monkeypatch):
    """CPU tables always; CUDA tables in eager mode unless check_inputs=False; never while compiling or
    capturing a CUDA graph (the values are unknown there, and a host read would break the capture)."""

    class CudaTable:  # stands in for a CUDA tensor: the policy reads only .is_cuda and .device
        is_cuda = True
        device = torch.device("cuda", 0)

    cpu, cuda = torch.zeros(2), CudaTable()
    capturing, compiling = [False], [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling[0])
    assert validate.content_checks_enabled(True, cpu) and validate.content_checks_enabled(False, cpu)
    assert validate.content_checks_enabled(True, cuda) and not validate.content_checks_enabled(False, cuda)
    capturing[0] = True
    assert not validate.content_checks_enabled(True, cuda)
    capturing[0], compiling[0] = False, True
    assert not validate.content_checks_enabled(True, cuda) and not validate.content_checks_enabled(True, cpu)
    compiling[0] = False
    assert not validate.content_checks_enabled(True, torch.zeros(2, device="meta"))  # no values to read


def test_one_host_read_per_call(monkeypatch):
    """The content check of a call reads all of its tables in one device-to-host copy (one sync on CUDA)."""
    reads = []
    real = validate._to_host
    monkeypatch.setattr(validate, "_to_host", lambda *t: reads.append(len(t)) or real(*t))
    _varlen([0, 4, 12])
    q, k, v = _qkv()
    hfp.flash_attn_with_kvcache(q[:, :1], k, v, torch.tensor([5, 6], dtype=torch.int32))
    hfp.flash_attn_paged_decode(*_paged_inputs())
    hfp.flash_attn_func(q, k, v)  # no tables: no read
    assert reads == [2, 1, 2]


# --------------------------------------------------------------------------- 8: NaN propagates, never leaks


@pytest.mark.parametrize("return_lse,softcap", [(False, None), (True, None), (False, 20.0), (True, 20.0)],
                         ids=["sdpa", "lse", "softcap", "lse+softcap"])  # fmt: skip
@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_propagates_to_its_rows_only(return_lse, softcap, where):
    q, k, v = _qkv(sq=9, sk=9)
    clean = hfp.flash_attn_func(q, k, v, causal=True, softcap=softcap, return_lse=True)
    if where == "q":
        q[1, 4, 3, 0] = NAN  # batch 1, query 4, head 3
        hit = torch.zeros(2, 9, 4, dtype=torch.bool)
        hit[1, 4, 3] = True
    else:
        k[1, 4, 0, 5] = NAN  # batch 1, key 4, kv head 0 (query heads 0, 1): seen by queries 4.. (causal)
        hit = torch.zeros(2, 9, 4, dtype=torch.bool)
        hit[1, 4:, :2] = True
    res = hfp.flash_attn_func(q, k, v, causal=True, softcap=softcap, return_lse=return_lse)
    out = res[0] if return_lse else res
    assert torch.isnan(out).all(dim=-1).eq(hit).all()  # NaN exactly in the rows that see it
    torch.testing.assert_close(out[~hit], clean[0][~hit])  # every other row as before
    if return_lse:
        lse_hit = hit.transpose(1, 2)  # (B, H, S_q)
        assert torch.isnan(res[1]).eq(lse_hit).all()
        torch.testing.assert_close(res[1][~lse_hit], clean[1][~lse_hit])


@pytest.mark.parametrize("return_lse", [False, True])
def test_nan_stays_in_its_sequence(return_lse):
    q, k, v = torch.randn(12, 4, 16), torch.randn(12, 2, 16), torch.randn(12, 2, 16)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    clean = hfp.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, softcap=10.0, return_lse=True)
    k[2, 1] = NAN  # sequence 0, key 2, kv head 1 (query heads 2, 3)
    res = hfp.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, softcap=10.0, return_lse=return_lse)
    out = res[0] if return_lse else res
    assert torch.isnan(out[:5, 2:]).all() and not torch.isnan(out[:5, :2]).any()
    torch.testing.assert_close(out[5:], clean[0][5:])  # the other sequence is untouched
    qp, pk, pv, table, lens = _paged_inputs()
    pk[1, 0, 0, 0] = NAN  # page 1 belongs to sequence 0 only
    paged = hfp.flash_attn_paged_decode(qp, pk, pv, table, lens, return_lse=True)
    assert torch.isnan(paged[0][0, :, :2]).all() and torch.isnan(paged[1][0, :2]).all()
    assert torch.isfinite(paged[0][0, :, 2:]).all() and torch.isfinite(paged[0][1]).all()


# --------------------------------------------------------------------------- 9: window / softcap types


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(window=(2.5, 0)), TypeError, r"window left must be an int or None .* got float 2.5"),
        (dict(window=(3, 0.0)), TypeError, r"window right must be an int or None .* got float 0.0"),
        (dict(window=(True, 0)), TypeError, r"window left must be an int or None .* got bool True"),
        (dict(window=("3", 0)), TypeError, r"window left must be an int or None .* got str '3'"),
        (dict(window=5), ValueError, r"window must be a \(left, right\) pair .* got 5"),
        (dict(softcap="30"), TypeError, r"softcap must be a float or None, got str '30'"),
        (dict(softcap=True), TypeError, r"softcap must be a float or None, got bool True"),
    ],
)
def test_window_and_softcap_types_name_the_argument(kwargs, error, match):
    for call in _call_each_api(**kwargs):
        with pytest.raises(error, match=match):
            call()


def test_int_like_windows_still_work():
    import numpy as np

    q, k, v = _qkv()
    expect = hfp.flash_attn_func(q, k, v, causal=True, window=(3, 0))
    torch.testing.assert_close(hfp.flash_attn_func(q, k, v, causal=True, window=[np.int64(3), None]), expect)
    torch.testing.assert_close(hfp.flash_attn_func(q, k, v, causal=True, window=(3, -1)), expect)


# --------------------------------------------------------------------------- batch 0


def test_empty_batch_gives_empty_results():
    q, k, v = (t[:0] for t in _qkv())
    out, lse = hfp.flash_attn_with_kvcache(q[:, :1], k, v, torch.zeros(0, dtype=torch.int32), return_lse=True)
    assert out.shape == (0, 1, 4, 16) and lse.shape == (0, 4, 1)
    _, pk, pv, _, _ = _paged_inputs()
    out = hfp.flash_attn_paged_decode(q[:, :1], pk, pv, torch.zeros(0, 3, dtype=torch.int32),
                                      torch.zeros(0, dtype=torch.int32))  # fmt: skip
    assert out.shape == (0, 1, 4, 16)


# --------------------------------------------------------------------------- kernel arguments


def _compile(build, source_text: str, suffix: str) -> str:
    """PTX of ``source_text`` (written next to nothing: it includes cuda/ headers) under ``build``'s flags."""
    from hf_flashpatch.kernels.build import find_nvcc

    tag = f"/tmp/hfp_args_{abs(hash((build, source_text)))}{suffix}"
    Path(tag + ".cu").write_text(source_text)
    command = [("-ptx" if a == "-cubin" else a) for a in build.nvcc_command(find_nvcc(), tag + ".ptx")]
    command[-1] = tag + ".cu"
    subprocess.run(command, check=True, capture_output=True, text=True)
    return Path(tag + ".ptx").read_text()


def _ptx_params(build, entries):
    """The parameters of each entry of ``build`` as nvcc's PTX declares them: widths, or a struct's
    ``("struct", bytes)``."""
    from hf_flashpatch.kernels.sources import cuda_source_dir

    ptx = _compile(build, (cuda_source_dir() / build.source).read_text(), "")
    found = {}
    for m in re.finditer(r"\.entry (\w+)\(([^)]*)\)", ptx):
        struct_param = re.fullmatch(r"\s*\.param \.align \d+ \.b8 \w+\[(\d+)\]\s*", m.group(2))
        found[m.group(1)] = ("struct", int(struct_param.group(1))) if struct_param else \
            re.findall(r"\.param \.(\w+)", m.group(2))  # fmt: skip
    return {name: found[name] for name in entries}


def _field_offsets(fmt: str) -> list[int]:
    """Byte offset of each field of a :mod:`struct` format with ``0q`` / ``0i`` alignment markers and ``Nx``
    padding."""
    import struct

    offsets, prefix = [], "@"
    for token in re.findall(r"0[qi]|\d+x|\d+s|[PqiIf]", fmt):  # Nx: padding, 128s: a tensor map's bytes
        if not (token.startswith("0") or token.endswith("x")):
            offsets.append(struct.calcsize(prefix + token) - struct.calcsize("@" + token))
        prefix += token
    return offsets


_PARAM_STRUCTS = {  # each family's parameter struct: its qualified name and the header that declares it
    "FwdParams": ("hfp::fwd::FwdParams", "fwd_geometry.cuh"),
    "DecodeParams": ("hfp::DecodeParams", "decode_common.cuh"),
}


@pytest.mark.skipif(__import__("hf_flashpatch.kernels.build", fromlist=["x"]).find_nvcc() is None,
                    reason="nvcc not found")  # fmt: skip
def test_kernel_argument_lists_match_the_cuda_signatures():
    """The argument buffer the launches pack, read from each entry's parameters in cuda/ (kernels/sources.py),
    against what nvcc compiled: one PTX parameter of the same width per letter (P/q = 64-bit, i = 32-bit,
    f = float, T = a 64-byte aligned tensor map), or, for a parameter struct, its size and every field's offset and width (checked by nvcc),
    or every later argument would land at the wrong offset."""
    import struct

    from hf_flashpatch.kernels import backward, decode, forward
    from hf_flashpatch.kernels.sources import cuda_source_dir, kernel_signature

    width = {"P": "u64", "q": "u64", "i": "u32", "f": "f32", "T": "align"}  # T: `.param .align 64 .b8 name[128]`
    cases = [
        (decode.DecodeConfig(128, True, "slot", False).build(), ("hfp_decode_split", "hfp_decode_combine")),
        (decode.KV_APPEND_BUILD, ("hfp_kv_append",)),
        (backward.BackwardConfig.choose(64, torch.bfloat16, False).build(),
         ("bwd_preprocess", "bwd_dkdv_dq_atomic", "bwd_dkdv", "bwd_dq", "bwd_convert_dq")),
    ]  # fmt: skip
    seen = set()
    for build in forward.all_builds():
        entry = {"fwd.cu": forward._ENTRY, "fwd_hopper_ws.cu": forward._ENTRY_SM90_WS}[build.source]
        if entry not in seen:
            seen.add(entry)
            cases.append((build, (entry,)))
    structs_checked = set()
    for build, entries in cases:
        signatures = {entry: kernel_signature(build.source, entry) for entry in entries}
        params = _ptx_params(build, signatures)
        for entry, signature in signatures.items():
            if params[entry][0] != "struct":  # a flat list (a tensor map in it packs as its 128 bytes, 64-aligned)
                assert [width[c] for c in signature.letters] == params[entry], f"{build.source}:{entry}"
                continue
            assert params[entry] == ("struct", struct.calcsize("@" + signature.format)), f"{build.source}:{entry}"
            family = re.search(entry + r"\s*\(\s*const __grid_constant__ (?:\w+::)*(\w+)",
                               (cuda_source_dir() / build.source).read_text()).group(1)
            if family in structs_checked:
                continue
            structs_checked.add(family)
            type_name, header = _PARAM_STRUCTS[family]
            checks = [f"static_assert(sizeof({type_name}) == {struct.calcsize('@' + signature.format)}, \"size\");"]
            sizes = [128 if letter == "T" else struct.calcsize("@" + letter) for letter in signature.letters]
            checks += [f"static_assert(offsetof({type_name}, {name}) == {offset} && "
                       f"sizeof((({type_name}*)nullptr)->{name}) == {size}, \"{name}\");"
                       for name, offset, size in zip(signature.names, _field_offsets(signature.format), sizes)]  # fmt: skip
            _compile(build, f'#include <cstddef>\n#include "{header}"\n' + "\n".join(checks) + "\n", "_layout")
    assert structs_checked == set(_PARAM_STRUCTS)


def test_nan_in_k_reaches_the_gradients_as_in_torch():
    """The backward's torch path propagates NaN where torch's autograd does (it used to zero those rows),
    and never into the head that does not read the NaN key."""
    from hf_flashpatch.kernels import forward
    from hf_flashpatch.reference import attention_reference

    q = torch.randn(1, 6, 2, 16)
    k, v = torch.randn(1, 6, 2, 16), torch.randn(1, 6, 2, 16)
    k[0, 3, 0, 5] = float("nan")  # key 3 of head 0
    grads = []
    for run in ("ours", "torch"):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        if run == "ours":
            out, _ = forward.attention_forward(qq, kk, v, causal=True, softmax_scale=None, window_left=-1,
                                               window_right=0, softcap=None, torch_fallback=True)  # fmt: skip
        else:
            out, _ = attention_reference(qq, kk, v, causal=True)
        out.sum().backward()
        grads.append((torch.isnan(qq.grad), torch.isnan(kk.grad)))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    assert grads[0][0][0, 3:, 0].all() and not grads[0][0][0, :, 1].any()
