"""Every primitive, every dtype it accepts: generated C kernels and op-by-op execution against
numpy on random inputs."""
import math

import numpy as np
import pytest
from cells import product_atol, sum_atol

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir import opset
from graphkernel.ir import types as T
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
# Both backends run the main per-op tests: generated C ("native" kernels) and numpy (the same
# groups run op by op on numpy, "interpreted").
BACKENDS = ["c", "numpy"]
KERNEL_BACKEND = {"c": "native", "numpy": "interpreted"}
FLOATS = ["float16", "float32", "float64"]
INTS = ["int32", "int64"]


def random_array(rng, shape, dtype, positive=False):
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        low = 1 if positive else -20
        return rng.integers(low, 20, shape).astype(dtype)
    values = rng.standard_normal(shape) * 2
    if positive:
        values = np.abs(values) + 0.1
    return values.astype(dtype)


class OneOp(nn.GraphKernel):
    """A user composite around one primitive: it always runs as one generated C kernel."""

    def __init__(self, op, call_args=()):
        super().__init__()
        self.op = op
        self.call_args = call_args

    def construct(self, *xs):
        return self.op(*xs, *self.call_args)


class Wrap(nn.Cell):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def construct(self, *xs):
        return self.inner(*xs)


def tolerance(dtype, op):
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return 2e-3
    transcendental = op in ("Exp", "Log", "Tanh", "Erf", "Pow", "Sqrt", "Rsqrt")
    if dtype == np.float32:
        return 1e-5 if not transcendental else 1e-5
    return 1e-12


def assert_matches(got, want, rtol):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    if np.issubdtype(want.dtype, np.floating):
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=rtol * 1e-2, equal_nan=True)
    else:
        np.testing.assert_array_equal(got, want)


ELEMENTWISE = [op for op in opset.OPS.values() if op.kind == opset.PatternKind.ELEMWISE]
POSITIVE = {"Sqrt", "Rsqrt", "Log", "Pow", "Reciprocal", "RealDiv", "Log1p"}


# Every op in float32 and on the numpy backend on every run (no compile there); in the other
# dtypes a generated kernel each (a compile apiece) only for these ops, one or more of each kind
# (arithmetic, integer division, comparison, logic, selection, cast, transcendental, test), and
# the rest in the slow step.
DTYPE_REPRESENTATIVES = {"Add", "RealDiv", "FloorDiv", "Mod", "Maximum", "Neg", "Abs", "Sign",
                         "Round", "Exp", "Tanh", "Pow", "Less", "Equal", "LogicalAnd", "Select",
                         "Cast", "IsNan"}


def _cases():
    for op in ELEMENTWISE:
        accepted = op.accepts or T.SUPPORTED_DTYPES
        for dtype in accepted:
            for backend in BACKENDS:
                slow = backend == "c" and dtype.name != "float32" and \
                    op.name not in DTYPE_REPRESENTATIVES
                yield pytest.param(op.name, dtype.name, backend,
                                   marks=[pytest.mark.slow] if slow else [],
                                   id=f"{op.name}-{dtype.name}-{backend}")


@pytest.mark.parametrize("name,dtype,backend", list(_cases()))
def test_elementwise_op_matches_numpy(name, dtype, backend, rng):
    op = opset.get_op(name)
    shapes = [(3, 17), (17,), (3, 1)][: len(op.inputs)]
    if name == "Select":
        arrays = [random_array(rng, (3, 17), "bool"), random_array(rng, (17,), dtype),
                  random_array(rng, (3, 1), dtype)]
    else:
        arrays = [random_array(rng, s, dtype, positive=name in POSITIVE) for s in shapes]
    call_args = (np.float64,) if name == "Cast" and dtype != "float64" else \
        (np.float32,) if name == "Cast" else ()
    prim = getattr(P, name)()
    want = np.asarray(op.reference(*arrays, **{**op.attr_defaults,
                                               **({"dtype": call_args[0]} if call_args else {})}))
    for fuse in (True, False):
        options = CompileOptions(enable_graph_kernel=fuse, backend=backend)
        exe = graphkernel.compile(Wrap(OneOp(prim, call_args)), *arrays, options=options)
        assert [k.backend for k in exe.kernels] == [KERNEL_BACKEND[backend]]
        got = exe.run_arrays(*arrays)[0]
        assert_matches(got, want, tolerance(dtype, name))


