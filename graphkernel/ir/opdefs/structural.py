"""Structural ops of the IR, not callable from the frontend: GetItem takes one item of a tuple;
CheckIndices refuses class indices out of range where the graph runs."""
from __future__ import annotations

from typing import Any

import numpy as np

from graphkernel.errors import DTypeError, InputError
from graphkernel.ir.opset import AttrKind, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, ValueType


def _getitem_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    raise AssertionError("GetItem is inferred from its tuple input by the graph")


declare(OpDef(name="GetItem", kind=PatternKind.INJECTIVE, inputs=("tuple",),
              infer=_getitem_infer, reference=lambda t, index: t[index],
              call_attrs=(("index", 0),), attr_kinds=(("index", AttrKind.COUNT),),
              structural=True))


# -- CheckIndices: class indices checked where the graph runs ----------------------------------

def _check_indices_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    (indices,) = types
    if indices.dtype.kind not in "iu":
        raise DTypeError(f"CheckIndices: indices must be integers, got {indices.dtype.name}")
    return indices


def _check_indices_ref(indices: np.ndarray, size: int, ignore: int | None = None,
                       what: str = "index") -> np.ndarray:
    """`indices` unchanged when each is in [0, size) (or equals `ignore`); else the error a
    user of MindSpore gets there (its GatherD refuses the label), naming the first bad one."""
    values = np.asarray(indices)
    bad = (values < 0) | (values >= size)
    if ignore is not None:
        bad &= values != ignore
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        also = "" if ignore is None else f" or {ignore} (ignored)"
        raise InputError(f"{what} {int(values[where])} at position {list(where)} is out of "
                         f"range: it must be in [0, {size}){also}")
    return values.copy()


# Data, not a guard the compiler could check: labels are inputs. A loss that one-hot encodes
# them (CrossEntropyLoss) would otherwise read an out-of-range label as a row of zeros, a loss of
# 0 instead of an error. Its output feeds every use of the labels, so no kernel reading them runs
# before the check; stateful, so it is never folded away or merged.
declare(OpDef(name="CheckIndices", kind=PatternKind.OPAQUE, inputs=("indices",),
              infer=_check_indices_infer, reference=_check_indices_ref,
              init_attrs=(("size", None), ("ignore", None), ("what", "index")),
              attr_kinds=(("size", AttrKind.COUNT), ("ignore", AttrKind.INT),
                          ("what", AttrKind.TEXT)),
              text_attrs=("what",), stateful=True, structural=True,
              doc="Its integer input unchanged, or an error naming an index out of range"))
