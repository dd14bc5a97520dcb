"""MindSpore's layer and API surface: layers against numpy, parameter names, checkpoints, mstype,
functional names, scalar promotion, non-tensor cell inputs, @jit."""
import pathlib
from collections import OrderedDict

import numpy as np
import pytest
from cells import product_atol

import graphkernel
from graphkernel import Tensor, nn, ops
from graphkernel import context as gk_context
from graphkernel.common import dtype as mstype
from graphkernel.common.checkpoint import CheckpointError
from graphkernel.errors import InputError, ShapeError
from graphkernel.frontend import context
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ops import operations as P

ON = CompileOptions(enable_graph_kernel=True)
OFF = CompileOptions(enable_graph_kernel=False)


def run_both(net, *arrays):
    outs = []
    for options in (ON, OFF):
        outs.append(graphkernel.compile(net, *arrays, options=options).run_arrays(*arrays))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return outs[0]


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(6, 8, activation="gelu", weight_init="xavier_uniform",
                            bias_init="zeros")
        self.fc2 = nn.Dense(8, 3, weight_init="he_normal", bias_init="normal")

    def construct(self, x):
        return self.fc2(self.fc1(x))


def test_dense_takes_nd_input_activation_names_and_initialisers(rng):
    net = Block()
    x = rng.standard_normal((2, 5, 6)).astype(np.float32)
    out = run_both(net, x)[0]
    w1, b1 = net.fc1.weight.asnumpy(), net.fc1.bias.asnumpy()
    w2, b2 = net.fc2.weight.asnumpy(), net.fc2.bias.asnumpy()
    h = x @ w1.T + b1
    h = 0.5 * h * (1 + np.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))
    np.testing.assert_allclose(out, h @ w2.T + b2, rtol=1e-4, atol=1e-5)
    assert out.shape == (2, 5, 3)
    assert not b1.any() and np.abs(w1).max() <= np.sqrt(6 / 14) + 1e-6
    with pytest.raises(InputError, match="unknown activation 'swishy'"):
        nn.Dense(2, 2, activation="swishy")
    with pytest.raises(InputError, match="unknown initializer 'glorot'"):
        nn.Dense(2, 2, weight_init="glorot")


def test_parameters_are_named_by_their_path():
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.block = Block()
            self.head = nn.SequentialCell(OrderedDict([("proj", nn.Dense(3, 2)),
                                                       ("act", nn.ReLU())]))
            self.layers = nn.CellList([nn.Dense(2, 2), nn.Dense(2, 2)])
            self.norm = nn.BatchNorm1d(2)

        def construct(self, x):
            x = self.head(self.block(x))
            for layer in self.layers:
                x = layer(x)
            return self.norm(x)

    net = Net()
    names = [name for name, _ in net.parameters_and_names()]
    assert names == ["block.fc1.weight", "block.fc1.bias", "block.fc2.weight", "block.fc2.bias",
                     "head.proj.weight", "head.proj.bias", "layers.0.weight", "layers.0.bias",
                     "layers.1.weight", "layers.1.bias", "norm.gamma", "norm.beta",
                     "norm.moving_mean", "norm.moving_variance"]
    assert [p.name for _, p in net.parameters_and_names()] == names
    assert list(net.parameters_dict()) == names
    assert len(net.trainable_params()) == 12  # moving statistics are not trained
    x = np.ones((4, 6), np.float32)
    assert net(Tensor(x)).shape == (4, 2)


