"""The C backend: answers lowering's questions (which window, argmax and conv-block kernels
its generated C covers), emits each kernel spec as C, compiles a plan's kernels and its CPython
entry into one library (cached) and loads it into the runner.

A warm build writes no C. The library's cache key is its C source's hash, so finding it used to
mean emitting every kernel. Instead a build computes a plan key P from what decides the C: the
graph it is given (as data, with its constants' bytes; source lines taken out: a hash the
compile cache makes of the data it writes or reads back, else made here), the plan made of it,
the backend's settings, numpy's BLAS as the entry finds it, the toolchain and graphkernel's
version (`plan_key`). After a build, a plan record `plans/R.json` in the kernel cache (R: P with
the stamp of graphkernel's modules and what chooses each product's BLAS library, `record_key`)
names the library (its cache key), its entry module, the tuning record each kernel's schedule
came from and each product's BLAS library. A later build reads it, takes each kernel's choice
from its tuning record as a cold build would, and loads the library the cache checks as usual
(checksum, ELF structure, symbols). The C is written only on a miss, and for reports and
exports when first asked for.

Records are data from anyone (like a compile-cache entry): P is computed here, never read, each
field is checked, and each library is built with a mark, an exported symbol naming the hash of
P, its kernels' knobs and its products' BLAS libraries (`_mark`), that the warm load requires.
A record that names another graph's library (forged, swapped) finds no such mark: it is refused
with a warning saying why, and the C is written and built as on a cold start, which rewrites
the record."""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

from graphkernel.backends.c import blas_choice, cache, calibration, plan_records, toolchain
from graphkernel.backends.c import cblas as numpys_blas
from graphkernel.backends.c.c_argmax import emit_argmax_kernel, why_not_argmax_kernel
from graphkernel.backends.c.c_entry_threads import (
    entry_step_kinds,
    runner_keep_awake,
    team_kept_awake,
    threads_note,
)
from graphkernel.backends.c.c_gemm import (
    SMALL_PRODUCT_LABEL,
    gemm_call,
    gemm_call_of,
    library_shape,
)
from graphkernel.backends.c.c_gemm_packed import (
    PACKED_COPIED_A_LABEL,
    PACKED_PRODUCT_LABEL,
    prepacked_bytes,
)
from graphkernel.backends.c.c_gemm_row import ROW_PRODUCT_LABEL
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.cblas import hand_blas_to
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.conv_tile import ConvTile
from graphkernel.backends.c.library import (
    BuiltLibrary,
    build_library,
    library_source,
    load_marked,
    toolchain_text,
    uses_openmp,
)
from graphkernel.backends.c.shared_kernels import EmitOnce
from graphkernel.backends.c.tuning import Choice, Knobs, choose_schedules, stored_choice
from graphkernel.errors import FormatError
from graphkernel.graph_kernel.lower import ConvBlock, KernelKind, lower
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.ir.graph import Graph, Node
from graphkernel.ir.opset import Window, get_op
from graphkernel.ir.serialize import code_text, graph_to_data
from graphkernel.runtime.builder import plan_graph
from graphkernel.runtime.executable import Executable
from graphkernel.runtime.plan import ExecutionPlan, KernelSpec, Slot, Step, StepKind
from graphkernel.runtime.runner import Runner

_warned_no_compiler = False


def _layout_of(node: Node) -> tuple[frozenset[int], int]:
    """The values a window kernel or conv block reads or writes blocked, and the block
    (graph_kernel/conv_layout.py, recorded on the node's lowering)."""
    lowering = node.lowering
    if lowering is None or not lowering.blocked:
        return frozenset(), 16
    return lowering.blocked, lowering.channel_block