# Casts from and to float32 on every run; the other pairs (a compile each) in the slow step.
@pytest.mark.parametrize("src,dst", [
    pytest.param(src, dst, id=f"{dst}-{src}",
                 marks=[] if "float32" in (src, dst) else [pytest.mark.slow])
    for dst in ["float16", "float32", "float64", "int32", "int64", "bool"]
    for src in ["float16", "float32", "float64", "int32", "int64", "bool"]])
def test_cast_between_all_dtypes(src, dst, rng):
    x = random_array(rng, (4, 9), src)
    exe = graphkernel.compile(Wrap(OneOp(P.Cast(), (np.dtype(dst),))), x, options=ON)
    got = exe.run_arrays(x)[0]
    assert_matches(got, x.astype(dst), 0)


REDUCTIONS = ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"]


REDUCTION_AXES = [(-1, False), (0, True), (1, False), ((0, 2), True), (None, False), ((), True)]


def _reduction_cases():
    # Every case on the numpy backend (no compile) and in float32 on every run; in the other
    # dtypes the generated kernels (a compile each) of the last axis and of two axes, and the
    # other axes in the slow step.
    for backend in BACKENDS:
        for axis, keep in REDUCTION_AXES:
            for dtype in ["float16", "float32", "float64", "int32", "int64"]:
                for name in REDUCTIONS:
                    slow = backend == "c" and dtype != "float32" and axis not in (-1, (0, 2))
                    yield pytest.param(name, dtype, axis, keep, backend,
                                       marks=[pytest.mark.slow] if slow else [],
                                       id=f"{backend}-{axis}-{keep}-{dtype}-{name}")


@pytest.mark.parametrize("name,dtype,axis,keep,backend", list(_reduction_cases()))
def test_reduction_matches_numpy(name, dtype, axis, keep, backend, rng):
    x = random_array(rng, (3, 5, 7), dtype)
    if name == "ReduceProd" and np.dtype(dtype).kind == "f":
        x = (1 + 0.03 * rng.uniform(-1, 1, x.shape)).astype(dtype)  # products stay in range
    prim = getattr(P, name)(keep_dims=keep)
    # Fused with an elementwise producer so the reduction is generated C, not numpy.
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.neg = P.Neg()
            self.red = prim

        def construct(self, x):
            return self.red(self.neg(x), axis)
    want = opset.get_op(name).reference(-x, axis=axis, keep_dims=keep)
    exe = graphkernel.compile(Net(), x,
                              options=CompileOptions(enable_graph_kernel=True, backend=backend))
    assert [k.backend for k in exe.kernels] == [KERNEL_BACKEND[backend]]
    got = exe.run_arrays(x)[0]
    if dtype == "float16":
        # numpy sums float16 in float16; the kernel accumulates in float32, so compare both with
        # the float64 result, to float16's precision scaled by the magnitudes summed.
        exact = opset.get_op(name).reference(-x.astype(np.float64), axis=axis, keep_dims=keep)
        scale = opset.get_op(name).reference(np.abs(x.astype(np.float64)), axis=axis,
                                             keep_dims=keep)
        assert got.dtype == np.float16
        bound = 2e-3 if backend == "c" else 4e-3  # numpy's float16 sums, as `want`
        assert np.all(np.abs(got - exact) <= bound * np.abs(scale) + 1e-3)
        assert np.all(np.abs(want - exact) <= 4e-3 * np.abs(scale) + 1e-3)
        return
    assert_matches(got, want, 1e-5 if dtype == "float32" else 1e-12)


def test_reduce_mean_expanded_and_library(rng):
    x = random_array(rng, (4, 6, 8), "float32")
    for options in (ON, OFF):
        exe = graphkernel.compile(Wrap(OneOp(P.ReduceMean(keep_dims=True), (1,))), x,
                                  options=options)
        np.testing.assert_allclose(exe.run_arrays(x)[0], x.mean(axis=1, keepdims=True),
                                   rtol=1e-6, atol=sum_atol(x, 1) / x.shape[1])


SHAPE_OPS = [
    (P.Reshape(), ((6, 4),), lambda x: x.reshape(6, 4)),
    (P.Reshape(), ((-1,),), lambda x: x.reshape(-1)),
    (P.Transpose(), ((2, 0, 1),), lambda x: x.transpose(2, 0, 1)),
    (P.ExpandDims(), (1,), lambda x: x[:, None]),
    (P.Squeeze(axis=(1,)), (), None),
    (P.BroadcastTo((5, 2, 3, 4)), (), lambda x: np.broadcast_to(x, (5, 2, 3, 4))),
    (P.Tile(), ((2, 1, 3),), lambda x: np.tile(x, (2, 1, 3))),
]


