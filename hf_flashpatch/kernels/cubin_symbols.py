"""Values a kernel source decides, read back from its compiled cubin (no GPU needed).

A kernel file states what C++ computes and the launch needs, the dynamic shared memory of an entry point,
as an initialised ``extern "C" __constant__ int <entry>_shared_bytes``. nvcc puts its value in the
cubin's ``.nv.constant3`` section and names it in the symbol table, so the host reads it from the
cubin's bytes (a 64-bit little-endian ELF file): Python never recomputes the size from a mirrored
formula, and CPU tests read the same number the launch uses.

The same file says where the kernel's first parameter sits in the parameter buffer: at 0, except where its
alignment exceeds that of the parameter bank's base (a struct holding a 64-byte aligned TMA descriptor
starts 48 bytes in on sm_90). The launch packs the buffer from that offset (``Kernel.pack``).
"""

from __future__ import annotations

import struct

_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_SHT_SYMTAB = 2
# .nv.info.<entry> records: format byte, attribute byte, then a 16-bit value (unused by format 1), or, for
# format 4, a 16-bit size and that many bytes. EIATTR_KPARAM_INFO (0x17): index u32, ordinal u16, offset u16, flags u32.
_NV_INFO_SIZED, _KPARAM_INFO = 4, 0x17


def _c_string(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode()


def _sections(cubin: bytes) -> list[tuple]:
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF cubin")
    section_offset = struct.unpack_from("<Q", cubin, 0x28)[0]
    entry_size, count = struct.unpack_from("<HH", cubin, 0x3A)
    return [_SECTION.unpack_from(cubin, section_offset + i * entry_size) for i in range(count)]


def read_int32(cubin: bytes, symbol: str) -> int | None:
    """The initial value of the 4-byte constant ``symbol`` in ``cubin``, or None if it has none."""
    sections = _sections(cubin)
    for table in (s for s in sections if s[1] == _SHT_SYMTAB):
        names = sections[table[6]]  # the symbol table's string table (sh_link)
        for i in range(table[5] // _SYMBOL.size):
            name, _info, _other, index, value, size = _SYMBOL.unpack_from(cubin, table[4] + i * _SYMBOL.size)
            if size == 4 and 0 < index < len(sections) and _c_string(cubin, names[4] + name) == symbol:
                return struct.unpack_from("<i", cubin, sections[index][4] + value)[0]
    return None


def first_parameter_offset(cubin: bytes, entry: str) -> int:
    """Where kernel ``entry``'s first parameter starts in its parameter buffer (0 for a kernel without one)."""
    sections = _sections(cubin)
    names = sections[struct.unpack_from("<H", cubin, 0x3E)[0]]  # the section-name string table
    info = next((s for s in sections if _c_string(cubin, names[4] + s[0]) == f".nv.info.{entry}"), None)
    if info is None:
        raise ValueError(f"no kernel {entry!r} in the cubin")
    body, i = cubin[info[4] : info[4] + info[5]], 0
    while i < len(body):
        fmt, attribute = body[i], body[i + 1]
        if fmt == _NV_INFO_SIZED:
            size = struct.unpack_from("<H", body, i + 2)[0]
            if attribute == _KPARAM_INFO and struct.unpack_from("<H", body, i + 8)[0] == 0:  # ordinal 0
                return struct.unpack_from("<H", body, i + 10)[0]
            i += 4 + size
        else:
            i += 4
    return 0
