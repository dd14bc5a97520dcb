"""Which library runs each convolution kernel (backends/c/onednn_choice.py): graphkernel's own
by default, oneDNN's where it is installed and measured faster for the shape on this CPU. The
chooser's logic and its record file run everywhere (a fake oneDNN and fake timings); the
convolutions on oneDNN run where `onednn` and `onednn-devel` are installed
(`pip install graphkernel[onednn]`; CI leaves them out: 601 MB of wheels, 2.0 GB installed)."""
import json

import numpy as np
import pytest
from cells import OFF, ON, Fn

import graphkernel
from graphkernel import Tensor, nn
from graphkernel.backends.c import c_window, onednn, onednn_choice, tuning
from graphkernel.backends.c.onednn_choice import OWN, choose
from graphkernel.graph_kernel.flags import parse_flags
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P


class FakeOneDNN:
    """A oneDNN that makes every primitive (nothing runs on it)."""

    label = "onednn 9.9.9"

    def primitive(self, geometry, blocked=False):
        return onednn.ConvPrimitive(1, 4096, "fake:impl"), ""


FAKE = FakeOneDNN()


class Timer:
    """Fake timings: seconds for ours ("own"), oneDNN's on NCHW and on its blocked layout
    (`blocked`, default the same); counts the shapes asked."""

    def __init__(self, own: float, theirs: float, blocked: float | None = None) -> None:
        self.own, self.theirs, self.asked = own, theirs, []
        self.blocked = theirs if blocked is None else blocked

    def __call__(self, node, labels):
        self.asked.append(onednn_choice.geometry(node))
        assert labels == [OWN, "onednn 9.9.9", "onednn 9.9.9 blocked"]
        return {labels[0]: self.own, labels[1]: self.theirs, labels[2]: self.blocked}


class One(nn.Cell):
    def __init__(self, c, o, k, **kw):
        super().__init__()
        self.conv = nn.Conv2d(c, o, k, has_bias=False, **kw)

    def construct(self, x):
        return self.conv(x)


def conv_node(c=16, o=32, k=3, size=32, dtype=np.float32, **kw):
    if dtype == np.float32:
        net = One(c, o, k, **kw)
        exe = graphkernel.compile(net, Tensor(np.zeros((2, c, size, size), dtype)), options=OFF)
    else:
        conv = P.Conv2D(o, k)
        exe = graphkernel.compile(Fn(lambda x, w: conv(x, w)), np.zeros((2, c, size, size),
                                  dtype), np.zeros((o, c, k, k), dtype), options=OFF)
    return next(n for n in exe.graph.nodes if n.op == "Conv2D")


@pytest.fixture
def fresh(monkeypatch):
    """A process with no decision made yet, oneDNN's threads those of the kernels."""
    monkeypatch.setattr(onednn_choice, "_chosen", {})
    monkeypatch.setattr(onednn, "threads", onednn_choice.openmp_threads)
    monkeypatch.delenv(onednn_choice.SWITCH, raising=False)


def test_ours_stays_unless_onednn_is_clearly_faster(tmp_path, fresh):
    path = str(tmp_path / "choice.json")
    node, other, third = conv_node(), conv_node(o=24), conv_node(k=5)
    won = choose(node, Timer(1.0, 0.5), path, FAKE)
    assert won.library == "onednn" and won.onednn is not None
    assert "onednn 9.9.9 (fake:impl; timed 0.50x graphkernel's kernel)" == won.why
    # Within the margin (a tie, or a loaded machine's noise): ours stays.
    assert choose(other, Timer(1.0, 0.97), path, FAKE).library == "graphkernel"
    blocked = choose(conv_node(c=24), Timer(1.0, 0.9, 0.5), path, FAKE)
    assert blocked.library == "onednn" and blocked.blocked
    assert blocked.why.startswith("onednn 9.9.9 blocked (fake:impl; timed 0.50x")
    lost = choose(third, Timer(1.0, 2.0), path, FAKE)
    assert lost.onednn is None and lost.why == "graphkernel's kernel (timed 0.50x onednn " \
                                               "9.9.9's)"


