"""A BERT-tiny style encoder, written as a MindSpore user writes it (porting it from MindSpore
changes only the imports): token and position embeddings, two encoder layers of multi-head
self-attention (head split and merge by Reshape + Transpose, an additive attention mask from
the padding mask) and a GeLU feed-forward block, each with a residual add and LayerNorm, then a
pooled [CLS] output (Dense + Tanh on x[:, 0]).

    python examples/bert_tiny.py [--batch B] [--seq S] [--no-fusion] [--why] [--train-steps N]
"""
from __future__ import annotations

import argparse
import math
import time

import numpy as np

import graphkernel as ms
from graphkernel import Tensor, context, nn, ops
from graphkernel.common import dtype as mstype


class Config:
    def __init__(self, vocab_size: int = 1000, hidden_size: int = 128, num_layers: int = 2,
                 num_heads: int = 2, intermediate_size: int = 512, max_position: int = 128
                 ) -> None:
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_layers, self.num_heads = num_layers, num_heads
        self.intermediate_size, self.max_position = intermediate_size, max_position


class SelfAttention(nn.Cell):
    def __init__(self, config: Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.heads, self.head_size = config.num_heads, h // config.num_heads
        self.query = nn.Dense(h, h, weight_init="normal")
        self.key = nn.Dense(h, h, weight_init="normal")
        self.value = nn.Dense(h, h, weight_init="normal")
        self.output = nn.Dense(h, h, weight_init="normal")
        self.norm = nn.LayerNorm((h,), epsilon=1e-12)
        self.batch_matmul = ops.BatchMatMul()
        self.batch_matmul_t = ops.BatchMatMul(transpose_b=True)
        self.softmax = nn.Softmax(axis=-1)
        self.scale = 1.0 / math.sqrt(self.head_size)

    def split_heads(self, x):
        b, s, _ = x.shape
        return ops.transpose(ops.reshape(x, (b, s, self.heads, self.head_size)), (0, 2, 1, 3))

    def construct(self, x, mask_bias):
        b, s, h = x.shape
        q = self.split_heads(self.query(x))
        k = self.split_heads(self.key(x))
        v = self.split_heads(self.value(x))
        scores = self.batch_matmul_t(q, k) * self.scale + mask_bias
        context_ = self.batch_matmul(self.softmax(scores), v)
        merged = ops.reshape(ops.transpose(context_, (0, 2, 1, 3)), (b, s, h))
        return self.norm(self.output(merged) + x)


class FeedForward(nn.Cell):
    def __init__(self, config: Config) -> None:
        super().__init__()
        h, f = config.hidden_size, config.intermediate_size
        self.dense_in = nn.Dense(h, f, activation="gelu", weight_init="normal")
        self.dense_out = nn.Dense(f, h, weight_init="normal")
        self.norm = nn.LayerNorm((h,), epsilon=1e-12)

    def construct(self, x):
        return self.norm(self.dense_out(self.dense_in(x)) + x)


class EncoderLayer(nn.Cell):
    def __init__(self, config: Config) -> None:
        super().__init__()
        self.attention = SelfAttention(config)
        self.ffn = FeedForward(config)

    def construct(self, x, mask_bias):
        return self.ffn(self.attention(x, mask_bias))


class BertTiny(nn.Cell):
    def __init__(self, config: Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, h, padding_idx=0)
        self.position_embeddings = nn.Embedding(config.max_position, h)
        self.embedding_norm = nn.LayerNorm((h,), epsilon=1e-12)
        self.layers = nn.CellList([EncoderLayer(config) for _ in range(config.num_layers)])
        self.pooler = nn.Dense(h, h, activation="tanh", weight_init="normal")

    def construct(self, input_ids, attention_mask):
        b, s = input_ids.shape
        positions = Tensor(np.arange(s, dtype=np.int32))  # a constant of the graph
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        x = self.embedding_norm(x)
        # 0 where a token may be attended, -10000 at padding: added to every head's scores.
        mask = ops.cast(attention_mask, mstype.float32)[:, None, None, :]
        mask_bias = (1.0 - mask) * -10000.0
        for layer in self.layers:
            x = layer(x, mask_bias)
        return x, self.pooler(x[:, 0])


class BertClassifier(nn.Cell):
    """A sequence classifier on the pooled [CLS] output: what fine-tuning trains."""

    def __init__(self, config: Config, num_classes: int = 2) -> None:
        super().__init__()
        self.bert = BertTiny(config)
        self.classifier = nn.Dense(config.hidden_size, num_classes, weight_init="normal")

    def construct(self, input_ids, attention_mask):
        _, pooled = self.bert(input_ids, attention_mask)
        return self.classifier(pooled)


class _WithLoss(nn.Cell):
    def __init__(self, net: BertClassifier) -> None:
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, input_ids, attention_mask, labels):
        return self.loss(self.net(input_ids, attention_mask), labels)


def train_steps(net: BertClassifier, ids: np.ndarray, mask: np.ndarray, labels: np.ndarray,
                steps: int = 5, learning_rate: float = 1e-3) -> list[float]:
    """`steps` Adam steps on one batch (TrainOneStepCell: forward, backward through attention,
    LayerNorm and both embeddings' Gathers, the update, one compiled graph); the losses."""
    optimizer = nn.Adam(net.trainable_params(), learning_rate=learning_rate)
    step = nn.TrainOneStepCell(_WithLoss(net), optimizer)
    args = (Tensor(ids), Tensor(mask), Tensor(labels))
    return [float(step(*args).asnumpy()) for _ in range(steps)]


def make_inputs(batch: int, seq: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocab, (batch, seq)).astype(np.int32)
    lengths = rng.integers(seq // 2, seq + 1, batch)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    return ids * mask, mask


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--no-fusion", action="store_true", help="compile without fusion")
    parser.add_argument("--why", action="store_true",
                        help="also list every pair of ops fusion kept apart, and why")
    parser.add_argument("--train-steps", type=int, default=0,
                        help="then train a classifier on the pooled output this many steps")
    args = parser.parse_args()
    context.set_context(mode=context.GRAPH_MODE, enable_graph_kernel=not args.no_fusion)
    ms.set_seed(0)
    config = Config()
    net = BertTiny(config)
    ids, mask = make_inputs(args.batch, args.seq, config.vocab_size)
    start = time.perf_counter()
    sequence, pooled = net(Tensor(ids), Tensor(mask))
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(10):
        net(Tensor(ids), Tensor(mask))
    steady = (time.perf_counter() - start) / 10
    compiled = ms.compile(net, ids, mask)
    print(f"sequence output {sequence.shape}, pooled {pooled.shape}; first call "
          f"{first * 1000:.0f} ms, then {steady * 1000:.2f} ms per call, "
          f"{compiled.kernel_count} launches per call")
    print(compiled.summary(reasons=args.why))
    if args.train_steps:
        ms.set_seed(0)
        classifier = BertClassifier(config)
        labels = (ids[:, 1] % 2).astype(np.int32)
        losses = train_steps(classifier, ids, mask, labels, args.train_steps)
        print("training losses: " + " ".join(f"{v:.4f}" for v in losses))


if __name__ == "__main__":
    main()
