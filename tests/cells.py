"""Helpers several test files share: a Cell whose construct is a plain function, and the compile
options with fusion on and off."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphkernel import nn
from graphkernel.graph_kernel.pipeline import CompileOptions

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


class Fn(nn.Cell):
    """`construct(*xs)` is `fn(*xs)`: a test's function of primitives as a cell."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, *xs: Any) -> Any:
        return self.fn(*xs)
