"""The MindSpore APIs a LeNet-style training script reaches (issue 28): nn.CrossEntropyLoss,
ops.stop_gradient, ops.Print, nn.LSTM, nn.WithEvalCell, and the errors for MindSpore names
graphkernel does not provide (graphkernel.amp and the progress bar: test_mindspore_amp.py).
Written as MindSpore's own tests are: a Net run with graph-kernel fusion on and off, each
compared with a numpy reference on random inputs; gradients against a float64 reference."""
import re

import numpy as np
import pytest
from cells import fused_and_unfused_outputs

import graphkernel as ms
from graphkernel import Tensor, context, nn, ops
from graphkernel.errors import InputError, UnsupportedError
from graphkernel.frontend.mindspore_names import MISSING


@pytest.fixture(autouse=True)
def graph_mode():
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=True)
    yield
    ms.set_context(mode=ms.GRAPH_MODE, enable_graph_kernel=False)


# -- missing MindSpore names ----------------------------------------------------------------

@pytest.mark.parametrize("module,name", [(ms, "ms_function"), (nn, "LSTMCell"),
                                         (ops, "HookBackward")])
def test_a_missing_mindspore_name_says_so_and_what_to_use(module, name):
    """
    Feature: graphkernel.X, nn.X, ops.X for MindSpore names graphkernel does not provide
    Description: reach one of each
    Expectation: UnsupportedError naming it as MindSpore's, what to use, and the user's line
    """
    with pytest.raises(UnsupportedError, match=rf"{name}: MindSpore's mindspore[.a-z]*\.{name} "
                       "is not provided by graphkernel") as err:
        getattr(module, name)
    assert err.value.location.filename == __file__
    assert not hasattr(nn, "LSTMCell")  # still an AttributeError for hasattr and getattr


def test_an_unknown_name_gets_close_matches():
    with pytest.raises(UnsupportedError, match=r"graphkernel.nn has no attribute 'Dence' "
                       r"\(did you mean Dense"):
        nn.Dence  # noqa: B018


def test_every_suggestion_names_what_exists():
    """Each name listed as missing is missing, and each it points to (nn.X, ops.X,
    graphkernel.X.Y) exists."""
    modules = {"graphkernel": ms, "graphkernel.nn": nn, "graphkernel.ops": ops}
    for module, names in MISSING.items():
        for name, instead in names.items():
            assert name not in vars(modules[module]), f"{module}.{name} exists now"
            for ref in re.findall(r"\b((?:graphkernel|nn|ops)(?:\.[A-Za-z_0-9]+)+)", instead):
                parts = ref.split(".")
                found = {"nn": nn, "ops": ops, "graphkernel": ms}[parts[0]]
                for part in parts[1:]:
                    found = getattr(found, part)


# -- ops.stop_gradient ------------------------------------------------------------------------

def test_stop_gradient_blocks_only_its_path():
    """
    Feature: ops.stop_gradient
    Description: d/dx and d/dy of sum(stop_gradient(x * y) * x + y)
    Expectation: x * y and ones: nothing flows through the stopped product
    """
    def f(x, y):
        return ops.reduce_sum(ops.stop_gradient(x * y) * x + y, ())

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 5, 7)).astype(np.float32)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        dx, dy = ms.grad(f, grad_position=(0, 1))(Tensor(x), Tensor(y))
        np.testing.assert_allclose(dx.asnumpy(), x * y, rtol=1e-6)
        np.testing.assert_array_equal(dy.asnumpy(), np.ones_like(y))
    out = fused_and_unfused_outputs(lambda: _Apply(ops.stop_gradient), x)
    np.testing.assert_array_equal(out[0], x)


class _Apply(nn.Cell):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def construct(self, *xs):
        return self.fn(*xs)


# -- nn.CrossEntropyLoss ----------------------------------------------------------------------

def _log_softmax(x, axis):
    x = x.astype(np.float64)
    shifted = x - x.max(axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis, keepdims=True))