def test_conv_bn_relu_pool_flatten_layers_against_numpy(rng):
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, stride=2, has_bias=True)
            self.bn = nn.BatchNorm2d(4)
            self.relu = nn.ReLU()
            self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
            self.avg = nn.AvgPool2d(kernel_size=2, stride=1, pad_mode="same")
            self.flatten = nn.Flatten()

        def construct(self, x):
            return self.flatten(self.avg(self.pool(self.relu(self.bn(self.conv(x))))))

    net = Net()
    net.bn.moving_mean.set_data(rng.standard_normal(4).astype(np.float32))
    net.bn.moving_variance.set_data(rng.random(4).astype(np.float32) + 0.5)
    x = rng.standard_normal((2, 3, 9, 8)).astype(np.float32)
    out = run_both(net, x)[0]
    conv = P.Conv2D(4, 3, pad_mode="same", stride=2)(Tensor(x), net.conv.weight).asnumpy()
    conv = conv + net.conv.bias.asnumpy().reshape(1, -1, 1, 1)
    m, v = net.bn.moving_mean.asnumpy(), net.bn.moving_variance.asnumpy()
    y = np.maximum((conv - m.reshape(1, -1, 1, 1)) / np.sqrt(v.reshape(1, -1, 1, 1) + 1e-5), 0)
    assert y.shape == (2, 4, 5, 4)
    pooled = y[:, :, :4, :4].reshape(2, 4, 2, 2, 2, 2).max(axis=(3, 5))
    # 'same' 2x2 average with stride 1: the last row and column average what they cover.
    padded = np.pad(pooled, ((0, 0), (0, 0), (0, 1), (0, 1)), constant_values=np.nan)
    avg = np.stack([[np.nanmean(padded[:, :, i:i + 2, j:j + 2], axis=(2, 3)) for j in range(2)]
                    for i in range(2)]).transpose(2, 3, 0, 1)
    np.testing.assert_allclose(out, avg.reshape(2, -1), rtol=1e-5, atol=1e-5)


def test_batchnorm_training_mode_uses_batch_statistics(rng):
    bn = nn.BatchNorm2d(3)
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32) * 3 + 1
    inference = bn(Tensor(x)).asnumpy()
    np.testing.assert_allclose(inference, x / np.sqrt(1 + 1e-5), rtol=1e-5)
    bn.set_train()
    train = bn(Tensor(x)).asnumpy()
    want = (x - x.mean((0, 2, 3), keepdims=True)) / np.sqrt(x.var((0, 2, 3), keepdims=True) +
                                                             1e-5)
    np.testing.assert_allclose(train, want, rtol=1e-4, atol=1e-4)


def test_dropout_layer_is_identity_unless_training(rng):
    drop = nn.Dropout(p=0.25)
    x = rng.standard_normal((100, 40)).astype(np.float32)
    np.testing.assert_array_equal(drop(Tensor(x)).asnumpy(), x)
    drop.set_train(True)
    out = drop(Tensor(x)).asnumpy()
    kept = out != 0
    assert 0.7 < kept.mean() < 0.8
    np.testing.assert_allclose(out[kept], x[kept] / 0.75, rtol=1e-6)


def test_embedding_gather_one_hot_and_padding_idx(rng):
    emb = nn.Embedding(10, 4, padding_idx=0)
    ids = np.array([[0, 3, 9], [1, 1, 2]], np.int32)
    table = emb.embedding_table.asnumpy()
    assert not table[0].any()
    np.testing.assert_array_equal(run_both(emb, ids)[0], table[ids])
    hot = nn.Embedding(10, 4, use_one_hot=True)
    np.testing.assert_allclose(run_both(hot, ids)[0], hot.embedding_table.asnumpy()[ids])


