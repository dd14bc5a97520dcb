"""The kernel cache's size policy (backends/c/cache.py reads and writes the entries): its limit,
and trimming it after each build, least recently used libraries first, with the temporary and
lock files killed builds left behind."""
from __future__ import annotations

import contextlib
import fcntl
import math
import os
import stat
import time

from graphkernel.errors import CacheError

LIBRARY_SUFFIX = ".so"
# After each build the cache is trimmed to this size, least recently used libraries first;
# GRAPHKERNEL_CACHE_MAX_MB overrides it.
DEFAULT_MAX_BYTES = 1 << 30
COMPILE_TIMEOUT = 600  # seconds
# A temporary or lock file this much older than any build can take was left by a killed
# process: trimming removes it.
STALE_SECONDS = 2 * COMPILE_TIMEOUT
_KEY_CHARS = frozenset("0123456789abcdef")


def max_bytes() -> int:
    """The cache's size limit: $GRAPHKERNEL_CACHE_MAX_MB (megabytes) or DEFAULT_MAX_BYTES."""
    text = os.environ.get("GRAPHKERNEL_CACHE_MAX_MB")
    if not text:
        return DEFAULT_MAX_BYTES
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = math.nan
    if not (math.isfinite(megabytes) and megabytes >= 0):
        raise CacheError(f"GRAPHKERNEL_CACHE_MAX_MB={text!r} is not a size in megabytes (a "
                         "finite number, 0 or more; the default is "
                         f"{DEFAULT_MAX_BYTES >> 20})")
    return int(megabytes * (1 << 20))


def is_key(text: str) -> bool:
    """A cache key: 32 lowercase hex digits (safe as a file name and a C identifier)."""
    return _is_key(text)


def _is_key(text: str) -> bool:
    return len(text) == 32 and set(text) <= _KEY_CHARS


def _remove_stale(folder: str, name: str, now: float) -> None:
    """Remove a build's temporary file or a lock file left by a killed process."""
    path = os.path.join(folder, name)
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISREG(info.st_mode) or now - info.st_mtime < STALE_SECONDS:
        return
    if not name.endswith(".lock"):
        with contextlib.suppress(OSError):
            os.unlink(path)
        return
    try:  # a lock file is removed only by whoever holds it (see _key_lock)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.path.samestat(os.fstat(fd), os.stat(path, follow_symlinks=False)):
            os.unlink(path)
    except OSError:
        pass  # held by a live builder, or gone
    finally:
        os.close(fd)


def trim(folder: str, limit: int, keep: str = "") -> list[str]:
    """Remove the least recently used libraries until the cache holds at most `limit` bytes
    (never `keep`, the one just built); return the keys removed. A process that loaded a
    removed library keeps it; one about to load it finds it gone and rebuilds. Temporary and
    lock files older than STALE_SECONDS (left by killed builds) are removed too."""
    entries = []
    now = time.time()
    for name in os.listdir(folder):
        key, dot, rest = name.partition(".")
        if _is_key(key) and dot and rest not in ("so", "so.sha256"):
            _remove_stale(folder, name, now)  # <key>.<random>.c, .tmp.so, .lock
            continue
        if name.startswith("toolchain.json.") and name.endswith(".tmp"):
            _remove_stale(folder, name, now)
            continue
        if rest != "so" or not _is_key(key):
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
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)
        total -= size
        removed.append(key)
    return removed
