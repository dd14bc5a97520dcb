"""The compile cache on disk: a new process compiling a graph compiled before skips the passes.

A warm start used to trace, run every stage (verifying after each), plan, generate C and only
then find the library in the kernel cache by its source's hash. Here the traced graph is looked
up first, and a hit gives the final graph (hwopt_d_end) the pipeline made of it; from there the
build is a fresh compile's (plan, kernel C, the library through the kernel cache).

Key: sha256 over this format's version; graphkernel's version and a stamp of its modules
(path, size and modification time of every `.py` file: an edited pass is another result);
numpy's version (constant folding runs numpy); the
traced graph as data (ir/serialize.py, with its tables of types and source lines: ops,
attributes, types, names, source lines, notes) and
its constants' bytes; every compile option (enable_graph_kernel, each flag, the cost model);
the toolchain (compiler, version, flags, libraries) and the CPU.

Entry: `<kernel cache folder>/graphs/<key>.gkc`, an archive in the container of GKIR exports
(frontend/archive.py: stored zip, a manifest with each entry's sha256 and its own checksum,
written under a temporary name and renamed): the final graph as data (`graph.json`: its nodes,
constants and type table, the code text the plan key hashes; its source locations' table in
the manifest) and its constants' arrays, the traced input each final input is, the fusion
reasons and rewrites, the stages' names and docs, and the bytes the initial graph needs
(checked against this machine's memory as a compile checks it). No weights: they are the
cell's Parameters, bound again from the traced graph.

An entry is read as a file from anyone (sums that match say it is whole, not true): it names the
key it was written under, its graph is verified (types inferred again, as an export's) and its
inputs, outputs and loop-nest notes must fit the traced graph. One that does not (truncated,
altered, swapped, another format) is a miss: removed, said once in a warning naming the file,
and the graph compiled afresh; the compile report says why (`CompileReport.compile_cache`).
Nothing is read when save_graphs or --dump_as_text asks for every stage's dump (the stages must
run to be written); GRAPHKERNEL_COMPILE_CACHE=0 turns the cache off.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel._version import __version__
from graphkernel.backends import backend_config, get_backend
from graphkernel.backends.c import cache, toolchain
from graphkernel.errors import FormatError, GraphKernelError, VerifyError
from graphkernel.frontend import archive
from graphkernel.graph_kernel.pipeline import CompileOptions, check_final_notes
from graphkernel.graph_kernel.reasons import FuseRule, FusionReason
from graphkernel.ir.graph import Graph
from graphkernel.ir.serialize import code_text, data_to_graph, graph_to_data
from graphkernel.ir.types import TensorType

KIND = "graphkernel compile cache"
# 2: the entry names its key; 3: source locations and types in tables (each distinct one
# once, inputs and nodes refer to them by index), the graph's code text an entry of its own
VERSION = 3
FOLDER = "graphs"  # under the kernel cache folder; its trimming skips sub-folders
SUFFIX = ".gkc"
ENV = "GRAPHKERNEL_COMPILE_CACHE"
# Entries are small (a final graph as JSON, its constants): beyond this many the least recently
# used go when a new one is written.
MAX_ENTRIES = 2000
# The final graph's data but its location table (`serialize.code_text`): an entry of its own, so
# that a hit hashes the bytes it read for the plan key rather than writing them again.
GRAPH_ENTRY = "graph.json"
_ENTRY_NAME = re.compile(rf"{archive.ARRAY_NAME.pattern}|{re.escape(GRAPH_ENTRY)}")


@dataclass
class Entry:
    """What a hit gives: the final graph (weights bound) and what its compile report said."""

    final: Graph
    reasons: list[FusionReason]
    rewrites: list[str]
    stage_docs: dict[str, str]  # every stage's name, in order, and its doc
    # A hash of the final graph's data as read (the `code_text` the graph was rebuilt from, and
    # its constants): the C backend's plan key takes it rather than writing the graph again.
    code_digest: str


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "off", "no")


# -- the key --------------------------------------------------------------------------------
def _canonical(value: Any) -> Any:
    """Option values as JSON with a fixed order (frozensets sorted)."""
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def options_text(options: CompileOptions) -> str:
    data = {"enable_graph_kernel": options.enable_graph_kernel, "backend": options.backend,
            "flags": {f.name: _canonical(getattr(options.flags, f.name))
                      for f in dataclasses.fields(options.flags)},
            "cost": {f.name: _canonical(getattr(options.cost, f.name))
                     for f in dataclasses.fields(options.cost)},
            # The backend's settings steer the code it generates: defaults spelt out, so that
            # None and the default settings share a key.
            "backend_config": dataclasses.asdict(
                backend_config(get_backend(options.backend), options.backend_config))}
    return json.dumps(data, sort_keys=True)


def key_of(traced: Graph, options: CompileOptions) -> tuple[str | None, str]:
    """The traced graph's key, or None and why it is not cached."""
    if not enabled():
        return None, f"off ({ENV}={os.environ.get(ENV)})"
    symbolic = [i.name for i in traced.inputs
                if not all(isinstance(d, int) for d in i.tensor_type.shape)]
    if symbolic:
        return None, f"not used: symbolic dimensions ({', '.join(symbolic)})"
    try:
        tc = toolchain.detect()
    except GraphKernelError as exc:  # the build says it again, where a compile says it
        return None, f"not used: no working toolchain ({exc.problem})"
    try:
        data, arrays = graph_to_data(traced, tables=True)
        text = json.dumps(data, sort_keys=True)
    except (FormatError, TypeError, ValueError) as exc:
        return None, f"not used: the traced graph is not data ({exc})"
    toolchain_text = "none" if tc is None else \
        f"{tc.compiler} {tc.version} {' '.join(tc.flags)} {' '.join(tc.libs)}"
    # numpy computes folded constants (fold_constants runs the ops' numpy references).
    return cache.digest((KIND, str(VERSION), cache.code_stamp(), np.__version__,
                         options_text(options), toolchain_text, toolchain.cpu_signature(), text),
                        arrays), ""


