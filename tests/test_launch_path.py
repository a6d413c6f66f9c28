"""The host side of a kernel call, on CPU (builds and launches are faked):

- the parameter buffer has the C ABI layout the CUDA kernel reads (checked against ctypes);
- a decode plan is made once per shape and reused by every layer of a step;
- :func:`hf_flashpatch.kernels.call_op` runs the function behind a custom op in plain eager inference,
  and the op itself wherever torch needs it (grad where the caller names no eager autograd Function: that path
  is in ``test_eager_autograd.py``; fake tensors, dispatch modes, torch.compile).

Layout (batch, seqlen, heads, head_dim).
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from hf_flashpatch.kernels import build, call_op, decode, sources
from launch_recorder import RecordingKernel

_CTYPES = {"P": ctypes.c_void_p, "i": ctypes.c_int32, "I": ctypes.c_uint32, "q": ctypes.c_int64,
           "f": ctypes.c_float}  # fmt: skip


def _unloaded_kernel(arg_types: str) -> build.Kernel:
    kernel = object.__new__(build.Kernel)  # no module load: only the packing is under test
    kernel.entry = "test_entry"
    kernel.set_signature(sources.Signature.flat([f"a{i}" for i in range(len(arg_types))], arg_types))
    return kernel


@pytest.mark.parametrize("arg_types", ["PqqqPi" + "PPqqqqqqPPiPqiPi" + "PqqqPqqqPP" + "iiiiiiffii", "PPfi", "iPfqIP"])
def test_parameter_buffer_has_the_c_layout(arg_types):
    tensor = torch.arange(4)
    values = []
    for i, letter in enumerate(arg_types):
        values.append({"P": tensor if i % 3 else None, "f": 0.5 + i, "I": 2**32 - 1 - i}.get(letter, -7 * i - 1))
    fields = [(f"a{i}", _CTYPES[letter]) for i, letter in enumerate(arg_types)]
    layout = type("Params", (ctypes.Structure,), {"_fields_": fields})
    c_values = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]  # None stays a null pointer
    want = bytes(layout(*c_values))
    got = _unloaded_kernel(arg_types).pack(values)
    assert got == want[: len(got)] and set(want[len(got) :]) <= {0}  # ctypes may pad the struct's tail
    with pytest.raises(TypeError, match="takes"):
        _unloaded_kernel(arg_types).pack(values[:-1])


def test_every_kernel_parameter_list_is_read_from_the_sources():
    """Each extern "C" kernel of cuda/: one letter per parameter, unique names, found in its own file only;
    the shared lists (forward bodies, dK/dV kernels) give the same signature wherever they are used (the dK/dV
    kernel with dQ atomics takes dQ's tensor map first)."""
    entries = {}
    for path in sorted(sources.cuda_source_dir().glob("*.cu")):
        for entry in sources.entry_names(path.read_text()):
            entries[entry] = path.name
    assert {"hfp_attention_forward", "hfp_attention_forward_sm90_ws", "bwd_dkdv", "hfp_decode_split"} <= set(entries)
    for entry, source in entries.items():
        signature = sources.kernel_signature(source, entry)
        assert len(signature.names) == len(signature.letters) > 0 and len(set(signature.names)) == len(signature.names)
        assert set(signature.letters) <= set("PqiIfT") and sources.entry_source(entry) == source
    forward_lists = {sources.kernel_signature(entries[e], e) for e in entries if e.startswith("hfp_attention_forward")}
    assert len(forward_lists) == 1  # fwd.cu, fwd_hopper_ws.cu: FwdParams
    dkdv, dkdv_dq = sources.kernel_signature("bwd.cu", "bwd_dkdv"), sources.kernel_signature("bwd.cu", "bwd_dkdv_dq_atomic")
    maps = ("dq_map", "q_map", "do_map", "stats_map")  # + the wgmma body's TMA maps
    assert dkdv_dq.names == (*maps, *dkdv.names) and dkdv_dq.letters == "TTTT" + dkdv.letters
    assert dkdv_dq.format == "128s" * 4 + dkdv.format  # the maps first: 128 bytes each, nothing to align
    assert sources.kernel_signature("decode.cu", "hfp_decode_split") == sources.kernel_signature(
        "decode.cu", "hfp_decode_combine")  # DecodeParams


@pytest.fixture
def fake_launches(monkeypatch):
    """Every get_kernel request and launch, with the decode path's GPU queries faked."""
    made, launched = [], []

    def get_kernel(build_, entry, device):
        made.append(entry)
        return RecordingKernel(entry, launched)  # the arguments must fit the kernel's parameter list in cuda/

    monkeypatch.setattr(decode, "get_kernel", get_kernel)
    monkeypatch.setattr(decode, "device_arch", lambda device: "sm_90a")
    monkeypatch.setattr(decode, "sm_count", lambda device: 132)
    monkeypatch.setattr(decode, "kernels_unavailable_reason", lambda t: None)
    monkeypatch.setattr(decode.DecodeConfig, "build", lambda self, arch="sm_90a": None)
    decode.decode_plan.cache_clear()  # plans hold the kernels they were made with
    yield made, launched
    decode.decode_plan.cache_clear()


def _decode_step(cache_len: int, layers: int):
    q = torch.randn(2, 1, 8, 64, dtype=torch.float16)  # (B, 1, H, D)
    k = torch.randn(2, cache_len, 2, 64, dtype=torch.float16)  # (B, S_cache, H_kv, D)
    with torch.inference_mode():
        for _ in range(layers):
            decode.decode_forward(q, k, k, None, causal=True, softmax_scale=None, window_left=-1, window_right=-1,
                                  softcap=None)  # fmt: skip


def test_decode_plan_is_made_once_per_step(fake_launches):
    made, launched = fake_launches
    _decode_step(4096, layers=6)
    split_launches = [grid for entry, grid, _args in launched if entry == "hfp_decode_split"]
    assert len(split_launches) == 6 and len(set(split_launches)) == 1
    assert made.count("hfp_decode_split") == 1, made  # one plan for the six layers
    splits = decode.decode_plan.cache_info()
    assert (splits.misses, splits.hits) == (1, 5)
    _decode_step(4097, layers=3)  # the next step: one more key, a new plan for its layers
    assert made.count("hfp_decode_split") == 2
    assert decode.decode_plan.cache_info().hits == 7


def _op_and_impl():
    calls = []

    def impl(x: torch.Tensor, scale: float) -> torch.Tensor:
        calls.append("impl")
        return x * scale

    op = torch.library.custom_op(f"hfp_test::scaled_{len(_OPS)}", mutates_args=())(impl)
    op.register_fake(lambda x, scale: torch.empty_like(x))
    op.register_autograd(lambda ctx, grad: (grad * ctx.scale, None),
                         setup_context=lambda ctx, inputs, output: setattr(ctx, "scale", inputs[1]))  # fmt: skip
    _OPS.append(op)
    dispatched = []

    def counting_op(*args):
        dispatched.append("op")
        return op(*args)

    return counting_op, impl, calls, dispatched


_OPS: list = []


def test_call_op_takes_the_function_in_plain_eager_inference():
    op, impl, calls, dispatched = _op_and_impl()
    x = torch.randn(3)
    with torch.inference_mode():
        assert torch.equal(call_op(op, impl, x, 2.0), x * 2)
    with torch.no_grad():
        call_op(op, impl, x.requires_grad_(), 2.0)  # requires grad, but no grad mode
    assert dispatched == [] and calls == ["impl", "impl"]


def test_call_op_dispatches_where_torch_needs_the_op():
    op, impl, calls, dispatched = _op_and_impl()
    x = torch.randn(3, requires_grad=True)
    y = call_op(op, impl, x, 3.0)  # autograd needs the op's registered backward
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # fake tensors / an active dispatch mode
        fake = call_op(op, impl, torch.empty(5), 2.0)
    assert fake.shape == (5,)
    compiled = torch.compile(lambda t: call_op(op, impl, t, 4.0), backend="eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 4.0))
    assert len(dispatched) == 3, dispatched
