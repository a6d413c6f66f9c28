"""CPU checks of the backward kernel: every shipped build compiles for sm_90a and for sm_80 (the mma.sync
bodies every other GPU takes) without register spills (needs nvcc), tile configs fit, the torch fallback
matches the oracle, and the autograd gets registered.

Builds come from :func:`hf_flashpatch.kernels.backward.all_builds` (head dims 32/64/96/128/192/256 x
bf16/fp16 x softcap x deterministic) for each arch; each holds the preprocess, dK/dV (atomic-dQ and
deterministic), dQ and convert kernels. ptxas' report must show every entry point with 0
bytes of spill stores and loads, and the SASS must hold m16n8k16 HMMA and no local-memory traffic (when
cuobjdump is at hand).
"""

import dataclasses
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from ptxas_report import descriptor_moves_inside_wgmma_groups, spills_by_entry

from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.kernels.backward import BackwardConfig, all_builds
from hf_flashpatch.kernels.build import compile_cubin, find_nvcc, shared_bytes_of

ENTRIES = {"bwd_preprocess", "bwd_dkdv_dq_atomic", "bwd_dkdv", "bwd_dq", "bwd_convert_dq"}

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


@pytest.mark.kernel_build
@needs_nvcc
def test_all_backward_builds_compile_without_spills():
    builds = all_builds() + all_builds("sm_80")
    # per arch 24 default-body builds (6 head dims x 2 dtypes x softcap: the deterministic path at d64/d128)
    # + 8 at d64/d128 x dtypes x softcap: the wgmma body on sm_90a, the tiled body on sm_80
    # + on sm_90a 2 wgmma builds of q/k 192 with v 128 (x dtypes; no softcap)
    assert len(builds) == len(set(builds)) == 66
    assert sum(("BWD_TILED", "1") in b.defines for b in builds) == 8
    assert sum(("BWD_WGMMA", "1") in b.defines for b in builds) == 10
    assert sum(("BWD_WGMMA_BLOCK_M", "128") in b.defines for b in builds) == 4
    assert sum(("HEAD_DIM_V", "128") in b.defines for b in builds) == 2
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        reports = list(pool.map(lambda b: compile_cubin(b, verbose_ptxas=True), builds))
    for build, (cubin, report) in zip(builds, reports):
        assert cubin, f"empty cubin for {build}"
        spills = spills_by_entry(report)
        # a v head dim of its own: no deterministic pair (bwd_dkdv, bwd_dq) in the build
        entries = ENTRIES - {"bwd_dkdv", "bwd_dq"} if any(n == "HEAD_DIM_V" for n, _ in build.defines) else ENTRIES
        assert set(spills) == entries, f"{build}: entries {sorted(spills)}"
        spilled = {name: s for name, s in spills.items() if s != (0, 0)}
        assert not spilled, f"{build} spills registers (store, load bytes): {spilled}"
        # the shared memory each entry's source states (and the launch provides) fits a Hopper block
        shared = {entry: shared_bytes_of(cubin, entry) for entry in entries}
        assert all(0 < shared[e] <= SMEM_OPT_IN_LIMIT for e in entries & {"bwd_dkdv", "bwd_dkdv_dq_atomic", "bwd_dq"})
        assert shared["bwd_preprocess"] == shared["bwd_convert_dq"] == 0, shared
        # ptxas serialised the wgmma pipeline: C7515 (an accumulator touched inside an async window), C7518 (a
        # divergent branch inside one), C7511 / C7512 (too few registers), C7520 (a wgmma in a path it sees as
        # divergent); C7517: it waits for every wgmma before reading registers one defined
        for code in ("C7511", "C7512", "C7515", "C7517", "C7518", "C7520"):
            assert code not in report, f"{build}: wgmma serialised or waited on ({code}):\n{report}"


def _find_cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton  # its wheel ships cuobjdump
    except ImportError:
        return None
    candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(candidate) if candidate.is_file() else None


