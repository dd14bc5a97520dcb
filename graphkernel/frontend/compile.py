"""The driver: trace a cell, run the pipeline, build the executable. Cells in graph mode call
`compile_cached`; users and tests call `graphkernel.compile`."""
from __future__ import annotations

import gc
import linecache
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

from graphkernel.backends import backend_config, get_backend
from graphkernel.backends.c.c_text import c_identifier
from graphkernel.errors import (
    ContextError,
    GraphKernelError,
    GraphModeError,
    InputError,
    ResourceError,
    ShapeError,
    SourceLocation,
)
from graphkernel.frontend import compile_cache, context, dynamic, guards, primitive, static_inputs
from graphkernel.frontend.compiled import CompiledCell, CompileReport
from graphkernel.frontend.location import user_location
from graphkernel.frontend.signature import CellLike, check_count, input_names, signature
from graphkernel.frontend.tensor import Tensor
from graphkernel.frontend.text_dump import write_graph_kernel_dump
from graphkernel.frontend.tracing import Tracer, function_location
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import (
    FRONTEND_STAGES,
    BackendState,
    CompileOptions,
    backend_stages,
    schedule_composites,
)
from graphkernel.ir.graph import Graph, output_types
from graphkernel.ir.types import SizeMultipleNeeded, SymSize, TensorType
from graphkernel.passes.dumper import Dumper
from graphkernel.passes.manager import StageGraphs, run_stages, stage_dump_names
from graphkernel.passes.stage_names import FINAL


def trace(cell: CellLike, types: list[TensorType]) -> tuple[Graph, Any]:
    """Run `construct` on symbolic tensors; every primitive call becomes a node. Returns the
    graph and, when construct returned nested tuples (MindSpore allows `(x, (y, z))`), their
    shape as nested tuples of output positions (None for a tensor or a flat tuple)."""
    name = type(cell).__name__
    tracer = Tracer(name)
    names = input_names(cell, len(types))
    with tracer:
        args = [tracer.add_input(t, n) for t, n in zip(types, names)]
        try:
            result = cell._traced_call(tuple(args))
        except RecursionError as exc:
            raise _endless_recursion(exc, cell) from None
        outs: list[Any] = []
        tree = _output_tree(result, outs)
        if not outs:
            raise GraphModeError(f"{name}.construct returned no tensor (an empty "
                                 f"{type(result).__name__}); graph mode returns a tensor or a "
                                 "tuple of tensors", function_location(cell.construct))
        values = []
        for i, out in enumerate(outs):
            if not isinstance(out, Tensor):
                raise GraphModeError(f"{name}.construct returned a {type(out).__name__} (output "
                                     f"{i}); graph mode returns tensors or (nested) tuples of "
                                     "tensors", function_location(cell.construct))
            values.append(tracer.value_of(out))
    graph = tracer.graph
    graph.outputs = values
    graph.returns_tuple = isinstance(result, (tuple, list))
    # Weights were appended as they were met; user inputs first keeps call order simple.
    graph.inputs = [i for i in graph.inputs if i.kind == "input"] + \
        [i for i in graph.inputs if i.kind == "weight"]
    nested = isinstance(tree, tuple) and any(not isinstance(t, int) for t in tree)
    return graph, tree if nested else None


def _output_tree(result: Any, outs: list[Any]) -> Any:
    """`result`'s items appended to `outs` depth first; the same nesting of their positions."""
    if isinstance(result, (tuple, list)):
        return tuple(_output_tree(item, outs) for item in result)
    outs.append(result)
    return len(outs) - 1


# Each retrace settles one Reshape's -1 (its symbol's factor makes the size whole).
MAX_RETRACES = 16


