"""User-facing errors. Every error can carry the source location in `construct` that caused it.

This module sits at the bottom of the package: it imports nothing from graphkernel.
"""
from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    """Where a node came from: a line of a cell's `construct` (or other user code)."""

    filename: str
    lineno: int
    function: str
    text: str = ""

    def __str__(self) -> str:
        text = f": {self.text.strip()}" if self.text.strip() else ""
        return f'File "{self.filename}", line {self.lineno}, in {self.function}{text}'


class GraphKernelError(Exception):
    """Base of every error graphkernel raises on purpose."""

    def __init__(self, message: str, location: SourceLocation | None = None) -> None:
        self.problem = message
        self.location = location
        super().__init__(self._render())

    def _render(self) -> str:
        if self.location is None:
            return self.problem
        return f"{self.problem}\n  at {self.location}"

    def with_location(self, location: SourceLocation | None) -> GraphKernelError:
        """Attach a location if the error has none yet (keeps the innermost one)."""
        if self.location is None and location is not None:
            self.location = location
            self.args = (self._render(),)
        return self


class ShapeError(GraphKernelError, ValueError):
    """Shapes that do not fit (broadcasting, axes, reshape sizes)."""


class DTypeError(GraphKernelError, TypeError):
    """A dtype an op does not accept, or a Python value that is not a tensor."""


class InputError(GraphKernelError, TypeError):
    """Wrong number, type, shape or dtype of inputs passed to a compiled graph."""


class GraphModeError(GraphKernelError, RuntimeError):
    """Something graph mode cannot trace (control flow on a tensor's value, unsupported calls)."""


class UnsupportedError(GraphKernelError, AttributeError):
    """An operator or tensor method graphkernel does not have."""


class ResourceError(GraphKernelError, MemoryError):
    """A graph that needs more memory than the machine has."""


class ContextError(GraphKernelError, ValueError):
    """An unknown context key or value."""


class FlagError(GraphKernelError, ValueError):
    """An unknown or malformed graph_kernel_flags entry."""


class DumpError(GraphKernelError, FileExistsError):
    """save_graphs would replace a file graphkernel did not write."""


class CompileError(GraphKernelError, RuntimeError):
    """The C compiler failed on generated code (a graphkernel bug: please report it)."""


class CacheError(GraphKernelError, PermissionError):
    """The kernel cache folder is unsafe or unusable."""


class ToolchainError(GraphKernelError, RuntimeError):
    """The C compiler graphkernel found (or was given in $CC) does not work: it fails on a
    one-line C file, or writes no library. Not a graphkernel bug: fix or unset $CC."""


class RendererError(GraphKernelError, RuntimeError):
    """No Graphviz renderer is available, or it failed."""


class VerifyError(GraphKernelError, AssertionError):
    """The IR verifier found a malformed graph (a graphkernel bug)."""


class FormatError(GraphKernelError, ValueError):
    """An export file (graphkernel.export) that is malformed, corrupted, altered, or written by
    a newer graphkernel."""


class CommunicationError(GraphKernelError, RuntimeError):
    """A process group that is missing or unusable (graphkernel.communication, AllReduce)."""


class NoEffectWarning(UserWarning):
    """A MindSpore setting graphkernel accepts but that changes nothing here."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_no_effect(message: str) -> None:
    """Warn NoEffectWarning at the user's line: the first caller outside graphkernel, however
    deep inside the package the setting was read (a fixed stacklevel points into graphkernel
    whenever a call path gains or loses a frame)."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 2 is the frame that called this function
    while frame.f_back is not None and \
            os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
        level += 1
    warnings.warn(message, NoEffectWarning, stacklevel=level)


class GradientError(GraphKernelError, TypeError):
    """Something on the path from a differentiated output to an input has no gradient."""
