"""The C compiler this machine offers: which one, its version, OpenMP and libmvec support."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    openmp: bool
    libmvec: bool
    # Include folders for CPython and numpy headers when both exist: graphs then get a CPython
    # entry point (runtime/c_entry.py).
    python_includes: tuple[str, ...] = ()
    avx512: bool = False

    @property
    def flags(self) -> tuple[str, ...]:
        omp = "-fopenmp" if self.openmp else "-fopenmp-simd"
        # 512-bit vectors: -march=native on AVX-512 Xeons defaults to 256-bit ones, which also
        # picks libmvec's 8-wide AVX2 variants instead of the 16-wide AVX-512 ones.
        wide = ("-mprefer-vector-width=512",) if self.avx512 else ()
        # -fno-trapping-math lets gcc turn selects on floats (clamps, NaN checks, max/min)
        # into vector blends; results stay IEEE-exact (it is not -ffast-math).
        # -ffp-contract=off: no fused multiply-adds, so each op rounds as in numpy (and as with
        # fusion off); gcc's GNU C default contracts x * y + z into one fma.
        return ("-O3", "-march=native", *wide, "-fPIC", "-shared", "-std=gnu11",
                "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv", omp)

    @property
    def libs(self) -> tuple[str, ...]:
        return ("-lmvec", "-lm") if self.libmvec else ("-lm",)


def _try_compile(compiler: str, source: str, args: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="graphkernel-probe-") as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(source)
        try:
            result = subprocess.run([compiler, src, "-o", os.path.join(tmp, "probe.so"),
                                     "-shared", "-fPIC", *args], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0


_MVEC_PROBE = """#include <math.h>
#pragma omp declare simd notinbranch
float expf(float);
void f(float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) x[i] = expf(x[i]);
}
"""


# Bump when the probe or the Toolchain fields change, so saved probes are redone.
_PROBE_VERSION = 4


def find_compiler() -> str | None:
    candidates = [os.environ.get("CC", "")] + ["gcc", "cc", "clang"]
    for name in candidates:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _python_includes() -> tuple[str, ...]:
    import sysconfig

    import numpy
    python = sysconfig.get_paths().get("include", "")
    if python and os.path.exists(os.path.join(python, "Python.h")):
        return (python, numpy.get_include())
    return ()


@functools.lru_cache(maxsize=1)
def detect() -> Toolchain | None:
    """The toolchain, or None when no C compiler exists (fused groups then run on numpy).

    Probing runs the compiler a few times (~0.3 s); the result is kept in the private cache
    folder, keyed by the compiler's path, size and modification time, so a new process reuses
    it."""
    compiler = find_compiler()
    if compiler is None:
        return None
    from graphkernel.codegen import cache
    try:
        info = os.stat(compiler)
        folder = cache.ensure_private_dir(cache.cache_dir())
    except (OSError, cache.CacheError):
        return _probe(compiler)
    # The interpreter and numpy stand for their include folders here: finding those imports
    # sysconfig (2 ms of every warm start); the probe itself records them.
    import numpy
    stamp = (f"{_PROBE_VERSION}|{compiler}|{info.st_size}|{info.st_mtime_ns}|"
             f"{sys.executable}|{sys.version}|{numpy.__version__}|{cpu_signature()}")
    path = os.path.join(folder, "toolchain.json")
    try:
        with open(path, encoding="utf-8") as fh:
            saved = json.load(fh)
        if saved.get("stamp") == stamp:
            fields = saved["toolchain"]
            fields["python_includes"] = tuple(fields["python_includes"])
            return Toolchain(**fields)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = _probe(compiler)
    if found is not None:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"stamp": stamp, "toolchain": dataclasses.asdict(found)}, fh)
        os.replace(tmp, path)
    return found


def _probe(compiler: str) -> Toolchain | None:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.splitlines()[0].strip() if out.stdout else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return None
    openmp = _try_compile(compiler, "int f(void){return 0;}\n", ["-fopenmp"])
    libmvec = _try_compile(compiler, _MVEC_PROBE, ["-O3", "-march=native", "-fopenmp-simd",
                                                   "-fno-math-errno", "-lmvec", "-lm"])
    includes = _python_includes()
    if includes and not _try_compile(compiler, "#include <Python.h>\n#include "
                                     "<numpy/arrayobject.h>\n",
                                     [f"-I{d}" for d in includes]):
        includes = ()
    avx512 = "avx512f" in cpu_signature().split()
    return Toolchain(compiler, version, openmp, libmvec, includes, avx512)


@functools.lru_cache(maxsize=1)
def cpu_signature() -> str:
    """What -march=native depends on: kernels built for one CPU are not reused on another."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return line.strip()
    except OSError:
        pass
    import platform
    return platform.machine() + platform.processor()
