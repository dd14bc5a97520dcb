"""The on-disk kernel cache: private to the user, keyed by everything that shapes the binary,
written atomically, checked before it is loaded.

A folder that cannot take new files (read-only, full, a folder where a file should be) is not
an error: libraries already in it still load, and this process builds new ones in a private
temporary folder of its own, after one warning that says why."""
from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from graphkernel._version import __version__
from graphkernel.backends.c import elf
from graphkernel.backends.c.cache_trim import (  # noqa: F401  # names callers know here
    COMPILE_TIMEOUT,
    DEFAULT_MAX_BYTES,
    LIBRARY_SUFFIX,
    STALE_SECONDS,
    is_key,
    max_bytes,
    trim,
)
from graphkernel.errors import CacheError, CompileError, ToolchainError

# Errors that say a folder cannot take a new file (as opposed to a broken compiler).
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                 errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.EEXIST, errno.ENOTEMPTY)

_warned: set[str] = set()


def warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# Where the cache lives

def _home() -> str:
    """$HOME when it is an absolute path, else the home folder in the password database."""
    home = os.environ.get("HOME", "")
    if os.path.isabs(home):
        return home
    try:
        recorded = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        recorded = ""
    if not os.path.isabs(recorded):
        raise CacheError(f"HOME={home!r} is not an absolute path and uid {os.getuid()} has no home "
                         "folder in the password database, so there is no place for the kernel "
                         "cache: set GRAPHKERNEL_CACHE_DIR to a folder of your own")
    warn_once(f"graphkernel: HOME={home!r} is not an absolute path; the kernel cache goes under "
               f"the home folder of uid {os.getuid()} in the password database ({recorded}). "
               "Set GRAPHKERNEL_CACHE_DIR to choose another folder")
    return recorded


def cache_dir() -> str:
    """$GRAPHKERNEL_CACHE_DIR, else $XDG_CACHE_HOME/graphkernel, else ~/.cache/graphkernel.

    A relative XDG_CACHE_HOME is ignored, as the XDG base directory specification says (it
    would put the cache under whatever folder the program runs in). Also checks the cache's
    settings, so that a bad GRAPHKERNEL_CACHE_MAX_MB is an error at the cache's first use."""
    max_bytes()
    env = os.environ.get("GRAPHKERNEL_CACHE_DIR")
    if env:
        return os.path.abspath(env)
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and not os.path.isabs(xdg):
        warn_once(f"graphkernel: XDG_CACHE_HOME={xdg!r} is not an absolute path, so it is "
                   "ignored (as the XDG base directory specification says); the kernel cache "
                   "goes under ~/.cache. Set GRAPHKERNEL_CACHE_DIR to choose another folder")
        xdg = ""
    base = xdg or os.path.join(_home(), ".cache")
    return os.path.join(base, "graphkernel")


def ensure_private_dir(path: str) -> str:
    """Create the folder 0700 if missing; refuse one that others could write to."""
    if not os.path.isdir(path):
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the kernel cache folder {path}: {exc}") from exc
    info = os.stat(path)
    if info.st_uid != os.getuid():
        raise CacheError(f"the kernel cache folder {path} belongs to uid {info.st_uid}, not to "
                         f"you (uid {os.getuid()}); loading libraries from it would run their "
                         "code. Set GRAPHKERNEL_CACHE_DIR to a folder of your own")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(f"the kernel cache folder {path} is writable by others (mode "
                         f"{stat.S_IMODE(info.st_mode):o}); anyone could plant a library in it. "
                         f"Run `chmod 700 {path}` or set GRAPHKERNEL_CACHE_DIR")
    return path


def open_folder() -> str:
    """The cache folder, created private if missing. One that is unsafe is refused (CacheError);
    one that cannot be created falls back, with a warning, to this process's temporary cache."""
    folder = cache_dir()
    try:
        return ensure_private_dir(folder)
    except CacheError as exc:
        if isinstance(exc.__cause__, OSError):  # could not be created: not a safety problem
            return cannot_write(folder, exc.__cause__)
        raise


# ---------------------------------------------------------------------------------------------
# A folder that cannot take new files

_fallback: dict[int, str] = {}  # pid -> this process's temporary cache (not a forked parent's)