class CBackend:
    name = "c"
    config_type = CConfig

    def default_config(self) -> CConfig:
        """CConfig's defaults from this machine's calibration, or its constants
        ($GRAPHKERNEL_CALIBRATION=off, no compiler): backends/c/calibration.py."""
        return calibration.default_config()

    def why_not_kernels(self) -> str | None:
        return None if toolchain.detect() is not None else "no C compiler"

    def why_not_window_kernel(self, node: Node) -> str | None:
        if node.subgraph is not None or get_op(node.op).window is None:
            # asked of every lone op: the window modules load where there is a window op
            return "not a window op"
        from graphkernel.backends.c import c_window
        return c_window.why_not_window_kernel(node)

    def why_not_argmax_kernel(self, node: Node) -> str | None:
        return why_not_argmax_kernel(node)

    def conv_blocks(self, graph: Graph) -> dict[int, ConvBlock]:
        if not any(n.subgraph is None and get_op(n.op).window is Window.CONVOLUTION
                   for n in graph.nodes):
            return {}  # the convolution modules (and oneDNN's chooser) load where one is
        from graphkernel.backends.c.c_conv_block import NOTE as CONV_BLOCK_NOTE
        from graphkernel.backends.c.c_conv_block import conv_blocks
        from graphkernel.backends.c.c_window import conv_library
        blocks = conv_blocks(graph)
        # A convolution stored timings put on oneDNN runs as a window kernel (the hook is
        # there); its epilogue stays a kernel of its own rather than our block's.
        for uid, block in list(blocks.items()):
            choice = conv_library(block.conv)
            if choice.onednn is not None:
                del blocks[uid]
                block.conv.notes[CONV_BLOCK_NOTE] = (
                    f"a kernel of its own: oneDNN runs the convolution ({choice.why})")
        return blocks

    def why_not_blocked(self, conv: Node, side: str) -> str | None:
        from graphkernel.backends.c.c_window import why_not_blocked  # only where convolutions are
        return why_not_blocked(conv, side)

    def channel_block(self, conv: Node) -> int:
        from graphkernel.backends.c.c_conv_units import channel_block
        return channel_block(conv.dtype)

    def conv_form(self, conv: Node, input_blocked: bool, output_blocked: bool) -> str | None:
        from graphkernel.backends.c.c_window import conv_form
        return conv_form(conv, input_blocked, output_blocked)

    def emit(self, spec: KernelSpec, config: CConfig) -> KernelSource:
        source = self._emit(spec, config)
        if config.vector_width is None:
            return source
        # GCC's per-function target option, over the kernel and its helpers (OpenMP's
        # outlined regions too); the width is one of VECTOR_WIDTHS (CConfig checks it).
        return dataclasses.replace(source, source=(
            "#pragma GCC push_options\n"
            f"#pragma GCC target(\"prefer-vector-width={config.vector_width}\")\n"
            f"{source.source}\n#pragma GCC pop_options\n"))

    def _emit(self, spec: KernelSpec, config: CConfig) -> KernelSource:
        kind = spec.kind
        if kind in (KernelKind.CONV_BLOCK, KernelKind.WINDOW):
            from graphkernel.backends.c.c_conv_block import emit_conv_block
            from graphkernel.backends.c.c_conv_units import NCHW, ConvLayout
            from graphkernel.backends.c.c_window import emit_window_kernel
        if kind is KernelKind.CONV_BLOCK:
            assert spec.block is not None
            return emit_conv_block(spec.block, spec.name, config.window_parallel_min_macs,
                                   _tile_of(config), *_layout_of(spec.node),
                                   store_epilogue=_store_choice(config))
        if kind is KernelKind.WINDOW:
            blocked, block = _layout_of(spec.node)
            layout = ConvLayout(spec.node.inputs[0].uid in blocked, spec.node.uid in blocked,
                                block) if blocked else NCHW
            return emit_window_kernel(spec.node, spec.name, config.window_parallel_min_macs,
                                      spec.workspace, tile=_tile_of(config), layout=layout)
        if kind is KernelKind.ARGMAX:
            return emit_argmax_kernel(spec.node, spec.name)
        if kind is KernelKind.ATTENTION:
            from graphkernel.backends.c.c_attention import emit_attention_kernel
            attention = spec.node.lowering.attention
            assert attention is not None
            return emit_attention_kernel(attention, spec.name)
        assert spec.group is not None
        # Imported when first needed: a warm build writes no C (~5 ms of a warm start).
        from graphkernel.backends.c.generic_kernel import emit_any_kernel
        from graphkernel.backends.c.parallel_kernel import emit_parallel_kernel
        if isinstance(spec.schedule, ParallelSchedule):  # independent groups, a nest each
            return emit_parallel_kernel(spec.group, spec.name, spec.schedule,
                                        config.parallel_threshold, config.stream_min_bytes,
                                        config.prefetch_min_bytes, spec.beside_blas,
                                        config.blocking)
        return emit_any_kernel(spec.group, spec.name, spec.schedule, config.parallel_threshold,
                               config.stream_min_bytes, config.prefetch_min_bytes,
                               spec.beside_blas, config.blocking)

    def build_executable(self, graph: Graph, name: str, config: CConfig,
                         prebuilt: tuple[str, bytes] | None = None,
                         tuning_level: int = 0, code_digest: str | None = None) -> Executable:
        """Plan `graph`, compile its kernels (one library, cached) and ready the runners.
        `prebuilt`: a library built elsewhere for the same source, by its cache key (see
        `build_library`). `code_digest`: `graph_code_digest` of `graph` as handed in, where the
        caller has it (the compile cache wrote or read the graph's data): the plan key takes
        it instead of writing the graph again."""
        global _warned_no_compiler
        if toolchain.detect() is None and not _warned_no_compiler:
            warnings.warn("graphkernel: no C compiler found (set CC or install gcc); fused "
                          "kernels run op by op on numpy, correct but slow. `graphkernel "
                          "doctor` says more.", RuntimeWarning, stacklevel=3)
            _warned_no_compiler = True
        if code_digest is None and toolchain.detect() is not None:
            code_digest = graph_code_digest(graph)  # of the graph as handed in, before lowering
        if graph.lowered_for != self.name:
            lower(graph, self)
        if tuning_level > 0:  # the library of each convolution kernel, timed (else stored)
            from graphkernel.backends.c.c_window import tune_conv_libraries
            tune_conv_libraries([n for n in graph.nodes if n.lowering is not None and
                                 n.lowering.kind is KernelKind.WINDOW and
                                 get_op(n.op).window is Window.CONVOLUTION], tuning_level)
        plan, notes = plan_graph(graph, name, config.plan, _workspace_bytes, _prepacked_bytes)
        thresholds = None
        # A kernel's fork within a call finds its team spinning; the entry (not the Python
        # runner) steps back to one thread when its probes find that faster (c_entry_threads)
        if team_kept_awake(plan) and entry_step_kinds(plan):
            config, thresholds = calibration.within_call(config)
        if tuning_level > 0:  # each product's library, timed (else stored: c_gemm.with_library)
            blas_choice.tune(_product_shapes(plan), tuning_level)
        # buffers readied while gcc runs
        runner = Runner(plan, prefault=config.plan.prefault_buffers)
        specs = [s.kernel for s in plan.steps if s.kernel is not None]
        choices: dict[str, Choice] = {}
        library: BuiltLibrary | None = None
        sources: Mapping[str, str] = {}
        key = None
        if specs and code_digest is not None:
            key = plan_key(code_digest, plan, config)
        # A tuning run measures, and a prebuilt library is checked against its source: both
        # write the C.
        if key is not None and tuning_level <= 0 and prebuilt is None:
            library, choices, sources, refused = self._warm(key, plan, specs, config)
            if refused is not None:
                cache.warn_once(f"graphkernel: {refused}")
                notes.append(refused)
        if library is None and specs:
            # Identical groups (a stack of identical layers) have their C written once
            emit = EmitOnce(self.emit)
            if toolchain.detect() is not None:
                # Each kernel's schedule: a record of this machine's, measured now, or the
                # defaults
                choices = choose_schedules(plan, config, tuning_level, emit)
            kernels = [emit(spec, config) if spec.name not in choices else
                       choices[spec.name].source or
                       emit(spec, choices[spec.name].knobs.apply(config))
                       for spec in specs]
            marked = None if key is None else \
                functools.partial(_mark, key, specs, choices, plan)
            entry = _entry_source(plan)
            library = build_library(kernels, entry, prebuilt, marked)
            if tuning_level > 0:  # the tuned kernels kept only where whole calls gain
                from graphkernel.backends.c.tuning_whole_call import confirm_tuned
                library, choices, kernels = confirm_tuned(plan, config, specs, choices, kernels,
                                                          library, emit, entry)
            sources = {k.name: k.source for k in kernels}
            if key is not None and library.mark is not None:
                problem = plan_records.write_plan_record(cache.open_folder(), record_key(key), {
                    "library_key": library.key, "module": _module_of(library),
                    "kernels": [s.name for s in specs], "openmp": uses_openmp(library.source),
                    "mark": library.mark, "gemm": _gemm_labels(plan),
                    "tuning": {s.name: choices[s.name].record_key for s in specs}})
                if problem is not None:
                    notes.append(problem)
        plan.schedule_notes.update({n: c.how for n, c in choices.items()
                                    if c.how != "defaults"})
        notes += [c.refused for c in choices.values() if c.refused is not None]
        for spec in specs:  # which library runs each convolution kernel, and why
            conv = _convolution_of(spec)
            if conv is not None:
                from graphkernel.backends.c.c_window import conv_library
                tuned = plan.schedule_notes.get(spec.name)
                library_ = conv_library(conv)
                chosen = choices[spec.name].knobs.apply(config) if spec.name in choices \
                    else config
                split = "" if library_.onednn is not None else "; " + images_note(
                    conv, spec.kind is KernelKind.CONV_BLOCK, chosen, _in_stores(spec, chosen))
                plan.schedule_notes[spec.name] = (f"{tuned}; " if tuned else "") + \
                    f"convolution on {library_.why}{split}"
        if library is not None:
            hand_blas_to(library.entry_module, any(
                label.startswith(MKL_LABEL) for label in _gemm_labels(plan).values()))
            runner.load(library)
        if prebuilt is not None and (library is None or os.path.basename(library.path) !=
                                     prebuilt[0] + cache.LIBRARY_SUFFIX):
            notes.append("the prebuilt library is not the one these kernels build (its source "
                         "differs): not used, compiled here")
        run_notes = {}
        if thresholds is not None:
            run_notes["thread thresholds"] = f"within a call the team is awake: {thresholds}"
        if library is not None:  # the Python runner's steps keep the threads awake too
            runner.keep_awake = runner_keep_awake(plan)
        threads = threads_note(plan, library is not None and library.entry is not None,
                               runner.keep_awake is not None)
        if threads is not None:
            run_notes["threads"] = threads
        return Executable(plan, runner, library, notes, sources, run_notes)

    def _warm(self, key: str, plan: ExecutionPlan, specs: list[KernelSpec], config: CConfig
              ) -> tuple[BuiltLibrary | None, dict[str, Choice], Mapping[str, str], str | None]:
        """The library plan `key` was built into, found by its plan record without writing C:
        (library, each kernel's schedule choice, the kernels' C written when first asked for,
        None); (None, {}, {}, None) on a miss (no record, its library gone, a tuning record
        changed since); (None, {}, {}, why) when the record or its library is refused (not
        what it claims: forged, swapped, corrupt)."""
        folder = cache.open_folder()
        record, problem = plan_records.read_plan_record(folder, record_key(key))
        where = plan_records.plan_record_path(folder, record_key(key))
        if record is None:
            return None, {}, {}, None if problem is None else \
                f"plan record not used ({problem}); kernels' C written and built afresh"
        problem = _record_problem(record, plan, specs)
        if problem is not None:
            return None, {}, {}, (f"plan record {where} not used ({problem}); kernels' C "
                                  "written and built afresh")
        default = Knobs.of(config)
        choices = {s.name: stored_choice(s.name, record["tuning"][s.name], default)
                   for s in specs}
        # Each product's BLAS library as the cold build chose it (its entry's C calls that
        # one): the plan says so, and the mark covers it.
        _note_gemm_labels(plan, record["gemm"], True)
        mark = _mark(key, specs, choices, plan)
        if record["mark"] != mark:  # a kernel's tuning record changed since: another library
            _note_gemm_labels(plan, record["gemm"], False)
            return None, {}, {}, None
        written: list[KernelSource] = []

        def write_kernels() -> list[KernelSource]:
            if not written:
                written.extend(self.emit(s, choices[s.name].knobs.apply(config)) for s in specs)
            return written

        def write_source() -> str:
            return library_source(write_kernels(), _entry_source(plan), lambda: mark).text

        library, problem = load_marked(record["library_key"], [s.name for s in specs],
                                       record["module"], mark, record["openmp"], write_source)
        if library is None:
            _note_gemm_labels(plan, record["gemm"], False)
            return None, {}, {}, None if problem is None else \
                (f"plan record {where} not used: {problem}; kernels' C written and built "
                 "afresh")
        return library, choices, _KernelSources(write_kernels), None


