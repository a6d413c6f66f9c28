"""The fallback for calls the kernels cannot serve (:mod:`hf_flashpatch.backend.unsupported`), on CPU.

Its mask must be the one transformers would have built for sdpa from the same inputs: compared here with
``transformers.masking_utils.sdpa_mask`` fed what our registered mask function gives, for padded prefill,
decode over a cache, sliding windows, chunked prefill and static buffers; packed sequences against a
mask spelled out key by key. Whole models through the fallback are in ``test_architectures.py``.
"""

import math
import types
import warnings

import pytest
import torch
from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function

from hf_flashpatch.backend import UnsupportedAttentionFeature, unsupported
from hf_flashpatch.backend.masks import key_padding_mask, traced_key_mask


pytestmark = pytest.mark.filterwarnings("ignore:hf_flashpatch. the attention kernels cannot serve")


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(unsupported, "_warned", set())


class Attention(torch.nn.Module):
    """What the fallback reads off an attention module: its GQA group and causality."""

    def __init__(self, groups=2, is_causal=True):
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, is_causal


def qkv(batch=2, heads=4, kv_heads=2, seqlen_q=5, seqlen_k=5, head_dim=8, v_head_dim=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seqlen_q, head_dim, generator=gen)
    k = torch.randn(batch, kv_heads, seqlen_k, head_dim, generator=gen)
    v = torch.randn(batch, kv_heads, seqlen_k, v_head_dim or head_dim, generator=gen)
    return q, k, v


def test_reasons():
    q, k, v = qkv()
    reason = unsupported.fallback_reason
    assert reason(q, k, v, None, {}) is None
    bookkeeping = dict(position_ids=torch.arange(5)[None], use_cache=True, output_router_logits=False,
                       cu_seq_lens_q=None, logits_indices=torch.tensor([4]))  # fmt: skip
    assert reason(q, k, v, None, bookkeeping) is None
    assert reason(q, k, v, None, dict(s_aux=torch.zeros(4))) is None  # one logit per query head: served (sinks.py)
    assert reason(q, k, v, None, dict(s_aux=torch.zeros(4, 2))) == unsupported.SINKS
    assert reason(q, k, v, None, dict(sinks=torch.zeros(2, 4), position_bias=torch.zeros(1))) == unsupported.SINKS
    assert reason(q, k, v, None, dict(position_bias=torch.zeros(2, 4, 5, 5))) == unsupported.POSITION_BIAS
    assert reason(q, k, v, None, dict(indices=torch.zeros(2, 5, 3))) == unsupported.UNKNOWN_KWARG
    assert reason(q, k, v, None, dict(indices=None)) is None  # a keyword without a value changes nothing
    assert reason(*qkv(v_head_dim=4), None, {}) is None  # served: the ops take the pair (kernels/value_head_dim.py)
    assert reason(*qkv(seqlen_q=1, seqlen_k=9, v_head_dim=4), None, {}) is None  # a CPU decode step: API torch path
    assert reason(*qkv(head_dim=512), None, {}) == unsupported.HEAD_DIM
    assert reason(*qkv(v_head_dim=320), None, {}) == unsupported.HEAD_DIM
    assert reason(q, k, v, torch.ones(2, 1, 5, 5, dtype=torch.bool), {}) == unsupported.MASK_4D
    assert reason(q, k, v, torch.ones(2, 5, dtype=torch.bool), {}) is None


@pytest.mark.parametrize("seqlen_q, seqlen_k, grad, want", [
    (1, 9, False, unsupported.VALUE_HEAD_DIM),  # a decode step of a pair no decode kernel is built for
    (4, 9, False, unsupported.VALUE_HEAD_DIM),  # speculative decoding: still a decode step
    (5, 9, False, None),  # chunked prefill: the padded forward kernel
    (9, 9, False, None),  # prefill
    (1, 9, True, None),  # gradients: the forward/backward kernels, padded
])  # fmt: skip
def test_value_head_dim_reason_on_a_kernel_device(seqlen_q, seqlen_k, grad, want, monkeypatch):
    """Where the kernels run (faked here), a V head dim of its own leaves the kernels only in a decode step."""
    monkeypatch.setattr(unsupported, "kernels_unavailable_reason", lambda tensor: None)
    q, k, v = qkv(seqlen_q=seqlen_q, seqlen_k=seqlen_k, v_head_dim=4)
    q.requires_grad_(grad)
    assert unsupported.fallback_reason(q, k, v, None, {}) == want
    assert unsupported.fallback_reason(*qkv(seqlen_q=seqlen_q, seqlen_k=seqlen_k), None, {}) is None  # one head dim
    mla = qkv(seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=192, v_head_dim=128)  # DeepSeek-V3: a decode kernel's pair
    assert unsupported.fallback_reason(*mla, None, {}) is None


