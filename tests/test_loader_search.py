"""loader_search.find_library: None at once, without ldconfig and the C compiler, where the
dynamic loader cannot see the library; ctypes' answer otherwise; once per process."""
from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

import pytest

from graphkernel.backends.c import loader_search


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []

    def find_library(name: str) -> str:
        calls.append(name)
        return f"lib{name}.so.7"

    monkeypatch.setattr(loader_search.ctypes.util, "find_library", find_library)
    loader_search.find_library.cache_clear()
    yield calls
    loader_search.find_library.cache_clear()


def _no_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, cache: bytes) -> None:
    monkeypatch.setattr(loader_search, "DEFAULT_DIRS", ())
    path = tmp_path / "ld.so.cache"
    path.write_bytes(cache)
    monkeypatch.setattr(loader_search, "LOADER_CACHE", str(path))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)


def test_a_library_the_loader_cannot_see_is_none_without_asking(monkeypatch, tmp_path, asked):
    _no_defaults(monkeypatch, tmp_path, b"\0libm.so.6\0/usr/lib/libm.so.6\0")
    assert loader_search.find_library("gkabsent") is None
    assert loader_search.find_library("gkabsent") is None
    assert asked == []


@pytest.mark.parametrize("where", ["cache", "ld_library_path", "default_dir", "unreadable"])
def test_a_library_the_loader_may_see_is_asked_once(monkeypatch, tmp_path, asked, where):
    _no_defaults(monkeypatch, tmp_path, b"\0libm.so.6\0")
    folder = tmp_path / "libs"
    folder.mkdir()
    if where == "cache":
        _no_defaults(monkeypatch, tmp_path, b"\0libgkthere.so.2\0/opt/x/libgkthere.so.2\0")
    elif where == "ld_library_path":
        (folder / "libgkthere.so.2").write_bytes(b"")
        monkeypatch.setenv("LD_LIBRARY_PATH", os.pathsep.join(["", str(folder)]))
    elif where == "default_dir":
        (folder / "libgkthere.so").write_bytes(b"")
        monkeypatch.setattr(loader_search, "DEFAULT_DIRS", (str(folder),))
    else:
        monkeypatch.setattr(loader_search, "LOADER_CACHE", str(tmp_path / "missing"))
    assert loader_search.find_library("gkthere") == "libgkthere.so.7"
    assert loader_search.find_library("gkthere") == "libgkthere.so.7"
    assert asked == ["gkthere"]


def test_agrees_with_ctypes_on_this_machine() -> None:
    # The C library the loader always sees, and a name nothing provides.
    loader_search.find_library.cache_clear()
    assert loader_search.find_library("c") == ctypes.util.find_library("c")
    ctypes.CDLL(loader_search.find_library("c"))
    assert loader_search.find_library("gk_no_such_library_anywhere") is None
    loader_search.find_library.cache_clear()
