"""Recurrent layers, MindSpore's: `LSTM`. The recurrence is unrolled over the (static) sequence
length into primitives, so the gates of each step fuse and the gradient comes from the ops'
own rules (backpropagation through time needs no rule of its own)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.common.initializer import init_array
from graphkernel.errors import InputError, ShapeError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter
from graphkernel.frontend.tracing import user_location
from graphkernel.nn.layers import Dropout
from graphkernel.ops import operations as P


class LSTM(Cell):
    """MindSpore's nn.LSTM(input_size, hidden_size, num_layers=1, has_bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, dtype=float32).

    `construct(x, hx=None, seq_length=None)`: x is (seq_len, batch, input_size), or
    (batch, seq_len, input_size) with batch_first; hx is (h_0, c_0), each
    (num_directions * num_layers, batch, hidden_size), zeros when None. Returns
    `output, (h_n, c_n)`, output (seq_len, batch, num_directions * hidden_size) (batch first
    with batch_first). Per step, gates = x W_ih^T + b_ih + h W_hh^T + b_hh split as
    input, forget, cell, output (MindSpore's and PyTorch's order); c = f c + i tanh(g),
    h = o tanh(c). Weights are named weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k},
    bias_hh_l{k} (with `_reverse` for the backward direction), initialised
    Uniform(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) as MindSpore's. `dropout` applies to
    every layer's output but the last, while training."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 has_bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, dtype: Any = np.float32) -> None:
        super().__init__()
        where = user_location()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("num_layers", num_layers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"LSTM: {name} must be a positive int, got {value!r}", where)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) \
                or not 0.0 <= dropout < 1.0:
            raise InputError(f"LSTM: dropout must be a float in [0, 1), got {dropout!r}", where)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.has_bias, self.batch_first = has_bias, batch_first
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.dropout = float(dropout)
        self.dropout_op = Dropout(p=self.dropout, dtype=dtype) if self.dropout else None
        bound = 1.0 / math.sqrt(hidden_size)
        gates = 4 * hidden_size
        self._weights: list[list[tuple[Any, ...]]] = []
        for layer in range(num_layers):
            layer_in = input_size if layer == 0 else hidden_size * self.num_directions
            directions = []
            for direction in range(self.num_directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")

                def param(name: str, shape: tuple[int, ...], suffix: str = suffix) -> Parameter:
                    # graphkernel.set_seed makes it repeatable, as every layer's weights
                    value = init_array("uniform", shape, dtype, scale=bound)
                    parameter = Parameter(value, name + suffix)
                    setattr(self, name + suffix, parameter)
                    return parameter

                w_ih = param("weight_ih", (gates, layer_in))
                w_hh = param("weight_hh", (gates, hidden_size))
                biases = (param("bias_ih", (gates,)), param("bias_hh", (gates,))) \
                    if has_bias else None
                directions.append((w_ih, w_hh, biases))
            self._weights.append(directions)
        self.matmul = P.MatMul(transpose_b=True)

    def _check(self, x: Any, hx: Any) -> tuple[int, int]:
        if len(x.shape) != 3 or x.shape[2] != self.input_size:
            raise ShapeError(f"LSTM(input_size={self.input_size}) takes x of shape "
                             f"({'batch, seq_len' if self.batch_first else 'seq_len, batch'}, "
                             f"{self.input_size}), got {tuple(x.shape)}", user_location())
        seq_len, batch = (x.shape[1], x.shape[0]) if self.batch_first else x.shape[:2]
        if hx is not None:
            state = (self.num_directions * self.num_layers, batch, self.hidden_size)
            if not isinstance(hx, (tuple, list)) or len(hx) != 2 or \
                    any(tuple(h.shape) != state for h in hx):
                raise ShapeError(f"LSTM: hx must be (h_0, c_0), each of shape {state}",
                                 user_location())
        return seq_len, batch

    def _direction(self, steps: list[Any], h: Any, c: Any, weights: tuple[Any, ...],
                   reverse: bool) -> tuple[list[Any], Any, Any]:
        """One layer, one direction: the outputs in time order, and the last h and c."""
        w_ih, w_hh, biases = weights
        hidden = self.hidden_size
        outputs: list[Any] = [None] * len(steps)
        for t in (reversed(range(len(steps))) if reverse else range(len(steps))):
            gates = self.matmul(steps[t], w_ih) + self.matmul(h, w_hh)
            if biases is not None:
                gates = gates + biases[0] + biases[1]
            i = P.Sigmoid()(gates[:, 0:hidden])
            f = P.Sigmoid()(gates[:, hidden:2 * hidden])
            g = P.Tanh()(gates[:, 2 * hidden:3 * hidden])
            o = P.Sigmoid()(gates[:, 3 * hidden:])
            c = f * c + i * g
            h = o * P.Tanh()(c)
            outputs[t] = h
        return outputs, h, c

    def construct(self, x: Any, hx: Any = None, seq_length: Any = None) -> Any:
        if seq_length is not None:
            raise InputError("LSTM: seq_length (per-sample lengths) is not supported; pad "
                             "the batch to one length and pass seq_length=None",
                             user_location())
        seq_len, batch = self._check(x, hx)
        if self.batch_first:
            x = P.Transpose()(x, (1, 0, 2))
        steps = [x[t] for t in range(seq_len)]
        zeros = np.zeros((batch, self.hidden_size), x.dtype)
        h_n, c_n = [], []
        for layer, directions in enumerate(self._weights):
            per_direction = []
            for direction, weights in enumerate(directions):
                k = layer * self.num_directions + direction
                h0 = zeros if hx is None else hx[0][k]
                c0 = zeros if hx is None else hx[1][k]
                outputs, h, c = self._direction(steps, h0, c0, weights, bool(direction))
                per_direction.append(outputs)
                h_n.append(h)
                c_n.append(c)
            steps = per_direction[0] if self.num_directions == 1 else \
                [P.Concat(1)((fw, bw)) for fw, bw in zip(*per_direction)]
            if self.dropout_op is not None and layer < self.num_layers - 1:
                steps = [self.dropout_op(step) for step in steps]
        output = P.Stack(1 if self.batch_first else 0)(tuple(steps))
        return output, (P.Stack(0)(tuple(h_n)), P.Stack(0)(tuple(c_n)))
