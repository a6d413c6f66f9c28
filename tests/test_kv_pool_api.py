"""The public KV-pool functions on CPU (the torch path): ``kv_append`` writes rows into their slots and
nothing else; ``flash_attn_slot_varlen_func`` equals varlen attention over the keys gathered through
the slots. Layout (rows, heads, head_dim)."""

import pytest
import torch

from hf_flashpatch import api
from hf_flashpatch.reference import varlen_attention_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_kv_append_writes_kept_rows_only(dtype):
    k_pool, v_pool = torch.randn(10, 2, 8).to(dtype), torch.randn(10, 2, 8).to(dtype)
    k_before, v_before = k_pool.clone(), v_pool.clone()
    k_new, v_new = torch.randn(4, 2, 8).to(dtype), torch.randn(4, 2, 8).to(dtype)
    slots = torch.tensor([3, -1, 9, 0])  # row 1 is padding: it writes nothing
    api.kv_append(k_new, v_new, k_pool, v_pool, slots)
    want_k, want_v = k_before.clone(), v_before.clone()
    want_k[[3, 9, 0]], want_v[[3, 9, 0]] = k_new[[0, 2, 3]], v_new[[0, 2, 3]]
    assert torch.equal(k_pool, want_k) and torch.equal(v_pool, want_v)


def test_kv_append_with_a_value_head_dim_of_its_own():
    """Multi-head latent attention pools: K rows of 24, V rows of 16."""
    k_pool, v_pool = torch.randn(10, 2, 24), torch.randn(10, 2, 16)
    k_before, v_before = k_pool.clone(), v_pool.clone()
    k_new, v_new = torch.randn(3, 2, 24), torch.randn(3, 2, 16)
    api.kv_append(k_new, v_new, k_pool, v_pool, torch.tensor([7, -1, 2]))
    k_before[[7, 2]], v_before[[7, 2]] = k_new[[0, 2]], v_new[[0, 2]]
    assert torch.equal(k_pool, k_before) and torch.equal(v_pool, v_before)


