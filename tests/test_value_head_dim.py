"""A value head dim of its own (``D_v != D``, multi-head latent attention) on CPU: the zero-padding route that
serves it on the kernels, and the kernels' native pairs (192/128). Every API form, the references and the input
checks: ``test_value_head_dim_api.py``.

Layout (batch, seqlen, heads, head_dim): q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``,
out ``(B, S_q, H, D_v)``. The padded route is run with the forward op's torch path standing in for the kernel
(the op picks it on CPU: the same op, autograd and backward the GPU runs) and compared, forward and gradients,
with the fp32 oracle at the native dims. Where the kernels would run is faked by monkeypatching
``kernels_unavailable_reason``; the CUDA runs are in ``tests/gpu/test_value_head_dim_gpu.py``.
"""

import math

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch import api
from hf_flashpatch.kernels import backward_torch, decode, forward, forward_torch, tma
from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.reference import attention_reference, normalize_window, varlen_attention_reference
from hf_flashpatch.sinks import add_sinks
from hf_flashpatch.kernels.heuristics import BACKWARD_HEAD_DIMS
from hf_flashpatch.kernels.value_head_dim import padded_attention, padded_head_dim
from value_head_dim_inputs import GRAD_TOL, TOL, cotangent_grads, grad_leaves, random_qkv

DIMS = [(192, 128), (96, 64), (64, 32), (128, 256)]  # (q/k head dim, v head dim); DeepSeek-V3's first
FORWARD_HEAD_DIMS = forward.SUPPORTED_HEAD_DIMS


# ------------------------------------------------------------------------------------ the padded route

CASES = {  # name: (batch kwargs of random_qkv, attention kwargs)
    "mha": (dict(heads=3, kv_heads=3), dict(causal=False)),
    "gqa causal": (dict(), dict(causal=True)),
    "mqa window": (dict(kv_heads=1), dict(causal=True, window=(4, 0))),
    "gqa softcap": (dict(), dict(causal=True, softcap=3.0)),
    "gqa sinks": (dict(), dict(causal=True, sinks=True)),
}


def _route_kwargs(attention):
    left, right = normalize_window(attention.get("window"), attention["causal"])
    return dict(causal=attention["causal"], window_left=left, window_right=right, softcap=attention.get("softcap"))


def _recording_torch_kernel(calls):
    """The forward op with its torch path (what serves the op on CPU), recording the shapes and scale it got."""

    def attend(q, k, v, **kwargs):
        calls.append((q.shape[-1], k.shape[-1], v.shape[-1], kwargs["softmax_scale"]))
        return forward.attention_forward(q, k, v, torch_fallback=True, **kwargs)

    return attend


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}-{d[1]}")
@pytest.mark.parametrize("case", list(CASES))
def test_padded_route_is_exact_forward_and_gradients(dims, case):
    """out, lse, dq, dk, dv (and dsinks) of the padded route equal the oracle's at the native head dims; the
    kernel gets one head dim P (the smallest kernel head dim >= both) and the scale 1/sqrt(D), not 1/sqrt(P)."""
    shape, attention = CASES[case]
    q, k, v = random_qkv(dims=dims, **shape)
    sinks = torch.randn(q.shape[2], generator=torch.Generator().manual_seed(9)) if attention.get("sinks") else None
    leaves = grad_leaves(q, k, v) + ([] if sinks is None else grad_leaves(sinks))
    calls = []
    out, lse = padded_attention(_recording_torch_kernel(calls), *leaves[:3], kernel_head_dims=FORWARD_HEAD_DIMS,
                                softmax_scale=None, **_route_kwargs(attention))  # fmt: skip
    if sinks is not None:
        out, lse = add_sinks(out, lse, leaves[3])
    ref_leaves = grad_leaves(q, k, v) + ([] if sinks is None else grad_leaves(sinks))
    ref_sinks = None if sinks is None else ref_leaves[3]
    ref_out, ref_lse = attention_reference(*ref_leaves[:3], causal=attention["causal"], window=attention.get("window"),
                                           softcap=attention.get("softcap"), sinks=ref_sinks)  # fmt: skip
    padded = padded_head_dim(*dims, FORWARD_HEAD_DIMS)
    assert calls == [(padded, padded, padded, 1.0 / math.sqrt(dims[0]))]
    assert out.shape == (*q.shape[:3], dims[1]) and out.is_contiguous()
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    got = cotangent_grads((out, lse), leaves)
    want = cotangent_grads((ref_out, ref_lse), ref_leaves)
    for name, g, w in zip(["dq", "dk", "dv", "dsinks"], got, want):
        assert g.shape == w.shape, name
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)