BACKEND = CBackend()


def _entry_source(plan: ExecutionPlan) -> Callable[[str], str] | None:
    """backends/c/c_entry.py's writer of the plan's CPython entry, imported when first needed
    (with the product and gather emitters it uses: a warm build writes no C)."""
    from graphkernel.backends.c.c_entry import entry_source
    return entry_source(plan)


def _tile_of(config: CConfig) -> ConvTile:
    return ConvTile(config.conv_channel_vectors, config.conv_pixels,
                    config.conv_tap_chunk_bytes)


def images_note(conv: Node, block: bool, config: CConfig, in_stores: bool = False) -> str:
    """Where a convolution kernel's images run (c_images.image_loop), for the plan's schedule
    notes: on threads from `window_parallel_min_macs` multiply-adds a call, else on the calling
    thread; a batch of one shares its image out (c_window.image_split_note) on the same rule.
    `block`: the kernel is a conv block; `in_stores`: its epilogue runs in the units' stores."""
    from graphkernel.backends.c.c_window import image_split_note
    threshold = config.window_parallel_min_macs
    n = conv.inputs[0].shape[0]
    per_image = math.prod(conv.shape[1:]) * math.prod(conv.inputs[1].shape[1:])
    if not isinstance(n, int):
        return (f"a dynamic batch: its images on threads from window_parallel_min_macs "
                f"{threshold} multiply-adds a call ({per_image} an image)")
    macs = n * per_image
    if n == 1 and macs >= threshold:
        return image_split_note(conv, block, _tile_of(config), in_stores)
    where = "on threads" if n > 1 and macs >= threshold else "on the calling thread"
    # the split note says where a conv block's epilogue runs; the others say it here
    epilogue = ("; the epilogue in each unit's stores" if block and in_stores else
                "; the epilogue in each unit's work item" if block else "")
    return (f"{'a batch of one' if n == 1 else f'{n} images'} {where} ({macs} multiply-adds, "
            f"window_parallel_min_macs {threshold}){epilogue}")


