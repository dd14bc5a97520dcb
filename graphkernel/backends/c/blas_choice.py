"""Which BLAS library runs each matrix product of the compiled entry, chosen by measurement.

numpy's OpenBLAS (backends/c/cblas.py) is the default and the only library where nothing else is
installed. Where Intel's MKL is (`pip install graphkernel[mkl]`: the `mkl` wheel's libmkl_rt),
the tuner (`--online_tuning>=1`, `graphkernel tune`: `tune`) times each product's shape on both,
one thread each as the entry runs them (its block of rows or columns on one OpenMP thread:
backends/c/c_gemm.py), and MKL takes the shapes it runs clearly faster. A normal compile
(`--online_tuning=0`) times nothing, as for the convolution library (onednn_choice.py): it
decides from the stored timings, and a shape not measured on this machine runs on OpenBLAS
without MKL being loaded (timing a product of the fused MLP on both libraries was 1.4 s of its
2.5 s cold compile). A timing is stored as one record per (CPU, shape, library) in the kernel
cache folder (`blas-choice.json`), so a shape is timed once per machine and library:

    {"format": "graphkernel-blas-choice", "version": 1,
     "records": [{"cpu": "<model name>|<flags hash>", "dtype": "float32", "m": 512, "n": 768,
                  "k": 768, "trans_a": false, "trans_b": false,
                  "library": "mkl 2026.2.1", "seconds": 0.0041}, ...]}

The file is data: a record that does not have this form is ignored (and timed again), a file
that is not JSON of this form is set aside with a warning naming it.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.backends.c import cache, toolchain
from graphkernel.backends.c.cache import warn_once
from graphkernel.backends.c.records import read_timing_rows
from graphkernel.errors import CacheError
from graphkernel.runtime.blas import blas_threads, openblas

FORMAT, VERSION = "graphkernel-blas-choice", 1
CHOICE_FILE = "blas-choice.json"
# MKL takes a shape only when its time is below this fraction of OpenBLAS's: a tie (or the noise
# of a loaded machine) keeps the default.
WIN_MARGIN = 0.95
# Timing budget per shape: at least REPEATS calls of each library after a warm-up, then more
# while under MAX_SECONDS; the fastest call counts.
REPEATS, MAX_SECONDS = 3, 0.1
_LP64_MAX = 2 ** 31 - 1  # MKL's LP64 interface takes int dimensions
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


@dataclass(frozen=True)
class GemmLibrary:
    """A BLAS library whose cblas_?gemm the entry calls by address."""

    name: str  # "openblas", "mkl"
    version: str
    sgemm: int
    dgemm: int
    int64: bool  # BLAS integers are int64_t (numpy's ILP64 OpenBLAS)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class GemmShape:
    """One thread's product, as the entry calls BLAS for it."""

    double: bool
    m: int
    n: int
    k: int
    trans_a: bool
    trans_b: bool

    @property
    def dtype(self) -> str:
        return "float64" if self.double else "float32"


@dataclass(frozen=True)
class Choice:
    library: GemmLibrary
    seconds: dict[str, float]  # each library's time (its label), measured or stored


_state: dict[str, Any] = {}
_lock = threading.Lock()


def openblas_library() -> GemmLibrary | None:
    """numpy's OpenBLAS as a GemmLibrary (None where the entry does not call it: cblas.py)."""
    found = openblas()
    if found is None:
        return None
    return GemmLibrary("openblas", found.version or "unknown", found.address("cblas_sgemm"),
                       found.address("cblas_dgemm"), found.int64)


def mkl_wheel_files() -> list[str]:
    """libmkl_rt where pip's `mkl` wheel puts it (the environment's lib/): a quick look, no
    loader search."""
    return sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))


def _mkl_paths() -> Iterator[str]:
    """Where pip's `mkl` wheel puts libmkl_rt (the environment's lib/), then the loader's,
    looked for only when the wheel's does not load (the loader's search runs ldconfig and the
    C compiler: ~40 ms of a warm start)."""
    yield from mkl_wheel_files()
    import ctypes.util
    found = ctypes.util.find_library("mkl_rt")
    if found:
        yield found


_SEQUENTIAL, _LP64 = 1, 0  # MKL_THREADING_SEQUENTIAL, MKL_INTERFACE_LP64


