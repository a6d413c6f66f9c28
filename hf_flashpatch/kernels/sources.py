"""The CUDA sources: where they are, and each kernel's parameter list read from them.

The parameter lists are the one declaration of the Python <-> CUDA boundary. Each entry point's
parameters are written once, in ``cuda/``: the kernel's own list, or, for the attention families, one
parameter struct that every kernel of the family takes as its only parameter
(``const __grid_constant__ hfp::fwd::FwdParams p``; ``struct FwdParams { ... };`` in ``fwd_geometry.cuh``).
The launch side derives the argument letters that :class:`~hf_flashpatch.kernels.build.Kernel` packs
from that text, so the two cannot drift apart. Letters (a :mod:`struct` format, the C ABI's natural
alignment, which is also how CUDA lays out kernel parameters and struct fields): ``P`` any pointer,
``q`` a 64-bit integer, ``i`` an ``int``, ``I`` an ``unsigned``, ``f`` a ``float``, ``T`` a TMA tensor map
(``TmaDescriptor``, ``cuda/tma.cuh``: 128 bytes aligned to 64, packed from :mod:`~hf_flashpatch.kernels.tma`'s
bytes). A struct's fields are flattened in order (a nested struct's with dotted names), with the padding C
puts before a nested struct or a tensor map and after the last field.
"""

from __future__ import annotations

import functools
import re
import struct
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
    (re.compile(r"\bTmaDescriptor\b"), "T"),
    (re.compile(r"\*"), "P"),
    (re.compile(r"\b(int64_t|long long|long)\b"), "q"),
    (re.compile(r"\b(unsigned|uint32_t)\b"), "I"),
    (re.compile(r"\b(int|int32_t)\b"), "i"),
    (re.compile(r"\bfloat\b"), "f"),
)


class Signature(NamedTuple):
    """An entry point's parameters, in order: their names, their letters (one per parameter) and the
    :mod:`struct` format that packs them (the letters plus alignment padding of a struct parameter)."""

    names: tuple[str, ...]
    letters: str
    format: str

    @classmethod
    def flat(cls, names, letters: str) -> "Signature":
        return cls(tuple(names), letters, letters)


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


# ``extern "C" __global__ void [__launch_bounds__(...)] [ATTRIBUTE_MACRO]``: what precedes a kernel's name (an
# attribute macro such as the cluster dims of fwd_hopper_ws.cu).
_ENTRY_OPENING = r'extern\s+"C"\s+__global__\s+void\s+(?:(?:__launch_bounds__\([^)]*\)|[A-Z][A-Z0-9_]*)\s*)*'


def _entry_pattern(entry: str) -> re.Pattern:
    """The opening of kernel ``entry``'s definition, up to its parameter list's parenthesis."""
    return re.compile(_ENTRY_OPENING + re.escape(entry) + r"\s*\(")


def entry_names(text: str) -> list[str]:
    """The ``extern "C"`` kernels the CUDA source ``text`` defines, in order."""
    return re.findall(_ENTRY_OPENING + r"(\w+)\s*\(", text)


_SIZES = {"P": 8, "q": 8, "i": 4, "I": 4, "f": 4, "T": 64}  # the alignment of each letter's C type
_FORMATS = {"T": "128s"}  # a tensor map packs as its bytes; the other letters are struct formats themselves


def _with_letter(fmt: str, letter: str) -> str:
    """``fmt`` followed by ``letter``'s format, a tensor map's bytes padded to its 64-byte alignment first."""
    return fmt + (_aligned_to(fmt, _SIZES[letter]) + _FORMATS[letter] if letter in _FORMATS else letter)


def _aligned_to(fmt: str, alignment: int) -> str:
    """Padding bytes (a ``struct`` format) that bring ``fmt``'s size to a multiple of ``alignment``."""
    pad = -struct.calcsize("@" + fmt) % alignment
    return f"{pad}x" if pad else ""


def _matching_brace(text: str, start: int) -> int:
    """The index just past the ``}`` that closes the ``{`` at ``start``."""
    depth, end = 0, start
    while True:
        depth += {"{": 1, "}": -1}.get(text[end], 0)
        end += 1
        if depth == 0:
            return end