def _store_choice(config: CConfig) -> bool | None:
    """CConfig.conv_store_epilogue as emit_conv_block takes it (None: the rule)."""
    return None if config.conv_store_epilogue is None else bool(config.conv_store_epilogue)


def _in_stores(spec: KernelSpec, config: CConfig) -> bool:
    """Whether a conv block's kernel applies its epilogue in the units' stores."""
    if spec.kind is not KernelKind.CONV_BLOCK or spec.block is None:
        return False
    from graphkernel.backends.c.c_conv_block import epilogue_in_stores
    return epilogue_in_stores(spec.block, _layout_of(spec.node)[0], _store_choice(config))


def _convolution_of(spec: KernelSpec) -> Node | None:
    """The convolution a window kernel or conv block runs (None for other kernels)."""
    if spec.kind not in (KernelKind.WINDOW, KernelKind.CONV_BLOCK):
        return None
    from graphkernel.backends.c.c_window import why_not_window_kernel
    conv = spec.block.conv if spec.kind is KernelKind.CONV_BLOCK and \
        spec.block is not None else spec.node
    if why_not_window_kernel(conv) is None and get_op(conv.op).window is Window.CONVOLUTION:
        return conv
    return None


def _product_shapes(plan: ExecutionPlan) -> list[blas_choice.GemmShape]:
    """Each product's shape as its library runs it (the one the BLAS library is chosen for)."""
    calls = (gemm_call(plan, s) for s in plan.steps if s.kind is StepKind.LIBRARY)
    return [shape for call in calls if call is not None
            and (shape := library_shape(call)) is not None]