@pytest.mark.parametrize("dims", DIMS, ids=lambda d: f"{d[0]}-{d[1]}")
def test_padded_route_varlen_is_exact(dims):
    """Packed sequences of lengths 5, 1 and 7 (and two padding rows past cu_seqlens[-1]) through the varlen op."""
    q, k, v = random_qkv(batch=1, seqlen_q=15, seqlen_k=15, heads=4, kv_heads=2, dims=dims, packed=True)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    leaves = grad_leaves(q, k, v)
    calls = []
    out, lse = padded_attention(_recording_torch_kernel(calls), *leaves, kernel_head_dims=FORWARD_HEAD_DIMS,
                                softmax_scale=0.1, causal=True,
                                window_left=-1, window_right=0, softcap=None, cu_seqlens_q=cu, cu_seqlens_k=cu,
                                max_seqlen_q=7, max_seqlen_k=7)  # fmt: skip
    ref_leaves = grad_leaves(q, k, v)
    ref_out, ref_lse = varlen_attention_reference(*ref_leaves, cu, cu, causal=True, softmax_scale=0.1)
    assert calls[0][3] == 0.1  # an explicit scale passes through
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    assert torch.equal(out[13:], torch.zeros_like(out[13:]))
    for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out,), leaves), cotangent_grads((ref_out,), ref_leaves)):
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)


def test_padded_head_dim_is_the_smallest_kernel_head_dim_that_fits():
    assert FORWARD_HEAD_DIMS == (32, 64, 96, 128, 256) and BACKWARD_HEAD_DIMS == (32, 64, 96, 128, 192, 256)
    assert [padded_head_dim(*d, FORWARD_HEAD_DIMS) for d in DIMS] == [256, 96, 64, 256]  # 96/64: only v is padded
    assert [padded_head_dim(*d, BACKWARD_HEAD_DIMS) for d in DIMS] == [192, 96, 64, 256]  # 192/128: v only, to 192
    assert padded_head_dim(24, 16, FORWARD_HEAD_DIMS) == 32 and padded_head_dim(1, 1, FORWARD_HEAD_DIMS) == 32
    assert padded_head_dim(300, 16, FORWARD_HEAD_DIMS) == 300  # none that large: the kernels decline
    with pytest.raises(ValueError, match=r"q and k must share a head dim, got q \(1, 2, 2, 8\) and k \(1, 2, 2, 4\)"):
        padded_attention(None, torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 4),
                         kernel_head_dims=FORWARD_HEAD_DIMS, softmax_scale=None)  # fmt: skip


# ------------------------------------------------------------------------------------ the public API