def test_kv_append_kernel_launch_with_narrower_value_rows(monkeypatch):
    """The kernel gets each pool's own row width in 16-byte chunks (K 192 -> 24, V 128 -> 16) and a grid over the
    wider one; its arguments pack against ``cuda/kv_append.cu``."""
    from launch_recorder import RecordingKernel

    from hf_flashpatch.kernels import decode

    launched = []
    monkeypatch.setattr(decode, "get_kernel", lambda build, entry, device: RecordingKernel(entry, launched))
    monkeypatch.setattr(decode, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    k_new, v_new = torch.randn(5, 2, 192).bfloat16(), torch.randn(5, 2, 128).bfloat16()
    k_pool, v_pool = torch.zeros(64, 2, 192).bfloat16(), torch.zeros(64, 2, 128).bfloat16()
    decode._kv_append_impl(k_new, v_new, k_pool, v_pool, torch.arange(5))
    ((entry, _grid, args),) = launched
    assert entry == "hfp_kv_append" and args[-5:] == (5, 2, 24, 16, 64)  # tokens, kv heads, K / V chunks, slots


def test_kv_append_all_padding_and_block_pool_view():
    pages = torch.randn(5, 4, 2, 8)  # (num_pages, page_size, H_kv, D): slot = page * 4 + offset
    before = pages.clone()
    pool = pages.view(-1, 2, 8)
    api.kv_append(torch.randn(2, 2, 8), torch.randn(2, 2, 8), pool, pool.clone(), torch.tensor([-1, -3]))
    assert torch.equal(pages, before)  # nothing kept: not even the anchor slot 0 changes
    new = torch.randn(1, 2, 8)
    api.kv_append(new, new.clone(), pool, torch.zeros_like(pool), torch.tensor([3 * 4 + 2]))
    assert torch.equal(pages[3, 2], new[0]) and torch.equal(pages[:3], before[:3])


def test_kv_append_errors_name_what_was_received():
    pool = torch.zeros(10, 2, 8)
    new = torch.zeros(2, 2, 8)
    with pytest.raises(ValueError, match=r"slots\[1\] = 10 is not a slot of this pool \(valid: 0..9"):
        api.kv_append(new, new, pool, pool.clone(), torch.tensor([0, 10]))
    with pytest.raises(TypeError, match="share a dtype"):
        api.kv_append(new.half(), new.half(), pool, pool.clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"same T, num_slots and H_kv.*got \(2, 2, 8\), \(2, 2, 8\), \(10, 1, 8\)"):
        api.kv_append(new, new, pool[:, :1], pool[:, :1].clone(), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"each pool the head dim of its new rows, got \(2, 2, 8\), \(2, 2, 4\)"):
        api.kv_append(new, new[..., :4], pool, pool.clone(), torch.tensor([0, 1]))  # v rows 4 wide, v pool 8
    with pytest.raises(ValueError, match=r"slots must be \(2,\), got \(3,\)"):
        api.kv_append(new, new, pool, pool.clone(), torch.tensor([0, 1, 2]))
    with pytest.raises(TypeError, match=r"float16, bfloat16 or float32, got \['torch.int32'"):
        api.kv_append(new.int(), new.int(), pool.int(), pool.int(), torch.tensor([0, 1]))
    before = pool.clone()
    with pytest.raises(ValueError, match=r"k_pool and v_pool are the same memory \(shape \(10, 2, 8\)\)"):
        api.kv_append(new + 1, new + 2, pool, pool, torch.tensor([0, 1]))  # V would overwrite K
    assert torch.equal(pool, before)


@pytest.mark.parametrize("causal,softcap", [(True, None), (False, 20.0)])
def test_slot_varlen_matches_gathered_varlen(causal, softcap):
    k_pool, v_pool = torch.randn(40, 2, 16), torch.randn(40, 2, 16)
    lens_q, lens_k = [1, 3, 2], [9, 14, 2]  # a decode step, a prefill chunk over cached keys, a fresh prompt
    slots = torch.randperm(40)[: sum(lens_k)]
    cu_q = torch.tensor([0, 1, 4, 6], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 23, 25], dtype=torch.int32)
    q = torch.randn(7, 4, 16)  # one padding row past cu_q[-1]
    out, lse = api.flash_attn_slot_varlen_func(
        q, k_pool, v_pool, slots, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, softcap=softcap,
        return_lse=True,
    )  # fmt: skip
    ref, ref_lse = varlen_attention_reference(q, k_pool[slots], v_pool[slots], cu_q, cu_k, causal=causal,
                                              softcap=softcap)  # fmt: skip
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    assert torch.all(out[6] == 0)


def test_slot_varlen_refuses_slots_outside_the_pool():
    k_pool = torch.randn(8, 2, 16)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"slots\[1\] = 8 is not a slot of this pool \(valid: 0..7\)"):
        api.flash_attn_slot_varlen_func(torch.randn(2, 4, 16), k_pool, k_pool, torch.tensor([0, 8]), cu, cu, 2, 2)
    with pytest.raises(TypeError, match=r"slots must be a 1-D int32/int64 tensor, got torch.float32"):
        api.flash_attn_slot_varlen_func(torch.randn(2, 4, 16), k_pool, k_pool, torch.zeros(2), cu, cu, 2, 2)


# ------------------------------------------------------------------ misuse found by the 2026-12-05 review


@pytest.mark.parametrize("spoil", ["requires_grad", "inference", "expanded"])
@pytest.mark.parametrize("which", ["k_pool", "v_pool"])
def test_kv_append_refuses_a_pool_it_cannot_write_before_writing_either(spoil, which):
    """Writing K first and failing on V used to leave the K pool changed behind the error; an expanded (stride-0)
    pool used to take every row's write in one place without an error."""
    new, slots = torch.randn(3, 2, 4), torch.tensor([1, 2, 3])
    pools = {"k_pool": torch.zeros(8, 2, 4), "v_pool": torch.zeros(8, 2, 4)}
    if spoil == "requires_grad":
        pools[which].requires_grad_()
        match = f"{which} is \\(a view of\\) a leaf that requires grad"
    elif spoil == "inference":
        with torch.inference_mode():
            pools[which] = torch.zeros(8, 2, 4)
        match = f"{which} was created under torch.inference_mode"
    else:
        pools[which] = torch.zeros(1, 2, 4).expand(8, -1, -1)
        match = rf"{which} must not be an expanded view .* strides \(0, 4, 1\)"
    before = {name: pool.detach().clone() for name, pool in pools.items()}
    with pytest.raises(ValueError, match=match):
        api.kv_append(new, new.clone(), pools["k_pool"], pools["v_pool"], slots)
    for name, pool in pools.items():
        assert torch.equal(pool.detach(), before[name]), name


