"""The structure of a shared library checked before the dynamic loader maps it.

dlopen trusts an ELF file's headers: a segment that reaches past the end of a truncated file is
mapped all the same, and the loader's first touch of it kills the process with SIGBUS. A cached
library whose checksum file was rewritten to match (or written by a build that was cut short)
is checked here first: the ELF header, the program headers and every segment's bytes must lie
within the file. This is what makes mapping it safe, not a proof that the code is ours (the
checksum and the exported symbols say that much, the private folder the rest)."""
from __future__ import annotations

import struct

_MAGIC = b"\x7fELF"
_ET_DYN = 3  # a shared object
_PT_LOAD = 1
# Per class (EI_CLASS 1: 32-bit, 2: 64-bit): the ELF header after e_ident (e_type, e_machine,
# e_version, e_entry, e_phoff, e_shoff, e_flags, e_ehsize, e_phentsize, e_phnum, e_shentsize,
# e_shnum, e_shstrndx), and a program header's (p_type, p_offset, p_filesz, p_memsz) with the
# struct field positions they are read from.
_HEADER = {1: "HHIIIIIHHHHHH", 2: "HHIQQQIHHHHHH"}
_PROGRAM = {1: ("IIIIIIII", (0, 1, 4, 5)), 2: ("IIQQQQQQ", (0, 2, 5, 6))}
_IDENT = 16


def problem(data: bytes) -> str | None:
    """What makes `data` unsafe to hand to the dynamic loader as a shared library (a truncated
    or malformed ELF file), or None."""
    if len(data) < _IDENT or data[:4] != _MAGIC:
        return "not an ELF file"
    width, order = data[4], data[5]
    if width not in _HEADER or order not in (1, 2):
        return f"an ELF file of unknown class {width} or byte order {order}"
    endian = "<" if order == 1 else ">"
    header = struct.Struct(endian + _HEADER[width])
    if len(data) < _IDENT + header.size:
        return f"truncated: {len(data)} bytes, shorter than its ELF header"
    (e_type, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     _) = header.unpack_from(data, _IDENT)
    if e_type != _ET_DYN:
        return f"an ELF file of type {e_type}, not a shared object"
    layout, (at_type, at_offset, at_filesz, at_memsz) = _PROGRAM[width]
    program = struct.Struct(endian + layout)
    if phentsize != program.size or phnum == 0:
        return f"{phnum} program headers of {phentsize} bytes: not a shared object's"
    if phoff + phnum * phentsize > len(data):
        return (f"truncated: its program headers end at byte {phoff + phnum * phentsize}, "
                f"past its {len(data)} bytes")
    if shnum and shoff + shnum * shentsize > len(data):
        return (f"truncated: its section headers end at byte {shoff + shnum * shentsize}, "
                f"past its {len(data)} bytes")
    loads = 0
    for k in range(phnum):
        fields = program.unpack_from(data, phoff + k * phentsize)
        p_type, offset, filesz, memsz = (fields[at_type], fields[at_offset],
                                         fields[at_filesz], fields[at_memsz])
        if offset + filesz > len(data):
            return (f"truncated: segment {k} ends at byte {offset + filesz}, past its "
                    f"{len(data)} bytes")
        if p_type == _PT_LOAD:
            loads += 1
            if filesz > memsz:
                return f"segment {k} holds {filesz} bytes of file in {memsz} of memory"
    if loads == 0:
        return "no loadable segment"
    return None