def mkl() -> GemmLibrary | None:
    """Intel MKL's cblas_sgemm/dgemm on its sequential layer (no thread pool of its own: the
    entry's OpenMP threads call it, as they call OpenBLAS), or None where it is not installed.
    Found once per process."""
    with _lock:
        if "mkl" in _state:
            return _state["mkl"]
        found = None
        for path in _mkl_paths():
            try:
                dynlib = ctypes.CDLL(path)
                # The layers are chosen before MKL's first call, once per process.
                dynlib.MKL_Set_Threading_Layer.argtypes = [ctypes.c_int]
                dynlib.MKL_Set_Interface_Layer.argtypes = [ctypes.c_int]
                if dynlib.MKL_Set_Threading_Layer(_SEQUENTIAL) != _SEQUENTIAL or \
                        dynlib.MKL_Set_Interface_Layer(_LP64) != _LP64:
                    continue
                text = ctypes.create_string_buffer(256)
                dynlib.MKL_Get_Version_String(text, 256)
                words = text.value.decode(errors="replace").split()
                version = next((w.split("-")[0] for w in words if w[:1].isdigit()), "unknown")
                found = GemmLibrary("mkl", version, _address(dynlib, "cblas_sgemm"),
                                    _address(dynlib, "cblas_dgemm"), int64=False)
                _state["mkl_dynlib"] = dynlib  # kept loaded: the entry holds its addresses
                break
            except (OSError, AttributeError):  # not a loadable MKL: try the next
                continue
        _state["mkl"] = found
        return found


def _address(dynlib: Any, name: str) -> int:
    return ctypes.cast(getattr(dynlib, name), ctypes.c_void_p).value or 0


def libraries() -> list[GemmLibrary]:
    """The libraries products may run on here: numpy's OpenBLAS first (the default)."""
    return [lib for lib in (openblas_library(), mkl()) if lib is not None]


def fits(lib: GemmLibrary, shape: GemmShape) -> bool:
    """Whether the library's integers hold the product's dimensions and leading dimensions."""
    return lib.int64 or max(shape.m, shape.n, shape.k) <= _LP64_MAX


# -- timing ----------------------------------------------------------------------------------

_GEMM_ARGS: dict[bool, tuple[Any, Any]] = {False: (ctypes.c_float, ctypes.POINTER(ctypes.c_float)),
              True: (ctypes.c_double, ctypes.POINTER(ctypes.c_double))}


def _gemm_function(lib: GemmLibrary, double: bool) -> Callable[..., None]:
    scalar, pointer = _GEMM_ARGS[double]
    integer = ctypes.c_int64 if lib.int64 else ctypes.c_int
    proto = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int, ctypes.c_int, integer, integer,
                             integer, scalar, pointer, integer, pointer, integer, scalar,
                             pointer, integer)
    return proto(lib.dgemm if double else lib.sgemm)


def time_gemm(libs: list[GemmLibrary], shape: GemmShape) -> dict[str, float]:
    """Each library's fastest one-thread call of the shape, in seconds of this thread's CPU time
    (other processes on a loaded machine preempt a call; they do not add to that), calls
    alternating between the libraries."""
    dtype = np.float64 if shape.double else np.float32
    rng = np.random.default_rng(0)
    a = rng.standard_normal((shape.k, shape.m) if shape.trans_a else (shape.m, shape.k)
                            ).astype(dtype)
    b = rng.standard_normal((shape.n, shape.k) if shape.trans_b else (shape.k, shape.n)
                            ).astype(dtype)
    c = np.empty((shape.m, shape.n), dtype)
    pointer = _GEMM_ARGS[shape.double][1]
    args = (_ROW_MAJOR, _TRANS if shape.trans_a else _NO_TRANS,
            _TRANS if shape.trans_b else _NO_TRANS, shape.m, shape.n, shape.k, 1.0,
            a.ctypes.data_as(pointer), a.shape[1], b.ctypes.data_as(pointer), b.shape[1], 0.0,
            c.ctypes.data_as(pointer), shape.n)
    functions = {lib.label: _gemm_function(lib, shape.double) for lib in libs}
    best = {label: math.inf for label in functions}
    with blas_threads(1):  # OpenBLAS on its caller, as the entry calls it; MKL is sequential
        for fn in functions.values():  # warm-up: packing buffers, page faults
            fn(*args)
        start, rounds = time.perf_counter(), 0
        while rounds < REPEATS or (time.perf_counter() - start < MAX_SECONDS and rounds < 50):
            for label, fn in functions.items():
                t0 = time.thread_time()
                fn(*args)
                best[label] = min(best[label], time.thread_time() - t0)
            rounds += 1
            if rounds >= REPEATS and time.perf_counter() - start >= MAX_SECONDS:
                break
    return best


# -- the stored records ----------------------------------------------------------------------

def cpu_model() -> str:
    """The CPU a timing holds for: its model name and a hash of its feature flags."""
    flags = toolchain.cpu_signature()
    return f"{toolchain.cpu_model()}|{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


_KEYS = {"cpu": str, "dtype": str, "m": int, "n": int, "k": int, "trans_a": bool,
         "trans_b": bool, "library": str, "seconds": float}


def _record_key(cpu: str, shape: GemmShape, label: str) -> tuple[Any, ...]:
    return (cpu, shape.dtype, shape.m, shape.n, shape.k, shape.trans_a, shape.trans_b, label)


def _valid(record: Any) -> bool:
    if not isinstance(record, dict) or set(record) != set(_KEYS):
        return False
    for key, kind in _KEYS.items():
        value = record[key]
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                    not math.isfinite(value) or value <= 0:
                return False
        elif kind is int:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                return False
        elif not isinstance(value, kind):
            return False
    return record["dtype"] in ("float32", "float64")


