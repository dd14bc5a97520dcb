"""Identical fused groups share one compiled kernel (backends/c/shared_kernels.py): a stack of
identical layers compiles its layer's kernels once, and groups whose code would differ (an
attribute, a constant, a shape) never share."""
from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cells import Stack

import graphkernel
from bench.real_models import encoder_params, gk_encoder
from graphkernel import nn
from graphkernel.backends.c import toolchain
from graphkernel.backends.c.backend import BACKEND, CBackend
from graphkernel.backends.c.config import CConfig
from graphkernel.backends.c.shared_kernels import EmitOnce, spec_key
from graphkernel.graph_kernel.index_maps import IndexMap
from graphkernel.graph_kernel.lower import ConvBlock, KernelKind
from graphkernel.graph_kernel.parallel_fusion import ParallelSchedule
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.graph_kernel.schedule import Schedule
from graphkernel.ir.graph import Constant
from graphkernel.ir.types import TensorType
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import KernelSpec, PlanSettings

ON = CompileOptions(enable_graph_kernel=True)
pytestmark = pytest.mark.skipif(toolchain.detect() is None, reason="needs a C compiler")

# A kernel's own body starts on a line of its own; a shared one's forward is one line.
_BODY = re.compile(r"^void (gk_\w+)\(void \*const \*args\) \{$", re.M)
_FORWARD = re.compile(r"^void (gk_\w+)\(void \*const \*args\) \{ (gk_\w+)\(args\); \}$", re.M)


def _functions(compiled: Any) -> tuple[set[str], dict[str, str]]:
    """The kernel functions compiled with code of their own, and each forward's target."""
    source = compiled.executable.library.source
    return set(_BODY.findall(source)), dict(_FORWARD.findall(source))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


OFF = CompileOptions(enable_graph_kernel=False)


def test_a_deeper_stack_compiles_no_more_kernel_functions() -> None:
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    counts = {}
    for depth in (1, 4):
        net = Stack(depth)
        compiled = graphkernel.compile(net, x, options=ON)
        bodies, forwards = _functions(compiled)
        counts[depth] = len(bodies)
        # every planned kernel is one of the compiled bodies or a forward to one
        planned = {s.kernel.name for s in compiled.plan.kernel_steps() if s.kernel is not None}
        assert planned == bodies | set(forwards)
        assert set(forwards.values()) <= bodies
        unfused = graphkernel.compile(net, x, options=OFF)
        np.testing.assert_allclose(compiled.run_arrays(x)[0], unfused.run_arrays(x)[0],
                                   rtol=1e-4, atol=1e-5)
    assert counts[4] == counts[1] >= 1, counts


class Variants(nn.Cell):
    """Four groups of the same ops: `b` is `a` again (shared); `c` differs only in a constant,
    `d` in the softmax axis, `e` in its input's shape: none of those may share `a`'s code."""

    def __init__(self) -> None:
        super().__init__()
        self.exp, self.tanh = P.Exp(), P.Tanh()
        self.rows, self.cols = P.Softmax(axis=-1), P.Softmax(axis=0)
        self.matmul = P.MatMul()

    def construct(self, x: Any, y: Any, z: Any) -> Any:
        a = self.rows(self.tanh(x * 2.0) + 1.0)
        # products between the groups keep them apart (each its own kernel)
        b = self.rows(self.tanh(self.matmul(a, y) * 2.0) + 1.0)
        c = self.rows(self.tanh(self.matmul(b, y) * 3.0) + 1.0)
        d = self.cols(self.tanh(self.matmul(c, y) * 2.0) + 1.0)
        e = self.rows(self.tanh(self.matmul(z, d) * 2.0) + 1.0)
        return a, b, c, d, e


