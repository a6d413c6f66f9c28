"""Compile every shipped kernel build and write or compare a manifest of cubin sha256s (no GPU needed).

    python scripts/check_shipped_cubins.py --compare scripts/shipped_cubins.json  # exit 1 if a cubin changed
    python scripts/check_shipped_cubins.py --write manifest.json                  # record this tree's
    git archive 6ce9a50 | tar -x -C /tmp/old              # another checkout's:
    python scripts/check_shipped_cubins.py --root /tmp/old --write old.json

``scripts/shipped_cubins.json`` is the reference written with nvcc 13.0 for the kernels as they ship now
(parameter structs; the commit 6ce9a50 (the parent of 965306c) and the flat-list commits before them
have other cubins). Each entry holds the cubin's sha256 and, where ``cuobjdump`` is on PATH (Triton's
wheel carries one in ``triton/backends/nvidia/bin/``), the sha256 of its SASS, and the manifest the cuobjdump's
version. Comparing prefers the SASS where both manifests were disassembled by the same cuobjdump: equal machine code
passes even where the cubin's metadata differs; across cuobjdump versions the cubins' bytes are compared. A change
that must not alter the kernels compares against the manifest; a change that alters them on purpose (verified on a
GPU) rewrites it.

A kernel-layer refactor that must not change what runs (deleting unshipped variants, moving the tile
choice) is proven harmless on the CPU by identical cubins (or SASS) for every problem the default dispatch
serves: forward (dtype x head dim x masking, and the plain build beside a K/V multicast one), backward
(dtype x head dim x softcap x deterministic), decode (dtype x head dim x addressing x softcap) and
kv_append, on sm_90a (the Hopper bodies) and on sm_80 (the portable mma.sync bodies). Entries are keyed by
the problem, not by the build's ``-D`` macros, so a change that renames or drops macros but compiles the
same code still compares equal.

Cubins are compiled through :func:`hf_flashpatch.kernels.build.compile_cubin` into a throwaway cache
directory, in parallel (``--jobs``). The sha256s depend on the nvcc version, which the manifest
records; compare only manifests written by the same nvcc. A build nvcc rejects is recorded as
``nvcc failed`` (the dispatch then serves that problem with the torch fallback). Slow (a few hundred nvcc runs): not part of
the default test run.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ARCHES = ("sm_90a", "sm_80")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
ADDRESSINGS = ("contiguous", "block_table", "slot")
HEAD_DIMS = (32, 64, 96, 128, 256)
VARIANT_ENV = ("HF_FLASHPATCH_FWD_VARIANT", "HF_FLASHPATCH_BWD_VARIANT", "HF_FLASHPATCH_DECODE_VARIANT")  # old checkouts


def _dispatch():
    """``(forward_config, backward_config, decode_config)`` of the imported package: its decision room
    (:mod:`hf_flashpatch.kernels.heuristics`), or, for checkouts older than it (commit
    6ce9a50 and before), the same choices through the variant tables of that time with no
    variant environment variable set."""
    try:
        from hf_flashpatch.kernels import heuristics

        return heuristics.forward_config, heuristics.backward_config, heuristics.decode_config
    except ImportError:
        pass
    from hf_flashpatch.kernels import decode_config as old_decode
    from hf_flashpatch.kernels.backward import BackwardConfig
    from hf_flashpatch.kernels.forward import ForwardConfig

    def backward_config(d, dtype, softcap, arch, deterministic=False):
        config = BackwardConfig.choose(d, dtype, softcap, arch)
        if deterministic and config.body != "default":  # what _kernel_backward launched then
            config = BackwardConfig._choose_default(d, dtype, softcap, arch)
        return config

    def forward_config(d, dtype_name, mask, arch):
        return ForwardConfig.for_problem(d, dtype_name, mask, arch=arch)

    def decode_config(d, bf16, addressing, softcap):
        return old_decode.variant_config(d, bf16, addressing, softcap, old_decode.DEFAULT_VARIANT)

    return forward_config, backward_config, decode_config


def shipped_builds() -> dict:
    """``{problem key: the KernelBuild the default dispatch launches for it}``."""
    from hf_flashpatch.kernels.build import KernelBuild

    forward_config, backward_config, decode_config = _dispatch()
    builds = {}
    for arch in ARCHES:
        for dtype_name, dtype in DTYPES.items():
            for d in HEAD_DIMS:
                for mask in (False, True):
                    key = f"fwd/{arch}/{dtype_name}/d{d}/mask{int(mask)}"
                    config = forward_config(d, dtype_name, mask, arch)
                    builds[key] = config.build(arch)
                    if getattr(config, "kv_cluster", 1) > 1:  # the plain build of walks that cannot take clusters
                        builds[f"{key}/plain_walk"] = dataclasses.replace(config, kv_cluster=1).build(arch)
                    if getattr(config, "split_tail", False):  # the chain without its split round, clustered or not
                        unsplit = dataclasses.replace(config, split_tail=False)
                        builds[f"{key}/unsplit"] = unsplit.build(arch)
                        if unsplit.kv_cluster > 1:
                            builds[f"{key}/unsplit_plain"] = dataclasses.replace(unsplit, kv_cluster=1).build(arch)
                    if getattr(config, "chained_walk", False):  # the same tiles work by work, clustered or not
                        work_by_work = dataclasses.replace(config, chained_walk=False, split_tail=False)
                        builds[f"{key}/work_by_work"] = work_by_work.build(arch)
                        if work_by_work.kv_cluster > 1:
                            builds[f"{key}/work_by_work_plain"] = dataclasses.replace(work_by_work, kv_cluster=1).build(arch)
                    if "one_cta_per_tile" in inspect.signature(forward_config).parameters:  # the Hopper walk's form
                        build = forward_config(d, dtype_name, mask, arch, one_cta_per_tile=True).build(arch)
                        if build != builds[key]:
                            builds[f"{key}/one_cta_per_tile"] = build
                for softcap in (False, True):
                    for det in (False, True):
                        config = backward_config(d, dtype, softcap, arch, deterministic=det)
                        builds[f"bwd/{arch}/{dtype_name}/d{d}/softcap{int(softcap)}/det{int(det)}"] = config.build()
                    for addressing in ADDRESSINGS:
                        config = decode_config(d, dtype == torch.bfloat16, addressing, softcap)
                        key = f"decode/{arch}/{dtype_name}/d{d}/{addressing}/softcap{int(softcap)}"
                        builds[key] = config.build(arch)
            for d, d_v in _value_head_dim_pairs(arch):  # a v head dim of its own (multi-head latent attention)
                for mask in (False, True):
                    config = forward_config(d, dtype_name, mask, arch, head_dim_v=d_v)
                    builds[f"fwd/{arch}/{dtype_name}/d{d}v{d_v}/mask{int(mask)}"] = config.build(arch)
            for d, d_v in _backward_value_head_dim_pairs(arch):  # the backward taking a v head dim of its own
                config = backward_config(d, dtype, False, arch, head_dim_v=d_v)
                builds[f"bwd/{arch}/{dtype_name}/d{d}v{d_v}/softcap0/det0"] = config.build()
            for d in _backward_only_head_dims():  # the padded backward of a v head dim of its own
                for softcap in (False, True):
                    for det in (False, True):
                        config = backward_config(d, dtype, softcap, arch, deterministic=det)
                        builds[f"bwd/{arch}/{dtype_name}/d{d}/softcap{int(softcap)}/det{int(det)}"] = config.build()
            for d in _decode_only_head_dims():  # 80: Phi-2 and StableLM, which the other kernels take padded
                for softcap in (False, True):
                    for addressing in ADDRESSINGS:
                        config = decode_config(d, dtype == torch.bfloat16, addressing, softcap)
                        key = f"decode/{arch}/{dtype_name}/d{d}/{addressing}/softcap{int(softcap)}"
                        builds[key] = config.build(arch)
            for d, d_v in _decode_value_head_dim_pairs():
                for softcap in (False, True):
                    for addressing in ADDRESSINGS:
                        config = decode_config(d, dtype == torch.bfloat16, addressing, softcap, head_dim_v=d_v)
                        builds[f"decode/{arch}/{dtype_name}/d{d}v{d_v}/{addressing}/softcap{int(softcap)}"] = (
                            config.build(arch))  # fmt: skip
        builds[f"kv_append/{arch}"] = KernelBuild("kv_append.cu", (), arch)
    return builds


def _value_head_dim_pairs(arch: str) -> list:
    """The (q/k, v) head-dim pairs a forward kernel of ``arch`` takes (none in checkouts older than them)."""
    try:
        from hf_flashpatch.kernels.heuristics import HOPPER_VALUE_HEAD_DIM_SHAPES, native_value_head_dim
    except ImportError:
        return []
    return [pair for pair in HOPPER_VALUE_HEAD_DIM_SHAPES if native_value_head_dim(*pair, arch)]


def _backward_value_head_dim_pairs(arch: str) -> list:
    """The (q/k, v) head-dim pairs a backward kernel of ``arch`` takes (none in checkouts older than them)."""
    try:
        from hf_flashpatch.kernels.heuristics import HOPPER_BACKWARD_VALUE_HEAD_DIMS, native_backward_value_head_dim
    except ImportError:
        return []
    return [pair for pair in HOPPER_BACKWARD_VALUE_HEAD_DIMS if native_backward_value_head_dim(*pair, arch)]


def _backward_only_head_dims() -> list:
    """Head dims the backward kernels take and the forward's do not (192: the padded backward of 192/128)."""
    from hf_flashpatch.kernels.heuristics import BACKWARD_HEAD_DIMS

    return [d for d in BACKWARD_HEAD_DIMS if d not in HEAD_DIMS]


