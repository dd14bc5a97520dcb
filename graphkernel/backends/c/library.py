"""One shared library per compiled graph: all its kernels in one translation unit, compiled
once, cached on disk, loaded with ctypes."""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphkernel._version import __version__
from graphkernel.backends.c import cache, toolchain
from graphkernel.backends.c.c_emitter import KernelSource
from graphkernel.backends.c.c_text import prelude_for
from graphkernel.backends.c.shared_kernels import share_identical
from graphkernel.backends.c.toolchain import compile_workers
from graphkernel.errors import CompileError

# A kernel as ctypes loaded it (ctypes' function-pointer class is private to its stubs).
KernelFn = Callable[..., Any]


@dataclass
class BuiltLibrary:
    path: str
    from_cache: bool
    functions: dict[str, KernelFn]
    entry: Any = None  # the graph's CPython `run`, when it has one
    entry_module: Any = None  # the module holding `run` and `call` (backends/c/c_entry.py)
    # Where building it went, in order (seconds): the C of shared kernels and the entry, the
    # compiler (or the cache's checked copy), the loader (dlopen, the entry module).
    seconds: list[tuple[str, float]] = field(default_factory=list)
    # Its whole C source, or what writes it the first time it is asked for: a warm build
    # finds the library by its plan and writes no C (backends/c/backend.py).
    _source: str | Callable[[], str] = ""
    # Its cache key (the C source's, with the toolchain's: `_key`).
    key: str = ""
    mark: str | None = None  # what it was built for (`library_source`)

    @property
    def source(self) -> str:
        if callable(self._source):
            self._source = self._source()
        return self._source


def _prelude(with_libmvec: bool, code: str) -> str:
    prelude = prelude_for(code)
    return prelude if with_libmvec else prelude.split("/* Vector variants")[0]


def translation_unit(kernels: list[KernelSource], with_libmvec: bool) -> str:
    code = "\n".join(k.source for k in kernels)
    return _prelude(with_libmvec, code) + "\n" + code


# The compiler's work on a unit, measured in characters of generated kernel C (gcc -O3 here:
# ~16 us a character): the CPython entry's headers (Python.h, numpy's) weigh as much as this.
ENTRY_WEIGHT = 10_000
# A library lighter than this is compiled as one unit: a second compiler process and the link
# would cost more than they save.
SPLIT_MIN_WEIGHT = 16_000


def translation_units(kernels: list[KernelSource], with_libmvec: bool, entry: str | None,
                      workers: int, names: list[str] | None = None) -> list[str]:
    """The library cut into units for `workers` compiler processes at once, or [] when one
    unit is as fast. Kernels are dealt out longest first to the lightest unit; the CPython
    entry goes in as one more piece, its unit declaring every kernel it calls. A cold compile
    of a training step (27 kernels) took 1.0 s as one unit here. `names`: every kernel function
    the entry calls (default: the kernels' own; more when some forward to a shared one)."""
    pieces = [(len(k.source), k.source) for k in kernels]
    if entry is not None:
        called = names if names is not None else [k.name for k in kernels]
        prototypes = "".join(f"void {name}(void *const *args);\n" for name in called)
        pieces.append((ENTRY_WEIGHT, prototypes + entry))
    total = sum(w for w, _ in pieces)
    count = min(workers, len(pieces))
    if count < 2 or total < SPLIT_MIN_WEIGHT:
        return []
    units: list[tuple[int, list[str]]] = [(0, []) for _ in range(count)]
    for weight, text in sorted(pieces, key=lambda p: -p[0]):
        k = min(range(count), key=lambda u: units[u][0])
        units[k] = (units[k][0] + weight, units[k][1] + [text])
    if max(w for w, _ in units) > 0.8 * total:  # one piece outweighs the rest: no gain
        return []
    codes = ["\n".join(texts) for _, texts in units if texts]
    return [_prelude(with_libmvec, code) + "\n" + code for code in codes]


