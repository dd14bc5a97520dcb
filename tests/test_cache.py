"""The kernel cache: a private folder, complete keys, atomic writes, safe under races, corrupt
entries rebuilt, and user names reaching C only sanitised."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.backends.c import cache, toolchain
from graphkernel.backends.c.c_text import c_comment, c_identifier
from graphkernel.errors import CacheError
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

needs_cc = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Fused(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Exp()(x * 2.0 + 1.0) - x


def _compile(x: np.ndarray, cell: nn.Cell | None = None) -> Any:
    return graphkernel.compile(cell or Fused(), x, options=CompileOptions(enable_graph_kernel=True))


# ---------------------------------------------------------------------------------------------
# Where the cache lives, and who may write it

def test_folder_is_the_environment_variable_when_set(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Any) -> None:
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "here"))
    assert cache.cache_dir() == str(tmp_path / "here")
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", "relative/dir")
    assert cache.cache_dir() == os.path.abspath("relative/dir")


def test_folder_is_the_users_cache_dir_otherwise(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Any) -> None:
    monkeypatch.delenv("GRAPHKERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == str(tmp_path / "xdg" / "graphkernel")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_dir() == str(tmp_path / "home" / ".cache" / "graphkernel")


@needs_cc
def test_folder_is_created_private(cache_folder: str) -> None:
    x = np.ones((3, 4), np.float32)
    _compile(x).run_arrays(x)
    info = os.stat(cache_folder)
    assert stat.S_IMODE(info.st_mode) == 0o700
    assert info.st_uid == os.getuid()
    libraries = [f for f in os.listdir(cache_folder) if f.endswith(".so")]
    assert libraries
    for name in os.listdir(cache_folder):
        assert os.stat(os.path.join(cache_folder, name)).st_uid == os.getuid()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702, 0o1777])
def test_folder_others_can_write_to_is_refused(tmp_path: Any, mode: int) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(CacheError) as info:
        cache.ensure_private_dir(str(folder))
    msg = str(info.value)
    assert "writable by others" in msg and f"chmod 700 {folder}" in msg
    assert "GRAPHKERNEL_CACHE_DIR" in msg


@needs_cc
def test_compiling_with_an_unsafe_folder_is_a_clear_error(tmp_path: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(folder))
    with pytest.raises(CacheError, match="writable by others"):
        _compile(np.ones((2, 2), np.float32))
    assert not [f for f in os.listdir(folder) if f.endswith(".so")]


def test_folder_owned_by_someone_else_is_refused(tmp_path: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 1)
    with pytest.raises(CacheError) as info:
        cache.ensure_private_dir(str(folder))
    assert f"belongs to uid {real}" in str(info.value)
    assert "not to you" in str(info.value)


def test_folder_that_cannot_be_created_is_a_clear_error(tmp_path: Any) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(CacheError, match="cannot create the kernel cache folder"):
        cache.ensure_private_dir(str(blocker / "kernels"))


# ---------------------------------------------------------------------------------------------
# Keys, atomic writes, races

def test_key_covers_source_compiler_version_flags_package_and_cpu() -> None:
    base = ("int f;", "/usr/bin/gcc", "gcc 12", ("-O3",), "0.1.0", "avx2")
    key = cache.cache_key(*base)
    assert key == cache.cache_key(*base)
    for i, other in enumerate(("int g;", "/usr/bin/clang", "gcc 13", ("-O2",), "0.1.1", "avx512")):
        changed = list(base)
        changed[i] = other
        assert cache.cache_key(*changed) != key, f"part {i} is not in the key"
    # Parts are delimited: moving text between parts changes the key.
    assert cache.cache_key("ab", "c", *base[2:]) != cache.cache_key("a", "bc", *base[2:])


@needs_cc
def test_key_includes_graphkernels_version(cache_folder: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.backends.c import library
    x = np.ones((3,), np.float32)
    first = _compile(x).library_path
    monkeypatch.setattr(library, "__version__", "999.0")
    second = _compile(x)
    assert second.library_path != first and not second.from_cache


@needs_cc
def test_build_leaves_no_temporary_files(cache_folder: str) -> None:
    x = np.ones((5,), np.float32)
    exe = _compile(x)
    names = sorted(os.listdir(cache_folder))
    key = os.path.basename(exe.library_path)[:-3]
    leftovers = [n for n in names if n.startswith(key) and
                 n not in (f"{key}.so", f"{key}.so.sha256", f"{key}.lock")]
    assert leftovers == []
    assert not [n for n in names if n.endswith((".tmp", ".c")) or ".tmp." in n]


_RACE_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    sys.path.insert(0, {root!r})
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ops import operations as P

    class Raced(nn.Cell):
        def construct(self, x):
            return P.Tanh()(x * 3.0 - 0.5) + P.ReduceSum(keep_dims=True)(x, -1)

    start = float(sys.argv[1])
    while time.time() < start:
        time.sleep(0.001)
    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    exe = graphkernel.compile(Raced(), x, options=CompileOptions(enable_graph_kernel=True))
    out = exe.run_arrays(x)[0]
    want = np.tanh(x * 3.0 - 0.5) + x.sum(-1, keepdims=True)
    assert np.allclose(out, want, rtol=1e-5), (out, want)
    print(exe.library_path)
""")


