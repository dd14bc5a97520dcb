"""Matrix products over a dynamic batch run from the compiled entry (backends/c/c_gemm.py):
a shape-generic plan (`Cell.set_inputs` with None, an ONNX export's dim_param) of kernels and
products is one C call, as the static plan is. The dynamic size sits on the leading axis (the
rows of one GEMM, or the first batch axis of a stack); strides stay numbers. The entry's result
for batch 3, 1 and 0 is numpy's, and the Python runner's; a product with a dynamic size elsewhere
keeps the Python runner."""
from __future__ import annotations

import numpy as np
import pytest
from cells import needs_openmp

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.frontend import context
from graphkernel.ops import operations as P


class Product(nn.Cell):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def construct(self, a, b):
        return P.ReLU()(self.fn(a, b))  # a kernel after the product: the entry holds the plan


# name: (product, numpy's, a's shape with None for the batch, b's shape)
CASES = {
    "rows (a classifier)": (lambda a, b: P.MatMul(transpose_b=True)(a, b),
                            lambda a, b: a @ b.T, (None, 12), (10, 12)),
    "batch of sequences times a matrix": (lambda a, b: P.MatMul()(a, b), lambda a, b: a @ b,
                                          (None, 6, 12), (12, 5)),
    # both stacks of one batch (two None inputs would be two sizes)
    "attention heads": (lambda a, b: P.BatchMatMul(transpose_b=True)(a, a * b),
                        lambda a, b: a @ np.swapaxes(a * b, -1, -2), (None, 4, 16, 8),
                        (4, 16, 8)),
    "heads times one matrix": (lambda a, b: P.BatchMatMul()(a, b), lambda a, b: a @ b,
                               (None, 3, 5, 7), (7, 4)),
}


def _entry_and_runner(net, a, b):
    exe = next(iter({id(v): v for v in net._compiled.values()}.values()))
    runner = exe.executable.runner
    by_entry = runner.entry(a, b, *runner.entry_constants)
    assert by_entry is not NotImplemented  # the entry took the call
    by_steps = runner.run(exe.executable.check_inputs([a, b]), [])
    return exe, by_entry, by_steps[0]


@needs_openmp
@pytest.mark.parametrize("case", list(CASES))
def test_a_product_over_a_dynamic_batch_runs_from_the_entry(case, rng):
    context.set_context(enable_graph_kernel=True)
    fn, reference, a_shape, b_shape = CASES[case]
    net = Product(fn)
    net.set_inputs(Tensor(shape=list(a_shape), dtype=graphkernel.float32),
                   Tensor(shape=list(b_shape), dtype=graphkernel.float32))
    for batch in (3, 1, 0):  # 0: an empty batch, no BLAS call
        a = rng.standard_normal([batch if d is None else d for d in a_shape]).astype(np.float32)
        b = rng.standard_normal([batch if d is None else d for d in b_shape]).astype(np.float32)
        expected = np.maximum(reference(a, b), 0)
        np.testing.assert_allclose(net(Tensor(a), Tensor(b)).asnumpy(), expected, rtol=1e-5,
                                   atol=1e-5)
        exe, by_entry, by_steps = _entry_and_runner(net, a, b)
        assert exe.entry is not None, exe.plan.describe()
        assert "N" in str(exe.plan.steps[0].out_types[0])  # the shape-generic plan
        np.testing.assert_allclose(by_entry, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(by_entry, by_steps, rtol=1e-6, atol=1e-6)


def test_a_dynamic_size_on_another_axis_keeps_the_python_runner(rng):
    context.set_context(enable_graph_kernel=True)
    net = Product(lambda a, b: P.MatMul(transpose_a=True)(a, b))  # a's rows: its 2nd axis
    net.set_inputs(Tensor(shape=[6, None], dtype=graphkernel.float32),
                   Tensor(shape=[6, 4], dtype=graphkernel.float32))
    a = rng.standard_normal((6, 3)).astype(np.float32)
    b = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(net(Tensor(a), Tensor(b)).asnumpy(), np.maximum(a.T @ b, 0),
                               rtol=1e-5, atol=1e-5)
    exe = next(iter(net._compiled.values()))
    assert exe.entry is None