@pytest.mark.parametrize("index", range(len(SHAPE_OPS)))
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_shape_ops(index, dtype, rng):
    prim, args, expect = SHAPE_OPS[index]
    x = random_array(rng, (2, 3, 4) if expect else (2, 1, 4), dtype)
    want = expect(x) if expect else x[:, 0, :]

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = prim

        def construct(self, x):
            return self.op(x, *args)
    for options in (ON, OFF):
        got = graphkernel.compile(Net(), x, options=options).run_arrays(x)[0]
        assert_matches(np.ascontiguousarray(got), np.ascontiguousarray(want), 0)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matmul_and_batch_matmul(ta, tb, dtype, rng):
    a = random_array(rng, (5, 3) if ta else (3, 5), dtype)
    b = random_array(rng, (4, 5) if tb else (5, 4), dtype)
    want = (a.T if ta else a) @ (b.T if tb else b)

    class Net(nn.Cell):
        def __init__(self, prim):
            super().__init__()
            self.mm = prim

        def construct(self, a, b):
            return self.mm(a, b)
    got = graphkernel.compile(Net(P.MatMul(ta, tb)), a, b, options=ON).run_arrays(a, b)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5,
                               atol=product_atol(a.T if ta else a, b.T if tb else b))
    ab, bb = np.stack([a, a * 2]), np.stack([b, b - 1])
    want_b = np.stack([(x.T if ta else x) @ (y.T if tb else y) for x, y in zip(ab, bb)])
    got_b = graphkernel.compile(Net(P.BatchMatMul(ta, tb)), ab, bb, options=ON).run_arrays(
        ab, bb)[0]
    np.testing.assert_allclose(got_b, want_b, rtol=1e-5, atol=max(
        product_atol(x.T if ta else x, y.T if tb else y) for x, y in zip(ab, bb)))


# ---- composite ops: expanded (fusion on) and library (fusion off) against float64 formulas --