def _workspace_bytes(spec: KernelSpec) -> int:
    """A convolution kernel's workspace: its repacked weights, kept between calls (a block's
    convolution is always ours: c_window.conv_library chooses for window kernels)."""
    from graphkernel.backends.c.c_window import workspace_bytes
    if spec.block is not None:
        return workspace_bytes(spec.block.conv, library_choice=False)
    return workspace_bytes(spec.node)


def _prepacked_bytes(slots: Sequence[Slot], step: Step) -> int:
    """A product's workspace of B's panels packed once (c_gemm_packed.py `prepacked_bytes`;
    0: none). Only the compiled entry reads it: a product's step function of the Python runner
    reads its two operands alone."""
    call = gemm_call_of(slots, step)
    return 0 if call is None else prepacked_bytes(call)


_HEX32 = re.compile(r"[0-9a-f]{32}")
_MODULE = re.compile(r"gk_[0-9a-f]{24}")
# blas_choice.GemmLibrary.label: a name and a version; or one of the entry's own kernels
_GEMM_LABEL = re.compile(r"(openblas|mkl) [0-9A-Za-z.+_-]{1,40}|" + re.escape(SMALL_PRODUCT_LABEL)
                         + "|" + re.escape(PACKED_PRODUCT_LABEL) + "|"
                         + re.escape(PACKED_COPIED_A_LABEL) + "|"
                         + re.escape(ROW_PRODUCT_LABEL))
