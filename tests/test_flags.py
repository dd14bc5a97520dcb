"""MindSpore's graph_kernel_flags and set_context keys: every documented name accepted, the
implemented ones acting, the rest named in one warning, typos an error with a suggestion."""
import warnings

import numpy as np
import pytest

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.errors import ContextError, FlagError, NoEffectWarning
from graphkernel.frontend import context
from graphkernel.graph_kernel.flags import IMPLEMENTED, MINDSPORE_FLAGS, parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

VALUES = {"bool": "", "int": "=1", "str": "=x", "list": "=GeLU"}


def _all_flags_text() -> str:
    parts = []
    for name, kind in MINDSPORE_FLAGS.items():
        value = VALUES[kind]
        if name in ("enable_pass", "disable_pass"):
            value = "=graph_kernel_simplify" if name == "enable_pass" else "=basic_op_fusion"
        elif name in ("enable_cluster_ops", "enable_cluster_ops_only", "disable_cluster_ops"):
            value = "=Add"
        elif name == "composite_op_limit_size":
            value = "=8"
        parts.append(f"--{name}{value}")
    return " ".join(parts)


class Fn(nn.Cell):
    def __init__(self, fn, **prims):
        super().__init__()
        self.fn = fn
        for name, prim in prims.items():
            setattr(self, name, prim)

    def construct(self, *xs):
        return self.fn(self, *xs)


def _compile(cell, x, flags):
    exe = graphkernel.compile(cell, x, options=CompileOptions(True, parse_flags(flags)))
    plain = graphkernel.compile(cell, x, options=CompileOptions(False))
    np.testing.assert_allclose(exe.run_arrays(x)[0], plain.run_arrays(x)[0], rtol=1e-5,
                               atol=1e-6)
    return exe


def test_mindsporess_whole_flag_list_is_accepted_with_one_warning():
    assert len(MINDSPORE_FLAGS) >= 42
    with pytest.warns(NoEffectWarning) as caught:
        flags = parse_flags(_all_flags_text(), warn=True)
    assert len(caught) == 1
    message = str(caught[0].message)
    for name in MINDSPORE_FLAGS:
        assert (f"--{name}" in message) == (name not in IMPLEMENTED or name in (
            "enable_expand_ops", "disable_expand_ops", "enable_cluster_ops",
            "disable_cluster_ops")), name  # the plain lists are overridden by *_only
    assert "no effect" in message and "ignored because" in message
    assert flags.enable_expand_ops_only == {"GeLU"} and flags.composite_op_limit_size == 8
    # The same string through set_context: accepted, one warning.
    with pytest.warns(NoEffectWarning):
        context.set_context(graph_kernel_flags=_all_flags_text())


def test_implemented_flags_alone_warn_nothing():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        context.set_context(graph_kernel_flags="--opt_level=2 --dump_as_text "
                            "--disable_expand_ops=Softmax --enable_cluster_ops_only=Add,Mul")


@pytest.mark.parametrize("text,message", [
    ("--opt_levle=2", "unknown flag --opt_levle (did you mean --opt_level?)"),
    ("--enable_paralel_fusion", "did you mean --enable_parallel_fusion?"),
    ("--enable_pass=basic_op_fusion --disable_pass=hwopt_2_basic_op_fusion",
     "both in --enable_pass and --disable_pass"),
    ("--enable_parallel_fusion=maybe", "takes true or false"),
    ("--online_tuning=high", "needs an integer"),
    ("--opt_level=2 --opt_level=1", "given twice"),
])
def test_bad_flags_name_the_problem(text, message):
    def escaped(m):
        return "".join("\\" + c if c in "()?[]." else c for c in m)
    with pytest.raises(FlagError, match=escaped(message)):
        context.set_context(graph_kernel_flags=text)


