"""Head dims up to 256 that no kernel build takes (16, 48, 80 as in Phi-2 and StableLM, 160), on CPU: the forward and
backward ops pad q/k/v with zero columns to the next build head dim (:mod:`hf_flashpatch.kernels.value_head_dim`)
and the result is exact. Layout q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``, out ``(B, S_q, H, D)``.

Where the kernels would run is faked by ``tests/test_value_head_dim.py``'s ``kernel_device`` fixture (every launch
replaced by the ops' torch path at the head dims it got, and recorded); the CUDA runs are in
``tests/gpu/test_value_head_dim_gpu.py`` (its ``DIMS`` 16 and 80)."""

import pytest
import torch
from test_value_head_dim import kernel_device  # noqa: F401 - a fixture
from value_head_dim_inputs import GRAD_TOL, TOL, cotangent_grads, grad_leaves, random_qkv

import hf_flashpatch as hfp
from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.kernels import backward, forward
from hf_flashpatch.kernels.heuristics import padding_head_dims
from hf_flashpatch.reference import attention_reference, varlen_attention_reference

# head dim: (forward launch head dim, backward launch head dim) on Hopper, where 96 is padded to 128 as well
PADDED = {16: (32, 32), 48: (64, 64), 80: (128, 128), 96: (128, 128), 160: (256, 192)}


@pytest.mark.parametrize("head_dim", list(PADDED))
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_flash_attn_func_pads_a_head_dim_no_build_takes(kernel_device, head_dim, grad):
    """Forward and backward launches at the padded head dim, exact against the oracle at the model's own head dim
    (its scale ``1/sqrt(D)``, not the padded one's); inference asks the decode kernel first, at the model's dims."""
    q, k, v = random_qkv(seqlen_q=3, seqlen_k=17, dims=(head_dim, head_dim))
    leaves = grad_leaves(q, k, v) if grad else [q, k, v]
    out, lse = hfp.flash_attn_func(*leaves, causal=True, window=(9, 0), softcap=4.0, return_lse=True)
    ref_leaves = grad_leaves(q, k, v)
    ref_out, ref_lse = attention_reference(*ref_leaves, causal=True, window=(9, 0), softcap=4.0)
    assert out.shape == q.shape and out.is_contiguous()
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    fwd, bwd = PADDED[head_dim]
    if grad:
        for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out, lse), leaves), cotangent_grads((ref_out, ref_lse), ref_leaves)):
            assert g.shape == w.shape, name
            torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
        assert kernel_device == [("forward", fwd, fwd, fwd), ("backward", bwd, bwd, bwd)]
    else:
        assert kernel_device == [("decode", head_dim, head_dim, head_dim), ("forward", fwd, fwd, fwd)]


def test_varlen_pads_a_head_dim_no_build_takes(kernel_device):
    q, k, v = random_qkv(batch=1, seqlen_q=12, seqlen_k=12, dims=(80, 80), packed=True)  # (12, H, 80)
    cu = torch.tensor([0, 1, 12], dtype=torch.int32)
    leaves = grad_leaves(q, k, v)
    out = hfp.flash_attn_varlen_func(*leaves, cu, cu, 11, 11, causal=True)
    ref_leaves = grad_leaves(q, k, v)
    ref_out, _ = varlen_attention_reference(*ref_leaves, cu, cu, causal=True)
    torch.testing.assert_close(out, ref_out, **TOL)
    for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out,), leaves), cotangent_grads((ref_out,), ref_leaves)):
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
    assert kernel_device == [("forward", 128, 128, 128), ("backward", 128, 128, 128)]


def test_head_dims_above_256_are_refused_by_name():
    """The kernels' head-dim rule: every head dim up to 256 is served (padded where no build takes it), none above;
    the refusal names the shapes received (the public API then takes the torch fallback)."""
    q, k, v = (t.bfloat16() for t in random_qkv(dims=(80, 80)))
    with pytest.raises(KernelUnsupported, match="one CUDA device"):  # 80 passes the head-dim check
        forward._check_supported(q, k, v)
    q, k, v = (t.bfloat16() for t in random_qkv(dims=(264, 264)))
    with pytest.raises(KernelUnsupported, match=r"head dims up to 256 .*got q \(2, 9, 4, 264\), k \(2, 13, 2, 264\)"):
        forward._check_supported(q, k, v)
    assert forward.needs_padding(torch.zeros(1, 1, 1, 80), torch.zeros(1, 1, 1, 80))
    assert not forward.needs_padding(torch.zeros(1, 1, 1, 64), torch.zeros(1, 1, 1, 64))
    assert forward.needs_padding(torch.zeros(1, 1, 1, 192), torch.zeros(1, 1, 1, 128))  # CPU: no native pair


def test_padding_widths_skip_96_on_hopper_but_for_a_deterministic_backward():
    """The decision room's rule: 80 and 96 pad to 128 on Hopper (the wgmma bodies), to 96 elsewhere and in a
    deterministic backward (whose one body serves 128 no faster); a build's own head dim is never padded elsewhere."""
    built = forward.SUPPORTED_HEAD_DIMS
    assert padding_head_dims(built, "sm_90a") == (32, 64, 128, 256)
    assert padding_head_dims(built, "sm_80") == padding_head_dims(built, None) == built
    assert padding_head_dims(backward.SUPPORTED_HEAD_DIMS, "sm_90a", deterministic=True) == backward.SUPPORTED_HEAD_DIMS


@pytest.mark.parametrize("head_dim", list(PADDED))
def test_backward_config_is_the_padded_head_dims(kernel_device, head_dim):
    q, k, v = random_qkv(dims=(head_dim, head_dim))
    cfg = backward.check_supported(q, k, v, 0.0)
    assert (cfg.head_dim, cfg.head_dim_v) == (PADDED[head_dim][1], None)
    assert backward.check_supported(*random_qkv(dims=(64, 64)), 0.0).head_dim == 64  # a build's own head dim stays
    deterministic = backward.check_supported(q, k, v, 0.0, deterministic=True)  # the per-warp body keeps 96
    assert deterministic.head_dim == (96 if head_dim in (80, 96) else PADDED[head_dim][1])
    with pytest.raises(KernelUnsupported, match="head_dim must be one of"):
        backward.check_supported(*random_qkv(dims=(264, 264)), 0.0)
