"""Numerical quality: reductions as accurate as numpy's (blocked and pairwise sums, float16
accumulating in float32), float16 composites computed in float32 and rounded once, and every
expander stable at the extremes of each float dtype. Each test compares with float64 numpy."""
import math
import warnings

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.errors import DTypeError
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.ops.operations import _grad_ops as G

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)
FLOATS = ["float16", "float32", "float64"]


class Kernel(nn.GraphKernel):
    """A user composite: whatever it computes runs as one generated C kernel."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, *xs):
        return self.fn(*xs)


class Net(nn.Cell):
    def __init__(self, fn, kernel=False):
        super().__init__()
        self.fn = Kernel(fn) if kernel else fn

    def construct(self, *xs):
        return self.fn(*xs)


def run(fn, *arrays, options=ON, kernel=False, kernels=None):
    """Compile `fn` (inside one GraphKernel when `kernel`) and run it once; with fusion on,
    check the number of generated kernels when `kernels` is given."""
    exe = graphkernel.compile(Net(fn, kernel), *arrays, options=options)
    if options is ON and kernels is not None:
        assert [k.backend for k in exe.kernels] == ["native"] * kernels
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings either
        out = exe.run_arrays(*arrays)
    return out[0] if len(out) == 1 else out


def rel_err(got, want, scale=None):
    got = np.asarray(got, np.float64)
    scale = np.abs(want) if scale is None else scale
    return float(np.max(np.abs(got - want) / scale))


# ---- float16 reductions and composites accumulate in float32 ---------------------------------

def test_float16_mean_of_large_values_does_not_overflow():
    # 4096 x 30.0 sums to 122880, beyond float16's 65504: the sum must stay in float32.
    x = np.full((2, 4096), 30.0, np.float16)
    for options in (ON, OFF):
        got = run(lambda a: P.ReduceMean(keep_dims=True)(a, -1), x, options=options, kernels=1)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, np.full((2, 1), 30.0, np.float16))


def test_float16_layernorm_of_large_row_is_finite():
    rng = np.random.default_rng(0)
    x = (30 + rng.standard_normal((3, 4096))).astype(np.float16)
    g, b = np.ones(4096, np.float16), np.zeros(4096, np.float16)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-7)
    for options in (ON, OFF):
        y, mean, var = run(lambda a, g, b: P.LayerNorm()(a, g, b), x, g, b, options=options,
                           kernels=1)
        assert np.isfinite(y).all() and np.isfinite(mean).all() and np.isfinite(var).all()
        np.testing.assert_allclose(y.astype(np.float64), want, rtol=2e-3, atol=4e-3)
        np.testing.assert_allclose(mean.astype(np.float64), x64.mean(-1, keepdims=True),
                                   rtol=1e-3)


def test_float16_softmax_of_wide_zero_row():
    # The sum of 70,000 exp(0) is beyond float16's range: 1/sum was 0 everywhere.
    x = np.zeros((2, 70000), np.float16)
    want = np.float16(1 / 70000)
    for options in (ON, OFF):
        got = run(lambda a: P.Softmax()(a), x, options=options, kernels=1)
        assert got.dtype == np.float16
        np.testing.assert_array_equal(got, np.full(x.shape, want))


@pytest.mark.parametrize("begin", [-1, 1])
def test_float16_layernorm_fused_matches_unfused(begin):
    # MindSpore's graph-kernel test compares fused and unfused float16 LayerNorm at 1e-3: both
    # compute in float32 and round once.
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 32, 32)).astype(np.float16)
    shape = x.shape[begin:]
    g = rng.standard_normal(shape).astype(np.float16)
    b = rng.standard_normal(shape).astype(np.float16)

    def ln(a, g, b):
        return P.LayerNorm(begin_norm_axis=begin, begin_params_axis=begin)(a, g, b)
    fused = run(ln, x, g, b, options=ON, kernels=1)
    unfused = run(ln, x, g, b, options=OFF)
    for f, u in zip(fused, unfused):
        assert f.dtype == u.dtype == np.float16
        np.testing.assert_allclose(f.astype(np.float32), u.astype(np.float32), rtol=1e-3,
                                   atol=1e-3)


def test_float16_expanders_round_once():
    # GeLU's eight basic ops, rounded to float16 after each, drift by several float16 ulp; in
    # float32 rounded once the result is within one ulp of the float64 answer.
    x = np.linspace(-6, 6, 4001).astype(np.float16)
    x64 = x.astype(np.float64)
    want = (0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64 ** 3))))
    ulp = np.spacing(np.abs(want.astype(np.float16))).astype(np.float64)
    got = run(lambda a: P.GeLU()(a), x, kernels=1).astype(np.float64)
    assert np.all(np.abs(got - want) <= ulp + 1e-7)


def _layer_norm_grad_args(rng):
    x = (3 * rng.standard_normal((32, 64)) + 30).astype(np.float16)
    x64 = x.astype(np.float64)
    return (x, rng.standard_normal(x.shape).astype(np.float16),
            x64.var(axis=1, keepdims=True).astype(np.float16),
            x64.mean(axis=1, keepdims=True).astype(np.float16),
            (2 * rng.standard_normal(64) + 5).astype(np.float16))


def test_float16_layer_norm_grad_fused_matches_unfused():
    # Issue 28: float16 LayerNormGrad fused and unfused differed by 3 ulp (0.047 at 30): the
    # expansion rounded to float16 after every basic op. Both paths now compute in float32 (or
    # wider) and round once, as the forward LayerNorm does.
    args = _layer_norm_grad_args(np.random.default_rng(28))
    fused = run(G.LayerNormGrad(1, 1), *args, options=ON)
    unfused = run(G.LayerNormGrad(1, 1), *args, options=OFF)
    for f, u in zip(fused, unfused):
        assert f.dtype == u.dtype == np.float16
        f64, u64 = f.astype(np.float64), u.astype(np.float64)
        ulp = np.spacing(np.maximum(np.abs(f), np.abs(u))).astype(np.float64)
        assert np.all(np.abs(f64 - u64) <= ulp), float(np.max(np.abs(f64 - u64) / ulp))


@pytest.mark.parametrize("options", [ON, OFF], ids=["fused", "unfused"])
def test_gradient_composites_refuse_mixed_dtypes(options):
    # Issue 28: GeLUGrad with y float64 and dy, x float32 gave float64 values 3.3 off unfused
    # (the fused path was right). MindSpore's kernels take one dtype for all three: both paths
    # refuse, naming the dtypes.
    rng = np.random.default_rng(3)
    dy, x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    y = x.astype(np.float64)
    with pytest.raises(DTypeError, match="GeLUGrad: gradient inputs must share one dtype, "
                       "got float32, float32, float64"):
        run(G.GeLUGrad(), dy, x, y, options=options)


@pytest.mark.parametrize("options", [ON, OFF], ids=["fused", "unfused"])
def test_relu_grad_takes_int32_as_mindspore(options):
    dy = np.arange(-6, 6, dtype=np.int32).reshape(3, 4)
    y = np.array([[1, 0, -1, 3]] * 3, np.int32)
    got = run(G.ReluGrad(), dy, y, options=options)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, np.where(y > 0, dy, 0))


# ---- long rows, long columns, large magnitudes: blocked and pairwise sums ---------------------

def _data(kind, shape, dtype, rng):
    if kind == "uniform":
        return rng.random(shape, dtype=np.float64).astype(dtype)
    if kind == "near_one":
        return (1 + 1e-3 * rng.standard_normal(shape)).astype(dtype)
    if kind == "huge":
        return (1e30 * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _check_sum(got, x, axis, bound):
    x64 = x.astype(np.float64)
    want = x64.sum(axis=axis, keepdims=True)
    mass = np.abs(x64).sum(axis=axis, keepdims=True)  # summation error scales with sum |x|
    err = float(np.max(np.abs(got.astype(np.float64) - want) / mass))
    assert err <= bound, f"relative error {err:.3g} > {bound:.3g}"
    return err


@pytest.mark.parametrize("kind", ["uniform", "near_one", "normal", "huge"])
def test_long_row_sum_and_mean_float32(kind):
    rng = np.random.default_rng(1)
    x = _data(kind, (2, 10 ** 6), np.float32, rng)
    total = run(lambda a: P.ReduceSum(keep_dims=True)(a, -1), x, kernel=True, kernels=1)
    err = _check_sum(total, x, -1, 1.2e-7)  # sequential float32 was off by 3.8e-6
    numpy_err = _check_sum(x.sum(-1, keepdims=True), x, -1, 1.2e-7)
    assert err <= max(4 * numpy_err, 1.2e-7)
    mean = run(lambda a: P.ReduceMean(keep_dims=True)(a, -1), x, kernels=1)
    _check_sum(mean * np.float32(x.shape[-1]), x, -1, 2.4e-7)


def test_ten_million_element_row():
    rng = np.random.default_rng(2)
    x = rng.random((1, 10 ** 7), dtype=np.float32)
    got = run(lambda a: P.ReduceSum(keep_dims=True)(a, -1), x, kernel=True, kernels=1)
    _check_sum(got, x, -1, 1.2e-7)


def test_sum_of_all_elements_of_a_large_tensor():
    # 1x5120x2560 float32: one sequential accumulator per vector lane was off by 4e-4.
    rng = np.random.default_rng(3)
    x = rng.random((1, 5120, 2560), dtype=np.float32)
    got = run(lambda a: P.ReduceSum(keep_dims=True)(a, ()), x, kernel=True, kernels=1)
    _check_sum(got, x, (0, 1, 2), 1.2e-7)


@pytest.mark.parametrize("kind", ["uniform", "normal"])
def test_long_column_sum_float32(kind):
    rng = np.random.default_rng(4)
    x = _data(kind, (10 ** 6, 8), np.float32, rng)
    got = run(lambda a: P.ReduceSum(keep_dims=True)(a, 0), x, kernel=True, kernels=1)
    _check_sum(got, x, 0, 4e-7)  # numpy's own column sum is sequential: ~1e-5 here


def test_long_middle_axis_sum_float32():
    rng = np.random.default_rng(5)
    x = rng.random((3, 200000, 5), dtype=np.float32)
    got = run(lambda a: P.ReduceSum(keep_dims=True)(a, 1), x, kernel=True, kernels=1)
    _check_sum(got, x, 1, 4e-7)


def test_long_row_sum_float64():
    rng = np.random.default_rng(6)
    x = rng.random((1, 10 ** 7))
    got = run(lambda a: P.ReduceSum(keep_dims=True)(a, -1), x, kernel=True, kernels=1)
    exact = math.fsum(x[0])  # correctly rounded
    assert abs(float(got[0, 0]) - exact) <= 4e-15 * exact  # sequential lanes: ~1e-13


def test_long_row_sum_float16_accumulates_in_float32():
    x = np.full((1, 10 ** 6), 0.01, np.float16)
    want = np.float16(float(np.float16(0.01)) * 10 ** 6)
    for options in (ON, OFF):
        got = run(lambda a: P.ReduceSum(keep_dims=True)(a, -1), x, kernel=True, options=options)
        assert got.dtype == np.float16
        assert abs(float(got[0, 0]) - float(want)) <= float(np.spacing(want))


@pytest.mark.parametrize("width", [4096, 10 ** 6])
def test_softmax_on_rows_near_one(width):
    rng = np.random.default_rng(8)
    x = (1 + 1e-3 * rng.standard_normal((2, width))).astype(np.float32)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(-1, keepdims=True))
    want = e / e.sum(-1, keepdims=True)
    got = run(lambda a: P.Softmax()(a), x, kernels=1)
    assert rel_err(got, want) < 1e-6  # sequential sums were off by 1.6e-4 at 1e6


@pytest.mark.parametrize("width", [4096, 10 ** 6])
def test_layernorm_on_rows_near_one(width):
    # The centred values are 1e-3 of the mean: a mean rounded to float32 shifts every output by
    # up to 6e-5 unless the kernel corrects it with the centred values' own sum.
    rng = np.random.default_rng(9)
    x = (1 + 1e-3 * rng.standard_normal((2, width))).astype(np.float32)
    g, b = np.ones(width, np.float32), np.zeros(width, np.float32)
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = x64.var(-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + 1e-7)
    for options in (ON, OFF):
        y, m, v = run(lambda a, g, b: P.LayerNorm()(a, g, b), x, g, b, options=options,
                      kernels=1)
        assert float(np.max(np.abs(y - want))) < 2e-6  # was 3e-5 (4096), 9e-4 (1e6)
        assert rel_err(m, mean) < 2e-7
        assert rel_err(v, var) < 1e-5


# ---- stable expanders at the extremes of each float dtype --------------------------------------

def _sigmoid64(x):
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _times_sigmoid64(x, k):
    s = _sigmoid64(k * x)
    return np.where(s == 0, -0.0, x * s)  # x * sigmoid(kx) -> -0.0 as x -> -inf


def _erfc64(x):
    return np.array([math.erfc(v) if v == v else v for v in x.ravel()]).reshape(x.shape)


def _gelu_tanh64(x):
    with np.errstate(over="ignore"):
        z = math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)
    s = _sigmoid64(2 * z)
    return np.where(s == 0, -0.0, x * s)


def _gelu_erf64(x):
    c = _erfc64(-x / math.sqrt(2))
    return np.where(c == 0, -0.0, 0.5 * x * c)


STABLE = {
    "Softplus": (P.Softplus, {},
                 lambda x: np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))),
    "Sigmoid": (P.Sigmoid, {}, _sigmoid64),
    "SiLU": (P.SiLU, {}, lambda x: _times_sigmoid64(x, 1.0)),
    "FastGeLU": (P.FastGeLU, {}, lambda x: _times_sigmoid64(x, 1.702)),
    "GeLU-tanh": (P.GeLU, {"approximate": "tanh"}, _gelu_tanh64),
    "GeLU-erf": (P.GeLU, {"approximate": "none"}, _gelu_erf64),
}


def extremes(dtype):
    info = np.finfo(dtype)
    big = [info.max, info.max / 2, 1e4, 700.0, 89.0, 30.0, 20.0, 12.0, 5.0, 1.0, 1e-3,
           float(info.tiny), float(info.smallest_subnormal), 0.0]
    vals = [v for v in big if v <= info.max] + [-v for v in big] + [math.inf, -math.inf, math.nan]
    with np.errstate(over="ignore"):
        return np.array(vals, np.float64).astype(dtype)


def _assert_close_at_extremes(got, want, dtype, what, rtol=None):
    dtype = np.dtype(dtype)
    info = np.finfo(dtype)
    with np.errstate(over="ignore"):
        want_d = want.astype(dtype).astype(np.float64)  # correctly rounded to the dtype
    got = np.asarray(got).astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want_d)), f"{what}: NaN where {want_d}: {got}"
    inf = np.isinf(want_d)
    assert np.array_equal(got[inf], want_d[inf]), f"{what}: infinities differ: {got} {want_d}"
    finite = ~np.isnan(want_d) & ~inf
    rtol = rtol or {"float16": 2e-3, "float32": 2e-6, "float64": 1e-13}[dtype.name]
    diff = np.abs(got[finite] - want_d[finite])
    ok = diff <= rtol * np.abs(want_d[finite]) + 2 * float(info.smallest_subnormal)
    assert ok.all(), f"{what}: at {np.flatnonzero(finite)[~ok]} got {got[finite][~ok]}, " \
        f"want {want_d[finite][~ok]}"


@pytest.mark.parametrize("name", sorted(STABLE))
@pytest.mark.parametrize("dtype", FLOATS)
def test_stable_expanders_at_extremes(name, dtype):
    prim, init, formula = STABLE[name]
    x = extremes(dtype)
    with np.errstate(all="ignore"):  # inf * 0 and the like, masked by the formulas
        want = formula(x.astype(np.float64))
    # erfc(t) far in its tail turns the rounding of t = -x/sqrt(2) into a relative error of
    # 2 t^2 u (t <= 10 while float32 erfc(t) is above 0).
    rtol = {"float32": 3e-5, "float64": 1e-12}.get(dtype) if name == "GeLU-erf" else None
    for options in (ON, OFF):
        got = run(lambda a: prim(**init)(a), x, options=options, kernels=1)
        assert got.dtype == np.dtype(dtype)
        _assert_close_at_extremes(got, want, dtype, f"{name} {dtype} fusion={options is ON}",
                                  rtol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_softplus_issue_values(dtype):
    # float16 softplus(12) was inf, float32 softplus(89) inf, softplus(-20) 0.
    x = np.array([12.0, 89.0, -20.0, -100.0], dtype)
    want = np.maximum(x, 0).astype(np.float64) + np.log1p(np.exp(-np.abs(x.astype(np.float64))))
    for options in (ON, OFF):
        got = run(lambda a: P.Softplus()(a), x, options=options, kernels=1)
        _assert_close_at_extremes(got, want, dtype, f"softplus fusion={options is ON}")


@pytest.mark.parametrize("dtype", FLOATS)
def test_log_softmax_at_extremes(dtype):
    info = np.finfo(dtype)
    x = np.array([[info.max, -info.max, 0.0, 1.0],
                  [-info.max, -info.max, -info.max, -info.max],
                  [1e4, -1e4, 0.5, -0.5] if dtype != "float16" else [6e4, -6e4, 0.5, -0.5],
                  [float(info.tiny), 0.0, -0.0, float(info.smallest_subnormal)]], dtype)
    x64 = x.astype(np.float64)
    with np.errstate(over="ignore"):
        s = x64 - x64.max(-1, keepdims=True)
    want = s - np.log(np.exp(s).sum(-1, keepdims=True))
    for options in (ON, OFF):
        got = run(lambda a: P.LogSoftmax()(a), x, options=options, kernels=1)
        _assert_close_at_extremes(got, want, dtype, f"LogSoftmax fusion={options is ON}")
        soft = run(lambda a: P.Softmax()(a), x, options=options, kernels=1)
        _assert_close_at_extremes(soft, np.exp(want), dtype, f"Softmax fusion={options is ON}")


@pytest.mark.parametrize("fusion", [True, False])
def test_layernorm_mean_of_a_row_with_inf_is_inf(fusion):
    """The corrected two-pass mean added its correction (inf - inf = NaN) to an infinite rough
    mean: LayerNorm's mean output was NaN where numpy's mean is -inf (found by the
    differential generator)."""
    class LN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln = P.LayerNorm(begin_norm_axis=-1, begin_params_axis=-1)

        def construct(self, x, g, b):
            return self.ln(x, g, b)[1]
    x = np.array([[-np.inf, 1.0, 2.0], [1.0, 2.0, 3.0], [np.inf, np.inf, 0.0]], np.float32)
    g, b = np.ones(3, np.float32), np.zeros(3, np.float32)
    exe = graphkernel.compile(LN(), x, g, b, options=CompileOptions(enable_graph_kernel=fusion))
    want = x.astype(np.float64).mean(axis=-1, keepdims=True).astype(np.float32)
    np.testing.assert_array_equal(exe.run_arrays(x, g, b)[0], want)


# ---- products multiply in numpy's order -------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_product_of_inf_and_subnormals_is_numpys(dtype):
    """Vector lanes multiplied a row's subnormals to 0 and then met -inf in another lane:
    0 * -inf = NaN where numpy's product, one factor after the other, is -inf (found by the
    differential generator). Every shape and axis, fused, gives numpy's answer bit for bit."""
    import itertools

    from graphkernel.ir.opdefs.reduction import _reduce_ref
    numpy_prod = _reduce_ref(np.prod)  # the op table's reference: np.prod (float16 in float32)
    info = np.finfo(dtype)
    row = np.ones(64, dtype)
    row[0], row[1], row[9] = -np.inf, info.smallest_subnormal, info.smallest_subnormal
    assert np.isneginf(numpy_prod(row, (0,)))
    got = run(lambda x: P.ReduceProd()(x * 1.0, 0), row, kernel=True, kernels=1)
    assert np.isneginf(got), got
    rng = np.random.default_rng(16)
    factors = np.array([-np.inf, np.inf, info.smallest_subnormal, info.smallest_normal / 4,
                        -0.5, 1e-3, 3.0], dtype)
    for shape in [(3, 40), (4, 5, 6), (2, 1500)]:
        for r in range(1, len(shape) + 1):
            for axis in itertools.combinations(range(len(shape)), r):
                x = np.where(rng.random(shape) < 0.5, 1.0,
                             rng.choice(factors, size=shape)).astype(dtype)
                with np.errstate(all="ignore"):
                    got = run(lambda x, axis=axis: P.ReduceProd()(x * 1.0, axis), x,
                              kernel=True, kernels=1)
                np.testing.assert_array_equal(got, numpy_prod(x, axis),
                                              err_msg=f"{dtype} {shape} axis {axis}")


