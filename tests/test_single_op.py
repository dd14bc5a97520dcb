"""Lone ops with fusion off (graph_kernel/single_op.py): the ops declared `kernel_alone` on
their OpDef (a transposed copy, a concatenation, a sum) run as one generated kernel each, so a
plan of them keeps the compiled entry; views, products and other reductions do not."""
import numpy as np
from cells import Fn

import graphkernel
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.graph_kernel.single_op import runs_as_kernel
from graphkernel.ir.opset import OPS
from graphkernel.ops import operations as P
from graphkernel.runtime.reference import run_reference_graph

UNFUSED = CompileOptions(enable_graph_kernel=False)


def test_the_fact_is_declared_for_exactly_the_copies_and_the_sum():
    # The list single_op.py held before the fact moved onto the declarations.
    assert {name for name, op in OPS.items() if op.kernel_alone} == \
        {"Transpose", "Concat", "ReduceSum"}


def test_lone_copies_and_a_sum_run_as_kernels_and_keep_the_entry(rng):
    a = rng.standard_normal((13, 7, 5)).astype(np.float32)
    b = rng.standard_normal((13, 3, 5)).astype(np.float32)

    def body(x, y):
        t = P.Transpose()(x, (2, 0, 1))
        c = P.Concat(1)((x, y))
        return t, c, P.ReduceSum(keep_dims=False)(c, 1)
    exe = graphkernel.compile(Fn(body), a, b, options=UNFUSED)
    assert [(k.op_names, k.backend) for k in exe.kernels] == [
        (["Transpose"], "native"), (["Concat"], "native"), (["ReduceSum"], "native")]
    assert all(runs_as_kernel(n) for n in exe.graph.nodes)
    assert exe.entry is not None  # every step a generated kernel: one C call
    want = (a.transpose(2, 0, 1), np.concatenate([a, b], 1), np.concatenate([a, b], 1).sum(1))
    for got, ref in zip(exe.run_arrays(a, b), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    for got, ref in zip(exe.run_arrays(a, b), run_reference_graph(exe.graph, [a, b])):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_ops_not_declared_stay_numpy_steps(rng):
    # Another reduction (ReduceMax) is not declared: a numpy call, and no compiled entry.
    x = rng.standard_normal((9, 11)).astype(np.float32)
    exe = graphkernel.compile(Fn(lambda v: P.ReduceMax(keep_dims=False)(v, 0)), x,
                              options=UNFUSED)
    assert [(k.op_names, k.backend) for k in exe.kernels] == [(["ReduceMax"], "library")]
    assert not runs_as_kernel(exe.graph.nodes[0])
    assert exe.entry is None
    np.testing.assert_allclose(exe.run_arrays(x)[0], x.max(0), rtol=1e-6)
