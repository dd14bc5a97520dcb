"""Will it fit: the machine's physical memory, and the check that an op's result fits in it."""
from __future__ import annotations

from typing import Any

from graphkernel.errors import ResourceError
from graphkernel.ir.types import TupleType
from graphkernel.runtime.memory import format_bytes, physical_memory

__all__ = ["check_fits_in_memory", "format_bytes", "physical_memory"]


def check_fits_in_memory(op: str, out_type: Any) -> None:
    """An op whose result alone is larger than the machine's memory is an error before it runs."""
    items = out_type.items if isinstance(out_type, TupleType) else (out_type,)
    items = tuple(t for t in items if t.is_static)  # a dynamic size is checked when it runs
    need = sum(t.nbytes for t in items)
    have = physical_memory()
    if have and need > have:
        raise ResourceError(f"{op} would produce {out_type} ({format_bytes(need)}), more than "
                            f"this machine's memory ({format_bytes(have)})")
