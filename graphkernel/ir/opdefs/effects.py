"""Ops that act beyond their result: Print (MindSpore's P.Print), which writes its strings and
tensors to stdout each time the graph runs.

Such an op is `effect=True`: tracing puts its node in `Graph.effects`, so dead-code
elimination keeps it though nothing reads its result. Effects run in the order construct called
them: each takes the previous one's result (an int32 token) as its first input, MindSpore's IO
monad threaded through the graph, so no pass can reorder two Prints; nothing else depends on
the token, so the ops around a Print are scheduled and fused as if it were not there. It is
OPAQUE (never inside a fused kernel) and `stateful` (never merged with a twin by CSE, never
folded while compiling, which would print once at compile time instead of on every call). Its
neighbours still fuse with each other: a value it prints is one more result of the kernel that
computes it, and nothing waits on Print.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from graphkernel.errors import ShapeError
from graphkernel.ir.opset import AttrKind, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, ValueType


def _print_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    # layout: one letter per input in order: "o" the previous effect's token (first, if any),
    # "t" a tensor to print, "s" the next of `texts`.
    layout = attrs["layout"]
    if layout.count("t") + layout.count("o") != len(types) or \
            layout.count("s") != len(attrs["texts"]) or set(layout) - {"s", "t", "o"} or \
            "o" in layout[1:]:
        raise ShapeError(f"Print: layout {layout!r} does not match {len(types)} tensors and "
                         f"{len(attrs['texts'])} strings")
    return TensorType((), np.dtype("int32"))  # MindSpore's Print gives an int32 scalar


def format_tensor(array: np.ndarray) -> str:
    """A tensor as Print writes it (the form graphkernel's Tensor repr has)."""
    dims = ", ".join(str(d) for d in array.shape)
    body = np.array2string(array, separator=", ")
    return f"Tensor(shape=[{dims}], dtype={array.dtype.name}, value=\n{body})"


def _print_ref(*arrays: np.ndarray, texts: tuple[str, ...] = (), layout: str = ""
               ) -> np.ndarray:
    if layout.startswith("o"):  # the previous effect's token: orders, is not printed
        arrays, layout = arrays[1:], layout[1:]
    tensors, strings = iter(arrays), iter(texts)
    lines = [next(strings) if kind == "s" else format_tensor(np.asarray(next(tensors)))
             for kind in layout]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    return np.zeros((), np.int32)


declare(OpDef(name="Print", kind=PatternKind.OPAQUE, inputs=(), infer=_print_infer,
              reference=_print_ref, init_attrs=(("texts", ()), ("layout", "")), variadic=True,
              stateful=True, effect=True, text_attrs=("texts",), functional=("print_",),
              attr_kinds=(("texts", AttrKind.TEXTS),),
              doc="Writes its strings and tensors to stdout, one per line, on every call"))