# gcc's optimisation level for the CPython entry. The entry is glue (argument checks, buffer
# takes, one call per kernel or product) that grows with the plan's steps, and at -O3 it became
# the longest compile of a deep model once identical kernels are shared: its unit for 12
# bert_tiny layers took 1.4 s of CPU at -O3, 0.92 at O1, 0.55 at Og, 0.35 at O0 (the kernels'
# unit 0.14). A 2-layer stack's call took 1.1 us through an entry built at O1 or Og, 1.7-1.8 us
# at O0: Og keeps the glue's speed for 40% of O1's compile.
ENTRY_OPTIMIZE = "Og"


def _glue_optimised(entry: str) -> str:
    """The CPython entry compiled at ENTRY_OPTIMIZE under gcc; the kernels keep -O3. Other
    compilers ignore the pragma, so it is shown to gcc only."""
    return ("#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC push_options\n"
            f"#pragma GCC optimize (\"{ENTRY_OPTIMIZE}\")\n#endif\n" + entry +
            "#if defined(__GNUC__) && !defined(__clang__)\n#pragma GCC pop_options\n#endif\n")


# Loaded libraries stay loaded for the life of the process (ctypes cannot unload safely): each
# cache path's library and the name the loader knows it by.
_loaded: dict[str, tuple[ctypes.CDLL, str]] = {}


def mark_symbol(mark: str) -> str:
    """The symbol a library built with `mark` exports (a cache key: hex digits)."""
    return f"gk_plan_{mark}"


@dataclass
class LibrarySource:
    """A library's whole C source and how it is cut and named."""

    text: str
    kernels: list[KernelSource]  # after sharing identical ones
    names: list[str]  # every kernel function callers look up
    module: str | None  # the CPython entry module's name, when there is one
    entry_text: str | None
    flags: tuple[str, ...]
    mark: str | None
    mark_text: str


_MODULE_STAND_IN = "gk_module_name_to_come"


def library_source(kernels: list[KernelSource], entry: Callable[[str], str] | None = None,
                   mark: Callable[[], str] | None = None) -> LibrarySource:
    """The C of one library of `kernels`, with the CPython entry `entry` writes given its
    module name, and, with `mark`, a symbol that names what it was built for (a warm build
    that finds the library by its plan checks it: backends/c/backend.py). `mark` is asked
    once the entry is written: writing it decides things the mark covers (each product's
    BLAS library)."""
    tc = toolchain.detect()
    assert tc is not None, "library_source needs a C compiler"
    names = [k.name for k in kernels]
    kernels, _ = share_identical(kernels)  # identical groups: one function, compiled once
    source = translation_unit(kernels, tc.libmvec)
    flags = tc.flags
    module = None
    entry_text = None
    if entry is not None and tc.python_includes:
        # The module's name must be known inside its source: name it after the kernels' source
        # and the entry's, written with a stand-in name first. After the kernels alone, two
        # graphs whose kernels are the same but whose entries differ (NetBasicFuse and
        # NetCompositeFuse in the lab) named their modules alike, and CPython, which keeps a
        # module built this way by its name, gave one graph's module the other's functions.
        text = entry(_MODULE_STAND_IN)
        module = "gk_" + hashlib.sha256((source + text).encode()).hexdigest()[:24]
        entry_text = _glue_optimised(text.replace(_MODULE_STAND_IN, module))
        source += "\n" + entry_text
        flags = flags + tuple(f"-I{d}" for d in tc.python_includes)
    marked = None if mark is None else mark()
    mark_text = "" if marked is None else \
        f'\nconst char {mark_symbol(marked)}[] = "{marked}";\n'
    return LibrarySource(source + mark_text, kernels, names, module, entry_text, flags, marked,
                         mark_text)