def _ce_indices(x, y, weight, ignore_index, reduction, smoothing):
    """MindSpore's nll_loss over log_softmax, in float64."""
    axis = 0 if x.ndim == 1 else 1
    classes = x.shape[axis]
    log_p = np.moveaxis(_log_softmax(x, axis), axis, -1)  # classes last
    w = np.ones(classes) if weight is None else weight.astype(np.float64)
    kept = y != ignore_index
    safe = np.where(kept, y, 0)
    picked = np.take_along_axis(log_p, safe[..., None], -1)[..., 0]
    loss = np.where(kept, -w[safe] * picked, 0.0)
    smooth = np.where(kept, -log_p.sum(-1), 0.0)  # no class weights in MindSpore's
    if reduction == "sum":
        loss, smooth = loss.sum(), smooth.sum()
    elif reduction == "mean":
        loss, smooth = loss.sum() / np.where(kept, w[safe], 0).sum(), smooth.mean()
    return (1 - smoothing) * loss + smoothing / classes * smooth if smoothing else loss


def _ce_probabilities(x, y, weight, reduction, smoothing):
    axis = 0 if x.ndim == 1 else 1
    classes = x.shape[axis]
    y = y.astype(np.float64) * (1 - smoothing) + smoothing / classes
    w = np.ones(classes) if weight is None else weight.astype(np.float64)
    w = w.reshape((classes,) + (1,) * (x.ndim - axis - 1))
    terms = _log_softmax(x, axis) * y * w
    if reduction == "none":
        return -terms.sum(axis)
    total = -terms.sum()
    return total if reduction == "sum" else total / (x.size / classes)


@pytest.mark.parametrize("shape", [(8, 5), (4, 5, 3, 2), (5,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,smoothing", [(False, 0.0), (True, 0.0), (True, 0.2)])
def test_cross_entropy_loss_on_class_indices(shape, reduction, weighted, smoothing):
    """
    Feature: nn.CrossEntropyLoss on class indices, ignore_index included
    Description: random logits, labels with some positions ignored, fused and unfused
    Expectation: MindSpore's formula in float64 to float32 accuracy
    """
    rng = np.random.default_rng(len(shape) * 7 + int(smoothing * 10))
    x = rng.standard_normal(shape).astype(np.float32) * 3
    classes = shape[0] if len(shape) == 1 else shape[1]
    label_shape = () if len(shape) == 1 else shape[:1] + shape[2:]
    y = rng.integers(0, classes, label_shape).astype(np.int32)
    if y.ndim:
        y.flat[::3] = 2  # ignored positions, a class index in range
    weight = rng.uniform(0.5, 2.0, classes).astype(np.float32) if weighted else None
    kw = dict(ignore_index=2 if y.ndim else -100, reduction=reduction,
              label_smoothing=smoothing)
    (got,) = fused_and_unfused_outputs(lambda: nn.CrossEntropyLoss(
        None if weight is None else Tensor(weight), **kw), x, y)
    want = _ce_indices(x, y, weight, kw["ignore_index"], reduction, smoothing)
    assert got.dtype == np.float32 and got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_loss_on_probabilities(reduction, smoothing):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 4, 3)).astype(np.float32)
    y = rng.uniform(size=(6, 4, 3)).astype(np.float32)
    y /= y.sum(1, keepdims=True)
    weight = rng.uniform(0.5, 2.0, 4).astype(np.float32)
    (got,) = fused_and_unfused_outputs(
        lambda: nn.CrossEntropyLoss(Tensor(weight), reduction=reduction,
                                    label_smoothing=smoothing), x, y)
    np.testing.assert_allclose(got, _ce_probabilities(x, y, weight, reduction, smoothing),
                               rtol=2e-5, atol=1e-6)


def test_cross_entropy_loss_gradient_against_float64():
    """
    Feature: nn.CrossEntropyLoss's gradient
    Description: d loss / d logits, weighted, smoothed, some labels ignored
    Expectation: the float64 finite differences of the numpy reference
    """
    rng = np.random.default_rng(4)
    x = rng.standard_normal((6, 5)).astype(np.float32)
    y = rng.integers(0, 5, 6).astype(np.int32)
    y[1] = -100
    weight = rng.uniform(0.5, 2.0, 5).astype(np.float32)
    loss = nn.CrossEntropyLoss(Tensor(weight), label_smoothing=0.1)
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        got = ms.grad(loss)(Tensor(x), Tensor(y)).asnumpy()
        want = np.zeros(x.shape)
        h = 1e-6
        for i in np.ndindex(x.shape):
            up, down = x.astype(np.float64), x.astype(np.float64)
            up[i] += h
            down[i] -= h
            want[i] = (_ce_indices(up, y, weight, -100, "mean", 0.1)
                       - _ce_indices(down, y, weight, -100, "mean", 0.1)) / (2 * h)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_cross_entropy_loss_refuses_bad_labels_and_arguments():
    x = Tensor(np.zeros((4, 3), np.float32))
    with pytest.raises(InputError, match=r"class indices \(integers of shape \(4,\)\)"):
        nn.CrossEntropyLoss()(x, Tensor(np.zeros((4, 2), np.int32)))
    with pytest.raises(InputError, match="probability labels of shape"):
        nn.CrossEntropyLoss()(x, Tensor(np.zeros((4, 2), np.float32)))
    with pytest.raises(InputError, match="weight has 2 entries for 3 classes"):
        nn.CrossEntropyLoss(Tensor(np.ones(2, np.float32)))(x, Tensor(np.zeros(4, np.int32)))
    with pytest.raises(InputError, match="label_smoothing must be a float in"):
        nn.CrossEntropyLoss(label_smoothing=1.5)


@pytest.mark.parametrize("backend", ["c", "numpy"])
@pytest.mark.parametrize("fusion", [True, False])
@pytest.mark.parametrize("bad", [5, -1, 3])
def test_cross_entropy_loss_refuses_a_class_index_out_of_range(bad, fusion, backend):
    """
    Feature: nn.CrossEntropyLoss on class indices the graph cannot check while compiling
    Description: a label outside [0, classes) that is not ignore_index, in a training step and
        in the loss alone, fused and unfused, on both backends
    Expectation: an InputError naming the label and its position, as MindSpore refuses it
        (a one-hot of it is a row of zeros: the loss would be 0); the weights stay as they were
    """
    context.set_context(enable_graph_kernel=fusion, backend=backend)
    try:
        rng = np.random.default_rng(5)
        x = rng.standard_normal((4, 6)).astype(np.float32)
        y = np.array([0, 1, bad, -100], np.int32)
        net = nn.Dense(6, 3)
        before = [p.asnumpy().copy() for p in net.get_parameters()]
        step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()),
                                   nn.Momentum(net.trainable_params(), 0.1, 0.9))
        with pytest.raises(InputError, match=rf"CrossEntropyLoss: class index {bad} at "
                           r"position \[2\] is out of range: it must be in \[0, 3\) or -100"):
            step(Tensor(x), Tensor(y))
        for old, p in zip(before, net.get_parameters()):
            np.testing.assert_array_equal(p.asnumpy(), old)
        with pytest.raises(InputError, match=f"class index {bad} at position"):
            nn.CrossEntropyLoss()(Tensor(x[:, :3]), Tensor(y))
        y[2] = 2  # in range: the same compiled graphs run
        assert np.isfinite(float(step(Tensor(x), Tensor(y)).asnumpy()))
    finally:
        context.set_context(backend="c")