def _decode_only_head_dims() -> list:
    """Head dims the decode kernels are built for and the forward's are not (80)."""
    from hf_flashpatch.kernels.decode_config import SUPPORTED_HEAD_DIMS

    return [d for d in SUPPORTED_HEAD_DIMS if d not in HEAD_DIMS]


def _decode_value_head_dim_pairs() -> tuple:
    """The (q/k, v) head-dim pairs the decode kernels are built for (none in checkouts older than them)."""
    try:
        from hf_flashpatch.kernels.decode_config import VALUE_HEAD_DIM_PAIRS
    except ImportError:
        return ()
    return VALUE_HEAD_DIM_PAIRS


def _nvcc_version() -> str:
    from hf_flashpatch.kernels import build

    nvcc = build.find_nvcc()
    if nvcc is None:
        raise SystemExit("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return build.nvcc_version(nvcc).splitlines()[-1]


def _cuobjdump_version() -> str | None:
    """The cuobjdump that disassembles the SASS digests (its version line), None without one: another version may
    print the same machine code otherwise, so digests of two versions do not compare."""
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return None
    return subprocess.run([cuobjdump, "--version"], check=True, capture_output=True, text=True).stdout.splitlines()[-1]


def _sass_digest(cubin: bytes) -> str | None:
    """sha256 of the cubin's disassembled machine code (``cuobjdump -sass``), None without cuobjdump. Two
    cubins with equal SASS run the same instructions on the same parameter offsets; what can still differ
    is metadata, e.g. a parameter list declared as one ``__grid_constant__`` struct of the same layout."""
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([cuobjdump, "-sass", f.name], check=True, capture_output=True).stdout
    return hashlib.sha256(sass).hexdigest()


def _digest(kernel_build) -> dict:
    """The cubin's sha256 (and its SASS's, see :func:`_sass_digest`), or ``nvcc failed`` (a build that does
    not compile is recorded, not fatal: the dispatch then serves the problem with the torch fallback, and a
    change must not alter that either)."""
    from hf_flashpatch.errors import KernelUnsupported
    from hf_flashpatch.kernels import build

    try:
        cubin = build.compile_cubin(kernel_build)[0]
    except KernelUnsupported:
        return {"sha256": "nvcc failed"}
    sass = _sass_digest(cubin)
    return {"sha256": hashlib.sha256(cubin).hexdigest(), **({"sass": sass} if sass else {})}


def manifest(jobs: int) -> dict:
    """Compile every shipped build (each distinct build once) into a throwaway cache."""
    from hf_flashpatch.kernels import build

    builds = shipped_builds()
    distinct = list(dict.fromkeys(builds.values()))
    with tempfile.TemporaryDirectory(prefix="hfp-shipped-") as cache:
        os.environ["HF_FLASHPATCH_CACHE"] = cache
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            digests = dict(zip(distinct, pool.map(_digest, distinct)))
    cuobjdump = _cuobjdump_version()
    return {
        "nvcc": _nvcc_version(),
        **({"cuobjdump": cuobjdump} if cuobjdump else {}),
        "distinct_builds": len(distinct),
        "builds": {
            key: {**digests[b], "source": b.source, "defines": " ".join(f"{n}={v}" for n, v in b.defines)}
            for key, b in sorted(builds.items())
        },
    }


def compare(old: dict, new: dict) -> list[str]:
    """Lines describing every difference (empty: every problem's machine code is the same). Where the manifests'
    cuobjdump versions differ (one written on a machine without cuobjdump) the cubins' bytes are compared, and that
    alone is no difference (:func:`compare_note`)."""
    lines = []
    if old["nvcc"] != new["nvcc"]:
        lines.append(f"nvcc differs: {old['nvcc']!r} vs {new['nvcc']!r} (sha256s are not comparable)")
    sass_comparable = old.get("cuobjdump") == new.get("cuobjdump")
    for key in sorted(set(old["builds"]) | set(new["builds"])):
        a, b = old["builds"].get(key), new["builds"].get(key)
        if a is None or b is None:
            lines.append(f"{key}: only in the {'new' if a is None else 'old'} manifest")
        elif sass_comparable and "sass" in a and "sass" in b:  # same machine code is the claim; metadata may differ
            if a["sass"] != b["sass"]:
                lines.append(f"{key}: SASS changed ({a['source']} {a['defines']} -> {b['source']} {b['defines']})")
        elif a["sha256"] != b["sha256"]:
            lines.append(f"{key}: cubin changed ({a['source']} {a['defines']} -> {b['source']} {b['defines']})")
    return lines


def compare_note(old: dict, new: dict) -> str | None:
    """What :func:`compare` compared where the manifests' cuobjdump versions differ, else None."""
    if old.get("cuobjdump") == new.get("cuobjdump"):
        return None
    return (f"cuobjdump differs: {old.get('cuobjdump')!r} vs {new.get('cuobjdump')!r} (the cubins' bytes are compared, "
            "not their SASS)")  # fmt: skip


def metadata_only(old: dict, new: dict) -> list[str]:
    """Problems whose SASS is equal but whose cubin bytes are not (parameter metadata, section layout)."""
    if old.get("cuobjdump") != new.get("cuobjdump"):
        return []
    return sorted(key for key in set(old["builds"]) & set(new["builds"])
                  if old["builds"][key].get("sass") and old["builds"][key].get("sass") == new["builds"][key].get("sass")
                  and old["builds"][key]["sha256"] != new["builds"][key]["sha256"])  # fmt: skip


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="JSON", help="compile and write the manifest")
    parser.add_argument("--compare", metavar="JSON", help="compile and compare against this manifest")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent),
                        help="the checkout whose hf_flashpatch/ and cuda/ are compiled (default: this one)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc runs")
    args = parser.parse_args(argv)
    if not (args.write or args.compare):
        parser.error("give --write, --compare or both")
    sys.path.insert(0, str(Path(args.root).resolve()))
    for name in VARIANT_ENV:
        os.environ.pop(name, None)
    import hf_flashpatch

    print(f"compiling the shipped builds of {Path(hf_flashpatch.__file__).parent}")
    new = manifest(args.jobs)
    failed = sorted(key for key, entry in new["builds"].items() if entry["sha256"] == "nvcc failed")
    print(f"{len(new['builds'])} shipped problems, {new['distinct_builds']} distinct builds ({new['nvcc']}); "
          f"{len(failed)} problems whose build nvcc rejects: {', '.join(failed) or 'none'}")
    if args.write:
        Path(args.write).write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.write}")
    if not args.compare:
        return 0
    old = json.loads(Path(args.compare).read_text())
    note = compare_note(old, new)
    if note:
        print(note)
    differences = compare(old, new)
    for line in differences:
        print(line)
    same_code = metadata_only(old, new)
    if same_code:
        print(f"{len(same_code)} problems with identical SASS but other cubin bytes (metadata only)")
    print(("byte-identical" if not same_code else "SASS-identical") if not differences else f"{len(differences)} differences")
    sys.stdout.flush()
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
