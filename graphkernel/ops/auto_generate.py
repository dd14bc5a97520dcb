"""MindSpore's `mindspore.ops.auto_generate` (2.3 and later), where its generated primitives and
their functional forms live: `from graphkernel.ops.auto_generate import Add, GeLUGrad, gelu`.
The same classes and functions as graphkernel.ops, graphkernel.ops.operations and
operations._grad_ops (one op table makes them all)."""
from typing import Any

from graphkernel.frontend.primitive import make_functional
from graphkernel.ir.opset import user_ops
from graphkernel.ops import functional as _F
from graphkernel.ops import operations as _P
from graphkernel.ops.operations import _grad_ops as _G

for _name in _P.__all__[1:]:
    globals()[_name] = getattr(_P, _name)
for _name in _G.__all__:
    globals()[_name] = getattr(_G, _name)
for _op in user_ops():
    for _functional in _op.functional_names:
        # MindSpore's signature where graphkernel.ops writes it by hand (gelu's approximate)
        globals()[_functional] = getattr(_F, _functional) \
            if _functional in _F.MINDSPORE_SIGNATURES else make_functional(_op)

__all__ = sorted({*_P.__all__[1:], *_G.__all__,
                  *(name for op in user_ops() for name in op.functional_names)})


def __getattr__(name: str) -> Any:
    """A name MindSpore generates that graphkernel has not: say so, and what there is."""
    if name.startswith("_"):
        raise AttributeError(name)
    from graphkernel.frontend.mindspore_names import missing_name_error
    raise missing_name_error("graphkernel.ops.auto_generate", name, __all__)