def test_activation_cells(rng):
    x = rng.standard_normal((3, 7)).astype(np.float32)
    cases = [(nn.Tanh(), np.tanh(x)), (nn.Sigmoid(), 1 / (1 + np.exp(-x))),
             (nn.SiLU(), x / (1 + np.exp(-x))), (nn.Softsign(), x / (1 + np.abs(x))),
             (nn.Identity(), x)]
    for cell, want in cases:
        np.testing.assert_allclose(run_both(cell, x)[0], want, rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip_and_errors(tmp_path, rng):
    net = Block()
    path = str(tmp_path / "block")
    graphkernel.save_checkpoint(net, path)
    assert (tmp_path / "block.ckpt").exists()
    other = Block()
    params = graphkernel.load_checkpoint(path + ".ckpt")
    assert list(params) == list(net.parameters_dict())
    not_loaded, unused = graphkernel.load_param_into_net(other, params)
    assert not_loaded == [] and unused == []
    for (_, a), (_, b) in zip(net.parameters_and_names(), other.parameters_and_names()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    params["block.extra"] = params.pop("fc2.bias")
    not_loaded, unused = graphkernel.load_param_into_net(Block(), params)
    assert not_loaded == ["fc2.bias"] and unused == ["block.extra"]
    with pytest.raises(CheckpointError, match="strict load"):
        graphkernel.load_param_into_net(Block(), params, strict_load=True)
    bad = {"fc1.weight": np.zeros((2, 2), np.float32)}
    with pytest.raises(CheckpointError, match=r"shape \(2, 2\) differs from the net's \(8, 6\)"):
        graphkernel.load_param_into_net(Block(), bad)
    (tmp_path / "junk.ckpt").write_bytes(b"\xff\xff\xff")
    with pytest.raises(CheckpointError, match="junk.ckpt"):
        graphkernel.load_checkpoint(str(tmp_path / "junk.ckpt"))


def test_checkpoint_of_a_training_step_keeps_mindspore_names(tmp_path):
    """A checkpoint of TrainOneStepCell (what ModelCheckpoint saves) names each parameter as
    MindSpore does, by Parameter.name: "fc1.weight" and the optimizer's "moments.fc1.weight",
    not the wrappers' attribute paths; it loads back into a bare network."""
    net = Block()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                               nn.Momentum(net.trainable_params(), 0.1, 0.9))
    graphkernel.save_checkpoint(step, str(tmp_path / "step.ckpt"))
    params = graphkernel.load_checkpoint(str(tmp_path / "step.ckpt"))
    names = list(net.parameters_dict())
    assert list(params) == names + [f"moments.{n}" for n in names]
    not_loaded, unused = graphkernel.load_param_into_net(Block(), params)
    assert not_loaded == [] and unused == [f"moments.{n}" for n in names]
    not_loaded, _ = graphkernel.load_param_into_net(step, params, strict_load=True)
    assert not_loaded == []


def test_checkpoint_wire_format_spelled_out(tmp_path):
    """The bytes of a one-tensor checkpoint, spelled out from MindSpore's checkpoint.proto."""
    path = str(tmp_path / "one.ckpt")
    graphkernel.save_checkpoint({"w": np.array([1.0, 2.0], np.float32)}, path)
    tensor = b"\x08\x02" + b"\x12\x07Float32" + b"\x1a\x08" + np.array([1, 2], "<f4").tobytes()
    value = b"\x0a\x01w" + b"\x12" + bytes([len(tensor)]) + tensor
    assert open(path, "rb").read() == b"\x0a" + bytes([len(value)]) + value
    # packed dims (proto3 writers) read the same
    packed = b"\x0a\x01\x02" + tensor[2:]
    value = b"\x0a\x01w" + b"\x12" + bytes([len(packed)]) + packed
    (tmp_path / "packed.ckpt").write_bytes(b"\x0a" + bytes([len(value)]) + value)
    got = graphkernel.load_checkpoint(str(tmp_path / "packed.ckpt"))["w"].asnumpy()
    np.testing.assert_array_equal(got, [1.0, 2.0])


def test_a_training_steps_checkpoint_loads_into_the_bare_network(tmp_path, rng):
    """Entries are keyed by Parameter.name, as MindSpore keys them: the step's own attribute
    paths (network._backbone.fc1.weight) would load nothing into the bare net."""
    net = Block()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                               nn.Momentum(net.trainable_params(), 0.1, 0.9))
    x, y = rng.standard_normal((4, 6)).astype(np.float32), np.zeros((4, 3), np.float32)
    step(Tensor(x), Tensor(y))
    path = str(tmp_path / "step.ckpt")
    graphkernel.save_checkpoint(step, path)
    params = graphkernel.load_checkpoint(path)
    names = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert list(params) == names + [f"moments.{n}" for n in names]
    bare = Block()
    not_loaded, unused = graphkernel.load_param_into_net(bare, params)
    assert not_loaded == [] and unused == [f"moments.{n}" for n in names]
    for (_, a), (_, b) in zip(net.parameters_and_names(), bare.parameters_and_names()):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())
    # a file of an older graphkernel, keyed by attribute path, still loads into the step
    old = {path: p.asnumpy() for path, p in step.parameters_and_names()}
    again = Block()
    fresh = nn.TrainOneStepCell(nn.WithLossCell(again, nn.MSELoss()),
                                nn.Momentum(again.trainable_params(), 0.1, 0.9))
    assert graphkernel.load_param_into_net(fresh, old) == ([], [])
    np.testing.assert_array_equal(again.fc2.weight.asnumpy(), net.fc2.weight.asnumpy())


def test_a_checkpoint_that_fits_nothing_is_an_error(tmp_path):
    path = str(tmp_path / "other.ckpt")
    graphkernel.save_checkpoint({"conv.weight": np.ones((2, 2), np.float32)}, path)
    with pytest.raises(CheckpointError, match=r"none of the 4 parameters of Block \('fc1.weight"
                                              r"'.*entries are 'conv.weight': nothing loaded"):
        graphkernel.load_param_into_net(Block(), graphkernel.load_checkpoint(path))
    with pytest.raises(CheckpointError, match="takes a dict of parameters"):
        graphkernel.load_param_into_net(Block(), [("fc1.weight", 1)])


