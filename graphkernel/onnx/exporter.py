"""graphkernel.export(net, *inputs, file_name=..., file_format="ONNX"): a network's initial
graph (traced, constants folded, before fusion: the forward graph as the user wrote it) written
as a standard ONNX model, its Parameters as initializers. Each primitive maps to one or a few
ONNX operators; a primitive without a mapping is an `UnsupportedError` naming it, raised before
anything is written."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphkernel.errors import FormatError, UnsupportedError
from graphkernel.frontend.compile import automatic_types, compile
from graphkernel.frontend.export import LoadedGraph, check_signature
from graphkernel.frontend.signature import CellLike
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.graph import Constant, Graph, Node, Value, output_types
from graphkernel.ir.opdefs.array import _slice_index, strided_slice_index
from graphkernel.ir.opdefs.nn import pair, window_padding
from graphkernel.ir.opset import get_op
from graphkernel.ir.types import SymSize, TensorType
from graphkernel.nn.graph_cell import GraphCell
from graphkernel.passes.stage_names import VALIDATE

OPSET = 20  # Gelu is new in 20; LayerNormalization 17; Reduce* take axes as an input from 18
SUFFIX = ".onnx"


def export_onnx(net: CellLike, *inputs: Any, file_name: str) -> str:
    """Write `net`'s forward graph for `inputs` to `file_name` (".onnx" added when missing) as
    an ONNX model that `onnx.checker` accepts. Returns the path written."""
    path = os.path.abspath(file_name if file_name.endswith(SUFFIX) else file_name + SUFFIX)
    loaded = net._loaded if isinstance(net, GraphCell) else net
    if isinstance(loaded, LoadedGraph):
        graph, name = _loaded_graph(loaded, inputs), loaded.name
    else:
        # as the GKIR export: declared inputs, or the graph automatic dynamic shapes made
        compiled = compile(net, *inputs, options=CompileOptions(enable_graph_kernel=False),
                           types=automatic_types(net, inputs))
        graph, name = compiled.report.stages[VALIDATE], type(net).__name__
    made = graph_to_model(graph, name)
    onnx.checker.check_model(made, full_check=True)
    try:
        with open(path, "wb") as fh:
            fh.write(made.SerializeToString())
    except OSError as exc:
        raise FormatError(f"{path}: cannot write the ONNX model ({exc.strerror})") from None
    return path


def _loaded_graph(loaded: LoadedGraph, inputs: tuple[Any, ...]) -> Graph:
    """The forward graph of a loaded model (`graphkernel.load`, or the `nn.GraphCell` that
    runs it): an imported ONNX model's initial graph, as its load traced it (its initializers
    constants, its dynamic dimensions kept). A GKIR export holds only its final, fused graph,
    which is refused. `inputs`, when given, must fit the signature."""
    if inputs:
        check_signature(loaded, list(inputs))
    if loaded.compiled is None or loaded.compiled.report.stages.get(VALIDATE) is None:
        raise UnsupportedError(f"export to ONNX: {loaded.name} was loaded from a GKIR export, "
                               "which keeps only its fused final graph; export the network it "
                               "was made from")
    return loaded.compiled.report.stages[VALIDATE]


def graph_to_model(graph: Graph, name: str) -> onnx.ModelProto:
    writer = _Writer(graph)
    for node in graph.nodes:
        writer.node(node)
    outputs = []
    for i, value in enumerate(graph.outputs):
        out_name = f"output_{i}" if len(graph.outputs) > 1 else "output"
        writer.nodes.append(helper.make_node("Identity", [writer.name(value)], [out_name]))
        outputs.append(_value_info(out_name, value.tensor_type))
    inputs = [_value_info(i.name, i.tensor_type) for i in graph.inputs if i.kind == "input"]
    onnx_graph = helper.make_graph(writer.nodes, name, inputs, outputs, writer.initializers)
    made = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             producer_name="graphkernel")
    made.ir_version = 9  # what ONNX Runtime releases of the last two years read
    return made


def _value_info(name: str, type_: TensorType) -> onnx.ValueInfoProto:
    """A graph input's or output's type; a dynamic size is a `dim_param` of its text (N, 2*N:
    ONNX Runtime binds each name to one size, as graphkernel binds its symbols)."""
    elem = helper.np_dtype_to_tensor_dtype(type_.dtype)
    return helper.make_tensor_value_info(
        name, elem, [str(d) if isinstance(d, SymSize) else d for d in type_.shape])


class _Writer:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.symbols: dict[str, str] = {}  # a dynamic size's symbol -> its int64[1] value
        self.names: dict[int, str] = {}
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.used: set[str] = set()
        for inp in graph.inputs:
            self.names[inp.uid] = self.fresh(inp.name)
            if inp.kind == "weight":
                self.initializers.append(numpy_helper.from_array(
                    np.asarray(inp.binding.asnumpy()), self.names[inp.uid]))

    def fresh(self, base: str) -> str:
        name, count = base or "v", 0
        while name in self.used:
            count += 1
            name = f"{base}_{count}"
        self.used.add(name)
        return name

    def name(self, value: Value) -> str:
        if value.uid not in self.names:
            assert isinstance(value, Constant), value
            self.names[value.uid] = self.const(value.value, value.name)
        return self.names[value.uid]

    def const(self, array: Any, base: str = "const") -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def shape(self, dims: tuple[int | SymSize, ...]) -> str:
        """An int64 shape tensor: a constant when static; otherwise built at run time, each
        dynamic size from the graph input dimension that carries its symbol."""
        if all(isinstance(d, int) for d in dims):
            return self.const(np.array(dims, np.int64), "shape")
        parts = []
        for d in dims:
            if isinstance(d, SymSize):
                value = self.symbol(d.names[0])
                for other in d.names[1:]:
                    value = self.emit("Mul", [value, self.symbol(other)])
                if d.coef != 1:
                    value = self.emit("Mul", [value, self.const(np.array([d.coef], np.int64))])
                parts.append(value)
            else:
                parts.append(self.const(np.array([d], np.int64), "dim"))
        return self.emit("Concat", parts, axis=0)

    def symbol(self, name: str) -> str:
        if name not in self.symbols:
            for inp in self.graph.inputs:
                found = [(axis, d.coef) for axis, d in enumerate(inp.tensor_type.shape)
                         if isinstance(d, SymSize) and d.names == (name,)]
                if inp.kind == "input" and found:
                    axis, coef = found[0]
                    size = self.emit("Gather", [self.emit("Shape", [self.names[inp.uid]]),
                                                self.const(np.array([axis], np.int64))])
                    if coef != 1:
                        size = self.emit("Div", [size, self.const(np.array([coef], np.int64))])
                    self.symbols[name] = size
                    break
            else:
                raise UnsupportedError(f"export to ONNX: the dynamic size {name} is no input "
                                       "dimension")
        return self.symbols[name]

    def emit(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        out = self.fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def node(self, node: Node) -> None:
        if node.op == "GetItem":
            source = node.inputs[0]
            index = node.attrs.get("index", 0)
            if source.uid in self.names and index == 0 and isinstance(source, Node) and \
                    source.op in _FIRST_ITEM:
                self.names[node.uid] = self.names[source.uid]
                return
            if isinstance(source, Node) and source.op == "Split":
                # Split's item i is the i-th of its equal pieces along the axis: a Slice.
                self.names[node.uid] = _split_item(self, source, index)
                return
            if isinstance(source, Node) and source.op == "Unstack":
                # Unstack's item i is a Gather of index i (a scalar index drops the axis);
                # the Unstack node itself stands for its input (see _unstack).
                self.names[node.uid] = self.emit(
                    "Gather", [self.names[source.uid], self.const(np.asarray(index, np.int64))],
                    axis=source.attrs.get("axis", get_op("Unstack").attr_defaults["axis"]))
                return
            raise UnsupportedError(f"export to ONNX: item {index} of {source.name} "
                                   f"({getattr(source, 'op', '?')}) has no ONNX counterpart")
        write = _WRITERS.get(node.op)
        if write is None or node.is_composite:
            raise UnsupportedError(f"export to ONNX: primitive {node.op} ({node.name}) has no "
                                   "ONNX mapping yet")
        attrs = {**get_op(node.op).attr_defaults, **node.attrs}
        self.names[node.uid] = write(self, node, [self.name(v) for v in node.inputs], attrs)


_Write = Callable[[_Writer, Node, list[str], dict[str, Any]], str]
_WRITERS: dict[str, _Write] = {}
# Ops whose first output is the ONNX operator's only one (the others are training statistics).
_FIRST_ITEM = {"BatchNorm", "LayerNorm"}


def _simple(onnx_op: str) -> _Write:
    return lambda w, n, ins, attrs: w.emit(onnx_op, ins)


for _prim, _onnx in [("Add", "Add"), ("Sub", "Sub"), ("Mul", "Mul"), ("RealDiv", "Div"),
                     ("Maximum", "Max"), ("Minimum", "Min"), ("Pow", "Pow"), ("Sqrt", "Sqrt"),
                     ("Exp", "Exp"), ("Log", "Log"), ("Tanh", "Tanh"), ("Erf", "Erf"),
                     ("Abs", "Abs"), ("Neg", "Neg"), ("Floor", "Floor"),
                     ("Reciprocal", "Reciprocal"), ("Sigmoid", "Sigmoid"), ("ReLU", "Relu"),
                     ("Sin", "Sin"), ("Cos", "Cos"), ("Equal", "Equal"), ("Less", "Less"),
                     ("Greater", "Greater"), ("LessEqual", "LessOrEqual"),
                     ("GreaterEqual", "GreaterOrEqual"), ("LogicalAnd", "And"),
                     ("LogicalOr", "Or"), ("LogicalNot", "Not"), ("Select", "Where"),
                     ("Identity", "Identity"), ("StopGradient", "Identity"),
                     ("Softplus", "Softplus"), ("HSwish", "HardSwish"), ("Sign", "Sign")]:
    _WRITERS[_prim] = _simple(_onnx)


def _writer(*names: str) -> Callable[[_Write], _Write]:
    def register(f: _Write) -> _Write:
        for name in names:
            _WRITERS[name] = f
        return f
    return register


def _scalar(w: _Writer, node: Node, value: float) -> str:
    return w.const(np.asarray(value, dtype=node.dtype))


@_writer("Rsqrt")
def _rsqrt(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Reciprocal", [w.emit("Sqrt", ins)])


@_writer("Square")
def _square(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Mul", [ins[0], ins[0]])


@_writer("SiLU")
def _silu(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Mul", [ins[0], w.emit("Sigmoid", ins)])


@_writer("ReLU6")
def _relu6(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Clip", [ins[0], _scalar(w, n, 0), _scalar(w, n, 6)])


@_writer("GeLU")
def _gelu(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Gelu", ins, approximate=attrs["approximate"])


@_writer("Cast")
def _cast(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Cast", ins, to=helper.np_dtype_to_tensor_dtype(np.dtype(attrs["dtype"])))


@_writer("Softmax", "LogSoftmax")
def _softmax(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    axis = attrs["axis"]
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise UnsupportedError(f"export to ONNX: {n.op} over several axes {axis}")
        axis = axis[0]
    return w.emit(n.op, ins, axis=int(axis))


@_writer("MatMul", "BatchMatMul")
def _matmul(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    a, b = ins
    for i, key in ((0, "transpose_a"), (1, "transpose_b")):
        if attrs[key]:
            rank = len(n.inputs[i].shape)
            perm = list(range(rank - 2)) + [rank - 1, rank - 2]
            transposed = w.emit("Transpose", [ins[i]], perm=perm)
            a, b = (transposed, b) if i == 0 else (a, transposed)
    return w.emit("MatMul", [a, b])


@_writer("BiasAdd")
def _bias_add(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    rank = len(n.inputs[0].shape)
    channels = n.inputs[1].shape[0]
    shape = w.const(np.array([channels] + [1] * (rank - 2), np.int64), "bias_shape")
    return w.emit("Add", [ins[0], w.emit("Reshape", [ins[1], shape])])


@_writer("Reshape")
def _reshape(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Reshape", [ins[0], w.shape(n.shape)])


@_writer("BroadcastTo")
def _broadcast(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Expand", [ins[0], w.shape(n.shape)])


@_writer("Transpose")
def _transpose(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Transpose", ins, perm=[int(p) for p in attrs["perm"]])


@_writer("ExpandDims", "Squeeze")
def _unsqueeze(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    if n.op == "ExpandDims":
        axes = [int(attrs["axis"])]
        return w.emit("Unsqueeze", [ins[0], w.const(np.array(axes, np.int64), "axes")])
    axis = attrs["axis"]
    axes = [axis] if isinstance(axis, int) else list(axis)
    if not axes:
        return w.emit("Squeeze", ins)
    return w.emit("Squeeze", [ins[0], w.const(np.array(axes, np.int64), "axes")])


@_writer("Concat")
def _concat(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return w.emit("Concat", ins, axis=int(attrs["axis"]))


@_writer("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd")
def _reduce(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    axis = attrs["axis"]
    axes = [axis] if isinstance(axis, int) else list(axis)
    inputs = [ins[0]] + ([w.const(np.array(axes, np.int64), "axes")] if axes else [])
    return w.emit(n.op, inputs, keepdims=int(bool(attrs["keep_dims"])))


def _window_attrs(n: Node, kernel: tuple[int, int], stride: tuple[int, int],
                  dilation: tuple[int, int], pad_mode: str, pad: Any) -> dict[str, Any]:
    x = n.inputs[0].shape
    (top, bottom), (left, right) = window_padding((x[2], x[3]), kernel, stride, dilation, pad_mode,
                                                  pad, n.op)
    return {"kernel_shape": list(kernel), "strides": list(stride),
            "pads": [top, left, bottom, right]}


@_writer("Conv2D")
def _conv(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    kernel = pair(attrs["kernel_size"], "kernel_size", n.op)
    stride = pair(attrs["stride"], "stride", n.op)
    dilation = pair(attrs["dilation"], "dilation", n.op)
    window = _window_attrs(n, kernel, stride, dilation, attrs["pad_mode"], attrs["pad"])
    return w.emit("Conv", ins, dilations=list(dilation), group=int(attrs["group"]), **window)


@_writer("MaxPool", "AvgPool")
def _pool(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    kernel = pair(attrs["kernel_size"], "kernel_size", n.op)
    stride = pair(attrs["strides"], "strides", n.op)
    window = _window_attrs(n, kernel, stride, (1, 1), attrs["pad_mode"], attrs.get("pad", 0))
    if n.op == "AvgPool":  # its padding is counted only with count_include_pad, as ONNX's
        return w.emit("AveragePool", ins,
                      count_include_pad=int(bool(attrs.get("count_include_pad", False))),
                      **window)
    return w.emit("MaxPool", ins, **window)


_INT64_MAX, _INT64_MIN = 2 ** 63 - 1, -2 ** 63


@_writer("Slice", "StridedSlice")
def _slice(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    """A numpy index (slices, integers, new axes, one ellipsis) as ONNX Slice, then Squeeze of
    the integer-indexed axes, then Unsqueeze of the new ones."""
    shape = n.inputs[0].shape
    if n.op == "Slice":
        index: tuple[Any, ...] = _slice_index(shape, attrs["begin"], attrs["size"])
    else:
        masks = {k: attrs[k] for k in ("begin_mask", "end_mask", "ellipsis_mask",
                                        "new_axis_mask", "shrink_axis_mask")}
        index = strided_slice_index(shape, attrs["begin"], attrs["end"], attrs["strides"],
                                    **masks)
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = len(shape) - sum(1 for i in index if i is not None and i is not Ellipsis)
        index = index[:at] + (slice(None),) * fill + index[at + 1:]
    index = index + (slice(None),) * (len(shape) - sum(1 for i in index if i is not None))
    starts, ends, axes, steps, squeeze, unsqueeze = [], [], [], [], [], []
    axis = out_axis = 0
    for item in index:
        if item is None:
            unsqueeze.append(out_axis)
            out_axis += 1
            continue
        if isinstance(item, slice):
            step = 1 if item.step is None else item.step
            if (item.start, item.stop, step) != (None, None, 1):  # a whole axis needs none
                starts.append(item.start if item.start is not None else
                              (0 if step > 0 else _INT64_MAX))
                ends.append(item.stop if item.stop is not None else
                            (_INT64_MAX if step > 0 else _INT64_MIN))
                axes.append(axis)
                steps.append(step)
            out_axis += 1
        else:  # an integer: one element, then the axis goes
            starts.append(item)
            ends.append(item + 1 if item != -1 else _INT64_MAX)
            axes.append(axis)
            steps.append(1)
            squeeze.append(axis)
        axis += 1
    out = ins[0]
    if axes:
        out = w.emit("Slice", [out] + [w.const(np.array(v, np.int64), name) for v, name in
                                       ((starts, "starts"), (ends, "ends"), (axes, "axes"),
                                        (steps, "steps"))])
    if squeeze:
        out = w.emit("Squeeze", [out, w.const(np.array(squeeze, np.int64), "axes")])
    if unsqueeze:
        out = w.emit("Unsqueeze", [out, w.const(np.array(unsqueeze, np.int64), "axes")])
    return out if out != ins[0] else w.emit("Identity", [out])


@_writer("Unstack")
def _unstack(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return ins[0]  # each item is written where a GetItem takes it


@_writer("Split")
def _split(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    return ins[0]  # each item is written where a GetItem takes it (_split_item)


def _split_item(w: _Writer, split: Node, index: int) -> str:
    attrs = {**get_op("Split").attr_defaults, **split.attrs}
    shape = split.inputs[0].shape
    axis = attrs["axis"] % len(shape)
    size = output_types(split)[index].shape[axis]
    bounds = [w.const(np.array([v], np.int64), what) for v, what in
              ((index * size, "starts"), ((index + 1) * size, "ends"), (axis, "axes"))]
    return w.emit("Slice", [w.names[split.uid]] + bounds)


@_writer("Gather")
def _gather(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    # ONNX's Gather takes indices in range, negative ones from the end: both Gathers agree
    return w.emit("Gather", ins, axis=int(attrs["axis"]) % len(n.inputs[0].shape))


@_writer("RangeLike")
def _range_like(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    rank = len(n.inputs[0].shape)
    axis = attrs["axis"] % rank
    length = w.emit("Squeeze", [w.emit("Shape", ins, start=axis, end=axis + 1),
                                w.const(np.array([0], np.int64), "axes")])
    line = w.emit("Range", [w.const(np.asarray(0, np.int64), "start"), length,
                            w.const(np.asarray(1, np.int64), "delta")])
    if rank - axis - 1:
        line = w.emit("Reshape", [line, w.const(np.array([-1] + [1] * (rank - axis - 1),
                                                         np.int64), "shape")])
    out = w.emit("Expand", [line, w.emit("Shape", ins)])
    if n.dtype != np.int64:
        out = w.emit("Cast", [out], to=helper.np_dtype_to_tensor_dtype(n.dtype))
    return out


@_writer("ZerosLike")
def _zeros_like(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    zero = numpy_helper.from_array(np.zeros(1, dtype=n.dtype), "value")
    return w.emit("ConstantOfShape", [w.emit("Shape", ins)], value=zero)


@_writer("BatchNorm")
def _batch_norm(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    if attrs["is_training"]:
        raise UnsupportedError(f"export to ONNX: BatchNorm {n.name} in training mode (call "
                               "net.set_train(False) first)")
    return w.emit("BatchNormalization", ins, epsilon=float(attrs["epsilon"]))


@_writer("LayerNorm")
def _layer_norm(w: _Writer, n: Node, ins: list[str], attrs: dict[str, Any]) -> str:
    rank = len(n.inputs[0].shape)
    norm = attrs["begin_norm_axis"] % rank
    if attrs["begin_params_axis"] % rank != norm:
        raise UnsupportedError(f"export to ONNX: LayerNorm {n.name} with begin_params_axis "
                               "other than begin_norm_axis")
    return w.emit("LayerNormalization", ins, axis=norm, epsilon=float(attrs["epsilon"]))


__all__ = ["export_onnx", "graph_to_model", "OPSET"]