def test_kv_append_takes_inference_pools_inside_inference_mode_and_strided_views():
    with torch.inference_mode():
        k_pool, v_pool = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
        new = torch.randn(2, 2, 4)
        api.kv_append(new, new, k_pool, v_pool, torch.tensor([5, 0]))
    assert torch.equal(k_pool[5], new[0]) and torch.equal(v_pool[0], new[1])
    blocks = torch.zeros(2, 8, 4, 2, 4)  # (layer, pages, page_size, H_kv, D): one layer's pool is a strided view
    pool = blocks[1].view(32, 2, 4)
    api.kv_append(new, new, pool, blocks[0].view(32, 2, 4), torch.tensor([31, 4]))
    assert torch.equal(blocks[1, 7, 3], new[0]) and torch.equal(blocks[0, 1, 0], new[1])


def test_kv_append_slots_of_another_type_are_named():
    pool = torch.zeros(8, 2, 4)
    with pytest.raises(TypeError, match="slots must be a torch.Tensor, got list"):
        api.kv_append(torch.zeros(2, 2, 4), torch.zeros(2, 2, 4), pool, pool.clone(), [0, 1])


def test_slot_varlen_names_slots_where_its_table_is_short():
    pool = torch.randn(20, 2, 8)
    cu_q, cu_k = torch.tensor([0, 2, 4], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k ends at 9 but slots has only 5 rows"):
        api.flash_attn_slot_varlen_func(torch.randn(4, 2, 8), pool, pool, torch.arange(5), cu_q, cu_k, 2, 5)


def test_kv_append_traces_into_one_graph():
    """The torch path indexed with a 0-d device tensor, a data-dependent value torch.compile(fullgraph=True)
    could not trace; the pool checks asked tensor.is_inference(), which dynamo does not trace either."""
    def append(new, k_pool, v_pool, slots):
        api.kv_append(new, new * 2, k_pool, v_pool, slots, check_inputs=False)
        return k_pool, v_pool

    compiled = torch.compile(append, fullgraph=True, backend="eager")
    new = torch.randn(2, 2, 4)
    for slots in ([1, 3], [-1, 5], [-1, -1], [7, 7]):
        got = compiled(new, torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), torch.tensor(slots))
        want = append(new, torch.zeros(8, 2, 4), torch.zeros(8, 2, 4), torch.tensor(slots))
        assert all(torch.equal(g, w) for g, w in zip(got, want)), slots


def test_kv_append_takes_strided_pools_and_pools_that_came_to_require_grad():
    """A step slice over an odd dim (no overlap) was refused by a too strict stride rule; a pool that the torch
    path's first write made require grad (new rows computed with grad) was refused on the second call."""
    new = torch.randn(2, 2, 4)
    wide = torch.zeros(8, 3, 4)
    pool = wide[:, ::2]  # (8, 2, 4), strides (12, 8, 1)
    api.kv_append(new, new, pool, wide[:, 1:], torch.tensor([0, 5]))
    assert torch.equal(wide[5, 2], new[1, 1]) and torch.equal(wide[0, 0], new[0, 0])
    weight = torch.randn(4, 4, requires_grad=True)
    k_pool, v_pool = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    for slot in (1, 2):
        rows = torch.randn(1, 2, 4) @ weight  # requires grad
        api.kv_append(rows, rows, k_pool, v_pool, torch.tensor([slot]))
    k_pool.sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0
