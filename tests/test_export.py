"""graphkernel.export / load / nn.GraphCell: the GKIR file, across processes, and refusing bad
files clearly."""
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from cells import Fn

import graphkernel
from graphkernel import Parameter, Tensor, nn
from graphkernel.backends.c.config import CConfig
from graphkernel.errors import FormatError, InputError
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.graph import Constant, Graph, Input, Node
from graphkernel.ir.printer import print_graph
from graphkernel.ir.serialize import data_to_graph, graph_to_data
from graphkernel.ir.types import TensorType
from graphkernel.ops import operations as P
from graphkernel.runtime.plan import PlanSettings

ON = CompileOptions(enable_graph_kernel=True)


def mlp() -> nn.Cell:
    return nn.SequentialCell([nn.Dense(12, 24), nn.GELU(), nn.LayerNorm((24,)), nn.Dense(24, 5),
                              nn.Softmax()])


class TwoOutputs(nn.Cell):
    """A user GraphKernel (a composite with its own weight) and a tuple result."""

    class Inner(nn.GraphKernel):
        def __init__(self):
            super().__init__()
            self.scale = Parameter(np.linspace(0.5, 2.0, 6).astype(np.float32), "scale")

        def construct(self, x):
            y = x * self.scale
            return y + 1.0, y - 1.0

    def __init__(self):
        super().__init__()
        self.inner = self.Inner()
        self.exp = P.Exp()
        self.sum = P.ReduceSum(keep_dims=True)

    def construct(self, x):
        a, b = self.inner(x)
        return self.exp(a) * b, self.sum(b, -1)


def _run(cell, x):
    out = cell(Tensor(x))
    return [o.asnumpy() for o in out] if isinstance(out, tuple) else [out.asnumpy()]


class EveryAxis(nn.Cell):
    """Reductions over every axis, given as None (`ops.mean(x)`): the attribute a file holds
    then is None, which loading must take as MindSpore's 'all axes'."""

    def construct(self, x):
        return P.ReduceMean()(x, None) * P.ReduceMax(keep_dims=True)(x, None) + x


@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("make,shape", [(mlp, (7, 12)), (TwoOutputs, (3, 6)),
                                        (EveryAxis, (5, 4))])
def test_loaded_graph_gives_the_same_results(tmp_path, rng, fusion, make, shape):
    context.set_context(enable_graph_kernel=fusion)
    net = make()
    x = rng.standard_normal(shape).astype(np.float32)
    expected = _run(net, x)
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "net"))
    assert path.endswith(".gkir")
    loaded = graphkernel.load(path)
    cell = nn.GraphCell(loaded)
    got = _run(cell, x)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)
    original = graphkernel.compile(net, Tensor(x))
    assert cell.compiled.kernel_count == original.kernel_count
    assert print_graph(cell.compiled.graph) == print_graph(original.graph)
    if original.executable.library is not None:  # the same C, so the cached library
        assert cell.compiled.executable.library.source == loaded.kernel_source
        assert cell.compiled.from_cache
    # other inputs of the signature, which the export never saw
    y = rng.standard_normal(shape).astype(np.float32) * 3
    for g, e in zip(_run(cell, y), _run(net, y)):
        np.testing.assert_array_equal(g, e)