def _trace_whole(cell: CellLike, types: list[TensorType], rules: list[dynamic.SizeRule],
                 inputs: tuple[Any, ...]) -> tuple[Graph, Any, list[dynamic.SizeRule]]:
    """Trace `cell`; where a size is whole only for multiples of a factor of an input symbol
    (a Reshape's -1 of [N, 6] into (-1, 4)), declare the symbol so (its dimensions N become
    2*N, a rule checks each call) and trace again. Refuses what no size allows (another rule
    of the symbol contradicts the factor) and a call whose own sizes break the new rule.
    Returns the graph, its output tree (trace) and the rules."""
    name = type(cell).__name__
    for _ in range(MAX_RETRACES):
        try:
            return (*trace(cell, types), rules)
        except SizeMultipleNeeded as need:
            dims = {d for t in types for d in t.shape
                    if isinstance(d, SymSize) and d.names == (need.symbol,)}
            if len(dims) != 1:  # not an input's symbol
                raise
            dim = dims.pop()
            where = f", at {need.location}" if need.location is not None else ""
            rule = dynamic.SizeRule(need.symbol, f"{need.problem}{where}",
                                    divisor=dim.coef * need.factor)
            for other in rules:
                if other.symbol == need.symbol and \
                        other.remainder % math.gcd(other.divisor, rule.divisor):
                    raise ShapeError(f"{need.problem}, but no size of {dim} is "
                                     f"{other.remainder} modulo {other.divisor} and a multiple "
                                     f"of {rule.divisor} ({other.origin})",
                                     need.location) from None
            types = [TensorType(tuple(d * need.factor if d == dim else d for d in t.shape),
                                t.dtype) for t in types]
            rules = [*rules, rule]
            if inputs and all(hasattr(a, "shape") for a in inputs):
                problem = dynamic.broken_rule(name, types, inputs, [rule])
                if problem is not None:
                    raise InputError(problem, need.location) from None
    raise ShapeError(f"{name}: more than {MAX_RETRACES} Reshapes need a multiple of a dynamic "
                     "size; declare those dimensions static", user_location())


def _endless_recursion(exc: RecursionError, cell: CellLike) -> Exception:
    """A construct that calls itself until Python's stack runs out, as a GraphModeError at the
    line that recurses; a RecursionError from elsewhere stays as it is."""
    code = getattr(cell.construct, "__code__", None)
    sites = []
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            sites.append(tb.tb_lineno)
        tb = tb.tb_next
    if code is None or len(sites) < 20:
        return exc
    line = sites[-1]
    where = SourceLocation(code.co_filename, line, code.co_name,
                           linecache.getline(code.co_filename, line))
    return GraphModeError(f"{type(cell).__name__}.construct calls itself without end (deeper than "
                          f"Python's recursion limit, {sys.getrecursionlimit()}); graph mode "
                          "traces construct by running it, so a recursion must stop on values "
                          "known when compiling (shapes, Python numbers)", where)


SUMMARY_NAME = "graph_kernel_summary.txt"


def options_from_context() -> CompileOptions:
    return CompileOptions(enable_graph_kernel=context.get_context("enable_graph_kernel"),
                          flags=parse_flags(context.get_context("graph_kernel_flags")),
                          backend=context.get_context("backend"))


def _dump_folder() -> str | None:
    if not context.get_context("save_graphs"):
        return None
    folder = os.path.abspath(context.get_context("save_graphs_path"))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise ContextError(f"save_graphs_path {folder} cannot be created: {exc}") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ContextError(f"save_graphs_path {folder} is not writable; choose another folder "
                           "with context.set_context(save_graphs_path=...)")
    return folder


def _check_memory(graph: Graph, name: str) -> int:
    """Every input and result of the initial graph together must fit in physical memory (an
    upper bound of what one call holds: refuse before any kernel runs rather than swap or die).
    Returns those bytes."""
    have = primitive.physical_memory()
    values = [*graph.nodes, *graph.inputs]  # the largest node, if any, locates the error
    sizes = sorted(((sum(t.nbytes for t in output_types(v) if t.is_static), v) for v in values),
                   key=lambda item: -item[0])
    need = sum(size for size, _ in sizes)
    if not have or need <= have:
        return need
    largest = sizes[0][1]
    where = getattr(largest, "loc", None)
    raise ResourceError(f"{name} needs {primitive.format_bytes(need)} for its inputs and results, "
                        f"more than this machine's memory ({primitive.format_bytes(have)}); the "
                        f"largest is {largest.name}: {largest.type} "
                        f"({primitive.format_bytes(sizes[0][0])})", where)


def kernel_source_name(graph_name: str) -> str:
    """Where a graph's kernel source goes in the dump folder (relative path)."""
    return os.path.join("kernel_meta", f"{c_identifier(graph_name)}.c")


def plan_dump_name(graph_name: str) -> str:
    """Where a graph's execution plan (steps, buffers, in-place writes) goes in the dump
    folder (relative path)."""
    return os.path.join("kernel_meta", f"{c_identifier(graph_name)}.plan.txt")


