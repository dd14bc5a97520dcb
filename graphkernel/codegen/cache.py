"""The on-disk kernel cache: private to the user, keyed by everything that shapes the binary,
written atomically, checked before it is loaded."""
from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import subprocess
import tempfile

from graphkernel.errors import CacheError, CompileError

LIBRARY_SUFFIX = ".so"
# After each build the cache is trimmed to this size, least recently used libraries first;
# GRAPHKERNEL_CACHE_MAX_MB overrides it.
DEFAULT_MAX_BYTES = 1 << 30
_KEY_CHARS = frozenset("0123456789abcdef")


def cache_dir() -> str:
    """$GRAPHKERNEL_CACHE_DIR, else $XDG_CACHE_HOME/graphkernel, else ~/.cache/graphkernel."""
    env = os.environ.get("GRAPHKERNEL_CACHE_DIR")
    if env:
        return os.path.abspath(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
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


def lookup(folder: str, key: str) -> str | None:
    """The cached library's path if present and intact; a corrupt entry is removed."""
    lib = os.path.join(folder, key + LIBRARY_SUFFIX)
    sums = lib + ".sha256"
    if not (os.path.exists(lib) and os.path.exists(sums)):
        return None
    try:
        with open(sums, encoding="ascii") as fh:
            expected = fh.read().strip()
        if _digest(lib) == expected:
            os.utime(lib)  # recently used: trimming removes the oldest first
            return lib
    except OSError:
        return None
    for path in (lib, sums):  # truncated or tampered: rebuild
        try:
            os.unlink(path)
        except OSError:
            pass
    return None


def build(folder: str, key: str, source: str, compiler: str, flags: tuple[str, ...],
          libs: tuple[str, ...]) -> str:
    """Compile `source` into the cache under `key`; safe when processes race on the same key:
    a lock file serialises builders, and the loser finds the winner's library."""
    lock_path = os.path.join(folder, key + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = lookup(folder, key)
            if found is not None:
                return found
            built = _build_locked(folder, key, source, compiler, flags, libs)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    trim(folder, max_bytes(), keep=key)
    return built


def install(folder: str, key: str, data: bytes) -> str:
    """Place a library built elsewhere (a trusted export's prebuilt one) under `key`, written
    atomically with its checksum like a build; an intact library already there is kept."""
    if len(key) != 32 or not set(key) <= _KEY_CHARS:
        raise CacheError(f"not a cache key: {key!r:.40}")
    lock_path = os.path.join(folder, key + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            found = lookup(folder, key)
            if found is not None:
                return found
            lib = os.path.join(folder, key + LIBRARY_SUFFIX)
            fd, tmp_lib = tempfile.mkstemp(prefix=key + ".", suffix=".tmp.so", dir=folder)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                with open(tmp_lib + ".sha256", "w", encoding="ascii") as fh:
                    fh.write(hashlib.sha256(data).hexdigest() + "\n")
                os.replace(tmp_lib + ".sha256", lib + ".sha256")
                os.replace(tmp_lib, lib)
            finally:
                for path in (tmp_lib, tmp_lib + ".sha256"):
                    if os.path.exists(path):
                        os.unlink(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    trim(folder, max_bytes(), keep=key)
    return lib


def max_bytes() -> int:
    """The cache's size limit: $GRAPHKERNEL_CACHE_MAX_MB (megabytes) or DEFAULT_MAX_BYTES."""
    text = os.environ.get("GRAPHKERNEL_CACHE_MAX_MB")
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = -1.0
    if not megabytes >= 0:
        raise CacheError(f"GRAPHKERNEL_CACHE_MAX_MB={text!r} is not a size in megabytes")
    return int(megabytes * (1 << 20))


def trim(folder: str, limit: int, keep: str = "") -> list[str]:
    """Remove the least recently used libraries until the cache holds at most `limit` bytes
    (never `keep`, the one just built); return the keys removed. A process that loaded a
    removed library keeps it; one about to load it finds it gone and rebuilds."""
    entries = []
    for name in os.listdir(folder):
        key = name[:-len(LIBRARY_SUFFIX)]
        if not name.endswith(LIBRARY_SUFFIX) or len(key) != 32 or not set(key) <= _KEY_CHARS:
            continue
        paths = [os.path.join(folder, key + ext)
                 for ext in (LIBRARY_SUFFIX, LIBRARY_SUFFIX + ".sha256")]
        try:
            info = os.stat(paths[0])
            size = info.st_size + sum(os.stat(p).st_size for p in paths[1:]
                                      if os.path.exists(p))
        except OSError:
            continue  # removed meanwhile by another process
        entries.append((info.st_mtime, key, size, paths))
    total = sum(e[2] for e in entries)
    removed = []
    for _, key, size, paths in sorted(entries):
        if total <= limit:
            break
        if key == keep:
            continue
        for path in paths + [os.path.join(folder, key + ".lock")]:
            try:
                os.unlink(path)
            except OSError:
                pass
        total -= size
        removed.append(key)
    return removed


def _build_locked(folder: str, key: str, source: str, compiler: str, flags: tuple[str, ...],
                  libs: tuple[str, ...]) -> str:
    lib = os.path.join(folder, key + LIBRARY_SUFFIX)
    fd, tmp_src = tempfile.mkstemp(prefix=key + ".", suffix=".c", dir=folder)
    tmp_lib = tmp_src[:-2] + ".tmp.so"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(source)
        cmd = [compiler, *flags, tmp_src, "-o", tmp_lib, *libs]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise CompileError("the C compiler rejected generated code (a graphkernel bug):\n"
                               f"$ {' '.join(cmd)}\n{result.stderr[-4000:]}")
        digest = _digest(tmp_lib)
        sums_tmp = tmp_lib + ".sha256"
        with open(sums_tmp, "w", encoding="ascii") as fh:
            fh.write(digest + "\n")
        # The checksum lands first: a reader that sees the new library also sees its checksum.
        os.replace(sums_tmp, lib + ".sha256")
        os.replace(tmp_lib, lib)
        return lib
    finally:
        for path in (tmp_src, tmp_lib):
            if os.path.exists(path):
                os.unlink(path)
