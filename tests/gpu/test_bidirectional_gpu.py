"""Encoder-decoder cross-attention and bidirectional sliding windows (``tests/test_bidirectional_models.py``) on a
GPU, where the kernels serve them: bf16 on CUDA, patched, against the same weights under sdpa. The error at the
real tokens against an fp32 sdpa run is at most twice sdpa's own bf16 error, plus a small eps, and no call takes
the kernels' torch fallback ("kernel not used")."""

import copy
import warnings

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("pycuda")

import hf_flashpatch  # noqa: E402
import test_bidirectional_models as cpu  # noqa: E402 - tests/ is on sys.path (rootdir-relative imports)
from transformers import AutoModel, AutoModelForSeq2SeqLM  # noqa: E402

FALLBACK_MARK = "kernel not used"


@pytest.mark.parametrize("model_type, model_class", [("bart", AutoModelForSeq2SeqLM), ("modernbert", AutoModel),
                                                     ("gemma3_text", AutoModel)])  # fmt: skip
@pytest.mark.parametrize("padding", ["no padding", "right padding", "left padding"])
def test_bf16_error_within_twice_sdpa(model_type, model_class, padding):
    ref, _ = cpu._twins(model_type, model_class)
    ref = ref.cuda()
    ours = hf_flashpatch.patch(copy.deepcopy(ref).to(torch.bfloat16))
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(4, 100, (3, 10), generator=gen).cuda()
    mask = cpu._masks()[padding]
    inputs = dict(input_ids=ids, attention_mask=None if mask is None else mask.cuda())
    if model_class is AutoModelForSeq2SeqLM:
        inputs["decoder_input_ids"] = torch.randint(4, 100, (3, 5), generator=gen).cuda()
    pick = (lambda o: o.logits) if model_class is AutoModelForSeq2SeqLM else (lambda o: o.last_hidden_state)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = pick(ours(**inputs)).float()
    assert not [w for w in caught if FALLBACK_MARK in str(w.message)]
    with torch.no_grad():
        want = pick(ref(**inputs))
        half = pick(copy.deepcopy(ref).to(torch.bfloat16)(**inputs)).float()
    real = slice(None) if model_class is AutoModelForSeq2SeqLM or mask is None else mask.cuda().bool()
    err, bound = (got - want)[real].abs().max(), (half - want)[real].abs().max()
    assert torch.isfinite(got[real]).all() and err <= 2 * bound + 1e-2, (err, bound)