def compile(cell: CellLike, *inputs: Any, options: CompileOptions | None = None,
            types: list[TensorType] | None = None) -> CompiledCell:
    """Compile `cell` for the signature of `inputs` with the current context settings, or for
    `types` (which may hold dynamic dimensions: frontend/dynamic.py)."""
    start = time.perf_counter()
    if not callable(getattr(cell, "_traced_call", None)):
        raise InputError(f"graphkernel.compile takes an nn.Cell (an object whose construct "
                         f"method is the program), got a {type(cell).__name__}: define "
                         "`class Net(nn.Cell)` with `def construct(self, ...)` and pass Net()",
                         user_location())
    declared = getattr(cell, "__dict__", {}).get("_declared_inputs")
    if types is None and any(dynamic.is_declaration(a) for a in inputs):
        # compile(net, Tensor(shape=[None, 64], dtype=...)), MindSpore's export call: the
        # inputs declare the types as set_inputs would; they hold no sizes to check
        declared = dynamic.declared_types(cell, inputs)
        types, inputs = declared.types, ()
    elif types is None and declared is not None:  # set_inputs: the graph serves every size
        problem = dynamic.mismatch(cell, declared.types, inputs, declared.rules)
        if problem is not None:
            raise InputError(problem, user_location())
        types = declared.types
    # The sizes the declared Symbols allow, checked on each call.
    rules = list(declared.rules) if declared is not None and types is declared.types else []
    types = types if types is not None else signature(inputs, cell)
    options = options or options_from_context()
    name = type(cell).__name__
    folder = _dump_folder()
    if folder is not None:  # refused before tracing if a dump would replace a user's file
        Dumper(folder).claim(_dump_names(name, options))
    traced = time.perf_counter()
    collector = _CollectorPause()  # tracing (a training step's gradients) allocates as a pass
    collector.space_out()
    try:
        with guards.recording(cell) as read:
            graph, output_tree, rules = _trace_whole(cell, types, rules, inputs)
    finally:
        collector.resume()
    traced = time.perf_counter() - traced
    compiled = compile_traced(graph, name, options, read, output_tree)
    compiled.report.timeline.insert(0, ("trace: construct run on symbolic tensors", traced))
    if rules:
        compiled.check_sizes(compiled.input_types, rules)
    compiled.report.compile_seconds = time.perf_counter() - start
    return compiled


def _dump_names(name: str, options: CompileOptions) -> list[str]:
    return stage_dump_names(FRONTEND_STAGES + backend_stages(options, BackendState())) + \
        [kernel_source_name(name), plan_dump_name(name), SUMMARY_NAME]


class _CollectorPause:
    """Python's cyclic garbage collector held off while a warm start reads the compile-cache
    entry and builds from it, and spaced out for the rest of a compile (tracing, the cache key,
    a cold compile's passes, build and entry).
    Reading a final graph allocates tens of thousands of small, acyclic objects (JSON, nodes,
    types): each allocation burst set off collections that scanned the whole heap, 15-20% of a
    warm first call's CPU (the 12-layer encoder stack's 40 ms). The passes of a cold compile
    keep every stage's graph alive until the end, so at the default threshold (a collection
    each 700 net allocations) those objects were promoted and the old generations rescanned as
    the heap grew: 10-20% of the BERT-base training step's Python CPU (48 old-generation
    collections, 4 of them full). They run with the collector on (they make cyclic garbage),
    a young collection each `COLD_THRESHOLD` net allocations, as mypy's checker does. Cycles
    made meanwhile are collected once it runs as before; a collector the caller turned off is
    left so, and the caller's thresholds are put back."""

    # Net allocations between young collections during a cold compile: its garbage stays in
    # the tens of MB, and a pass's live graphs are not rescanned every few hundred objects.
    COLD_THRESHOLD = 100_000

    def __init__(self) -> None:
        self._paused = False
        self._thresholds: tuple[int, int, int] | None = None

    def pause(self) -> None:
        if gc.isenabled():
            gc.disable()
            self._paused = True

    def space_out(self) -> None:
        """Collections spaced out for a cold compile's passes (see the class doc)."""
        self.resume()
        if self._thresholds is None and gc.isenabled():
            self._thresholds = gc.get_threshold()
            young, *older = self._thresholds
            if young:  # a threshold of 0 turns collection off: left so
                gc.set_threshold(max(young, self.COLD_THRESHOLD), *older)

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            gc.enable()
        if self._thresholds is not None:
            gc.set_threshold(*self._thresholds)
            self._thresholds = None


