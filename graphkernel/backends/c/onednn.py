"""oneDNN (`pip install graphkernel[onednn]`: the `onednn` and `onednn-devel` wheels) for forward
float32 convolutions, where it is installed and measured faster (backends/c/onednn_choice.py).

Generated kernels do not link to oneDNN: a fixed C shim (onednn_shim.c) is compiled once per
oneDNN version and compiler into the kernel cache against the wheel's headers and libdnnl, and
loaded with RTLD_GLOBAL before any kernel library that calls it; kernels reference the shim's
three functions as weak symbols (c_window.py ONEDNN_DECLS), so a library loaded where the shim
is not runs its own convolution code.

The `onednn` wheel (2026.1) is built for SYCL's CPU runtime: its CPU engine is a SYCL CPU
device, which the wheel's OpenCL CPU runtime (`intel-opencl-rt`, libintelocl.so) provides.
OpenCL's loader finds that runtime through OCL_ICD_FILENAMES (the wheel's .icd file names a
path on its build machine), so `load()` adds the environment's libintelocl.so there before the
engine is made. Its threads are TBB's, as many as the CPUs this process may run on."""
from __future__ import annotations

import ctypes
import glob
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from graphkernel.backends.c import cache, loader_search, toolchain
from graphkernel.errors import CacheError

SHIM_SOURCE = os.path.join(os.path.dirname(__file__), "onednn_shim.c")
# The geometry the shim takes (onednn_shim.c's G_* order).
GEOMETRY = ("n", "c", "h", "w", "o", "kh", "kw", "groups", "sh", "sw", "dh", "dw", "pt", "pb",
            "pl", "pr", "oh", "ow", "blocked")


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


@dataclass(frozen=True)
class OneDNN:
    """The loaded shim over an installed oneDNN."""

    version: str  # "3.13.2"
    libdnnl: str
    shim: Any  # ctypes.CDLL of the compiled onednn_shim.c

    @property
    def label(self) -> str:
        return f"onednn {self.version}"

    def primitive(self, geometry: tuple[int, ...], blocked: bool = False
                  ) -> tuple[ConvPrimitive | None, str]:
        """The convolution for `geometry` (GEOMETRY's numbers but the last) on NCHW, or on
        oneDNN's blocked layout (`blocked`), or None and oneDNN's reason."""
        numbers = (ctypes.c_int64 * len(GEOMETRY))(*geometry, int(blocked))
        error = ctypes.create_string_buffer(256)
        handle = self.shim.gk_dnnl_conv_get(numbers, error, len(error))
        if not handle:
            return None, error.value.decode(errors="replace") or "oneDNN made no primitive"
        implementation = self.shim.gk_dnnl_conv_impl(handle).decode(errors="replace")
        return ConvPrimitive(handle, int(self.shim.gk_dnnl_conv_weights_bytes(handle)),
                             implementation), ""


@dataclass(frozen=True)
class ConvPrimitive:
    """oneDNN's convolution for one geometry (the shim's, made once per process)."""

    handle: int
    weights_bytes: int
    implementation: str


_state: dict[str, Any] = {}
_lock = threading.Lock()


def _libdnnl_paths() -> Iterator[str]:
    """Where the `onednn` wheel puts libdnnl (the environment's lib/), then the loader's. The
    loader is asked only when the wheel's did not serve, and once per process, without
    running ldconfig and the C compiler where it cannot see libdnnl (loader_search.py)."""
    yield from sorted(glob.glob(os.path.join(sys.prefix, "lib", "libdnnl.so.*")))
    found = loader_search.find_library("dnnl")
    if found:
        yield found


def _include_dir(libdnnl: str) -> str | None:
    """The `onednn-devel` headers beside the library (<prefix>/include/oneapi/dnnl/dnnl.h)."""
    for prefix in (os.path.dirname(os.path.dirname(os.path.realpath(libdnnl))), sys.prefix):
        if os.path.isfile(os.path.join(prefix, "include", "oneapi", "dnnl", "dnnl.h")):
            return os.path.join(prefix, "include")
    return None


def _opencl_cpu_runtime(libdnnl: str) -> None:
    """Point OpenCL's loader at the CPU runtime beside libdnnl, where there is one (a SYCL
    build's CPU device; a build on OpenMP or TBB alone has none and needs none)."""
    folder = os.path.dirname(os.path.realpath(libdnnl))
    runtime = os.path.join(folder, "libintelocl.so")
    listed = [p for p in os.environ.get("OCL_ICD_FILENAMES", "").split(":") if p]
    if os.path.isfile(runtime) and runtime not in listed:
        os.environ["OCL_ICD_FILENAMES"] = ":".join(listed + [runtime])