def test_graph_cell_owns_its_weights(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    net = mlp()
    x = rng.standard_normal((2, 12)).astype(np.float32)
    cell = nn.GraphCell(graphkernel.load(graphkernel.export(net, Tensor(x),
                                                            file_name=str(tmp_path / "m"))))
    names = [n for n, _ in cell.parameters_and_names()]
    assert len(names) == 6 and len(set(names)) == 6
    before = _run(cell, x)[0]
    for (_, p), (_, q) in zip(cell.parameters_and_names(), net.parameters_and_names()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())
        assert p is not q
    last_bias = cell.parameters_and_names()[-1][1]
    last_bias.set_data(last_bias.asnumpy() + np.arange(5, dtype=np.float32))
    assert not np.array_equal(_run(cell, x)[0], before)  # the new weight is read
    other = nn.GraphCell(graphkernel.load(str(tmp_path / "m.gkir")))
    np.testing.assert_array_equal(_run(other, x)[0], before)  # cells do not share weights
    with pytest.raises(InputError, match=r"float32\[2,12\]"):
        cell(Tensor(np.zeros((3, 12), np.float32)))
    with pytest.raises(InputError, match="takes 1 input"):
        cell(Tensor(x), Tensor(x))


def test_export_in_one_process_loads_in_another(tmp_path):
    export_script = textwrap.dedent(f"""
        import numpy as np, graphkernel
        from graphkernel import nn, context, Tensor
        context.set_context(enable_graph_kernel=True)
        net = nn.SequentialCell([nn.Dense(12, 24), nn.GELU(), nn.LayerNorm((24,)),
                                 nn.Dense(24, 5), nn.Softmax()])
        x = np.random.default_rng(7).standard_normal((9, 12)).astype(np.float32)
        np.save({str(tmp_path / 'x.npy')!r}, x)
        np.save({str(tmp_path / 'expected.npy')!r}, net(Tensor(x)).asnumpy())
        graphkernel.export(net, Tensor(x), file_name={str(tmp_path / 'net')!r})
    """)
    load_script = textwrap.dedent(f"""
        import numpy as np, graphkernel
        from graphkernel import nn, Tensor
        cell = nn.GraphCell(graphkernel.load({str(tmp_path / 'net.gkir')!r}))
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.save({str(tmp_path / 'got.npy')!r}, cell(Tensor(x)).asnumpy())
        print(cell.compiled.kernel_count)
    """)
    env = {**os.environ, "GRAPHKERNEL_CACHE_DIR": str(tmp_path / "cache_a")}
    subprocess.run([sys.executable, "-c", export_script], check=True, env=env)
    env["GRAPHKERNEL_CACHE_DIR"] = str(tmp_path / "cache_b")  # another node: an empty cache
    out = subprocess.run([sys.executable, "-c", load_script], check=True, env=env,
                         capture_output=True, text=True)
    assert int(out.stdout.strip()) >= 2
    np.testing.assert_array_equal(np.load(tmp_path / "got.npy"), np.load(tmp_path / "expected.npy"))
    assert os.listdir(tmp_path / "cache_b")  # compiled there, through its own cache


def test_trusted_prebuilt_library_skips_the_compile(tmp_path, rng, monkeypatch):
    context.set_context(enable_graph_kernel=True)
    net = mlp()
    x = rng.standard_normal((4, 12)).astype(np.float32)
    path = graphkernel.export(net, Tensor(x), file_name=str(tmp_path / "net"))
    expected = _run(net, x)[0]
    with zipfile.ZipFile(path) as zf:
        libs = [n for n in zf.namelist() if n.startswith("prebuilt/")]
        assert len(libs) == 1
        blob = zf.read(libs[0])
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "fresh"))
    # Untrusted (the default): compiled here from the graph.
    cell = nn.GraphCell(graphkernel.load(path))
    np.testing.assert_array_equal(_run(cell, x)[0], expected)
    assert not cell.compiled.from_cache
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "fresh2"))
    cell = nn.GraphCell(graphkernel.load(path, trust_prebuilt=True))
    np.testing.assert_array_equal(_run(cell, x)[0], expected)
    assert cell.compiled.from_cache  # the file's library, no compiler run
    with open(cell.compiled.library_path, "rb") as fh:
        assert fh.read() == blob


def test_prebuilt_library_for_another_machine_is_not_used(tmp_path, rng, monkeypatch):
    context.set_context(enable_graph_kernel=True)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    path = graphkernel.export(mlp(), Tensor(x), file_name=str(tmp_path / "net"))

    def other_key(manifest, entries):
        old = manifest["prebuilt"]["key"]
        new = "0" * 32
        entries[f"prebuilt/{new}.so"] = entries.pop(f"prebuilt/{old}.so")
        manifest["entries"][f"prebuilt/{new}.so"] = manifest["entries"].pop(f"prebuilt/{old}.so")
        manifest["prebuilt"] = {"key": new, "entry": f"prebuilt/{new}.so"}
    rewrite(path, other_key)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "fresh"))
    loaded = graphkernel.load(path, trust_prebuilt=True)
    assert loaded.prebuilt is None and "another toolchain" in loaded.notes[0]
    cell = nn.GraphCell(loaded)
    _run(cell, x)
    assert not cell.compiled.from_cache