# -- reading --------------------------------------------------------------------------------
def _folder() -> str:
    return os.path.join(cache.open_folder(), FOLDER)


def _path(key: str) -> str:
    return os.path.join(_folder(), key + SUFFIX)


def load(key: str, traced: Graph, have_memory: int) -> tuple[Entry | None, str]:
    """The entry under `key` with its weights bound to `traced`'s Parameters, or None and why.
    A bad entry (unreadable, written under another key, a graph that does not check) is a
    miss: said once as a warning naming the file, and removed, so the fresh compile writes a
    good one."""
    path = _path(key)
    if not os.path.isfile(path):
        return None, "miss: no entry"
    try:
        entry, need = _read(path, key, traced)
    except FormatError as exc:
        with contextlib.suppress(OSError):
            os.unlink(path)
        cache.warn_once(f"graphkernel: the compile cache entry {path} is corrupt or altered "
                        f"({exc.problem}); it is removed and the graph compiled afresh")
        return None, f"miss: the entry was unreadable and is removed ({exc.problem})"
    if have_memory and need > have_memory:
        return None, "miss: the graph needs more memory than this machine has"
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: trimming removes the oldest first
    return entry, f"hit: {path}"


def _read(path: str, key: str, traced: Graph) -> tuple[Entry, int]:
    """The entry at `path`, checked as a file from anyone: its sums say it is whole, not that
    it is ours, so it must name the key it was looked up under, its graph is verified (types
    inferred again, as an export's), and what the build takes from it besides (the inputs,
    the outputs, the loop nests of parallel kernels) must agree with the traced graph."""
    entries = archive.read_entries(path, path, KIND)
    manifest = archive.parse_manifest(path, entries, KIND)
    if manifest.get("format") != KIND or manifest.get("version") != VERSION:
        raise FormatError(f"{path} is not a {KIND} entry of version {VERSION}")
    archive.check_sums(path, entries, manifest, _ENTRY_NAME)
    if manifest.get("key") != key:
        raise FormatError(f"{path} was written under key {manifest.get('key')!r:.40}, not "
                          f"{key} (a swapped or copied entry)")
    try:
        code = _code_data(entries, path)
        arrays = archive.constant_arrays(entries, code, path)
        if "locations" in manifest:  # else data_to_graph says it is missing
            code = {**code, "locations": manifest["locations"]}
        final = data_to_graph(code, arrays, tables=True)
        inputs = manifest["inputs"]
        if not (isinstance(inputs, list) and len(inputs) == len(final.inputs) and
                all(type(i) is int and 0 <= i < len(traced.inputs) for i in inputs)):
            raise FormatError(f"{path}: the inputs do not match the traced graph")
        for inp, i in zip(final.inputs, inputs):
            source = traced.inputs[i]
            if (inp.kind, inp.name, inp.type) != (source.kind, source.name, source.type):
                raise FormatError(f"{path}: input {inp.name} is not the traced graph's")
            inp.binding = source.binding
        if [v.type for v in final.outputs] != [v.type for v in traced.outputs] or \
                final.returns_tuple != traced.returns_tuple:
            raise FormatError(f"{path}: the outputs are not the traced graph's")
        check_final_notes(final)
        reasons = [FusionReason(r["stage"], r["producer"], r["consumer"], FuseRule(r["rule"]),
                                r["detail"], bool(r["parallel"])) for r in manifest["reasons"]]
        rewrites = [str(r) for r in manifest["rewrites"]]
        docs = {str(n): str(d) for n, d in manifest["stages"]}
        need = int(manifest["memory_bytes"])
        # The very bytes `final` was rebuilt from (verified), hashed as the cold build hashed
        # the ones it wrote.
        code_digest = cache.digest((entries[GRAPH_ENTRY].decode(),), arrays)
    except VerifyError as exc:
        raise FormatError(f"{path}: {exc.problem}") from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError) as exc:
        if isinstance(exc, FormatError):  # FormatError passes through
            raise
        raise FormatError(f"{path}: bad entry ({type(exc).__name__}: {exc})") from None
    return Entry(final, reasons, rewrites, docs, code_digest), need


