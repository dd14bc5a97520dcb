"""The C backend: answers lowering's questions (which window, argmax and conv-block kernels
its generated C covers), emits each kernel spec as C, compiles a plan's kernels and its CPython
entry into one library (cached) and loads it into the runner."""
from __future__ import annotations

import dataclasses
import os
import warnings

from graphkernel.backends.c import cache, calibration, toolchain
from graphkernel.backends.c.c_argmax import emit_argmax_kernel, why_not_argmax_kernel
from graphkernel.backends.c.c_conv_block import NOTE as CONV_BLOCK_NOTE
from graphkernel.backends.c.c_conv_block import conv_blocks, emit_conv_block
from graphkernel.backends.c.c_entry import entry_source
from graphkernel.backends.c.c_loops import KernelSource
from graphkernel.backends.c.c_window import (
    conv_library,
    emit_window_kernel,
    tune_conv_libraries,
    why_not_window_kernel,
    workspace_bytes,
)
from graphkernel.backends.c.cblas import hand_blas_to
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.generic_kernel import emit_any_kernel
from graphkernel.backends.c.library import build_library
from graphkernel.backends.c.parallel_kernel import emit_parallel_kernel
from graphkernel.backends.c.tuning import choose_schedules
from graphkernel.graph_kernel.lower import ConvBlock, KernelKind, lower
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.ir.graph import Graph, Node
from graphkernel.ir.opset import Window, get_op
from graphkernel.runtime.builder import plan_graph
from graphkernel.runtime.executable import Executable
from graphkernel.runtime.plan import KernelSpec
from graphkernel.runtime.runner import Runner

_warned_no_compiler = False


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
        return why_not_window_kernel(node)

    def why_not_argmax_kernel(self, node: Node) -> str | None:
        return why_not_argmax_kernel(node)

    def conv_blocks(self, graph: Graph) -> dict[int, ConvBlock]:
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
        if kind is KernelKind.CONV_BLOCK:
            assert spec.block is not None
            return emit_conv_block(spec.block, spec.name, config.window_parallel_min_macs)
        if kind is KernelKind.WINDOW:
            return emit_window_kernel(spec.node, spec.name, config.window_parallel_min_macs,
                                      spec.workspace)
        if kind is KernelKind.ARGMAX:
            return emit_argmax_kernel(spec.node, spec.name)
        assert spec.group is not None
        if isinstance(spec.schedule, ParallelSchedule):  # independent groups, a nest each
            return emit_parallel_kernel(spec.group, spec.name, spec.schedule,
                                        config.parallel_threshold, config.stream_min_bytes,
                                        config.prefetch_min_bytes, spec.beside_blas)
        return emit_any_kernel(spec.group, spec.name, spec.schedule, config.parallel_threshold,
                               config.stream_min_bytes, config.prefetch_min_bytes,
                               spec.beside_blas)

    def build_executable(self, graph: Graph, name: str, config: CConfig,
                         prebuilt: tuple[str, bytes] | None = None,
                         tuning_level: int = 0) -> Executable:
        """Plan `graph`, compile its kernels (one library, cached) and ready the runners.
        `prebuilt`: a library built elsewhere for the same source, by its cache key (see
        `build_library`)."""
        global _warned_no_compiler
        if toolchain.detect() is None and not _warned_no_compiler:
            warnings.warn("graphkernel: no C compiler found (set CC or install gcc); fused "
                          "kernels run op by op on numpy, correct but slow. `graphkernel "
                          "doctor` says more.", RuntimeWarning, stacklevel=3)
            _warned_no_compiler = True
        if graph.lowered_for != self.name:
            lower(graph, self)
        if tuning_level > 0:  # the library of each convolution kernel, timed (else stored)
            tune_conv_libraries([n for n in graph.nodes if n.lowering is not None and
                                 n.lowering.kind is KernelKind.WINDOW and
                                 get_op(n.op).window is Window.CONVOLUTION], tuning_level)
        plan, notes = plan_graph(graph, name, config.plan, _workspace_bytes)
        # buffers readied while gcc runs
        runner = Runner(plan, prefault=config.plan.prefault_buffers)
        specs = [s.kernel for s in plan.steps if s.kernel is not None]
        choices = {}
        if specs and toolchain.detect() is not None:
            # Each kernel's schedule: a record of this machine's, measured now, or the defaults
            choices = choose_schedules(plan, config, tuning_level, self.emit)
            plan.schedule_notes.update({n: c.how for n, c in choices.items()
                                        if c.how != "defaults"})
            notes += [c.refused for c in choices.values() if c.refused is not None]
        for spec in specs:  # which library runs each convolution kernel, and why
            conv = spec.block.conv if spec.kind is KernelKind.CONV_BLOCK and \
                spec.block is not None else spec.node
            if spec.kind in (KernelKind.WINDOW, KernelKind.CONV_BLOCK) and \
                    why_not_window_kernel(conv) is None and \
                    get_op(conv.op).window is Window.CONVOLUTION:
                tuned = plan.schedule_notes.get(spec.name)
                plan.schedule_notes[spec.name] = (f"{tuned}; " if tuned else "") + \
                    f"convolution on {conv_library(conv).why}"
        kernels = [self.emit(spec, config) if spec.name not in choices else
                   choices[spec.name].source or
                   self.emit(spec, choices[spec.name].knobs.apply(config)) for spec in specs]
        library = None
        if kernels:
            library = build_library(kernels, entry_source(plan), prebuilt)
            hand_blas_to(library.entry_module)
            runner.load(library)
        if prebuilt is not None and (library is None or os.path.basename(library.path) !=
                                     prebuilt[0] + cache.LIBRARY_SUFFIX):
            notes.append("the prebuilt library is not the one these kernels build (its source "
                         "differs): not used, compiled here")
        return Executable(plan, runner, library, notes, {k.name: k.source for k in kernels})


BACKEND = CBackend()


def _workspace_bytes(spec: KernelSpec) -> int:
    """A convolution kernel's workspace: its repacked weights, kept between calls (a block's
    convolution is always ours: c_window.conv_library chooses for window kernels)."""
    if spec.block is not None:
        return workspace_bytes(spec.block.conv, library_choice=False)
    return workspace_bytes(spec.node)
