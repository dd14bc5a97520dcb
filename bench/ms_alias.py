"""Run MindSpore code, MindCV's model files included, on graphkernel without editing it: a
meta-path finder that answers `import mindspore...` with the graphkernel module of the same path
(`mindspore.common.initializer` -> `graphkernel.common.initializer`), and serves MindCV's model
files from an installed MindCV without running its package `__init__`s (they import MindCV's
trainers, datasets and optimizers, which a model file does not need).

    from bench.ms_alias import install_alias
    install_alias(mindcv_dir="/work/ms-venv/lib/python3.11/site-packages/mindcv")
    from mindcv.models import resnet        # MindCV's file, unchanged, on graphkernel

Nothing of MindCV is copied: its files are read from where pip put them. A MindSpore module
graphkernel does not have fails as `No module named 'graphkernel.x'`."""
from __future__ import annotations

import glob
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any

# MindCV's packages whose __init__ is skipped: an empty package with the right __path__.
_BARE_PACKAGES = ("mindcv", "mindcv.models", "mindcv.utils")


class _MindSporeAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, mindcv_dir: str | None) -> None:
        self.mindcv_dir = mindcv_dir

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname == "mindspore" or fullname.startswith("mindspore."):
            return importlib.machinery.ModuleSpec(fullname, self)
        if self.mindcv_dir and fullname in _BARE_PACKAGES:
            folder = os.path.join(os.path.dirname(self.mindcv_dir), *fullname.split("."))
            spec = importlib.machinery.ModuleSpec(fullname, self, is_package=True)
            spec.submodule_search_locations = [folder]
            return spec
        return None

    def create_module(self, spec: Any) -> types.ModuleType | None:
        return None  # a plain module; exec_module puts graphkernel's in its place

    def exec_module(self, module: types.ModuleType) -> None:
        name = module.__name__
        if name.startswith("mindcv"):
            return  # a bare package: its submodules load from __path__
        # The import system returns whatever sys.modules holds under the name once this ends.
        sys.modules[name] = importlib.import_module("graphkernel" + name[len("mindspore"):])


def find_mindcv() -> str | None:
    """MindCV's package folder in the MindSpore venv beside graphkernel's (MINDCV_DIR wins)."""
    if os.environ.get("MINDCV_DIR"):
        return os.environ["MINDCV_DIR"]
    found = glob.glob("/work/ms-venv/lib/python3*/site-packages/mindcv")
    return found[0] if found else None


def install_alias(mindcv_dir: str | None = None) -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _MindSporeAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, _MindSporeAlias(mindcv_dir or find_mindcv()))