# ---- losses ------------------------------------------------------------------------------

def _softplus64(x):
    return np.logaddexp(0.0, x)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("pos_weight", [None, 3.0])
@pytest.mark.parametrize("fusion", [True, False])
def test_bce_with_logits_at_extremes(dtype, pos_weight, fusion):
    """BCEWithLogitsLoss took log(1 + exp(-|x|)): 0 for |x| > 17 in float32 where the loss is
    2e-9 (y = 1, x = 20); with pos_weight, (1 - y) x + ... cancelled (y = 0, x = -20 gave 0).
    Now p y softplus(-x) + (1 - y) softplus(x) with softplus = max(z, 0) + log1p(exp(-|z|))."""
    info = np.finfo(dtype)
    xs = np.array([-info.max, -1e4, -100.0, -20.0, -1.0, -info.tiny, -0.0, 0.0,
                   info.smallest_subnormal, 1.0, 20.0, 100.0, 1e4, info.max], np.float64)
    xs = xs[np.abs(xs) <= info.max]
    x = np.repeat(xs, 3).astype(dtype)
    y = np.tile([0.0, 1.0, 0.5], len(xs)).astype(dtype)
    pw = None if pos_weight is None else Tensor(np.full(x.shape, pos_weight, dtype))
    loss = nn.BCEWithLogitsLoss("none", pos_weight=pw)
    exe = graphkernel.compile(loss, x, y, options=CompileOptions(enable_graph_kernel=fusion))
    got = exe.run_arrays(x, y)[0].astype(np.float64)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    p = 1.0 if pos_weight is None else pos_weight
    with np.errstate(over="ignore"):
        want = p * y64 * _softplus64(-x64) + (1 - y64) * _softplus64(x64)
        want = want.astype(dtype).astype(np.float64)  # what the dtype holds (3 * max is inf)
    rtol = {"float16": 1e-2, "float32": 1e-5, "float64": 1e-12}[dtype]
    with np.errstate(invalid="ignore"):  # inf - inf where both are inf
        close = np.abs(got - want) <= rtol * np.abs(want) + info.smallest_subnormal
    bad = ~((got == want) | close)
    assert not bad.any(), [(x[i], y[i], got[i], want[i]) for i in np.flatnonzero(bad)]
