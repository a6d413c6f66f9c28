"""The host path of a kernel call asks for the same derived values on every launch; each is made once and looked up
after (CPU, no GPU): a forward config and its build, a backward config's build, a device's arch, a tensor's TMA map.
And :func:`hf_flashpatch.kernels.aligned` keeps exactly the tensors the kernels can read in place, copying the rest
to a fresh, aligned allocation.

Layouts: q/k/v ``(B, S, H, D)``.
"""

from __future__ import annotations

import pytest
import torch

from hf_flashpatch.kernels import aligned, backward, build, forward, tma
from hf_flashpatch.kernels.heuristics import forward_tile_shape


@pytest.mark.parametrize("head_dim, has_mask", [(64, True), (128, False), (96, False)])
def test_a_forward_config_and_its_build_are_made_once(head_dim, has_mask):
    shape = forward_tile_shape(head_dim, "sm_90a", has_mask)
    config = forward.ForwardConfig.for_problem(head_dim, "bf16", has_mask, shape, "sm_90a")
    assert forward.ForwardConfig.for_problem(head_dim, "bf16", has_mask, shape, "sm_90a") is config
    made = config.build("sm_90a")
    assert config.build("sm_90a") is made and made == type(config).build.__wrapped__(config, "sm_90a")
    fp16 = forward.ForwardConfig.for_problem(head_dim, "fp16", has_mask, shape, "sm_90a")
    assert fp16 != config and fp16.build("sm_90a") != made  # the dtype keys both
    if not shape.wgmma:
        assert config.build("sm_80") != made and config.build("sm_80").arch == "sm_80"  # the arch keys the build


def test_an_invalid_forward_config_is_refused_every_time():
    shape = forward_tile_shape(64, "sm_90a", False)
    for _ in range(2):  # a refusal is not remembered as a config
        with pytest.raises(ValueError, match="dtype"):
            forward.ForwardConfig.for_problem(64, "fp32", False, shape, "sm_90a")


def test_a_backward_build_is_made_once_per_config():
    config = backward.BackwardConfig.choose(128, torch.bfloat16, False, "sm_90a")
    made = config.build()
    assert config.build() is made and made == type(config).build.__wrapped__(config)
    assert backward.BackwardConfig.choose(128, torch.bfloat16, False, "sm_90a").build() is made  # an equal config
    other = backward.BackwardConfig.choose(128, torch.bfloat16, True, "sm_90a")
    assert other.build() != made and ("HAS_SOFTCAP", "1") in other.build().defines


def test_a_devices_arch_is_asked_of_torch_once(monkeypatch):
    asked = []
    capabilities = {0: (9, 0), 1: (8, 6)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or capabilities[index])
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    build._arch_of_device.cache_clear()
    try:
        assert [build.device_arch(torch.device("cuda", 0)) for _ in range(3)] == ["sm_90a"] * 3
        assert build.device_arch(torch.device("cuda")) == "sm_86"  # no index: the current device's
        assert build.device_arch(torch.device("cuda", 1)) == "sm_86"
        assert asked == [0, 1]
    finally:
        build._arch_of_device.cache_clear()


def test_a_tensor_map_is_looked_up_before_its_geometry(monkeypatch):
    encoded, measured = [], []
    real_geometry = tma.map_geometry
    monkeypatch.setattr(tma, "_encoded", lambda t, *args: encoded.append(args) or bytes([len(encoded)]) * 128)
    monkeypatch.setattr(tma, "map_geometry", lambda *args: measured.append(args) or real_geometry(*args))
    monkeypatch.setattr(tma, "_described", {})
    k = torch.randn(2, 300, 4, 128, dtype=torch.bfloat16)  # (B, S, H, D)
    first = tma.descriptor(k, 128)
    assert tma.descriptor(k, 128) is first and len(encoded) == len(measured) == 1
    assert tma.descriptor(k, 64) != first and len(encoded) == 2  # another box
    view = k.view(2, 300, 8, 64)  # the same address, another layout: its own map
    assert tma.descriptor(view, 128) != first and encoded[-1][1][:3] == (64, 8, 300)  # (type, dims, strides, box)
    transposed = torch.randn(2, 4, 300, 128, dtype=torch.bfloat16).transpose(1, 2)  # transformers' view
    tma.descriptor(transposed, 128)
    assert encoded[-1][2] == (300 * 256, 256, 4 * 300 * 256)  # its own (heads, rows, batch) strides
    assert len(encoded) == len(measured) == 4


def test_aligned_keeps_exactly_what_the_kernels_read_in_place():
    t = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16)
    assert aligned(t) is t
    transposed = torch.randn(2, 4, 16, 64, dtype=torch.bfloat16).transpose(1, 2)  # strided rows, contiguous last dim
    assert aligned(transposed) is transposed
    copies = {
        "last dim strided": torch.randn(2, 16, 64, 4, dtype=torch.bfloat16).transpose(2, 3),
        "address off 16 bytes": torch.randn(2 * 16 * 4 * 64 + 1, dtype=torch.bfloat16)[1:].view(2, 16, 4, 64),
        "head stride not 16 bytes": torch.randn(2, 16, 4, 68, dtype=torch.bfloat16)[..., :64],
    }
    for name, bad in copies.items():
        got = aligned(bad)
        assert got is not bad and got.is_contiguous() and got.data_ptr() % 16 == 0 and torch.equal(got, bad), name
    assert copies["address off 16 bytes"].is_contiguous()  # contiguous() would have kept its address


def test_decode_copies_a_contiguous_q_at_an_unaligned_address():
    from hf_flashpatch.kernels.decode import _aligned_q

    q = torch.randn(4 * 1 * 8 * 64 + 1, dtype=torch.bfloat16)[1:].view(4, 1, 8, 64)  # (B, 1, H, D), 2 bytes off
    got = _aligned_q(q)
    assert q.is_contiguous() and q.data_ptr() % 16 and got.data_ptr() % 16 == 0 and torch.equal(got, q)
    fine = torch.randn(4, 1, 8, 64, dtype=torch.bfloat16)
    assert _aligned_q(fine) is fine