@pytest.fixture
def kernel_device(monkeypatch):
    """The API as it runs where the kernels do, on CPU: every kernel launch is replaced by the ops' torch path at
    the head dims the launch got, and recorded as ``(kind, D_q, D_k, D_v)``: "forward" / "backward" launches,
    and "decode" tries (which decline, so the forward serves the call)."""
    from hf_flashpatch.kernels import backward

    launches = []
    monkeypatch.setattr(api, "kernels_unavailable_reason", lambda tensor: None)
    monkeypatch.setattr(forward, "kernels_unavailable_reason", lambda tensor: None)
    monkeypatch.setattr(backward, "kernels_unavailable_reason", lambda tensor: None)
    monkeypatch.setattr(forward, "_check_supported", lambda q, k, v: None)  # its head-dim rules: tests below
    monkeypatch.setattr(forward, "arch_of", lambda q: "sm_90a")  # the padding widths of Hopper (no 96)
    monkeypatch.setattr(backward, "device_arch", lambda device: "sm_90a")
    real_choose = backward.BackwardConfig.choose  # the shipped config of the head dim, whatever the test's dtype
    monkeypatch.setattr(backward.BackwardConfig, "choose", staticmethod(
        lambda head_dim, dtype, *args, **kwargs: real_choose(head_dim, torch.bfloat16, *args, **kwargs)))

    def launch(q, k, v, cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, shape=None):
        launches.append(("forward", q.shape[-1], k.shape[-1], v.shape[-1]))
        left, right = normalize_window((left, right), causal)
        if cu_q is not None:
            return forward_torch.varlen_attention_with_lse(q, k, v, cu_q, cu_k, scale, left, right, softcap)
        return forward_torch.attention_with_lse(q, k, v, scale, left, right, softcap)

    def kernel_backward(cfg, dout, q, k, v, out, lse, dlse, cu_q, cu_k, max_q, max_k, scale, left, right, softcap,
                        deterministic):  # fmt: skip
        launches.append(("backward", q.shape[-1], k.shape[-1], v.shape[-1]))
        assert cfg.head_dim == q.shape[-1] and (cfg.head_dim_v or cfg.head_dim) == v.shape[-1]
        return backward_torch.torch_backward(dout, q, k, v, out, lse, dlse, cu_q, cu_k, scale, left, right, softcap)

    def decline_decode(q, k, v, *args, **kwargs):
        launches.append(("decode", q.shape[-1], k.shape[-1], v.shape[-1]))
        raise KernelUnsupported("decode kernel faked away")

    monkeypatch.setattr(forward, "_launch", launch)
    monkeypatch.setattr(backward, "_kernel_backward", kernel_backward)
    for name in ("decode_forward", "paged_decode_forward", "slot_varlen_forward"):
        monkeypatch.setattr(decode, name, decline_decode)
    monkeypatch.setattr(api, "_warned", set())
    return launches


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_flash_attn_func_on_a_kernel_device_pads_inside_the_op(kernel_device, grad):
    """A pair without a native kernel: the forward launch and the backward launch both get zero-padded inputs
    (48/32 -> 64); inference tries the decode kernel first, at the native dims."""
    q, k, v = random_qkv(seqlen_q=2, seqlen_k=17, dims=(48, 32))
    leaves = grad_leaves(q, k, v) if grad else [q, k, v]
    sinks = torch.randn(q.shape[2])
    out, lse = hfp.flash_attn_func(*leaves, causal=True, softcap=4.0, sinks=sinks, return_lse=True)
    ref_leaves = grad_leaves(q, k, v)
    ref_out, ref_lse = attention_reference(*ref_leaves, causal=True, softcap=4.0, sinks=sinks)
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    if grad:
        for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out, lse), leaves), cotangent_grads((ref_out, ref_lse), ref_leaves)):
            torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
    want = [("forward", 64, 64, 64), ("backward", 64, 64, 64)] if grad else [("decode", 48, 48, 32),
                                                                               ("forward", 64, 64, 64)]  # fmt: skip
    assert kernel_device == want


@pytest.fixture
def hopper_pairs(monkeypatch):
    """The kernel device is a Hopper GPU: the pairs of HOPPER_VALUE_HEAD_DIM_SHAPES have a native kernel."""
    from hf_flashpatch.kernels.heuristics import native_value_head_dim

    monkeypatch.setattr(forward, "native_value_head_dim_for",
                        lambda q, v: native_value_head_dim(q.shape[-1], v.shape[-1], "sm_90a"))  # fmt: skip