def test_timings_are_stored_per_cpu_geometry_and_library_and_reused(tmp_path, fresh,
                                                                    monkeypatch):
    path = str(tmp_path / "choice.json")
    node = conv_node(size=48, stride=2, pad_mode="pad", padding=1, group=2)
    first = Timer(1.0, 0.5)
    assert choose(node, first, path, FAKE).library == "onednn"
    assert len(first.asked) == 1
    data = json.loads((tmp_path / "choice.json").read_text())
    assert data["format"] == onednn_choice.FORMAT and data["version"] == onednn_choice.VERSION
    geo = list(onednn_choice.geometry(node))
    assert geo == [2, 16, 48, 48, 32, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 24, 24]
    assert {(r["library"], r["op"], tuple(r["geometry"]), r["seconds"])
            for r in data["records"]} == {(OWN, "Conv2D", tuple(geo), 1.0),
                                          ("onednn 9.9.9", "Conv2D", tuple(geo), 0.5),
                                          ("onednn 9.9.9 blocked", "Conv2D", tuple(geo), 0.5)}
    assert all(r["cpu"] == onednn_choice.cpu_model() for r in data["records"])
    # Another process (no decision in memory): the stored timings decide, nothing is timed.
    monkeypatch.setattr(onednn_choice, "_chosen", {})
    again = Timer(0.1, 9.0)  # would choose ours if asked
    assert choose(node, again, path, FAKE).library == "onednn"
    assert again.asked == []


def test_a_stored_choice_of_ours_does_not_start_onednn(tmp_path, fresh, monkeypatch):
    """A warm compile whose stored timings keep our kernel never loads oneDNN (its start-up,
    the SYCL device, costs 0.4 s or more); one that chooses oneDNN does."""
    path = str(tmp_path / "choice.json")
    ours, theirs = conv_node(), conv_node(o=24)
    choose(ours, Timer(1.0, 2.0), path, FAKE)
    choose(theirs, Timer(1.0, 0.5), path, FAKE)
    monkeypatch.setattr(onednn_choice, "_chosen", {})
    monkeypatch.setattr(onednn, "installed_label", lambda: FAKE.label)
    loads = []
    monkeypatch.setattr(onednn, "load", lambda: loads.append(1) or FAKE)
    timer = Timer(9.0, 9.0)
    assert choose(ours, timer, path).library == "graphkernel" and loads == []
    assert choose(theirs, timer, path).library == "onednn" and loads == [1]
    assert timer.asked == []


def test_another_cpus_record_is_refused_and_the_shape_timed_here(tmp_path, fresh,
                                                                 monkeypatch):
    path = str(tmp_path / "choice.json")
    node = conv_node()
    monkeypatch.setattr(onednn_choice, "cpu_model", lambda: "Some Xeon|0123456789ab")
    assert choose(node, Timer(1.0, 0.1), path, FAKE).library == "onednn"
    monkeypatch.setattr(onednn_choice, "cpu_model", lambda: "Some EPYC|ba9876543210")
    timer = Timer(0.5, 1.0)
    choice = choose(node, timer, path, FAKE)
    assert choice.library == "graphkernel" and len(timer.asked) == 1
    cpus = {r["cpu"] for r in json.loads((tmp_path / "choice.json").read_text())["records"]}
    assert cpus == {"Some Xeon|0123456789ab", "Some EPYC|ba9876543210"}


def test_malformed_records_are_skipped_and_a_foreign_file_set_aside(tmp_path, fresh):
    path = tmp_path / "choice.json"
    node = conv_node()
    good = {"cpu": onednn_choice.cpu_model(), "dtype": "float32", "op": "Conv2D",
            "geometry": list(onednn_choice.geometry(node)), "library": OWN, "seconds": 1.0}
    bad = [dict(good, seconds=-1.0), dict(good, seconds=float("nan")), dict(good, seconds=True),
           dict(good, geometry=[1, 2]), dict(good, geometry=[True] * 18),
           dict(good, op="MatMul"), dict(good, dtype="float64"), dict(good, extra=1), "x"]
    path.write_text(json.dumps({"format": onednn_choice.FORMAT, "version": 1,
                                "records": bad + [good, dict(good, library="onednn 9.9.9",
                                                             seconds=0.5),
                                                  dict(good, library="onednn 9.9.9 blocked",
                                                       seconds=0.7)]}))
    assert sorted(onednn_choice.load_records(str(path)).values()) == [0.5, 0.7, 1.0]
    timer = Timer(9.0, 9.0)
    assert choose(node, timer, str(path), FAKE).library == "onednn" and timer.asked == []
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="unreadable"):
        assert onednn_choice.load_records(str(path)) == {}
    path.write_text(json.dumps({"format": "something-else", "version": 1, "records": []}))
    with pytest.warns(RuntimeWarning, match="not a graphkernel-conv-choice file"):
        assert onednn_choice.load_records(str(path)) == {}


