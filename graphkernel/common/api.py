"""`mindspore.common.api`'s path: `from graphkernel.common.api import jit` (and the older name
`ms_function`), the same decorator as `graphkernel.jit` (frontend/jit.py)."""
from graphkernel.frontend.jit import jit

ms_function = jit  # MindSpore 1.x's name for jit, still imported by older scripts

__all__ = ["jit", "ms_function"]