@pytest.mark.parametrize("grad", [False, True, "softcap", "deterministic"])
def test_native_pair_takes_the_unpadded_forward_and_backward(kernel_device, hopper_pairs, grad):
    """192/128 on Hopper: the forward kernel runs at the native dims, for training too, and so does the backward
    but with softcap or ``deterministic=True`` (the gradients then run on v, out and dout zero-padded to 192).
    Other pairs are padded either way."""
    q, k, v = random_qkv(seqlen_q=5, seqlen_k=11, dims=(192, 128))
    leaves = grad_leaves(q, k, v) if grad else [q, k, v]
    attn = dict(causal=True, softcap=4.0 if grad == "softcap" else None, deterministic=grad == "deterministic")
    out = hfp.flash_attn_func(*leaves, **attn)
    ref_leaves = grad_leaves(q, k, v)
    ref_out, _ = attention_reference(*ref_leaves, causal=True, softcap=attn["softcap"])
    torch.testing.assert_close(out, ref_out, **TOL)
    if grad:
        for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out,), leaves), cotangent_grads((ref_out,), ref_leaves)):
            torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
    forward_launch = ("forward", 192, 192, 128)
    tried = ("decode", 192, 192, 128)  # few queries, no gradients: the decode kernel is asked first (and declines)
    backward_launch = ("backward", 192, 192, 128) if grad is True else ("backward", 192, 192, 192)
    assert kernel_device == ([forward_launch, backward_launch] if grad else [tried, forward_launch])
    if grad:
        return  # the inference routes below are the same whatever the backward does
    kernel_device.clear()
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    packed = [t.reshape(-1, *t.shape[2:])[:9] for t in (q, k, v)]  # (T, H, D | D_v)
    with torch.no_grad():
        hfp.flash_attn_varlen_func(*packed, cu, cu, 5, 5, causal=True)
        hfp.flash_attn_func(*random_qkv(dims=(96, 64)), causal=True)  # no native kernel for this pair
    assert kernel_device == [forward_launch, ("decode", 96, 96, 64), ("forward", 128, 128, 128)]  # Hopper: no 96


def test_forward_launch_at_a_native_pair(monkeypatch):
    """The launch at 192/128: the warp-specialised build with HEAD_DIM_V, out with v's head dim; refused off
    Hopper and for pairs no kernel takes."""
    from launch_recorder import RecordingKernel

    launched, built = [], []
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(forward, "sm_count", lambda device: 132)
    monkeypatch.setattr(forward, "get_kernel", lambda build, entry, device: built.append(build)
                        or RecordingKernel(entry, launched))  # fmt: skip
    monkeypatch.setattr(forward, "aligned", lambda t: t)
    mapped = []  # the tensor maps of K, V and Q (no driver here): (tensor, box rows, box heads)
    monkeypatch.setattr(tma, "descriptor", lambda t, rows, box_heads=1: mapped.append((t, rows, box_heads))
                        or bytes([len(mapped)]) * 128)  # fmt: skip
    q, k, v = (t.bfloat16() for t in random_qkv(seqlen_q=70, seqlen_k=70, dims=(192, 128)))
    with pytest.raises(KernelUnsupported, match="one CUDA device"):  # the pair passes the head-dim check
        forward._check_supported(q, k, v)
    monkeypatch.setattr(forward, "_check_supported", lambda *tensors: None)
    out, lse = forward._launch(q, k, v, None, None, 0, 0, None, True, -1, -1, 0.0)
    assert out.shape == (*q.shape[:-1], 128) and lse.shape == (2, 4, 70)
    ((entry, grid, args),) = launched
    # K and V in boxes of a key tile; the 192/128 shape's math warps copy their Q rows (no map) and store their output
    # rows by boxes of group (2) heads x 8 positions
    # (the output's map first: whether the chained walk serves depends on it)
    assert [(t.shape, rows, heads) for t, rows, heads in mapped[:1]] == [((2, 70, 4, 128), 8, 2)]
    assert [(t is k, t is v, rows, heads) for t, rows, heads in mapped[1:]] == [(True, False, 64, 1), (False, True, 64, 1)]
    # FwdParams.k_tma, v_tma, q_tma, o_tma
    assert args[:4] == (bytes([2]) * 128, bytes([3]) * 128, tma.NO_DESCRIPTOR, bytes([1]) * 128)
    # FwdParams.q_box_heads, o_box_heads, leading_rows: none with output boxes (140 packed rows on 128-row tiles would
    # lead by one 64-row warpgroup, but a box before the sequence faults the TMA)
    assert args[-7:] == (0, 2, 0, 0, None, None, None)  # the split round's: none (not the chained walk), no list
    defines = dict(built[0].defines)
    assert entry == "hfp_attention_forward_sm90_ws" and built[0].source == "fwd_hopper_ws.cu"
    assert (defines["HEAD_DIM"], defines["HEAD_DIM_V"], defines["BLOCK_N"]) == ("192", "128", "64")
    assert grid == (math.ceil(70 * 2 / 128) * 2 * 2, 1, 1)  # persistent: every work tile, fewer than the SMs
    monkeypatch.setattr(forward, "device_arch", lambda device: "sm_80")
    with pytest.raises(KernelUnsupported, match="192 / 128 on sm_80"):
        forward._launch(q, k, v, None, None, 0, 0, None, True, -1, -1, 0.0)
    monkeypatch.undo()
    with pytest.raises(KernelUnsupported, match="one CUDA device"):  # 192/64 passes too: it pads to 256
        forward._check_supported(q, k, v[..., :64])


