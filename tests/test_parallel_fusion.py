"""Parallel (horizontal) fusion: independent groups and siblings of one input launched as one
kernel; refusals (path between them, large groups, library calls) recorded with their reason;
fused vs unfused vs numpy on random inputs; the flag both ways; the dumps; a training step."""
import re

import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.frontend import context
from graphkernel.graph_kernel.cost_model import CostModel
from graphkernel.graph_kernel.flags import flags_text, parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P
from graphkernel.passes import stage_names
from graphkernel.runtime.plan import StepKind

mul, add, sub, exp, tanh = P.Mul(), P.Add(), P.Sub(), P.Exp(), P.Tanh()
NO_PARALLEL = CompileOptions(enable_graph_kernel=True,
                             flags=parse_flags("--enable_parallel_fusion=false"))


def compiled(fn, *arrays, options=ON):
    return graphkernel.compile(Fn(fn), *arrays, options=options)


def check_all(fn, numpy_fn, *arrays, rtol=1e-5, atol=1e-6):
    """Parallel fusion on, off, fusion off and numpy agree; returns the executable (on)."""
    on = compiled(fn, *arrays)
    expected = numpy_fn(*arrays)
    results = [expected if isinstance(expected, tuple) else (expected,)]
    results += [compiled(fn, *arrays, options=o).run_arrays(*arrays) for o in (NO_PARALLEL, OFF)]
    got = on.run_arrays(*arrays)
    for want in results:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return on


def kernel_steps(exe):
    return [s for s in exe.executable.plan.steps if s.kind is StepKind.KERNEL]


def loops(source):
    return len(re.findall(r"\bfor \(", source))


def parallel_reasons(exe):
    return [r for r in exe.reasons if r.parallel]


def test_independent_branches_are_one_kernel(rng):
    x, y = (rng.standard_normal((4, 4)).astype(np.float32) for _ in range(2))
    exe = check_all(lambda x, y: (mul(x, 2.0), add(y, 1.0)), lambda x, y: (x * 2, y + 1), x, y)
    assert [(k.name, k.backend) for k in exe.kernels] == [("Parallel_Mul_Add", "native")]
    (step,) = kernel_steps(exe)
    assert len(step.writes) == 2 and len(step.reads) == 2  # one step, two results
    # same iteration space: interleaved in one loop nest
    assert loops(exe.kernels[0].source) == 1
    final = exe.stages[stage_names.END]
    (node,) = final.nodes[:1]
    assert node.op == "Composite" and node.notes["members"] == ["Mul", "Add"]
    assert node.notes["loop_nests"] == [[0, 1]]
    assert len(compiled(lambda x, y: (mul(x, 2.0), add(y, 1.0)), x, y,
                        options=NO_PARALLEL).kernels) == 2


def test_siblings_of_one_input_read_it_once(rng):
    x = rng.standard_normal((4, 4)).astype(np.float32)
    exe = check_all(lambda x: (exp(mul(x, 2.0)), add(x, 1.0)),
                    lambda x: (np.exp(x * 2), x + 1), x)
    assert [k.name for k in exe.kernels] == ["Parallel_Mul_Exp_Add"]
    source = exe.kernels[0].source
    assert loops(source) == 1
    assert source.count("in0[i0]") == 2 and "in1" not in source  # x is the one input
    node = exe.stages[stage_names.END].nodes[0]
    assert node.notes["members"] == ["Fused_Mul_Exp", "Add"]
    assert "interleaved in one loop nest" in node.notes["parallel"]


def test_different_spaces_run_one_loop_nest_after_another(rng):
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.standard_normal(7).astype(np.float64)
    z = rng.standard_normal((3, 8)).astype(np.float32)
    exe = check_all(
        lambda x, y, z: (tanh(mul(x, 2.0)), add(y, 1.0), P.ReduceSum()(exp(z), 1)),
        lambda x, y, z: (np.tanh(x * 2), y + 1, np.exp(z).sum(1)), x, y, z)
    assert len(exe.kernels) == 1 and exe.kernels[0].backend == "native"
    (step,) = kernel_steps(exe)
    assert len(step.writes) == 3
    source = exe.kernels[0].source
    assert source.count("static void") == 3  # a function per loop nest, one entry
    node = exe.stages[stage_names.END].nodes[0]
    assert len(node.notes["loop_nests"]) == 3
    assert "3 loop nests one after another" in node.notes["parallel"]