def _remove_fallback(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child leaves its parent's folder alone
        shutil.rmtree(folder, ignore_errors=True)


def fallback_folder() -> str | None:
    """This process's private temporary cache, if it needed one."""
    return _fallback.get(os.getpid())


def note_unwritable(folder: str, exc: OSError) -> None:
    """Warn, once per folder, that `folder` cannot take new files."""
    warn_once(f"graphkernel: cannot write to the kernel cache folder {folder} "
               f"({exc.strerror or exc}); kernels it already holds still load, and new ones are "
               "built in a private temporary folder for this process only, so they are compiled "
               "again by the next process. Make the folder writable or free some space, or set "
               "GRAPHKERNEL_CACHE_DIR to another folder.")


def cannot_write(folder: str, exc: OSError) -> str:
    """Warn (once per folder) that `folder` cannot take new files, and return this process's
    private temporary cache (created 0700, removed at exit)."""
    note_unwritable(folder, exc)
    pid = os.getpid()
    if pid not in _fallback:
        try:
            made = tempfile.mkdtemp(prefix="graphkernel-cache-")  # 0700, owned by us
        except OSError as again:
            raise CacheError(f"cannot write to the kernel cache folder {folder} ({exc}), nor "
                             f"create a temporary one in {tempfile.gettempdir()} ({again}): "
                             "free some disk space, or set GRAPHKERNEL_CACHE_DIR (and TMPDIR) "
                             "to a writable folder") from again
        _fallback[pid] = made
        atexit.register(_remove_fallback, made, pid)
    return _fallback[pid]


def _is_write_failure(exc: OSError) -> bool:
    return exc.errno in _WRITE_ERRNOS


def clear_empty_folder(path: str) -> None:
    """An empty folder where a cache file belongs is removed (nothing is lost); anything else
    there stays, and writing the file then fails with a clear warning."""
    if os.path.isdir(path) and not os.path.islink(path):
        with contextlib.suppress(OSError):
            os.rmdir(path)


# ---------------------------------------------------------------------------------------------
# Keys and entries

def cache_key(source: str, compiler: str, version: str, flags: tuple[str, ...],
              package_version: str, cpu: str) -> str:
    h = hashlib.sha256()
    for part in (source, compiler, version, " ".join(flags), package_version, cpu):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _checked_bytes(lib: str) -> tuple[bytes | None, str | None]:
    """The library at `lib` read once, and what is wrong with those bytes: no checksum file,
    another checksum, or not a whole shared library (elf.problem: a truncated one, even with a
    checksum rewritten to match, dies in dlopen with SIGBUS). (None, None): it cannot be read
    (gone meanwhile)."""
    try:
        with open(lib + ".sha256", encoding="ascii") as fh:
            expected = fh.read().strip()
    except (OSError, ValueError):
        return None, "no readable checksum file"
    try:
        with open(lib, "rb") as fh:
            data = fh.read()
    except OSError:
        return None, None
    if hashlib.sha256(data).hexdigest() != expected:
        return data, "it does not match its checksum"
    return data, elf.problem(data)


def _lookup_in(folder: str, key: str) -> str | None:
    lib = os.path.join(folder, key + LIBRARY_SUFFIX)
    if not (os.path.isfile(lib) and os.path.isfile(lib + ".sha256")):
        return None
    data, problem = _checked_bytes(lib)
    if data is None and problem is None:
        return None
    if problem is None:
        # Recently used: trimming removes the oldest first (a read-only folder keeps its time).
        with contextlib.suppress(OSError):
            os.utime(lib)
        return lib
    remove(folder, key)  # truncated or tampered: rebuild
    return None


def loadable_copy(lib: str) -> tuple[str, str | None]:
    """The name to dlopen the cached library `lib` under, and what is wrong with it (None when
    nothing). The bytes are read once, checked (checksum, ELF structure) and written to a
    private file of this process beside it, which is what the loader maps: a file changed in
    place after its check cannot reach the loader. The caller removes the copy once loaded
    (the mapping stays). A folder that cannot take the copy loads `lib` itself, just checked."""
    data, problem = _checked_bytes(lib)
    if data is None or problem is not None:
        return lib, problem or "it cannot be read"
    try:
        fd, copy = tempfile.mkstemp(prefix=os.path.basename(lib) + ".",
                                    suffix=".load", dir=os.path.dirname(lib))
    except OSError:
        return lib, None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(copy)
        return lib, None
    return copy, None


def lookup(folder: str, key: str) -> str | None:
    """The cached library's path if present and intact (in `folder`, or in this process's
    temporary cache); a corrupt entry is removed."""
    found = _lookup_in(folder, key)
    spare = fallback_folder()
    if found is None and spare is not None and spare != folder:
        found = _lookup_in(spare, key)
    return found


def remove(folder: str, key: str) -> None:
    """Remove a cache entry (a library that failed its checks): the next build replaces it."""
    for ext in (LIBRARY_SUFFIX, LIBRARY_SUFFIX + ".sha256"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, key + ext))


@contextlib.contextmanager
def _key_lock(folder: str, key: str) -> Iterator[None]:
    """Hold `<key>.lock` exclusively. The holder removes it when done, so lock files do not
    pile up; a waiter that then gets a removed file's lock tries again with a fresh one."""
    path = os.path.join(folder, key + ".lock")
    clear_empty_folder(path)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(os.fstat(fd), current):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)  # still holding it: see above
        os.close(fd)