def test_backward_launch_at_a_native_pair(monkeypatch):
    """The backward at 192/128 on Hopper: the wgmma build with HEAD_DIM_V, the preprocess over out's 128 columns,
    dQ's fp32 workspace at 192, dK at 192 and dV at 128, 128-key blocks; refused for what the build does not take."""
    from launch_recorder import RecordingKernel

    from hf_flashpatch.kernels import backward

    launched, built = [], []
    monkeypatch.setattr(backward, "get_kernel", lambda build, entry, device: built.append(build)
                        or RecordingKernel(entry, launched))  # fmt: skip
    monkeypatch.setattr(backward, "sm_count", lambda device: 132)
    monkeypatch.setattr(backward.tma, "reduce_descriptor", lambda t: bytes(128))  # the TMA maps (no driver here)
    monkeypatch.setattr(backward.tma, "descriptor", lambda t, rows: bytes(128))
    monkeypatch.setattr(backward.tma, "stats_descriptor", lambda t, rows: bytes(128))
    q, k, v = (t.bfloat16() for t in random_qkv(seqlen_q=70, seqlen_k=300, dims=(192, 128)))  # (2, S, 4 | 2, D | D_v)
    out, dout = (torch.zeros(*q.shape[:-1], 128, dtype=torch.bfloat16) for _ in range(2))
    lse = torch.zeros(2, 4, 70)
    cfg = backward.BackwardConfig.choose(192, torch.bfloat16, False, "sm_90a", head_dim_v=128)
    dq, dk, dv = backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 70, 300, 0.1, -1, 0, 0.0, False)
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert [entry for entry, _grid, _args in launched] == ["bwd_preprocess", "bwd_dkdv_dq_atomic", "bwd_convert_dq"]
    defines = dict(built[0].defines)
    assert (defines["HEAD_DIM"], defines["HEAD_DIM_V"], defines["BWD_WGMMA"], defines["HAS_SOFTCAP"]) == (
        "192", "128", "1", "0")
    (_entry, grid, args) = launched[1]
    assert sorted(grid) == [2, 2, math.ceil(300 / 128)]  # (kv heads, key blocks, batch) in either order
    dq_accum = args[10]  # after the four tensor maps and q, k, v, dout, lse2, D
    assert dq_accum.shape[-1] == 192 and dq_accum.dtype == torch.float32
    with pytest.raises(KernelUnsupported, match="does not take"):  # v padded to 192 is not this build's v
        backward._kernel_backward(cfg, dout, q, k, torch.zeros_like(k), out, lse, None, None, None, 70, 300, 0.1, -1, 0,
                                  0.0, False)  # fmt: skip
    with pytest.raises(KernelUnsupported, match="does not take"):  # no deterministic pair at 192/128
        backward._kernel_backward(cfg, dout, q, k, v, out, lse, None, None, None, 70, 300, 0.1, -1, 0, 0.0, True)
    with pytest.raises(ValueError, match="192 / 128 on sm_90a"):  # softcap: the padded route
        backward.BackwardConfig.choose(192, torch.bfloat16, True, "sm_90a", head_dim_v=128)
    with pytest.raises(ValueError, match="192 / 128 on sm_80"):
        backward.BackwardConfig.choose(192, torch.bfloat16, False, "sm_80", head_dim_v=128)


