"""Multi-head latent attention models through the backend on CPU: a tiny DeepSeek-V3-shaped model (q/k head
dim 32 + 16 = 48, v head dim 32) patched vs transformers' ``sdpa``, eager and under ``torch.compile``, in
fp32: the same logits, gradients and greedy tokens (cached ``generate`` and ``generate_batch``).

Two devices are exercised on this CPU: the CPU itself (the API's torch path serves every call), and a faked
kernel device (``kernels_unavailable_reason`` answers None; the kernel calls run the ops' torch paths; see
``kernel_device`` in ``test_value_head_dim.py``), where prefill and training take the padded forward route and
each decode step takes transformers' sdpa with one ``value head dim`` warning (48/32: no decode kernel is built
for it), or asks the decode kernel (DeepSeek-V3's own 192/128). Layout of the attention calls:
query ``(B, H, S_q, 48)``, key ``(B, H, S_k, 48)``, value ``(B, H, S_k, 32)``.
"""

import collections
import copy
import warnings

import pytest
import torch
from test_backend import VOCAB, padded_batch
from test_backend_generate import PROMPTS, batch_generate
from test_backend_generate import NEW_TOKENS as BATCH_NEW_TOKENS
from test_value_head_dim import kernel_device  # noqa: F401 - a fixture
from transformers import AutoModelForCausalLM, DeepseekV3Config

import hf_flashpatch
import hf_flashpatch.api
from hf_flashpatch.backend import UnsupportedAttentionFeature, paged_kernel, unsupported
from hf_flashpatch.backend.patch import _paged_prefix_supported
from hf_flashpatch.backend.traced import traced_attention
from hf_flashpatch.paged import PagedKVCache
from hf_flashpatch.reference import attention_reference

NEW_TOKENS = 6
GREEDY = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
TOL = dict(atol=2e-5, rtol=1e-4)


def deepseek_v3_config(dense_layers=1, dims=(32, 16, 32)):
    """DeepSeek-V3's attention shape, shrunk: 4 heads, q/k 48 (``dims``: 32 without RoPE + 16 with it), v 32 (a pair
    no decode kernel is built for; ``dims=(128, 64, 128)`` is DeepSeek-V3's own 192/128); the first
    ``dense_layers`` of the 2 layers have a dense MLP, the rest a mixture of experts."""
    nope, rope, value = dims
    return DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=rope,
        qk_nope_head_dim=nope, v_head_dim=value, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, n_group=1,
        topk_group=1, first_k_dense_replace=dense_layers, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, attention_dropout=0.0,
    )  # fmt: skip


def twin_deepseek(**config):
    """The same random weights, patched and under sdpa."""
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(deepseek_v3_config(**config), attn_implementation="sdpa").eval()
    ours = AutoModelForCausalLM.from_config(copy.deepcopy(ref.config), attn_implementation="eager").eval()
    ours.load_state_dict(ref.state_dict())
    hf_flashpatch.patch(ours)
    return ours, ref


def left_padded(lengths=(9, 4, 7), total=9):
    return padded_batch(lengths, total, side="left")  # ids < 128: within the tiny vocabulary


@pytest.fixture
def served(monkeypatch):
    """Counts what serves attention: API calls by ``(function, q/k head dim, v head dim)`` and the fallback's
    calls by reason; the fallback's warnings start afresh."""
    counts = collections.Counter()
    api = hf_flashpatch.api

    def counted(name, function):
        def wrapper(q, k, v, *args, **kwargs):
            counts[(name, q.shape[-1], v.shape[-1])] += 1
            return function(q, k, v, *args, **kwargs)

        return wrapper

    for name in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        monkeypatch.setattr(api, name, counted(name, getattr(api, name)))
    fallback = unsupported.fallback_attention
    monkeypatch.setattr(unsupported, "fallback_attention",
                        lambda *a, **k: counts.update([k.get("reason")]) or fallback(*a, **k))  # fmt: skip
    monkeypatch.setattr(unsupported, "_warned", set())
    return counts