def test_graph_with_assigns_round_trips():
    """Graph.assigns and tuple results survive the description (no frontend op writes weights
    yet on main, so the graph is built by hand)."""
    f32 = TensorType((3,), np.dtype("float32"))
    x, w = Input(f32, "x"), Input(f32, "w", kind="weight")
    two = Constant(np.array(2.0, np.float32), "two")
    mul = Node("Mul", [x, two], {}, f32, "mul")
    add = Node("Add", [mul, w], {}, f32, "add")
    graph = Graph("g", [x, w], [mul, add], [add, mul])
    graph.returns_tuple = True
    graph.assigns = [(w, add)]
    data, arrays = graph_to_data(graph)
    json.dumps(data)  # plain JSON
    back = data_to_graph(json.loads(json.dumps(data)), arrays)
    assert print_graph(back) == print_graph(graph)
    assert back.returns_tuple and back.assigns[0][0] is back.inputs[1]
    assert back.assigns[0][1] is back.nodes[1]
    assert back.nodes[0].inputs[1].is_scalar


# -- refusing bad files ------------------------------------------------------------------------
@pytest.fixture
def exported(tmp_path, rng):
    context.set_context(enable_graph_kernel=True)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    return graphkernel.export(mlp(), Tensor(x), file_name=str(tmp_path / "net"))


def rewrite(path, edit, fix_checksum=True):
    """Rewrite an export: `edit(manifest, entries)` changes them in place; the checksums are
    recomputed (a deliberate forgery) unless fix_checksum is False (a hand edit)."""
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    manifest = json.loads(entries["manifest.json"])
    edit(manifest, entries)
    if fix_checksum:
        manifest["entries"] = {n: hashlib.sha256(b).hexdigest() for n, b in entries.items()
                               if n not in ("manifest.json", "checksum.sha256")}
    text = json.dumps(manifest).encode()
    entries["manifest.json"] = text
    if fix_checksum:
        entries["checksum.sha256"] = hashlib.sha256(text).hexdigest().encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for n, b in entries.items():
            zf.writestr(n, b)


def _first_node(manifest):
    return manifest["graph"]["nodes"][0]


@pytest.mark.parametrize("edit,fix,message", [
    # hand edits without fixing the checksum
    (lambda m, e: _first_node(m).update(name="renamed"), False, "checksum"),
    (lambda m, e: e.update({"arrays/weight0.npy": e["arrays/weight0.npy"][:-4] + b"\0\0\0\0"}),
     False, "does not match its checksum"),
    # forgeries with consistent checksums: still checked as data
    (lambda m, e: _first_node(m).update(op="__import__('os').system"), True, "unknown op"),
    (lambda m, e: _first_node(m)["type"].update(shape=[4, 99]), True, "does not check"),
    (lambda m, e: m["weights"][0].update(array="../../etc/passwd"), True, "missing"),
    (lambda m, e: e.update({"../evil.so": b"x"}), True, "unexpected entries"),
    (lambda m, e: m.update(version=99), True, "version 99.*newer graphkernel.*upgrade"),
    (lambda m, e: m.update(format="MINDIR"), True, "not a GKIR export"),
    (lambda m, e: _first_node(m)["attrs"].update(transpose_b={"pickle": "cos\nsystem"}), True,
     "unknown value tag"),
    (lambda m, e: m["options"]["backend_config"].update(parallel_threshold="1; rm -rf /"), True,
     "bad C backend settings"),
    (lambda m, e: e.update({"arrays/weight0.npy": _object_npy()}), True, "unreadable"),
    (lambda m, e: e.update({"arrays/weight0.npy": _npy(np.zeros((2, 2), np.float32))}), True,
     r"weight.*declared float32\[12,24\]|declared"),
    (lambda m, e: m["graph"]["outputs"].__setitem__(0, ["v", 10_000]), True, "points at no value"),
])
def test_altered_files_are_refused_clearly(exported, edit, fix, message):
    rewrite(exported, edit, fix_checksum=fix)
    with pytest.raises(FormatError, match=message):
        graphkernel.load(exported)