def test_the_reasons_ours_runs_without_timing(tmp_path, fresh, monkeypatch):
    path = str(tmp_path / "choice.json")
    timer = Timer(1.0, 0.1)
    monkeypatch.setenv(onednn_choice.SWITCH, "0")
    assert "GRAPHKERNEL_ONEDNN=0" in choose(conv_node(), timer, path, FAKE).why
    monkeypatch.delenv(onednn_choice.SWITCH)
    assert "float64" in choose(conv_node(dtype=np.float64), timer, path, FAKE).why
    small = conv_node(c=8, o=8, size=8)  # 2 * 8 * 64 * 8 * 9 multiply-adds
    assert "73728 multiply-adds, too few" in choose(small, timer, path, FAKE).why
    monkeypatch.setattr(onednn, "threads", lambda: 7)
    why = choose(conv_node(), timer, path, FAKE).why
    assert "oneDNN would run on 7 TBB threads" in why
    monkeypatch.setattr(onednn, "_state", {"found": None, "why": "oneDNN is not installed",
                                           "label": None})
    assert choose(conv_node(), timer, path).why == "graphkernel's kernel (oneDNN is not " \
                                                   "installed)"
    assert timer.asked == []


def test_a_default_compile_times_nothing_and_a_tuned_one_stores_what_the_next_uses(
        tmp_path, fresh, monkeypatch):
    """The library is the tuner's choice: a normal compile (--online_tuning=0) decides from
    stored timings only, and without them runs our kernel, timing nothing and not loading
    oneDNN, the reason in describe's schedule line; --online_tuning=1 times the convolution and
    stores its timings, which the next normal compile decides from (not loading oneDNN when
    they keep our kernel)."""
    monkeypatch.setattr(onednn_choice, "_choice_path", lambda: str(tmp_path / "choice.json"))
    monkeypatch.setattr(tuning, "record_folder", lambda: str(tmp_path / "tuning"))
    monkeypatch.setattr(tuning, "PASSES", 1)
    monkeypatch.setattr(onednn, "installed_label", lambda: FAKE.label)
    loads, timed = [], []
    monkeypatch.setattr(onednn, "load", lambda: loads.append(1) or FAKE)

    def time_conv(node, labels, own):
        timed.append(onednn_choice.geometry(node))
        return dict(zip(labels, (0.1, 1.0, 2.0)))  # ours wins: no oneDNN call is emitted

    monkeypatch.setattr(onednn_choice, "time_conv", time_conv)
    net = One(16, 32, 3, pad_mode="pad", padding=1)  # 18.9M multiply-adds: worth timing
    x = Tensor(np.zeros((1, 16, 64, 64), np.float32))

    def note(level):
        options = CompileOptions(enable_graph_kernel=True,
                                 flags=parse_flags(f"--online_tuning={level}"))
        notes = [n for n in graphkernel.compile(net, x, options=options).plan
                 .schedule_notes.values() if "convolution on" in n]
        assert len(notes) == 1
        return notes[0]

    assert "graphkernel's kernel (not measured on this machine; run graphkernel tune or " \
           "--online_tuning>=1)" in note(0)
    assert timed == [] and loads == []
    assert "graphkernel's kernel (timed 0.10x onednn 9.9.9's)" in note(1)
    assert len(timed) == 1
    assert len(onednn_choice.load_records(str(tmp_path / "choice.json"))) == 3
    monkeypatch.setattr(onednn_choice, "_chosen", {})  # another process
    loads.clear()
    assert "graphkernel's kernel (timed 0.10x onednn 9.9.9's)" in note(0)
    assert len(timed) == 1 and loads == []


