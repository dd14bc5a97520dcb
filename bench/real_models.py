"""The real-size networks of `python -m bench --real` (bench/real.py), each written twice with the
same parameter names: with `graphkernel.nn` layers (what is timed as graphkernel) and with
`torch.nn` layers (torch eager, and the ONNX file ONNX Runtime, OpenVINO and graphkernel.load
run). ResNet-18/50 (basic and bottleneck blocks), MobileNetV2 (inverted residuals, depthwise
convolutions, ReLU6), MobileNetV3-small (hard-swish, squeeze-excitation; torch only: it is one of
the exported ONNX models) and a stack of the bench's encoder layer (bench/gk_cells.py).

graphkernel's pooling takes no explicit padding (MindSpore's pad_mode), so the stem's 3x3/2 max
pool pads one row and column at the end ("same"); the torch version of a network that graphkernel
also runs pads the same way (zeros, equal to -inf after a ReLU). The torch-only exports keep
torchvision's symmetric padding.
"""
from __future__ import annotations

from typing import Any

import numpy as np

# (expansion t, channels c, repeats n, first stride s), torchvision's MobileNetV2 table.
MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1))
# (kernel, expanded, out, squeeze-excite, hard-swish, stride), torchvision's MobileNetV3-small.
MOBILENET_V3_SMALL = ((3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
                      (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2),
                      (5, 240, 40, True, True, 1), (5, 240, 40, True, True, 1),
                      (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
                      (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1),
                      (5, 576, 96, True, True, 1))
RESNETS = {"resnet18": ("basic", (2, 2, 2, 2)), "resnet50": ("bottleneck", (3, 4, 6, 3))}


def _make_divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


# -- graphkernel.nn ------------------------------------------------------------------------------

def gk_cnn(name: str, params: dict[str, np.ndarray] | None = None, classes: int = 1000,
           framework: str = "graphkernel") -> Any:
    """ResNet-18/50 or MobileNetV2 with graphkernel.nn layers, inference mode: `params` by name
    (as gk_params returns them), else random weights. framework "mindspore": the same code on
    MindSpore 2.10's cells and primitives (graphkernel's API is MindSpore's; `params` needed),
    as bench/ms_worker.py runs it in a process of its own."""
    import importlib
    fw = importlib.import_module(framework)
    nn = importlib.import_module(framework + ".nn")
    P = importlib.import_module(framework + ".ops.operations")

    class ConvBN(nn.Cell):
        def __init__(self, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                     act: str | None = "relu") -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride, pad_mode="pad", padding=k // 2,
                                  group=group)
            self.bn = nn.BatchNorm2d(cout)
            self.act = nn.ReLU() if act == "relu" else nn.ReLU6() if act == "relu6" else None

        def construct(self, x: Any) -> Any:
            y = self.bn(self.conv(x))
            return self.act(y) if self.act is not None else y

    class Basic(nn.Cell):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.conv1 = ConvBN(cin, width, 3, stride)
            self.conv2 = ConvBN(width, width, 3, act=None)
            self.down = ConvBN(cin, width, 1, stride, act=None) \
                if stride != 1 or cin != width else None
            self.relu = nn.ReLU()

        def construct(self, x: Any) -> Any:
            short = self.down(x) if self.down is not None else x
            return self.relu(self.conv2(self.conv1(x)) + short)

    class Bottleneck(nn.Cell):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.conv1 = ConvBN(cin, width, 1)
            self.conv2 = ConvBN(width, width, 3, stride)
            self.conv3 = ConvBN(width, out, 1, act=None)
            self.down = ConvBN(cin, out, 1, stride, act=None) \
                if stride != 1 or cin != out else None
            self.relu = nn.ReLU()

        def construct(self, x: Any) -> Any:
            short = self.down(x) if self.down is not None else x
            return self.relu(self.conv3(self.conv2(self.conv1(x))) + short)

    class InvertedResidual(nn.Cell):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            self.expand = ConvBN(cin, hidden, 1, act="relu6") if t != 1 else None
            self.depthwise = ConvBN(hidden, hidden, 3, stride, group=hidden, act="relu6")
            self.project = ConvBN(hidden, cout, 1, act=None)
            self.residual = stride == 1 and cin == cout

        def construct(self, x: Any) -> Any:
            y = self.expand(x) if self.expand is not None else x
            y = self.project(self.depthwise(y))
            return y + x if self.residual else y

    class Net(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.mean = P.ReduceMean(keep_dims=False)
            if name == "mobilenetv2":
                blocks = [ConvBN(3, 32, 3, 2, act="relu6")]
                cin = 32
                for t, c, n, s in MOBILENET_V2:
                    for i in range(n):
                        blocks.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                        cin = c
                blocks.append(ConvBN(cin, 1280, 1, act="relu6"))
                self.features = nn.SequentialCell(blocks)
                self.fc = nn.Dense(1280, classes)
                return
            kind, counts = RESNETS[name]
            block = Basic if kind == "basic" else Bottleneck
            blocks = [ConvBN(3, 64, 7, 2), nn.MaxPool2d(3, 2, pad_mode="same")]
            cin = 64
            for stage, n in enumerate(counts):
                width = 64 << stage
                for i in range(n):
                    blocks.append(block(cin, width, 2 if stage and i == 0 else 1))
                    cin = width * block.expansion
            self.features = nn.SequentialCell(blocks)
            self.fc = nn.Dense(cin, classes)

        def construct(self, x: Any) -> Any:
            return self.fc(self.mean(self.features(x), (2, 3)))

    net = Net()
    if params is None:
        _randomise_batchnorm(net)
    else:
        if framework == "mindspore":  # MindSpore loads Parameters, not arrays
            params = {k: fw.Parameter(fw.Tensor(v), name=k) for k, v in params.items()}
        not_loaded, unused = fw.load_param_into_net(net, params)
        if not_loaded or unused:
            raise KeyError(f"{name}: parameters not loaded {not_loaded}, unused {unused}")
    net.set_train(False)
    return net


def _randomise_batchnorm(net: Any) -> None:
    """Moving statistics and affine terms away from identity, so a wrong one shows."""
    rng = np.random.default_rng(7)
    for name, p in net.parameters_and_names():
        shape = p.shape
        if name.endswith("moving_variance"):
            p.set_data(rng.uniform(0.5, 1.5, shape).astype(np.float32))
        elif name.endswith("moving_mean") or name.endswith("beta"):
            p.set_data((0.1 * rng.standard_normal(shape)).astype(np.float32))
        elif name.endswith("gamma"):
            p.set_data((1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32))


def gk_params(net: Any) -> dict[str, np.ndarray]:
    return {name: p.asnumpy() for name, p in net.parameters_and_names()}


# -- torch.nn ------------------------------------------------------------------------------------

TORCH_NAMES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean",
               "moving_variance": "running_var"}


def torch_name(gk_name: str) -> str:
    head, _, last = gk_name.rpartition(".")
    return f"{head}.{TORCH_NAMES.get(last, last)}" if head.endswith(".bn") or \
        head == "bn" else gk_name


def torch_cnn(name: str, classes: int = 1000, gk_padding: bool = True) -> Any:
    """The same network in torch.nn (attribute names as in gk_cnn, BatchNorm's torch names).
    gk_padding: the stem max pool padded as graphkernel's pad_mode='same' (see the module doc);
    False: torchvision's symmetric padding."""
    import torch
    from torch import nn

    class ConvBN(nn.Module):
        def __init__(self, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                     act: str | None = "relu") -> None:
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, stride, k // 2, groups=group, bias=False)
            self.bn = nn.BatchNorm2d(cout)
            self.act = nn.ReLU() if act == "relu" else nn.ReLU6() if act == "relu6" else \
                nn.Hardswish() if act == "hswish" else None

        def forward(self, x: Any) -> Any:
            y = self.bn(self.conv(x))
            return self.act(y) if self.act is not None else y

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.conv1 = ConvBN(cin, width, 3, stride)
            self.conv2 = ConvBN(width, width, 3, act=None)
            self.down = ConvBN(cin, width, 1, stride, act=None) \
                if stride != 1 or cin != width else None
            self.relu = nn.ReLU()

        def forward(self, x: Any) -> Any:
            short = self.down(x) if self.down is not None else x
            return self.relu(self.conv2(self.conv1(x)) + short)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.conv1 = ConvBN(cin, width, 1)
            self.conv2 = ConvBN(width, width, 3, stride)
            self.conv3 = ConvBN(width, out, 1, act=None)
            self.down = ConvBN(cin, out, 1, stride, act=None) \
                if stride != 1 or cin != out else None
            self.relu = nn.ReLU()

        def forward(self, x: Any) -> Any:
            short = self.down(x) if self.down is not None else x
            return self.relu(self.conv3(self.conv2(self.conv1(x))) + short)

    class InvertedResidual(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int, t: int) -> None:
            super().__init__()
            hidden = cin * t
            self.expand = ConvBN(cin, hidden, 1, act="relu6") if t != 1 else None
            self.depthwise = ConvBN(hidden, hidden, 3, stride, group=hidden, act="relu6")
            self.project = ConvBN(hidden, cout, 1, act=None)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.expand(x) if self.expand is not None else x
            y = self.project(self.depthwise(y))
            return y + x if self.residual else y

    class SqueezeExcite(nn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            squeezed = _make_divisible(channels // 4)
            self.fc1 = nn.Conv2d(channels, squeezed, 1)
            self.fc2 = nn.Conv2d(squeezed, channels, 1)

        def forward(self, x: Any) -> Any:
            s = torch.relu(self.fc1(x.mean((2, 3), keepdim=True)))
            return x * nn.functional.hardsigmoid(self.fc2(s))

    class V3Block(nn.Module):
        def __init__(self, cin: int, k: int, hidden: int, cout: int, se: bool, hs: bool,
                     stride: int) -> None:
            super().__init__()
            act = "hswish" if hs else "relu"
            self.expand = ConvBN(cin, hidden, 1, act=act) if hidden != cin else None
            self.depthwise = ConvBN(hidden, hidden, k, stride, group=hidden, act=act)
            self.se = SqueezeExcite(hidden) if se else None
            self.project = ConvBN(hidden, cout, 1, act=None)
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.expand(x) if self.expand is not None else x
            y = self.depthwise(y)
            y = self.se(y) if self.se is not None else y
            y = self.project(y)
            return y + x if self.residual else y

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head: Any = None
            if name == "mobilenetv2":
                blocks: list[Any] = [ConvBN(3, 32, 3, 2, act="relu6")]
                cin = 32
                for t, c, n, s in MOBILENET_V2:
                    for i in range(n):
                        blocks.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                        cin = c
                blocks.append(ConvBN(cin, 1280, 1, act="relu6"))
                self.features = nn.Sequential(*blocks)
                self.fc = nn.Linear(1280, classes)
                return
            if name == "mobilenetv3":
                blocks = [ConvBN(3, 16, 3, 2, act="hswish")]
                cin = 16
                for k, hidden, cout, se, hs, s in MOBILENET_V3_SMALL:
                    blocks.append(V3Block(cin, k, hidden, cout, se, hs, s))
                    cin = cout
                blocks.append(ConvBN(cin, 576, 1, act="hswish"))
                self.features = nn.Sequential(*blocks)
                self.head = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish())
                self.fc = nn.Linear(1024, classes)
                return
            kind, counts = RESNETS[name]
            block = Basic if kind == "basic" else Bottleneck
            pool: Any = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.MaxPool2d(3, 2)) \
                if gk_padding else nn.MaxPool2d(3, 2, 1)
            blocks = [ConvBN(3, 64, 7, 2), pool]
            cin = 64
            for stage, n in enumerate(counts):
                width = 64 << stage
                for i in range(n):
                    blocks.append(block(cin, width, 2 if stage and i == 0 else 1))
                    cin = width * block.expansion
            self.features = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x: Any) -> Any:
            y = self.features(x).mean((2, 3))
            return self.fc(self.head(y) if self.head is not None else y)

    return Net().eval()