def _npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _object_npy():
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buf.getvalue()


def test_truncated_and_corrupted_files_are_refused(exported, tmp_path):
    data = open(exported, "rb").read()
    for cut in (10, len(data) // 2, len(data) - 30):
        short = tmp_path / f"cut{cut}.gkir"
        short.write_bytes(data[:cut])
        with pytest.raises(FormatError, match="truncated|corrupted|checksum|missing"):
            graphkernel.load(str(short))
    flipped = bytearray(data)
    middle = data.index(b"\x93NUMPY") + 200  # inside the first array's bytes
    flipped[middle] ^= 0xFF
    bad = tmp_path / "flipped.gkir"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(FormatError, match="checksum|corrupted"):
        graphkernel.load(str(bad))
    with pytest.raises(FormatError, match="no such file"):
        graphkernel.load(str(tmp_path / "absent.gkir"))


def test_compressed_entries_are_refused(exported, tmp_path):
    with zipfile.ZipFile(exported) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    bomb = tmp_path / "deflated.gkir"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, b in entries.items():
            zf.writestr(n, b)
    with pytest.raises(FormatError, match="compressed"):
        graphkernel.load(str(bomb))


def test_export_refuses_other_formats_and_foreign_files(tmp_path, rng):
    x = Tensor(rng.standard_normal((2, 12)).astype(np.float32))
    with pytest.raises(FormatError, match="MINDIR"):
        graphkernel.export(mlp(), x, file_name=str(tmp_path / "n"), file_format="MINDIR")
    mine = tmp_path / "notes.gkir"
    mine.write_text("my notes")
    with pytest.raises(FormatError, match="not replacing"):
        graphkernel.export(mlp(), x, file_name=str(mine))
    assert mine.read_text() == "my notes"
    first = graphkernel.export(mlp(), x, file_name=str(tmp_path / "n"))
    assert graphkernel.export(mlp(), x, file_name=first) == first  # an export is replaced


# -- forged dynamic sizes: symbols become C locals of generated kernels -------------------------
@pytest.fixture
def exported_generic(tmp_path):
    context.set_context(enable_graph_kernel=True)
    net = mlp()
    net.set_inputs(Tensor(shape=[graphkernel.Symbol(min=2, max=64), 12],
                          dtype=graphkernel.float32))
    return graphkernel.export(net, Tensor(np.ones((4, 12), np.float32)),
                              file_name=str(tmp_path / "generic"))


def _input_dim(m, symbols, coef=1):
    size = {"coef": coef, "symbols": symbols}
    m["graph"]["inputs"][0]["type"]["shape"][0] = size
    m["signature"][0]["shape"][0] = size


def _weight_dim(m):
    weight = next(i for i in m["graph"]["inputs"] if i["kind"] == "weight")
    weight["type"]["shape"][0] = {"coef": 1, "symbols": ["N"]}


@pytest.mark.parametrize("edit,message", [
    (lambda m: _input_dim(m, ['N; system("rm -rf /"); int x']), "bad dynamic size: symbols"),
    (lambda m: _input_dim(m, ["i"]), "bad dynamic size: symbols"),  # a kernel's loop index
    (lambda m: _input_dim(m, ["N0099"]), "bad dynamic size: symbols"),
    (lambda m: _input_dim(m, ["N"], coef=0), "coefficient 0"),
    (lambda m: _input_dim(m, ["N"], coef=-2), "coefficient -2"),
    (lambda m: _input_dim(m, ["N"], coef=True), "coefficient True"),
    (lambda m: _input_dim(m, ["N", "M"]), "does not check|one symbol per dynamic dimension"),
    (lambda m: m["graph"]["inputs"][0]["type"]["shape"].__setitem__(0, "N"), "bad size 'N'"),
    (lambda m: _weight_dim(m), "does not check|a weight.*takes static sizes"),
    (lambda m: m.update(version=1), "version 1 holds static shapes only"),
    (lambda m: m.pop("size_rules"), "bad size rules None"),
    (lambda m: m["size_rules"][0].update(symbol="M"), "no dynamic dimension of the inputs"),
    (lambda m: m["size_rules"][0].update(symbol="N\"); system(\""),
     "no dynamic dimension of the inputs"),
    (lambda m: m["size_rules"][0].update(divisor=0), "bad numbers"),
    (lambda m: m["size_rules"][0].update(remainder=5, divisor=3), "bad numbers"),
    (lambda m: m["size_rules"][0].update(max=-1), "bad numbers"),
    (lambda m: m["size_rules"][0].update(min=1 << 70), "bad numbers"),
    (lambda m: m["size_rules"][0].update(origin="\x1b[2J"), "bad origin"),
    (lambda m: m["size_rules"][0].update(code="__import__('os')"), "not a record"),
    (lambda m: m["size_rules"].extend([m["size_rules"][0]] * 65), "bad size rules"),
    (lambda m: _first_node(m)["type"]["shape"].__setitem__(0, {"coef": 1, "symbols": ["M"]}),
     "does not check"),
])
def test_forged_dynamic_sizes_are_refused(exported_generic, edit, message):
    rewrite(exported_generic, lambda m, e: edit(m))
    with pytest.raises(FormatError, match=message):
        graphkernel.load(exported_generic)


# -- forged files: checksums consistent, contents hostile ----------------------------------------
def _parallel_export(tmp_path):
    """A parallel kernel of two loop nests (notes loop_nests [[0, 2], [1]]): tanh(y) and y * 2
    over y's 256x256, and a row sum of x * x over x's 10x100."""
    context.set_context(enable_graph_kernel=True)
    tanh, mul = P.Tanh(), P.Mul()
    net = Fn(lambda x, y: (tanh(y), P.ReduceSum()(mul(x, x), 1), y * 2.0))
    x, y = np.ones((10, 100), np.float32), np.ones((256, 256), np.float32)
    path = graphkernel.export(net, Tensor(x), Tensor(y), file_name=str(tmp_path / "parallel"))
    return path, x, y


def _set_loop_nests(nests):
    def edit(manifest, entries):
        (node,) = [n for n in manifest["graph"]["nodes"] if "loop_nests" in n["notes"]]
        node["notes"]["loop_nests"] = nests
    return edit


def _nests(*nests):
    return {"list": [{"list": list(n)} for n in nests]}


@pytest.mark.parametrize("nests", [
    _nests([1, 2], [-2]),  # nest 2 writes the kernel's argument x
    _nests([1, 2], [-1]),  # 65,536 floats into y's 1,000-float neighbour x: SIGSEGV
    _nests([1, 2], [1]),  # output 0 never written: uninitialised memory returned
    _nests([1, 2], [9]),  # no such output: an IndexError
    _nests([0, 1, 2], []),
    "[[0, 1, 2]]",
])
def test_forged_loop_nests_are_refused(tmp_path, nests):
    path, x, y = _parallel_export(tmp_path)
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert [n["notes"]["loop_nests"] for n in manifest["graph"]["nodes"]
            if "loop_nests" in n["notes"]] == [_nests([0, 2], [1])]
    rewrite(path, _set_loop_nests(nests))
    with pytest.raises(FormatError, match=r"Parallel_\w+: note loop_nests .*outputs|not lists"):
        graphkernel.load(path)


@pytest.fixture
def exported_unfused(tmp_path, rng):
    """mlp's export with fusion off: its nodes are the ops themselves, with their attributes."""
    context.set_context(enable_graph_kernel=False)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    return graphkernel.export(mlp(), Tensor(x), file_name=str(tmp_path / "unfused"))


def _node(manifest, op):
    return next(n for n in manifest["graph"]["nodes"] if n["op"] == op)


@pytest.mark.parametrize("edit,message", [
    (lambda m: _node(m, "LayerNorm")["attrs"].update(epsilon="x"),
     r"LayerNorm: attribute epsilon must be a finite number, got 'x'"),
    (lambda m: _node(m, "LayerNorm")["attrs"].update(epsilon={"float": "inf"}),
     "epsilon must be a finite number"),
    (lambda m: _node(m, "GetItem")["attrs"].update(index=-1),
     "GetItem: attribute index must be an integer from 0, got -1"),
    (lambda m: _node(m, "Softmax")["attrs"].update(axis=2 ** 70), "axis must be an integer"),
    (lambda m: _node(m, "MatMul")["attrs"].update(transpose_b=1), "transpose_b must be True"),
    # the builder's own step attributes: strided views of BLAS operands
    (lambda m: _node(m, "MatMul")["attrs"].update(
        read_views={"list": [{"tuple": [0, {"tuple": [1 << 40, {"tuple": [4, 12]},
                                                      {"tuple": [0, 1]}]}]}]}),
     "MatMul has no attribute 'read_views'"),
])
def test_forged_attributes_are_refused_at_load(exported_unfused, edit, message):
    rewrite(exported_unfused, lambda m, e: edit(m))
    with pytest.raises(FormatError, match=message) as info:
        graphkernel.load(exported_unfused)
    assert "graph/" in str(info.value)  # names the node


def test_a_composite_with_attributes_is_refused(exported):
    rewrite(exported, lambda m, e: next(n for n in m["graph"]["nodes"] if n["subgraph"])[
        "attrs"].update(read_views={"list": []}))
    with pytest.raises(FormatError, match="Fused_\\w+: a composite has no attributes"):
        graphkernel.load(exported)


@pytest.mark.parametrize("section,field,value,message", [
    ("backend_config", "parallel_threshold", None,
     "C backend settings: field parallel_threshold is None; it is int from 0"),
    ("backend_config", "stream_min_bytes", 1 << 70,
     "C backend settings: field stream_min_bytes is .*; it is int or None from 0"),
    ("cost", "max_inputs", -3, "cost model: field max_inputs is -3"),
    ("backend_config", "vector_width", 300,
     r"C backend settings: CConfig: vector_width is 300; it is None or one of \(128, 256"),
    ("backend_config.plan", "prefault_buffers", 1,
     r"C backend settings \(plan\): field prefault_buffers is 1; it is bool"),
    ("backend_config", "no_such_field", 1, "C backend settings: it has no field 'no_such_field'"),
    # a C setting among fusion's costs, in a file that has the C backend's own section
    ("cost", "parallel_threshold", 1, "cost model: it has no field 'parallel_threshold'"),
])
def test_forged_settings_are_refused_at_load(exported, section, field, value, message):
    def forge(m, e):
        part = m["options"]
        for key in section.split("."):
            part = part[key]
        part[field] = value
    rewrite(exported, forge)
    with pytest.raises(FormatError, match="bad " + message):
        graphkernel.load(exported)


def test_an_export_with_c_settings_among_the_costs_loads_them(exported):
    """Files written before the C backend had settings of its own kept them in "cost"."""
    def older(m, e):
        config = m["options"].pop("backend_config")
        m["options"]["cost"].update({k: v for k, v in config.items() if k != "plan"},
                                    **config["plan"])
        m["options"]["cost"]["parallel_threshold"] = 7
        m["options"]["cost"]["prefault_buffers"] = False
    rewrite(exported, older)
    options = graphkernel.load(exported).options
    assert options.backend_config == CConfig(parallel_threshold=7,
                                             plan=PlanSettings(prefault_buffers=False))


def test_forged_graph_kernel_flags_are_a_format_error(exported):
    rewrite(exported, lambda m, e: m["options"].update(graph_kernel_flags="--no_such_flag"))
    with pytest.raises(FormatError, match="compile options: .*unknown flag --no_such_flag"):
        graphkernel.load(exported)


def _npy_with_shape(shape_text, data):
    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}"
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