def left_padded(lengths, total):
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, total - length :] = 1
    return mask


@pytest.mark.parametrize(
    "lengths, total, q_length, window",
    [
        ((7, 3, 5), 7, 7, None),  # padded prefill
        ((7, 3, 5), 7, 1, None),  # decode: one query over the cache
        ((7, 3, 5), 7, 3, None),  # chunked prefill: three queries after four cached keys
        ((9, 4, 6), 9, 9, 3),  # sliding window shorter than the sequences
        ((9, 4, 6), 9, 2, 3),
        ((5, 5), 5, 5, 2),  # no padding: our mask function gives None
    ],
)
def test_mask_is_transformers_sdpa_mask(lengths, total, q_length, window):
    padding = left_padded(lengths, total)
    batch, offset = len(lengths), total - q_length
    function = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    common = dict(batch_size=batch, q_length=q_length, kv_length=total, q_offset=offset, kv_offset=0,
                  attention_mask=padding.bool())  # fmt: skip
    want = sdpa_mask(**common, mask_function=function, allow_is_causal_skip=False)  # (B, 1, S_q, S_k)
    ours = key_padding_mask(**common, device="cpu")  # None or (B, S_k)
    q, k, _ = qkv(batch=batch, seqlen_q=q_length, seqlen_k=total)
    got = unsupported.dense_mask(q, k, ours, True, window, {})
    assert got.shape == want.shape
    assert torch.equal(got, want), (got.int(), want.int())


def test_mask_of_a_static_buffer():
    """A static cache hands over every slot; the traced key mask marks the unwritten ones False."""
    padding = left_padded((4, 2), 4)  # two prompts in four slots, then one decoded token
    written, slots = 5, 8
    attention_mask = torch.cat([padding, torch.ones(2, 1, dtype=torch.long)], dim=1).bool()  # (2, 5)
    ours = traced_key_mask(2, 1, slots, written - 1, 0, attention_mask, "cpu")  # (2, 8): False past slot 5
    want = sdpa_mask(batch_size=2, q_length=1, kv_length=slots, q_offset=written - 1, kv_offset=0,
                     mask_function=causal_mask_function, attention_mask=attention_mask,
                     allow_is_causal_skip=False)  # fmt: skip
    q, k, _ = qkv(batch=2, seqlen_q=1, seqlen_k=slots)
    assert torch.equal(unsupported.dense_mask(q, k, ours, True, None, {}), want)


def spelled_out(lens_q, lens_k, window=None, total_q=None, total_k=None):
    """The packed-row mask key by key: each query sees its own sequence's keys up to its position."""
    total_q, total_k = total_q or sum(lens_q), total_k or sum(lens_k)
    mask = torch.zeros(total_q, total_k, dtype=torch.bool)
    start_q = start_k = 0
    for len_q, len_k in zip(lens_q, lens_k):
        for i in range(len_q):
            position = len_k - len_q + i
            for j in range(len_k):
                mask[start_q + i, start_k + j] = j <= position and (window is None or position - j < window)
        start_q, start_k = start_q + len_q, start_k + len_k
    return mask[None, None]  # (1, 1, T_q, T_k)


@pytest.mark.parametrize("window", [None, 2])
def test_mask_of_packed_sequences(window):
    """Continuous batching: new tokens of three requests (3, 1, 2) over their caches (5, 4, 2), plus one
    padding row past the end of cu_seq_lens_q that sees nothing."""
    lens_q, lens_k = [3, 1, 2], [5, 4, 2]
    cu = lambda lens: torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    q, k, _ = qkv(batch=1, seqlen_q=7, seqlen_k=11)
    got = unsupported.dense_mask(q, k, None, True, window, dict(cu_seq_lens_q=cu(lens_q), cu_seq_lens_k=cu(lens_k)))
    assert torch.equal(got, spelled_out(lens_q, lens_k, window, total_q=7, total_k=11))


def test_mask_of_packed_position_ids():
    """Packed sequences without cu_seq_lens (DataCollatorWithFlattening): positions restart per sequence."""
    position_ids = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    q, k, _ = qkv(batch=1, seqlen_q=9, seqlen_k=9)
    got = unsupported.dense_mask(q, k, None, True, None, dict(position_ids=position_ids))
    assert torch.equal(got, spelled_out([3, 2, 4], [3, 2, 4]))