class Typed(nn.Cell):
    def __init__(self):
        super().__init__()
        self.steps = graphkernel.Parameter(np.zeros(3, np.int32), "steps")
        self.scale = graphkernel.Parameter(np.ones(3, np.float32), "scale")
        self.half = graphkernel.Parameter(np.ones(2, np.float16), "half")


@pytest.mark.parametrize("name,value,message", [
    ("steps", np.array([1.5, np.nan, 2.0], np.float32),
     r"parameter 'steps': the checkpoint holds float32, the net's parameter is int32"),
    ("steps", np.array([1, 2 ** 40, 3], np.int64),
     r"parameter 'steps': the checkpoint's int64 value 1099511627776 does not fit the net's "
     r"int32"),
    ("scale", np.array([1.0, 1e300, 2.0]),
     r"parameter 'scale': the checkpoint's float64 value .*1e\+300.* does not fit the net's "
     r"float32 \(it would become .*inf"),
    ("half", np.array([1.0, 70000.0], np.float32), r"'half'.*does not fit the net's float16"),
    ("scale", np.array([True, False, True]), r"'scale': the checkpoint holds bool"),
    ("scale", np.array(["a", "b", "c"]), r"'scale': the checkpoint's value has dtype <U1"),
])
def test_a_value_the_parameter_cannot_hold_is_refused_and_nothing_loads(name, value, message):
    net = Typed()
    params = {"steps": np.array([7, 8, 9], np.int32), name: value}
    with pytest.raises(CheckpointError, match=message):
        graphkernel.load_param_into_net(net, params)
    np.testing.assert_array_equal(net.steps.asnumpy(), [0, 0, 0])  # not even the good entry


def test_value_preserving_conversions_load_as_mindspore_converts():
    net = Typed()
    params = {"steps": np.array([1, -2, 3], np.int64), "scale": np.array([0.5, 1e-3, 2.0]),
              "half": np.array([1.5, -3.0], np.float32)}
    assert graphkernel.load_param_into_net(net, params) == ([], [])
    assert net.steps.dtype == np.int32 and list(net.steps.asnumpy()) == [1, -2, 3]
    np.testing.assert_allclose(net.scale.asnumpy(), [0.5, 1e-3, 2.0], rtol=1e-7)
    with pytest.raises(CheckpointError, match="not converting under strict_load"):
        graphkernel.load_param_into_net(Typed(), params, strict_load=True)


def _ckpt(name, dims, type_name, content):
    """One entry of MindSpore's Checkpoint message, dims as int64 varints (ten bytes when
    negative, as protobuf writes them)."""
    def varint(v):
        v &= (1 << 64) - 1
        out = bytearray()
        while True:
            out.append((v & 0x7F) | (0x80 if v >> 7 else 0))
            v >>= 7
            if not v:
                return bytes(out)

    def field(number, payload):
        return varint(number << 3 | 2) + varint(len(payload)) + payload

    tensor = b"".join(b"\x08" + varint(d) for d in dims) + field(2, type_name) + \
        field(3, content)
    return field(1, field(1, name) + field(2, tensor))


@pytest.mark.parametrize("data,message", [
    (b"", "is empty"),
    (_ckpt(b"w", [-1, -2], b"Float32", bytes(8)), r"bad shape \(-1, -2\)"),
    # 2**32 * 2**32 wraps to 0 in int64: zero bytes must not pass for that many elements
    (_ckpt(b"w", [2 ** 32, 2 ** 32], b"Float32", b""),
     r"0 bytes for a Float32 tensor of shape \(4294967296, 4294967296\)"),
    (_ckpt(b"w", [1] * 40, b"Float32", bytes(4)), "bad shape"),
    (_ckpt(b"w", [2], b"Bool", b"\x01\x07"), "bytes other than 0 and 1"),
    (_ckpt(b"w", [1], b"Float32", bytes(4)) * 2, "'w' appears twice"),
    (_ckpt(b"w", [1], b"Float32", bytes(4)) + b"\x0d\x01\x02", "damaged one"),
], ids=["empty", "negative dims", "wrapping dims", "40 dims", "bool bytes", "twice",
        "cut fixed32"])