def build(folder: str, key: str, source: str, compiler: str, flags: tuple[str, ...],
          libs: tuple[str, ...], units: Sequence[str] = ()) -> str:
    """Compile `source` into the cache under `key`; safe when processes race on the same key:
    a lock file serialises builders, and the loser finds the winner's library. When `folder`
    cannot take the library, it is built in this process's temporary cache instead. `units`,
    when there are two or more: the same program cut into translation units that the compiler
    builds at once, one process each, then links (`source` still names the library)."""
    try:
        return _build_in(folder, key, source, compiler, flags, libs, units)
    except OSError as exc:
        if not _is_write_failure(exc):
            raise
        spare = cannot_write(folder, exc)
    try:
        return _build_in(spare, key, source, compiler, flags, libs, units)
    except OSError as again:
        raise CacheError(f"cannot write a compiled kernel to the cache folder {folder} nor to "
                         f"the temporary folder {spare}: {again}. Free some disk space, or set "
                         "GRAPHKERNEL_CACHE_DIR to a writable folder") from again


def _build_in(folder: str, key: str, source: str, compiler: str, flags: tuple[str, ...],
              libs: tuple[str, ...], units: Sequence[str] = ()) -> str:
    with _key_lock(folder, key):
        found = _lookup_in(folder, key)
        if found is not None:
            return found
        built = _build_locked(folder, key, source, compiler, flags, libs, units)
    trim(folder, max_bytes(), keep=key)
    return built


def install(folder: str, key: str, data: bytes) -> str:
    """Place a library built elsewhere (a trusted export's prebuilt one) under `key`, written
    atomically with its checksum like a build; an intact library already there is kept. When
    `folder` cannot take it, it goes to this process's temporary cache, as a build would."""
    if not is_key(key):
        raise CacheError(f"not a cache key: {key!r:.40}")
    try:
        return _install_in(folder, key, data)
    except OSError as exc:
        if not _is_write_failure(exc):
            raise
        spare = cannot_write(folder, exc)
    try:
        return _install_in(spare, key, data)
    except OSError as again:
        raise CacheError(f"cannot write a library to the cache folder {folder} nor to the "
                         f"temporary folder {spare}: {again}. Free some disk space, or set "
                         "GRAPHKERNEL_CACHE_DIR to a writable folder") from again


def _install_in(folder: str, key: str, data: bytes) -> str:
    with _key_lock(folder, key):
        found = _lookup_in(folder, key)
        if found is not None:
            return found
        lib = os.path.join(folder, key + LIBRARY_SUFFIX)
        fd, tmp_lib = tempfile.mkstemp(prefix=key + ".", suffix=".tmp.so", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            with open(tmp_lib + ".sha256", "w", encoding="ascii") as fh:
                fh.write(hashlib.sha256(data).hexdigest() + "\n")
            for path in (lib + ".sha256", lib):
                clear_empty_folder(path)
            os.replace(tmp_lib + ".sha256", lib + ".sha256")
            os.replace(tmp_lib, lib)
        finally:
            for path in (tmp_lib, tmp_lib + ".sha256"):
                with contextlib.suppress(OSError):
                    os.unlink(path)
    trim(folder, max_bytes(), keep=key)
    return lib


_stamp: list[str] = []


def code_stamp() -> str:
    """graphkernel's version and each of its modules' path, size and modification time (once
    per process; Python's own bytecode check trusts the same facts): an edited pass or emitter
    is another compile-cache key and another plan record."""
    if not _stamp:
        h = hashlib.sha256(__version__.encode())
        folders = [os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))]
        while folders:  # os.scandir: the stat comes with the listing
            with os.scandir(folders.pop()) as it:
                for item in sorted(it, key=lambda e: e.name):
                    if item.is_dir(follow_symlinks=False) and item.name != "__pycache__":
                        folders.append(item.path)
                    elif item.name.endswith(".py"):
                        with contextlib.suppress(OSError):
                            info = item.stat()
                            h.update(f"{item.path} {info.st_size} {info.st_mtime_ns}\0".encode())
        _stamp.append(h.hexdigest())
    return _stamp[0]


# ---------------------------------------------------------------------------------------------
# Compiling

def _write_failure_in(stderr: str) -> OSError | None:
    """The compiler's own report that it could not write its output, as an OSError."""
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
        if os.strerror(code) in stderr:
            return OSError(code, os.strerror(code) + " (the C compiler: "
                           + stderr.strip()[-300:] + ")")
    return None