# -- nn.LSTM ----------------------------------------------------------------------------------

def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _lstm_reference(net, x, hx=None):
    """nn.LSTM in float64 numpy, from the net's own weights."""
    p = {q.name.split(".")[-1]: q.asnumpy().astype(np.float64) for q in net.trainable_params()}
    x = x.astype(np.float64)
    if net.batch_first:
        x = x.transpose(1, 0, 2)
    seq, batch = x.shape[:2]
    hid, dirs = net.hidden_size, net.num_directions
    steps = list(x)
    h_n, c_n = [], []
    for layer in range(net.num_layers):
        outs = []
        for d in range(dirs):
            s = f"_l{layer}" + ("_reverse" if d else "")
            k = layer * dirs + d
            h = np.zeros((batch, hid)) if hx is None else hx[0][k].astype(np.float64)
            c = np.zeros((batch, hid)) if hx is None else hx[1][k].astype(np.float64)
            out = [None] * seq
            for t in (range(seq - 1, -1, -1) if d else range(seq)):
                g = steps[t] @ p["weight_ih" + s].T + h @ p["weight_hh" + s].T
                if net.has_bias:
                    g = g + p["bias_ih" + s] + p["bias_hh" + s]
                i, f, gg, o = np.split(g, 4, axis=1)
                c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(gg)
                h = _sigmoid(o) * np.tanh(c)
                out[t] = h
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        steps = [np.concatenate(parts, 1) for parts in zip(*outs)]
    output = np.stack(steps, 1 if net.batch_first else 0)
    return output, np.stack(h_n), np.stack(c_n)


@pytest.mark.parametrize("num_layers,bidirectional,batch_first,has_bias", [
    (1, False, False, True), (2, True, True, True), (2, False, False, False)])
