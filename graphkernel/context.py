"""`import graphkernel.context as context`: the same module as `graphkernel.context`."""
import sys

from graphkernel.frontend import context as _context

sys.modules[__name__] = _context
