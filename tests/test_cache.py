"""The kernel cache: a private folder, complete keys, atomic writes, safe under races, corrupt
entries rebuilt, and user names reaching C only sanitised."""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import nn
from graphkernel.codegen import cache, toolchain
from graphkernel.codegen.c_text import c_comment, c_identifier
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


@pytest.fixture
def cache_folder(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    folder = str(tmp_path / "kernels")
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
    return folder


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
    from graphkernel.codegen import library
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
    import time
    script = tmp_path / "race.py"
    script.write_text(_RACE_SCRIPT.format(root=ROOT))
    env = dict(os.environ, GRAPHKERNEL_CACHE_DIR=cache_folder)
    # Probe the toolchain once first so all processes reach the kernel build together.
    toolchain_probe = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, "
                                      f"{ROOT!r}); from graphkernel.codegen import toolchain; "
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

def _fresh_process_result(cache_folder: str) -> tuple[str, bool]:
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        sys.path.insert(0, {ROOT!r})
        import graphkernel
        from graphkernel import nn
        from graphkernel.graph_kernel.pipeline import CompileOptions
        from graphkernel.ops import operations as P

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
                                    "missing_checksum"])
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
    else:
        os.unlink(path + ".sha256")
    rebuilt, from_cache = _fresh_process_result(cache_folder)
    assert rebuilt == path and not from_cache
    assert cache.lookup(cache_folder, os.path.basename(path)[:-3]) == path
    assert os.path.getsize(path) > 1000


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
# The test suite itself keeps out of the user's cache (tests/conftest.py)

@needs_cc
def test_the_suite_compiles_into_its_own_folder_not_the_users(user_cache_dir: str) -> None:
    # Kernels no one has compiled before (constants drawn now), one built in this process and
    # one in a child process started as the tests start theirs, land in the session's folder
    # and not in the folder the user's own runs use.
    import secrets
    session = cache.cache_dir()
    assert session == os.environ["GRAPHKERNEL_CACHE_DIR"] and session != user_cache_dir

    def libraries(folder: str) -> set[str]:
        return {f for f in os.listdir(folder) if f.endswith(".so")} \
            if os.path.isdir(folder) else set()

    before = libraries(session)
    k1, k2 = (1 + secrets.randbelow(10**9) / 1e12 for _ in range(2))
    _compile(np.ones((3, 4), np.float32), ScaleShift(k1))
    code = textwrap.dedent(f"""
        import numpy as np
        import graphkernel
        from graphkernel import nn
        from graphkernel.graph_kernel.pipeline import CompileOptions

        class ScaleShift(nn.Cell):
            def construct(self, x):
                return x * {k2!r} + 1.0

        graphkernel.compile(ScaleShift(), np.ones((3, 4), np.float32),
                            options=CompileOptions(enable_graph_kernel=True))
    """)
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    new = libraries(session) - before
    assert len(new) == 2, new
    assert not new & libraries(user_cache_dir)


class ScaleShift(nn.Cell):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def construct(self, x: Any) -> Any:
        return x * self.k + 1.0


# ---------------------------------------------------------------------------------------------
# A hostile disk: read-only, full, folders where files belong, killed builds. No raw OSError
# reaches the user; hits still load; new kernels go to a private temporary cache, said once.

@pytest.fixture
def fresh_cache_state(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Forget this process's warnings, temporary cache and probed toolchain, before and after."""
    monkeypatch.setattr(cache, "_warned", set())
    monkeypatch.setattr(cache, "_fallback", {})
    toolchain.detect.cache_clear()
    yield
    toolchain.detect.cache_clear()


@contextlib.contextmanager
def read_only(folder: str) -> Iterator[None]:
    """Make `folder` refuse new entries for real: mode 500, or as root (whom modes do not stop)
    the immutable attribute."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o500)
        try:
            yield
        finally:
            os.chmod(folder, 0o700)
        return
    made = subprocess.run(["chattr", "+i", folder], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"running as root and `chattr +i` is not possible here: {made.stderr}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", folder], check=True)


_HOSTILE_SCRIPT = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    sys.path.insert(0, {root!r})
    warnings.simplefilter("always")
    import graphkernel
    from graphkernel import nn
    from graphkernel.graph_kernel.pipeline import CompileOptions
    from graphkernel.ops import operations as P

    class Fused(nn.Cell):
        def construct(self, x):
            return P.Exp()(x * 2.0 + 1.0) - x

    class Other(nn.Cell):
        def construct(self, x):
            return P.Tanh()(x * 3.0) + x

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    for cell, want in ((Fused(), np.exp(x * 2.0 + 1.0) - x), (Other(), np.tanh(x * 3.0) + x)):
        for fusion in sys.argv[1:]:
            exe = graphkernel.compile(cell, x, options=CompileOptions(
                enable_graph_kernel=fusion == "on"))
            out = exe.run_arrays(x)[0]
            assert np.allclose(out, want, rtol=1e-5), (out, want)
            print(type(cell).__name__, fusion, exe.library_path, exe.from_cache)
""")