def test_malformed_checkpoints_are_refused_clearly(tmp_path, data, message):
    path = tmp_path / "bad.ckpt"
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match=message) as info:
        graphkernel.load_checkpoint(str(path))
    assert str(path) in str(info.value)


def test_checkpoint_fields_protobuf_skips_are_skipped(tmp_path):
    """Unknown fields of any wire type, a group included, are skipped as protobuf's readers
    (MindSpore's) skip them: a later MindSpore's additions do not make a file unreadable."""
    entry = _ckpt(b"w", [2], b"Float32", np.array([1, 2], "<f4").tobytes())
    value = entry[2:]  # the Value message inside the Checkpoint's field 1
    extra = b"\x28\x01" + b"\x33\x08\x05\x34" + b"\x3d" + bytes(4)  # varint, group, fixed32
    path = tmp_path / "later.ckpt"
    path.write_bytes(b"\x0a" + bytes([len(value) + len(extra)]) + value + extra)
    params = graphkernel.load_checkpoint(str(path))
    np.testing.assert_array_equal(params["w"].asnumpy(), [1, 2])


def test_a_failed_save_is_a_clear_error_and_keeps_the_old_file(tmp_path):
    missing = tmp_path / "no" / "such" / "folder" / "net.ckpt"
    with pytest.raises(CheckpointError, match=r"cannot save checkpoint .*net.ckpt: No such file"):
        graphkernel.save_checkpoint(Block(), str(missing))
    path = tmp_path / "net.ckpt"
    graphkernel.save_checkpoint(Block(), str(path))
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match="dtype object"):
        graphkernel.save_checkpoint({"w": np.array([{}])}, str(path))
    (tmp_path / "folder.ckpt").mkdir()
    with pytest.raises(CheckpointError, match="cannot save checkpoint .*folder.ckpt"):
        graphkernel.save_checkpoint(Block(), str(tmp_path / "folder.ckpt"))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.ckpt", "net.ckpt"]


def test_mstype_and_functional_names(rng):
    assert mstype.float32 == graphkernel.float32 == np.float32 and graphkernel.dtype is mstype
    x = Tensor(rng.standard_normal((2, 6)).astype(np.float32))
    for name in ["gelu", "relu", "matmul", "softmax", "concat", "split", "gather", "one_hot",
                 "argmax", "sum", "mean", "sin", "isnan", "floor_div", "zeros_like", "fill",
                 "stack", "unstack", "strided_slice", "conv2d", "dropout", "bias_add"]:
        assert callable(getattr(ops, name)), name
    for machine in ["ge_lu", "re_lu", "mat_mul", "soft_max"]:
        assert not hasattr(ops, machine)
    assert ops.ReduceSum is P.ReduceSum and ops.Select is P.Select
    a = x.asnumpy()
    np.testing.assert_allclose(ops.softmax(x, 0).asnumpy(),
                               np.exp(a) / np.exp(a).sum(0), rtol=1e-6)
    pieces = ops.split(x, [1, 5], axis=1)
    assert [p.shape for p in pieces] == [(2, 1), (2, 5)]
    assert [p.shape for p in ops.split(x, 4, axis=1)] == [(2, 4), (2, 2)]
    np.testing.assert_allclose(ops.concat(pieces, 1).asnumpy(), a)
    assert ops.sum(x, 1, keepdim=True).shape == (2, 1)
    assert ops.functional.depend(x, x * 2) is x


@pytest.mark.parametrize("mode", [context.GRAPH_MODE, context.PYNATIVE_MODE])
def test_python_scalars_promote_as_in_mindspore(mode):
    context.set_context(mode=mode)

    class Net(nn.Cell):
        def construct(self, i, h):
            return i * 2.5, h * 2.5, i * 2

    i, h = Tensor(np.array([1, 2], np.int32)), Tensor(np.array([1, 2], np.float16))
    a, b, c = Net()(i, h)
    assert (a.dtype, b.dtype, c.dtype) == (np.float32, np.float16, np.int32)