def compile_traced(graph: Graph, name: str, options: CompileOptions, read: Any = None,
                   output_tree: Any = None) -> CompiledCell:
    """The pipeline every traced graph goes through, a cell's or an imported model's
    (onnx/importer.py): save_graphs dumps, the compile cache, the frontend and backend stages
    (their reasons in the report), the build."""
    collector = _CollectorPause()
    try:
        return _compile_traced(graph, name, options, read, output_tree, collector)
    finally:
        collector.resume()


def _compile_traced(graph: Graph, name: str, options: CompileOptions, read: Any,
                    output_tree: Any, collector: _CollectorPause) -> CompiledCell:
    start = time.perf_counter()
    folder = _dump_folder()
    state = BackendState()
    target = get_backend(options.backend)
    config = backend_config(target, options.backend_config)  # refused before the passes run
    backend = backend_stages(options, state, target)
    dumper = Dumper(folder) if folder is not None else None
    if dumper is not None:  # refuse before compiling if a dump would replace a user's file
        dumper.claim(_dump_names(name, options))
    # Dumps need every stage to run: the compile cache is not read then (nor written).
    key, cache_note = None, "not used: save_graphs or --dump_as_text writes every stage"
    timeline: list[tuple[str, float]] = []
    lap = time.perf_counter()
    collector.space_out()  # the key encodes the whole traced graph
    if dumper is None and not options.flags.dump_as_text:
        key, cache_note = compile_cache.key_of(graph, options)
    hit = None
    if key is not None:
        collector.pause()
        hit, cache_note = compile_cache.load(key, graph, primitive.physical_memory())
        timeline.append(("compile cache: key and look-up" + (", final graph read" if hit else ""),
                         time.perf_counter() - lap))
    pending = None
    if hit is not None:  # the passes ran in an earlier process: the final graph they made
        lap = time.perf_counter()
        final = schedule_composites(hit.final)  # loop nests live on nodes, not in the data
        timeline.append(("loop nests planned", time.perf_counter() - lap))
        stages: Mapping[str, Graph] = _StagesOnDemand(list(hit.stage_docs), final,
                                                      graph, options)
        report = CompileReport(stages=stages, stage_docs=hit.stage_docs, reasons=hit.reasons,
                               rewrites=hit.rewrites)
    else:
        collector.space_out()
        results = run_stages(graph, FRONTEND_STAGES, dumper)
        need = _check_memory(results[-1].graph, name)
        results += run_stages(results[-1].graph, backend, dumper)
        final = results[-1].graph
        timeline += [(f"stage {r.name}", r.seconds) for r in results]
        report = CompileReport(stages=StageGraphs(results),  # each built when asked for
                               stage_docs={r.name: r.doc for r in results},
                               reasons=state.reasons, rewrites=state.rewrites)
        if key is not None:  # serialised before the build, which notes decisions on it
            lap = time.perf_counter()
            pending, problem = compile_cache.prepare(graph, final, state.reasons,
                                                     state.rewrites, report.stage_docs, need)
            cache_note += f"; {problem}" if pending is None else ""
            timeline.append(("compile cache: final graph serialised", time.perf_counter() - lap))
    lap = time.perf_counter()
    # The compile cache hashed the final graph's data as it wrote or read it: the C backend's
    # plan key takes that rather than writing the graph again.
    code_digest = hit.code_digest if hit is not None else \
        pending.code_digest if pending is not None else None
    executable = target.build_executable(final, name, config,
                                         tuning_level=options.flags.online_tuning,
                                         code_digest=code_digest)
    collector.space_out()  # a warm hit's pause ends; a cold compile's entry is written next
    timeline += build_phases(executable, time.perf_counter() - lap)
    if key is not None and pending is not None:
        lap = time.perf_counter()
        cache_note += f"; {compile_cache.store(key, pending)}"
        timeline.append(("compile cache: stored", time.perf_counter() - lap))
    report.compile_cache = cache_note
    report.timeline = timeline
    if dumper is not None and executable.library is not None:
        dumper.write_text(kernel_source_name(name), executable.library.source)
    if dumper is not None:
        dumper.write_text(plan_dump_name(name), executable.plan.describe() + "\n")
    params = [i.binding for i in final.inputs if i.kind == "weight"]
    compiled = CompiledCell(executable, params, report, read, output_tree)
    compiled.input_types = [i.tensor_type for i in graph.inputs if i.kind == "input"]
    report.compile_seconds = time.perf_counter() - start
    report.dump_files = list(dumper.written) if dumper else []
    if dumper is not None and options.flags.dump_as_text:
        report.dump_files.append(dumper.write_text(SUMMARY_NAME, compiled.summary() + "\n"))
    if options.flags.dump_as_text:
        report.dump_files.append(write_graph_kernel_dump(compiled, options.flags, folder))
    return compiled


