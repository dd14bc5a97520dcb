"""One shared library per compiled graph: all its kernels in one translation unit, compiled
once, cached on disk, loaded with ctypes."""
from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel._version import __version__
from graphkernel.codegen import cache, toolchain
from graphkernel.codegen.c_emitter import KernelSource
from graphkernel.codegen.c_text import PRELUDE

KernelFn = ctypes._CFuncPtr  # type: ignore[name-defined]


@dataclass
class BuiltLibrary:
    path: str
    source: str
    from_cache: bool
    functions: dict[str, KernelFn]
    entry: Any = None  # the graph's CPython `run`, when it has one


def translation_unit(kernels: list[KernelSource], with_libmvec: bool) -> str:
    prelude = PRELUDE if with_libmvec else PRELUDE.split("/* Vector variants")[0]
    return prelude + "\n" + "\n".join(k.source for k in kernels)


# Loaded libraries stay loaded for the life of the process (ctypes cannot unload safely).
_loaded: dict[str, ctypes.CDLL] = {}


def build_library(kernels: list[KernelSource],
                  entry: Callable[[str], str] | None = None) -> BuiltLibrary:
    """Compile `kernels` into one shared library (or load it from the cache). `entry`, given
    the module name, returns the C of a CPython module to build into the same library (the
    plan's C runner, runtime/c_entry.py)."""
    tc = toolchain.detect()
    assert tc is not None, "build_library needs a C compiler"
    # libgomp reads its settings when it is loaded: spin-waiting threads stall on a shared
    # 2-core machine, so wait passively unless the user chose otherwise.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    source = translation_unit(kernels, tc.libmvec)
    flags = tc.flags
    module = None
    if entry is not None and tc.python_includes:
        # The module's name must be known inside its source: name it after the kernels' source.
        module = "gk_" + hashlib.sha256(source.encode()).hexdigest()[:24]
        source += "\n" + entry(module)
        flags = flags + tuple(f"-I{d}" for d in tc.python_includes)
    folder = cache.ensure_private_dir(cache.cache_dir())
    key = _key(tc, source, flags, module is not None)
    path = cache.lookup(folder, key)
    from_cache = path is not None
    if path is None:
        path = cache.build(folder, key, source, tc.compiler, flags, tc.libs)
    lib = _loaded.get(path)
    if lib is None:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            # Unloadable although the checksum matched (e.g. built for another libc): rebuild.
            os.unlink(path)
            path = cache.build(folder, key, source, tc.compiler, flags, tc.libs)
            lib = ctypes.CDLL(path)
            from_cache = False
        _loaded[path] = lib
    functions = {}
    for k in kernels:
        fn = getattr(lib, k.name)
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        functions[k.name] = fn
    entry = _load_entry(path, module) if module else None
    return BuiltLibrary(path, source, from_cache, functions, entry)


def _key(tc: toolchain.Toolchain, source: str, flags: tuple[str, ...], with_entry: bool) -> str:
    abi = f"{sys.version_info[:2]} numpy {np.__version__}" if with_entry else ""
    return cache.cache_key(source, tc.compiler, tc.version, flags + tc.libs, __version__ + abi,
                           toolchain.cpu_signature())


def library_key(source: str, with_entry: bool) -> str | None:
    """The cache key this machine's toolchain and CPU give a library's whole `source` (as in
    `BuiltLibrary.source`; `with_entry`: it holds the CPython entry), or None without a
    compiler. A prebuilt library from an export is usable here only under this key."""
    tc = toolchain.detect()
    if tc is None or (with_entry and not tc.python_includes):
        return None
    flags = tc.flags + (tuple(f"-I{d}" for d in tc.python_includes) if with_entry else ())
    return _key(tc, source, flags, with_entry)


def _load_entry(path: str, module: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod.run
