"""A value head dim of its own (``D_v != D``) on CPU through every API form: the batched, decode, paged and compiled
forms against the fp32 oracle, the references against each other, and the input checks' messages.

Layout (batch, seqlen, heads, head_dim): q ``(B, S_q, H, D)``, k ``(B, S_k, H_kv, D)``, v ``(B, S_k, H_kv, D_v)``,
out ``(B, S_q, H, D_v)``. The padded route and the kernels' native pairs: ``test_value_head_dim.py``.
"""

import functools

import pytest
import torch

import hf_flashpatch as hfp
from hf_flashpatch import api
from hf_flashpatch.kernels import backward_torch, forward_torch
from hf_flashpatch.reference import attention_reference, attention_tiled, varlen_attention_reference
from value_head_dim_inputs import GRAD_TOL, TOL, cotangent_grads, grad_leaves, random_qkv


# ------------------------------------------------------------------------------------ CPU: every API form


@pytest.mark.parametrize("kwargs", [dict(causal=False), dict(causal=True, window=(3, 0)),
                                    dict(causal=True, softcap=5.0)])  # fmt: skip
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
def test_cpu_fallback_of_every_batched_form_matches_the_oracle(kwargs, heads):
    q, k, v = random_qkv(seqlen_q=7, seqlen_k=11, heads=heads[0], kv_heads=heads[1], dims=(24, 8))
    ref_out, ref_lse = attention_reference(q, k, v, **kwargs)
    out, lse = hfp.flash_attn_func(q, k, v, return_lse=True, **kwargs)  # the tiled reference
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(lse, ref_lse, **TOL)
    torch.testing.assert_close(hfp.flash_attn_func(q, k, v, **kwargs), ref_out, **TOL)  # sdpa where exact
    one = q[:, -1:]
    want, _ = attention_reference(one, k, v, **{**kwargs, "causal": True})
    torch.testing.assert_close(hfp.flash_attn_with_kvcache(one, k, v, **kwargs), want, **TOL)
    empty = hfp.flash_attn_with_kvcache(one[:0], k[:0], v[:0], return_lse=True)
    assert empty[0].shape == (0, 1, heads[0], 8) and empty[1].shape == (0, heads[0], 1)


def test_cpu_fallback_gradients_match_the_oracle():
    q, k, v = random_qkv(seqlen_q=6, seqlen_k=9, dims=(40, 24))
    leaves, ref_leaves = grad_leaves(q, k, v), grad_leaves(q, k, v)
    out, lse = hfp.flash_attn_func(*leaves, causal=True, return_lse=True)
    ref_out, ref_lse = attention_reference(*ref_leaves, causal=True)
    for name, g, w in zip(["dq", "dk", "dv"], cotangent_grads((out, lse), leaves), cotangent_grads((ref_out, ref_lse), ref_leaves)):
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)


def test_references_and_torch_paths_agree_at_a_value_head_dim_of_their_own():
    """naive, tiled, the ops' torch forward and torch backward: one function, D_v != D included."""
    q, k, v = random_qkv(seqlen_q=10, seqlen_k=14, dims=(24, 40))
    scale = 24**-0.5
    naive, naive_lse = attention_reference(q, k, v, causal=True, window=(5, 0))
    tiled, tiled_lse = attention_tiled(q, k, v, causal=True, window=(5, 0), block_m=4, block_n=4)
    torch_out, torch_lse = forward_torch.attention_with_lse(q, k, v, scale, 5, 0, 0.0)
    for out, lse in ((tiled, tiled_lse), (torch_out, torch_lse)):
        assert out.shape == naive.shape == (2, 10, 4, 40)
        torch.testing.assert_close(out, naive, **TOL)
        torch.testing.assert_close(lse, naive_lse, **TOL)
    leaves = grad_leaves(q, k, v)
    ref_out, _ = attention_reference(*leaves, causal=True, window=(5, 0))
    dout = torch.randn(ref_out.shape)
    want = torch.autograd.grad(ref_out, leaves, dout)
    got = backward_torch.torch_backward(dout, q, k, v, naive, naive_lse, None, None, None, scale, 5, 0, 0.0)
    for name, g, w in zip(["dq", "dk", "dv"], got, want):
        torch.testing.assert_close(g, w, **GRAD_TOL, msg=name)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    packed_out, _ = forward_torch.varlen_attention_with_lse(q[0], k[0, :10], v[0, :10], cu, cu, scale, -1, 0, 0.0)
    want_packed, _ = varlen_attention_reference(q[0], k[0, :10], v[0, :10], cu, cu, causal=True)
    torch.testing.assert_close(packed_out, want_packed, **TOL)