def test_lstm_matches_numpy(num_layers, bidirectional, batch_first, has_bias):
    """
    Feature: nn.LSTM, MindSpore's signature
    Description: random inputs and initial state, fused and unfused
    Expectation: output, (h_n, c_n) of the float64 numpy recurrence
    """
    rng = np.random.default_rng(num_layers + 2 * bidirectional)
    net = nn.LSTM(3, 5, num_layers=num_layers, has_bias=has_bias, batch_first=batch_first,
                  bidirectional=bidirectional)
    x = rng.standard_normal((2, 4, 3) if batch_first else (4, 2, 3)).astype(np.float32)
    dirs = 2 if bidirectional else 1
    h0, c0 = rng.standard_normal((2, num_layers * dirs, 2, 5)).astype(np.float32)

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.lstm = net

        def construct(self, x, h0, c0):
            out, (h, c) = self.lstm(x, (h0, c0))
            return out, h, c

    got = fused_and_unfused_outputs(Net, x, h0, c0)
    want = _lstm_reference(net, x, (h0, c0))
    assert got[0].shape == want[0].shape == ((2, 4, 5 * dirs) if batch_first else (4, 2, 5 * dirs))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    out, (h, c) = net(Tensor(x))  # hx=None: zeros
    np.testing.assert_allclose(h.asnumpy(), _lstm_reference(net, x)[1], rtol=1e-5, atol=1e-6)


def test_lstm_weight_gradients_match_finite_differences():
    """
    Feature: nn.LSTM is trainable
    Description: gradients of sum(output * r) + sum(h_n) for every weight, float64 network
    Expectation: central differences of the numpy reference
    """
    rng = np.random.default_rng(7)
    net = nn.LSTM(2, 3, num_layers=2, bidirectional=True, dtype=np.float64)
    x = rng.standard_normal((3, 2, 2))
    r = rng.standard_normal((3, 2, 6))

    class Objective(nn.Cell):
        def __init__(self):
            super().__init__()
            self.lstm = net

        def construct(self, x, r):
            out, (h, _) = self.lstm(x)
            return ops.reduce_sum(out * r, ()) + ops.reduce_sum(h, ())

    def reference():
        out, h, _ = _lstm_reference(net, x)
        return (out * r).sum() + h.sum()

    params = net.trainable_params()
    for fusion in (True, False):
        context.set_context(enable_graph_kernel=fusion)
        grads = ms.grad(Objective(), grad_position=None, weights=params)(Tensor(x), Tensor(r))
        for param, grad in zip(params, grads):
            value = param.asnumpy().copy()
            want = np.zeros_like(value)
            for i in np.ndindex(value.shape):
                for sign in (1, -1):
                    moved = value.copy()
                    moved[i] += sign * 1e-6
                    param.set_data(Tensor(moved))
                    want[i] += sign * reference() / 2e-6
                param.set_data(Tensor(value))
            np.testing.assert_allclose(grad.asnumpy(), want, rtol=1e-5, atol=1e-8,
                                       err_msg=param.name)


def test_lstm_refuses_bad_shapes():
    net = nn.LSTM(3, 4)
    with pytest.raises(Exception, match=r"takes x of shape \(seq_len, batch, 3\)"):
        net(Tensor(np.zeros((4, 2, 5), np.float32)))
    with pytest.raises(InputError, match="dropout must be a float"):
        nn.LSTM(3, 4, dropout=1.0)


# -- ops.Print --------------------------------------------------------------------------------

class _Printing(nn.Cell):
    def __init__(self, with_print=True):
        super().__init__()
        self.with_print = with_print
        self.print = ops.Print()

    def construct(self, x, y):
        a = ops.exp(x) + y
        if self.with_print:
            self.print("a:", a)
            ops.print_("then", 2)
        return ops.tanh(a * 2.0 - y)


