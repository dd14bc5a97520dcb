"""The pass manager: runs named stages in order, verifies after each, dumps when asked."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from graphkernel.errors import DumpError
from graphkernel.ir.dot import to_dot
from graphkernel.ir.graph import Graph
from graphkernel.ir.printer import print_graph
from graphkernel.ir.verifier import verify

PassFn = Callable[[Graph], Graph]


@dataclass(frozen=True)
class Stage:
    """One named step of the pipeline. Its name is the dump's file name."""

    name: str
    run: PassFn
    doc: str = ""
    # The lowest graph_kernel opt_level that runs it (0: always runs when its list runs).
    opt_level: int = 0


@dataclass
class StageResult:
    name: str
    graph: Graph
    seconds: float
    doc: str = ""


MANIFEST = ".graphkernel-dumps.json"


def _sha256(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except OSError:
        return None


@dataclass
class Dumper:
    """Writes `<stage>.ir` and `<stage>.dot` (and kernel sources) into a folder.

    It never overwrites a file it did not write: every file it writes is listed, with its
    checksum, in the folder's manifest (`.graphkernel-dumps.json`); a file of the same name that
    is not listed, or was changed since, belongs to the user, and is refused with a DumpError.
    Nothing is ever deleted."""

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
        theirs = self.collisions(names)
        if theirs:
            listed = ", ".join(theirs)
            raise DumpError(f"save_graphs would overwrite {listed}, which graphkernel did not "
                            f"write (or which was changed since); graphkernel only replaces the "
                            f"dumps it lists in {self.manifest_path}. Move those files, or "
                            "choose another folder with context.set_context(save_graphs_path=...)")

    def write_text(self, name: str, text: str) -> str:
        """Write `text` to `name` (relative to the folder) atomically; return the path."""
        self.claim([name])
        path = os.path.join(self.folder, name)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        data = text.encode("utf-8")
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
        self._record(name, hashlib.sha256(data).hexdigest())
        self.written.append(path)
        return path

    def _record(self, name: str, digest: str) -> None:
        files = self._manifest()
        files[name] = digest
        self._save(files)

    def _save(self, files: dict[str, str]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".graphkernel-", suffix=".tmp", dir=self.folder)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"writer": "graphkernel", "files": files}, fh, indent=1, sort_keys=True)
        os.replace(tmp, self.manifest_path)

    def clean(self) -> list[str]:
        """Remove the dumps graphkernel wrote here and nothing else: a listed file the user
        changed since, or replaced by a link or folder, stays. Returns the removed paths."""
        files = self._manifest()
        removed = []
        for name, digest in sorted(files.items()):
            path = os.path.join(self.folder, name)
            if os.path.isfile(path) and not os.path.islink(path) and _sha256(path) == digest:
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


def stage_dump_names(stages: list[Stage]) -> list[str]:
    """The files `Dumper.dump` writes for these stages."""
    return [stage.name + suffix for stage in stages for suffix in (".ir", ".dot")]


def run_stages(graph: Graph, stages: list[Stage], dumper: Dumper | None) -> list[StageResult]:
    """Run each stage on a copy of the previous graph, so every stage's graph stays readable."""
    results: list[StageResult] = []
    for stage in stages:
        start = time.perf_counter()
        graph = stage.run(graph.clone())
        verify(graph, f"after stage {stage.name}")
        results.append(StageResult(stage.name, graph, time.perf_counter() - start, stage.doc))
        if dumper is not None:
            dumper.dump(stage.name, graph, stage.doc)
    return results