def build_library(kernels: list[KernelSource],
                  entry: Callable[[str], str] | None = None,
                  prebuilt: tuple[str, bytes] | None = None,
                  mark: Callable[[], str] | None = None) -> BuiltLibrary:
    """Compile `kernels` into one shared library (or load it from the cache). `entry`, given
    the module name, returns the C of a CPython module to build into the same library (the
    plan's C runner, backends/c/c_entry.py). `prebuilt`: (its cache key, its bytes), a library
    built elsewhere (a trusted export's), placed in the cache only when the source generated
    here has that very key: a library never lands under another graph's key. `mark`: see
    `library_source`."""
    tc = toolchain.detect()
    assert tc is not None, "build_library needs a C compiler"
    clock = _Clock()
    # The OpenMP runtime reads its settings when it starts: spin-waiting threads stall on a shared
    # 2-core machine, so wait passively unless the user chose otherwise.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    built = library_source(kernels, entry, mark)
    source, flags, module, names = built.text, built.flags, built.module, built.names
    clock.lap("C source: shared kernels, entry, hash")
    folder = cache.open_folder()
    key = _key(tc, source, flags, module is not None)
    path = cache.lookup(folder, key)
    if path is None and prebuilt is not None and prebuilt[0] == key:
        path = cache.install(folder, key, prebuilt[1])
    from_cache = path is not None
    units: list[str] = []
    if path is None:
        units = translation_units(built.kernels, tc.libmvec, built.entry_text,
                                  compile_workers(), names)
        if units:  # the mark goes in one unit
            units[0] += built.mark_text
        path = cache.build(folder, key, source, tc.compiler, flags, tc.libs, units)
    clock.lap("library from the kernel cache (checked)" if from_cache else
              f"C compiler ({max(len(units), 1)} unit{'s' if len(units) > 1 else ''})")
    exported = _exports(names, module, built.mark)
    lib, load_name, problem = _open(path, exported)
    if problem is not None:
        # Its checksum matched, yet it does not load or lacks the kernels' symbols (planted,
        # built for another libc), or it changed since it was looked up: remove it, build it
        # again, and load the new one.
        cache.remove(os.path.dirname(path), key)
        path = cache.build(folder, key, source, tc.compiler, flags, tc.libs, units)
        from_cache = False
        clock.lap("C compiler again (the cached library did not load)")
        lib, load_name, problem = _open(path, exported)
        if problem is not None:
            raise CompileError(f"the library graphkernel just built, {path}, {problem} (a "
                               "graphkernel bug)")
    assert lib is not None
    return _ready(lib, load_name, path, names, module, uses_openmp(source), from_cache, clock,
                  source, key, built.mark)


def uses_openmp(source: str) -> bool:
    """Whether a library's C has parallel regions (its OpenMP runtime is started early)."""
    return "#pragma omp parallel" in source


def _exports(names: list[str], module: str | None, mark: str | None) -> list[str]:
    return names + ([f"PyInit_{module}"] if module else []) + \
        ([mark_symbol(mark)] if mark is not None else [])


def load_marked(key: str, names: list[str], module: str | None, mark: str, openmp: bool,
                write_source: Callable[[], str]) -> tuple[BuiltLibrary | None, str | None]:
    """The cached library under `key`, without writing its C, when it is the one built with
    `mark` for kernels `names` (and entry `module`): checked as a build checks a cached one
    (checksum, ELF structure, its symbols) and by its mark. (None, why) when it is gone or
    fails a check, (None, None) when it is not in the cache (trimmed); a library that fails is
    left alone (it may be another graph's, whole).
    `openmp`: its C has parallel regions; `write_source` writes its C when asked for."""
    tc = toolchain.detect()
    assert tc is not None, "load_marked needs a C compiler"
    clock = _Clock()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as build_library
    path = cache.lookup(cache.open_folder(), key)
    if path is None:
        return None, None
    clock.lap("library from the kernel cache (checked)")
    lib, load_name, problem = _open(path, _exports(names, module, mark))
    if problem is not None:
        if not (lib is not None and hasattr(lib, mark_symbol(mark))):
            problem = (f"{problem}: it was not built for this graph and schedule (its "
                       f"mark is not {mark_symbol(mark)})")
        return None, f"its library {path} {problem}"
    assert lib is not None
    return _ready(lib, load_name, path, names, module, openmp, True, clock, write_source,
                  key, mark), None