# -- on oneDNN itself -------------------------------------------------------------------------

try:  # the reference convolution of the tests that run on oneDNN (CI installs neither)
    import torch
except ImportError:
    torch = None
needs_onednn = pytest.mark.skipif(onednn.load() is None or torch is None,
                                  reason="needs oneDNN (pip install graphkernel[onednn]) "
                                  "and torch")


def forced(monkeypatch, tmp_path, fast):
    """Every convolution's stored timings (fakes) say `fast` wins ("onednn", "blocked": oneDNN
    on its blocked layout, or "own"), small ones too."""
    monkeypatch.setattr(onednn_choice, "_chosen", {})
    monkeypatch.setattr(onednn_choice, "MIN_MACS", 0)
    monkeypatch.setattr(onednn_choice, "_choice_path", lambda: str(tmp_path / f"{fast}.json"))
    seconds = {"own": (0.1, 1.0, 1.0), "onednn": (1.0, 0.1, 0.5), "blocked": (1.0, 0.5, 0.1)}
    monkeypatch.setattr(onednn_choice, "_stored", lambda node, labels, path: dict(
        zip(labels, seconds[fast])))


class Block(nn.Cell):
    """A convolution with BatchNorm (folded into it in inference) and ReLU, plus a residual."""

    def __init__(self, c, o, k, residual, **kw):
        super().__init__()
        self.conv = nn.Conv2d(c, o, k, has_bias=False, **kw)
        self.bn = nn.BatchNorm2d(o)
        self.residual = residual

    def construct(self, x):
        y = self.bn(self.conv(x))
        return P.ReLU()(y + x if self.residual else y)


GEOMETRIES = {  # (c, o, k, image, keywords): large enough images for kernels of their own
    "3x3": (16, 16, 3, 40, dict(pad_mode="pad", padding=1)),
    "1x1-stride2": (16, 32, 1, 40, dict(stride=2)),
    "groups-dilation": (16, 16, 3, 40, dict(pad_mode="pad", padding=2, dilation=2, group=4)),
    "depthwise-stride2": (32, 32, 3, 40, dict(pad_mode="pad", padding=1, stride=2, group=32)),
    "7x7-stem": (3, 16, 7, 64, dict(pad_mode="pad", padding=3, stride=2)),
    "asymmetric-same": (16, 8, (3, 5), 41, dict(pad_mode="same")),
}


