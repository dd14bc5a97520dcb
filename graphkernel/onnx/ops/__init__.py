"""ONNX operators as compositions of graphkernel's primitives (ir/opdefs/), one module per kind.

Each converter takes the node's context and its inputs and returns its outputs; importing this
package registers them all in `CONVERTERS` (and `FOLDERS`). The machinery is in `base`.
"""
from graphkernel.onnx.ops import conv, elementwise, linalg, norm, reduce, shape  # noqa: F401
from graphkernel.onnx.ops.base import (
    CONVERTERS,
    FOLDERS,
    NodeContext,
    ValueNeededError,
    concrete,
    run,
)

__all__ = ["CONVERTERS", "FOLDERS", "NodeContext", "ValueNeededError", "concrete", "run"]
