"""The coverage matrix: every decoder-only architecture of the installed transformers, patched vs unpatched.

The rows come from transformers itself (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``), so a new model family
shows up here as a row that runs (and passes or fails) or as a skip that says why, never not at all.
Each runnable row builds a tiny random model (hidden 64, 2 layers, GQA 4/2 heads where the config
allows, vocab 128; sliding windows and chunks of 6 tokens, shorter than the sequences; distinct layer
types where the architecture mixes them), patches one copy and compares it in fp32 with ``sdpa`` (or
``eager`` where the architecture has no sdpa) on:

(a) a left-padded batch forward, at the real tokens;
(b) a cached greedy ``generate`` from the same batch: the same tokens;
(c) ``generate_batch`` (continuous batching): each prompt's tokens as the reference generates it alone.

Each row also checks what served its attention against ``docs/architectures.md`` (our kernels, or the
fallback of :mod:`hf_flashpatch.backend.unsupported` and its reason, one warning per reason). The rows in
``REPRESENTATIVE`` run by default; the rest run under ``-m slow``. The rows, tiny configs and twin models:
``tests/architecture_matrix.py`` (``python tests/architecture_matrix.py`` rewrites that table).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import transformers
from architecture_matrix import (DOCS, GREEDY, KNOWN_SKIPS, KNOWN_WRONG, NAME, NEW_TOKENS, PROMPTS, REPRESENTATIVE,
                                 SPECIAL, VOCAB, _reference_or_skip, architecture_rows, batch_generate, docs_table,
                                 documented, padded_batch, serving, tiny_config, twin_models, what_runs)
from transformers import AutoModelForCausalLM, GenerationConfig
from transformers.models.auto import modeling_auto

import hf_flashpatch
from hf_flashpatch.backend import unpatchable

# ---------------------------------------------------------------------------------------------- tests


def test_every_causal_lm_of_transformers_is_a_row():
    rows = architecture_rows()
    assert set(rows) == set(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert all(row.skip is None or row.skip.strip() for row in rows.values())
    if docs_table()[0] == transformers.__version__:  # no stale hand-kept names (older releases lack newer models)
        for listed in (KNOWN_SKIPS, KNOWN_WRONG, SPECIAL):
            assert set(listed) <= set(rows), set(listed) - set(rows)
    assert set(REPRESENTATIVE) <= set(rows), set(REPRESENTATIVE) - set(rows)
    assert all(rows[model_type].skip is None for model_type in REPRESENTATIVE)
    assert not set(REPRESENTATIVE) & set(KNOWN_WRONG)
    assert len([row for row in rows.values() if row.skip is None]) >= 50  # the enumeration found the zoo


def test_the_docs_table_lists_every_row():
    version, table = docs_table()
    if version != transformers.__version__:
        pytest.skip(f"{DOCS.name} was made with transformers {version}, this is {transformers.__version__}")
    rows = architecture_rows()
    assert set(table) == set(rows), (sorted(set(rows) - set(table)), sorted(set(table) - set(rows)))
    for model_type, row in rows.items():
        assert (table[model_type] == "not run") == (row.skip is not None), (model_type, table[model_type])


def _row_params():
    """Every row: skipped with its reason, slow unless representative, strict xfail if known wrong."""
    params = []
    for model_type, row in architecture_rows().items():
        marks = []
        if row.skip is not None:
            marks.append(pytest.mark.skip(reason=row.skip))
        elif model_type not in REPRESENTATIVE:
            marks.append(pytest.mark.slow)
        if model_type in KNOWN_WRONG:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[model_type]))
        params.append(pytest.param(model_type, marks=marks, id=model_type))
    return params


@pytest.fixture(scope="module", params=_row_params())
def model_type(request):
    """A row. Module scope makes pytest run a row's three tests one after the other, on the same twin models."""
    return request.param


def test_padded_forward(model_type):
    """(a) Left-padded batch, compared at the real tokens; what served it matches the docs, one warning per
    fallback reason."""
    ours, ref = twin_models(model_type)
    ids, mask = padded_batch()
    with serving() as counts, warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        got = ours(input_ids=ids, attention_mask=mask).logits
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], atol=2e-5, rtol=1e-4)
    reasons = sorted(r for r in counts if r != "our kernels")
    fallback_warnings = sorted(str(w.message) for w in caught if "cannot serve" in str(w.message))
    assert len(fallback_warnings) == len(reasons), fallback_warnings
    assert all(f"({reason}:" in message for reason, message in zip(reasons, fallback_warnings))
    assert counts, "no attention call reached the backend"
    assert what_runs(counts) == (documented(model_type) or what_runs(counts))


def _known_wrong(model_type: str) -> None:
    """Greedy tokens of a known-wrong row may agree by chance: no strict verdict from them."""
    if model_type in KNOWN_WRONG:
        pytest.xfail(KNOWN_WRONG[model_type])


