"""The CUDA sources: where they are, and each kernel's parameter list read from them.

The parameter lists are the one declaration of the Python <-> CUDA boundary. Each entry point's
parameters are written once, in ``cuda/`` (the kernel's own list, or a macro such as ``HFP_FWD_PARAMS``
that several kernels share); the launch side derives the argument letters that
:class:`~hf_flashpatch.kernels.build.Kernel` packs from that text, so the two cannot drift apart. Letters
(a :mod:`struct` format, the C ABI's natural alignment): ``P`` any pointer, ``q`` a 64-bit integer, ``i``
an ``int``, ``I`` an ``unsigned``, ``f`` a ``float``.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import NamedTuple

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def cuda_source_dir() -> Path:
    """The kernel sources: ``hf_flashpatch/_cuda`` in an installed wheel, ``cuda/`` in a checkout."""
    for candidate in (_PACKAGE_DIR / "_cuda", _PACKAGE_DIR.parent / "cuda"):
        if (candidate / "primitives.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"hf_flashpatch CUDA sources not found next to {_PACKAGE_DIR}")


_LETTERS = (  # (pattern on the parameter's type, letter), first match wins
    (re.compile(r"\*"), "P"),
    (re.compile(r"\b(int64_t|long long|long)\b"), "q"),
    (re.compile(r"\b(unsigned|uint32_t)\b"), "I"),
    (re.compile(r"\b(int|int32_t)\b"), "i"),
    (re.compile(r"\bfloat\b"), "f"),
)


class Signature(NamedTuple):
    """An entry point's parameters, in order: their names and their struct letters."""

    names: tuple[str, ...]
    letters: str


def _letter(declaration: str) -> str:
    for pattern, letter in _LETTERS:
        if pattern.search(declaration):
            return letter
    raise ValueError(f"no argument letter for the kernel parameter {declaration!r}")


@functools.lru_cache(maxsize=1)
def _macros() -> dict[str, str]:
    """Every ``#define NAME <body>`` of the CUDA sources, continuation lines joined."""
    macros = {}
    for path in sorted(cuda_source_dir().glob("*.cu*")):
        text = path.read_text().replace("\\\n", " ")
        for name, body in re.findall(r"^#define\s+(\w+)\s+(.*)$", text, flags=re.M):
            macros[name] = body
    return macros


def _entry_pattern(entry: str) -> re.Pattern:
    """The opening of ``extern "C" __global__ void [__launch_bounds__(...)] entry(``."""
    return re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?' + re.escape(entry)
                      + r"\s*\(")  # fmt: skip


@functools.lru_cache(maxsize=None)
def kernel_signature(source: str, entry: str) -> Signature:
    """The parameters of ``extern "C"`` kernel ``entry`` in ``cuda/<source>``, a shared macro expanded."""
    text = (cuda_source_dir() / source).read_text()
    found = _entry_pattern(entry).search(text)
    if found is None:
        raise ValueError(f"no extern \"C\" __global__ kernel {entry!r} in cuda/{source}")
    depth, end = 1, found.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    params = " ".join(text[found.end() : end - 1].split())
    if re.fullmatch(r"\w+", params):  # the whole list is a shared macro
        params = " ".join(_macros()[params].split())
    declarations = [d.strip() for d in params.split(",") if d.strip()]
    names = tuple(re.search(r"(\w+)\s*$", d).group(1) for d in declarations)
    return Signature(names, "".join(_letter(d) for d in declarations))


@functools.lru_cache(maxsize=None)
def entry_source(entry: str) -> str:
    """The ``cuda/`` file that defines ``extern "C"`` kernel ``entry``."""
    found = [p.name for p in sorted(cuda_source_dir().glob("*.cu")) if _entry_pattern(entry).search(p.read_text())]
    if len(found) != 1:
        raise ValueError(f"kernel {entry!r} is defined in {len(found)} cuda/ files ({found}), expected one")
    return found[0]