MKL_LABEL = "mkl "


def _record_problem(record: dict[str, object], plan: ExecutionPlan, specs: list[KernelSpec]
                    ) -> str | None:
    """What is wrong with a plan record's fields for `plan` (None: nothing). Only values
    checked here are used: cache keys and a module name as hex digits, product steps by
    number, BLAS libraries by graphkernel's own labels."""
    names = [s.name for s in specs]

    def key_like(value: object) -> bool:
        return isinstance(value, str) and _HEX32.fullmatch(value) is not None

    if not key_like(record.get("library_key")) or not key_like(record.get("mark")):
        return "its library key or mark is not a cache key"
    module = record.get("module")
    if module is not None and not (isinstance(module, str) and _MODULE.fullmatch(module)):
        return "its entry module's name is not one graphkernel gives"
    if record.get("kernels") != names:
        return "its kernels are not this plan's"
    if not isinstance(record.get("openmp"), bool):
        return "its OpenMP flag is not true or false"
    tuning = record.get("tuning")
    if not (isinstance(tuning, dict) and sorted(tuning) == sorted(names) and
            all(v is None or key_like(v) for v in tuning.values())):
        return "its tuning records are not one per kernel, each a record key or null"
    gemm = record.get("gemm")
    if not (isinstance(gemm, dict) and all(
            isinstance(i, str) and i.isdigit() and int(i) < len(plan.steps) and
            plan.steps[int(i)].op in ("MatMul", "BatchMatMul") and
            "gemm_library" not in plan.steps[int(i)].attrs and
            isinstance(label, str) and _GEMM_LABEL.fullmatch(label)
            for i, label in gemm.items())):
        return "its BLAS libraries are not one label per product step"
    return None


def _gemm_labels(plan: ExecutionPlan) -> dict[str, str]:
    """The BLAS library writing the entry chose for each product step, by step number."""
    return {str(i): str(step.attrs["gemm_library"]) for i, step in enumerate(plan.steps)
            if "gemm_library" in step.attrs}


def _note_gemm_labels(plan: ExecutionPlan, labels: Mapping[str, str], on: bool) -> None:
    """Note (`on`) or take back each product step's BLAS library, as writing the entry notes
    it (backends/c/c_gemm.py `with_library`)."""
    for index, label in labels.items():
        attrs = plan.steps[int(index)].attrs
        assert isinstance(attrs, dict)  # the builder's own, as writing the entry finds it
        if on:
            attrs["gemm_library"] = label
        else:
            attrs.pop("gemm_library", None)