def build_phases(executable: Any, seconds: float) -> list[tuple[str, float]]:
    """A build's `seconds` split: planning and emitting each kernel's C, then its library's
    own phases (backends/c/library.py `BuiltLibrary.seconds`)."""
    library = getattr(executable, "library", None)
    parts = list(getattr(library, "seconds", None) or [])
    own = seconds - sum(s for _, s in parts)
    return [("build: plan, kernels' C emitted", max(own, 0.0))] + \
        [(f"build: {name}", s) for name, s in parts]


class _StagesOnDemand(Mapping[str, Graph]):
    """A compile-cache hit's stages: the final graph at once; the others, the first time one is
    asked for, by running the pipeline again on the traced graph (what the cold compile ran:
    the same stages, the same graphs)."""

    def __init__(self, names: list[str], final: Graph, traced: Graph,
                 options: CompileOptions) -> None:
        self._names = names
        self._final = final
        self._traced = traced
        self._options = options
        self._graphs: Mapping[str, Graph] | None = None

    def __getitem__(self, name: str) -> Graph:
        if name not in self._names:
            raise KeyError(name)
        if name == FINAL:
            return self._final
        if self._graphs is None:
            results = run_stages(self._traced, FRONTEND_STAGES, None)
            results += run_stages(results[-1].graph,
                                  backend_stages(self._options, BackendState(),
                                                 get_backend(self._options.backend)), None)
            self._graphs = StageGraphs(results)
        return self._graphs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def compile_graph(graph: Graph, name: str, options: CompileOptions | None = None) -> CompiledCell:
    """Compile a graph that went through the frontend stages (an initial graph, e.g. a dump's
    6_validate) with `options` (default: fusion off), without a cell; its weights keep their
    bindings."""
    options = options or CompileOptions()
    start = time.perf_counter()
    state = BackendState()
    target = get_backend(options.backend)
    config = backend_config(target, options.backend_config)
    results = run_stages(graph.clone(), backend_stages(options, state, target), None)
    final = results[-1].graph
    lap = time.perf_counter()
    executable = target.build_executable(final, name, config,
                                         tuning_level=options.flags.online_tuning)
    report = CompileReport(stages=StageGraphs(results),
                           stage_docs={r.name: r.doc for r in results}, reasons=state.reasons,
                           rewrites=state.rewrites,
                           timeline=[(f"stage {r.name}", r.seconds) for r in results] +
                           build_phases(executable, time.perf_counter() - lap))
    compiled = CompiledCell(executable, [i.binding for i in final.inputs if i.kind == "weight"],
                            report)
    report.compile_seconds = time.perf_counter() - start
    return compiled


def compile_cached(cell: CellLike, inputs: tuple[Any, ...]) -> CompiledCell:
    """The executable for this cell, input signature and context (compiled on first use, and
    again when an attribute its `construct` read has changed: frontend/guards.py). Each shape a
    shape-generic graph served is a key of its own, so the per-call path is one lookup."""
    try:  # the per-call path: Tensors holding arrays, a graph compiled for them, no guard moved
        key = (context._generation, *[(a._array.shape, a._array.dtype) for a in inputs])
        exe = cell._compiled.get(key)
        if exe is not None and exe.guards.hold():
            return exe
    except AttributeError:  # arrays, numbers, symbolic or declared tensors: the full path
        pass
    if static_inputs.has_static(inputs):  # numbers, tuples: constants and tuple inputs
        check_count(inputs, cell)
        names = input_names(cell, len(inputs))
        key = (context._generation, "static",
               static_inputs.cache_key(inputs, names, type(cell).__name__))
        static = cell._compiled.get(key)
        stale = None
        if static is not None and not static.compiled.guards.hold():
            stale = static.compiled.guards.changed()
            if stale is not None:
                static = None
        if static is None:
            bound = static_inputs.bound_cell(cell, inputs, names)
            static = cell._compiled[key] = static_inputs.StaticCall(
                compile(bound, *static_inputs.leaves(inputs)))
            static.compiled.report.recompiled_because = stale
        return static  # type: ignore[return-value]  # a StaticCall stands in for one
    try:
        key = (context._generation, *[(a.shape, a.dtype) for a in inputs])
    except AttributeError:  # not arrays or tensors: signature() raises the clear error
        signature(inputs, cell)
        raise
    exe = cell._compiled.get(key)
    stale = None
    if exe is not None:
        stale = _drop_if_stale(cell, exe)
        if stale is not None:
            exe = None
    if exe is None:
        exe = _compile_for(cell, inputs)
        if stale is not None and exe.report.recompiled_because is None:
            exe.report.recompiled_because = stale
        cell._compiled[key] = exe
    return exe


