"""Export a compiled graph to one file and load it back (MindSpore's export/load, format GKIR).

A GKIR file is a zip archive of stored (uncompressed) entries:
  manifest.json    format name and version, the final graph (ir/serialize.py), the input
                   signature, compile options, which array is which, and the sha256 of every
                   other entry
  checksum.sha256  the sha256 of manifest.json: with the per-entry sums, a checksum over all
  arrays/*.npy     constants and weights (numpy's format, read with allow_pickle=False)
  kernels.c        the generated C of the graph's library (for people, and to match a prebuilt
                   library against)
  prebuilt/KEY.so  optionally, that library as built here, for the same toolchain and CPU

Loading never runs anything from the file: the graph is rebuilt from data and verified, and its
kernels are generated again from it and compiled through the kernel cache. A prebuilt library is
native code; it is used only when the caller trusts the file (`trust_prebuilt=True`) and the
regenerated source gives this machine the library's own cache key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import time
import typing
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from graphkernel._version import __version__
from graphkernel.backends import backend_config, get_backend
from graphkernel.backends.c import cache
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.library import library_key
from graphkernel.errors import (
    FormatError,
    GraphKernelError,
    InputError,
    VerifyError,
)
from graphkernel.frontend import archive
from graphkernel.frontend.compile import (
    _check_memory,
    automatic_types,
    compile,
    options_from_context,
)
from graphkernel.frontend.compiled import CompiledCell, CompileReport
from graphkernel.frontend.dynamic import SizeRule, broken_rule
from graphkernel.frontend.signature import CellLike
from graphkernel.frontend.tensor import Parameter
from graphkernel.graph_kernel.cost_model import CostModel
from graphkernel.graph_kernel.flags import flags_text, parse_flags
from graphkernel.graph_kernel.pipeline import (
    CompileOptions,
    check_final_notes,
    schedule_composites,
)
from graphkernel.ir.graph import Graph
from graphkernel.ir.serialize import (
    check_array,
    data_to_graph,
    encode_dim,
    encode_type,
    graph_to_data,
)
from graphkernel.ir.types import SymSize, TensorType, shape_fits
from graphkernel.passes.stage_names import FINAL
from graphkernel.runtime.plan import PlanSettings

FORMAT = "GKIR"
# 1: static shapes only. 2: dynamic sizes (`{"coef": c, "symbols": [...]}` in shapes) and the
# rules their sizes follow ("size_rules"); written only for a shape-generic graph.
FORMAT_VERSION = 2
SUFFIX = ".gkir"
# The only entries an export holds besides the manifest and its checksum.
_ENTRY_NAME = re.compile(rf"{archive.ARRAY_NAME.pattern}|kernels\.c|prebuilt/[0-9a-f]{{32}}\.so")


@dataclass
class LoadedGraph:
    """What `load` returns: give it to `nn.GraphCell` to run it."""

    name: str
    graph: Graph  # the final graph (hwopt_d_end); weight inputs are not bound yet
    weights: dict[str, np.ndarray]  # by weight input name, in the graph's order
    options: CompileOptions
    signature: list[tuple[str, TensorType]]
    # The kernels' C source, or what writes it when first asked for: an import whose build
    # found its library warm writes no C unless someone reads it (`kernel_source`)
    _kernel_source: str | Callable[[], str] | None
    checksum: str  # sha256 of the manifest: names this file's content
    producer: str
    # (cache key, library) when trusted: used only if the kernels generated here have that key
    prebuilt: tuple[str, bytes] | None = None
    notes: list[str] = field(default_factory=list)
    # What the sizes of the signature's dynamic dimensions must be (a Symbol's range, a
    # Reshape's multiple), checked on every call
    size_rules: tuple[SizeRule, ...] = ()
    # An imported model (onnx/importer.py) went through the whole compile pipeline when it was
    # loaded, as a written network does (dumps, compile cache, reasons): what that built. It
    # has no weights (initializers are constants), so a GraphCell runs it as it is.
    compiled: CompiledCell | None = None

    @property
    def kernel_source(self) -> str | None:
        if callable(self._kernel_source):
            self._kernel_source = self._kernel_source()
        return self._kernel_source

    def __repr__(self) -> str:
        args = ", ".join(f"{n}: {t}" for n, t in self.signature)
        return f"<LoadedGraph {self.name}({args}), {len(self.weights)} weight(s)>"


# -- export --------------------------------------------------------------------------------
def _options_data(options: CompileOptions) -> dict[str, Any]:
    cost = {f.name: getattr(options.cost, f.name) for f in dataclasses.fields(options.cost)}
    # The file holds C kernel sources and loads on the C backend: its settings are recorded,
    # those of the plan kept when the export was compiled on the numpy backend.
    config = options.backend_config
    c_config = CConfig(plan=config) if isinstance(config, PlanSettings) else \
        backend_config(get_backend("c"), config)
    return {"enable_graph_kernel": options.enable_graph_kernel,
            "graph_kernel_flags": flags_text(options.flags).replace(" (no effect)", ""),
            "cost": cost, "backend_config": dataclasses.asdict(c_config)}


def export(net: CellLike | LoadedGraph, *inputs: Any, file_name: str,
           file_format: str = FORMAT, include_library: bool = True,
           options: CompileOptions | None = None) -> str:
    """Compile `net` for `inputs` (the current context's settings, or `options`) and write the
    final graph, its weights, kernel sources, options and input signature to `file_name`
    (".gkir" added when missing). Returns the path written.

    The graph is shape-generic when `net` is: dimensions declared dynamic by
    `net.set_inputs` (with their Symbols' rules), or made dynamic by automatic dynamic shapes
    in earlier calls of `net` (its shape-generic graph that serves `inputs`), or the dynamic
    dimensions of a loaded graph (`nn.GraphCell` of a GKIR or ONNX file, `inputs` optional);
    `load`ed, it runs every size they allow with one compile. Otherwise the export takes
    `inputs`' shapes only. An imported model (`graphkernel.load` of an ONNX file) is written
    as its load compiled it."""
    if file_format != FORMAT:
        raise FormatError(f"file_format={file_format!r}: graphkernel writes {FORMAT!r} only "
                          "(graphkernel.export writes ONNX too; MINDIR and AIR are MindSpore's)")
    path = os.path.abspath(file_name if file_name.endswith(SUFFIX) else file_name + SUFFIX)
    if os.path.exists(path) and not _is_export(path):
        raise FormatError(f"{path} exists and is not a {FORMAT} export; not replacing it")
    if isinstance(net, LoadedGraph):  # an imported model: what its load compiled
        if net.compiled is None or inputs or options is not None:
            raise InputError(f"export of a loaded graph ({net.name}) writes what its load "
                             "compiled: an imported (ONNX) model, given without inputs or "
                             "options")
        return write_compiled(net.compiled, path, net.options, include_library)
    loaded = getattr(net, "_loaded", None)
    if isinstance(loaded, LoadedGraph) and hasattr(net, "compiled"):
        # An nn.GraphCell (a loaded GKIR or ONNX graph): its graph as it is, dynamic sizes too
        if inputs:
            check_signature(loaded, list(inputs))
        return write_compiled(net.compiled, path, loaded.options, include_library)
    compiled = compile(net, *inputs, options=options, types=automatic_types(net, inputs))
    return write_compiled(compiled, path, options or options_from_context(), include_library)


def write_compiled(compiled: CompiledCell, path: str, options: CompileOptions,
                   include_library: bool = True) -> str:
    """Write an already compiled graph (see `export`)."""
    graph = compiled.graph
    data, arrays = graph_to_data(graph)
    weights = [i for i in graph.inputs if i.kind == "weight"]
    for i, param in enumerate(compiled.params):  # the plan's weight order is the graph's
        arrays[f"weight{i}"] = param.asnumpy()
    entries: dict[str, bytes] = {f"arrays/{k}.npy": archive.npy(v) for k, v in arrays.items()}
    library = compiled.executable.library
    prebuilt = None
    if library is not None:
        entries["kernels.c"] = library.source.encode()
        key = os.path.basename(library.path)[:-len(cache.LIBRARY_SUFFIX)]
        if include_library and key == library_key(library.source, library.entry is not None):
            with open(library.path, "rb") as fh:
                entries[f"prebuilt/{key}.so"] = fh.read()
            prebuilt = {"key": key, "entry": f"prebuilt/{key}.so"}
    # Version 1 holds static graphs only: a static export stays readable by older releases.
    generic = not all(i.tensor_type.is_static for i in graph.inputs)
    manifest = {
        "format": FORMAT, "version": FORMAT_VERSION if generic else 1,
        "producer": f"graphkernel {__version__}", "name": compiled.name, **data,
        "weights": [{"name": inp.name, "array": f"weight{i}"} for i, inp in enumerate(weights)],
        "signature": [{"name": i.name, **encode_type(i.type)}
                      for i in graph.inputs if i.kind == "input"],
        "options": _options_data(options),
        "kernels": "kernels.c" if library is not None else None,
        "library": None if library is None else {"with_entry": library.entry is not None},
        "prebuilt": prebuilt,
    }
    if generic:
        manifest["size_rules"] = [{**dataclasses.asdict(rule), "origin": _origin_text(rule)}
                                  for rule in compiled.size_rules]
    archive.write(path, manifest, entries, prefix=".gkir.")
    return path


def _origin_text(rule: SizeRule) -> str:
    """A rule's origin as the file keeps it: printable ASCII (escapes for the rest), cut to
    the length `load` takes."""
    text = rule.origin.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(c if " " <= c <= "~" else " " for c in text)
    return text[:_ORIGIN_LENGTH] or "a rule on " + rule.symbol


def _is_export(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return archive.MANIFEST in zf.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


# -- load ----------------------------------------------------------------------------------
def _manifest(path: str, entries: dict[str, bytes]) -> dict[str, Any]:
    manifest = archive.parse_manifest(path, entries, FORMAT)
    if manifest.get("format") != FORMAT:
        raise FormatError(f"{path} is not a {FORMAT} export")
    version = manifest.get("version")
    if type(version) is not int or version < 1:
        raise FormatError(f"{path}: bad format version {version!r}")
    if version > FORMAT_VERSION:
        raise FormatError(f"{path} is {FORMAT} version {version}, written by a newer graphkernel "
                          f"({manifest.get('producer', '?')}); this graphkernel {__version__} "
                          f"reads up to version {FORMAT_VERSION}: upgrade graphkernel to load it")
    archive.check_sums(path, entries, manifest, _ENTRY_NAME)
    return manifest


# Integer settings reach generated C as literals: int64's range.
_COST_LIMIT = 1 << 63


def _settings(kind: type, data: Any, path: str, what: str) -> Any:
    """A `kind` (a frozen dataclass of settings) from `data`: each field of the type its
    declaration gives (`int | None`: an int or None; a dataclass: a dict of its fields),
    integers from 0 into int64's range. `what` names it in an error."""
    if not isinstance(data, dict):
        raise FormatError(f"{path}: bad {what} {data!r:.80}")
    types = typing.get_type_hints(kind)
    values: dict[str, Any] = {}
    for name, value in data.items():
        declared = types.get(name) if isinstance(name, str) else None
        if declared is None:
            raise FormatError(f"{path}: bad {what}: it has no field {name!r:.40}")
        if isinstance(declared, type) and dataclasses.is_dataclass(declared):
            values[name] = _settings(declared, value, path, f"{what} ({name})")
            continue
        allowed = typing.get_args(declared) or (declared,)
        values[name] = value
        if value is None and type(None) in allowed:
            continue
        if type(value) is bool and bool in allowed:
            continue
        if type(value) is not int or int not in allowed or not 0 <= value < _COST_LIMIT:
            kinds = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
            raise FormatError(f"{path}: bad {what}: field {name} is {value!r:.40}; it "
                              f"is {kinds}" + (" from 0" if int in allowed else ""))
    try:
        return kind(**values)
    except GraphKernelError as exc:  # a check of the settings' own (CConfig.vector_width)
        raise FormatError(f"{path}: bad {what}: {exc.problem}") from None


# Before the C backend had settings of its own (issue 29), an export recorded them among the
# cost model's: such a file's values move to where they live now.
_C_FIELDS = {f.name for f in dataclasses.fields(CConfig)} - {"plan"}
_PLAN_FIELDS = {f.name for f in dataclasses.fields(PlanSettings)}


def _options(data: Any, path: str) -> CompileOptions:
    if not isinstance(data, dict) or not {"cost", "graph_kernel_flags",
                                          "enable_graph_kernel"} <= set(data):
        raise FormatError(f"{path}: bad compile options")
    cost_data, config_data = data["cost"], data.get("backend_config")
    if config_data is None and isinstance(cost_data, dict):
        plan = {k: v for k, v in cost_data.items() if k in _PLAN_FIELDS}
        config_data = {k: v for k, v in cost_data.items() if k in _C_FIELDS} | {"plan": plan}
        cost_data = {k: v for k, v in cost_data.items()
                     if k not in _C_FIELDS and k not in _PLAN_FIELDS}
    cost = _settings(CostModel, cost_data, path, "cost model")
    config = _settings(CConfig, config_data, path, "C backend settings")
    flags = data["graph_kernel_flags"]
    if not isinstance(flags, str) or type(data["enable_graph_kernel"]) is not bool:
        raise FormatError(f"{path}: bad compile options")
    try:
        parsed = parse_flags(flags)
    except GraphKernelError as exc:
        raise FormatError(f"{path}: compile options: {exc.problem}") from None
    return CompileOptions(enable_graph_kernel=data["enable_graph_kernel"], flags=parsed,
                          cost=cost, backend_config=config)


def load(file_name: str | BinaryIO, trust_prebuilt: bool = False) -> LoadedGraph:
    """Read an export written by `export` (a path, or a binary file object); run it with
    `nn.GraphCell(load(file))`. `trust_prebuilt=True` lets a prebuilt library in the file be
    used (native code: only for files you trust), and only when the kernels generated here from
    the file's graph are the source it was built from; otherwise they are compiled here."""
    if isinstance(file_name, (str, os.PathLike)):
        path = os.path.abspath(file_name)
        entries = archive.read_entries(path, path, FORMAT)
    else:
        path = str(getattr(file_name, "name", "<export bytes>"))
        entries = archive.read_entries(path, file_name, FORMAT)
    manifest = _manifest(path, entries)
    arrays = archive.constant_arrays(entries, manifest, path)
    try:
        graph = data_to_graph(manifest, arrays)
        check_final_notes(graph)  # what the file says about its loop nests, against the graph
    except (FormatError, VerifyError) as exc:
        raise FormatError(f"{path}: {exc.problem}") from None
    weight_inputs = [i for i in graph.inputs if i.kind == "weight"]
    weight_recs = manifest.get("weights")
    if not isinstance(weight_recs, list) or len(weight_recs) != len(weight_inputs):
        raise FormatError(f"{path}: the weights do not match the graph's weight inputs")
    weights = {}
    for inp, rec in zip(weight_inputs, weight_recs):
        if not isinstance(rec, dict) or rec.get("name") != inp.name:
            raise FormatError(f"{path}: weight {inp.name} is not listed in order")
        array = archive.array(entries, rec.get("array"), path)
        check_array(array, inp.tensor_type, f"{path}: weight {inp.name}")
        weights[inp.name] = array
    if len(weights) != len(weight_inputs):
        raise FormatError(f"{path}: two weights share a name")
    signature = [(i.name, i.tensor_type) for i in graph.inputs if i.kind == "input"]
    listed = manifest.get("signature")
    if not isinstance(listed, list) or [
            (r.get("name"), r.get("shape"), r.get("dtype")) if isinstance(r, dict) else None
            for r in listed] != [(n, [encode_dim(d) for d in t.shape], t.dtype.name)
                                 for n, t in signature]:
        raise FormatError(f"{path}: the input signature does not match the graph")
    rules = _size_rules(manifest, graph, path)
    _check_memory(graph, graph.name)  # refuse a graph too large for this machine up front
    kernels = manifest.get("kernels")
    source = entries[kernels].decode("utf-8", "replace") if kernels in entries else None
    loaded = LoadedGraph(_name(manifest, path), graph, weights,
                         _options(manifest.get("options"), path), signature, source,
                         hashlib.sha256(entries[archive.MANIFEST]).hexdigest(),
                         str(manifest.get("producer", "?")), size_rules=rules)
    prebuilt = manifest.get("prebuilt")
    if trust_prebuilt and isinstance(prebuilt, dict) and prebuilt.get("entry") in entries:
        library = manifest.get("library") or {}
        here = library_key(source or "", bool(library.get("with_entry")))
        if here is not None and here == prebuilt.get("key"):
            loaded.prebuilt = (here, entries[prebuilt["entry"]])
        else:
            loaded.notes.append("the prebuilt library was made for another toolchain or CPU: "
                                "compiling here")
    return loaded


# A rule's origin is text for error messages (a Symbol's repr, a Reshape at a source line).
_ORIGIN_LENGTH = 300
_ORIGIN = re.compile(rf"[ -~]{{1,{_ORIGIN_LENGTH}}}")


def _size_rules(manifest: dict[str, Any], graph: Graph, path: str) -> tuple[SizeRule, ...]:
    """The rules on the graph's dynamic sizes. Dynamic sizes come in through the inputs only
    (the verifier inferred every other type from them): each input's dynamic dimension is one
    symbol (N or c*N), weights are static, and each rule is on a symbol of the inputs."""
    symbols: set[str] = set()
    for inp in graph.inputs:
        for axis, dim in enumerate(inp.tensor_type.shape):
            if not isinstance(dim, SymSize):
                continue
            if inp.kind == "weight" or len(dim.names) != 1:
                what = "a weight" if inp.kind == "weight" else "an input"
                raise FormatError(f"{path}: {what}, {inp.name}, has the dynamic size {dim} at "
                                  f"axis {axis}; {what} takes " +
                                  ("static sizes" if inp.kind == "weight" else
                                   "one symbol per dynamic dimension"))
            symbols.add(dim.names[0])
    version = manifest["version"]
    records = manifest.get("size_rules", [] if version < 2 or not symbols else None)
    if symbols and version < 2:
        raise FormatError(f"{path}: {FORMAT} version {version} holds static shapes only, and "
                          f"this graph has dynamic sizes ({', '.join(sorted(symbols))})")
    if not isinstance(records, list) or len(records) > 64:
        raise FormatError(f"{path}: bad size rules {records!r:.80}")
    rules = []
    for i, rec in enumerate(records):
        fields = {f.name: f.type for f in dataclasses.fields(SizeRule)}
        if not isinstance(rec, dict) or set(rec) != set(fields):
            raise FormatError(f"{path}: size rule {i} is not a record of "
                              f"{', '.join(fields)}")
        if rec["symbol"] not in symbols:
            raise FormatError(f"{path}: size rule {i} is on {rec['symbol']!r:.20}, which is no "
                              f"dynamic dimension of the inputs "
                              f"({', '.join(sorted(symbols)) or 'none'})")
        if not isinstance(rec["origin"], str) or not _ORIGIN.fullmatch(rec["origin"]):
            raise FormatError(f"{path}: size rule {i} has a bad origin {rec['origin']!r:.60}")
        numbers = [rec[k] for k in ("divisor", "remainder", "min", "max")]
        if not all(type(n) is int and 0 <= n < _COST_LIMIT for n in numbers) or \
                not 0 <= rec["remainder"] < rec["divisor"]:
            raise FormatError(f"{path}: size rule {i} on {rec['symbol']} has bad numbers "
                              f"(divisor {rec['divisor']!r:.20}, remainder "
                              f"{rec['remainder']!r:.20}, min {rec['min']!r:.20}, max "
                              f"{rec['max']!r:.20}): a divisor from 1, a remainder below it")
        rules.append(SizeRule(**rec))
    return tuple(rules)


def _name(manifest: dict[str, Any], path: str) -> str:
    name = manifest.get("name")
    if not isinstance(name, str) or not name:
        raise FormatError(f"{path}: the export has no name")
    return name


def compile_loaded(loaded: LoadedGraph, graph: Graph, params: list[Parameter]) -> CompiledCell:
    """Build a loaded final graph (its weight inputs bound to `params`): kernels generated
    again from the graph, compiled through the kernel cache (a trusted prebuilt library placed
    there when it was built from the very source generated here)."""
    start = time.perf_counter()
    schedule_composites(graph)  # each composite's loop nest, as the last backend stage plans it
    # A trusted prebuilt library goes into the cache only under the key of the source
    # generated here from the graph, and only when that is the key it was built under.
    target = get_backend(loaded.options.backend)
    executable = target.build_executable(
        graph, loaded.name, backend_config(target, loaded.options.backend_config),
        loaded.prebuilt, loaded.options.flags.online_tuning)
    report = CompileReport(stages={FINAL: graph},
                           stage_docs={FINAL: "the final graph, loaded from an export"})
    compiled = CompiledCell(executable, params, report)
    compiled.input_types = [t for _, t in loaded.signature]
    if loaded.size_rules:
        compiled.check_sizes(compiled.input_types, loaded.size_rules)
    report.compile_seconds = time.perf_counter() - start
    return compiled


def check_signature(loaded: LoadedGraph, arrays: list[Any]) -> None:
    """The call's inputs against the export's signature (a clear error, before compiling)."""
    if len(arrays) != len(loaded.signature):
        names = ", ".join(n for n, _ in loaded.signature)
        raise InputError(f"GraphCell {loaded.name} takes {len(loaded.signature)} input(s) "
                         f"({names}), got {len(arrays)}")
    sizes: dict[str, int] = {}  # a dynamic dimension (an ONNX dim_param) is one size throughout
    for array, (name, type_) in zip(arrays, loaded.signature):
        shape = tuple(getattr(array, "shape", ()))
        dtype = getattr(array, "dtype", None)
        if not shape_fits(shape, type_.shape, sizes) or dtype is None or \
                np.dtype(dtype) != type_.dtype:
            raise InputError(f"GraphCell {loaded.name} input {name!r} must be {type_} (the "
                             f"exported signature), got {dtype}{list(shape)}")
    problem = broken_rule(f"GraphCell {loaded.name}", [t for _, t in loaded.signature],
                          arrays, loaded.size_rules)
    if problem is not None:
        raise InputError(problem)


__all__ = ["export", "load", "LoadedGraph", "FORMAT", "FORMAT_VERSION"]