@pytest.mark.parametrize("text,message", [
    # MindSpore's op and pass names graphkernel lacks: warned, as MindSpore warns (issue 28).
    ("--enable_expand_ops=Conv2D", "--enable_expand_ops=Conv2D (graphkernel does not expand "
     "Conv2D"),
    ("--disable_pass=highlevelopt2.atomic_clean", "--disable_pass=highlevelopt2.atomic_clean "
     "(graphkernel has no stage highlevelopt2.atomic_clean"),
    ("--enable_expand_ops=SoftmaxGradExt", "graphkernel has no op SoftmaxGradExt (did you mean "
     "'SoftmaxGrad'?)"),
    # A misspelt name is told with the closest one graphkernel has.
    ("--disable_expand_ops=Softmx", "no op Softmx (did you mean 'Softmax'?)"),
    ("--enable_expand_ops_only=Mul", "graphkernel does not expand Mul"),
    ("--disable_pass=basic_fusion", "no stage basic_fusion (did you mean 'basic_op_fusion'?)"),
])
def test_names_graphkernel_lacks_warn_at_the_users_line(text, message, rng):
    def escaped(m):
        return "".join("\\" + c if c in "()?[]." else c for c in m)
    with pytest.warns(NoEffectWarning, match=escaped(message)) as caught:
        context.set_context(graph_kernel_flags=text)
    assert [w.filename for w in caught] == [__file__]
    # The program goes on: the names select nothing, the rest of the flags act.
    x = rng.standard_normal((4, 8)).astype(np.float32)
    cell = Fn(lambda s, x: s.softmax(s.mul(x, 2.0)), softmax=P.Softmax(), mul=P.Mul())
    with pytest.warns(NoEffectWarning) as caught:
        flags = parse_flags(text + " --disable_cluster_ops=Exp", warn=True)
    assert caught[0].filename == __file__ and flags.disable_cluster_ops == {"Exp"}
    _compile(cell, x, text)


def test_set_context_warnings_point_at_the_callers_line():
    with pytest.warns(NoEffectWarning) as caught:
        context.set_context(max_call_depth=100)
        graphkernel.context.set_context(graph_kernel_flags="--enable_stitch_fusion")
    assert [w.filename for w in caught] == [__file__] * 2


def test_enable_expand_ops_only_expands_just_those(rng):
    x = rng.standard_normal((8, 16)).astype(np.float32)
    cell = Fn(lambda s, x: s.softmax(s.gelu(x)), gelu=P.GeLU(), softmax=P.Softmax())
    exe = _compile(cell, x, "--enable_expand_ops_only=GeLU")
    # Softmax is not expanded: it runs as one op of its own; GeLU's expansion is fused.
    assert [k.op_names for k in exe.kernels][-1] == ["Softmax"]
    assert exe.kernels[0].backend == "native" and exe.kernels[0].op_names != ["GeLU"]
    both = _compile(cell, x, "")
    assert [k.backend for k in both.kernels] == ["native"]