def load_into_torch(model: Any, params: dict[str, np.ndarray]) -> None:
    """graphkernel's parameters (by name) into the torch module; every tensor must match."""
    import torch

    state = model.state_dict()
    wanted = {k for k in state if not k.endswith("num_batches_tracked")}
    given = {torch_name(k): v for k, v in params.items()}
    if set(given) != wanted:
        raise KeyError(f"torch/graphkernel names differ: {sorted(set(given) ^ wanted)[:8]}")
    model.load_state_dict({k: torch.from_numpy(np.array(v))  # writeable: torch asks
                           for k, v in given.items()}, strict=False)


def randomise_torch_batchnorm(model: Any, seed: int = 7) -> None:
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=g))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=g))
                m.weight.copy_(1.0 + 0.1 * torch.randn(m.num_features, generator=g))
                m.bias.copy_(0.1 * torch.randn(m.num_features, generator=g))


# -- the encoder stack (bench/gk_cells.EncoderLayer, n layers) ------------------------------------

def encoder_params(layers: int, hidden: int, inner: int, seed: int = 0
                   ) -> list[dict[str, np.ndarray]]:
    from bench.workloads import param_shapes
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(layers):
        p = {}
        for name, shape in param_shapes("encoder", {"hidden": hidden, "inner": inner}).items():
            if name.startswith("w"):
                p[name] = (rng.uniform(-1, 1, shape) / np.sqrt(shape[1])).astype(np.float32)
            elif name.startswith("g"):
                p[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            else:
                p[name] = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        out.append(p)
    return out


def gk_encoder(params: list[dict[str, np.ndarray]], batch: int, seq: int, hidden: int,
               heads: int) -> Any:
    from bench.gk_cells import EncoderLayer
    from graphkernel import nn
    return nn.SequentialCell([EncoderLayer(p, batch, seq, hidden, heads) for p in params])


def torch_encoder(params: list[dict[str, np.ndarray]], heads: int) -> Any:
    """The same stack in torch.nn (nn.Linear, nn.LayerNorm, scaled_dot_product_attention)."""
    import torch
    from torch import nn

    from bench.workloads import EPS

    class Layer(nn.Module):
        def __init__(self, p: dict[str, np.ndarray]) -> None:
            super().__init__()
            h, f = p["wq"].shape[0], p["w1"].shape[0]
            self.heads = heads
            self.lin = nn.ModuleDict({n: nn.Linear(*reversed(p["w" + n].shape))
                                      for n in ("q", "k", "v", "o", "1", "2")})
            self.norm1, self.norm2 = nn.LayerNorm(h, eps=EPS), nn.LayerNorm(h, eps=EPS)
            with torch.no_grad():
                for n, lin in self.lin.items():
                    lin.weight.copy_(torch.from_numpy(p["w" + n]))
                    lin.bias.copy_(torch.from_numpy(p["b" + n]))
                for norm, g, b in ((self.norm1, "g1", "be1"), (self.norm2, "g2", "be2")):
                    norm.weight.copy_(torch.from_numpy(p[g]))
                    norm.bias.copy_(torch.from_numpy(p[b]))
            del f

        def forward(self, x: Any) -> Any:
            b, s, h = x.shape
            hd = h // self.heads

            def split(t: Any) -> Any:
                return t.view(b, s, self.heads, hd).transpose(1, 2)
            q, k, v = (split(self.lin[n](x)) for n in ("q", "k", "v"))
            probs = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / hd ** 0.5), dim=-1)
            ctx = (probs @ v).transpose(1, 2).reshape(b, s, h)
            h1 = self.norm1(x + self.lin["o"](ctx))
            f = self.lin["2"](nn.functional.gelu(self.lin["1"](h1), approximate="tanh"))
            return self.norm2(h1 + f)

    return nn.Sequential(*[Layer(p) for p in params]).eval()


