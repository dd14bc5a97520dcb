"""Primitives (`from graphkernel.ops import operations as P`, or `ops.ReduceSum` as in
MindSpore 2.x) and functional forms under MindSpore 2.x's names (`ops.gelu`, `ops.matmul`,
`ops.concat`), generated from the op table in graphkernel/ir/opdefs/; where MindSpore's signature
differs from the primitive's, `ops/functional.py` writes the function by hand. `GradOperation`
is MindSpore's gradient operation (frontend/grad.py); `constexpr` its compile-time function
decorator (frontend/primitive.py)."""
from typing import Any

from graphkernel.frontend.grad import GradOperation
from graphkernel.frontend.primitive import Primitive, constexpr, make_functional
from graphkernel.ir.opset import user_ops
from graphkernel.ops import operations
from graphkernel.ops import operations as _P

for _op in user_ops():
    _fn = make_functional(_op)
    for _name in _op.functional_names:
        globals()[_name] = _fn
for _name in _P.__all__[1:]:  # the primitive classes: ops.ReduceSum, ops.Select, ...
    globals()[_name] = getattr(_P, _name)

# after the generated forms functional overrides; auto_generate is MindSpore 2.3's module path
from graphkernel.ops import auto_generate, functional  # noqa: E402, F401, I001
from graphkernel.ops.functional import *  # noqa: E402, F403
from graphkernel.ops.functional import MINDSPORE_SIGNATURES as _HAND_WRITTEN  # noqa: E402

__all__ = ["operations", "functional", "Primitive", "GradOperation", "constexpr"]
__all__ += sorted({*_P.__all__[1:], *_HAND_WRITTEN,
                   *(name for op in user_ops() for name in op.functional_names)})


def __getattr__(name: str) -> Any:
    """A MindSpore name graphkernel.ops lacks: say so, and what to use instead."""
    if name.startswith("_"):
        raise AttributeError(name)
    from graphkernel.frontend.mindspore_names import missing_name_error
    raise missing_name_error("graphkernel.ops", name, __all__)