def test_enable_cluster_ops_only_keeps_other_ops_apart(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    cell = Fn(lambda s, x: s.mul(s.exp(s.add(x, 1.0)), s.add(x, 2.0)), add=P.Add(), exp=P.Exp(),
              mul=P.Mul())
    exe = _compile(cell, x, "--enable_cluster_ops_only=Add,Mul")
    assert sorted(k.op_names for k in exe.kernels) == [["Add"], ["Add", "Mul"], ["Exp"]]
    # (parallel fusion also keeps Add(x, 1) apart from its sibling: Exp lies between them)
    assert {r.rule for r in exe.reasons if not r.parallel} == {"flag"}
    assert all("--enable_cluster_ops_only" in r.detail for r in exe.reasons if not r.parallel)
    assert len(_compile(cell, x, "").kernels) == 1


def test_enable_and_disable_pass_by_stage_name(rng):
    x = rng.standard_normal((8, 8)).astype(np.float32)
    cell = Fn(lambda s, x: s.mul(s.add(x, 1.0), 3.0), add=P.Add(), mul=P.Mul())
    exe = _compile(cell, x, "--disable_pass=basic_op_fusion,hwopt_3_composite_op_fusion")
    assert "hwopt_2_basic_op_fusion" not in exe.stages
    assert "hwopt_3_composite_op_fusion" not in exe.stages
    assert [k.op_names for k in exe.kernels] == [["Add"], ["Mul"]]
    # Only composite fusion: it fuses basic ops too, and records its reasons.
    exe = _compile(cell, x, "--disable_pass=basic_op_fusion")
    assert [k.op_names for k in exe.kernels] == [["Add", "Mul"]]
    # Simplification is an opt_level 2 stage; enable_pass turns it on at level 1.
    assert "hwopt_4_graph_kernel_simplify" not in _compile(cell, x, "--opt_level=1").stages
    assert "hwopt_4_graph_kernel_simplify" in _compile(
        cell, x, "--opt_level=1 --enable_pass=graph_kernel_simplify").stages


def test_dump_as_text_writes_graph_kernel_dump(tmp_path, monkeypatch, rng):
    x = Tensor(rng.standard_normal((4, 4)).astype(np.float32))
    cell = Fn(lambda s, x: s.mul(s.exp(x), 3.0), exp=P.Exp(), mul=P.Mul())
    context.set_context(enable_graph_kernel=True, save_graphs=True,
                        save_graphs_path=str(tmp_path / "dumps"),
                        graph_kernel_flags="--dump_as_text --disable_cluster_ops=Exp")
    cell(x)
    text = (tmp_path / "dumps" / "graph_kernel_dump" / "Fn.txt").read_text()
    assert "--disable_cluster_ops=Exp" in text and "not fused (flag)" in text
    assert "# stage hwopt_d_end" in text and "# stage 6_validate" in text
    # Without save_graphs it goes where MindSpore puts it: ./graph_kernel_dump.
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    context.set_context(save_graphs=False)
    Fn(lambda s, x: s.neg(x), neg=P.Neg())(x)
    assert (work / "graph_kernel_dump" / "Fn.txt").read_text().startswith(
        "# graph_kernel_dump of graph Fn")


def test_set_context_takes_mindspores_other_keys(rng):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # these act (or already hold): no warning
        context.set_context(deterministic="ON", device_id=0, pynative_synchronize=True,
                            jit_config={"jit_level": "O1"})
    assert context.get_context("enable_graph_kernel") is True
    context.set_context(jit_config={"jit_level": "O0"})
    assert context.get_context("enable_graph_kernel") is False
    with pytest.warns(NoEffectWarning, match="max_call_depth has no effect"):
        context.set_context(max_call_depth=10000)
    assert context.get_context("max_call_depth") == 10000
    with pytest.warns(NoEffectWarning, match="memory_optimize_level"):
        context.set_context(memory_optimize_level="O1")
    with pytest.raises(ContextError, match="deterministic must be 'ON' or 'OFF'"):
        context.set_context(deterministic=True)
    with pytest.raises(ContextError, match="jit_level must be one of O0, O1, O2"):
        context.set_context(jit_config={"jit_level": "O3"})
    with pytest.raises(ContextError, match="disagree"):
        context.set_context(jit_config={"jit_level": "O0"}, enable_graph_kernel=True)
    with pytest.raises(ContextError, match="did you mean 'max_call_depth'"):
        context.set_context(max_call_deph=10)
    with pytest.raises(ContextError, match="max_call_depth must be an integer"):
        context.set_context(max_call_depth="deep")


def test_deterministic_results_are_bitwise_equal(rng):
    x = rng.standard_normal((64, 257)).astype(np.float32)
    context.set_context(deterministic="ON", enable_graph_kernel=True)
    first = nn.Softmax()(Tensor(x)).asnumpy()
    again = graphkernel.compile(nn.Softmax(), Tensor(x))(Tensor(x)).asnumpy()
    assert np.array_equal(first, again)