def test_print_prints_on_every_call_in_order_without_splitting_the_fusion(capsys):
    """
    Feature: ops.Print in graph mode
    Description: a Print between elementwise ops, fused; the net called twice
    Expectation: printed on each call (not while tracing), in call order; the ops around it
        form the same one kernel as without the Print; the result unchanged
    """
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((2, 3, 4)).astype(np.float32)
    plain = ms.compile(_Printing(False), Tensor(x), Tensor(y))
    printing = ms.compile(_Printing(), Tensor(x), Tensor(y))
    capsys.readouterr()
    fused = [k.op_names for k in printing.kernels if k.op_names != ["Print"]]
    assert fused == [k.op_names for k in plain.kernels] == [["Exp", "Add", "Mul", "Sub", "Tanh"]]
    assert sum(k.op_names == ["Print"] for k in printing.kernels) == 2
    net = _Printing()
    for _ in range(2):
        out = net(Tensor(x), Tensor(y))
        np.testing.assert_allclose(out.asnumpy(), np.tanh((np.exp(x) + y) * 2 - y), rtol=1e-5)
    text = capsys.readouterr().out
    calls = text.split("then\n2\n")  # each call: the tensor, then the string
    assert len(calls) == 3 and calls[2] == ""
    for printed in calls[:2]:
        head, values = printed.split("value=\n")
        assert head == "a:\nTensor(shape=[3, 4], dtype=float32, "
        got = np.array(eval(values.rstrip()[:-1]), np.float32)  # the printed list
        np.testing.assert_allclose(got, np.exp(x) + y, rtol=1e-6)


def test_print_unfused_and_in_pynative_mode(capsys):
    x = np.arange(3, dtype=np.float32)
    context.set_context(enable_graph_kernel=False)
    _Apply(lambda t: (ops.Print()("x =", t), t + 1.0)[1])(Tensor(x))
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ops.Print()("eager", Tensor(x))
    assert capsys.readouterr().out == ("x =\nTensor(shape=[3], dtype=float32, value=\n"
                                       "[0., 1., 2.])\neager\nTensor(shape=[3], "
                                       "dtype=float32, value=\n[0., 1., 2.])\n")


def test_print_in_a_differentiated_function_and_bad_inputs(capsys):
    def f(x):
        ops.Print()("x", x)
        return ops.reduce_sum(x * x, ())

    x = np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(ms.grad(f)(Tensor(x)).asnumpy(), 2 * x)
    assert "x\nTensor(shape=[3]" in capsys.readouterr().out
    with pytest.raises(InputError, match="Print takes strings, numbers and Tensors, got dict"):
        ops.Print()("x", {})


# -- nn.WithEvalCell --------------------------------------------------------------------------

def test_with_eval_cell_returns_loss_outputs_label_and_casts_to_float32():
    """
    Feature: nn.WithEvalCell(network, loss_fn, add_cast_fp32)
    Description: a float16 Dense (Cell.to_float) evaluated with and without add_cast_fp32
    Expectation: (loss, outputs, label); with add_cast_fp32 outputs are float32 and the loss
        is computed from them
    """
    rng = np.random.default_rng(16)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    dense = nn.Dense(3, 2).to_float(ms.float16)  # a float16 network: float16 outputs
    for cast, dtype in ((False, np.float16), (True, np.float32)):
        loss, out, label = nn.WithEvalCell(dense, nn.MSELoss(), add_cast_fp32=cast)(
            Tensor(x), Tensor(y))
        assert out.dtype == dtype and label.dtype == np.float32
        np.testing.assert_allclose(loss.asnumpy(), np.mean((out.asnumpy().astype(np.float64)
                                                            - y) ** 2), rtol=2e-3)


def test_ops_auto_generate_module_path():
    """
    Feature: mindspore.ops.auto_generate, where MindSpore 2.3+ puts its generated primitives
    Description: import primitives, a gradient primitive and a functional form from it
    Expectation: graphkernel's own; a name it lacks says so
    """
    from graphkernel.ops import auto_generate
    from graphkernel.ops.auto_generate import Add, GeLUGrad, gelu
    from graphkernel.ops.operations import _grad_ops as G
    assert Add is ops.Add and GeLUGrad is G.GeLUGrad
    x = np.linspace(-2, 2, 5).astype(np.float32)
    np.testing.assert_allclose(gelu(Tensor(x)).asnumpy(), ops.gelu(Tensor(x)).asnumpy())
    with pytest.raises(UnsupportedError, match="graphkernel.ops.auto_generate has no attribute"):
        auto_generate.NoSuchPrimitive  # noqa: B018


def test_lstm_initialisation_is_mindspores_uniform_and_follows_set_seed():
    ms.set_seed(3)
    first = [q.asnumpy() for q in nn.LSTM(4, 8, num_layers=2).trainable_params()]
    ms.set_seed(3)
    again = [q.asnumpy() for q in nn.LSTM(4, 8, num_layers=2).trainable_params()]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
        assert np.abs(a).max() <= 1 / np.sqrt(8) and a.std() > 0.1
