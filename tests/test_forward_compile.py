"""CPU checks of the forward kernels: every shipped build (mma.sync and Hopper wgmma bodies) compiles for
sm_90a without register spills,
the op's schema and fake (meta) implementation give the documented shapes, and unsupported inputs raise
KernelUnsupported before any GPU work. Layout: q ``(B, S_q, H, D)``, k/v ``(B, S_k, H_kv, D)``.
"""

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from ptxas_report import gpu_fences_before_remote_arrivals, hgmmas_waiting_on_moves, steady_softmax_stretches

from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.kernels.build import compile_cubin, find_nvcc, shared_bytes_of
from hf_flashpatch.kernels.forward import SUPPORTED_HEAD_DIMS, ForwardConfig, all_builds, attention_forward
from hf_flashpatch.kernels.heuristics import HOPPER_SHAPES, HOPPER_VALUE_HEAD_DIM_SHAPES, forward_tile_shape

BUILDS = all_builds()
ALL_COMPILED = BUILDS + all_builds("sm_80")  # Hopper's bodies, and the mma.sync bodies other GPUs run
SMEM_OPT_IN_LIMIT = 232448  # bytes of dynamic shared memory per block on H100/H200
ENTRIES = {"fwd.cu": "hfp_attention_forward", "fwd_hopper_ws.cu": "hfp_attention_forward_sm90_ws"}


def _ptxas_numbers(report: str) -> dict[str, int]:
    numbers = {
        "registers": re.search(r"Used (\d+) registers", report),
        "stack": re.search(r"(\d+) bytes stack frame", report),
        "spill_stores": re.search(r"(\d+) bytes spill stores", report),
        "spill_loads": re.search(r"(\d+) bytes spill loads", report),
    }
    missing = [name for name, match in numbers.items() if match is None]
    assert not missing, f"ptxas -v report lacks {missing}:\n{report}"
    return {name: int(match.group(1)) for name, match in numbers.items()}


@pytest.fixture(scope="module")
def ptxas_reports(tmp_path_factory):
    """Compile every build once, in parallel (CI has 2 cores), into a private cache."""
    if find_nvcc() is None:
        pytest.skip("nvcc not found")
    previous = os.environ.get("HF_FLASHPATCH_CACHE")
    os.environ["HF_FLASHPATCH_CACHE"] = str(tmp_path_factory.mktemp("cubins"))
    try:
        with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            reports = list(pool.map(lambda build: compile_cubin(build, verbose_ptxas=True), ALL_COMPILED))
    finally:
        if previous is None:
            del os.environ["HF_FLASHPATCH_CACHE"]
        else:
            os.environ["HF_FLASHPATCH_CACHE"] = previous
    return dict(zip(ALL_COMPILED, reports))


def _build_id(build) -> str:
    return build.arch + "-" + "-".join(f"{k}={v}" for k, v in build.defines)


@pytest.mark.kernel_build
@pytest.mark.parametrize("build", ALL_COMPILED, ids=_build_id)
def test_build_compiles_without_spills(build, ptxas_reports):
    report = ptxas_reports[build][1]
    numbers = _ptxas_numbers(report)
    assert numbers["spill_stores"] == 0 and numbers["spill_loads"] == 0, f"{build}: {numbers}"
    assert numbers["stack"] == 0, f"{build} uses a local-memory stack frame: {numbers}"
    # ptxas serialised the wgmma pipeline: C7515 (an accumulator touched inside an async window), C7518 (a
    # divergent branch inside one), C7511 / C7512 (too few registers), C7520 (a wgmma in a path it sees as divergent);
    # C7517: it waits for every wgmma before reading registers one defined
    for code in ("C7511", "C7512", "C7515", "C7517", "C7518", "C7520"):
        assert code not in report, f"{_build_id(build)}: wgmma serialised or waited on ({code}):\n{report}"
    assert "serialized" not in report, f"{_build_id(build)}:\n{report}"
    # C7508: ptxas ignored setmaxnreg (the warp-specialised body's register split would silently not apply)
    assert "C7508" not in report, f"{_build_id(build)}:\n{report}"
    # the shared memory the source states (and the launch provides) fits a Hopper block
    assert 0 < shared_bytes_of(ptxas_reports[build][0], ENTRIES[build.source]) <= SMEM_OPT_IN_LIMIT, build


def _find_cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:  # triton wheels ship one
        import triton

        candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        return str(candidate) if candidate.is_file() else None
    except ImportError:
        return None


