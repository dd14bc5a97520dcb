"""Where a node or an error came from: the user's line in `construct`, found on the stack."""
from __future__ import annotations

import linecache
import os
import sys
from typing import Any

from graphkernel.errors import SourceLocation

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in these folders (and mindspore.numpy's functions, numpy.py, which are ops) are the
# compiler itself; any other frame (a user's script, or cells that ship with graphkernel such
# as nn/layers.py and tools/lab.py) is where a node came from.
_INTERNAL_DIRS = tuple(os.path.join(_PACKAGE_DIR, d) + os.sep for d in (
    "frontend", "ir", "passes", "graph_kernel", "backends", "runtime", "ops", "common")) + (
    os.path.join(_PACKAGE_DIR, "numpy.py"),)


# A code object's file name, made absolute, by that name (one normpath per file, not per frame:
# every traced op walks the stack). Only names already absolute are kept: a relative one depends
# on the working folder of the moment.
_absolute: dict[str, str] = {}


def _absolute_name(name: str) -> str:
    found = _absolute.get(name)
    if found is None:
        found = os.path.abspath(name)
        if os.path.isabs(name):
            _absolute[name] = found
    return found


def user_location() -> SourceLocation | None:
    """The innermost stack frame outside graphkernel: the user's line in `construct`."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = _absolute_name(frame.f_code.co_filename)
        if not filename.startswith(_INTERNAL_DIRS):
            text = linecache.getline(filename, frame.f_lineno)
            return SourceLocation(filename, frame.f_lineno, frame.f_code.co_name, text)
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    return None


def function_location(fn: Any) -> SourceLocation | None:
    """The `def` line of a user's function (e.g. construct), for errors about what it returned."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    text = linecache.getline(code.co_filename, code.co_firstlineno)
    return SourceLocation(code.co_filename, code.co_firstlineno, code.co_name, text)