def test_native_pair_configs():
    cfg = forward.ForwardConfig.for_problem(192, "bf16", True, arch="sm_90a", head_dim_v=128)
    assert cfg.wgmma and cfg.value_dim == 128 and cfg.block_n == 64
    assert forward.ForwardConfig.for_problem(128, "bf16", True, arch="sm_90a", head_dim_v=128).head_dim_v is None
    with pytest.raises(ValueError, match="192 / 128 on sm_80"):
        forward.ForwardConfig.for_problem(192, "bf16", True, arch="sm_80", head_dim_v=128)
    with pytest.raises(ValueError, match="invalid wgmma tile"):  # no producer warpgroup
        forward.ForwardConfig(192, "bf16", 128, 64, 8, wgmma=True, head_dim_v=128)
    with pytest.raises(ValueError, match="one head dim"):
        forward.ForwardConfig(64, "bf16", 128, 64, 4, head_dim_v=32)
    sm90 = {dict(b.defines)["HEAD_DIM_V"] for b in forward.all_builds("sm_90a") if dict(b.defines)["HEAD_DIM"] == "192"}
    assert sm90 == {"128"} and not any(dict(b.defines)["HEAD_DIM"] == "192" for b in forward.all_builds("sm_80"))


def test_varlen_on_a_kernel_device_takes_the_padded_forward(kernel_device):
    q, k, v = random_qkv(batch=1, seqlen_q=12, seqlen_k=12, dims=(96, 64), packed=True)
    cu = torch.tensor([0, 4, 12], dtype=torch.int32)
    leaves = grad_leaves(q, k, v)
    out = hfp.flash_attn_varlen_func(*leaves, cu, cu, 8, 8, causal=True, window=(2, 0))
    ref_leaves = grad_leaves(q, k, v)
    ref_out, _ = varlen_attention_reference(*ref_leaves, cu, cu, causal=True, window=(2, 0))
    torch.testing.assert_close(out, ref_out, **TOL)
    for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out,), leaves), cotangent_grads((ref_out,), ref_leaves)):
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
    assert kernel_device == [("forward", 128, 128, 128), ("backward", 128, 128, 128)]  # Hopper pads past 96


@pytest.fixture
def decode_recorder(monkeypatch):
    """The decode kernels' builds and launches where they would run (arguments packed against ``cuda/``)."""
    from launch_recorder import RecordingKernel

    built, launched = [], []
    monkeypatch.setattr(api, "kernels_unavailable_reason", lambda tensor: None)
    monkeypatch.setattr(decode, "kernels_unavailable_reason", lambda tensor: None)
    monkeypatch.setattr(decode, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "get_kernel", lambda build, entry, device: built.append(build)
                        or RecordingKernel(entry, launched))  # fmt: skip
    monkeypatch.setattr(api, "_warned", set())
    decode.decode_plan.cache_clear()  # plans hold the kernels they were made with
    yield built, launched
    decode.decode_plan.cache_clear()


