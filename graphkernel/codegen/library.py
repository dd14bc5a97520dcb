"""One shared library per compiled graph: all its kernels in one translation unit, compiled
once, cached on disk, loaded with ctypes."""
from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from graphkernel import __version__
from graphkernel.codegen import cache, toolchain
from graphkernel.codegen.c_emitter import PRELUDE, KernelSource

KernelFn = ctypes._CFuncPtr  # type: ignore[name-defined]


@dataclass
class BuiltLibrary:
    path: str
    source: str
    from_cache: bool
    functions: dict[str, KernelFn]


def translation_unit(kernels: list[KernelSource], with_libmvec: bool) -> str:
    prelude = PRELUDE if with_libmvec else PRELUDE.split("/* Vector variants")[0]
    return prelude + "\n" + "\n".join(k.source for k in kernels)


# Loaded libraries stay loaded for the life of the process (ctypes cannot unload safely).
_loaded: dict[str, ctypes.CDLL] = {}


def build_library(kernels: list[KernelSource]) -> BuiltLibrary:
    tc = toolchain.detect()
    assert tc is not None, "build_library needs a C compiler"
    # libgomp reads its settings when it is loaded: spin-waiting threads stall on a shared
    # 2-core machine, so wait passively unless the user chose otherwise.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    source = translation_unit(kernels, tc.libmvec)
    folder = cache.ensure_private_dir(cache.cache_dir())
    key = cache.cache_key(source, tc.compiler, tc.version, tc.flags + tc.libs, __version__,
                          toolchain.cpu_signature())
    path = cache.lookup(folder, key)
    from_cache = path is not None
    if path is None:
        path = cache.build(folder, key, source, tc.compiler, tc.flags, tc.libs)
    lib = _loaded.get(path)
    if lib is None:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            # Unloadable although the checksum matched (e.g. built for another libc): rebuild.
            os.unlink(path)
            path = cache.build(folder, key, source, tc.compiler, tc.flags, tc.libs)
            lib = ctypes.CDLL(path)
            from_cache = False
        _loaded[path] = lib
    functions = {}
    for k in kernels:
        fn = getattr(lib, k.name)
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        functions[k.name] = fn
    return BuiltLibrary(path, source, from_cache, functions)
