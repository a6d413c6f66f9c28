"""Values a kernel source decides, read back from its compiled cubin (no GPU needed).

A kernel file states what C++ computes and the launch needs, the dynamic shared memory of an entry point,
as an initialised ``extern "C" __constant__ int <entry>_shared_bytes``. nvcc puts its value in the
cubin's ``.nv.constant3`` section and names it in the symbol table, so the host reads it from the
cubin's bytes (a 64-bit little-endian ELF file): Python never recomputes the size from a mirrored
formula, and CPU tests read the same number the launch uses.
"""

from __future__ import annotations

import struct

_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_SHT_SYMTAB = 2


def _c_string(data: bytes, offset: int) -> str:
    return data[offset : data.index(b"\0", offset)].decode()


def read_int32(cubin: bytes, symbol: str) -> int | None:
    """The initial value of the 4-byte constant ``symbol`` in ``cubin``, or None if it has none."""
    if cubin[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF cubin")
    section_offset = struct.unpack_from("<Q", cubin, 0x28)[0]
    entry_size, count = struct.unpack_from("<HH", cubin, 0x3A)
    sections = [_SECTION.unpack_from(cubin, section_offset + i * entry_size) for i in range(count)]
    for table in (s for s in sections if s[1] == _SHT_SYMTAB):
        names = sections[table[6]]  # the symbol table's string table (sh_link)
        for i in range(table[5] // _SYMBOL.size):
            name, _info, _other, index, value, size = _SYMBOL.unpack_from(cubin, table[4] + i * _SYMBOL.size)
            if size == 4 and 0 < index < len(sections) and _c_string(cubin, names[4] + name) == symbol:
                return struct.unpack_from("<i", cubin, sections[index][4] + value)[0]
    return None