# ------------------------------------------------------------------------------------ input checks


@pytest.mark.parametrize(
    "shapes, error, match",
    [
        (((2, 5, 4, 16), (2, 7, 2, 16), (2, 6, 2, 8)), ValueError,
         r"k and v must have the same shape except the last dim .*got \(2, 7, 2, 16\) and \(2, 6, 2, 8\)"),
        (((2, 5, 4, 16), (2, 7, 2, 16), (2, 7, 1, 8)), ValueError, r"except the last dim"),
        (((2, 5, 4, 16), (2, 7, 2, 16), (2, 7, 2, 0)), ValueError,
         r"head_dim must be in 1\.\.256, got 0 \(v's head_dim"),
        (((2, 5, 4, 16), (2, 7, 2, 16), (2, 7, 2, 320)), ValueError,
         r"got 320 \(v's head_dim, v shape \(2, 7, 2, 320\)"),
        (((2, 5, 4, 16), (2, 7, 2, 12), (2, 7, 2, 16)), ValueError, r"q and k must have the same head_dim"),
    ],
)  # fmt: skip
def test_bad_value_shapes_name_what_was_received(shapes, error, match):
    q, k, v = (torch.randn(*s) for s in shapes)
    with pytest.raises(error, match=match):
        hfp.flash_attn_func(q, k, v)


def test_bad_paged_pools_name_what_was_received():
    q = torch.randn(1, 1, 4, 16)
    table, lens = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"v_pages \(num_pages, page_size, H_kv, D_v\), got \(3, 4, 2, 16\) and "
                                         r"\(3, 2, 2, 8\)"):  # fmt: skip
        hfp.flash_attn_paged_decode(q, torch.randn(3, 4, 2, 16), torch.randn(3, 2, 2, 8), table, lens)
    out = hfp.flash_attn_paged_decode(q, torch.randn(3, 4, 2, 16), torch.randn(3, 4, 2, 8), table, lens)
    assert out.shape == (1, 1, 4, 8)


def test_the_decode_op_takes_a_value_head_dim_of_its_own():
    """The compile-safe decode op (its fake gives v's head dim) serves D_v != D with its torch path here."""
    q, k, v = random_qkv(seqlen_q=1, dims=(24, 16))
    out, lse = api.decode_op(q, k, v, None, None, softmax_scale=None, softcap=None, window_left=-1, window_right=0)
    want, want_lse = attention_reference(q, k, v, causal=True)
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(lse, want_lse, **TOL)
    compiled = torch.compile(lambda q, k, v: api.decode_op(q, k, v, None, None, softmax_scale=None, softcap=None,
                                                           window_left=-1, window_right=0)[0],
                             fullgraph=True, backend="aot_eager")  # fmt: skip
    torch.testing.assert_close(compiled(q, k, v), want, **TOL)
    out, lse = api.attention_op(q, k, v, causal=True, softmax_scale=None, softcap=None, window_left=-1,
                                window_right=-1)  # fmt: skip
    torch.testing.assert_close(out, want, **TOL)
    torch.testing.assert_close(lse, want_lse, **TOL)


def test_the_forward_op_compiles_whole_with_a_value_head_dim_of_its_own():
    """attention_op under torch.compile(fullgraph=True): one op, its fake giving v's head dim."""
    q, k, v = random_qkv(dims=(24, 16))
    op = functools.partial(api.attention_op, causal=True, softmax_scale=None, softcap=None, window_left=-1,
                           window_right=-1)  # fmt: skip
    compiled = torch.compile(lambda q, k, v: op(q, k, v)[0], fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v), attention_reference(q, k, v, causal=True)[0], **TOL)