def test_numbers_and_tuples_as_cell_inputs():
    class Net(nn.Cell):
        def construct(self, xs, axis, scale=2.0):
            return P.ReduceSum()(P.AddN()(xs), axis) * scale

    x, y = Tensor(np.ones((2, 3), np.float32)), Tensor(np.full((2, 3), 2, np.float32))
    net = Net()
    np.testing.assert_array_equal(net((x, y), 1).asnumpy(), [18, 18])
    np.testing.assert_array_equal(net([x, y, x], (0, 1), 0.5).asnumpy(), 12)
    np.testing.assert_array_equal(net((x, y), 1, 3.0).asnumpy(), [27, 27])
    assert len(net._compiled) == 3  # one graph per constant value and tuple length
    with pytest.raises(InputError, match="input 'axis' is a dict"):
        net((x, y), {"axis": 1})


def test_jit_decorates_functions_and_construct():
    calls = []

    @graphkernel.jit
    def f(a, b, k):
        calls.append(1)
        return ops.relu(a - b) * k

    a, b = Tensor(np.array([3.0, -1.0], np.float32)), Tensor(np.ones(2, np.float32))
    np.testing.assert_array_equal(f(a, b, 2).asnumpy(), [4, 0])
    np.testing.assert_array_equal(f(a, b, 2).asnumpy(), [4, 0])
    assert len(calls) == 1  # traced once, then the compiled graph runs

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)

        @graphkernel.jit(jit_level="O1")
        def construct(self, x):
            return self.fc(x) * 2.0

    net = Net()
    gk_context.set_context(mode=gk_context.PYNATIVE_MODE)
    w, bias = net.fc.weight.asnumpy(), net.fc.bias.asnumpy()
    np.testing.assert_allclose(net(a.asnumpy()[None]).asnumpy(),
                               (a.asnumpy()[None] @ w.T + bias) * 2, rtol=1e-6,
                               atol=2 * product_atol(a.asnumpy()[None], w.T))


def test_flatten_and_layer_errors():
    with pytest.raises(ShapeError, match="needs input with 4 features"):
        nn.Dense(4, 2)(Tensor(np.ones((2, 3), np.float32)))
    with pytest.raises(ShapeError, match="expects rank-4 input"):
        nn.BatchNorm2d(3)(Tensor(np.ones((2, 3), np.float32)))
    out = nn.Flatten(0, 1)(Tensor(np.ones((2, 3, 4), np.float32)))
    assert out.shape == (6, 4)


# Written by MindSpore 2.10.0 (CPU, pip wheel) with mindspore.save_checkpoint from a cell with
# nn.Dense(3, 2) as fc1, nn.BatchNorm1d(2) as bn, and Parameters scalar (float32, 0-d), ids
# (int64, [2, 2]) and half (float16, [2]); the values it held:
MINDSPORE_CKPT = pathlib.Path(__file__).parent / "data" / "mindspore_2_10.ckpt"
MINDSPORE_VALUES = {
    "scalar": np.array(2.5, np.float32),
    "ids": np.array([[1, -2], [3, 4]], np.int64),
    "half": np.array([1.5, -0.25], np.float16),
    "fc1.weight": np.array([[-0.15583154559135437, 0.05939997360110283, -0.30640751123428345],
                            [0.566713809967041, -0.42807918787002563, -0.4388887882232666]],
                           np.float32),
    "fc1.bias": np.array([0.2149970531463623, -0.2361009120941162], np.float32),
    "bn.moving_mean": np.zeros(2, np.float32), "bn.moving_variance": np.ones(2, np.float32),
    "bn.gamma": np.ones(2, np.float32), "bn.beta": np.zeros(2, np.float32),
}


def test_reads_a_checkpoint_mindspore_wrote_and_writes_the_same_bytes(tmp_path):
    params = graphkernel.load_checkpoint(str(MINDSPORE_CKPT))
    assert list(params) == list(MINDSPORE_VALUES)
    for name, want in MINDSPORE_VALUES.items():
        got = params[name].asnumpy()
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want)
    path = tmp_path / "again.ckpt"
    graphkernel.save_checkpoint(MINDSPORE_VALUES, str(path))
    assert path.read_bytes() == MINDSPORE_CKPT.read_bytes()

    class Port(nn.Cell):  # the same cell, ported: its parameters load by name
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(3, 2)
            self.bn = nn.BatchNorm1d(2)

    not_loaded, unused = graphkernel.load_param_into_net(Port(), params)
    assert not_loaded == [] and unused == ["scalar", "ids", "half"]


