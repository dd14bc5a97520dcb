"""The backend boundary: lowering as the last stage (its choices in the dumps, on the graph and
in the plan), and the same programs on both backends (generated C and numpy) giving the numpy
reference's results."""
import os

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.errors import ContextError
from graphkernel.frontend import context
from graphkernel.graph_kernel.lower import KernelKind
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import PlanSettings

BACKENDS = ["c", "numpy"]


class Fn(nn.Cell):
    def __init__(self, fn, **prims):
        super().__init__()
        self.fn = fn
        for name, prim in prims.items():
            setattr(self, name, prim)

    def construct(self, *xs):
        return self.fn(self, *xs)


class ConvBlock(nn.Cell):
    """Conv-BatchNorm-ReLU-pool: one conv block kernel on the C backend."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)

    def construct(self, x):
        return self.pool(self.relu(self.bn(self.conv(x))))


def _gelu(v):
    return 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))


def _cases(rng):
    x = rng.standard_normal((24, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    e = np.exp(x - x.max(-1, keepdims=True))
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return {
        "bias_gelu": (Fn(lambda s, x, b: s.gelu(s.bias(x, b)), bias=P.BiasAdd(), gelu=P.GeLU()),
                      (x, b), _gelu(x + b)),
        "softmax": (nn.Softmax(-1), (x,), e / e.sum(-1, keepdims=True)),
        "layernorm": (nn.LayerNorm((40,)), (x,), (x - mean) / np.sqrt(var + 1e-7)),
        "reduce": (Fn(lambda s, x: s.sum(s.exp(x), 0), sum=P.ReduceSum(), exp=P.Exp()), (x,),
                   np.exp(x).sum(0)),
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["bias_gelu", "softmax", "layernorm", "reduce"])
def test_fused_programs_match_numpy_on_each_backend(backend, name, rng):
    cell, arrays, want = _cases(rng)[name]
    exe = graphkernel.compile(cell, *arrays,
                              options=CompileOptions(enable_graph_kernel=True, backend=backend))
    np.testing.assert_allclose(exe.run_arrays(*arrays)[0], want, rtol=1e-4, atol=1e-5)
    (kernel,) = exe.kernels  # one fused group on either backend
    assert kernel.backend == ("native" if backend == "c" else "interpreted")
    kinds = {n.lowering.kind for n in exe.graph.nodes} - {KernelKind.ITEM}  # LayerNorm's [0]
    assert kinds == ({KernelKind.LOOP_NEST} if backend == "c" else {KernelKind.INTERPRETED})


@pytest.mark.parametrize("backend", BACKENDS)
def test_conv_net_and_mlp_agree_across_backends(backend, rng):
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    conv = ConvBlock()
    c = graphkernel.compile(conv, x, options=CompileOptions(enable_graph_kernel=True))
    other = graphkernel.compile(conv, x, options=CompileOptions(enable_graph_kernel=True,
                                                                backend=backend))
    np.testing.assert_allclose(other.run_arrays(x)[0], c.run_arrays(x)[0], rtol=1e-4,
                               atol=1e-5)
    kinds = [n.lowering.kind for n in other.graph.nodes]
    if backend == "c":  # the convolution, its epilogue and the pool: one kernel
        assert kinds.count(KernelKind.CONV_BLOCK) == 1 and len(other.kernels) == 1
    else:
        assert KernelKind.CONV_BLOCK not in kinds and other.library_path is None
        assert all(k.backend != "native" for k in other.kernels)


def test_lowering_is_the_last_stage_in_dumps_and_plan(tmp_path, rng):
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    cell = Fn(lambda s, x, w: s.tanh(s.mm(s.exp(x), w)), mm=P.MatMul(), tanh=P.Tanh(),
              exp=P.Exp())
    context.set_context(enable_graph_kernel=True, save_graphs=True,
                        save_graphs_path=str(tmp_path))
    exe = graphkernel.compile(cell, x, w)
    assert list(exe.stages)[-2:] == ["hwopt_d_end", "hwopt_e_lower"]
    dump = (tmp_path / "hwopt_e_lower.ir").read_text()
    assert "lowering: library: its numpy reference" in dump  # the MatMul
    assert "lowering: single op: one op as one loop nest" in dump  # Exp and Tanh, each alone
    assert "lowering:" not in (tmp_path / "hwopt_d_end.ir").read_text()
    plan = exe.executable.plan.describe()
    assert plan.count("# single op") == 2 and plan.count("# library") == 1
    plan_files = [f for f in os.listdir(tmp_path / "kernel_meta") if f.endswith(".plan.txt")]
    assert "# single op" in (tmp_path / "kernel_meta" / plan_files[0]).read_text()


def test_set_context_backend_numpy_runs_without_generated_kernels(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    cell = Fn(lambda s, x: s.mul(s.exp(x), 2.0), mul=P.Mul(), exp=P.Exp())
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=True, backend="numpy")
    got = cell(Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, np.exp(x) * 2, rtol=1e-6)
    exe = graphkernel.compile(cell, x)
    assert exe.library_path is None
    assert [n.lowering.reason for n in exe.graph.nodes] == [
        "the numpy backend: each op runs vectorised on numpy"]


def test_unknown_backend_is_a_context_error():
    with pytest.raises(ContextError, match="backend must be one of 'c', 'numpy'"):
        context.set_context(backend="cuda")


def test_a_backend_takes_only_its_own_settings(rng):
    """`CompileOptions.backend_config` is typed by the backend it is for: the C backend's
    settings given to the numpy backend are refused before anything compiles."""
    x = rng.standard_normal((4, 8)).astype(np.float32)
    wrong = CompileOptions(enable_graph_kernel=True, backend="numpy", backend_config=CConfig())
    with pytest.raises(ContextError, match="backend_config is a CConfig; the numpy backend "
                       "takes a PlanSettings"):
        graphkernel.compile(_Softmax(), x, options=wrong)
    right = CompileOptions(enable_graph_kernel=True, backend="numpy",
                           backend_config=PlanSettings(prefault_buffers=False))
    got = graphkernel.compile(_Softmax(), x, options=right).run_arrays(x)[0]
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True), rtol=1e-5)


class _Softmax(nn.Cell):
    def construct(self, x):
        return P.Softmax()(x)


def test_products_and_relabellings_are_declared_facts():
    """The library views, the runner, the C entry and the conv block ask `OpDef.gemm` and
    `OpDef.view`, not lists of op names: each primitive says it once."""
    from graphkernel.ir.opset import OPS
    assert sorted({o.name for o in OPS.values() if o.gemm}) == ["BatchMatMul", "MatMul"]
    assert sorted({o.name for o in OPS.values() if o.view}) == ["ExpandDims", "Reshape", "Squeeze"]


def test_every_pointwise_op_has_a_c_expression():
    """Fusion takes every elementwise and broadcasting op into a loop nest
    (graph_kernel/schedule.py `fusible_op` asks the op's kind, not the backend): the C
    backend's op table must have an expression for each, and for no op the IR lacks."""
    from graphkernel.backends.c.ops import CODE_FOR_OP
    from graphkernel.ir.opset import OPS, PatternKind
    pointwise = {o.name for o in OPS.values()
                 if o.kind in (PatternKind.ELEMWISE, PatternKind.BROADCAST)}
    assert pointwise and pointwise <= set(CODE_FOR_OP)
    assert set(CODE_FOR_OP) <= set(OPS)


def test_every_reduction_kind_has_a_c_fold():
    """Each reduce op declares an abstract `Reduction` (kind, identity); the C backend spells
    every kind's combine step and OpenMP operator, and each identity as a C literal."""
    from graphkernel.backends.c.ops import C_REDUCTIONS, c_identity
    from graphkernel.ir import types as T
    from graphkernel.ir.opset import OPS, ReductionKind
    assert set(C_REDUCTIONS) == set(ReductionKind)
    identities = {o.name: (c_identity(o.reduction, T.float32), c_identity(o.reduction, T.int64))
                  for o in OPS.values() if o.reduction is not None}
    assert identities["ReduceMax"] == ("-INFINITY", "INT64_MIN")
    assert identities["ReduceMin"] == ("INFINITY", "INT64_MAX")
    assert identities["ReduceSum"] == ("0", "0") and identities["ReduceProd"] == ("1", "1")


def test_no_c_below_the_backends():
    """The IR, the passes, the middle end and the runtime are backend-neutral: no C expression,
    C type, preprocessor line or OpenMP word in their source (the C backend's op table and
    types live in backends/c/), nor the C entry's BLAS hand-over (backends/c/cblas.py)."""
    import pathlib
    import re
    root = pathlib.Path(__file__).resolve().parent.parent / "graphkernel"
    c_code = re.compile(r"c_template|c_float_template|omp_operator|C_STORAGE|C_COMPUTE|"
                        r"#include|#pragma|\bomp\b|\bOpenMP\b|CBlas|set_blas|BATCH_VERSIONS")
    found = []
    for folder in ("ir", "passes", "graph_kernel", "runtime"):
        for path in sorted((root / folder).rglob("*.py")):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if c_code.search(line):
                    found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_windows_are_declared_facts():
    """Clustering, parallel fusion, lowering and the C backend ask `OpDef.window`."""
    from graphkernel.ir.opset import OPS, Window
    windows = {o.name: o.window for o in OPS.values() if o.window is not None}
    assert windows == {"Conv2D": Window.CONVOLUTION, "Conv2DFoldedBN": Window.CONVOLUTION,
                       "MaxPool": Window.POOL, "AvgPool": Window.POOL,
                       "MaxPoolGrad": Window.POOL_GRAD, "AvgPoolGrad": Window.POOL_GRAD,
                       "Conv2DBackpropFilter": Window.FILTER_GRAD}