def _hostile_run(folder: str, tmp_path: Any, *fusion: str, **env: str) -> tuple[list[str], str]:
    script = tmp_path / "hostile.py"
    script.write_text(_HOSTILE_SCRIPT.format(root=ROOT))
    result = subprocess.run([sys.executable, str(script), *fusion], capture_output=True,
                            text=True, timeout=300,
                            env=dict(os.environ, GRAPHKERNEL_CACHE_DIR=folder, **env))
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines(), result.stderr


@needs_cc
def test_a_read_only_cache_folder_still_loads_hits_and_builds_elsewhere(tmp_path: Any) -> None:
    folder = str(tmp_path / "kernels")
    lines, _ = _hostile_run(folder, tmp_path, "on")
    fused_path, other_path = lines[0].split()[2], lines[1].split()[2]
    for path in (other_path, other_path + ".sha256"):  # only Fused is in the cache
        os.unlink(path)
    before = sorted(os.listdir(folder))
    with read_only(folder):
        lines, err = _hostile_run(folder, tmp_path, "on", "off")
    assert sorted(os.listdir(folder)) == before  # nothing written, nothing removed
    fused_on, fused_off, other_on, other_off = (line.split() for line in lines)
    assert fused_on[2:] == [fused_path, "True"]  # the hit loads from the read-only folder
    assert other_on[3] == "False" and not other_on[2].startswith(folder)  # built elsewhere
    assert fused_off[2] == other_off[2] == "None"  # fusion off works too
    assert err.count("cannot write to the kernel cache folder") == 1, err
    assert f"cannot write to the kernel cache folder {folder}" in err
    assert "private temporary folder for this process" in err
    assert "Traceback" not in err and "OSError" not in err
    assert not os.path.exists(os.path.dirname(other_on[2]))  # the temporary cache is removed


@needs_cc
def test_fusion_off_in_an_empty_read_only_cache_folder_works(tmp_path: Any) -> None:
    folder = tmp_path / "kernels"
    folder.mkdir(mode=0o700)
    with read_only(str(folder)):
        lines, err = _hostile_run(str(folder), tmp_path, "off")  # toolchain.json is not written
    assert [line.split()[2] for line in lines] == ["None", "None"]
    assert os.listdir(folder) == []
    assert err.count("cannot write to the kernel cache folder") == 1, err


@needs_cc
def test_a_full_disk_builds_in_the_temporary_cache(tmp_path: Any, fresh_cache_state: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiler reports the full disk: it must not read as "a graphkernel bug".
    tc = toolchain.detect()
    assert tc is not None
    folder = str(tmp_path / "kernels")
    fake = tmp_path / "cc"
    fake.write_text(f"#!/bin/sh\ncase \"$*\" in *{folder}/*) echo 'ld: final link failed: No "
                    f"space left on device' >&2; exit 1;; esac\nexec {tc.compiler} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
    toolchain.detect.cache_clear()
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    with pytest.warns(RuntimeWarning, match="No space left on device") as caught:
        exe = _compile(x)
    assert len([w for w in caught if "cannot write" in str(w.message)]) == 1
    assert not exe.library_path.startswith(folder)
    np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(x * 2 + 1) - x, rtol=1e-6)
    assert not [n for n in os.listdir(folder) if n.endswith((".so", ".c", ".lock"))]


@needs_cc
def test_a_full_disk_while_writing_falls_back(cache_folder: str, fresh_cache_state: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    real_replace = os.replace

    def replace(src: str, dst: str) -> None:
        if str(dst).startswith(cache_folder + os.sep) and str(dst).endswith(".so"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), dst)
        real_replace(src, dst)
    monkeypatch.setattr(cache.os, "replace", replace)
    x = np.ones((6,), np.float32)
    with pytest.warns(RuntimeWarning, match="No space left on device"):
        exe = _compile(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(3.0) - 1, rtol=1e-6)
    assert not exe.library_path.startswith(cache_folder)
    assert not [n for n in os.listdir(cache_folder) if n.endswith((".so", ".c", ".tmp"))]


def _mount_tmpfs(path: str, size: str) -> bool:
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs",
                           path], capture_output=True).returncode == 0


