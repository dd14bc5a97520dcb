"""The numpy backend (`set_context(backend="numpy")`): what graphkernel runs without a C
compiler, as a backend of its own. Lowering (graph_kernel/lower.py) asks it for kernels and
gets none: each fused group runs op by op on numpy over whole arrays (an INTERPRETED step of
the plan, runtime/reference.py), each other op as its numpy reference (BLAS for a product).
Fusion still runs, so its dumps and reports show the same groups as the C backend's; the
results are the reference the C kernels are compared with."""
from __future__ import annotations

from graphkernel.errors import CompileError
from graphkernel.graph_kernel.lower import ConvBlock, lower
from graphkernel.ir.graph import Graph, Node
from graphkernel.runtime.builder import plan_graph
from graphkernel.runtime.executable import Executable
from graphkernel.runtime.plan import KernelSpec, PlanSettings
from graphkernel.runtime.runner import Runner

NO_KERNELS = "the numpy backend: each op runs vectorised on numpy"


class NumpyBackend:
    name = "numpy"
    config_type = PlanSettings  # no kernels of its own: only how the plan runs

    def default_config(self) -> PlanSettings:
        return PlanSettings()

    def why_not_kernels(self) -> str | None:
        return NO_KERNELS

    def why_not_window_kernel(self, node: Node) -> str | None:
        return NO_KERNELS

    def why_not_argmax_kernel(self, node: Node) -> str | None:
        return NO_KERNELS

    def conv_blocks(self, graph: Graph) -> dict[int, ConvBlock]:
        return {}

    def why_not_blocked(self, conv: Node, side: str) -> str | None:
        return "numpy reads and writes NCHW"

    def channel_block(self, conv: Node) -> int:
        return 1

    def conv_form(self, conv: Node, input_blocked: bool, output_blocked: bool) -> str | None:
        return None

    def emit(self, spec: KernelSpec, config: PlanSettings) -> None:
        # Lowering for this backend chooses no kernel (why_not_kernels), so a plan it made
        # holds no KernelSpec; one lowered for another backend is not this backend's to run.
        raise CompileError(f"kernel {spec.name} ({spec.kind.value}) was lowered for another "
                           "backend: the numpy backend builds no kernels")

    def build_executable(self, graph: Graph, name: str, config: PlanSettings,
                         prebuilt: tuple[str, bytes] | None = None,
                         tuning_level: int = 0, code_digest: str | None = None) -> Executable:
        # no kernels, so no schedule choices: tuning_level has nothing to tune, and no
        # library to find by code_digest
        if graph.lowered_for != self.name:
            lower(graph, self)
        plan, notes = plan_graph(graph, name, config)
        for step in plan.steps:
            if step.kernel is not None:
                self.emit(step.kernel, config)
        if prebuilt is not None:
            notes.append("the export's prebuilt library is C: the numpy backend does not use it")
        return Executable(plan, Runner(plan, prefault=config.prefault_buffers), None, notes)


BACKEND = NumpyBackend()