@pytest.mark.kernel_build
@needs_nvcc
def test_backward_sass_uses_tensor_cores_and_no_local_memory(tmp_path):
    cuobjdump = _find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found")
    builds = [b for b in all_builds() + all_builds("sm_80") if ("HEAD_DIM", "128") in b.defines]  # bodies x dtypes x softcap
    builds += [b for b in all_builds() if ("HEAD_DIM_V", "128") in b.defines]  # q/k 192, v 128
    for build in builds:
        path = tmp_path / "bwd.cubin"
        path.write_bytes(compile_cubin(build)[0])
        sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        if ("HEAD_DIM_V", "128") not in build.defines:  # bwd_dq, bwd_dkdv (the deterministic pair)
            assert "HMMA.16816.F32" in sass, f"{build}: no m16n8k16 tensor-core MMA in the SASS"
        if ("BWD_WGMMA", "1") in build.defines:
            atomic = subprocess.run([cuobjdump, "-sass", "-fun", "bwd_dkdv_dq_atomic", str(path)], capture_output=True,
                                    text=True, check=True).stdout  # fmt: skip
            assert re.search(r"HGMMA\.64x128x16\.F32", atomic) and "HMMA" not in atomic, f"{build}: not on wgmma"
            # wgmma kept asynchronous: ptxas serialising it puts a wait behind every HGMMA
            waits, mmas = atomic.count("WARPGROUP.DEPBAR"), len(re.findall(r"\bHGMMA\.", atomic))
            assert waits * 4 < mmas, f"{build}: {waits} wgmma waits for {mmas} HGMMA (serialised)"
            moves = descriptor_moves_inside_wgmma_groups(atomic)  # each HGMMA of the chain would wait on them
            assert not moves, f"{build}: descriptors moved into uniform registers inside a wgmma chain: {moves[:2]}"
        assert not re.search(r"\b(LDL|STL)\b", sass), f"{build}: local-memory loads/stores in the SASS"


# ------------------------------------------------------------------------------- config and fallback (no nvcc needed)