def _code_data(entries: dict[str, bytes], path: str) -> dict[str, Any]:
    """The graph's code text entry as an object holding exactly what `code_text` writes."""
    if GRAPH_ENTRY not in entries:
        raise FormatError(f"{path}: no {GRAPH_ENTRY} entry")
    try:
        code = json.loads(entries[GRAPH_ENTRY].decode())
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"{path}: {GRAPH_ENTRY} is not valid JSON ({exc})") from None
    if not (isinstance(code, dict) and set(code) == {"graph", "constants", "types"}):
        raise FormatError(f"{path}: {GRAPH_ENTRY} does not hold a graph, its constants and "
                          "types")
    return code


# -- writing --------------------------------------------------------------------------------
@dataclass
class Pending:
    """An entry serialised before the build (which notes decisions on the final graph), written
    once the build succeeded."""

    manifest: dict[str, Any]
    entries: dict[str, bytes]
    code_digest: str  # as `Entry.code_digest` will be when it is read back


def prepare(traced: Graph, final: Graph, reasons: Sequence[FusionReason],
            rewrites: Sequence[str], stage_docs: dict[str, str], memory_bytes: int
            ) -> tuple[Pending | None, str]:
    """The entry for `final` (None and why when it cannot be one)."""
    by_binding = {id(i.binding): n for n, i in enumerate(traced.inputs) if i.kind == "weight"}
    by_name = {i.name: n for n, i in enumerate(traced.inputs) if i.kind == "input"}
    inputs = []
    for inp in final.inputs:
        n = by_binding.get(id(inp.binding)) if inp.kind == "weight" else by_name.get(inp.name)
        if n is None or not isinstance(inp.type, TensorType):
            return None, f"not stored: input {inp.name} is not one of the traced graph's"
        inputs.append(n)
    try:
        data, arrays = graph_to_data(final, tables=True)
    except FormatError as exc:
        return None, f"not stored: {exc.problem}"
    text = code_text(data)
    manifest = {"format": KIND, "version": VERSION, "producer": f"graphkernel {__version__}",
                "locations": data["locations"], "inputs": inputs,
                "reasons": [{"stage": r.stage, "producer": r.producer, "consumer": r.consumer,
                             "rule": str(r.rule), "detail": r.detail, "parallel": r.parallel}
                            for r in reasons],
                "rewrites": list(rewrites), "stages": [[n, d] for n, d in stage_docs.items()],
                "memory_bytes": memory_bytes}
    entries = {GRAPH_ENTRY: text.encode(),
               **{f"arrays/{k}.npy": archive.npy(v) for k, v in arrays.items()}}
    return Pending(manifest, entries, cache.digest((text,), arrays)), ""


def store(key: str, pending: Pending) -> str:
    """Write the entry (atomically; a folder that cannot take it is no error). Returns what
    happened, for the report."""
    try:
        folder = cache.ensure_private_dir(_folder())
        # The entry names its key, so that one copied or renamed under another is a miss.
        archive.write(os.path.join(folder, key + SUFFIX), {**pending.manifest, "key": key},
                      pending.entries, prefix=f".{key}.", indent=None)
    except (OSError, GraphKernelError) as exc:
        return f"not stored: {exc}"
    _trim(folder)
    return "stored"


def _trim(folder: str, limit: int = MAX_ENTRIES) -> None:
    """Keep at most `limit` entries, least recently used removed first; a temporary file older
    than any write (its writer was killed) goes too."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    for name in names:
        if name.startswith("."):
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                if now - os.stat(path).st_mtime > cache.STALE_SECONDS:
                    os.unlink(path)
    names = [n for n in names if n.endswith(SUFFIX)]
    if len(names) <= limit:
        return
    dated = []
    for name in names:
        with contextlib.suppress(OSError):
            dated.append((os.stat(os.path.join(folder, name)).st_mtime, name))
    for _, name in sorted(dated)[:len(dated) - limit]:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, name))