def test_a_path_between_groups_keeps_them_apart_with_the_reason(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    w = rng.standard_normal((8, 8)).astype(np.float32)
    # x*2 feeds a MatMul whose result the sibling x+... reads: one launch would wait on itself
    exe = check_all(lambda x, w: add(x, P.MatMul()(mul(x, 2.0), w)),
                    lambda x, w: x + (x * 2) @ w, x, w, rtol=1e-4, atol=1e-4)
    assert [k.name for k in exe.kernels] == ["Mul", "MatMul", "Add"]
    cycle = [r for r in parallel_reasons(exe) if r.rule == "cycle"]
    assert len(cycle) == 1
    assert (cycle[0].producer, cycle[0].consumer) == ("Mul", "Add")
    assert "Mul reaches Add" in cycle[0].detail
    assert "Mul || Add: not one launch (cycle)" in exe.summary()


def test_matmul_sibling_is_a_library_call_with_the_reason(rng):
    x, w = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    exe = check_all(lambda x, w: (P.MatMul()(x, w), add(x, 1.0)),
                    lambda x, w: (x @ w, x + 1), x, w, rtol=1e-4, atol=1e-4)
    assert sorted(k.name for k in exe.kernels) == ["Add", "MatMul"]
    (reason,) = parallel_reasons(exe)
    assert reason.rule == "pattern" and "MatMul is opaque" in reason.detail


def test_large_groups_are_refused_by_the_cost_model(rng):
    n = 1024  # each kernel moves 8 MiB: over parallel_max_bytes, it saturates memory
    x, y = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    exe = check_all(lambda x, y: (mul(x, 2.0), add(y, 1.0)), lambda x, y: (x * 2, y + 1), x, y)
    assert len(exe.kernels) == 2
    (reason,) = parallel_reasons(exe)
    assert reason.rule == "cost" and "saturates memory" in reason.detail
    # with the threshold above both, they share one launch again
    big = CompileOptions(enable_graph_kernel=True,
                         cost=CostModel(parallel_max_bytes=64 << 20))
    assert len(compiled(lambda x, y: (mul(x, 2.0), add(y, 1.0)), x, y,
                        options=big).kernels) == 1
    # large siblings of one input still share one loop nest: x is read once instead of twice
    exe = check_all(lambda x: (exp(mul(x, 2.0)), add(x, 1.0)),
                    lambda x: (np.exp(x * 2), x + 1), x)
    assert len(exe.kernels) == 1 and loops(exe.kernels[0].source) >= 1


def test_different_spaces_large_and_small(rng):
    """One large group and small ones: the small ones' launches are saved; two large nests
    are refused."""
    big = rng.standard_normal((1024, 1024)).astype(np.float32)
    small = rng.standard_normal((5, 3)).astype(np.float32)
    exe = check_all(lambda a, b: (mul(a, 2.0), add(b, 1.0)), lambda a, b: (a * 2, b + 1),
                    big, small)
    assert len(exe.kernels) == 1
    exe = check_all(lambda a, b, c: (mul(a, 2.0), add(b, 1.0), P.ReduceSum()(c, 0)),
                    lambda a, b, c: (a * 2, b + 1, c.sum(0)), big, big.T.copy(), small)
    assert len(exe.kernels) == 2
    assert [r.rule for r in parallel_reasons(exe)] == ["cost"]


def test_flag_turns_it_off_and_on():
    x = np.ones((4, 4), np.float32)

    def fn(x, y):
        return mul(x, 2.0), add(y, 1.0)

    for flags, count in [("", 1), ("--enable_parallel_fusion", 1),
                         ("--enable_parallel_fusion=false", 2),
                         ("--disable_pass=parallel_fusion", 2),
                         ("--enable_parallel_fusion=false --enable_pass=parallel_fusion", 1),
                         ("--opt_level=0", 2)]:
        exe = compiled(fn, x, x, options=CompileOptions(enable_graph_kernel=True,
                                                        flags=parse_flags(flags)))
        assert len(exe.kernels) == count, flags
        assert (stage_names.PARALLEL_FUSION in exe.stages) == (count == 1), flags
    off = parse_flags("--enable_parallel_fusion=false", warn=True)  # acts: no NoEffectWarning
    assert off.no_effect == () and flags_text(off) == "--enable_parallel_fusion=false"
    assert flags_text(parse_flags("--enable_parallel_fusion")) == ""  # the default


def test_dumps_show_the_merged_group(tmp_path, rng):
    context.set_context(enable_graph_kernel=True, save_graphs=True,
                        save_graphs_path=str(tmp_path), graph_kernel_flags="--dump_as_text")
    cell = Fn(lambda x: (exp(mul(x, 2.0)), add(x, 1.0)))
    x = rng.standard_normal((4, 4)).astype(np.float32)
    out = cell(Tensor(x))
    np.testing.assert_allclose(out[1].asnumpy(), x + 1)
    before = (tmp_path / f"{stage_names.SIMPLIFY}.ir").read_text()
    after = (tmp_path / f"{stage_names.PARALLEL_FUSION}.ir").read_text()
    final = (tmp_path / f"{stage_names.END}.ir").read_text()
    assert "Parallel_" not in before and "Fused_Mul_Exp" in before
    for text in (after, final):
        assert "Parallel_Mul_Exp_Add" in text
        assert "members: Fused_Mul_Exp Add" in text
        assert "parallel: 2 groups interleaved in one loop nest" in text
    assert "Parallel_Mul_Exp_Add" in (tmp_path / "graph_kernel_summary.txt").read_text()


@pytest.mark.parametrize("seed", range(6))
def test_random_independent_branches(seed):
    """Random branches (shapes, dtypes, ops, some sharing inputs): parallel fusion on equals
    off, fusion off and numpy, and never launches more kernels than without it."""
    rng = np.random.default_rng(seed)
    shapes = [(4, 4), (3, 5), (4,), (2, 3, 4), (16, 8)]
    dtypes = [np.float32, np.float64]
    inputs = [rng.standard_normal(shapes[rng.integers(len(shapes))]).astype(
        dtypes[rng.integers(2)]) for _ in range(rng.integers(2, 4))]
    ops = [(lambda v: mul(v, 2.0), lambda v: v * 2), (lambda v: exp(tanh(v)),
                                                      lambda v: np.exp(np.tanh(v))),
           (lambda v: sub(add(v, 1.0), v), lambda v: v + 1 - v),
           (lambda v: P.ReduceSum()(mul(v, v), -1), lambda v: (v * v).sum(-1))]
    branches = [(int(rng.integers(len(inputs))), int(rng.integers(len(ops))))
                for _ in range(rng.integers(2, 6))]

    def fn(*xs):
        return tuple(ops[k][0](xs[i]) for i, k in branches)

    def numpy_fn(*xs):
        return tuple(ops[k][1](xs[i]) for i, k in branches)

    exe = check_all(fn, numpy_fn, *inputs)
    apart = compiled(fn, *inputs, options=NO_PARALLEL)
    assert len(exe.kernels) <= len(apart.kernels)
    assert len(kernel_steps(exe)) == 1  # all are small and independent


def test_python_runner_runs_the_merged_kernel(rng):
    """A strided input sends the call to the Python runner: the merged step's arguments are
    bound there too."""
    x = rng.standard_normal((8, 4)).astype(np.float32)[::2]
    y = rng.standard_normal((3, 5)).astype(np.float32)
    exe = compiled(lambda x, y: (exp(x), add(y, 1.0)), np.ascontiguousarray(x), y)
    assert len(exe.kernels) == 1
    got = exe.run_arrays(x, y)
    np.testing.assert_allclose(got[0], np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(got[1], y + 1)


class SmallMLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Dense(6, 8), nn.Dense(8, 8), nn.Dense(8, 3)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.l3(self.relu(self.l2(self.relu(self.l1(x)))))


def _train(options, x, target, steps=3):
    np.random.seed(0)
    net = SmallMLP()
    for i, p in enumerate(net.trainable_params()):  # the same weights in every run
        p.set_data(Tensor(np.random.default_rng(i).standard_normal(p.shape).astype(np.float32)))
    loss = nn.WithLossCell(net, nn.MSELoss())
    step = nn.TrainOneStepCell(loss, nn.Adam(net.trainable_params(), 1e-2))
    exe = graphkernel.compile(step, x, target, options=options)
    losses = [float(exe.run_arrays(x, target)[0]) for _ in range(steps)]
    return exe, losses, [p.asnumpy().copy() for p in net.trainable_params()]


def test_training_step_merges_optimizer_updates(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    target = rng.standard_normal((4, 3)).astype(np.float32)
    on, losses_on, weights_on = _train(ON, x, target)
    apart, losses_apart, weights_apart = _train(NO_PARALLEL, x, target)
    _, losses_off, weights_off = _train(OFF, x, target)
    assert len(on.kernels) < len(apart.kernels)
    merged = [k for k in on.kernels if k.name.startswith("Parallel_")]
    assert merged and any(k.op_names.count("Sqrt") >= 2 for k in merged)  # several Adams
    np.testing.assert_allclose(losses_on, losses_apart, rtol=1e-5)
    np.testing.assert_allclose(losses_on, losses_off, rtol=1e-4)
    for a, b, c in zip(weights_on, weights_apart, weights_off):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


def test_exported_parallel_kernel_loads_with_its_loop_nests(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    net = Fn(lambda x, y: (tanh(y), P.ReduceSum()(mul(x, x), 1)))
    x = rng.standard_normal((5, 3)).astype(np.float32)
    y = rng.standard_normal(4).astype(np.float32)
    expected = [o.asnumpy() for o in net(Tensor(x), Tensor(y))]
    path = graphkernel.export(net, Tensor(x), Tensor(y), file_name=str(tmp_path / "net"))
    cell = nn.GraphCell(graphkernel.load(path))
    got = [o.asnumpy() for o in cell(Tensor(x), Tensor(y))]
    assert cell.compiled.kernel_count == 1
    assert cell.compiled.kernels[0].source.count("static void") == 2
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
