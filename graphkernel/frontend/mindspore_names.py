"""MindSpore names graphkernel does not provide, and what to use instead.

A MindSpore script ported by changing its imports reaches `ms.X`, `nn.X` or `ops.X`; where X is
missing, the module's `__getattr__` raises `missing_name_error`: the name, that it is MindSpore's
and not here yet, and the nearest thing graphkernel has (the bar `Tensor.sum` set). Names that are
not MindSpore's get the module's close matches instead.
"""
from __future__ import annotations

import difflib
import linecache
import sys
from collections.abc import Iterable

from graphkernel.errors import SourceLocation, UnsupportedError

_NO_DTYPE = "graphkernel computes in float16, float32, float64, int32, int64 and bool_"
_NO_SPARSE = "graphkernel has dense tensors only: use Tensor"
_NO_DEVICE = "graphkernel runs on the CPU only; nothing here is needed"

# module -> {MindSpore name: what to use instead ("" where there is nothing yet)}.
MISSING: dict[str, dict[str, str]] = {
    "graphkernel": {
        "ms_function": "graphkernel.jit (MindSpore 2.x's name for it)",
        "ms_class": "", "jit_class": "",
        "mutable": "pass the value as a Tensor (construct inputs are traced by shape)",
        "load_mindir": "graphkernel.load (GKIR and ONNX files)",
        "vmap": "write the batch axis into construct's ops",
        "jacfwd": "graphkernel.grad per output", "jacrev": "graphkernel.grad per output",
        "hessian": "", "Profiler": "graphkernel's kernel timings (docs/architecture.md)",
        "COOTensor": _NO_SPARSE, "CSRTensor": _NO_SPARSE, "RowTensor": _NO_SPARSE,
        "int8": _NO_DTYPE, "int16": _NO_DTYPE, "uint8": _NO_DTYPE, "uint16": _NO_DTYPE,
        "uint32": _NO_DTYPE, "uint64": _NO_DTYPE, "bfloat16": _NO_DTYPE,
        "complex64": _NO_DTYPE, "complex128": _NO_DTYPE,
        "mint": "graphkernel.ops (MindSpore 2.x's functional names: ops.relu, ops.matmul, ...)",
        "scipy": "", "hal": _NO_DEVICE, "boost": "", "rewrite": "",
        "parallel": "graphkernel.communication and context.set_auto_parallel_context "
                    "(data parallel)",
        "shard": "data parallel only (context.set_auto_parallel_context)",
        "set_auto_parallel_context": "graphkernel.context.set_auto_parallel_context",
        "get_auto_parallel_context": "graphkernel.context.get_auto_parallel_context",
        "data_sink": "graphkernel.train.Model.train(..., dataset_sink_mode=False)",
    },
    "graphkernel.nn": {
        "Conv1d": "nn.Conv2d over a (N, C, 1, W) input", "Conv3d": "",
        "Conv2dTranspose": "", "Conv1dTranspose": "",
        "BatchNorm3d": "", "InstanceNorm2d": "nn.GroupNorm(num_groups=num_channels, ...)",
        "SyncBatchNorm": "nn.BatchNorm2d (data parallel averages gradients, not statistics)",
        "LSTMCell": "nn.LSTM over a sequence of length 1", "GRU": "nn.LSTM",
        "GRUCell": "nn.LSTM", "RNN": "nn.LSTM", "RNNCell": "nn.LSTM",
        "MultiheadAttention": "nn.Dense and ops.matmul / ops.softmax",
        "Transformer": "", "TransformerEncoder": "", "TransformerDecoder": "",
        "TransformerEncoderLayer": "", "TransformerDecoderLayer": "",
        "AdaptiveAvgPool2d": "ops.mean(x, (2, 3), keep_dims=True) for output size 1",
        "AdaptiveMaxPool2d": "ops.amax(x, (2, 3), keep_dims=True) for output size 1",
        "AvgPool1d": "nn.AvgPool2d", "MaxPool1d": "nn.MaxPool2d",
        "Dropout2d": "nn.Dropout", "Dropout1d": "nn.Dropout",
        "LeakyReLU": "ops.maximum(x, alpha * x)", "PReLU": "", "ELU": "", "SeLU": "",
        "CELU": "", "Mish": "", "Hardtanh": "graphkernel.numpy.clip", "LogSigmoid": "",
        "Softmin": "nn.Softmax on -x", "GLU": "", "Tanhshrink": "", "HShrink": "",
        "SoftShrink": "", "Threshold": "",
        "NLLLoss": "nn.CrossEntropyLoss on logits", "BCELoss": "nn.BCEWithLogitsLoss on logits",
        "SmoothL1Loss": "", "HuberLoss": "", "KLDivLoss": "", "CTCLoss": "", "FocalLoss": "",
        "DiceLoss": "", "CosineEmbeddingLoss": "", "MultiClassDiceLoss": "",
        "SoftMarginLoss": "", "MultiMarginLoss": "", "TripletMarginLoss": "",
        "DynamicLossScaleUpdateCell": "graphkernel.amp.DynamicLossScaleManager",
        "FixedLossScaleUpdateCell": "graphkernel.amp.FixedLossScaleManager",
        "ForwardValueAndGrad": "graphkernel.value_and_grad",
        "Accuracy": "graphkernel.train.Accuracy", "Loss": "graphkernel.train.Loss",
        "Metric": "graphkernel.train.Metric",
        "Top1CategoricalAccuracy": "graphkernel.train.Top1CategoricalAccuracy",
        "Top5CategoricalAccuracy": "graphkernel.train.Top5CategoricalAccuracy",
        "Adagrad": "nn.SGD, nn.Momentum, nn.Adam, nn.AdamWeightDecay or nn.Lamb",
        "RMSProp": "nn.Adam", "AdamW": "nn.AdamWeightDecay", "FTRL": "", "LARS": "nn.Lamb",
        "ProximalAdagrad": "", "LazyAdam": "nn.Adam", "Rprop": "", "ASGD": "", "Adadelta": "",
        "Adamax": "", "thor": "",
        "CosineDecayLR": "nn.ExponentialDecayLR or a nn.LearningRateSchedule subclass",
        "PolynomialDecayLR": "a nn.LearningRateSchedule subclass",
        "WarmUpLR": "a nn.LearningRateSchedule subclass",
        "NaturalExpDecayLR": "a nn.LearningRateSchedule subclass",
        "InverseDecayLR": "a nn.LearningRateSchedule subclass",
        "piecewise_constant_lr": "a list of per-step rates built in Python",
        "cosine_decay_lr": "a list of per-step rates built in Python",
        "exponential_decay_lr": "a list of per-step rates built in Python",
        "warmup_lr": "a list of per-step rates built in Python",
        "Pad": "", "ResizeBilinear": "", "Upsample": "", "PixelShuffle": "",
        "PixelUnshuffle": "", "Unfold": "", "Roll": "graphkernel.numpy.roll",
        "Tril": "", "Triu": "", "Norm": "ops.sqrt(ops.reduce_sum(x * x, axis))",
        "ClipByNorm": "", "OneHot": "ops.one_hot", "MatMul": "ops.matmul", "BiDense": "",
        "Range": "graphkernel.numpy.arange",
    },
    "graphkernel.ops": {
        "HookBackward": "", "InsertGradientOf": "", "vmap": "write the batch axis into ops",
        "jvp": "", "vjp": "graphkernel.grad with sens_param", "hessian": "",
        "jacfwd": "graphkernel.grad per output", "jacrev": "graphkernel.grad per output",
        "Conv3D": "", "Conv2DTranspose": "",
        "DynamicRNN": "nn.LSTM", "LSTM": "nn.LSTM", "GRU": "nn.LSTM",
        "NLLLoss": "nn.CrossEntropyLoss on logits", "CTCLoss": "",
        "ResizeBilinear": "", "ResizeNearestNeighbor": "", "ROIAlign": "",
        "TensorDump": "ops.Print", "TensorSummary": "ops.Print", "ScalarSummary": "ops.Print",
        "ImageSummary": "", "HistogramSummary": "",
        "AllGather": "graphkernel.communication (AllReduce)",
        "ReduceScatter": "graphkernel.communication (AllReduce)",
        "Broadcast": "graphkernel.communication (AllReduce)",
        "NPUGetFloatStatus": "ops.FloatStatus (its CPU form)",
        "NPUClearFloatStatus": "ops.FloatStatus (its CPU form)",
        "NPUAllocFloatStatus": "ops.FloatStatus (its CPU form)",
        "custom_info_register": "", "Custom": "a Cell of graphkernel primitives",
        "CustomRegOp": "", "kernel": "",
    },
}


def missing_name_error(module: str, name: str, available: Iterable[str]) -> UnsupportedError:
    """The error `module.name` raises when graphkernel has no `name`: a MindSpore name it does
    not provide says so and what to use instead; another name gets the module's close matches."""
    # The line that named it: the caller of the module's __getattr__ (which called this).
    frame = sys._getframe(2)
    where = SourceLocation(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                           linecache.getline(frame.f_code.co_filename, frame.f_lineno))
    short = module.replace("graphkernel", "mindspore", 1)
    known = MISSING.get(module, {})
    if name in known:
        instead = known[name]
        advice = f"; use {instead}" if instead else \
            " and nothing here stands in for it yet"
        return UnsupportedError(f"{module}.{name}: MindSpore's {short}.{name} is not provided "
                                f"by graphkernel{advice}", where)
    close = difflib.get_close_matches(name, sorted(set(available)), n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return UnsupportedError(f"{module} has no attribute {name!r}{hint}; {module}.__all__ lists "
                            "what it has", where)