def test_padded_batch_and_cached_generate_run_on_our_api(served):
    """CPU: every attention call (prefill, decode over the cache) is ours; logits and greedy tokens as sdpa's."""
    ours, ref = twin_deepseek()
    ids, mask = left_padded()
    with torch.no_grad():
        got, want = (m(input_ids=ids, attention_mask=mask).logits for m in (ours, ref))
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], **TOL)
    tokens = ours.generate(input_ids=ids, attention_mask=mask, **GREEDY)
    assert torch.equal(tokens, ref.generate(input_ids=ids, attention_mask=mask, **GREEDY))
    one = ids[:1]  # no padding: the decode steps take flash_attn_with_kvcache
    assert torch.equal(ours.generate(input_ids=one, **GREEDY), ref.generate(input_ids=one, **GREEDY))
    layers = ours.config.num_hidden_layers
    assert served[("flash_attn_with_kvcache", 48, 32)] == layers * (NEW_TOKENS - 1)
    assert served[("flash_attn_varlen_func", 48, 32)] > 0  # the padded batch, unpadded
    assert {name for name, *_ in served} <= {"flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"}
    assert all(dims == [48, 32] for _, *dims in served), served  # V's own head dim reached the API


def test_on_a_kernel_device_prefill_is_padded_and_decode_steps_fall_back_once(kernel_device, served):  # noqa: F811
    """Faked kernel device: the prefill runs the padded forward op (head dim 64 for 48/32), every decode step
    goes to transformers' sdpa with one warning naming the value head dim; the greedy tokens are sdpa's."""
    ours, ref = twin_deepseek()
    ids, mask = left_padded()
    with pytest.MonkeyPatch.context() as patcher, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patcher.setattr(unsupported, "kernels_unavailable_reason", lambda tensor: None)
        got = ours.generate(input_ids=ids, attention_mask=mask, **GREEDY)
    assert torch.equal(got, ref.generate(input_ids=ids, attention_mask=mask, **GREEDY))
    layers = ours.config.num_hidden_layers
    assert served[unsupported.VALUE_HEAD_DIM] == layers * (NEW_TOKENS - 1)  # each decode step of each layer
    assert served[("flash_attn_varlen_func", 48, 32)] == layers  # the padded prefill, on the padded forward op
    assert kernel_device == [("forward", 64, 64, 64)] * layers  # the prefill; decode steps never reach the API
    fallback_warnings = [str(w.message) for w in caught if "cannot serve" in str(w.message)]
    assert len(fallback_warnings) == 1
    assert "(value head dim: value head dim 32, query/key head dim 48, in a decode step" in fallback_warnings[0]


def test_on_a_kernel_device_192_128_decode_steps_ask_the_decode_kernel(kernel_device, served):  # noqa: F811
    """DeepSeek-V3's own 192/128 on the faked kernel device: no fallback; the prefill runs the forward op (padded
    to 256 off Hopper), each decode step asks the decode kernel at the native dims (faked to decline, so the
    forward op serves it); the greedy tokens are sdpa's."""
    ours, ref = twin_deepseek(dims=(128, 64, 128))
    ids = left_padded()[0][:1]  # one unpadded row: the decode steps take flash_attn_with_kvcache
    with pytest.MonkeyPatch.context() as patcher, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patcher.setattr(unsupported, "kernels_unavailable_reason", lambda tensor: None)
        got = ours.generate(input_ids=ids, **GREEDY)
    assert torch.equal(got, ref.generate(input_ids=ids, **GREEDY))
    layers = ours.config.num_hidden_layers
    assert served[("flash_attn_with_kvcache", 192, 128)] == layers * (NEW_TOKENS - 1)
    assert not [w for w in caught if "cannot serve" in str(w.message)] and unsupported.VALUE_HEAD_DIM not in served
    decode_tries = [launch for launch in kernel_device if launch[0] == "decode"]
    assert decode_tries == [("decode", 192, 192, 128)] * (layers * NEW_TOKENS)  # prefill (9 rows) included


