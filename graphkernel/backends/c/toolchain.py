"""The C compiler this machine offers: which one, its version, OpenMP (and which runtime) and
libmvec support."""
from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from graphkernel.errors import CacheError, ToolchainError

# "llvm" links kernels to LLVM's OpenMP runtime (libomp), "gnu" to GCC's (libgomp); unset: llvm
# when libomp is installed. libgomp is not fork-safe: a child forked after a parallel region ran
# hangs in its first one. libomp re-creates its threads in the child.
OPENMP_ENV = "GRAPHKERNEL_OPENMP"


@dataclass(frozen=True)
class Toolchain:
    compiler: str
    version: str
    openmp: bool
    libmvec: bool
    # Include folders for CPython and numpy headers when both exist: graphs then get a CPython
    # entry point (backends/c/c_entry.py).
    python_includes: tuple[str, ...] = ()
    avx512: bool = False
    # The folder holding LLVM's libomp.so when kernels link to it; "" for GCC's libgomp.
    openmp_lib: str = ""
    # gcc 12 on an AVX512-FP16 CPU emits masked `vmovsh` moves for float16 selects that
    # binutils 2.40 rejects ("unsupported masking"): such a toolchain builds without
    # AVX512-FP16 (float16 math is done in float32 anyway).
    no_avx512fp16: bool = False

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
        fp16 = ("-mno-avx512fp16",) if self.no_avx512fp16 else ()
        return ("-O3", "-march=native", *wide, *fp16, "-fPIC", "-shared", "-std=gnu11",
                "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fwrapv", omp)

    @property
    def libs(self) -> tuple[str, ...]:
        maths = ("-lmvec", "-lm") if self.libmvec else ("-lm",)
        return _libomp_args(self.openmp_lib) + maths if self.openmp else maths

    @property
    def openmp_runtime(self) -> str:
        """Which OpenMP runtime kernels use, in words."""
        if not self.openmp:
            return "none"
        if self.openmp_lib:
            return f"LLVM libomp ({self.openmp_lib}; fork-safe)"
        return "GNU libgomp (not fork-safe: forked children run kernels on one thread)"


def _libomp_args(folder: str) -> tuple[str, ...]:
    if not folder:
        return ()
    # gcc -fopenmp adds -lgomp at the end of the link: libomp, found first, provides the GOMP_*
    # entry points gcc emits, and --as-needed keeps libgomp out of the library's dependencies.
    return (f"-L{folder}", f"-Wl,-rpath,{folder}", "-Wl,--as-needed", "-lomp")


def find_libomp() -> str | None:
    """The folder of LLVM's OpenMP runtime (libomp.so), the newest LLVM first."""
    def llvm_version(path: str) -> int:
        found = re.search(r"llvm-(\d+)", path)
        return int(found.group(1)) if found else 0
    candidates = sorted(glob.glob("/usr/lib/llvm-*/lib/libomp.so"), key=llvm_version,
                        reverse=True)
    candidates += [os.path.join(d, "libomp.so") for d in (
        "/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64",
        "/usr/local/lib", "/usr/lib")]
    for path in candidates:
        if os.path.exists(path):
            return os.path.dirname(path)
    return None


def _openmp_choice() -> str:
    choice = os.environ.get(OPENMP_ENV, "").strip().lower()
    if choice not in ("", "llvm", "gnu"):
        raise ToolchainError(f"{OPENMP_ENV}={os.environ[OPENMP_ENV]!r} is not an OpenMP runtime: "
                             "use 'llvm' (LLVM's libomp) or 'gnu' (GCC's libgomp), or unset it")
    return choice