def _drop_if_stale(cell: CellLike, exe: CompiledCell) -> str | None:
    """Why `exe` is stale (and forget it under every key), or None when it still holds."""
    if exe.guards.hold():
        return None
    stale: str | None = exe.guards.changed()  # an object moved: is its value another?
    if stale is not None:
        for table in (cell._compiled, _generic(cell)):
            for k in [k for k, v in table.items() if v is exe]:
                del table[k]
    return stale


def _generic(cell: CellLike) -> dict[tuple[Any, ...], CompiledCell]:
    """The cell's shape-generic graphs (declared or automatic), by context and types; each
    call shape they served is also a key of `cell._compiled`."""
    return cell.__dict__.setdefault("_generic", {})


def automatic_types(cell: CellLike, inputs: tuple[Any, ...]) -> list[TensorType] | None:
    """The input types of the shape-generic graph automatic dynamic shapes made for `cell` that
    serves `inputs` (in this context), or None when calls have made none, and for a cell or
    inputs that declare their types (set_inputs, Tensor(shape=[None, 64], dtype=...))."""
    if getattr(cell, "__dict__", {}).get("_declared_inputs") is not None or not inputs or \
            not all(hasattr(a, "shape") and hasattr(a, "dtype") and
                    not dynamic.is_declaration(a) for a in inputs):
        return None
    generation = context._generation
    for key in _generic(cell):
        if key[:2] == ("automatic", generation) and dynamic.matches(key[2], inputs):
            return list(key[2])
    return None


def _compile_for(cell: CellLike, inputs: tuple[Any, ...]) -> CompiledCell:
    """A call whose shapes have no executable yet: the declared (set_inputs) graph, a
    shape-generic graph that fits, or a new compile (shape-generic once a dimension varied)."""
    signature(inputs, cell)  # clear errors for anything that is not an array
    generation = context._generation
    declared = cell.__dict__.get("_declared_inputs")
    if declared is not None:
        problem = dynamic.mismatch(cell, declared.types, inputs, declared.rules)
        if problem is not None:
            raise InputError(problem, user_location())
        key: tuple[Any, ...] = ("declared", generation)
        exe = _generic(cell).get(key)
        if exe is None or _drop_if_stale(cell, exe) is not None:
            exe = _generic(cell)[key] = compile(cell, *inputs, types=declared.types)
        return exe
    for key, exe in list(_generic(cell).items()):
        if key[:2] == ("automatic", generation) and dynamic.matches(key[2], inputs) and \
                _drop_if_stale(cell, exe) is None:
            return exe
    if not context.get_context("automatic_dynamic_shapes"):
        return compile(cell, *inputs)
    family = (generation, dynamic.family(inputs))
    static_only = cell.__dict__.setdefault("_static_families", set())
    history = cell.__dict__.setdefault("_shape_history", {}).setdefault(family, [])
    shapes = tuple(tuple(a.shape) for a in inputs)
    if shapes not in history:
        history.append(shapes)
    types = None if family in static_only else dynamic.automatic_types(history, inputs)
    if types is None:
        return compile(cell, *inputs)
    try:
        exe = compile(cell, *inputs, types=types)
    except GraphKernelError:  # cannot be shape-generic (or a user error static shapes repeat)
        static_only.add(family)
        return compile(cell, *inputs)
    # Keyed by the types it was built for (a Reshape may have made a size 2*N: odd sizes then
    # compile anew).
    _generic(cell)[("automatic", generation, tuple(exe.input_types))] = exe
    return exe