@needs_cc
def test_processes_compiling_the_same_kernel_at_once_all_succeed(cache_folder: str,
                                                                 tmp_path: Any) -> None:
    script = tmp_path / "race.py"
    script.write_text(_RACE_SCRIPT.format(root=ROOT))
    env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=cache_folder)
    # Probe the toolchain once first so all processes reach the kernel build together.
    toolchain_probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, "
                                      f"{ROOT!r}); from graphkernel.backends.c import toolchain; "
                                      "toolchain.detect()"], env=env, capture_output=True)
    assert toolchain_probe.returncode == 0, toolchain_probe.stderr
    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, str(script), str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]
    results = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, results):
        assert p.returncode == 0, err
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1  # one library, found or built by every process
    libraries = [f for f in os.listdir(cache_folder) if f.endswith(".so")]
    assert len(libraries) == 1


# ---------------------------------------------------------------------------------------------
# Corrupt entries are detected and rebuilt

def _fresh_process_result(cache_folder: str, prelude: str = "") -> tuple[str, bool]:
    """Compile and run Fused in a new process (after `prelude`): its library and whether it
    came from the cache."""
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        sys.path.insert(0, {ROOT!r})
        import graphkernel
        from graphkernel import nn
        from graphkernel.graph_kernel.pipeline import CompileOptions
        from graphkernel.ops import operations as P
        {prelude}

        class Fused(nn.Cell):
            def construct(self, x):
                return P.Exp()(x * 2.0 + 1.0) - x

        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        exe = graphkernel.compile(Fused(), x, options=CompileOptions(enable_graph_kernel=True))
        out = exe.run_arrays(x)[0]
        assert np.allclose(out, np.exp(x * 2.0 + 1.0) - x, rtol=1e-5)
        print(exe.library_path, exe.from_cache)
    """)
    env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=cache_folder)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    path, from_cache = result.stdout.split()
    return path, from_cache == "True"


@needs_cc
@pytest.mark.parametrize("damage", ["truncate", "flip_byte", "garbage_with_matching_sum",
                                    "missing_checksum", "truncate_with_matching_sum"])
def test_corrupt_library_is_detected_and_rebuilt(cache_folder: str, damage: str) -> None:
    path, from_cache = _fresh_process_result(cache_folder)
    assert not from_cache
    again, from_cache = _fresh_process_result(cache_folder)
    assert again == path and from_cache
    good = open(path, "rb").read()
    if damage == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(len(good) // 3)
    elif damage == "flip_byte":
        with open(path, "r+b") as fh:
            fh.seek(len(good) // 2)
            fh.write(bytes([good[len(good) // 2] ^ 0xFF]))
    elif damage == "garbage_with_matching_sum":
        # Not a library at all, but its checksum file agrees: loading fails, so it is rebuilt.
        import hashlib
        with open(path, "wb") as fh:
            fh.write(b"\x7fELF garbage")
        with open(path + ".sha256", "w") as fh:
            fh.write(hashlib.sha256(b"\x7fELF garbage").hexdigest() + "\n")
    elif damage == "truncate_with_matching_sum":
        # Its segments reach past the end: dlopen died of SIGBUS touching them.
        _cut_short(path, len(good) * 2 // 3)
    else:
        os.unlink(path + ".sha256")
    rebuilt, from_cache = _fresh_process_result(cache_folder)
    assert rebuilt == path and not from_cache
    assert cache.lookup(cache_folder, os.path.basename(path)[:-3]) == path
    assert os.path.getsize(path) > 1000


def _cut_short(path: str, size: int) -> None:
    """Truncate the library at `path` in place, its checksum file rewritten to match."""
    import hashlib
    with open(path, "r+b") as fh:
        fh.truncate(size)
    with open(path, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    with open(path + ".sha256", "w") as fh:
        fh.write(digest + "\n")


_CUT_AFTER_LOOKUP = """
from graphkernel.backends.c import cache
from test_cache import _cut_short
_lookup = cache.lookup
def lookup(folder, key):
    found = _lookup(folder, key)
    if found is not None:  # checked whole: now cut short in place, before it is loaded
        _cut_short(found, os.path.getsize(found) * 2 // 3)
    return found
cache.lookup = lookup
"""


@needs_cc
def test_a_library_cut_short_after_its_check_never_reaches_the_loader(cache_folder: str) -> None:
    """The loader maps a private copy of the bytes it checked: a change to the cached file
    after its check (here: truncated in place, checksum rewritten) is found, not mapped."""
    path, _ = _fresh_process_result(cache_folder)
    prelude = f"import os; sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})" + \
        _CUT_AFTER_LOOKUP.replace("\n", "\n        ")
    rebuilt, from_cache = _fresh_process_result(cache_folder, prelude)
    assert rebuilt == path and not from_cache
    assert _fresh_process_result(cache_folder) == (path, True)
    assert not [n for n in os.listdir(cache_folder) if n.endswith(".load")]


@needs_cc
def test_the_elf_check_finds_a_library_cut_anywhere(cache_folder: str) -> None:
    import struct

    from graphkernel.backends.c import elf
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    with open(_compile(x).library_path, "rb") as fh:
        data = fh.read()
    assert elf.problem(data) is None
    for size in (0, 3, 17, 63, 64, 100, len(data) // 2, len(data) - 1):
        assert elf.problem(data[:size]) is not None, size
    # Without its section headers (written last, so any cut loses them) a cut is found by the
    # segment it ends inside.
    headless = bytearray(data)
    struct.pack_into("<QIHHHHH", headless, 40, 0, 0, 64, 56, struct.unpack_from(
        "<H", data, 56)[0], 0, 0)
    assert elf.problem(bytes(headless)) is None
    assert "segment" in (elf.problem(bytes(headless[:len(data) * 2 // 3])) or "")
    executable = bytearray(data)
    struct.pack_into("<H", executable, 16, 2)
    assert "not a shared object" in (elf.problem(bytes(executable)) or "")
    assert elf.problem(b"#!/bin/sh\n" + data) == "not an ELF file"


def test_lookup_removes_a_corrupt_entry(tmp_path: Any) -> None:
    folder = str(tmp_path)
    lib = tmp_path / "abc.so"
    lib.write_bytes(b"library bytes")
    (tmp_path / "abc.so.sha256").write_text("0" * 64 + "\n")
    assert cache.lookup(folder, "abc") is None
    assert not lib.exists() and not (tmp_path / "abc.so.sha256").exists()


# ---------------------------------------------------------------------------------------------
# Names from user code reach C only sanitised

EVIL = 'Evil */ int pwned; /* "quoted" \'single\'\nnewline \\ ??/ end*'


def test_c_identifier_and_comment_are_safe() -> None:
    ident = c_identifier(EVIL)
    assert ident.startswith("gk_") and all(c.isalnum() or c == "_" for c in ident)
    comment = c_comment(EVIL)
    assert "*/" not in comment and "/*" not in comment and "\n" not in comment
    for text in ("*/", "/*", "**//", "/*/", "*\n/", "a*" + "/" * 3):
        assert "*/" not in c_comment(text) and "/*" not in c_comment(text)


@needs_cc
def test_evil_class_names_reach_c_only_sanitised(cache_folder: str, tmp_path: Any) -> None:
    def construct_kernel(self: Any, x: Any) -> Any:
        return x * 2.0 + 1.0

    def construct_net(self: Any, x: Any) -> Any:
        return self.k(x) * 3.0

    def init_net(self: Any) -> None:
        nn.Cell.__init__(self)
        self.k = kernel_cls()

    kernel_cls = type(EVIL, (nn.GraphKernel,), {"construct": construct_kernel})
    net_cls = type(EVIL + "Net", (nn.Cell,), {"construct": construct_net, "__init__": init_net})
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    dump = tmp_path / "dump"
    context.set_context(save_graphs=True, save_graphs_path=str(dump))
    for fusion in (False, True):
        exe = graphkernel.compile(net_cls(), x,
                                  options=CompileOptions(enable_graph_kernel=fusion))
        np.testing.assert_allclose(exe.run_arrays(x)[0], (x * 2.0 + 1.0) * 3.0)
        native = [k for k in exe.kernels if k.backend == "native"]
        assert native
        for k in native:
            source = k.source
            assert "pwned" not in source.replace("_int_pwned_", "")
            assert "quoted" not in source.replace("_quoted_", "")
            for line in source.splitlines():
                if line.startswith("/*"):
                    assert line.endswith("*/") and line.count("*/") == 1
                    assert line.count("/*") == 1
    # The kernel source written into the dump folder has a sanitised file name.
    written = os.listdir(dump / "kernel_meta")
    assert written and all(set(n) <= set("abcdefghijklmnopqrstuvwxyz"
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.") for n in written)


class SoftmaxAfterScale(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.softmax = P.Softmax(axis=-1)

    def construct(self, x: Any) -> Any:
        return self.softmax(x * 0.5)


@needs_cc
def test_the_same_kernel_compiled_again_in_one_process_is_a_cache_hit(cache_folder: str) -> None:
    # C names must not depend on process-wide node numbering: a second compile of the same
    # graph (after other graphs were traced) has the same source and reuses the library.
    x = np.ones((16, 32), np.float32)
    first = _compile(x, SoftmaxAfterScale())
    _compile(x)  # another graph in between moves every node counter on
    again = _compile(x, SoftmaxAfterScale())
    assert not first.from_cache and again.from_cache
    assert [k.source for k in first.kernels] == [k.source for k in again.kernels]


def _libraries(folder: str) -> dict[str, int]:
    return {n: os.path.getsize(os.path.join(folder, n)) for n in os.listdir(folder)
            if n.endswith(".so") and len(n) == 35}


@needs_cc
def test_cache_is_trimmed_to_its_limit_least_recently_used_first(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [_compile(np.ones((n,), np.float32)).library_path for n in (3, 4, 5)]
    for age, path in zip((300, 200, 100), paths):  # the first is the least recently used
        past = os.path.getmtime(path) - age
        os.utime(path, (past, past))
    foreign = os.path.join(cache_folder, "notes.so")
    with open(foreign, "w") as fh:
        fh.write("not ours")
    sizes = _libraries(cache_folder)
    biggest = max(sizes.values())
    # Room for about three libraries and their checksums: a fourth build removes the oldest.
    monkeypatch.setenv("GRAPHKERNEL_CACHE_MAX_MB", str((3 * biggest + 300) / (1 << 20)))
    newest = _compile(np.ones((6,), np.float32)).library_path
    left = _libraries(cache_folder)
    assert os.path.basename(paths[0]) not in left
    assert not os.path.exists(paths[0] + ".sha256")
    assert os.path.basename(newest) in left and os.path.basename(paths[2]) in left
    assert os.path.exists(foreign)  # only the cache's own entries are ever removed
    again = _compile(np.ones((3,), np.float32))  # a removed kernel is simply built again
    assert not again.from_cache
    np.testing.assert_allclose(again.run_arrays(np.ones((3,), np.float32))[0],
                               np.exp(3.0) - 1, rtol=1e-6)


@needs_cc
def test_a_cache_hit_counts_as_a_use(cache_folder: str) -> None:
    path = _compile(np.ones((7,), np.float32)).library_path
    past = os.path.getmtime(path) - 1000
    os.utime(path, (past, past))
    assert _compile(np.ones((7,), np.float32)).from_cache
    assert os.path.getmtime(path) > past + 500


def test_a_bad_cache_limit_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRAPHKERNEL_CACHE_MAX_MB", "lots")
    with pytest.raises(CacheError, match="GRAPHKERNEL_CACHE_MAX_MB='lots'"):
        cache.max_bytes()


# ---------------------------------------------------------------------------------------------
# One library from several translation units, compiled at once

def _kernel(name: str, size: int) -> Any:
    from graphkernel.backends.c.c_loops import KernelSource

    body = f"/* {name} */\nvoid {name}(void *const *args) {{\n" + \
        "  /* pad */\n" * (size // 12) + "}\n"
    return KernelSource(name, body, [])


def test_a_large_library_is_dealt_into_units_balanced_by_size() -> None:
    from graphkernel.backends.c.library import ENTRY_WEIGHT, translation_units

    kernels = [_kernel(f"gk_k{i}", size) for i, size in enumerate([9000, 7000, 5000, 3000, 800])]
    units = translation_units(kernels, True, "/* the entry */\n", workers=2)
    assert len(units) == 2
    for k in kernels:  # each kernel in exactly one unit
        assert sum(u.count(f"void {k.name}(void *const *args) {{") for u in units) == 1
    (entry_unit,) = [u for u in units if "/* the entry */" in u]
    for k in kernels:  # the entry's unit declares every kernel it calls
        assert f"void {k.name}(void *const *args);" in entry_unit
    weights = sorted(sum(len(k.source) for k in kernels if k.name + "(void *const *args) {" in u)
                     + (ENTRY_WEIGHT if "/* the entry */" in u else 0) for u in units)
    assert weights[1] - weights[0] <= 2000  # within the smallest kernel but one


@pytest.mark.parametrize("kernels, workers", [
    ([4000, 3000], 2),  # too small to pay for a second compiler and a link
    ([30000, 40000], 1),  # one core
    ([60000, 300], 2),  # one kernel outweighs the rest
])
def test_one_unit_when_splitting_cannot_pay(kernels: list[int], workers: int) -> None:
    from graphkernel.backends.c.library import translation_units

    assert translation_units([_kernel(f"gk_k{i}", n) for i, n in enumerate(kernels)], True,
                             None, workers) == []


class ManyKernels(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.matmul = P.MatMul()

    def construct(self, x: Any, w: Any) -> Any:
        # MatMuls between pointwise groups: each group is a kernel of its own.
        a = self.matmul(P.Tanh()(x * 2.0 + 1.0), w)
        b = self.matmul(P.Exp()(a * 0.1) - a, w)
        c = self.matmul(P.Sigmoid()(b) * b + 1.0, w)
        return P.Softmax()(c) + P.ReduceSum(keep_dims=True)(c * c, -1)


@needs_cc
def test_a_library_built_from_units_runs_like_one_built_whole(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.backends.c import library

    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    w = (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)
    seen: list[int] = []
    real = cache.build

    def build(*args: Any) -> str:
        seen.append(len(args[6]) if len(args) > 6 else 0)
        return real(*args)

    monkeypatch.setattr(cache, "build", build)
    whole = graphkernel.compile(ManyKernels(), x, w,
                                options=CompileOptions(enable_graph_kernel=True))
    monkeypatch.setattr(library, "SPLIT_MIN_WEIGHT", 0)
    monkeypatch.setattr(library, "compile_workers", lambda: 3)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", os.path.join(cache_folder, "split"))
    split = graphkernel.compile(ManyKernels(), x, w,
                                options=CompileOptions(enable_graph_kernel=True))
    assert seen[0] == 0 and seen[-1] >= 2  # the whole, then the same program in units
    assert split.library_path != whole.library_path
    np.testing.assert_array_equal(split.run_arrays(x, w)[0], whole.run_arrays(x, w)[0])
    names = os.listdir(os.path.dirname(split.library_path))
    assert not [n for n in names if n.endswith((".c", ".o")) or ".tmp." in n]