def test_groups_differing_in_an_attribute_a_constant_or_a_shape_are_not_shared() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    y = rng.standard_normal((8, 8)).astype(np.float32)
    z = rng.standard_normal((4, 8)).astype(np.float32)
    compiled = graphkernel.compile(Variants(), x, y, z, options=ON)
    bodies, forwards = _functions(compiled)
    # exactly one group (b) reuses another's code; a, c, d, e each have their own
    assert len(forwards) == 1, (sorted(bodies), forwards)
    assert len(bodies) == 4, sorted(bodies)
    a = _softmax(np.tanh(x * 2.0) + 1.0)
    b = _softmax(np.tanh(a @ y * 2.0) + 1.0)
    c = _softmax(np.tanh(b @ y * 3.0) + 1.0)
    d = np.tanh(c @ y * 2.0) + 1.0
    d = np.exp(d - d.max(0, keepdims=True))
    d = d / d.sum(0, keepdims=True)
    e = _softmax(np.tanh(z @ d * 2.0) + 1.0)
    for got, want in zip(compiled.run_arrays(x, y, z), (a, b, c, d, e)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# -- one emission per distinct kernel (spec_key, EmitOnce) ------------------------------------

def _variants_spec() -> tuple[Any, Any]:
    """The first kernel of `Variants` (Mul, Tanh, Add by constants, a row softmax) and the
    config it is emitted under."""
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    z = rng.standard_normal((4, 8)).astype(np.float32)
    compiled = graphkernel.compile(Variants(), x, y, z, options=ON)
    spec = next(s.kernel for s in compiled.plan.steps if s.kernel is not None)
    return spec, BACKEND.default_config()


def _group_changes(spec: Any) -> dict[str, Callable[[Any], None]]:
    """One change per ingredient of a group's C: each edits a copy of `spec` in place."""
    nodes = lambda s: s.group.nodes  # noqa: E731
    reduce_max = next(i for i, n in enumerate(spec.group.nodes) if n.op == "ReduceMax")

    def set_type(s: Any, shape: tuple[int, ...], dtype: Any) -> None:
        s.group.inputs[0].type = TensorType(shape, np.dtype(dtype))

    def constant(s: Any, value: Any) -> None:
        const = nodes(s)[0].inputs[1]
        assert isinstance(const, Constant)
        const.value = np.asarray(value)

    def array_constant(s: Any, last: float) -> None:
        old, new = nodes(s)[0].inputs[1], Constant(np.array([2.0] * 7 + [last], np.float32))
        nodes(s)[0].inputs[1] = new
        s.schedule.aligned[new.uid] = s.schedule.aligned.pop(old.uid)

    return {
        "op": lambda s: setattr(nodes(s)[1], "op", "Sigmoid"),
        "attribute": lambda s: nodes(s)[reduce_max].attrs.update(keep_dims=False),
        "attribute's type": lambda s: nodes(s)[reduce_max].attrs.update(axis=-1.0),
        "dtype": lambda s: set_type(s, (8, 8), np.float64),
        "shape": lambda s: set_type(s, (8, 16), np.float32),
        "a node's type": lambda s: setattr(nodes(s)[1], "type", TensorType((8, 16), np.dtype(
            np.float32))),
        "wiring": lambda s: nodes(s)[-1].inputs.reverse(),
        "scalar constant": lambda s: constant(s, np.float32(3.0)),
        "constant's dtype": lambda s: constant(s, np.float64(2.0)),
        "outputs": lambda s: s.group.outputs.append(nodes(s)[1]),
        # an array constant, and the same array with its last element changed
        "array constant": lambda s: array_constant(s, 2.5),
        "array constant's element": lambda s: array_constant(s, 3.5),
    }


def _schedule_changes(spec: Any) -> dict[str, Callable[[Any], None]]:
    """One change per field of Schedule."""
    first = spec.group.nodes[0].uid
    return {
        "space": lambda s: setattr(s.schedule, "space", (8, 16)),
        "reduce_axes": lambda s: setattr(s.schedule, "reduce_axes", (0,)),
        "aligned": lambda s: s.schedule.aligned.update({first: (1, 8)}),
        "outer_phase": lambda s: s.schedule.outer_phase.update({first: 1}),
        "phases": lambda s: s.schedule.phases.reverse(),
        "maps": lambda s: s.schedule.maps.update(
            {first: IndexMap(s.group.inputs[0], 0, (1, 8))}),
        "concats": lambda s: s.schedule.concats.update({first: (1, ((s.group.inputs[0], 0),))}),
        "tiles": lambda s: s.schedule.tiles.update({first: (s.group.inputs[0], (8, 8))}),
    }


def test_a_kernels_key_changes_with_each_thing_its_c_is_written_from() -> None:
    spec, config = _variants_spec()
    base = spec_key(spec, config)
    assert base is not None
    assert spec_key(copy.deepcopy(spec), config) == base  # a copy is the same kernel
    assert spec_key(dataclasses.replace(spec, name="gk_elsewhere"), config) == base
    group, schedule = _group_changes(spec), _schedule_changes(spec)
    # every field of the schedule is covered: a new one must be added here (and to the key)
    assert set(schedule) == {f.name for f in dataclasses.fields(Schedule)}
    keys = {"": base}
    for what, change in {**group, **schedule}.items():
        changed = copy.deepcopy(spec)
        change(changed)
        keys[what] = spec_key(changed, config)
        assert keys[what] is not None, what
    # the spec's own fields (its name and the composite it came from are not the C's)
    block = lambda s: ConvBlock(s.group.nodes[0], s.group.nodes[1], None)  # noqa: E731
    fields = {"kind": KernelKind.SINGLE_OP, "workspace": True, "beside_blas": True,
              "block": block}
    assert set(fields) | {"name", "node", "group", "schedule"} == \
        {f.name for f in dataclasses.fields(KernelSpec)}
    for name, value in fields.items():
        changed = copy.deepcopy(spec)
        keys[f"spec {name}"] = spec_key(dataclasses.replace(
            changed, **{name: value(changed) if callable(value) else value}), config)
    # every knob of the config, the plan's settings too
    knobs = {"parallel_threshold": 1, "stream_min_bytes": None, "prefetch_min_bytes": None,
             "window_parallel_min_macs": 1, "vector_width": 256,
             "prefetch_distance_bytes": 8192, "pointwise_chunk": 128, "row_pipeline_rows": 8,
             "row_block": 512, "column_block": 256, "conv_channel_vectors": 3, "conv_pixels": 8,
             "conv_store_epilogue": 1, "conv_tap_chunk_bytes": 0}
    plan = {"blas_parallel_min_mnk": None, "serial_beside_blas": False,
            "prefault_buffers": False}
    assert set(knobs) | {"plan"} == {f.name for f in dataclasses.fields(CConfig)}
    assert set(plan) == {f.name for f in dataclasses.fields(PlanSettings)}
    for name, value in knobs.items():
        assert getattr(config, name) != value
        keys[f"config {name}"] = spec_key(spec, dataclasses.replace(config, **{name: value}))
    for name, value in plan.items():
        keys[f"plan {name}"] = spec_key(spec, dataclasses.replace(
            config, plan=dataclasses.replace(config.plan, **{name: value})))
    assert all(key is not None for key in keys.values()), keys
    assert len(set(keys.values())) == len(keys), \
        [w for w in keys if list(keys.values()).count(keys[w]) > 1]


def _training_step_specs(depth: int) -> tuple[list[Any], Any]:
    net = gk_encoder(encoder_params(depth, 32, 64), 2, 8, 32, 2)

    class WithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.sum, self.square = net, P.ReduceSum(), P.Square()

        def construct(self, x: Any, target: Any) -> Any:
            return self.sum(self.square(self.net(x) - target))

    loss = WithLoss()
    step = nn.TrainOneStepCell(loss, nn.Adam(loss.trainable_params(), 1e-3))
    step.set_train(True)
    x = np.random.default_rng(0).standard_normal((2, 8, 32)).astype(np.float32)
    compiled = graphkernel.compile(step, x, x, options=ON)
    specs = [s.kernel for s in compiled.plan.steps if s.kernel is not None]
    return specs, BACKEND.default_config()


def test_kernels_emitted_once_have_the_c_their_own_emission_writes() -> None:
    """Every kernel of a 3-layer encoder's training step (loop nests, parallel kernels of
    several nests, single ops): its C from EmitOnce is the text its own emission writes."""
    specs, config = _training_step_specs(3)
    assert any(isinstance(s.schedule, ParallelSchedule) for s in specs)
    once = EmitOnce(BACKEND.emit)
    for spec in specs:
        shared, own = once(spec, config), BACKEND.emit(spec, config)
        assert (shared.name, shared.source) == (own.name, own.source), spec.name
    assert once.emitted + once.bound == len(specs)
    assert once.bound >= len(specs) // 2, (once.emitted, once.bound)
    # a parallel kernel's nests are part of its key
    parallel = next(s for s in specs if isinstance(s.schedule, ParallelSchedule))
    changed = copy.deepcopy(parallel)
    nest = changed.schedule.nests[0]
    changed.schedule.nests[0] = dataclasses.replace(nest, args=nest.args[::-1])
    assert spec_key(changed, config) not in (None, spec_key(parallel, config))


def test_identical_layers_have_their_kernels_c_written_once(
        cache_folder: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cold compile of a 4-layer stack runs the emitter as often as one of 1 layer."""
    runs: list[str] = []
    emit = CBackend._emit

    def counted(self: Any, spec: Any, config: Any) -> Any:
        runs.append(spec.name)
        return emit(self, spec, config)

    monkeypatch.setattr(CBackend, "_emit", counted)
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    emitted, kernels = {}, {}
    for depth in (1, 4):
        runs.clear()
        compiled = graphkernel.compile(Stack(depth), x, options=ON)
        emitted[depth] = len(runs)
        kernels[depth] = len([s for s in compiled.plan.kernel_steps() if s.kernel is not None])
        unfused = graphkernel.compile(Stack(depth), x, options=OFF)
        np.testing.assert_allclose(compiled.run_arrays(x)[0], unfused.run_arrays(x)[0],
                                   rtol=1e-4, atol=1e-5)
    assert kernels[4] > kernels[1], kernels
    assert emitted[4] == emitted[1] >= 1, (emitted, kernels)