@needs_cc
def test_a_really_full_disk_falls_back(tmp_path: Any, fresh_cache_state: None,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    disk = str(tmp_path / "disk")
    if not _mount_tmpfs(disk, "256k"):
        pytest.skip("cannot mount a small tmpfs here (needs root and mount rights)")
    try:
        folder = os.path.join(disk, "kernels")
        os.mkdir(folder, 0o700)
        monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
        free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
        with open(os.path.join(disk, "filler"), "wb") as fh:  # leave about 4 KiB
            fh.write(b"\0" * max(free - 4096, 0))
        x = np.linspace(-1, 1, 12, dtype=np.float32)
        with pytest.warns(RuntimeWarning, match="No space left on device"):
            exe = _compile(x)
        np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(x * 2 + 1) - x, rtol=1e-6)
        assert not exe.library_path.startswith(folder)
        assert not [n for n in os.listdir(folder) if n.endswith((".so", ".c", ".tmp"))]
    finally:
        subprocess.run(["umount", disk], check=True)


@pytest.mark.parametrize("program, said", [("/bin/false", "fails on a one-line C file"),
                                           ("/bin/true", "wrote no library")])
def test_a_compiler_that_does_not_work_is_a_toolchain_error(
        program: str, said: str, fresh_cache_state: None, cache_folder: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.errors import ToolchainError
    monkeypatch.setenv("CC", program)
    with pytest.raises(ToolchainError) as info:
        _compile(np.ones((3,), np.float32))
    msg = str(info.value)
    assert f"$CC='{program}'" in msg and said in msg and "set CC to a working gcc or clang" in msg
    assert "graphkernel bug" not in msg


@needs_cc
def test_a_compiler_that_breaks_after_probing_is_a_toolchain_error(
        tmp_path: Any, cache_folder: str, fresh_cache_state: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.errors import ToolchainError
    tc = toolchain.detect()
    assert tc is not None
    broken = tmp_path / "cc"
    broken.write_text("#!/bin/sh\necho 'cc1: internal compiler error: Segmentation fault' >&2\n"
                      "exit 4\n")
    broken.chmod(0o755)
    with pytest.raises(ToolchainError, match="fails even on a one-line C file"):
        cache.build(cache_folder if os.path.isdir(cache_folder) else
                    cache.ensure_private_dir(cache_folder), "0" * 32, "int f(void){return 0;}",
                    str(broken), tc.flags, tc.libs)


@needs_cc
def test_generated_code_the_compiler_rejects_is_still_a_compile_error(cache_folder: str) -> None:
    from graphkernel.errors import CompileError
    tc = toolchain.detect()
    assert tc is not None
    with pytest.raises(CompileError, match="a graphkernel bug"):
        cache.build(cache.ensure_private_dir(cache_folder), "1" * 32, "this is not C;",
                    tc.compiler, tc.flags, tc.libs)


@needs_cc
@pytest.mark.parametrize("text", ["inf", "-inf", "nan", "abc", "-1", "1e999"])
def test_a_bad_cache_limit_is_an_error_at_first_use(text: str, cache_folder: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.ones((9,), np.float32)
    _compile(x)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_MAX_MB", text)
    with pytest.raises(CacheError, match=f"GRAPHKERNEL_CACHE_MAX_MB='{text}' is not a size"):
        _compile(x)  # a cache hit: nothing is built, the setting is checked all the same


@needs_cc
@pytest.mark.parametrize("content", ["[]", "null", '"text"', '{"stamp": 1}', "{", "\0\1"])
def test_a_toolchain_file_that_is_not_a_probe_is_replaced(content: str, cache_folder: str,
                                                          fresh_cache_state: None) -> None:
    os.makedirs(cache_folder, mode=0o700)
    path = os.path.join(cache_folder, "toolchain.json")
    with open(path, "w") as fh:
        fh.write(content)
    tc = toolchain.detect()
    assert tc is not None and tc.compiler
    import json
    with open(path) as fh:
        assert json.load(fh)["toolchain"]["compiler"] == tc.compiler
    toolchain.detect.cache_clear()
    assert toolchain.detect() == tc  # read back from the file


def _key_of(exe: Any) -> str:
    return os.path.basename(exe.library_path)[:-len(cache.LIBRARY_SUFFIX)]


@needs_cc
@pytest.mark.parametrize("name", ["{key}.so", "{key}.so.sha256", "{key}.lock", "toolchain.json"])
@pytest.mark.parametrize("full", [False, True])
def test_a_folder_in_place_of_a_cache_file(name: str, full: bool, cache_folder: str,
                                           fresh_cache_state: None) -> None:
    x = np.ones((11,), np.float32)
    key = _key_of(_compile(x))
    for ext in (".so", ".so.sha256"):
        os.unlink(os.path.join(cache_folder, key + ext))
    if name == "toolchain.json":
        os.unlink(os.path.join(cache_folder, name))
        toolchain.detect.cache_clear()
    place = os.path.join(cache_folder, name.format(key=key))
    os.mkdir(place)
    if full:  # someone's file inside: it is never removed
        with open(os.path.join(place, "keep.txt"), "w") as fh:
            fh.write("mine")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exe = _compile(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(3.0) - 1, rtol=1e-6)
    ours = [str(w.message) for w in caught if "cannot " in str(w.message)]
    if full:
        assert os.path.isfile(os.path.join(place, "keep.txt"))
        assert len(ours) == 1 and "Is a directory" in ours[0], ours
    else:
        assert ours == []  # an empty folder is simply replaced
        assert not os.path.isdir(place)
        if name != "toolchain.json":
            assert exe.library_path == os.path.join(cache_folder, key + ".so")


@needs_cc
def test_lock_files_do_not_pile_up(cache_folder: str) -> None:
    for n in range(3, 8):
        _compile(np.ones((n,), np.float32))
    names = os.listdir(cache_folder)
    assert len([n for n in names if n.endswith(".so")]) == 5
    assert [n for n in names if n.endswith(".lock")] == []


@needs_cc
def test_a_builder_waiting_on_a_removed_lock_takes_a_fresh_one(cache_folder: str) -> None:
    import threading
    os.makedirs(cache_folder, mode=0o700)
    order: list[str] = []
    inside = threading.Event()

    def first() -> None:
        with cache._key_lock(cache_folder, "2" * 32):
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    def second() -> None:
        inside.wait()
        with cache._key_lock(cache_folder, "2" * 32):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert order == ["first out", "second in"]
    assert not os.path.exists(os.path.join(cache_folder, "2" * 32 + ".lock"))


@needs_cc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_leftovers_of_a_killed_build_are_removed_by_trimming(
        tmp_path: Any, cache_folder: str, monkeypatch: pytest.MonkeyPatch, sig: int) -> None:
    tc = toolchain.detect()
    assert tc is not None
    # A compiler that hangs on kernels (and probes normally): the build is killed meanwhile.
    slow = tmp_path / "slowcc"
    slow.write_text(f"#!/bin/sh\ncase \"$*\" in *{cache_folder}/*) sleep 120;; esac\n"
                    f"exec {tc.compiler} \"$@\"\n")
    slow.chmod(0o755)
    script = tmp_path / "killed.py"
    script.write_text(_HOSTILE_SCRIPT.format(root=ROOT))
    proc = subprocess.Popen([sys.executable, str(script), "on"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True,
                            env=dict(os.environ, GRAPHKERNEL_CACHE_DIR=cache_folder,
                                     CC=str(slow)))
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.isdir(cache_folder) and any(
            n.endswith(".c") for n in os.listdir(cache_folder))):
        time.sleep(0.05)
    time.sleep(0.2)
    os.killpg(proc.pid, sig)  # the builder and its compiler, as a job control or a shutdown does
    assert proc.wait() == -sig
    left = sorted(os.listdir(cache_folder))
    stale = [n for n in left if n.endswith((".c", ".lock"))]
    assert len(stale) == 2, left  # <key>.<random>.c and <key>.lock
    recent = os.path.join(cache_folder, "f" * 32 + ".abcdefgh.c")  # a live build's file
    with open(recent, "w") as fh:
        fh.write("int x;")
    old = time.time() - cache.STALE_SECONDS - 60
    for n in stale:
        os.utime(os.path.join(cache_folder, n), (old, old))
    _compile(np.ones((13,), np.float32))  # a build trims
    after = os.listdir(cache_folder)
    assert not set(stale) & set(after), after
    assert os.path.basename(recent) in after  # young files stay: a build may be running


def test_an_empty_home_uses_the_password_database(monkeypatch: pytest.MonkeyPatch,
                                                  fresh_cache_state: None) -> None:
    import pwd
    monkeypatch.delenv("GRAPHKERNEL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    home = pwd.getpwuid(os.getuid()).pw_dir
    for value in ("", "relative/home"):
        monkeypatch.setenv("HOME", value)
        with pytest.warns(RuntimeWarning, match=f"HOME='{value}' is not an absolute path"):
            assert cache.cache_dir() == os.path.join(home, ".cache", "graphkernel")
    monkeypatch.setattr(cache.pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    with pytest.raises(CacheError, match="set GRAPHKERNEL_CACHE_DIR"):
        cache.cache_dir()


def test_a_relative_xdg_cache_home_is_ignored(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                              fresh_cache_state: None) -> None:
    monkeypatch.delenv("GRAPHKERNEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", "cachedir")
    with pytest.warns(RuntimeWarning, match="XDG_CACHE_HOME='cachedir' is not an absolute path"):
        assert cache.cache_dir() == str(tmp_path / "home" / ".cache" / "graphkernel")


@needs_cc
def test_a_planted_library_without_the_kernels_is_rebuilt(cache_folder: str,
                                                          tmp_path: Any) -> None:
    import hashlib
    tc = toolchain.detect()
    assert tc is not None
    path, _ = _fresh_process_result(cache_folder)
    planted = tmp_path / "planted.c"
    planted.write_text("int planted(void) { return 7; }\n")

    def plant() -> None:
        # A real library that loads, with a checksum that matches, but not the kernels.
        subprocess.run([tc.compiler, "-shared", "-fPIC", str(planted), "-o", path], check=True)
        with open(path, "rb") as fh:
            digest = hashlib.sha256(fh.read()).hexdigest()
        with open(path + ".sha256", "w") as fh:
            fh.write(digest + "\n")

    plant()
    rebuilt, from_cache = _fresh_process_result(cache_folder)
    assert rebuilt == path and not from_cache
    assert _fresh_process_result(cache_folder) == (path, True)  # repaired for later runs
    # In this process, which loads the planted library first: repaired and loaded afresh.
    plant()
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    exe = _compile(x)
    assert exe.library_path == path and not exe.from_cache
    np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(x * 2.0 + 1.0) - x, rtol=1e-6)
    assert not [n for n in os.listdir(cache_folder) if n.endswith(".load")]


@needs_cc
def test_a_cache_folder_that_cannot_be_created_falls_back(tmp_path: Any, fresh_cache_state: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    folder = str(blocker / "kernels")
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", folder)
    x = np.ones((14,), np.float32)
    with pytest.warns(RuntimeWarning, match=f"cannot write to the kernel cache folder {folder}"):
        exe = _compile(x)
    np.testing.assert_allclose(exe.run_arrays(x)[0], np.exp(3.0) - 1, rtol=1e-6)
    assert exe.library_path.startswith(cache.fallback_folder() or "?")
    assert _compile(x).from_cache  # the temporary cache serves this process's next compile


@pytest.mark.parametrize("env, line", [
    ({"CC": "/bin/false"}, "compiler : BROKEN - the C compiler $CC='/bin/false'"),
    ({"GRAPHKERNEL_CACHE_MAX_MB": "inf"}, "cache    : REFUSED - GRAPHKERNEL_CACHE_MAX_MB='inf'")])
def test_doctor_reports_a_broken_compiler_or_cache_setting(
        env: dict[str, str], line: str, cache_folder: str, fresh_cache_state: None,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from graphkernel.tools.doctor import doctor
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    text, ok = doctor()
    assert not ok and line in text, text


@needs_cc
def test_doctor_says_a_cache_folder_is_read_only(cache_folder: str) -> None:
    from graphkernel.tools.doctor import doctor
    os.makedirs(cache_folder, mode=0o700)
    text, _ = doctor()
    assert "READ-ONLY" not in text
    with read_only(cache_folder):
        text, _ = doctor()
    assert "READ-ONLY: its kernels load, new ones are built in a temporary folder" in text
