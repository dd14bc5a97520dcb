"""Makes the small PyTorch exports in this folder, which tests/test_onnx_exports.py loads.

Six real exports with a dynamic batch axis (`dim_param` "batch"), each at a reduced width so
the file stays well under 1 MB, random weights from a fixed seed (nothing is downloaded):

- resnet18_small.onnx: ResNet-18's layout (7x7 stem, max pool, four stages of two basic
  blocks, global average pool, linear), widths 4-8-16-32 instead of 64-128-256-512;
  float32[batch, 3, 32, 32].
- mobilenetv3_small.onnx: MobileNetV3-Small's layout (its 11 inverted-residual blocks with
  squeeze-excitation, hard-swish, depthwise convolutions), width multiplier 0.25;
  float32[batch, 3, 64, 64].
- bert_encoder_small.onnx: transformers' BertModel from a small BertConfig (2 layers, hidden
  32, 4 heads), input_ids int64[batch, 16]; outputs the last hidden state.
- gpt2_block_small.onnx: transformers' GPT2Model from a small GPT2Config (one block, hidden
  32, 4 heads), input_ids int64[batch, 16]; outputs the last hidden state.
- bert_encoder_masked_small.onnx, gpt2_block_masked_small.onnx: the same two configurations
  called with an attention_mask int64[batch, 16] as well (the shape-generic form of the bench's
  BERT and GPT-2 rows): transformers builds the mask from `arange(batch)`, a Range up to the
  dynamic batch.

torchvision's wheels do not match torch 2.13 here, so the two CNNs are their layouts written
in PyTorch. Run with torch 2.13 (CPU) and transformers installed (not in the test extra; CI
only reads the files):

    python tests/data/onnx/make_models.py [folder]
"""
import os
import sys

import torch
from torch import nn

SEED = 0
OPSET = 17


# -- ResNet-18 layout --------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNet18(nn.Module):
    def __init__(self, widths: tuple[int, ...] = (4, 8, 16, 32), classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


# -- MobileNetV3-Small layout ------------------------------------------------------------------
def _divisible(v: float, by: int = 8) -> int:
    return max(by, int(v + by / 2) // by * by)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        squeezed = _divisible(c / 4)
        self.fc1 = nn.Conv2d(c, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        s = nn.functional.hardsigmoid(self.fc2(torch.relu(self.fc1(s))))
        return x * s


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, k: int, expand: int, cout: int, se: bool, hswish: bool,
                 stride: int) -> None:
        super().__init__()
        act = nn.Hardswish if hswish else nn.ReLU
        layers: list[nn.Module] = []
        if expand != cin:
            layers += [nn.Conv2d(cin, expand, 1, bias=False), nn.BatchNorm2d(expand), act()]
        layers += [nn.Conv2d(expand, expand, k, stride, k // 2, groups=expand, bias=False),
                   nn.BatchNorm2d(expand), act()]
        if se:
            layers.append(SqueezeExcite(expand))
        layers += [nn.Conv2d(expand, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


# kernel, expanded, out, squeeze-excite, hard-swish, stride (MobileNetV3-Small, table 2)
SMALL = [(3, 16, 16, True, False, 2), (3, 72, 24, False, False, 2),
         (3, 88, 24, False, False, 1), (5, 96, 40, True, True, 2), (5, 240, 40, True, True, 1),
         (5, 240, 40, True, True, 1), (5, 120, 48, True, True, 1), (5, 144, 48, True, True, 1),
         (5, 288, 96, True, True, 2), (5, 576, 96, True, True, 1), (5, 576, 96, True, True, 1)]


class MobileNetV3Small(nn.Module):
    def __init__(self, width: float = 0.25, last: int = 128, classes: int = 10) -> None:
        super().__init__()
        cin = _divisible(16 * width)
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(cin), nn.Hardswish()]
        for k, expand, cout, se, hs, stride in SMALL:
            cout = _divisible(cout * width)
            layers.append(InvertedResidual(cin, k, _divisible(expand * width), cout, se, hs,
                                           stride))
            cin = cout
        features = _divisible(576 * width)
        layers += [nn.Conv2d(cin, features, 1, bias=False), nn.BatchNorm2d(features),
                   nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(nn.Linear(features, last), nn.Hardswish(), nn.Dropout(0.2),
                                  nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.head(torch.flatten(y, 1))


def _random_batch_norms(net: nn.Module, gen: torch.Generator) -> None:
    """Running statistics that are not the identity, so BatchNormalization does something."""
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.weight.data.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
            m.bias.data.copy_(torch.randn(m.num_features, generator=gen) * 0.1)


# -- transformers ------------------------------------------------------------------------------
class LastHiddenState(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def bert_encoder() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=32, attn_implementation="eager")
    return LastHiddenState(BertModel(config, add_pooling_layer=False))


def gpt2_block() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=100, n_embd=32, n_layer=1, n_head=4, n_positions=32,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    return LastHiddenState(GPT2Model(config))


class MaskedLastHiddenState(nn.Module):
    """The model called with an attention mask too: transformers then builds the mask with
    index arithmetic over `arange(batch)`, an ONNX Range up to the dynamic batch."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


# -- export ------------------------------------------------------------------------------------
def export(net: nn.Module, example: torch.Tensor | tuple[torch.Tensor, ...], path: str,
           input_name: str | tuple[str, ...]) -> None:
    net.eval()
    examples = example if isinstance(example, tuple) else (example,)
    names = list(input_name) if isinstance(input_name, tuple) else [input_name]
    torch.onnx.export(net, examples, path, dynamo=False, opset_version=OPSET,
                      input_names=names, output_names=["y"],
                      dynamic_axes={**{n: {0: "batch"} for n in names}, "y": {0: "batch"}})
    print(f"{path}: {os.path.getsize(path)} bytes")


def export_masked(folder: str, ids: torch.Tensor) -> None:
    """bert_encoder_masked_small.onnx and gpt2_block_masked_small.onnx: the two transformers
    models (their own seeds) with an attention mask input, the last quarter of each row
    padding."""
    mask = torch.ones_like(ids)
    mask[:, -ids.shape[1] // 4:] = 0
    names = ("input_ids", "attention_mask")
    torch.manual_seed(SEED + 1)
    export(MaskedLastHiddenState(bert_encoder().model), (ids, mask),
           os.path.join(folder, "bert_encoder_masked_small.onnx"), names)
    torch.manual_seed(SEED + 2)
    export(MaskedLastHiddenState(gpt2_block().model), (ids, mask),
           os.path.join(folder, "gpt2_block_masked_small.onnx"), names)


def main(folder: str) -> None:
    gen = torch.Generator().manual_seed(SEED)
    torch.manual_seed(SEED)
    image32 = torch.randn(2, 3, 32, 32, generator=gen)
    image64 = torch.randn(2, 3, 64, 64, generator=gen)
    ids = torch.randint(0, 100, (2, 16), generator=gen)
    with torch.no_grad():
        resnet = ResNet18()
        _random_batch_norms(resnet, gen)
        export(resnet, image32, os.path.join(folder, "resnet18_small.onnx"), "x")
        mobilenet = MobileNetV3Small()
        _random_batch_norms(mobilenet, gen)
        export(mobilenet, image64, os.path.join(folder, "mobilenetv3_small.onnx"), "x")
        export(bert_encoder(), ids, os.path.join(folder, "bert_encoder_small.onnx"),
               "input_ids")
        export(gpt2_block(), ids, os.path.join(folder, "gpt2_block_small.onnx"), "input_ids")
        export_masked(folder, ids)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