@pytest.mark.parametrize("shape_text", [
    "(274177, 67280421310721, 288)",  # 288 * (2**64 + 1) elements: int64 wraps to 288
    "(18446744073709551617, 288)",  # a dimension past int64
])
def test_npy_shapes_that_wrap_int64_are_refused(exported, shape_text):
    data = np.zeros(288, np.float32).tobytes()  # weight0 is float32[24,12]: 288 elements
    rewrite(exported, lambda m, e: e.update({"arrays/weight0.npy": _npy_with_shape(shape_text,
                                                                                   data)}))
    with pytest.raises(FormatError, match="array weight0 is unreadable"):
        graphkernel.load(exported)


def test_a_zip_entry_declaring_more_than_the_file_holds_is_named(exported):
    data = bytearray(open(exported, "rb").read())
    record = data.index(b"PK\x01\x02")  # the central directory: find kernels.c's record
    while data[record + 46:record + 46 + len(b"kernels.c")] != b"kernels.c":
        name, extra, comment = struct.unpack_from("<HHH", data, record + 28)
        record += 46 + name + extra + comment
    struct.pack_into("<II", data, record + 20, 0xFFFFFFF0, 0xFFFFFFF0)  # ~4 GiB, stored
    with open(exported, "wb") as fh:
        fh.write(data)
    with pytest.raises(FormatError, match=r"entry 'kernels.c' declares 4294967280 bytes, more "
                                          r"than the file holds"):
        graphkernel.load(exported)


