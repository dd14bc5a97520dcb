"""`FILE.py:CellClass` and `--input float32[4,4]` from the command line, with errors that point
at the user's file and say what to do."""
from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
import re
import sys
import traceback
from typing import Any

from graphkernel.errors import GraphKernelError, SourceLocation
from graphkernel.frontend.signature import construct_arity
from graphkernel.frontend.tracing import function_location
from graphkernel.ir.types import TensorType, to_dtype
from graphkernel.tools.report_page import ReportError

EXAMPLE_INPUT = "float32[4,4]"
_TYPE_SPEC = re.compile(r"^\s*(\w+)\s*\[([\d,\s]*)\]\s*$")


def _location_in(path: str, exc: BaseException) -> SourceLocation | None:
    """The deepest traceback frame of `exc` inside the user's file `path`."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        return SourceLocation(exc.filename, exc.lineno, "<module>", exc.text or "")
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if os.path.abspath(frame.filename) == os.path.abspath(path):
            found = SourceLocation(frame.filename, frame.lineno or 0, frame.name,
                                   linecache.getline(frame.filename, frame.lineno or 0))
    return found


def load_cell_spec(spec: str) -> Any:
    """`path/to/file.py:CellClass` -> an instance (the class must take no arguments)."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path.endswith(".py") or not name.isidentifier():
        raise ReportError(f"cell spec {spec!r} is not FILE.py:CellClass (e.g. net.py:Net)")
    if not os.path.isfile(path):
        raise ReportError(f"no such file: {path}")
    module_name = "_graphkernel_report_" + re.sub(r"\W", "_", os.path.abspath(path))
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    # The file's own folder first, as `python file.py` would have it, for its sibling imports.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        module_spec.loader.exec_module(module)
    except GraphKernelError:
        raise
    except Exception as exc:  # the user's module failed: say so at its line, not ours
        raise ReportError(f"{path} failed while loading: {type(exc).__name__}: {exc}",
                          _location_in(path, exc)) from exc
    finally:
        sys.path.pop(0)
    cls = getattr(module, name, None)
    if cls is None:
        found = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and
                       hasattr(v, "construct") and v.__module__ == module_name)
        hint = f"; classes with a construct there: {', '.join(found)}" if found else ""
        raise ReportError(f"{path} defines no {name}{hint}")
    try:
        return cls()
    except GraphKernelError:
        raise
    except TypeError as exc:
        raise ReportError(f"{name}() failed: {exc}; the report builds the cell with no "
                          "arguments, so give every __init__ argument a default",
                          function_location(cls.__init__)) from exc


def check_input_count(cell: Any, given: int) -> None:
    """Refuse before compiling when the number of --input options does not match construct."""
    arity = construct_arity(cell)
    if arity is None or arity[1] <= given <= len(arity[0]):
        return
    names = ", ".join(arity[0]) or "none"
    want = arity[1]
    example = " ".join(f"--input {EXAMPLE_INPUT}" for _ in range(max(want, 1)))
    raise ReportError(f"{type(cell).__name__}.construct takes {want} input(s) ({names}) but "
                      f"{given} --input {'was' if given == 1 else 'were'} given: pass one "
                      f"--input DTYPE[SHAPE] per input, in order, e.g. {example}",
                      function_location(cell.construct))


def parse_input_spec(text: str) -> TensorType:
    """`float32[4,4]` (the form dumps print) -> a TensorType."""
    match = _TYPE_SPEC.match(text)
    if match is None:
        raise ReportError(f"input {text!r} is not DTYPE[D0,D1,...], e.g. {EXAMPLE_INPUT}")
    try:
        dtype = to_dtype(match.group(1))
    except Exception as exc:  # to_dtype raises its own error types; say it in report terms
        raise ReportError(f"input {text!r}: unknown dtype {match.group(1)!r} (e.g. float32, "
                          "float16, int32, bool)") from exc
    dims = tuple(int(d) for d in match.group(2).split(",") if d.strip())
    return TensorType(dims, dtype)