def load_records(path: str) -> dict[tuple[Any, ...], float]:
    """The stored timings by (cpu, shape, library); {} for a missing file. A file not of the
    format is reported (once) and ignored; a malformed record is skipped."""
    rows, problem = read_timing_rows(path, FORMAT, VERSION, "BLAS choice file")
    if problem is not None:
        warn_once(f"graphkernel: {problem}; its shapes are timed again and the file rewritten")
    out = {}
    for r in rows:
        if _valid(r):
            shape = GemmShape(r["dtype"] == "float64", r["m"], r["n"], r["k"], r["trans_a"],
                              r["trans_b"])
            out[_record_key(r["cpu"], shape, r["library"])] = float(r["seconds"])
    return out


def save_records(path: str, records: dict[tuple[Any, ...], float]) -> None:
    """Write the records (atomically: a reader sees the old file or the new one)."""
    rows = [{"cpu": key[0], "dtype": key[1], "m": key[2], "n": key[3], "k": key[4],
             "trans_a": key[5], "trans_b": key[6], "library": key[7], "seconds": seconds}
            for key, seconds in records.items()]
    text = json.dumps({"format": FORMAT, "version": VERSION, "records": rows}, indent=1)
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".blas-choice-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _choice_path() -> str | None:
    try:
        return os.path.join(cache.open_folder(), CHOICE_FILE)
    except CacheError:
        return None


Timer = Callable[[list[GemmLibrary], GemmShape], dict[str, float]]
# Why a product not measured here runs on the default library.
NOT_MEASURED = "not measured on this machine; run graphkernel tune or --online_tuning>=1"


def choose(shape: GemmShape, libs: list[GemmLibrary] | None = None,
           timer: Timer | None = None, path: str | None = None) -> Choice:
    """The library for one thread's product of this shape: the default (the first of `libs`)
    unless another ran it in under WIN_MARGIN of the default's time. Timings are read from the
    choice file (`path`, default the kernel cache's); `timer` (tuning passes one) times the
    libraries missing there and adds them to it. With no timer and a library not timed, the
    default runs, and with no stored timing of the shape at all MKL is not even loaded."""
    path = path if path is not None else _choice_path()
    cpu = cpu_model()
    with _lock:
        records = load_records(path) if path else {}
    if libs is None:
        if timer is None and not any(key[0] == cpu and key[1:7] == _record_key(cpu, shape, "")[1:7]
                                     for key in records):
            default = openblas_library()
            if default is not None:
                return Choice(default, {})
        libs = libraries()
    libs = [lib for lib in libs if fits(lib, shape)]
    if not libs:
        raise ValueError("choose() needs at least one BLAS library")
    if len(libs) == 1:
        return Choice(libs[0], {})
    seconds = {lib.label: records[_record_key(cpu, shape, lib.label)] for lib in libs
               if _record_key(cpu, shape, lib.label) in records}
    missing = [lib for lib in libs if lib.label not in seconds]
    if missing and timer is None:
        return Choice(libs[0], {})
    if missing:
        assert timer is not None
        # Time all of them together: a stored time from a quieter moment is not compared
        # with a new one from a busier one.
        seconds = dict(timer(libs, shape))
        with _lock:
            records = load_records(path) if path else {}
            for lib in libs:
                records[_record_key(cpu, shape, lib.label)] = seconds[lib.label]
            if path:
                try:
                    save_records(path, records)
                except OSError as exc:
                    warn_once(f"graphkernel: cannot write the BLAS choice file {path} ({exc}): "
                              "shapes are timed again in the next tuning")
    default = libs[0]
    best = min(libs, key=lambda lib: seconds[lib.label])
    if best is not default and seconds[best.label] < WIN_MARGIN * seconds[default.label]:
        return Choice(best, seconds)
    return Choice(default, seconds)


def tune(shapes: list[GemmShape], level: int, timer: Timer | None = None) -> None:
    """Time, on each library here, the product shapes among `shapes` that have no stored
    timings (`--online_tuning=level`, `graphkernel tune`), storing the timings `choose` then
    decides from; shapes are timed one after another until the tuning budget
    (tuning.TIME_BUDGET_S per level) is spent: those left run on the default, not measured,
    until the next tuning."""
    if level <= 0:
        return
    from graphkernel.backends.c.tuning import TIME_BUDGET_S  # the tuner's: not of a warm start
    libs = libraries()
    if len(libs) < 2:
        return
    start = time.perf_counter()
    for shape in dict.fromkeys(shapes):  # each shape once, in order
        if time.perf_counter() - start > TIME_BUDGET_S * level:
            break
        choose(shape, libs, timer or time_gemm)


def openmp_threads() -> int:
    """The OpenMP threads a parallel region of the entry runs on: OMP_NUM_THREADS's first
    number where set, else the cores this process may use."""
    text = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)
