"""Will it fit: the machine's physical memory, and the check that an op's result fits in it."""
from __future__ import annotations

import os
from typing import Any

from graphkernel.errors import ResourceError
from graphkernel.ir.types import TupleType


def physical_memory() -> int:
    """Bytes of RAM this machine has (0 when unknown)."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def format_bytes(n: int) -> str:
    size = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1024 or unit == "PiB":
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError(n)


def check_fits_in_memory(op: str, out_type: Any) -> None:
    """An op whose result alone is larger than the machine's memory is an error before it runs."""
    items = out_type.items if isinstance(out_type, TupleType) else (out_type,)
    items = tuple(t for t in items if t.is_static)  # a dynamic size is checked when it runs
    need = sum(t.nbytes for t in items)
    have = physical_memory()
    if have and need > have:
        raise ResourceError(f"{op} would produce {out_type} ({format_bytes(need)}), more than "
                            f"this machine's memory ({format_bytes(have)})")