def test_greedy_generate(model_type):
    """(b) Cached greedy generation from the left-padded batch: the same tokens, on the same path."""
    _known_wrong(model_type)
    ours, ref = twin_models(model_type)
    ids, mask = padded_batch()
    want = _reference_or_skip(lambda: ref.generate(input_ids=ids, attention_mask=mask, **GREEDY), "generate", ref,
                              model_type)  # fmt: skip
    with serving() as counts, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback's warning is checked by test_padded_forward
        got = ours.generate(input_ids=ids, attention_mask=mask, **GREEDY)
    assert got.shape == (ids.shape[0], ids.shape[1] + NEW_TOKENS)
    assert torch.equal(got, want), (got, want)
    assert what_runs(counts) == (documented(model_type) or what_runs(counts))


def one_at_a_time(model) -> list[list[int]]:
    """Each prompt alone through greedy ``generate``: what continuous batching must reproduce."""
    return [model.generate(input_ids=torch.tensor([p]), **GREEDY)[0, len(p) :].tolist() for p in PROMPTS]


def test_generate_batch(model_type):
    """(c) Continuous batching: each prompt's tokens are the reference's greedy ``generate`` of it alone.

    Not transformers' own ``generate_batch`` of the reference: for moshi that disagrees with its own
    ``generate`` (its page cache treats every layer as sliding because ``config.sliding_window`` is set). Where
    ours fails or disagrees, the row is a skip only if transformers' own run of the reference fails or disagrees
    too (models that keep continuous batching's keywords from their attention: StableLM and Nemotron on
    5.19-5.23, where ours refuses them and sdpa gives wrong tokens).
    """
    _known_wrong(model_type)
    ours, ref = twin_models(model_type)
    want = _reference_or_skip(lambda: one_at_a_time(ref), "generate", ref, model_type)
    with serving() as counts, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got, error = batch_generate(ours), None
        except Exception as raised:  # noqa: BLE001 - judged against transformers' own run below
            got, error = None, raised
        if got != want:
            theirs = _reference_or_skip(lambda: batch_generate(ref), "generate_batch", ref, model_type)
            if theirs != want:
                pytest.skip(f"transformers' own generate_batch of {model_type} disagrees with its generate here")
            if error is not None:
                raise error  # transformers' run works: ours must too
    assert got == want
    assert ours.config._attn_implementation == NAME  # restored after the batch
    assert what_runs(counts) == (documented(model_type) or what_runs(counts))


@pytest.mark.parametrize("model_type", ["mistral", "gemma2"])  # every layer sliding; sliding and full alternating
def test_generate_batch_chunked_prefill_over_sliding_windows(model_type):
    """Prompts longer than the window (6) and than the batch budget (16 tokens): prefill runs in chunks over
    cached keys of sliding layers (on transformers < 5.19 the ``paged|<name>`` gather-then-varlen route with its
    rolling buffer). Each prompt's tokens as the reference's greedy ``generate`` of it alone."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    ours, ref = twin_models(model_type)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (40, 9, 23)]
    want = [ref.generate(input_ids=torch.tensor([p]), **GREEDY)[0, len(p) :].tolist() for p in prompts]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = ours.generate_batch(inputs=prompts, generation_config=GenerationConfig(**GREEDY),
                                      continuous_batching_config=ContinuousBatchingConfig(num_blocks=32,
                                                                                          max_batch_tokens=16),
                                      progress_bar=False)  # fmt: skip
    by_prompt = {tuple(r.prompt_ids): list(r.generated_tokens) for r in results.values()}
    assert [by_prompt.get(tuple(p)) for p in prompts] == want


# ---------------------------------------------------------------------------------- models patch() refuses


def _refused_rows():
    """Rows patch() must refuse: the 4-D-mask readers, and models whose attention bypasses AttentionInterface."""
    rows = architecture_rows()
    bypass = [t for t, row in rows.items() if row.skip and "no attention through AttentionInterface" in row.skip]
    no_attention = [t for t in ("mamba", "falcon_mamba") if t in bypass]  # transformers lets these switch
    return sorted(unpatchable.READS_4D_MASK) + sorted(set(bypass[:3] + no_attention))  # a few of the second kind


@pytest.mark.parametrize("refused", _refused_rows())
def test_patch_refuses_what_it_cannot_serve(refused):
    """patch() raises UnsupportedModel naming why, and leaves the model's attention as it was; the 4-D-mask
    readers fail the same way through from_pretrained(attn_implementation=...) (our mask function)."""
    try:
        config = tiny_config(refused)
        model = AutoModelForCausalLM.from_config(copy.deepcopy(config))
    except Exception as exc:  # noqa: BLE001 - a row whose tiny model cannot be built here
        pytest.skip(f"no tiny {refused} model: {type(exc).__name__}: {exc}")
    before = model.config._attn_implementation
    with pytest.raises(hf_flashpatch.UnsupportedModel, match="cannot patch this model") as refusal:
        hf_flashpatch.patch(model)
    assert type(model).__name__ in str(refusal.value) and "attn_implementation='sdpa'" in str(refusal.value)
    assert model.config._attn_implementation == before
    if refused in unpatchable.READS_4D_MASK and model.is_backend_compatible():
        assert "4-D" in str(refusal.value)
        hf_flashpatch.backend.register(NAME)
        direct = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=NAME)
        with pytest.raises(hf_flashpatch.UnsupportedModel, match="4-D sdpa/eager mask"):
            direct(input_ids=torch.randint(3, VOCAB, (1, 5)))