def test_a_prebuilt_library_is_installed_only_for_its_own_graph(tmp_path, rng, monkeypatch):
    """A trusted file whose kernels.c and prebuilt library are net B's but whose graph is net
    A's: loading and running it must not place the library under B's key, where a later
    compile of B would run it."""
    context.set_context(enable_graph_kernel=True)
    x = rng.standard_normal((4, 12)).astype(np.float32)
    net_a = Fn(lambda x: P.Tanh()(x * 3.0))
    net_b = mlp()
    path_a = graphkernel.export(net_a, Tensor(x), file_name=str(tmp_path / "a"))
    path_b = graphkernel.export(net_b, Tensor(x), file_name=str(tmp_path / "b"))
    with zipfile.ZipFile(path_b) as zf:
        b_entries = {n: zf.read(n) for n in zf.namelist()}
    b_prebuilt = json.loads(b_entries["manifest.json"])["prebuilt"]

    def b_library_in_a(manifest, entries):
        for name in [n for n in entries if n.startswith("prebuilt/")]:
            del entries[name]
        entries["kernels.c"] = b_entries["kernels.c"]
        entries[b_prebuilt["entry"]] = b_entries[b_prebuilt["entry"]]
        manifest["prebuilt"] = b_prebuilt
    rewrite(path_a, b_library_in_a)
    monkeypatch.setenv("GRAPHKERNEL_CACHE_DIR", str(tmp_path / "fresh"))
    cell = nn.GraphCell(graphkernel.load(path_a, trust_prebuilt=True))
    np.testing.assert_allclose(_run(cell, x)[0], np.tanh(x * 3), rtol=1e-6)
    assert not os.path.exists(tmp_path / "fresh" / f"{b_prebuilt['key']}.so")
    assert not cell.compiled.from_cache  # A's kernels, compiled here
    assert any("prebuilt library is not the one" in w for w in cell.compiled.executable.warnings)
    assert not graphkernel.compile(net_b, Tensor(x)).from_cache  # B compiled, not the file's


