"""Convolution and pooling cells, MindSpore's arguments and defaults (NCHW)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphkernel.common.initializer import init_array
from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter
from graphkernel.ir.opdefs.nn import pair
from graphkernel.ops import operations as P


class Conv2d(Cell):
    """2-D convolution: weight [out, in/group, kh, kw], default pad_mode='same', no bias, as in
    MindSpore; default initialisation HeUniform(sqrt(5)) like MindSpore 2.x."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 pad_mode: str = "same", padding: Any = 0, dilation: Any = 1, group: int = 1,
                 has_bias: bool = False, weight_init: Any = None, bias_init: Any = None,
                 data_format: str = "NCHW", dtype: Any = np.float32) -> None:
        super().__init__()
        kernel = pair(kernel_size, "kernel_size", "Conv2d")
        if in_channels % group or out_channels % group:
            raise InputError(f"Conv2d: group={group} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        # MindSpore's attributes, which initialisation loops (MindCV's) read.
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size = kernel
        self.stride = pair(stride, "stride", "Conv2d")
        self.pad_mode, self.padding = pad_mode, padding
        self.dilation = pair(dilation, "dilation", "Conv2d")
        self.group, self.has_bias, self.data_format = group, has_bias, data_format
        shape = (out_channels, in_channels // group) + kernel
        self.weight = Parameter(
            init_array("he_uniform", shape, dtype, negative_slope=math.sqrt(5))
            if weight_init is None else init_array(weight_init, shape, dtype), "weight")
        self.bias = None  # MindSpore's: None without a bias
        if has_bias:
            fan_in = (in_channels // group) * kernel[0] * kernel[1]
            bound = 1 / math.sqrt(fan_in)
            self.bias = Parameter(init_array("uniform", (out_channels,), dtype, scale=bound)
                                  if bias_init is None else
                                  init_array(bias_init, (out_channels,), dtype), "bias")
            self.bias_add = P.BiasAdd()
        self.conv2d = P.Conv2D(out_channels, kernel, pad_mode=pad_mode, pad=padding,
                               stride=stride, dilation=dilation, group=group,
                               data_format=data_format)

    def construct(self, x: Any) -> Any:
        y = self.conv2d(x, self.weight)
        return self.bias_add(y, self.bias) if self.has_bias else y


class _Pool2d(Cell):
    primitive: Any = None

    def __init__(self, kernel_size: Any = 1, stride: Any = 1, pad_mode: str = "valid",
                 padding: Any = 0, data_format: str = "NCHW", **unsupported: Any) -> None:
        super().__init__()
        name = type(self).__name__
        if padding not in (0, (0, 0), (0, 0, 0, 0)):
            raise InputError(f"{name}: explicit padding is not supported; use pad_mode='same'")
        for key, value in unsupported.items():
            if value not in (False, None, 1, True if key == "count_include_pad" else False):
                raise InputError(f"{name}: {key}={value!r} is not supported")
        self.pool = type(self).primitive(kernel_size=kernel_size, strides=stride,
                                         pad_mode=pad_mode, data_format=data_format)

    def construct(self, x: Any) -> Any:
        return self.pool(x)


class MaxPool2d(_Pool2d):
    primitive = P.MaxPool


class AvgPool2d(_Pool2d):
    primitive = P.AvgPool