def _compiler_fails_on_trivial_code(compiler: str) -> str | None:
    """What the compiler says on a one-line C file, when it fails on that too."""
    with tempfile.TemporaryDirectory(prefix="graphkernel-check-") as tmp:
        src, out = os.path.join(tmp, "check.c"), os.path.join(tmp, "check.so")
        with open(src, "w", encoding="ascii") as fh:
            fh.write("int gk_check(void) { return 1; }\n")
        try:
            result = subprocess.run([compiler, "-shared", "-fPIC", src, "-o", out],
                                    capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if result.returncode != 0:
            return f"exit status {result.returncode}: {result.stderr.strip()[-2000:]}"
        if not os.path.isfile(out):
            return "it exited with status 0 but wrote no library"
    return None


def _build_locked(folder: str, key: str, source: str, compiler: str, flags: tuple[str, ...],
                  libs: tuple[str, ...], units: Sequence[str] = ()) -> str:
    lib = os.path.join(folder, key + LIBRARY_SUFFIX)
    fd, tmp_src = tempfile.mkstemp(prefix=key + ".", suffix=".c", dir=folder)
    tmp_lib = tmp_src[:-2] + ".tmp.so"
    sums_tmp = tmp_lib + ".sha256"
    pieces: list[str] = []  # the units' sources and objects
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            if len(units) < 2:
                fh.write(source)
        if len(units) < 2:
            _run_compiler(compiler, [compiler, *flags, tmp_src, "-o", tmp_lib, *libs])
        else:
            objects = []
            for k, unit in enumerate(units):
                unit_src = f"{tmp_src[:-2]}.{k}.c"
                pieces += [unit_src, unit_src[:-2] + ".o"]
                objects.append(unit_src[:-2] + ".o")
                with open(unit_src, "w", encoding="utf-8") as fh:
                    fh.write(unit)
            compile_only = [f for f in flags if f != "-shared"]
            _run_compilers(compiler, [[compiler, *compile_only, "-c", src, "-o", obj]
                                      for src, obj in zip(pieces[::2], objects)])
            _run_compiler(compiler, [compiler, *flags, *objects, "-o", tmp_lib, *libs])
        if not os.path.isfile(tmp_lib):
            raise ToolchainError(f"the C compiler {compiler} exited with status 0 but wrote no "
                                 f"library ({tmp_lib}); set CC to a working gcc or clang")
        digest = _digest(tmp_lib)
        with open(sums_tmp, "w", encoding="ascii") as fh:
            fh.write(digest + "\n")
        # The checksum lands first: a reader that sees the new library also sees its checksum.
        for path in (lib + ".sha256", lib):
            clear_empty_folder(path)
        os.replace(sums_tmp, lib + ".sha256")
        os.replace(tmp_lib, lib)
        return lib
    finally:
        for path in (tmp_src, tmp_lib, sums_tmp, *pieces):
            with contextlib.suppress(OSError):
                os.unlink(path)


def _run_compiler(compiler: str, cmd: list[str]) -> None:
    _run_compilers(compiler, [cmd])


def _run_compilers(compiler: str, cmds: list[list[str]]) -> None:
    """Run the compiler commands at once, one process each; raise on the first that failed,
    saying whose problem it is (a full disk, a broken compiler, or generated code it rejects)."""
    procs = []
    try:
        for cmd in cmds:
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True)))
    except OSError as exc:  # not executable, vanished: the compiler's problem, not ours
        for _, proc in procs:
            proc.kill()
            proc.wait()
        raise ToolchainError(f"cannot run the C compiler {compiler}: {exc}. Set CC to a "
                             "working gcc or clang") from exc
    results = []
    for cmd, proc in procs:
        try:
            _, stderr = proc.communicate(timeout=COMPILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            for _, other in procs:
                other.kill()
            raise
        results.append((cmd, proc.returncode, stderr))
    for cmd, returncode, stderr in results:
        if returncode == 0:
            continue
        write_failure = _write_failure_in(stderr)
        if write_failure is not None:
            raise write_failure
        broken = _compiler_fails_on_trivial_code(compiler)
        if broken is not None:
            raise ToolchainError(f"the C compiler {compiler} fails even on a one-line C file "
                                 f"({broken}); set CC to a working gcc or clang")
        raise CompileError("the C compiler rejected generated code (a graphkernel bug):\n"
                           f"$ {' '.join(cmd)}\n{stderr[-4000:]}")


def digest(parts: Iterable[str], arrays: Mapping[str, Any]) -> str:
    """A 32-hex key of text parts and named arrays (dtype, shape and bytes): the compile
    cache's entry key and the C backend's plan key are made this way."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        h.update(f"{name} {array.dtype.str} {array.shape}\0".encode())
        h.update(array.tobytes())
    return h.hexdigest()[:32]