def naive(q, k, v, visible, scale):
    """fp64 softmax attention, (B, H, S_q, D) -> (B, S_q, H, D_v); rows that see nothing give 0."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, -math.inf)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ v).transpose(1, 2)


def test_value_head_dim_with_padding_runs_sdpa_and_warns_once():
    q, k, v = qkv(batch=3, seqlen_q=6, seqlen_k=6, head_dim=8, v_head_dim=4)  # MLA-shaped: V narrower
    padding = left_padded((6, 2, 4), 6).bool()
    scale = 0.3
    reason = unsupported.VALUE_HEAD_DIM
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out, weights = unsupported.fallback_attention(Attention(), q, k, v, padding, scaling=scale, reason=reason)
        unsupported.fallback_attention(Attention(), q, k, v, padding, scaling=scale, reason=reason)  # no new warning
    assert weights is None and out.shape == (3, 6, 4, 4) and out.is_contiguous()
    visible = unsupported.dense_mask(q, k, padding, True, None, {})
    torch.testing.assert_close(out.double(), naive(q, k, v, visible, scale), atol=1e-5, rtol=1e-5)
    assert out[1, :4].abs().max() == 0  # left-padding query rows: zeros, as on the kernel path
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "Attention" in message and "(value head dim: value head dim 4, query/key head dim 8, in a decode" in message
    assert "sdpa" in message


def test_each_reason_warns_once():
    q, k, v = qkv()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            unsupported.fallback_attention(Attention(), *qkv(v_head_dim=4), None, reason=unsupported.VALUE_HEAD_DIM)
            unsupported.fallback_attention(Attention(), q, k, v, None, position_bias=torch.zeros(2, 4, 5, 5))
    assert len(caught) == 2
    assert {unsupported.VALUE_HEAD_DIM, unsupported.POSITION_BIAS} == unsupported._warned


def test_sliding_window_decode_over_a_longer_cache():
    q, k, v = qkv(batch=1, seqlen_q=2, seqlen_k=9, v_head_dim=4)
    out, _ = unsupported.fallback_attention(Attention(), q, k, v, None, scaling=0.5, sliding_window=3)
    visible = torch.zeros(1, 1, 2, 9, dtype=torch.bool)
    visible[..., 0, 5:8] = True  # the query at position 7 sees 5, 6, 7
    visible[..., 1, 6:9] = True
    torch.testing.assert_close(out.double(), naive(q, k, v, visible, 0.5), atol=1e-5, rtol=1e-5)


def test_a_4d_mask_is_used_as_given():
    q, k, v = qkv(v_head_dim=4)
    given = torch.rand(2, 1, 5, 5) > 0.3
    given[..., 0] = True  # every row sees a key
    out, _ = unsupported.fallback_attention(Attention(), q, k, v, given, scaling=0.25)
    torch.testing.assert_close(out.double(), naive(q, k, v, given, 0.25), atol=1e-5, rtol=1e-5)


def test_sinks_run_the_models_own_eager_attention():
    """Sinks the kernels do not take (another shape than one per query head) go to the eager function of the
    module's own modeling file, with an additive mask."""
    seen = {}

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        seen.update(mask=attention_mask, kwargs=kwargs)
        return torch.zeros(query.shape[0], query.shape[2], query.shape[1], value.shape[-1]), None

    modeling = types.ModuleType("modeling_with_sinks")
    modeling.eager_attention_forward = eager_attention_forward
    module = type("SinkAttention", (Attention,), {"__module__": modeling.__name__})()
    q, k, v = qkv()
    sinks = torch.zeros(4, 2)
    with pytest.MonkeyPatch.context() as patcher:
        patcher.setitem(__import__("sys").modules, modeling.__name__, modeling)
        with pytest.warns(UserWarning, match=r"SinkAttention \(attention sinks: s_aux of shape \(4, 2\)\).*eager"):
            unsupported.fallback_attention(module, q, k, v, left_padded((5, 3), 5).bool(), scaling=1.0, s_aux=sinks)
    assert seen["kwargs"]["s_aux"] is sinks
    assert seen["mask"].dtype == torch.float32 and seen["mask"].shape == (2, 1, 5, 5)
    assert seen["mask"][1, 0, 4, :2].eq(torch.finfo(torch.float32).min).all()  # padding keys: -inf-like
    assert seen["mask"][1, 0, 4, 2:].eq(0).all()


def test_no_eager_function_is_an_error_naming_the_module():
    module = type("Orphan", (Attention,), {"__module__": "no_such_modeling_file"})()
    with pytest.raises(UnsupportedAttentionFeature, match="Orphan.*attention sinks.*no eager_attention_forward"):
        unsupported.fallback_attention(module, *qkv(), None, s_aux=torch.zeros(4, 2))


def test_traces_whole_under_torch_compile():
    """No graph break (``fullgraph=True``): the mask comes from tensor ops, the reasons from shapes and keywords."""
    q, k, v = qkv(batch=3, seqlen_q=6, seqlen_k=6, v_head_dim=4)
    padding = left_padded((6, 2, 4), 6).bool()

    def attend(q, k, v, padding):
        return unsupported.fallback_attention(Attention(), q, k, v, padding, scaling=0.3, sliding_window=4)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(q, k, v, padding), attend(q, k, v, padding))
