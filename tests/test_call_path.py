"""The per-call path of a Cell, `net(Tensor(x))`: one C call from `Cell.__call__` to the kernels
(backends/c/c_entry.py `call`), and every condition that must send a call down the full path."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest
from cells import Fn

from graphkernel import Parameter, Tensor, context, nn, ops
from graphkernel.tools.lab import NetBasicFuse


@pytest.fixture(autouse=True)
def graph_mode() -> None:
    context.set_context(mode=context.GRAPH_MODE, device_target="CPU", enable_graph_kernel=True)


def python_calls(fn) -> list[str]:
    """The Python functions entered while `fn()` runs (C functions are not listed)."""
    seen: list[str] = []

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call":
            seen.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen[1:]  # the first is `fn` itself


class Scaled(nn.Cell):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.w = Parameter(Tensor(np.full((n,), 2.0, np.float32)), name="w")
        self.mul, self.add = ops.Mul(), ops.Add()

    def construct(self, x):
        return self.add(self.mul(x, self.w), x)


class TwoOut(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.exp, self.neg = ops.Exp(), ops.Neg()

    def construct(self, x):
        return self.exp(x), self.neg(x)


def test_a_repeated_call_enters_only_cell_call(rng) -> None:
    net = NetBasicFuse()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    calls = python_calls(lambda: net(Tensor(x)))
    assert [c for c in calls if not c.endswith("__init__")] == ["cell.py:__call__"], calls
    out = net(Tensor(x))
    assert type(out) is Tensor
    np.testing.assert_allclose(out.asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)


def test_results_are_tensors_and_tuples_of_tensors(rng) -> None:
    net = TwoOut()
    x = rng.standard_normal((3, 5)).astype(np.float32)
    for _ in range(3):
        a, b = net(Tensor(x))
        assert type(a) is Tensor and type(b) is Tensor
        np.testing.assert_allclose(a.asnumpy(), np.exp(x), rtol=1e-6)
        np.testing.assert_array_equal(b.asnumpy(), -x)
        assert not a.is_symbolic and a.shape == (3, 5)


def test_results_kept_by_the_caller_are_never_reused(rng) -> None:
    net = NetBasicFuse()
    xs = [rng.standard_normal((4, 4)).astype(np.float32) for _ in range(5)]
    outs = [net(Tensor(x)) for x in xs]  # all held: the pool must hand out new buffers
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(out.asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)


def test_parameters_are_read_on_every_call(rng) -> None:
    net = Scaled(6)
    x = rng.standard_normal((2, 6)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x * 3, rtol=1e-6)
    net.w.set_data(np.full((6,), -1.0, np.float32))
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x * 0, atol=1e-7)


def test_another_shape_dtype_or_argument_kind_takes_the_full_path(rng) -> None:
    net = NetBasicFuse()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    y = rng.standard_normal((3, 7)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(y)).asnumpy(), (y * 2 + 1) * 3, rtol=1e-6)
    z = rng.standard_normal((4, 4))  # float64: its own graph
    out = net(Tensor(z))
    assert out.dtype == np.float64
    np.testing.assert_allclose(out.asnumpy(), (z * 2 + 1) * 3, rtol=1e-12)
    np.testing.assert_allclose(net(x).asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)  # a bare array
    np.testing.assert_allclose(net(Tensor(x[:, ::2])).asnumpy(),  # not contiguous
                               (x[:, ::2] * 2 + 1) * 3, rtol=1e-6)
    with pytest.raises(Exception, match="input"):
        net(Tensor(x), Tensor(x))  # too many inputs: the full path's clear error


def test_context_changes_and_set_train_leave_the_last_graph(rng) -> None:
    net = NetBasicFuse()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    net(Tensor(x))
    assert net.__dict__["_last_call"][1].kernel_count == 1
    context.set_context(enable_graph_kernel=False)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)
    assert net.__dict__["_last_call"][1].kernel_count == 3  # one kernel per op
    assert len(net._compiled) == 2
    context.set_context(enable_graph_kernel=True)
    net(Tensor(x))
    assert net.__dict__["_last_call"][1].kernel_count == 1
    context.set_context(mode=context.PYNATIVE_MODE)
    calls = python_calls(lambda: net(Tensor(x)))
    assert any(c.endswith(":construct") for c in calls)  # eager: construct runs
    context.set_context(mode=context.GRAPH_MODE)
    last = net.__dict__["_last_call"][1]
    net.set_train(True)  # its construct never reads `training`: the same graph goes on
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2 + 1) * 3, rtol=1e-6)
    assert net.__dict__["_last_call"][1] is last


def test_a_graph_without_entry_leaves_no_last_call(rng) -> None:
    # a lone ReduceMax stays a numpy step with fusion off (a lone ReduceSum is a kernel:
    # declared `kernel_alone`, graph_kernel/single_op.py): no C entry
    net = Fn(lambda a: ops.ReduceMax()(a * 2.0, 1))
    x = rng.standard_normal((4, 6)).astype(np.float32)
    context.set_context(enable_graph_kernel=False)
    for _ in range(2):
        np.testing.assert_allclose(net(Tensor(x)).asnumpy(), (x * 2).max(1), rtol=1e-6)
        assert "_last_call" not in net.__dict__


def test_a_changed_attribute_recompiles(rng) -> None:
    class Affine(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.scale = 2.0
            self.mul = ops.Mul()

        def construct(self, x):
            return self.mul(x, self.scale)

    net = Affine()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x * 2, rtol=1e-6)
    net.scale = 5.0
    np.testing.assert_allclose(net(Tensor(x)).asnumpy(), x * 5, rtol=1e-6)


def test_a_cell_called_inside_construct_is_traced_not_run(rng) -> None:
    inner = NetBasicFuse()
    x = rng.standard_normal((4, 4)).astype(np.float32)
    inner(Tensor(x))  # the inner cell has a per-call path of its own now

    class Outer(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.inner = inner
            self.add = ops.Add()

        def construct(self, y):
            return self.add(self.inner(y), y)

    outer = Outer()
    out = outer(Tensor(x))
    np.testing.assert_allclose(out.asnumpy(), (x * 2 + 1) * 3 + x, rtol=1e-6)
    (exe,) = outer._compiled.values()
    traced = [n.op for n in exe.report.stages["0_trace"].nodes]
    assert traced == ["Mul", "Add", "Mul", "Add"]  # the inner cell's ops are in the graph
    assert exe.kernel_count == 1


def test_calls_from_threads_agree(rng) -> None:
    net = Scaled(8)
    xs = [rng.standard_normal((16, 8)).astype(np.float32) for _ in range(4)]
    net(Tensor(xs[0]))
    errors: list[str] = []

    def worker(x: np.ndarray) -> None:
        for _ in range(200):
            got = net(Tensor(x)).asnumpy()
            if not np.allclose(got, x * 3, rtol=1e-6):
                errors.append("mismatch")
                return

    threads = [threading.Thread(target=worker, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_an_input_the_entry_declines_is_offered_to_it_once(rng) -> None:
    # One path from Cell.__call__ to the kernels: the Cell's per-call path offers the input to
    # the compiled entry; when it declines (a strided view), neither the CompiledCell nor the
    # Executable offers it again: the Python runner takes it.
    net = NetBasicFuse()
    x = rng.standard_normal((4, 8)).astype(np.float32)
    net(Tensor(np.ascontiguousarray(x[:, ::2])))
    # Each of the entry's functions wrapped to count its calls: the per-call path's own (held
    # in the cell's _last_call) and the runner's. (A sys.setprofile hook missed the C call once
    # the interpreter had specialised Cell.__call__ after other tests' many calls.)
    generation, exe, fast, *fixed = net.__dict__["_last_call"]
    runner = exe.executable.runner
    assert fast is runner.entry_call is runner.entry_module.call
    offered: list[str] = []

    def counted(name, function):  # noqa: ANN001, ANN202
        def offer(*args):  # noqa: ANN002, ANN202
            offered.append(name)
            return function(*args)
        return offer

    runner.entry_call = counted("call", runner.entry_call)
    runner.entry = counted("run", runner.entry)
    net.__dict__["_last_call"] = (generation, exe, runner.entry_call, *fixed)
    out = net(Tensor(x[:, ::2]))  # the compiled shape and dtype, not contiguous
    assert offered == ["call"], offered
    np.testing.assert_allclose(out.asnumpy(), (x[:, ::2] * 2 + 1) * 3, rtol=1e-6)