def _ready(lib: ctypes.CDLL, load_name: str, path: str, names: list[str], module: str | None,
           openmp: bool, from_cache: bool, clock: _Clock, source: str | Callable[[], str],
           key: str, mark: str | None) -> BuiltLibrary:
    """The loaded library's kernels and entry, ready to run."""
    if not _openmp_started and openmp:
        start_openmp(lib)
    functions = {}
    for name in names:
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p]
        fn.restype = None
        functions[name] = fn
    try:
        entry_module = _load_entry(load_name, module) if module else None
        entry = entry_module.run if entry_module is not None else None
    finally:
        _remove_copy(load_name, path)
    clock.lap("load: dlopen, entry module")
    return BuiltLibrary(path, from_cache, functions, entry, entry_module, clock.laps, source,
                        key, mark)


class _Clock:
    """Consecutive named laps of wall time."""

    def __init__(self) -> None:
        self.laps: list[tuple[str, float]] = []
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self._last))
        self._last = now


_openmp_started = False


def start_openmp(lib: ctypes.CDLL) -> bool:
    """Start the OpenMP runtime `lib` links, once per process, on the main thread: what its
    first parallel region would otherwise do inside the graph's first call. Started there,
    between BLAS products whose idle workers spin on the cores, it made the first call of the
    MLP block take 35-55 ms against 26-30 steady; started here (~3 ms, while the compile
    finishes) the first call took 30-34 ms (fresh processes, warm caches, alternating). Other
    threads leave the runtime to the first call, as before: a thread that starts it becomes
    one of its roots, and a worker thread of the caller's may end while the runtime holds it.
    True when it started the runtime now."""
    global _openmp_started
    if _openmp_started or threading.current_thread() is not threading.main_thread():
        return False
    try:
        max_threads = lib.omp_get_max_threads  # from the OpenMP runtime the library links
    except AttributeError:  # built without OpenMP
        return False
    _openmp_started = True
    max_threads.restype = ctypes.c_int
    max_threads.argtypes = []
    max_threads()
    return True


def toolchain_text() -> str:
    """Everything of this machine's toolchain that shapes a library built from the same C (as
    `_key` covers it), as text; "none" without a compiler."""
    tc = toolchain.detect()
    if tc is None:
        return "none"
    return "\0".join((repr(tc), " ".join(tc.flags + tc.libs), f"{sys.version_info[:2]}",
                      np.__version__, __version__, toolchain.cpu_signature()))


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


def _open(path: str, names: list[str]) -> tuple[ctypes.CDLL | None, str, str | None]:
    """Load the library at `path` (once per process) and check that it exports `names`: the
    library, the name it was opened under, and what is wrong with it (None when nothing).
    The loader maps a private copy of the bytes just checked (cache.loadable_copy), under a
    name of its own: the loader knows a library by that name, so one rebuilt after a bad one
    is not handed the bad one back, and the entry module is later opened by that name."""
    if path in _loaded:
        lib, load_name = _loaded[path]
    else:
        load_name, problem = cache.loadable_copy(path)
        if problem is not None:
            return None, load_name, f"is not a whole library ({problem})"
        try:
            lib = ctypes.CDLL(load_name)
        except OSError as exc:
            _remove_copy(load_name, path)
            return None, load_name, f"does not load ({exc})"
        _loaded[path] = (lib, load_name)
    missing = [n for n in names if not hasattr(lib, n)]
    if missing:
        _loaded.pop(path, None)
        _remove_copy(load_name, path)
        return lib, load_name, f"does not export {', '.join(missing)}"
    return lib, load_name, None


def _remove_copy(load_name: str, path: str) -> None:
    """Remove the copy a library was loaded from (its mapping stays)."""
    if load_name != path:
        with contextlib.suppress(OSError):
            os.unlink(load_name)


def _load_entry(path: str, module: str) -> Any:
    loader = importlib.machinery.ExtensionFileLoader(module, path)
    spec = importlib.util.spec_from_file_location(module, path, loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod
