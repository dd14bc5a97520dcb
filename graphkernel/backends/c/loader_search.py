"""Where the dynamic loader would find a shared library by name, asked cheaply.

`ctypes.util.find_library` runs ldconfig and then the C compiler and the linker (~16 ms on
a Zen 5 host); looking for an optional library that is not installed (oneDNN) it did so twice
in every warm compile of a convolutional model, ~31 ms of a ~55 ms warm compile of the digits
CNN. The name it returns is then loaded by name, through the loader, so a library the loader
cannot see is of no use: when none of the loader's places (LD_LIBRARY_PATH, its cache
/etc/ld.so.cache, the default folders) holds `lib<name>.so*`, the answer is None without
asking; otherwise `find_library` is asked, as before. Either answer is kept for the process."""
from __future__ import annotations

import ctypes.util
import functools
import glob
import os
import sysconfig

LOADER_CACHE = "/etc/ld.so.cache"
# The loader's own folders, Debian's multiarch ones too (ld.so searches them without its cache).
_ARCH = sysconfig.get_config_var("MULTIARCH") or ""
DEFAULT_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64") + \
    ((f"/lib/{_ARCH}", f"/usr/lib/{_ARCH}") if _ARCH else ())


def _loader_may_see(name: str) -> bool:
    """Whether a `lib<name>.so*` is in a folder of LD_LIBRARY_PATH, named in the loader's
    cache, or in a default folder (a cache that cannot be read counts as naming it)."""
    stem = f"lib{name}.so"
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    if any(glob.glob(os.path.join(glob.escape(d), stem + "*")) for d in [*dirs, *DEFAULT_DIRS]):
        return True
    try:
        with open(LOADER_CACHE, "rb") as fh:
            return stem.encode() in fh.read()
    except OSError:
        return True


@functools.cache
def find_library(name: str) -> str | None:
    """`ctypes.util.find_library(name)`, None at once where the loader cannot see the library;
    once per process."""
    if not _loader_may_see(name):
        return None
    return ctypes.util.find_library(name)
