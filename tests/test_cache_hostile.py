"""The kernel cache on a hostile disk: read-only, full, folders where files belong, killed
builds, broken compilers and settings. No raw OSError reaches the user; hits still load; new
kernels go to a private temporary cache, said once."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_cache import ROOT, _compile, _fresh_process_result, needs_cc

from graphkernel.backends.c import cache, toolchain
from graphkernel.errors import CacheError

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
    for off in (fused_off, other_off):  # fusion off (one kernel per op) is built elsewhere too
        assert off[3] == "False" and not off[2].startswith(folder)
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
    paths = [line.split()[2] for line in lines]  # one kernel per op: built elsewhere
    assert len(paths) == 2 and all(p != "None" and not p.startswith(str(folder)) for p in paths)
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
@pytest.mark.parametrize("fails, want", [
    ((), {}),
    (("-fopenmp",), {"openmp": False, "openmp_lib": ""}),
    (("-lomp",), {"openmp_lib": ""}),
    (("-lmvec",), {"libmvec": False}),
    (("Python.h",), {"python_includes": ()}),
    (("fp16 plain",), {"no_avx512fp16": True}),
    (("fp16 plain", "-mno-avx512fp16"), {"no_avx512fp16": False}),
])
def test_each_trial_compile_decides_its_own_toolchain_field(
        fails: tuple[str, ...], want: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trial compiles run at once (toolchain._probe); each answer lands in its own field
    whatever order they finish in."""
    import random
    import time as clock
    compiler = toolchain.find_compiler()
    assert compiler is not None
    real_cpu = toolchain.cpu_signature()
    monkeypatch.setattr(toolchain, "cpu_signature", lambda: real_cpu + " avx512_fp16")

    def trial(cc: str, source: str, args: list[str]) -> bool:
        clock.sleep(random.random() * 0.02)  # finish in any order
        if "fp16 plain" in fails and "_Float16" in source and "-mno-avx512fp16" not in args:
            return False
        return not any(f in args or f in source for f in fails)  # a flag given, a header

    monkeypatch.setattr(toolchain, "_try_compile", trial)
    libomp = "/opt/llvm/lib"
    monkeypatch.setattr(toolchain, "_libomp_args", lambda folder: [f"-L{folder}", "-lomp"])
    got = toolchain._probe(compiler, libomp)
    base = {"openmp": True, "openmp_lib": libomp, "libmvec": True,
            "python_includes": toolchain._python_includes(), "no_avx512fp16": False}
    for field, value in {**base, **want}.items():
        assert getattr(got, field) == value, (field, got)


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