def test_kernels_of_one_name_in_a_training_step_are_told_apart(tmp_path, rng):
    """Names in a file need not be unique: the plan's in-place weight updates look each
    kernel up by its step, not its name (a forged file whose composites share one name made
    the builder analyse another kernel: IndexError)."""
    context.set_context(enable_graph_kernel=True)
    net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 4)])
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.1, momentum=0.9)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    y = np.arange(6, dtype=np.int32) % 4
    path = graphkernel.export(step, Tensor(x), Tensor(y), file_name=str(tmp_path / "train"))
    honest = nn.GraphCell(graphkernel.load(path))

    def one_name(manifest, entries):
        composites = [n for n in manifest["graph"]["nodes"] if n["subgraph"]]
        assert len(composites) >= 3
        for node in composites:
            node["name"] = "K"
    rewrite(path, one_name)
    forged = nn.GraphCell(graphkernel.load(path))
    for _ in range(2):  # the weights move: the second call reads the first one's updates
        got = forged(Tensor(x), Tensor(y)).asnumpy()
        np.testing.assert_array_equal(got, honest(Tensor(x), Tensor(y)).asnumpy())
    for (_, p), (_, q) in zip(forged.parameters_and_names(), honest.parameters_and_names()):
        np.testing.assert_array_equal(p.asnumpy(), q.asnumpy())