SMEM_OPT_IN_LIMIT = 232448  # bytes of dynamic shared memory per block on H100/H200


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("softcap", [False, True])
def test_config_tiles_fit(head_dim, softcap):
    import torch

    from hf_flashpatch.kernels.backward import BackwardConfig

    cfg = BackwardConfig.choose(head_dim, torch.bfloat16, softcap)
    assert cfg.block_n % 16 == 0 and cfg.block_m % 16 == 0 and head_dim % cfg.d_split == 0
    dq_row_warps = min(cfg.block_m // 16, cfg.num_warps)
    dq_cols = head_dim // (cfg.num_warps // dq_row_warps)
    assert dq_cols % min(cfg.dq_chunk, dq_cols) == 0, "dQ column chunks must tile a warp's columns"


def test_config_refuses_what_it_does_not_serve():
    import torch

    from hf_flashpatch import KernelUnsupported
    from hf_flashpatch.kernels.backward import BackwardConfig

    with pytest.raises(KernelUnsupported, match="head_dim"):
        BackwardConfig.choose(80, torch.bfloat16, False)
    with pytest.raises(KernelUnsupported, match="float32"):
        BackwardConfig.choose(64, torch.float32, False)


@pytest.mark.parametrize(
    "seqlens,heads,causal,window,softcap",
    [((37, 53), (4, 2), True, (-1, -1), None), ((53, 37), (4, 1), False, (5, 3), 7.0), ((20, 9), (2, 2), True, (-1, -1), None)],
)  # fmt: skip
def test_torch_fallback_matches_oracle(seqlens, heads, causal, window, softcap):
    """The documented fallback (the op on CPU) against autograd through the fp32 reference."""
    import math
    import warnings

    import torch

    from hf_flashpatch.kernels import backward
    from hf_flashpatch.reference import attention_reference, normalize_window

    (sq, sk), (h, hk) = seqlens, heads
    q = torch.randn(2, sq, h, 32, dtype=torch.float64, requires_grad=True)  # (B, S_q, H, D)
    k = torch.randn(2, sk, hk, 32, dtype=torch.float64, requires_grad=True)  # (B, S_k, H_kv, D)
    v = torch.randn(2, sk, hk, 32, dtype=torch.float64, requires_grad=True)
    out, lse = attention_reference(q, k, v, causal=causal, window=window, softcap=softcap)
    dout = torch.randn_like(out)
    out.backward(dout)
    left, right = normalize_window(window, causal)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "backward kernel not used (tensor is on cpu)"
        grads = backward._backward_op(dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None,
                                      None, None, sq, sk, 1 / math.sqrt(32), left, right, softcap or 0.0, False)  # fmt: skip
    for g, ref in zip(grads, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(g, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("first", ["backward", "forward"])
def test_autograd_registered_whichever_module_is_imported_first(first):
    """The forward op is differentiable once the forward module is imported, whichever kernels module came
    first, and the backward module never imports the forward one (no import cycle)."""
    import subprocess
    import sys

    code = (
        f"import sys, torch\nfrom hf_flashpatch.kernels import {first}\n"
        "assert 'hf_flashpatch.kernels.forward' not in sys.modules or 'hf_flashpatch.kernels.backward' in sys.modules\n"
        "from hf_flashpatch.kernels import backward, forward\n"
        "assert backward._registered, 'autograd not registered'\n"
        "q = torch.randn(1, 5, 2, 16, requires_grad=True)\n"
        "out, _ = forward.attention_forward(q, q.detach(), q.detach(), causal=True, softmax_scale=None,\n"
        "    window_left=-1, window_right=0, softcap=None, torch_fallback=True)\n"
        "out.sum().backward()\nassert q.grad is not None and torch.isfinite(q.grad).all()\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    backward_source = (root / "hf_flashpatch" / "kernels" / "backward.py").read_text()
    assert "import forward" not in backward_source and "from .forward" not in backward_source


def test_body_choice():
    """On sm_90a the wgmma body with mbarrier-handed stages at d64/d128 (d64 with 128-query steps);
    elsewhere the tiled body (d64 with 128-query steps, d128 softcap with unroll 1); the default body for
    other head dims and for deterministic=True."""
    import torch

    for head_dim in (64, 128):
        hopper = BackwardConfig.choose(head_dim, torch.bfloat16, False, "sm_90a")
        assert hopper.body == "wgmma" and ("BWD_WGMMA", "1") in hopper.build().defines
        assert hopper.wgmma_block_m == (128 if head_dim == 64 else 64)
        ampere = BackwardConfig.choose(head_dim, torch.bfloat16, False, "sm_80")
        assert ampere.body == "tiled" and ampere.arch == "sm_80" and ampere.block_n == 128
        assert ("BWD_TILED", "1") in ampere.build().defines
        for arch in ("sm_90a", "sm_80"):
            assert BackwardConfig.choose(head_dim, torch.bfloat16, False, arch, deterministic=True).body == "default"
    assert BackwardConfig.choose(64, torch.bfloat16, False, "sm_80").tiled_block_m == 128
    assert BackwardConfig.choose(128, torch.bfloat16, True, "sm_86").tiled_unroll == 1  # unroll 2 spills there
    with pytest.raises(KernelUnsupported, match="sm_90a"):
        dataclasses.replace(BackwardConfig.choose(128, torch.bfloat16, False), arch="sm_80").build()
    default = BackwardConfig.choose(96, torch.bfloat16, False)
    assert default.body == "default" and not any(name in ("BWD_TILED", "BWD_WGMMA") for name, _ in default.build().defines)


def test_tiled_body_serves_d64_d128_off_hopper():
    import torch

    for head_dim in (64, 128):
        for softcap in (False, True):
            cfg = BackwardConfig.choose(head_dim, torch.bfloat16, softcap, "sm_80")
            assert cfg.body == "tiled"
            assert 2 * cfg.tiled_block_m <= cfg.threads and cfg.tiled_block_m % 64 == 0


@pytest.mark.parametrize("kv_heads,batch,key_blocks", [(8, 1, 32), (8, 2, 16), (1, 3, 5), (4, 6, 1), (32, 8, 16),
                                                        (32, 1, 128), (8, 1, 132)])  # fmt: skip
def test_dkdv_grid_covers_every_block_once(kv_heads, batch, key_blocks):
    """The dK/dV grid, decoded as cuda/bwd_common.cuh's dkdv_block does, names every (key block, kv head, batch)
    once. Up to HEAVY_FIRST_MAX_WAVES waves (132 SMs) key blocks never decrease within a sequence in dispatch
    order (x fastest, then y, then z): heaviest first; beyond that one head's blocks run together."""
    from hf_flashpatch.kernels.backward import HEAVY_FIRST_MAX_WAVES, dkdv_grid

    (gx, gy, gz), heavy_first = dkdv_grid(kv_heads, batch, key_blocks, sms=132)
    assert heavy_first == (kv_heads * batch * key_blocks <= HEAVY_FIRST_MAX_WAVES * 132)
    assert dkdv_grid(kv_heads, batch, key_blocks, sms=132, choice=False) == ((kv_heads, key_blocks, batch), 1)
    seen, last_n, last_head = [], {}, {}
    for z in range(gz):
        for y in range(gy):
            for x in range(gx):
                n, hk, b = (y, x, z) if heavy_first else (x, y, z)
                if heavy_first:
                    assert n >= last_n.get(b, 0)
                    last_n[b] = n
                else:
                    assert hk >= last_head.get(b, 0)
                    last_head[b] = hk
                seen.append((n, hk, b))
    assert sorted(seen) == sorted((n, h, b) for n in range(key_blocks) for h in range(kv_heads) for b in range(batch))


def test_dkdv_grid_refuses_past_the_hardware_limit():
    from hf_flashpatch.kernels.backward import dkdv_grid

    with pytest.raises(KernelUnsupported, match="65536 key blocks"):
        dkdv_grid(8, 1, 65536, sms=132)