def _try_compile(compiler: str, source: str, args: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="graphkernel-probe-") as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as fh:
            fh.write(source)
        out = os.path.join(tmp, "probe.so")
        try:
            result = subprocess.run([compiler, src, "-o", out, "-shared", "-fPIC", *args],
                                    capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0 and os.path.isfile(out)


def _check_compiler(compiler: str) -> None:
    """Raise ToolchainError unless `compiler` builds a one-line shared library that this
    process can load (CC=/bin/false, CC=/bin/true, a cross compiler all fail here)."""
    named = f"$CC={os.environ['CC']!r} ({compiler})" if os.environ.get("CC") and \
        shutil.which(os.environ["CC"]) == compiler else compiler
    advice = "set CC to a working gcc or clang" if os.environ.get("CC") else \
        "repair it, or set CC to a working gcc or clang"
    with tempfile.TemporaryDirectory(prefix="graphkernel-probe-") as tmp:
        src, out = os.path.join(tmp, "check.c"), os.path.join(tmp, "check.so")
        with open(src, "w", encoding="ascii") as fh:
            fh.write("int gk_probe(void) { return 42; }\n")
        try:
            result = subprocess.run([compiler, "-shared", "-fPIC", src, "-o", out],
                                    capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolchainError(f"the C compiler {named} cannot be run: {exc}; {advice}") \
                from None
        if result.returncode != 0:
            said = result.stderr.strip()[-1500:] or "nothing on stderr"
            raise ToolchainError(f"the C compiler {named} fails on a one-line C file (exit "
                                 f"status {result.returncode}: {said}); {advice}")
        if not os.path.isfile(out):
            raise ToolchainError(f"the C compiler {named} exited with status 0 but wrote no "
                                 f"library for a one-line C file; {advice}")
        try:
            probe = ctypes.CDLL(out)
            answer = probe.gk_probe()
        except (OSError, AttributeError) as exc:
            raise ToolchainError(f"the C compiler {named} builds libraries this process cannot "
                                 f"load ({exc}); {advice}") from None
        if answer != 42:
            raise ToolchainError(f"a library built by the C compiler {named} returned {answer} "
                                 f"where it should return 42; {advice}")


_MVEC_PROBE = """#include <math.h>
#pragma omp declare simd notinbranch
float expf(float);
void f(float *restrict x, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) x[i] = expf(x[i]);
}
"""

_OMP_PROBE = """void f(float *x, long n) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) x[i] += 1.0f;
}
"""

# A float16 select as kernels write it (a masked scalar move on AVX512-FP16).
_FP16_PROBE = """void f(void **argv) {
  const _Float16 *a = argv[0], *b = argv[1];
  _Float16 *out = argv[2];
  out[0] = a[0] < b[0] ? a[0] : (_Float16)0.0f;
}
"""
_FP16_FLAGS = ["-O3", "-march=native", "-fno-trapping-math", "-ffp-contract=off"]

# Bump when the probe or the Toolchain fields change, so saved probes are redone.
_PROBE_VERSION = 6


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
    A compiler that does not work is a ToolchainError.

    Probing runs the compiler a few times (~0.3 s); the result is kept in the private cache
    folder, keyed by the compiler's path, size and modification time, so a new process reuses
    it."""
    compiler = find_compiler()
    if compiler is None:
        return None
    choice = _openmp_choice()
    libomp = find_libomp() if choice != "gnu" else None
    if choice == "llvm" and libomp is None:
        raise ToolchainError(f"{OPENMP_ENV}=llvm but LLVM's OpenMP runtime (libomp.so) is not "
                             "installed (Debian/Ubuntu: apt-get install libomp-dev)")
    found = _detect(compiler, libomp)
    if found.openmp and not found.openmp_lib:
        _serial_gnu_openmp_after_fork()
    return found


def _detect(compiler: str, libomp: str | None) -> Toolchain:
    from graphkernel.backends.c import cache
    folder_name = cache.cache_dir()  # a bad cache setting is an error here, at first use
    try:
        info = os.stat(compiler)
        folder = cache.ensure_private_dir(folder_name)
    except (OSError, CacheError):
        return _probe(compiler, libomp)  # the build reports an unusable cache folder
    # The interpreter and numpy stand for their include folders here: finding those imports
    # sysconfig (2 ms of every warm start); the probe itself records them.
    import numpy
    stamp = (f"{_PROBE_VERSION}|{compiler}|{info.st_size}|{info.st_mtime_ns}|"
             f"{sys.executable}|{sys.version}|{numpy.__version__}|{cpu_signature()}|{libomp}")
    path = os.path.join(folder, "toolchain.json")
    try:
        with open(path, encoding="utf-8") as fh:
            saved = json.load(fh)
        if isinstance(saved, dict) and saved.get("stamp") == stamp:
            fields = dict(saved["toolchain"])
            fields["python_includes"] = tuple(fields["python_includes"])
            return Toolchain(**fields)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # missing, unreadable or not ours: probe again and replace it
    found = _probe(compiler, libomp)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"stamp": stamp, "toolchain": dataclasses.asdict(found)}, fh)
        cache.clear_empty_folder(path)
        os.replace(tmp, path)
    except OSError as exc:
        # Not saving the probe costs the next process 0.3 s, not a failure: say why once.
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.ELOOP):
            cache.warn_once(f"graphkernel: cannot save the compiler probe as {path} "
                            f"({exc.strerror}): each process probes the compiler again (about "
                            f"0.3 s). Remove {path} to let graphkernel write it")
        else:
            cache.note_unwritable(folder, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return found


def compile_workers() -> int:
    """Compiler processes a build (or the probe) may run at once: the cores this process may
    use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _version(compiler: str) -> str:
    try:
        out = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _probe(compiler: str, libomp: str | None) -> Toolchain:
    _check_compiler(compiler)  # first and alone: a broken compiler is one clear error
    includes = _python_includes()
    cpu = cpu_signature().split()
    fp16_cpu = "avx512_fp16" in cpu or "avx512fp16" in cpu
    # The trial compiles are independent: run at once, one per core (0.21 -> ~0.1 s of a first
    # compile on 2 cores). A trial whose answer turns out not to matter (LLVM's libomp when
    # OpenMP itself fails) costs a core for 30 ms and nothing else.
    trials: dict[str, tuple[str, list[str]]] = {
        "openmp": (_OMP_PROBE, ["-fopenmp"]),
        "libmvec": (_MVEC_PROBE, ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno",
                                  "-lmvec", "-lm"]),
    }
    if libomp:
        trials["libomp"] = (_OMP_PROBE, ["-fopenmp", *_libomp_args(libomp)])
    if includes:
        trials["includes"] = ("#include <Python.h>\n#include <numpy/arrayobject.h>\n",
                              [f"-I{d}" for d in includes])
    if fp16_cpu:
        trials["fp16"] = (_FP16_PROBE, _FP16_FLAGS)
        trials["fp16_off"] = (_FP16_PROBE, [*_FP16_FLAGS, "-mno-avx512fp16"])
    with ThreadPoolExecutor(max_workers=min(compile_workers(), len(trials) + 1)) as pool:
        version_job = pool.submit(_version, compiler)
        jobs = {name: pool.submit(_try_compile, compiler, source, args)
                for name, (source, args) in trials.items()}
        ok = {name: job.result() for name, job in jobs.items()}
        version = version_job.result()
    openmp = ok["openmp"]
    openmp_lib = ""
    if openmp and libomp and ok["libomp"]:
        openmp_lib = libomp
    elif openmp and libomp and os.environ.get(OPENMP_ENV, "").strip().lower() == "llvm":
        raise ToolchainError(f"{OPENMP_ENV}=llvm but {compiler} cannot link OpenMP code to "
                             f"LLVM's libomp in {libomp}")
    if includes and not ok["includes"]:
        includes = ()
    avx512 = "avx512f" in cpu
    no_fp16 = fp16_cpu and not ok["fp16"] and ok["fp16_off"]
    return Toolchain(compiler, version, openmp, ok["libmvec"], includes, avx512, openmp_lib,
                     no_fp16)


_guarded_fork = False


def _serial_gnu_openmp_after_fork() -> None:
    """GNU libgomp cannot start threads in a child forked after a parallel region ran (the
    child hangs). Where kernels use it, a forked child runs them on one thread instead."""
    global _guarded_fork
    if not _guarded_fork:
        _guarded_fork = True
        os.register_at_fork(after_in_child=_one_thread_in_child)


def _one_thread_in_child() -> None:
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    except OSError:
        return  # no kernel was loaded: the child starts libgomp afresh
    gomp.omp_set_num_threads(1)
    warnings.warn("graphkernel: this process was forked from one that ran kernels with GNU "
                  "OpenMP (libgomp), which cannot start threads after a fork: kernels here run "
                  "on one thread. Install LLVM's OpenMP runtime (apt-get install libomp-dev) "
                  "for parallel kernels in forked processes.", RuntimeWarning, stacklevel=2)


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), or what the platform says: what measurements
    taken on this machine (tuning records, BLAS timings) are keyed by."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


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
