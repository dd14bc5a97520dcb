"""Bad input gets a clear error before any kernel runs: what is wrong, and the user's line.

Each test checks the message's content and the error's location (this file, the marked line):
a line is marked with a trailing `# @name` comment and found by `line_of("name")`.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.errors import (
    DTypeError,
    GraphKernelError,
    GraphModeError,
    InputError,
    ResourceError,
    ShapeError,
    UnsupportedError,
)
from graphkernel.frontend import context, primitive
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

with open(__file__, encoding="utf-8") as _fh:
    _LINES = _fh.read().splitlines()


def line_of(marker: str) -> int:
    hits = [i + 1 for i, text in enumerate(_LINES) if text.rstrip().endswith(f"# @{marker}")]
    assert len(hits) == 1, marker
    return hits[0]


def assert_at(err: GraphKernelError, marker: str) -> None:
    assert err.location is not None, f"no location on: {err}"
    assert err.location.filename == __file__
    assert err.location.lineno == line_of(marker), str(err.location)
    assert f"line {line_of(marker)}" in str(err)  # the rendered message shows it too


F32 = np.ones((2, 3), np.float32)


class AddCell(nn.Cell):
    def construct(self, x: Any, y: Any) -> Any:
        return P.Add()(x, y)  # @add


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kcache"))


# ---------------------------------------------------------------------------------------------
# Inputs at call time

def test_too_few_inputs() -> None:
    with pytest.raises(InputError) as info:
        AddCell()(Tensor(F32))  # @call_few
    assert "AddCell.construct takes 2 input(s) (x, y), got 1" in str(info.value)
    assert_at(info.value, "call_few")


def test_too_many_inputs() -> None:
    with pytest.raises(InputError) as info:
        AddCell()(F32, F32, F32)  # @call_many
    assert "takes 2 input(s) (x, y), got 3" in str(info.value)
    assert_at(info.value, "call_many")


@pytest.mark.parametrize("bad", [{"y": 1.0}, {1.0, 2.0}, object(), [1.0, {}]])
def test_input_of_the_wrong_type(bad: Any) -> None:
    # Numbers, strings, None and tuples of them are constants of the graph, as in MindSpore's
    # graph mode (tests/test_layers.py); other Python objects are refused.
    with pytest.raises(InputError) as info:
        AddCell()(F32, bad)  # @call_type
    assert "input 'y' is a" in str(info.value)
    assert "graph mode takes Tensors, numbers" in str(info.value)
    assert_at(info.value, "call_type")


def test_input_of_an_unsupported_dtype() -> None:
    with pytest.raises(InputError) as info:
        AddCell()(F32, np.ones((2, 3), np.complex64))  # @call_dtype
    msg = str(info.value)
    assert "input 'y'" in msg and "complex64 is not supported" in msg and "float32" in msg
    assert_at(info.value, "call_dtype")


def test_executable_called_with_another_shape_or_dtype() -> None:
    exe = graphkernel.compile(AddCell(), F32, F32)
    with pytest.raises(InputError, match=r"input 'y' is float32\[3, 3\] but this executable was "
                                         r"compiled for float32\[2, 3\]"):
        exe.run_arrays(F32, np.ones((3, 3), np.float32))
    with pytest.raises(InputError, match=r"input 'x' is float64\[2, 3\] .* float32\[2, 3\]"):
        exe.run_arrays(F32.astype(np.float64), F32)
    with pytest.raises(InputError, match=r"takes 2 input\(s\) \(x, y\), got 1"):
        exe.run_arrays(F32)
    with pytest.raises(InputError, match=r"input 'y' must be a Tensor or a numpy array, got str"):
        exe.run_arrays(F32, "y")


def test_a_cell_called_again_with_another_shape_recompiles() -> None:
    cell = AddCell()
    a = cell(F32, F32).asnumpy()
    b = cell(np.ones((4,), np.float32), np.ones((4,), np.float32)).asnumpy()
    assert a.shape == (2, 3) and b.shape == (4,)


# ---------------------------------------------------------------------------------------------
# Inside construct

def test_shapes_that_do_not_broadcast() -> None:
    with pytest.raises(ShapeError) as info:
        AddCell()(F32, np.ones((4, 3), np.float32))
    msg = str(info.value)
    assert "(2, 3)" in msg and "(4, 3)" in msg and "do not broadcast" in msg
    assert_at(info.value, "add")


class Mismatch(nn.Cell):
    def construct(self, x: Any) -> Any:
        y = x * 2.0
        return y + P.Reshape()(x, (3, 2))  # @operator_broadcast


def test_shapes_that_do_not_broadcast_through_an_operator() -> None:
    with pytest.raises(ShapeError) as info:
        Mismatch()(F32)
    assert "(2, 3)" in str(info.value) and "(3, 2)" in str(info.value)
    assert_at(info.value, "operator_broadcast")


class UnknownOp(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Conv3D()(x)  # @unknown_op


def test_unsupported_op() -> None:
    with pytest.raises(UnsupportedError) as info:
        UnknownOp()(F32)
    assert "no primitive 'Conv3D'" in str(info.value) and "ReduceSum" in str(info.value)
    assert isinstance(info.value, AttributeError)  # hasattr(P, "Conv3D") stays False
    assert not hasattr(P, "Conv3D")
    assert_at(info.value, "unknown_op")


class TensorMethod(nn.Cell):
    def construct(self, x: Any) -> Any:
        return x.sum()  # @tensor_method


def test_tensor_method_that_does_not_exist() -> None:
    with pytest.raises(UnsupportedError) as info:
        TensorMethod()(F32)
    assert "Tensor has no attribute 'sum'" in str(info.value) and "P.ReduceSum" in str(info.value)
    assert_at(info.value, "tensor_method")


class StringValue(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Mul()(x, "two")  # @python_value


class ListValue(nn.Cell):
    def construct(self, x: Any) -> Any:
        return x + [1.0, 2.0, 3.0]  # @python_list


@pytest.mark.parametrize("cell,marker,shown", [(StringValue, "python_value", "str ('two')"),
                                               (ListValue, "python_list", "list ([1.0, 2.0")])
def test_unsupported_python_value(cell: type, marker: str, shown: str) -> None:
    with pytest.raises(DTypeError) as info:
        cell()(F32)
    assert shown in str(info.value) and "expected a Tensor, a numpy array or a Python number" \
        in str(info.value)
    assert_at(info.value, marker)


class IfOnTensor(nn.Cell):
    def construct(self, x: Any) -> Any:
        if x > 0:  # @if_tensor
            return x
        return -x


class WhileOnTensor(nn.Cell):
    def construct(self, x: Any) -> Any:
        while P.ReduceSum()(x) < 10.0:  # @while_tensor
            x = x * 2.0
        return x


class FloatOfTensor(nn.Cell):
    def construct(self, x: Any) -> Any:
        return x * float(P.ReduceMax()(x))  # @float_tensor


class NumpyOnTensor(nn.Cell):
    def construct(self, x: Any) -> Any:
        return np.sin(x)  # @numpy_tensor


@pytest.mark.parametrize("cell,marker", [(IfOnTensor, "if_tensor"), (WhileOnTensor, "while_tensor"),
                                         (FloatOfTensor, "float_tensor"),
                                         (NumpyOnTensor, "numpy_tensor")])
def test_control_flow_on_a_tensor_value(cell: type, marker: str) -> None:
    with pytest.raises(GraphModeError) as info:
        cell()(Tensor(F32))
    msg = str(info.value)
    assert "static graph" in msg and "PYNATIVE_MODE" in msg
    assert_at(info.value, marker)


def test_control_flow_on_a_tensor_value_works_in_pynative_mode() -> None:
    context.set_context(mode=context.PYNATIVE_MODE)
    x = np.array([[-1.0, 2.0]], np.float32)
    out = IfOnTensor()(Tensor(np.array(-3.0, np.float32)))
    assert out.asnumpy() == 3.0
    assert WhileOnTensor()(Tensor(x)).asnumpy().sum() >= 10.0


class ReturnsInt(nn.Cell):
    def construct(self, x: Any) -> Any:  # @returns_int
        return 3


def test_construct_returning_a_python_value() -> None:
    with pytest.raises(GraphModeError) as info:
        ReturnsInt()(F32)
    assert "ReturnsInt.construct returned a int" in str(info.value)
    assert_at(info.value, "returns_int")


class BadAxis(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ReduceSum(keep_dims=True)(x, 2)  # @bad_axis


class BadAxisTuple(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ReduceMax()(x, (0, -2))  # @repeated_axis


class BadAxisType(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ReduceMin()(x, 1.5)  # @float_axis


class BadExpand(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ExpandDims()(x, 4)  # @expand_axis


class BadSoftmax(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Softmax(axis=-3)(x)  # @softmax_axis


@pytest.mark.parametrize("cell,marker,text", [
    (BadAxis, "bad_axis", "axis 2 is out of range for a tensor of rank 2 (valid: -2..1)"),
    (BadAxisTuple, "repeated_axis", "repeats an axis"),
    (BadAxisType, "float_axis", "axis must be an int, a tuple of ints or None, got 1.5"),
    (BadExpand, "expand_axis", "ExpandDims: axis 4 out of range for rank 2"),
    (BadSoftmax, "softmax_axis", "axis -3 is out of range"),
])
@pytest.mark.parametrize("fusion", [False, True])
def test_bad_axis(cell: type, marker: str, text: str, fusion: bool) -> None:
    context.set_context(enable_graph_kernel=fusion)
    with pytest.raises(ShapeError) as info:
        cell()(F32)
    assert text in str(info.value)
    assert_at(info.value, marker)


class EmptyMax(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ReduceMax()(x, 0)  # @empty_max


def test_max_over_an_empty_axis() -> None:
    with pytest.raises(ShapeError) as info:
        EmptyMax()(np.zeros((0, 3), np.float32))
    assert "empty axis" in str(info.value) and "(0, 3)" in str(info.value)
    assert_at(info.value, "empty_max")


class Huge(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.BroadcastTo((1 << 20, 1 << 20, 1 << 10))(x)  # @huge


def test_result_larger_than_memory() -> None:
    with pytest.raises(ResourceError) as info:
        Huge()(np.ones((1,), np.float32))
    msg = str(info.value)
    assert "BroadcastTo would produce float32[1048576,1048576,1024] (4.0 PiB)" in msg
    assert "more than this machine's memory" in msg
    assert isinstance(info.value, MemoryError)
    assert_at(info.value, "huge")


class ManyMedium(nn.Cell):
    def construct(self, x: Any) -> Any:
        a = x * 2.0  # @medium
        b = a + 1.0
        c = b * b
        return c - a


def test_graph_larger_than_memory_in_total(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each result fits, all together do not: refused at compile time, before any kernel runs.
    x = np.ones((256, 256), np.float32)  # 256 KiB per value, 5 values in the graph
    monkeypatch.setattr(primitive, "physical_memory", lambda: 1 << 20)
    ran = []
    monkeypatch.setattr(graphkernel.runtime.executable.Executable, "run",
                        lambda *a: ran.append(a))
    with pytest.raises(ResourceError) as info:
        ManyMedium()(x)
    msg = str(info.value)
    assert "ManyMedium needs 1.2 MiB for its inputs and results" in msg
    assert "memory (1.0 MiB)" in msg and "float32[256,256]" in msg
    assert "the largest is Mul" in msg
    assert_at(info.value, "medium")
    assert not ran


class RowSums(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.ReduceSum()(P.Exp()(x), 0)


@pytest.mark.parametrize("fusion", [False, True])
def test_a_zero_stride_view_too_large_to_copy(fusion: bool) -> None:
    # 4 TiB as a dense array, 256 bytes as a broadcast view: the dynamic rows let it past the
    # compile's size check, and the kernels need it dense: refused before the copy is tried.
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=fusion)
    net = RowSums()
    net.set_inputs(Tensor(shape=[None, 64], dtype=graphkernel.float32))
    np.testing.assert_allclose(net(Tensor(np.zeros((3, 64), np.float32))).asnumpy(), 3.0)
    huge = np.broadcast_to(np.zeros((1, 64), np.float32), (2**34, 64))
    with pytest.raises(ResourceError) as info:
        net(Tensor(huge))
    msg = str(info.value)
    assert "RowSums input 'x' is a float32[17179869184, 64] view (strides [0, 4])" in msg
    assert "dense array of 4.0 TiB, more than this machine's memory" in msg
    assert isinstance(info.value, MemoryError)


# ---------------------------------------------------------------------------------------------
# Arrays the user passes: any layout works, and they are never written to

def _layouts(a: np.ndarray) -> dict[str, np.ndarray]:
    readonly = a.copy()
    readonly.setflags(write=False)
    wide = np.zeros((a.shape[0] * 2, a.shape[1] * 3), a.dtype)
    strided = wide[::2, ::3]
    strided[...] = a
    return {"fortran": np.asfortranarray(a), "readonly": readonly, "strided": strided,
            "transposed_view": np.ascontiguousarray(a.T).T}


class Net(nn.Cell):
    def construct(self, x: Any, y: Any) -> Any:
        s = P.Softmax()(x * 2.0 + y)
        return s, P.ReduceSum(keep_dims=True)(x, 1) - y, P.Transpose()(x, (1, 0)) * 1.0


class Elementwise(nn.Cell):
    """One fused kernel and nothing else (the whole call can run in generated C)."""

    def construct(self, x: Any, y: Any) -> Any:
        return P.Exp()(x * 2.0 - y) + y, (x - 1.0) * y


@pytest.mark.parametrize("cell", [Net, Elementwise])
@pytest.mark.parametrize("fusion", [False, True])
def test_any_input_layout_gives_correct_results(fusion: bool, cell: type) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)
    exe = graphkernel.compile(cell(), x, y, options=CompileOptions(enable_graph_kernel=fusion))
    want = exe.run_arrays(x, y)
    for name, xv in _layouts(x).items():
        for yname, yv in _layouts(y).items():
            for args in ((xv, yv), (Tensor(xv), Tensor(yv))):
                got = exe.run_arrays(*args)
                for g, w in zip(got, want):
                    np.testing.assert_array_equal(g, w, err_msg=f"{name}/{yname}")
    context.set_context(enable_graph_kernel=fusion)
    net = cell()
    for xv, yv in zip(_layouts(x).values(), _layouts(y).values()):
        for g, w in zip(net(Tensor(xv), Tensor(yv)), want):
            np.testing.assert_array_equal(g.asnumpy(), w)


@pytest.mark.parametrize("cell", [Net, Elementwise])
@pytest.mark.parametrize("fusion", [False, True])
def test_kernels_never_write_into_inputs(fusion: bool, cell: type) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 5)).astype(np.float32)
    y = rng.standard_normal((4, 5)).astype(np.float32)
    x0, y0 = x.copy(), y.copy()
    exe = graphkernel.compile(cell(), x, y, options=CompileOptions(enable_graph_kernel=fusion))
    outs = exe.run_arrays(x, y)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    # Results never alias the inputs: writing into them leaves the inputs alone.
    for out in outs:
        assert not np.shares_memory(out, x) and not np.shares_memory(out, y)
        out[...] = 0
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    # ...and a second call does not overwrite the first call's results.
    first = [o.copy() for o in exe.run_arrays(x, y)]
    kept = exe.run_arrays(x, y)
    exe.run_arrays(y, x)
    for k, f in zip(kept, first):
        np.testing.assert_array_equal(k, f)


class Identity(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Reshape()(x, (-1,)), P.AddN()([x])


@pytest.mark.parametrize("fusion", [False, True])
def test_results_that_are_views_of_inputs_are_copies(fusion: bool) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    outs = graphkernel.compile(Identity(), x,
                               options=CompileOptions(enable_graph_kernel=fusion)).run_arrays(x)
    for out in outs:
        assert not np.shares_memory(out, x)


class BadKernel(nn.GraphKernel):
    def construct(self, x: Any, y: Any) -> Any:
        return x * 2.0 + y  # @in_kernel


class UsesBadKernel(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.k = BadKernel()

    def construct(self, x: Any) -> Any:
        return self.k(x, P.Transpose()(x, (1, 0)))


class KernelGivenAList(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.k = BadKernel()

    def construct(self, x: Any) -> Any:
        return self.k(x, [1.0, 2.0, 3.0])  # @kernel_list


@pytest.mark.parametrize("fusion", [False, True])
def test_errors_inside_a_graph_kernel_point_into_it(fusion: bool) -> None:
    context.set_context(enable_graph_kernel=fusion)
    with pytest.raises(ShapeError) as info:
        UsesBadKernel()(F32)
    assert "(2, 3)" in str(info.value) and "(3, 2)" in str(info.value)
    assert_at(info.value, "in_kernel")
    with pytest.raises(InputError) as info2:
        KernelGivenAList()(F32)
    assert "BadKernel (a GraphKernel) takes tensors; input 1 is a list" in str(info2.value)
    assert_at(info2.value, "kernel_list")


# ---------------------------------------------------------------------------------------------
# Second wave (issue 16): arguments of the wrong kind, and programs graph mode cannot take

class CastWithoutDtype(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Cast()(x)  # @cast_no_dtype


class ShapeOpWithNone(nn.Cell):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def construct(self, x: Any) -> Any:
        return self.op(x, None)  # @shape_none


class ShapeOpWithText(nn.Cell):
    def construct(self, x: Any) -> Any:
        return P.Reshape()(x, "abc")  # @shape_text


@pytest.mark.parametrize("fusion", [False, True])
def test_cast_without_a_dtype(fusion: bool) -> None:
    with pytest.raises(InputError) as info:
        graphkernel.compile(CastWithoutDtype(), F32,
                            options=CompileOptions(enable_graph_kernel=fusion))
    assert "Cast needs its 'dtype' argument" in str(info.value)
    assert_at(info.value, "cast_no_dtype")


@pytest.mark.parametrize("op, attr", [(P.Reshape(), "shape"), (P.Transpose(), "perm"),
                                      (P.Tile(), "multiples")])
def test_shape_ops_given_none(op: Any, attr: str) -> None:
    with pytest.raises(InputError) as info:
        graphkernel.compile(ShapeOpWithNone(op), F32)
    assert f"needs its {attr!r} argument" in str(info.value)
    assert_at(info.value, "shape_none")


def test_a_shape_that_is_not_integers() -> None:
    with pytest.raises(InputError) as info:
        graphkernel.compile(ShapeOpWithText(), F32)
    assert "Reshape: shape must be a tuple of integers, got 'abc'" in str(info.value)
    assert_at(info.value, "shape_text")


def test_a_flag_attribute_that_is_not_a_bool() -> None:
    with pytest.raises(InputError) as info:
        P.ReduceSum(keep_dims="yes")  # @keep_dims_yes
    assert "ReduceSum: keep_dims must be True or False, got 'yes'" in str(info.value)
    assert_at(info.value, "keep_dims_yes")
    assert P.ReduceSum(keep_dims=np.True_).attrs["keep_dims"]  # numpy's bools are bools


def test_compiling_something_that_is_not_a_cell() -> None:
    with pytest.raises(InputError) as info:
        graphkernel.compile(lambda a: a, F32)  # @compile_lambda
    msg = str(info.value)
    assert "graphkernel.compile takes an nn.Cell" in msg and "got a function" in msg
    assert_at(info.value, "compile_lambda")


class Recursive(nn.Cell):
    def construct(self, x: Any) -> Any:
        return self.construct(x * 2.0) + 1.0  # @recursion


def test_a_construct_that_recurses_without_end() -> None:
    with pytest.raises(GraphModeError) as info:
        Recursive()(F32)
    assert "Recursive.construct calls itself without end" in str(info.value)
    assert_at(info.value, "recursion")


class ReturnsNothing(nn.Cell):
    def construct(self, x: Any) -> Any:  # @returns_empty
        return ()


@pytest.mark.parametrize("fusion", [False, True])
def test_construct_returning_an_empty_tuple(fusion: bool) -> None:
    with pytest.raises(GraphModeError) as info:
        graphkernel.compile(ReturnsNothing(), F32,
                            options=CompileOptions(enable_graph_kernel=fusion))
    assert "ReturnsNothing.construct returned no tensor" in str(info.value)
    assert_at(info.value, "returns_empty")