@pytest.mark.parametrize("mode", [context.GRAPH_MODE, context.PYNATIVE_MODE])
@pytest.mark.parametrize("fusion", [True, False])
def test_batchnorm_training_updates_moving_statistics(mode, fusion, rng):
    context.set_context(mode=mode, enable_graph_kernel=fusion)
    x = (rng.standard_normal((4, 3, 2, 2)) * 3 + 1).astype(np.float32)
    bn = nn.BatchNorm2d(3, momentum=0.8).set_train()
    for _ in range(2):
        bn(Tensor(x))
    m, v = x.mean((0, 2, 3)), x.var((0, 2, 3), ddof=1)  # unbiased, as MindSpore keeps it
    want_mean = 0.8 * (0.2 * m) + 0.2 * m
    want_var = 0.8 * (0.8 * 1 + 0.2 * v) + 0.2 * v
    np.testing.assert_allclose(bn.moving_mean.asnumpy(), want_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.moving_variance.asnumpy(), want_var, rtol=1e-5)
    bn.set_train(False)  # inference reads what training left
    out = bn(Tensor(x)).asnumpy()
    np.testing.assert_allclose(out, (x - want_mean.reshape(1, 3, 1, 1)) /
                               np.sqrt(want_var.reshape(1, 3, 1, 1) + 1e-5), rtol=1e-4,
                               atol=1e-5)


def test_assign_errors():
    from graphkernel.errors import GraphModeError
    p = graphkernel.Parameter(np.zeros(3, np.float32), "p")

    class Twice(nn.Cell):
        def __init__(self):
            super().__init__()
            self.p = p

        def construct(self, x):
            ops.functional.assign(self.p, x)
            ops.functional.assign(self.p, x * 2.0)
            return x

    with pytest.raises(GraphModeError, match="assigned twice"):
        Twice()(Tensor(np.ones(3, np.float32)))
    with pytest.raises(InputError, match=r"float32\[3\], the value float32\[2\]"):
        ops.functional.assign(p, Tensor(np.ones(2, np.float32)))
    ops.functional.assign(p, Tensor(np.ones(3, np.float32)))
    np.testing.assert_array_equal(p.asnumpy(), 1.0)


def test_cells_appended_to_a_list_are_named_as_mindspore_names_them(tmp_path):
    """A cell appended to a CellList or SequentialCell already set on its parent is named under
    the parent's attribute ("layers.1.weight", not "1.weight", which three lists of one net
    would share); a list built by appends before it is set, whose items hold lists (MindCV's
    Swin), gets MindSpore's own names for them. Expected names: MindSpore 2.10's, measured."""
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([nn.Dense(2, 2)])
            self.layers.append(nn.Dense(2, 2))
            self.seq = nn.SequentialCell([nn.Dense(2, 2)])
            self.seq.append(nn.Dense(2, 3))
            self.stages = nn.CellList()
            self.stages.append(nn.Dense(2, 2))
            self.stages.extend([nn.Dense(2, 2)])

    net = Net()
    assert [p.name for p in net.get_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
        "seq.0.weight", "seq.0.bias", "seq.1.weight", "seq.1.bias",
        "0.weight", "0.bias", "1.weight", "1.bias"]

    class Stage(nn.Cell):
        def __init__(self):
            super().__init__()
            self.blocks = nn.CellList([nn.Dense(2, 2)])

    stages = nn.CellList()
    for _ in range(3):
        stages.append(Stage())
    assert [p.name for p in stages.get_parameters()] == [
        "0.blocks.0.weight", "0.blocks.0.bias", "0.blocks.1.blocks.0.weight",
        "0.blocks.1.blocks.0.bias", "0.blocks.2.blocks.0.weight", "0.blocks.2.blocks.0.bias"]
    graphkernel.save_checkpoint(stages, str(tmp_path / "stages.ckpt"))  # names unique
    # Lists given whole to the constructor are named by index alone (MindCV's ConvNeXt:
    # SequentialCell([stem, stage, ...]) names "feature.1.0.gamma", not "feature.0.1.0...").
    for listed in (nn.SequentialCell, nn.CellList):
        whole = listed([nn.SequentialCell([nn.Dense(2, 2)]), nn.SequentialCell([nn.Dense(2, 2)])])
        assert [p.name for p in whole.get_parameters()] == [
            "0.0.weight", "0.0.bias", "1.0.weight", "1.0.bias"]
    assert len(graphkernel.load_checkpoint(str(tmp_path / "stages.ckpt"))) == 6