def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_erf(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _sig(x):
    return 1 / (1 + np.exp(-x))


COMPOSITES = [
    ("GeLU", P.GeLU(), (), _gelu_tanh),
    ("GeLU-erf", P.GeLU(approximate="none"), (), _gelu_erf),
    ("FastGeLU", P.FastGeLU(), (), lambda x: x * _sig(1.702 * x)),
    ("Sigmoid", P.Sigmoid(), (), _sig),
    ("SiLU", P.SiLU(), (), lambda x: x * _sig(x)),
    ("ReLU", P.ReLU(), (), lambda x: np.maximum(x, 0)),
    ("ReLU6", P.ReLU6(), (), lambda x: np.clip(x, 0, 6)),
    ("HSwish", P.HSwish(), (), lambda x: x * np.clip(x + 3, 0, 6) / 6),
    ("Softplus", P.Softplus(), (), lambda x: np.log(1 + np.exp(x))),
    ("Square", P.Square(), (), lambda x: x * x),
    ("Softmax", P.Softmax(axis=-1), (), lambda x: _softmax(x, -1)),
    ("Softmax-axis0", P.Softmax(axis=0), (), lambda x: _softmax(x, 0)),
    ("LogSoftmax", P.LogSoftmax(axis=1), (), lambda x: np.log(_softmax(x, 1))),
]


@pytest.mark.parametrize("name,prim,args,formula", COMPOSITES, ids=[c[0] for c in COMPOSITES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_composite_ops_against_formulas(name, prim, args, formula, dtype, rng):
    x = (rng.standard_normal((6, 4, 9)) * 3).astype(dtype)
    want = formula(x.astype(np.float64))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.op = prim

        def construct(self, x):
            return self.op(x, *args)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for options in (ON, OFF):
        exe = graphkernel.compile(Net(), x, options=options)
        got = exe.run_arrays(x)[0]
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 1e-2)
        if options is ON:
            assert [k.backend for k in exe.kernels] == ["native"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_binary_composites(dtype, rng):
    x, y = (random_array(rng, (5, 7), dtype) for _ in range(2))
    b = random_array(rng, (7,), dtype)
    x4, b4 = random_array(rng, (2, 3, 4, 5), dtype), random_array(rng, (3,), dtype)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sd, self.addn, self.bias = P.SquaredDifference(), P.AddN(), P.BiasAdd()

        def construct(self, x, y, b, x4, b4):
            return self.sd(x, y), self.addn((x, y, x)), self.bias(x, b), self.bias(x4, b4)
    want = ((x - y) ** 2, x + y + x, x + b, x4 + b4.reshape(1, 3, 1, 1))
    for options in (ON, OFF):
        got = graphkernel.compile(Net(), x, y, b, x4, b4, options=options).run_arrays(
            x, y, b, x4, b4)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("begin", [-1, 1])
def test_layer_norm_outputs(dtype, begin, rng):
    x = random_array(rng, (4, 6, 8), dtype)
    shape = x.shape[begin:]
    gamma, beta = random_array(rng, shape, dtype), random_array(rng, shape, dtype)
    axes = tuple(range(begin % 3, 3))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = x64.var(axis=axes, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + 1e-7) * gamma + beta

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = P.LayerNorm(begin_norm_axis=begin, begin_params_axis=begin)

        def construct(self, x, g, b):
            return self.ln(x, g, b)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    for options in (ON, OFF):
        got = graphkernel.compile(Net(), x, gamma, beta, options=options).run_arrays(
            x, gamma, beta)
        for g, w in zip(got, (y, mean, var)):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


def test_functional_forms_share_the_declaration(rng):
    from graphkernel import ops
    x = random_array(rng, (3, 4), "float32")
    np.testing.assert_allclose(ops.mul(Tensor(x), 2.0).asnumpy(), x * 2)
    np.testing.assert_allclose(ops.reduce_sum(Tensor(x), 1, keep_dims=True).asnumpy(),
                               x.sum(1, keepdims=True), rtol=1e-6, atol=sum_atol(x, 1))
    assert ops.real_div is not None and P.Div is not None and P.TensorAdd is not None


def test_typed_declarations_agree_with_the_c_they_emit():
    """OpDef.vector_math says whether an op's C calls a function the prelude declares for
    libmvec or defines itself (gkm_expf); a declaration that forgets the flag (or claims it
    wrongly) fails here."""
    import re

    from graphkernel.backends.c.c_text import PRELUDE
    from graphkernel.backends.c.ops import code_for_op
    from graphkernel.ir.opset import OPS

    libmvec = set(re.findall(r"^double (\w+)\(", PRELUDE, re.M))
    assert libmvec, "the prelude declares no vector math"
    # graphkernel's own inlined vector math (gkm_expf, gkm_erff, gkm_tanhf: float; their
    # double forms call libm).
    own = set(re.findall(r"^static inline float (gkm_\w+)f\(", PRELUDE, re.M))
    assert own == {"gkm_exp", "gkm_erf", "gkm_tanh"}, own
    for op in OPS.values():
        expression = code_for_op(op.name)
        templates = "" if expression is None else \
            expression.template + (expression.float_template or "")
        calls = any(re.search(rf"\b{name}(f|\{{f\}})?\(", templates)
                    for name in libmvec | own)
        assert op.vector_math == calls, op.name
        assert not op.vector_math or op.expensive, op.name
        assert (op.reduction is not None) == (op.kind.name == "REDUCE"), op.name


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_abs_wraps_at_the_minimum_like_numpy(dtype):
    """gcc folded `x < 0 ? -x : x` into an abs it assumed non-negative: fused
    Sign(Abs(Neg(INT_MIN))) gave 1 where numpy's wrapping gives -1."""
    class SignAbsNeg(nn.Cell):
        def __init__(self):
            super().__init__()
            self.sign, self.abs, self.neg = P.Sign(), P.Abs(), P.Neg()

        def construct(self, x):
            return self.sign(self.abs(self.neg(x))), self.abs(x)
    x = np.array([np.iinfo(dtype).min, -3, 0, 5, np.iinfo(dtype).max] * 4, dtype)
    want = (np.sign(np.abs(np.negative(x))), np.abs(x))
    for fusion in (True, False):
        exe = graphkernel.compile(SignAbsNeg(), x,
                                  options=CompileOptions(enable_graph_kernel=fusion))
        for got, expect in zip(exe.run_arrays(x), want):
            np.testing.assert_array_equal(got, expect)


def test_float16_select_compiles_on_every_cpu():
    """gcc 12 on an AVX512-FP16 CPU emitted a masked `vmovsh` for this select that binutils
    2.40 rejects: the toolchain probe now finds that and builds without AVX512-FP16."""
    class Net(nn.Cell):
        def construct(self, a, b):
            return P.Select()(P.Less()(a, b), a, 0.0)

    for a, b in [(1.0, 2.0), (3.0, 2.0)]:
        x, y = np.array(a, np.float16), np.array(b, np.float16)
        for options in (ON, OFF):
            out = graphkernel.compile(Net(), x, y, options=options).run_arrays(x, y)[0]
            assert out.dtype == np.float16 and out == np.where(x < y, x, np.float16(0))