@needs_onednn
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_convolutions_on_onednn_equal_our_kernels(geometry, monkeypatch, tmp_path, rng):
    """The same network compiled with its convolutions chosen for oneDNN, then for our kernel
    (fake timings): the source calls oneDNN, describe() says so, and the results agree within
    the differential tests' tolerance (and with torch's convolution)."""
    c, o, k, size, kw = GEOMETRIES[geometry]
    net = Block(c, o, k, residual=False, **kw)
    for p in net.get_parameters():
        p.set_data(rng.standard_normal(p.shape) * 0.3)
    net.bn.moving_variance.set_data(rng.random(o) + 0.5)
    net.set_train(False)
    x = rng.standard_normal((2, c, size, size)).astype(np.float32)
    results = {}
    for fast in ("onednn", "blocked", "own"):
        forced(monkeypatch, tmp_path, fast)
        exe = graphkernel.compile(net, Tensor(x), options=ON)
        source = exe.executable.library.source
        assert ("gk_dnnl_conv_run(" in source) == (fast != "own")
        notes = [n for n in exe.plan.schedule_notes.values() if "convolution on" in n]
        assert len(notes) == 1
        assert ("convolution on onednn " in notes[0]) == (fast != "own")
        assert (" blocked (" in notes[0]) == (fast == "blocked")
        results[fast] = exe(Tensor(x)).asnumpy()
        assert exe(Tensor(x)).asnumpy().tobytes() == results[fast].tobytes()  # kept weights
    np.testing.assert_allclose(results["onednn"], results["own"], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(results["blocked"], results["own"], rtol=1e-4, atol=1e-4)
    bn = net.bn
    scale = bn.gamma.asnumpy() / np.sqrt(bn.moving_variance.asnumpy() + bn.eps)
    conv = net.conv
    torch_conv = torch.nn.functional.conv2d(
        torch.tensor(x), torch.tensor(conv.weight.asnumpy()), stride=conv.stride,
        padding="same" if kw.get("pad_mode") == "same" else kw.get("padding", 0),
        dilation=conv.dilation, groups=conv.group).numpy()
    want = np.maximum(torch_conv * scale[:, None, None] + (
        bn.beta.asnumpy() - bn.moving_mean.asnumpy() * scale)[:, None, None], 0)
    np.testing.assert_allclose(results["onednn"], want, rtol=1e-4, atol=1e-4)


@needs_onednn
@pytest.mark.parametrize("layout", ["onednn", "blocked"])
def test_a_weight_change_reorders_onednns_weights_again(layout, monkeypatch, tmp_path, rng):
    """oneDNN's reordered weights are kept in the plan's workspace and reordered again when a
    weight's version moves (the conv prepack's invalidation)."""
    forced(monkeypatch, tmp_path, layout)
    net = One(16, 16, 3, pad_mode="pad", padding=1)
    net.conv.weight.set_data(rng.standard_normal(net.conv.weight.shape))
    x = rng.standard_normal((1, 16, 40, 40)).astype(np.float32)
    compiled = graphkernel.compile(net, Tensor(x), options=ON)
    assert "gk_dnnl_conv_run(" in compiled.executable.library.source

    def want():
        return torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(
            net.conv.weight.asnumpy()), padding=1).numpy()

    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)
    net.conv.weight.set_data(rng.standard_normal(net.conv.weight.shape))
    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)
    net.conv.weight[0:2] = rng.standard_normal((2, 16, 3, 3))
    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)


@needs_onednn
def test_the_real_timer_times_both_and_stores_them(monkeypatch, tmp_path):
    monkeypatch.setattr(onednn_choice, "_chosen", {})
    monkeypatch.setattr(onednn, "threads", onednn_choice.openmp_threads)
    node = conv_node(c=16, o=16, size=40)
    path = str(tmp_path / "choice.json")
    timer = onednn_choice.time_conv
    choice = choose(node, lambda n, labels: timer(n, labels, own=c_window._own_kernel), path)
    label = onednn.load().label
    assert set(choice.seconds) == {OWN, label, label + " blocked"}
    assert all(s > 0 for s in choice.seconds.values())
    assert len(onednn_choice.load_records(path)) == 3


@needs_onednn
def test_a_batchnorm_change_refolds_onednns_weights(monkeypatch, tmp_path, rng):
    """A folded BatchNorm's scale and variance are sources of the reordered weights too: a
    change to either reorders them again on the next call."""
    forced(monkeypatch, tmp_path, "onednn")
    net = Block(16, 16, 3, residual=True, pad_mode="pad", padding=1)
    for p in net.get_parameters():
        p.set_data(rng.standard_normal(p.shape) * 0.3)
    net.bn.moving_variance.set_data(rng.random(16) + 0.5)
    net.set_train(False)
    x = rng.standard_normal((1, 16, 40, 40)).astype(np.float32)
    compiled = graphkernel.compile(net, Tensor(x), options=ON)
    assert [n.op for n in compiled.graph.nodes][0] == "Conv2DFoldedBN"
    assert "gk_dnnl_conv_run(" in compiled.executable.library.source

    def want():
        bn = net.bn
        scale = bn.gamma.asnumpy() / np.sqrt(bn.moving_variance.asnumpy() + bn.eps)
        y = torch.nn.functional.conv2d(torch.tensor(x), torch.tensor(net.conv.weight.asnumpy()),
                                       padding=1).numpy()
        shift = bn.beta.asnumpy() - bn.moving_mean.asnumpy() * scale
        return np.maximum(y * scale[:, None, None] + shift[:, None, None] + x, 0)

    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)
    net.bn.gamma.set_data(rng.standard_normal(16))
    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)
    net.bn.moving_variance.set_data(rng.random(16) + 2.0)
    np.testing.assert_allclose(compiled(Tensor(x)).asnumpy(), want(), rtol=1e-4, atol=1e-4)