def transformer(name: str, batch: int) -> tuple[Any, list[str], list[list[np.ndarray]],
                                                dict[str, int]]:
    """transformers' BertModel (4 layers, hidden 256) or GPT2Model (one block) at seq 128, its
    last hidden state as the output, in eval mode (the ONNX rows' exports), with its input
    names, two input sets (token ids, a mask padding each row's last quarter) and dims."""
    import torch
    seq, vocab = 128, 8000
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, vocab, (batch, seq)).astype(np.int64) for _ in range(2)]
    masks = [np.ones((batch, seq), np.int64) for _ in range(2)]
    for m in masks:
        m[:, seq - seq // 4:] = 0  # padding at the end of every row
    names, sets = ["input_ids", "attention_mask"], [[i, m] for i, m in zip(ids, masks)]
    if name == "bert":
        from transformers import BertConfig, BertModel
        config = BertConfig(vocab_size=vocab, hidden_size=256, num_hidden_layers=4,
                            num_attention_heads=4, intermediate_size=1024,
                            max_position_embeddings=seq, attn_implementation="eager")
        model = BertModel(config, add_pooling_layer=False).eval()
    else:
        from transformers import GPT2Config, GPT2Model
        config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=256, n_layer=1, n_head=4,
                            use_cache=False)
        config._attn_implementation = "eager"
        # With an attention mask given, transformers does not look for packed sequences
        # (torch.diff of the positions, which has no ONNX form).
        model = GPT2Model(config).eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              return_dict=False)[0]
    return LastHidden().eval(), names, sets, {"batch": batch, "seq": seq}
