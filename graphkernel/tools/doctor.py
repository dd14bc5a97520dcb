"""`graphkernel doctor`: what this machine offers (compiler, OpenMP, libmvec, renderer, cache),
what it measures (copy bandwidth, FMA and GEMM rates), the calibration the C backend's
defaults come from and each default's value and source, how BLAS and OpenMP threads are set, and
what is missing."""
from __future__ import annotations

import os
import stat
import tempfile

from graphkernel.backends.c import blas_choice, cache, calibration, toolchain
from graphkernel.errors import CacheError, GraphKernelError, ToolchainError
from graphkernel.runtime import blas
from graphkernel.tools import machine_rates
from graphkernel.tools.render import find_renderer


def _takes_new_files(folder: str) -> bool:
    """Whether a file can be made in `folder` (a real try: modes do not stop root, but a
    read-only mount or the immutable attribute do)."""
    try:
        fd, path = tempfile.mkstemp(prefix=".doctor-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(path)
    return True


def _cache_line() -> tuple[str, str | None]:
    """The cache folder's line, and what is wrong with it (None when it is fine)."""
    try:
        folder = cache.cache_dir()
    except CacheError as err:
        return f"cache    : REFUSED - {err.problem}", "a usable kernel cache setting"
    source = "$GRAPHKERNEL_CACHE_DIR" if os.environ.get("GRAPHKERNEL_CACHE_DIR") else "default"
    if not os.path.exists(folder):
        return (f"cache    : {folder} ({source}; not created yet, will be created with mode 700)",
                None)
    try:
        cache.ensure_private_dir(folder)
    except CacheError as err:
        return f"cache    : REFUSED - {err.problem}", f"a private kernel cache folder ({folder})"
    info = os.stat(folder)
    mode = stat.S_IMODE(info.st_mode)
    entries = len([f for f in os.listdir(folder) if f.endswith(cache.LIBRARY_SUFFIX)])
    writable = "" if _takes_new_files(folder) else \
        ", READ-ONLY: its kernels load, new ones are built in a temporary folder per process"
    return (f"cache    : {folder} ({source}; mode {mode:o}, owner uid {info.st_uid} = you, "
            f"{entries} libraries{writable})", None)


def doctor(measure: bool = True) -> tuple[str, bool]:
    """The report, and whether everything graphkernel can use is there. `measure`: include
    the machine's measured rates (about a second)."""
    lines: list[str] = []
    missing: list[str] = []
    broken: ToolchainError | CacheError | None = None
    try:
        tc = toolchain.detect()
    except (ToolchainError, CacheError) as err:
        tc, broken = None, err
    if isinstance(broken, CacheError):  # the cache line below says what is wrong
        lines.append("compiler : not probed - the kernel cache setting is refused")
    elif broken is not None:
        lines.append(f"compiler : BROKEN - {broken.problem}")
        missing.append("a working C compiler (fix or unset CC)")
    elif tc is None:
        cc = os.environ.get("CC")
        tried = f"$CC={cc!r}, gcc, cc, clang" if cc else "gcc, cc, clang"
        lines.append(f"compiler : MISSING (tried {tried}) - fused kernels run op by op on "
                     "numpy: correct but slow")
        missing.append("a C compiler (install gcc, or set CC)")
    else:
        lines.append(f"compiler : {tc.compiler} ({tc.version})")
        lines.append(f"openmp   : yes, {tc.openmp_runtime}" if tc.openmp else
                     "openmp   : MISSING - kernels run on one thread")
        if not tc.openmp:
            missing.append("OpenMP (libgomp: install gcc's OpenMP support)")
        elif not tc.openmp_lib:
            missing.append("LLVM's OpenMP runtime, for parallel kernels in forked processes "
                           "(apt-get install libomp-dev)")
        lines.append(f"libmvec  : {'yes' if tc.libmvec else 'no - exp/log/tanh stay scalar'}")
        if not tc.libmvec:
            missing.append("libmvec (glibc's vector math: exp/log/tanh are slower)")
        lines.append(f"flags    : {' '.join(tc.flags + tc.libs)}")
    renderer = find_renderer()
    renderer = os.path.normpath(renderer) if renderer else None
    lines.append(f"renderer : {renderer or 'MISSING - pip install graphviz-pure==0.2.2'}")
    if renderer is None:
        missing.append("a Graphviz renderer for pictures (pip install graphviz-pure==0.2.2)")
    line, problem = _cache_line()
    lines.append(line)
    if problem is not None:
        missing.append(problem)
    # the thread settings as the user left them: building the calibration's kernels sets
    # OMP_WAIT_POLICY for this process (backends/c/library.py)
    thread_lines, advice = machine_rates.thread_lines(blas.describe())
    if measure:
        # the calibration first: after the GEMM rate numpy's BLAS threads spin a while on the
        # other cores, and a fork/join timed beside them read 8.6 us asleep, 33 awake (55, 1.3)
        calibrated = _calibration_lines()
        lines += _rate_lines(tc) + calibrated
    lines += thread_lines + [_gemm_line(), advice]
    if missing:
        lines.append("missing  : " + "; ".join(missing))
    else:
        lines.append("missing  : nothing")
    ok = tc is not None and problem is None
    return "\n".join(lines), ok


def _gemm_line() -> str:
    """Which libraries the compiled entry's products may run on (backends/c/blas_choice.py)."""
    found = blas_choice.libraries()
    if not found:
        return ("gemm     : products run through numpy (its BLAS is not an OpenBLAS the "
                "compiled entry calls)")
    mkl = blas_choice.mkl()
    text = (f"gemm     : compiled products on OpenMP's threads, one BLAS thread each; "
            f"{found[0].label} (default)")
    if mkl is None:
        return text + ", MKL not installed (pip install graphkernel[mkl] to time it per shape)"
    return text + f", {mkl.label} where timed faster per shape ({blas_choice.CHOICE_FILE})"


def _calibration_lines() -> list[str]:
    """The calibration the C backend's defaults come from (measured now and stored when the
    cache has no record), and each default with where it came from."""
    try:
        defaults = calibration.resolve()
    except GraphKernelError as err:
        return [f"calibrate: NOT MEASURED - {err.problem}",
                "defaults : CConfig's constants (no calibration)"]
    cal = defaults.calibration
    lines = [f"calibrate: {cal.describe()} ({defaults.origin})" if cal is not None else
             f"calibrate: none - {defaults.origin}"]
    settings = defaults.lines()
    lines.append(f"defaults : {settings[0]}")
    lines += [f"           {line}" for line in settings[1:]]
    _, within = calibration.within_call(defaults.config)
    if within is not None:  # plans of two kernels or more under libomp (c_entry_threads.py)
        lines.append(f"in a call: {within}")
    return lines


def _rate_lines(tc: toolchain.Toolchain | None) -> list[str]:
    """The measured copy bandwidth, FMA rate and GEMM rate, one line each."""
    fma = machine_rates.fma_rate(tc)
    fma_line = fma.line() if isinstance(fma, machine_rates.Rate) else \
        f"fma      : NOT MEASURED - {fma}"
    return [machine_rates.copy_bandwidth().line(), fma_line, machine_rates.gemm_rate().line()]