@functools.lru_cache(maxsize=1)
def _structs() -> dict[str, str]:
    """The data members of every ``struct Name { ... };`` of the CUDA sources, as ``;``-separated
    declarations: comments, preprocessor lines, member functions and type aliases dropped."""
    found = {}
    for path in sorted(cuda_source_dir().glob("*.cu*")):
        text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", path.read_text().replace("\\\n", " "), flags=re.S)
        text = re.sub(r"^\s*#.*$", " ", text, flags=re.M)  # preprocessor lines (a struct's layout has none)
        for head in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
            body = text[head.end() : _matching_brace(text, head.end() - 1) - 1]
            while "{" in body:  # member function bodies -> statement breaks
                start = body.index("{")
                body = body[:start] + ";" + body[_matching_brace(body, start):]
            members = [m for m in body.split(";") if m.strip() and "(" not in m
                       and not re.match(r"\s*(static|using|typedef|template)\b", m)]  # fmt: skip
            found[head.group(1)] = ";".join(members)
    return found


def _struct_fields(name: str, prefix: str = "") -> tuple[list[str], str, str, int]:
    """``(names, letters, format, alignment)`` of struct ``name``'s fields, nested structs flattened."""
    names, letters, fmt, align = [], "", "", 1
    for statement in _structs()[name].split(";"):
        parts = [" ".join(p.split()) for p in statement.split(",") if p.strip()]
        if not parts:
            continue
        first_name = re.search(r"(\w+)\s*$", parts[0]).group(1)
        field_type = parts[0][: -len(first_name)].strip()  # "const int*", "int64_t", "KvAddressT<Elem>"
        for part in parts:
            field = re.search(r"(\w+)\s*$", part).group(1)
            nested = re.fullmatch(r"(?:hfp::)?(\w+)(?:<\w+>)?", field_type)
            if nested and nested.group(1) in _structs():
                n, l, f, a = _struct_fields(nested.group(1), f"{prefix}{field}.")
                names += n
                letters += l
                fmt += (_aligned_to(fmt, a) if a > 8 else "0q" if a == 8 else "0i") + f  # C aligns a nested
                # struct to its widest field
                align = max(align, a)
            else:
                letter = _letter(field_type + " " + part[: -len(field)])
                names.append(prefix + field)
                letters += letter
                fmt = _with_letter(fmt, letter)
                align = max(align, _SIZES[letter])
    tail = _aligned_to(fmt, align) if align > 8 else ("0q" if align == 8 else "0i")
    return names, letters, fmt + tail, align  # tail padding to the alignment


@functools.lru_cache(maxsize=None)
def kernel_signature(source: str, entry: str) -> Signature:
    """The parameters of ``extern "C"`` kernel ``entry`` in ``cuda/<source>``: a shared macro expanded, a
    ``__grid_constant__`` struct parameter flattened into its fields."""
    text = (cuda_source_dir() / source).read_text()
    found = _entry_pattern(entry).search(text)
    if found is None:
        raise ValueError(f"no extern \"C\" __global__ kernel {entry!r} in cuda/{source}")
    depth, end = 1, found.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    params = " ".join(text[found.end() : end - 1].split())
    declarations = []
    for declaration in (d.strip() for d in params.split(",") if d.strip()):
        if re.fullmatch(r"\w+", declaration):  # a shared macro's list
            declarations += [d.strip() for d in " ".join(_macros()[declaration].split()).split(",") if d.strip()]
        else:
            declarations.append(declaration)
    struct_param = re.fullmatch(r"const\s+__grid_constant__\s+(?:\w+::)*(\w+)\s+\w+", declarations[0])
    if len(declarations) == 1 and struct_param and struct_param.group(1) != "TmaDescriptor":
        names, letters, fmt, _ = _struct_fields(struct_param.group(1))
        return Signature(tuple(names), letters, fmt)
    names = tuple(re.search(r"(\w+)\s*$", d).group(1) for d in declarations)
    letters = "".join(_letter(d) for d in declarations)
    fmt = ""
    for letter in letters:
        fmt = _with_letter(fmt, letter)
    return Signature(names, letters, fmt)


@functools.lru_cache(maxsize=None)
def entry_source(entry: str) -> str:
    """The ``cuda/`` file that defines ``extern "C"`` kernel ``entry``."""
    found = [p.name for p in sorted(cuda_source_dir().glob("*.cu")) if _entry_pattern(entry).search(p.read_text())]
    if len(found) != 1:
        raise ValueError(f"kernel {entry!r} is defined in {len(found)} cuda/ files ({found}), expected one")
    return found[0]
