"""The C compiler this machine offers: which one, its version, OpenMP and libmvec support."""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    openmp: bool
    libmvec: bool

    @property
    def flags(self) -> tuple[str, ...]:
        omp = "-fopenmp" if self.openmp else "-fopenmp-simd"
        return ("-O3", "-march=native", "-fPIC", "-shared", "-std=gnu11", "-fno-math-errno",
                "-fwrapv", omp)

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


def find_compiler() -> str | None:
    candidates = [os.environ.get("CC", "")] + ["gcc", "cc", "clang"]
    for name in candidates:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.lru_cache(maxsize=1)
def detect() -> Toolchain | None:
    """The toolchain, or None when no C compiler exists (fused groups then run on numpy)."""
    compiler = find_compiler()
    if compiler is None:
        return None
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        version = out.stdout.splitlines()[0].strip() if out.stdout else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return None
    openmp = _try_compile(compiler, "int f(void){return 0;}\n", ["-fopenmp"])
    libmvec = _try_compile(compiler, _MVEC_PROBE, ["-O3", "-march=native", "-fopenmp-simd",
                                                   "-fno-math-errno", "-lmvec", "-lm"])
    return Toolchain(compiler, version, openmp, libmvec)


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