@pytest.mark.parametrize("device", ["cpu", "kernel device"])
def test_training_step_matches_sdpa(device, request):
    """Loss and every gradient of a padded training step; on the faked kernel device through the padded op and
    its autograd (the backward's torch path at head dim 64)."""
    calls = request.getfixturevalue("kernel_device") if device == "kernel device" else None
    ours, ref = twin_deepseek()
    ours.train()
    ref.train()
    ids, mask = left_padded()
    labels = ids.masked_fill(mask == 0, -100)
    losses = [m(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss for m in (ours, ref)]
    for loss in losses:
        loss.backward()
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=2e-4, msg=name)
    layers = ours.config.num_hidden_layers
    assert calls is None or calls == [("forward", 64, 64, 64)] * layers + [("backward", 64, 64, 64)] * layers


def test_compiled_training_step_matches_sdpa():
    """torch.compile(fullgraph=True): the padded op in the graph (a padding mask: the masked op, its exact
    dense path here), loss and gradients as sdpa's. Dense MLPs only: transformers 5.17's mixture-of-experts backward
    does not trace (a data-dependent guard in its grouped matmul), whatever the attention."""
    torch._dynamo.reset()
    ours, ref = twin_deepseek(dense_layers=2)
    ours.train()
    ref.train()
    ids, mask = left_padded((9, 6), 9)
    labels = ids.masked_fill(mask == 0, -100)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    loss = compiled(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    want = ref(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
    loss.backward()
    want.backward()
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        if q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, atol=2e-5, rtol=2e-4, msg=name)
    torch._dynamo.reset()


def _per_row_reference(q, k, v, firsts, **attn):
    """The oracle per row: row b's real keys start at ``firsts[b]`` (left padding), its queries are the last."""
    return [attention_reference(q[b : b + 1, max(0, first - (k.shape[1] - q.shape[1])) :], k[b : b + 1, first:],
                                v[b : b + 1, first:], **attn)[0] for b, first in enumerate(firsts)]  # fmt: skip


@pytest.mark.parametrize("branch", ["no mask", "mask", "decode", "masked decode", "packed", "position_ids"])
def test_traced_attention_serves_a_value_head_dim_of_its_own(branch):
    """Each route of the compiled path (fullgraph) against the oracle: the batched and varlen ops (which take the
    pair), the masked op's two paths, and the few-query steps on the decode op (its torch path here; on a GPU the
    decode kernel serves 192/128)."""
    gen = torch.Generator().manual_seed(4)
    seqlen_q = 2 if "decode" in branch else 8
    q = torch.randn(2, seqlen_q, 4, 24, generator=gen)  # (B, S_q, H, D)
    k, v = torch.randn(2, 8, 2, 24, generator=gen), torch.randn(2, 8, 2, 16, generator=gen)  # D_v = 16
    sinks = torch.randn(4, generator=gen)
    attn = dict(causal=True, softmax_scale=None, window=(5, 0), softcap=None, sinks=sinks)
    mask, position_ids, packed, firsts = None, None, None, [0, 0]
    if "mask" in branch:
        mask, firsts = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8], dtype=torch.bool), [3, 0]
    if branch in ("packed", "position_ids"):
        q, k, v = q[:1], k[:1], v[:1]
        position_ids = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
        cu = torch.tensor([0, 3, 8], dtype=torch.int32)
        packed = (cu, cu, 5, 5) if branch == "packed" else None
    run = torch.compile(lambda q, k, v: traced_attention(q, k, v, mask, position_ids, packed, attn, False),
                        fullgraph=True, backend="aot_eager")  # fmt: skip
    got = run(q, k, v)
    assert got.shape == (*q.shape[:3], 16)
    if branch in ("packed", "position_ids"):
        for start, end in ((0, 3), (3, 8)):
            want, _ = attention_reference(q[:, start:end], k[:, start:end], v[:, start:end], **attn)
            torch.testing.assert_close(got[:, start:end], want, **TOL)
        return
    for b, want in enumerate(_per_row_reference(q, k, v, firsts, **attn)):
        torch.testing.assert_close(got[b : b + 1, seqlen_q - want.shape[1] :], want, **TOL)