@pytest.mark.kernel_build
def test_sass_uses_tensor_cores_and_no_local_memory(ptxas_reports, tmp_path):
    cuobjdump = _find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("cuobjdump not found")
    for build, (cubin, _) in ptxas_reports.items():
        path = tmp_path / "kernel.cubin"
        path.write_bytes(cubin)
        sass = subprocess.run([cuobjdump, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
        if build.source.startswith("fwd_hopper"):  # warpgroup MMA, and no fallback to the Ampere instruction
            assert re.search(r"HGMMA\.64x\d+x16\.F32", sass), f"{_build_id(build)}: no wgmma (HGMMA) in the SASS"
            assert "HMMA" not in sass, f"{_build_id(build)}: mma.sync in the Hopper body"
            # A descriptor from a per-thread value would make every later HGMMA of its groups wait on a move. One
            # waiting HGMMA a group is tolerated: at 192/128 (12 k-steps of Q descriptors) ptxas keeps one pair in
            # vector registers, and deriving every descriptor where used instead ran 1-2 % slower
            # (results/2026-12-06_q-descriptor-where-used).
            waiting = {group: n for group, n in hgmmas_waiting_on_moves(sass).items() if n > 1}
            assert not waiting, f"{_build_id(build)}: descriptors moved into uniform registers: {waiting}"
            # Each key loop's exponentials run under its P V (all but a few of a thread's BLOCK_N / 2 a step), not
            # after ptxas moved the P V's wait above them (results/2026-12-07_tensor-row-sums).
            stretches = steady_softmax_stretches(sass)
            exponentials = int(dict(build.defines)["BLOCK_N"]) // 2
            assert stretches and all(s.count("MUFU.EX2") >= exponentials - 8 for s in stretches), (
                f"{_build_id(build)}: exponentials after the P V wait: "
                f"{[s.count('MUFU.EX2') for s in stretches]} of {exponentials}")
            if dict(build.defines).get("KV_CLUSTER"):  # multicast loads, slots handed back to the other CTA unfenced
                assert "UTMALDG.4D.MULTICAST" in sass and "SYNCS.ARRIVE.TRANS64.RED" in sass, _build_id(build)
                fences = gpu_fences_before_remote_arrivals(sass)
                assert not fences, f"{_build_id(build)}: a GPU-wide fence before each remote arrival: {fences[:1]}"
        else:
            assert "HMMA.16816.F32" in sass, f"{_build_id(build)}: no m16n8k16 tensor-core MMA in the SASS"
        assert not re.search(r"\b(LDL|STL)\b", sass), f"{_build_id(build)}: local-memory traffic in the SASS"


def test_all_builds_cover_every_dtype_head_dim_and_mask():
    def key(b):
        defines = dict(b.defines)
        return defines["ELEM_BF16"], defines["HEAD_DIM"], defines.get("HEAD_DIM_V"), defines["HAS_MASK"]

    configs = {key(b) for b in BUILDS}
    # one build per dtype x head dim x masking: mma.sync at d32/d96/d256, the warp-specialised wgmma body at
    # d64/d128 and at q/k 192 with v 128 (multi-head latent attention); masked d128 has a second, for walks of one
    # work tile per CTA (heuristics.forward_tile_shape: the math warps copy Q), and unmasked d128 a second, its plain
    # build beside the K/V multicast one (for walks that cannot take clusters: heuristics.clustered_schedule), each
    # chained with its split last round, chained without it, and the same tiles work by work (heuristics.chain_form)
    pairs = len(HOPPER_VALUE_HEAD_DIM_SHAPES)
    assert len(configs) == (len(SUPPORTED_HEAD_DIMS) + pairs) * 2 * 2
    assert len(BUILDS) == len(configs) + 2 + 2 * 5
    count = {k: sum(key(b) == k for b in BUILDS) for k in configs}
    assert sorted(k for k, n in count.items() if n == 2) == [("0", "128", "128", "1"), ("1", "128", "128", "1")]
    assert sorted(k for k, n in count.items() if n == 6) == [("0", "128", "128", "0"), ("1", "128", "128", "0")]
    chained = [b for b in BUILDS if dict(b.defines).get("CHAINED_WALK")]
    assert [(dict(b.defines)["HEAD_DIM"], dict(b.defines)["HAS_MASK"]) for b in chained] == [("128", "0")] * 8
    assert sum(dict(b.defines).get("SPLIT_TAIL") == "1" for b in chained) == 4
    clustered = [b for b in BUILDS if dict(b.defines).get("KV_CLUSTER")]
    assert [(dict(b.defines)["HEAD_DIM"], dict(b.defines)["HAS_MASK"]) for b in clustered] == [("128", "0")] * 6
    assert {(d, d_v) for _, d, d_v, _ in configs if d_v not in (None, d)} == {
        (str(d), str(d_v)) for d, d_v in HOPPER_VALUE_HEAD_DIM_SHAPES}
    assert {b.source for b in BUILDS} == {"fwd.cu", "fwd_hopper_ws.cu"}
    assert {b.source for b in all_builds("sm_80")} == {"fwd.cu"}


def test_hopper_shape_has_a_producer_warpgroup_and_64_rows_per_math_warpgroup():
    for head_dim in (64, 128):
        for has_mask in (False, True):
            shape = forward_tile_shape(head_dim, "sm_90a", has_mask=has_mask)
            assert shape.wgmma and shape.block_m == 64 * (shape.num_warps // 4 - 1), (head_dim, has_mask)
            assert ForwardConfig.for_problem(head_dim, "bf16", has_mask, shape).build("sm_90a").source == "fwd_hopper_ws.cu"
    assert not forward_tile_shape(128, "sm_80", has_mask=True).wgmma  # other GPUs keep the mma.sync body


def test_schedule_choices_and_math_warpgroups_reach_the_build():
    """The shipped shapes' schedule choices are compile-time defines of the one Hopper body, and the
    mma.sync body refuses them (it has no producer warpgroup)."""
    for (head_dim, has_mask), shape in HOPPER_SHAPES.items():
        defines = dict(ForwardConfig.for_problem(head_dim, "bf16", has_mask, shape).build("sm_90a").defines)
        assert defines["NUM_WG"] == str(shape.block_m // 64), (head_dim, has_mask)
        assert defines["KV_STAGES"] == str(shape.kv_stages), (head_dim, has_mask)
        assert defines["Q_BY_TMA"] == str(int(shape.q_by_tma)), (head_dim, has_mask)
        assert defines["OWN_KEY_TILES"] == str(int(shape.own_key_tiles)), (head_dim, has_mask)
    assert forward_tile_shape(64, "sm_90a").block_m == 192  # d64: three math warpgroups
    with pytest.raises(ValueError, match="wgmma body"):
        ForwardConfig(head_dim=128, dtype="bf16", block_m=128, block_n=64, num_warps=4, q_by_tma=True)
    with pytest.raises(ValueError, match="3 at d64"):  # three math warpgroups serve d64 only
        ForwardConfig(head_dim=128, dtype="bf16", block_m=192, block_n=128, num_warps=16, kv_stages=2, wgmma=True)


def test_wgmma_body_only_on_sm90a():
    for head_dim, has_mask in HOPPER_SHAPES:
        assert forward_tile_shape(head_dim, "sm_90a", has_mask=has_mask).wgmma
        assert not forward_tile_shape(head_dim, "sm_80", has_mask=has_mask).wgmma  # Ampere / Ada: the mma.sync body
    assert not forward_tile_shape(96, "sm_90a").wgmma  # head dims the wgmma body does not serve
    config = ForwardConfig.for_problem(128, "bf16", False, forward_tile_shape(128, "sm_90a"), "sm_90a")
    with pytest.raises(KernelUnsupported, match="sm_90a"):
        config.build("sm_89")


@pytest.mark.parametrize("head_dim", SUPPORTED_HEAD_DIMS)
def test_tile_shapes_are_valid(head_dim):
    for arch in ("sm_90a", "sm_80"):
        for masked in (False, True):
            shape = forward_tile_shape(head_dim, arch, masked)
            config = ForwardConfig.for_problem(head_dim, "bf16", masked, shape)  # validates divisibility
            assert config.build(shape.wgmma and "sm_90a" or "sm_80").source in ENTRIES, config


def test_config_rejects_bad_tiles():
    with pytest.raises(ValueError, match="head_dim"):
        ForwardConfig(head_dim=80, dtype="bf16", block_m=128, block_n=64, num_warps=4)
    with pytest.raises(ValueError, match="invalid tile"):
        ForwardConfig(head_dim=64, dtype="bf16", block_m=96, block_n=64, num_warps=4)
    with pytest.raises(ValueError, match="invalid wgmma tile"):
        ForwardConfig(head_dim=128, dtype="bf16", block_m=128, block_n=128, num_warps=8, wgmma=True)  # no producer
    with pytest.raises(ValueError, match="invalid wgmma tile"):
        ForwardConfig(head_dim=96, dtype="bf16", block_m=128, block_n=128, num_warps=8, wgmma=True)
    multicast = dict(head_dim=128, dtype="bf16", block_m=128, block_n=160, num_warps=12, wgmma=True, kv_cluster=2)
    ForwardConfig(**multicast)  # the unmasked d128 shape's
    with pytest.raises(ValueError, match="invalid wgmma tile"):  # a masked walk's works see different key tiles
        ForwardConfig(**multicast, has_mask=True)
    with pytest.raises(ValueError, match="invalid wgmma tile"):
        ForwardConfig(**{**multicast, "kv_cluster": 4})
    with pytest.raises(ValueError, match="the wgmma body's"):
        ForwardConfig(head_dim=128, dtype="bf16", block_m=128, block_n=64, num_warps=4, kv_cluster=2)
    chained = {**multicast, "tma_output": True, "chained_walk": True}
    ForwardConfig(**chained)  # the unmasked d128 shape's
    for wrong in ({"has_mask": True}, {"tma_output": False}, {"block_n": 64}):  # masks, no boxes, rescale after P V
        with pytest.raises(ValueError, match="chained walk"):
            ForwardConfig(**{**chained, **wrong})
    with pytest.raises(ValueError, match="the wgmma body's"):
        ForwardConfig(head_dim=128, dtype="bf16", block_m=128, block_n=64, num_warps=4, chained_walk=True)
    with pytest.raises(ValueError, match="chained walk"):  # its turns lost (notes/forward.md, decision log)
        ForwardConfig(**{**chained, "warpgroup_turns": True})
    with pytest.raises(ValueError, match="the wgmma body's"):
        ForwardConfig(head_dim=128, dtype="bf16", block_m=128, block_n=64, num_warps=4, warpgroup_turns=True)
    # the warpgroups' turns: the masked d128 builds only (the walks and the one-tile-per-CTA form), a build define
    turns = [b for b in BUILDS if dict(b.defines).get("WARPGROUP_TURNS")]
    assert [(dict(b.defines)["HEAD_DIM"], dict(b.defines)["HAS_MASK"]) for b in turns] == [("128", "1")] * 4
    assert all(dict(b.defines)["WARPGROUP_TURNS"] == "1" for b in turns)


def test_op_schema_and_fake_shapes():
    schema = str(torch.ops.hf_flashpatch.attention_forward.default._schema)
    assert "Tensor? cu_seqlens_q" in schema and schema.endswith("-> (Tensor, Tensor)")
    q = torch.empty(2, 7, 8, 64, device="meta", dtype=torch.bfloat16)  # (B, S_q, H, D)
    k = torch.empty(2, 9, 2, 64, device="meta", dtype=torch.bfloat16)  # (B, S_k, H_kv, D)
    out, lse = torch.ops.hf_flashpatch.attention_forward(q, k, k, None, None, 0, 0, 0.125, True, -1, 0, 0.0, False)
    assert out.shape == (2, 7, 8, 64) and out.dtype == torch.bfloat16
    assert lse.shape == (2, 8, 7) and lse.dtype == torch.float32
    qv = torch.empty(30, 8, 64, device="meta", dtype=torch.float16)  # (T_q, H, D)
    kv = torch.empty(40, 1, 64, device="meta", dtype=torch.float16)  # (T_k, H_kv, D)
    cu = torch.empty(4, device="meta", dtype=torch.int32)
    out, lse = torch.ops.hf_flashpatch.attention_forward(qv, kv, kv, cu, cu, 16, 20, 0.125, False, -1, -1, 0.0, False)
    assert out.shape == (30, 8, 64) and lse.shape == (8, 30)
    v192 = torch.empty(2, 9, 2, 128, device="meta", dtype=torch.bfloat16)  # (B, S_k, H_kv, D_v): out takes D_v
    q192 = torch.empty(2, 7, 8, 192, device="meta", dtype=torch.bfloat16)
    k192 = torch.empty(2, 9, 2, 192, device="meta", dtype=torch.bfloat16)
    out, _ = torch.ops.hf_flashpatch.attention_forward(q192, k192, v192, None, None, 0, 0, 0.1, True, -1, 0, 0.0, False)
    assert out.shape == (2, 7, 8, 128)


@pytest.mark.parametrize(
    "dtype,head_dim,match", [(torch.float32, 64, "got torch.float32"), (torch.bfloat16, 264, "up to 256.*got q")]
)
def test_unsupported_inputs_raise_before_launch(dtype, head_dim, match):
    q = torch.randn(1, 4, 2, head_dim, dtype=dtype)
    with pytest.raises(KernelUnsupported, match=match):
        attention_forward(q, q, q, causal=False, softmax_scale=None, window_left=-1, window_right=-1, softcap=None)