def _module_of(library: BuiltLibrary) -> str | None:
    module = library.entry_module
    return None if module is None else module.__name__


def _mark(key: str, specs: list[KernelSpec], choices: Mapping[str, Choice],
          plan: ExecutionPlan) -> str:
    """What a library built for plan `key` is marked with: the plan key, each kernel's knobs
    (a tuned kernel's C differs) and each product's BLAS library (the entry's C calls it),
    known once the entry is written."""
    knobs = [[s.name, dataclasses.asdict(choices[s.name].knobs) if s.name in choices else None]
             for s in specs]
    text = "\0".join((key, json.dumps(knobs, sort_keys=True),
                      json.dumps(_gemm_labels(plan), sort_keys=True)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# Bumped when what a plan key covers changes shape. 2: the graph's data taken before lowering,
# its source locations in a table left out (`serialize.code_text`)
PLAN_KEY_VERSION = 2


def graph_code_digest(graph: Graph) -> str | None:
    """A hash of what of `graph` decides its code: its data (`serialize.code_text`, source
    locations left out) and its constants' bytes. The compile cache computes the same of the
    data it writes and reads. None when the graph is not data: it is then always built from its
    C."""
    try:
        data, arrays = graph_to_data(graph, tables=True)
        return cache.digest((code_text(data),), arrays)
    except (FormatError, TypeError, ValueError):
        return None


def plan_key(code_digest: str, plan: ExecutionPlan, config: CConfig) -> str:
    """What decides the C of `plan` under `config`, as a hash: the graph it was made of
    (`graph_code_digest` of the graph handed to the build), the plan, the settings, the
    toolchain and graphkernel's version (the same on any machine with them: a prebuilt library
    from an export is built with the same mark). Computed before the entry is written (which
    notes each product's BLAS library)."""
    specs = [[s.name, s.kind.value, s.workspace, s.beside_blas, _conv_library_label(s)]
             for s in (step.kernel for step in plan.steps) if s is not None]
    return cache.digest(("graphkernel plan key", str(PLAN_KEY_VERSION), toolchain_text(),
                         json.dumps(dataclasses.asdict(config), sort_keys=True, default=repr),
                         code_digest, plan.describe(), json.dumps(specs), _entry_blas(plan)),
                        {})


def _conv_library_label(spec: KernelSpec) -> str:
    """Which library runs a window kernel's convolution, and on which layout: stored timings
    decide it and can change between two builds of one plan, and it changes the C."""
    conv = _convolution_of(spec)
    if conv is None or spec.kind is not KernelKind.WINDOW:
        return ""
    from graphkernel.backends.c.c_window import conv_library
    choice = conv_library(conv)
    return f"{choice.library} blocked={choice.blocked}"


def _entry_blas(plan: ExecutionPlan) -> str:
    """For a plan with products: numpy's BLAS as the entry's writer finds it (none: no entry;
    its integer width shapes the calls), as text; "" without products."""
    if not any(s.kind is StepKind.LIBRARY and s.op in ("MatMul", "BatchMatMul")
               for s in plan.steps):
        return ""
    blas = numpys_blas.cblas()  # the entry's writer asks the same (c_entry.py)
    return "numpy's BLAS: none" if blas is None else f"numpy's BLAS: int64={blas.int64}"


def record_key(key: str) -> str:
    """Where plan `key`'s record is, for this code: the plan key with graphkernel's sources
    (an edited emitter is another library), the MKL wheel in this environment and the OpenMP
    threads (writing the entry chooses each product's BLAS library from them)."""
    text = "\0".join((key, cache.code_stamp(), " ".join(blas_choice.mkl_wheel_files()),
                      str(blas_choice.openmp_threads())))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class _KernelSources(Mapping[str, str]):
    """Each kernel's C for reports, written the first time one is asked for (a warm build
    writes none)."""

    def __init__(self, write: Callable[[], list[KernelSource]]) -> None:
        self._write = write
        self._sources: dict[str, str] | None = None

    def _all(self) -> dict[str, str]:
        if self._sources is None:
            self._sources = {k.name: k.source for k in self._write()}
        return self._sources

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())
