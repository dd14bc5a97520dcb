"""Structural ops of the IR, not callable from the frontend: GetItem takes one item of a tuple."""
from __future__ import annotations

from typing import Any

from graphkernel.ir.opset import AttrKind, OpDef, PatternKind, declare
from graphkernel.ir.types import TensorType, ValueType


def _getitem_infer(types: tuple[TensorType, ...], attrs: dict[str, Any]) -> ValueType:
    raise AssertionError("GetItem is inferred from its tuple input by the graph")


declare(OpDef(name="GetItem", kind=PatternKind.INJECTIVE, inputs=("tuple",),
              infer=_getitem_infer, reference=lambda t, index: t[index],
              call_attrs=(("index", 0),), attr_kinds=(("index", AttrKind.COUNT),),
              structural=True))
