"""Dumps a user reads (`<stage>.ir`, `<stage>.dot`, kernel sources, summaries): written into
save_graphs_path without ever replacing a file graphkernel did not write, and safe when several
processes (data loaders, ranks of a distributed run) share one folder."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from graphkernel.errors import DumpError
from graphkernel.ir.dot import to_dot
from graphkernel.ir.graph import Graph
from graphkernel.ir.printer import print_graph

MANIFEST = ".graphkernel-dumps.json"
# Held while a process reads or changes the folder's dumps and manifest; removed by its holder.
LOCK = ".graphkernel-dumps.lock"


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


@contextlib.contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """Hold the folder's lock file exclusively (processes and threads wait for each other).
    The holder removes the file when done; a waiter that then holds a removed file tries again
    with a fresh one, so two processes never both hold it."""
    path = os.path.join(folder, LOCK)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise DumpError(f"cannot lock the dump folder {folder} ({path}: {exc.strerror}); "
                            "choose another folder with "
                            "context.set_context(save_graphs_path=...)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            info = os.fstat(fd)
            if info.st_size != 0:  # ours are always empty: leave a user's file alone
                raise DumpError(f"{path} is not graphkernel's lock file; graphkernel will not "
                                "write into this folder. Move that file, or choose another "
                                "folder with context.set_context(save_graphs_path=...)")
            try:
                current = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                current = None
            if current is not None and os.path.samestat(info, current):
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


@dataclass
class Dumper:
    """Writes `<stage>.ir` and `<stage>.dot` (and kernel sources) into a folder.

    It never overwrites a file it did not write: every file it writes is listed, with its
    checksum, in the folder's manifest (`.graphkernel-dumps.json`); a file of the same name that
    is not listed, or was changed since, belongs to the user, and is refused with a DumpError.
    Only `clean` deletes, and only unchanged files it wrote.

    Several processes may dump into one folder at once: each check, write and manifest update
    happens under the folder's lock (`.graphkernel-dumps.lock`, present only while held), so the
    manifest always lists what is on disk. Dumps of the same name are replaced by the last
    writer, as in one process that compiles twice."""

    folder: str
    written: list[str] = field(default_factory=list)

    @property
    def manifest_path(self) -> str:
        return os.path.join(self.folder, MANIFEST)

    def _manifest(self) -> dict[str, str]:
        """Relative path -> sha256 of what graphkernel last wrote there."""
        path = self.manifest_path
        if not os.path.lexists(path):
            return {}
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            files = data["files"]
            if data.get("writer") != "graphkernel" or not isinstance(files, dict):
                raise ValueError("not a graphkernel manifest")
            return {str(k): str(v) for k, v in files.items()}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DumpError(f"{path} exists but is not graphkernel's list of its dumps ({exc}); "
                            "graphkernel will not write into this folder. Move that file, or "
                            "choose another folder with "
                            "context.set_context(save_graphs_path=...)") from None

    def collisions(self, names: list[str]) -> list[str]:
        """The paths among `names` (relative to the folder) that belong to someone else."""
        if not os.path.isdir(self.folder):
            return []
        with _folder_lock(self.folder):
            return self._collisions(names)

    def _collisions(self, names: list[str]) -> list[str]:
        owned = self._manifest()
        theirs = []
        for name in names:
            path = os.path.join(self.folder, name)
            if not os.path.lexists(path):
                continue
            if os.path.islink(path) or not os.path.isfile(path) or \
                    owned.get(name) != _sha256(path):
                theirs.append(path)
        return theirs

    def claim(self, names: list[str]) -> None:
        """Refuse, before anything is written, if any of `names` would replace a user's file."""
        self._refuse(self.collisions(names))

    def _refuse(self, theirs: list[str]) -> None:
        if theirs:
            listed = ", ".join(theirs)
            raise DumpError(f"save_graphs would overwrite {listed}, which graphkernel did not "
                            f"write (or which was changed since); graphkernel only replaces the "
                            f"dumps it lists in {self.manifest_path}. Move those files, or "
                            "choose another folder with context.set_context(save_graphs_path=...)")

    def write_text(self, name: str, text: str) -> str:
        """Write `text` to `name` (relative to the folder) atomically; return the path. A disk
        that is full or refuses the file is a DumpError naming it."""
        path = os.path.join(self.folder, name)
        try:
            return self._write(name, path, text.encode("utf-8"))
        except OSError as exc:
            raise DumpError(f"cannot write the dump {path}: {exc.strerror or exc}. Free some "
                            "space, or choose another folder with "
                            "context.set_context(save_graphs_path=...)") from None

    def _write(self, name: str, path: str, data: bytes) -> str:
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        with _folder_lock(self.folder):
            self._refuse(self._collisions([name]))
            # A fresh temporary name (never a user's file), then an atomic rename.
            fd, tmp = tempfile.mkstemp(prefix=".graphkernel-", suffix=".tmp", dir=directory)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)  # our own temporary file
                raise
            files = self._manifest()
            files[name] = hashlib.sha256(data).hexdigest()
            self._save(files)
        self.written.append(path)
        return path

    def _save(self, files: dict[str, str]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".graphkernel-", suffix=".tmp", dir=self.folder)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"writer": "graphkernel", "files": files}, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.manifest_path)

    def clean(self) -> list[str]:
        """Remove the dumps graphkernel wrote here and nothing else: a listed file the user
        changed since, or replaced by a link or folder, stays. Returns the removed paths."""
        if not os.path.isdir(self.folder):
            return []
        with _folder_lock(self.folder):
            files = self._manifest()
            removed = []
            for name, digest in sorted(files.items()):
                path = os.path.join(self.folder, name)
                if os.path.isfile(path) and not os.path.islink(path) and \
                        _sha256(path) == digest:
                    os.unlink(path)
                    removed.append(path)
                if not os.path.lexists(path) or path in removed:
                    files.pop(name)
            if files:
                self._save(files)
            elif os.path.lexists(self.manifest_path):
                os.unlink(self.manifest_path)
        return removed

    def dump(self, stage: str, graph: Graph, doc: str = "") -> None:
        header = f"stage {stage}" + (f": {doc}" if doc else "")
        self.write_text(stage + ".ir", print_graph(graph, header))
        self.write_text(stage + ".dot", to_dot(graph, f"{graph.name} - {stage}"))