def _build_shim(libdnnl: str, include: str, version: str) -> str:
    tc = toolchain.detect()
    if tc is None:
        raise OSError("no C compiler")
    with open(SHIM_SOURCE, encoding="utf-8") as fh:
        source = fh.read()
    folder = os.path.dirname(libdnnl)
    flags = (*tc.flags, f"-I{include}")
    # RPATH, not RUNPATH: libdnnl's own libraries (TBB, SYCL, Intel's maths) sit beside it.
    libs = (f"-L{folder}", f"-l:{os.path.basename(libdnnl)}",
            f"-Wl,--disable-new-dtags,-rpath,{folder}", "-lpthread")
    key = cache.cache_key(source, tc.compiler, tc.version, flags + libs, f"onednn {version}",
                          libdnnl)
    return cache.build(cache.open_folder(), key, source, tc.compiler, flags, libs)


def _header_version(include: str) -> str:
    """The headers' oneDNN version (dnnl_version.h), "" when unreadable."""
    numbers = {}
    try:
        with open(os.path.join(include, "oneapi", "dnnl", "dnnl_version.h"),
                  encoding="utf-8") as fh:
            for line in fh:
                words = line.split()
                if len(words) == 3 and words[0] == "#define" and words[2].isdigit():
                    numbers[words[1]] = words[2]
    except OSError:
        return ""
    parts = [numbers.get(f"DNNL_VERSION_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p for p in parts if p is not None) if all(parts) else ""


def _load() -> tuple[OneDNN | None, str]:
    problems = []
    for path in _libdnnl_paths():
        include = _include_dir(path)
        if include is None:
            problems.append(f"{path}: oneDNN's headers are missing (pip install onednn-devel)")
            continue
        headers = _header_version(include)
        # The shim loads libdnnl (its RPATH finds the libraries beside it): a CPU runtime that
        # needs OpenCL's loader set up is set up first.
        _opencl_cpu_runtime(path)
        try:
            shim_path = _build_shim(path, include, headers)
            shim = ctypes.CDLL(shim_path, mode=ctypes.RTLD_GLOBAL)
            shim.dnnl_version.restype = ctypes.POINTER(_Version)
            v = shim.dnnl_version().contents
        except (OSError, AttributeError, CacheError) as exc:
            problems.append(f"the oneDNN shim over {path} does not build or load ({exc})")
            continue
        version = f"{v.major}.{v.minor}.{v.patch}"
        if version != headers:
            problems.append(f"{path} is oneDNN {version}, its headers {headers or 'unknown'}")
            continue
        shim.gk_dnnl_conv_get.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
                                          ctypes.c_int]
        shim.gk_dnnl_conv_get.restype = ctypes.c_void_p
        shim.gk_dnnl_conv_weights_bytes.argtypes = [ctypes.c_void_p]
        shim.gk_dnnl_conv_weights_bytes.restype = ctypes.c_int64
        shim.gk_dnnl_conv_impl.argtypes = [ctypes.c_void_p]
        shim.gk_dnnl_conv_impl.restype = ctypes.c_char_p
        for name in ("gk_dnnl_conv_pack", "gk_dnnl_conv_run"):
            getattr(shim, name).restype = ctypes.c_int
        shim.gk_dnnl_conv_pack.argtypes = [ctypes.c_void_p] * 3
        shim.gk_dnnl_conv_run.argtypes = [ctypes.c_void_p] * 4
        return OneDNN(version, path, shim), ""
    if not problems:
        return None, "oneDNN is not installed (pip install graphkernel[onednn])"
    return None, "; ".join(problems)


def installed_label() -> str | None:
    """The label of the oneDNN `load()` would load ("onednn 3.13.2"), from its headers'
    version without loading it (a stored timing decides without oneDNN's start-up, which
    makes its SYCL device: 0.4 s); None where none is installed with its headers."""
    with _lock:
        if "label" not in _state:
            _state["label"] = None
            for path in _libdnnl_paths():
                include = _include_dir(path)
                version = _header_version(include) if include is not None else ""
                if version:
                    _state["label"] = f"onednn {version}"
                    break
        return _state["label"]


def load() -> OneDNN | None:
    """oneDNN with its shim loaded (once per process), or None where it is not usable here
    (`why_not()` says why)."""
    with _lock:
        if "found" not in _state:
            _state["found"], _state["why"] = _load()
        return _state["found"]


def why_not() -> str:
    """Why `load()` found no oneDNN ("" when it did)."""
    load()
    return str(_state["why"])


def threads() -> int:
    """oneDNN's threads here: TBB's, one per CPU this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