# ------------------------------------------------------------------------------------ continuous batching


def test_generate_batch_matches_greedy_generate_and_keeps_off_the_pool_routes(monkeypatch):
    """generate_batch with the pool routes forced on, as on a GPU: the MLA model keeps to the gathered route (its
    cache holds latents, V has its own head dim), which our varlen call serves; each prompt's tokens are sdpa's
    greedy generate of it alone. Where transformers' own continuous batching cannot run the model (5.24's page
    cache cannot hold its latents: every request fails before attention is called), the test skips saying so."""
    ours, ref = twin_deepseek()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            batch_generate(ref)
        except RuntimeError as error:  # batch_generate's: the requests failed
            pytest.skip(f"transformers' own generate_batch fails for this MLA model under sdpa too: {error}")
    want = [ref.generate(input_ids=torch.tensor([p]), **dict(GREEDY, max_new_tokens=BATCH_NEW_TOKENS))[0, len(p) :]
            .tolist() for p in PROMPTS]  # fmt: skip
    pool_calls = collections.Counter()
    for name in ("kv_append", "flash_attn_paged_decode", "flash_attn_slot_varlen_func"):
        original = getattr(hf_flashpatch.api, name)
        monkeypatch.setattr(hf_flashpatch.api, name, lambda *a, _f=original, _n=name, **k: pool_calls.update([_n])
                            or _f(*a, **k))  # fmt: skip
    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = batch_generate(ours)
    assert got == want
    assert not pool_calls, pool_calls
    assert ours.config._attn_implementation == hf_flashpatch.ATTN_NAME


def test_pool_routes_refuse_a_value_head_dim_by_name():
    config = deepseek_v3_config()
    assert "multi-head latent attention (kv_lora_rank=32" in paged_kernel.block_table_route_unavailable(config)
    query, key = torch.zeros(1, 4, 3, 48), torch.zeros(1, 4, 3, 48)
    value = torch.zeros(1, 4, 3, 32)
    assert "a value head dim of its own (32, query/key 48)" in paged_kernel.slot_route_declines(None, query, value, {})
    pages = torch.zeros(6, 4, 4, 48)  # (num_pages, page_size, H_kv, D): one head dim
    call = dict(block_table=torch.zeros(3, 2, dtype=torch.int32), k_cache=pages, v_cache=pages,
                cu_seq_lens_k=torch.tensor([0, 1, 2, 3]))  # fmt: skip
    refusal = r"route cannot serve Module: its pools hold K/V rows of \(H_kv, D\) = \(4, 48\).*value \(1, 4, 3, 32\)"
    with pytest.raises(UnsupportedAttentionFeature, match=refusal):
        paged_kernel.block_table_attention(torch.nn.Module(), query, key, value, None, call)
    cache = PagedKVCache(num_pages=4, page_size=2, kv_heads=2, head_dim=16, dtype=torch.float32)
    cache.allocate("a", 1)
    with pytest.raises(ValueError, match=r"keeps one head dim for K and V.*got \(1, 1, 2, 16\) and \(1, 1, 2, 8\)"):
        cache.append(["a"], torch.zeros(1, 1, 2, 16), torch.zeros(1, 1, 2, 8))


@pytest.mark.skipif(_paged_prefix_supported(), reason="the block-table decode path is transformers >= 5.19's")
def test_decode_fast_path_stays_off_for_multi_head_latent_attention(monkeypatch):
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import initialization

    from hf_flashpatch.backend.patch import continuous_batching_name

    monkeypatch.setattr(paged_kernel, "kernels_unavailable_reason", lambda tensor: None)
    ours, _ = twin_deepseek()
    ours.set_attn_implementation(continuous_batching_name(hf_flashpatch.ATTN_NAME))
    cb_config = ContinuousBatchingConfig(max_blocks_per_request=6)
    initialization.ensure_decode_fast_path_is_available(ours.config, cb_config, False)
    assert cb_config.max_blocks_per_request == 0