def test_decode_kernels_take_192_128_at_the_native_dims(decode_recorder):
    """Contiguous, paged and slot decode at q/k 192, v 128: the HEAD_DIM_V build, out and the split workspace at
    v's head dim, nothing padded."""
    built, launched = decode_recorder
    q, k_cache, v_cache = (t.bfloat16() for t in random_qkv(batch=3, seqlen_q=1, seqlen_k=4096, dims=(192, 128)))
    lens = torch.tensor([4096, 3, 7], dtype=torch.int32)
    out = hfp.flash_attn_with_kvcache(q, k_cache, v_cache, lens)
    page_table = torch.arange(3 * 256, dtype=torch.int32).view(3, 256)  # pages of 16
    paged = hfp.flash_attn_paged_decode(q, k_cache.reshape(768, 16, 2, 192), v_cache.reshape(768, 16, 2, 128),
                                        page_table, lens, check_inputs=False)  # fmt: skip
    slots = torch.arange(3 * 4096)
    cu_k = torch.tensor([0, 4096, 8192, 12288], dtype=torch.int32)
    cu_q = torch.arange(4, dtype=torch.int32)
    slot = hfp.flash_attn_slot_varlen_func(q[:, 0], k_cache.reshape(-1, 2, 192), v_cache.reshape(-1, 2, 128), slots,
                                           cu_q, cu_k, 1, 4096, causal=True, check_inputs=False)  # fmt: skip
    assert out.shape == paged.shape == (3, 1, 4, 128) and slot.shape == (3, 4, 128)
    splits = [args for entry, _grid, args in launched if entry == "hfp_decode_split"]
    assert len(splits) == 3 and {dict(b.defines)["HEAD_DIM_V"] for b in built} == {"128"}
    assert {dict(b.defines)["HEAD_DIM"] for b in built} == {"192"}
    o_parts = [a for args in splits for a in args if isinstance(a, torch.Tensor) and a.dim() == 4 and a.dtype == torch.float32]
    assert o_parts and all(o.shape[-1] == 128 for o in o_parts)  # (split, flat token, H, D_v)


def test_decode_at_a_pair_without_a_build_takes_the_fallback_with_one_warning(decode_recorder):
    """with_kvcache, paged decode and the slot function decline a pair no decode kernel is built for (padding
    the cache would cost more than the attention) and give the fallback's exact answer, warning once."""
    built, _launched = decode_recorder
    q, k_cache, v_cache = random_qkv(batch=3, seqlen_q=1, seqlen_k=10, dims=(48, 32))
    q, k_cache, v_cache = q.half(), k_cache.half(), v_cache.half()
    lens = torch.tensor([10, 3, 7], dtype=torch.int32)
    with pytest.warns(UserWarning, match=r"decode kernel serves .* got q \(3, 1, 4, 48\), k \(3, 10, 2, 48\), v "
                                         r"\(3, 10, 2, 32\)"):  # fmt: skip
        out = hfp.flash_attn_with_kvcache(q, k_cache, v_cache, lens, softcap=2.0)
        page_table = torch.arange(15, dtype=torch.int32).view(3, 5)  # pages of 2: row b owns pages 5b..5b+4
        paged = hfp.flash_attn_paged_decode(q, k_cache.reshape(15, 2, 2, 48), v_cache.reshape(15, 2, 2, 32),
                                            page_table, lens, softcap=2.0)  # fmt: skip
        slots = torch.cat([torch.arange(b * 10, b * 10 + n) for b, n in enumerate(lens.tolist())])
        cu_k = torch.tensor([0, 10, 13, 20], dtype=torch.int32)
        cu_q = torch.arange(4, dtype=torch.int32)
        slot = hfp.flash_attn_slot_varlen_func(q[:, 0], k_cache.reshape(30, 2, 48), v_cache.reshape(30, 2, 32),
                                               slots, cu_q, cu_k, 1, 10, causal=True, softcap=2.0)  # fmt: skip
    for b, n in enumerate(lens.tolist()):
        want, _ = attention_reference(q[b : b + 1].float(), k_cache[b : b + 1, :n].float(),
                                      v_cache[b : b + 1, :n].float(), causal=True, softcap=2.0)  # fmt: skip
        torch.testing.assert_close(out[b : b + 1].float(), want, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(paged[b : b + 1].float(), want, atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(slot[b].float(), want[0, 0], atol=2e-3, rtol=2e-3)
    assert built == []  # nothing was built or launched: the decode paths never pad
