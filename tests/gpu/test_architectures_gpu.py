"""The coverage matrix (``tests/test_architectures.py``) on a GPU: its representative rows, every one of which
runs on our kernels (``docs/architectures.md``), each a tiny random model (head dim 64; 192/128 for DeepSeek-V3:
``KERNEL_SIZES``; Phi-2 and StableLM once more at their own head dim 80, ``HEAD_DIM_80``) in bf16 on CUDA, patched, against
the same weights under transformers' sdpa (eager where the architecture has no sdpa):

(a) a left-padded batch: the logits at the real tokens are finite, and their error against an fp32 run of the
    reference is at most twice the reference's own bf16 error (plus a small eps);
(b) cached greedy ``generate`` from that batch: the same tokens, or a divergence at a bf16 near-tie
    (``greedy.py``: the fp32 logit gap of the two choices within twice the bf16 reference's error);
(c) ``generate_batch`` (continuous batching, the paged kernels): each prompt's tokens as the patched model's
    own greedy ``generate`` of it alone, up to a near-tie.

No call may take the torch fallback of the kernels ("kernel not used"), nor a fallback of the backend (the docs
list none for these rows; DeepSeek-V3's 192/128 decode steps run on the decode kernel).
"""

import re
import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch  # noqa: E402
import architecture_matrix as matrix  # noqa: E402 - tests/ is on sys.path (rootdir-relative imports)
from transformers import AutoModelForCausalLM  # noqa: E402

from .greedy import first_divergence_is_near_tie  # noqa: E402

DEV = "cuda"
# The docs' cell, whichever transformers made the table: a row whose behaviour differs under the installed
# release fails below (an unexpected fallback) rather than dropping out of the parameter set.
ROWS = [m for m in matrix.REPRESENTATIVE if matrix.docs_table()[1].get(m) == "our kernels"]
# Phi-2's and StableLM's own head dim, 80, which no forward or backward build takes: prefill runs the kernels on
# q, k, v zero-padded to 128 (Hopper) or 96, decode and generate_batch run the decode kernels built at 80.
HEAD_DIM_80 = dict(matrix.KERNEL_SIZES, hidden_size=320, head_dim=80)  # 4 heads of 80 (phi, stablelm: hidden / heads)
PARAMS = [pytest.param((m, matrix.KERNEL_SIZES), id=m) for m in ROWS] + [
    pytest.param((m, HEAD_DIM_80), id=f"{m}-head-dim-80") for m in ("phi", "stablelm")
]


def _twins(model_type, sizes):
    """bf16 patched model and its bf16 reference with the same seed-0 weights, on the GPU."""
    config = matrix.tiny_config(model_type, sizes)
    torch.manual_seed(0)
    ref = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(DEV).eval()
    ref.set_attn_implementation(matrix.reference_name(ref))
    ours = AutoModelForCausalLM.from_config(matrix.tiny_config(model_type, sizes), attn_implementation="eager").to(DEV)
    ours.load_state_dict(ref.state_dict())
    hf_flashpatch.patch(ours.eval())
    return ours.to(torch.bfloat16), ref


def _kernel_fallbacks(caught):
    return [str(w.message) for w in caught if "kernel not used" in str(w.message)]


def _backend_fallbacks(caught):
    """The reasons of the backend's fallback warnings ("... cannot serve <Module> (<reason>: ...")."""
    found = (re.search(r"cannot serve \w+ \(([^:]+):", str(w.message)) for w in caught)
    return sorted({m.group(1) for m in found if m})


def _assert_same_or_near_tie(model, reference, context, got, want, what):
    ok, where = first_divergence_is_near_tie(model, context, got, want, reference)
    assert ok, f"{what}: {where}"


@pytest.fixture(params=PARAMS)
def twins(request, monkeypatch):
    from hf_flashpatch.backend import unsupported

    monkeypatch.setattr(unsupported, "_warned", set())
    model_type, sizes = request.param
    ours, ref = _twins(model_type, sizes)
    if sizes is HEAD_DIM_80:
        assert ours.model.layers[0].self_attn.head_dim == 80, ours.model.layers[0].self_attn
    return model_type, ours, ref


def test_padded_logits_and_greedy_generate(twins):
    """(a) and (b); only the fallbacks the docs list for the row."""
    model_type, ours, ref = twins
    reference = matrix.reference_name(ref)
    ids, mask = (t.to(DEV) for t in matrix.padded_batch())
    real = mask.bool()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = ours(input_ids=ids, attention_mask=mask).logits[real].float()
        exact = ref(input_ids=ids, attention_mask=mask).logits[real].float()
        ref_bf16 = ref.to(torch.bfloat16)(input_ids=ids, attention_mask=mask).logits[real].float()
        greedy_ours = ours.generate(input_ids=ids, attention_mask=mask, **matrix.GREEDY)
        greedy_ref = ref.generate(input_ids=ids, attention_mask=mask, **matrix.GREEDY)
    assert not _kernel_fallbacks(caught), _kernel_fallbacks(caught)
    assert _backend_fallbacks(caught) == [], _backend_fallbacks(caught)  # DeepSeek-V3's 192/128 decode included
    assert torch.isfinite(got).all()
    err, err_ref = (got - exact).abs().max().item(), (ref_bf16 - exact).abs().max().item()
    assert err <= 2 * err_ref + 1e-2, (err, err_ref)
    prompt_len = ids.shape[1]
    for row in range(ids.shape[0]):
        context = ids[row][real[row]].tolist()
        _assert_same_or_near_tie(ref, reference, context, greedy_ours[row, prompt_len:].tolist(),
                                 greedy_ref[row, prompt_len:].tolist(), f"generate row {row}")  # fmt: skip


def test_generate_batch(twins):
    """(c); a skip only where transformers' own generate_batch of the reference fails too (as in the CPU matrix:
    its page cache does not take every attention layout, e.g. DeepSeek-V3's latent attention)."""
    model_type, ours, ref = twins
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            batched = matrix.batch_generate(ours)
        except RuntimeError:
            matrix._reference_or_skip(lambda: matrix.batch_generate(ref.to(torch.bfloat16)), "generate_batch", ref,
                                      model_type)  # fmt: skip
            raise  # transformers' run works: ours must too
        alone = [ours.generate(input_ids=torch.tensor([p], device=DEV), **matrix.GREEDY)[0, len(p):].tolist()
                 for p in matrix.PROMPTS]  # fmt: skip
    assert not _kernel_fallbacks(caught), _kernel_fallbacks(caught)
    for prompt, tokens, want in zip(matrix.PROMPTS, batched, alone):
        _assert_same_or_near_tie(ref.to(torch.bfloat16), matrix.reference_name(ref), prompt, tokens, want,
                                 f"generate_batch prompt {prompt}")  # fmt: skip
