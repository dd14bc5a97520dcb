"""Reading an ONNX model into the graph `nn.GraphCell` runs.

The model is data from a stranger: it is parsed with the `onnx` package, checked (`onnx.checker`,
then every node input defined before use, every initializer's declared size against its bytes,
external data kept inside the model's folder), converted to opset 13 or newer where older, and
every node's operator looked up before any is converted, so an operator graphkernel cannot run
is an `UnsupportedError` at load, naming the node. Nothing from the file is executed: its nodes
become primitives of graphkernel's op table (onnx/ops/), traced into a graph exactly as a
cell's `construct` is, so values known at load time (initializers, shape subgraphs) fold there
and then, and the graph goes through the same pipeline as a compiled cell.
"""
from __future__ import annotations

import hashlib
import math
import os
from typing import Any

import numpy as np
import onnx

from graphkernel.errors import FormatError, GraphKernelError, UnsupportedError
from graphkernel.frontend.compile import compile_traced, options_from_context
from graphkernel.frontend.dynamic import symbol_name
from graphkernel.frontend.export import LoadedGraph
from graphkernel.frontend.tensor import Tensor
from graphkernel.frontend.tracing import Tracer
from graphkernel.graph_kernel.pipeline import CompileOptions
from graphkernel.ir.types import SymSize, TensorType
from graphkernel.onnx import ops
from graphkernel.onnx.arrays import onnx_dtype, supported_dtype, tensor_array
from graphkernel.passes.stage_names import FINAL

# The oldest default-domain opset the converters are written for; older models are converted.
MIN_OPSET = 13
# An initializer or input larger than this many elements is refused as a hostile declaration
# before any memory is taken for it (real models' largest tensors are well below).
MAX_ELEMENTS = 1 << 34


def load_path(path: str, shapes: dict[str, tuple[int, ...]] | None = None,
              options: CompileOptions | None = None) -> LoadedGraph:
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read it ({exc.strerror})") from None
    return load_bytes(data, path, folder=os.path.dirname(path), shapes=shapes, options=options)


def load_bytes(data: bytes, label: str, folder: str | None,
               shapes: dict[str, tuple[int, ...]] | None = None,
               options: CompileOptions | None = None) -> LoadedGraph:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError, and whatever else a bad file raises
        raise FormatError(f"{label} is neither a GKIR export nor a readable ONNX model "
                          f"(truncated or corrupted?): {exc}") from None
    return load_model(model, label, folder, hashlib.sha256(data).hexdigest(), shapes=shapes,
                      options=options)


def load_model(model: onnx.ModelProto, label: str = "<onnx.ModelProto>",
               folder: str | None = None, checksum: str | None = None,
               bind: dict[str, np.ndarray] | None = None,
               shapes: dict[str, tuple[int, ...]] | None = None,
               options: CompileOptions | None = None) -> LoadedGraph:
    """Check `model`, convert it and build its graph (see the module's doc). `bind` gives
    graph inputs fixed values: they become constants, and leave the signature. `shapes` gives
    inputs static shapes that fit their declared ones (a size for each dim_param); `options`
    the compile options (default: the context's)."""
    if checksum is None:
        checksum = hashlib.sha256(model.SerializeToString()).hexdigest()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # external data and opset conversion never alter the caller's model
    model = _checked(copy, label, folder)
    return _Importer(model, label, checksum, bind or {}, shapes or {}, options).build()


def input_names(path: str) -> list[str]:
    """The names of an ONNX model's inputs (those no initializer gives), in order."""
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError, OSError, whatever a bad file raises
        raise FormatError(f"{path} is not a readable ONNX model: {exc}") from None
    given = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in given]


# -- checks --------------------------------------------------------------------------------
def _checked(model: onnx.ModelProto, label: str, folder: str | None) -> onnx.ModelProto:
    if not model.HasField("graph") or not model.graph.output:
        raise FormatError(f"{label} is not an ONNX model (no graph with outputs)")
    _load_external_data(model, label, folder)
    _check_initializer_sizes(model.graph, label)
    try:
        onnx.checker.check_model(model, full_check=True)  # types and shapes inferred too
    except Exception as exc:  # onnx.checker.ValidationError, or a parse problem inside it
        raise FormatError(f"{label}: the ONNX checker refuses the model: "
                          f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc}"
                          ) from None
    opset = default_opset(model)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise UnsupportedError(f"{label} uses ONNX opset {opset}; the installed onnx package "
                               f"({onnx.__version__}) knows up to {newest}: upgrade onnx")
    if opset < MIN_OPSET:
        try:
            model = onnx.version_converter.convert_version(model, MIN_OPSET)
        except Exception as exc:  # the converter's own errors for adapters it lacks
            raise UnsupportedError(f"{label} uses ONNX opset {opset}; graphkernel reads opset "
                                   f"{MIN_OPSET} and newer, and onnx.version_converter cannot "
                                   f"convert this model: {exc}") from None
    return model


def default_opset(model: onnx.ModelProto) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 1  # the ONNX rule for a model that imports no default-domain opset


def _load_external_data(model: onnx.ModelProto, label: str, folder: str | None) -> None:
    """Initializers stored in files beside the model: each read into the model, refused when
    its location leaves the model's folder or its bytes are not all there."""
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        if folder is None:
            raise FormatError(f"{label}: initializer {tensor.name!r} keeps its data in an "
                              f"external file ({location!r}); load the model from its path so "
                              "the file can be found beside it")
        root = os.path.realpath(folder)
        target = os.path.realpath(os.path.join(root, location))
        if not location or os.path.isabs(location) or \
                os.path.commonpath([root, target]) != root or target == root:
            raise FormatError(f"{label}: initializer {tensor.name!r} names external data "
                              f"{location!r} outside the model's folder {root}; refused")
        try:
            offset = int(info.get("offset", 0))
            length = int(info["length"]) if "length" in info else None
        except ValueError:
            raise FormatError(f"{label}: initializer {tensor.name!r} has a bad external data "
                              "offset or length") from None
        try:
            size = os.path.getsize(target)
            if offset < 0 or (length is not None and (length < 0 or offset + length > size)):
                raise FormatError(f"{label}: initializer {tensor.name!r} reads bytes "
                                  f"{offset}..{offset + (length or 0)} of {location!r}, which "
                                  f"holds {size}")
            with open(target, "rb") as fh:
                fh.seek(offset)
                data = fh.read(length if length is not None else -1)
        except OSError as exc:
            raise FormatError(f"{label}: initializer {tensor.name!r}: external data file "
                              f"{location!r} cannot be read ({exc.strerror})") from None
        tensor.raw_data = data
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _all_tensors(graph: onnx.GraphProto) -> list[onnx.TensorProto]:
    tensors = list(graph.initializer)
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                tensors.append(attr.t)
            tensors.extend(attr.tensors)
    return tensors


def _check_initializer_sizes(graph: onnx.GraphProto, label: str) -> None:
    """A declared shape must match the data held (a huge shape over a few bytes is refused
    here, before numpy is asked for the memory)."""
    for tensor in _all_tensors(graph):
        if any(d < 0 for d in tensor.dims):
            raise FormatError(f"{label}: tensor {tensor.name!r} has a negative dimension "
                              f"{list(tensor.dims)}")
        count = math.prod(tensor.dims)
        if count > MAX_ELEMENTS:
            raise FormatError(f"{label}: tensor {tensor.name!r} declares shape "
                              f"{list(tensor.dims)} ({count} elements): refused as too large")
        if tensor.HasField("raw_data") or tensor.raw_data:
            try:
                itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
            except Exception:  # an unknown data_type number
                raise FormatError(f"{label}: tensor {tensor.name!r} has an unknown data type "
                                  f"{tensor.data_type}") from None
            if tensor.data_type in (onnx.TensorProto.STRING,):
                continue
            if len(tensor.raw_data) != count * itemsize:
                raise FormatError(f"{label}: tensor {tensor.name!r} declares shape "
                                  f"{list(tensor.dims)} ({count * itemsize} bytes) but holds "
                                  f"{len(tensor.raw_data)} bytes")


class DynamicDims:
    """The one mapping from ONNX's symbolic dimensions to graphkernel's: each distinct
    `dim_param` (and each unnamed dimension) becomes a dynamic dimension of the kind
    `Cell.set_inputs` makes (`SymSize`, named N, M, K, ... in order); a `dim_param` used by two
    inputs is one size."""

    def __init__(self) -> None:
        self.by_param: dict[str, SymSize] = {}
        self.count = 0

    def dim(self, param: str | None) -> SymSize:
        if param and param in self.by_param:
            return self.by_param[param]
        size = SymSize.dim(symbol_name(self.count))
        self.count += 1
        if param:
            self.by_param[param] = size
        return size


def input_type(value: onnx.ValueInfoProto, dims: DynamicDims, label: str) -> TensorType:
    what = f"input {value.name!r}"
    if not value.type.HasField("tensor_type"):
        raise UnsupportedError(f"{label}: {what} is not a tensor (sequences, maps and optional "
                               "values are not supported)")
    tensor_type = value.type.tensor_type
    dtype = onnx_dtype(tensor_type.elem_type, what, label)
    if not tensor_type.HasField("shape"):
        raise UnsupportedError(f"{label}: {what} has no declared shape (not even its rank); "
                               "graphkernel needs the rank of every input")
    shape: list[int | SymSize] = []
    for d in tensor_type.shape.dim:
        if d.HasField("dim_value"):
            if d.dim_value < 0:
                raise FormatError(f"{label}: {what} has a negative dimension {d.dim_value}")
            shape.append(int(d.dim_value))
        else:
            shape.append(dims.dim(d.dim_param if d.HasField("dim_param") else None))
    static = math.prod(d for d in shape if isinstance(d, int))
    if static > MAX_ELEMENTS:
        raise FormatError(f"{label}: {what} declares shape {shape} ({static} elements and "
                          "more): refused as too large")
    return TensorType(tuple(shape), dtype)


# -- building ------------------------------------------------------------------------------
class _Importer:
    def __init__(self, model: onnx.ModelProto, label: str, checksum: str,
                 bind: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]],
                 options: CompileOptions | None) -> None:
        self.model = model
        self.shapes = shapes
        self.options = options
        self.bind = bind
        self.label = label
        self.checksum = checksum
        self.opset = default_opset(model)
        self.size_sources: dict[str, tuple[Tensor, int]] = {}
        self.name = model.graph.name or os.path.splitext(os.path.basename(label))[0] or "onnx"

    def build(self) -> LoadedGraph:
        graph = self.model.graph
        converters = self._converters()  # every operator looked up before anything is built
        initializers = {t.name: t for t in graph.initializer}
        dims = DynamicDims()
        signature = [(i.name, self._given_shape(i.name, input_type(i, dims, self.label)))
                     for i in graph.input
                     if i.name not in initializers and i.name not in self.bind]
        unknown = set(self.shapes) - {name for name, _ in signature}
        if unknown:
            raise FormatError(f"{self.label}: shapes given for {sorted(unknown)}, which are not "
                              "inputs of the model")
        unknown = set(self.bind) - {i.name for i in graph.input}
        if unknown:
            raise FormatError(f"{self.label}: bind names {sorted(unknown)}, which are not "
                              "inputs of the model")
        tracer = Tracer(self.name)
        values: dict[str, Any] = {}
        with tracer:
            sources: dict[str, tuple[Tensor, int]] = {}
            for name, type_ in signature:
                values[name] = tracer.add_input(type_, name)
                for axis, size in enumerate(type_.shape):
                    if isinstance(size, SymSize):
                        sources.setdefault(size.names[0], (values[name], axis))
            self.size_sources = sources
            for name, tensor in initializers.items():
                values[name] = tensor_array(tensor, self.label)
            for name, array in self.bind.items():
                values[name] = np.array(array, dtype=supported_dtype(
                    np.asarray(array).dtype, f"bound input {name!r}", self.label))
            for node, convert in zip(graph.node, converters):
                self._convert(node, convert, values)
            outputs = []
            for out in graph.output:
                if out.name not in values:
                    raise FormatError(f"{self.label}: graph output {out.name!r} is not made by "
                                      "any node, input or initializer")
                outputs.append(tracer.value_of(_as_tensor(values[out.name], out.name,
                                                          self.label)))
        traced = tracer.graph
        traced.outputs = outputs
        traced.returns_tuple = len(outputs) > 1
        options = self.options or options_from_context()
        try:  # the pipeline a written network's traced graph goes through
            compiled = compile_traced(traced, self.name, options)
        except GraphKernelError as err:
            raise type(err)(f"{self.label}: {err.problem}") from None
        final = compiled.report.stages[FINAL]
        producer = " ".join(p for p in (self.model.producer_name,
                                        self.model.producer_version) if p)
        types = {i.name: i.tensor_type for i in final.inputs if i.kind == "input"}
        library = compiled.executable.library
        return LoadedGraph(self.name, final, {}, options,
                           [(i.name, types[i.name]) for i in traced.inputs if i.kind == "input"],
                           # written only if read: a warm build wrote no C
                           (lambda: library.source) if library is not None else None,
                           self.checksum,
                           f"{producer or 'unknown'} (ONNX opset {self.opset})",
                           notes=[f"imported from ONNX: {self.label}"], compiled=compiled)

    def _given_shape(self, name: str, declared: TensorType) -> TensorType:
        """The input's declared type, or the static shape given for it (`shapes`), which must
        fit the declared one: a dynamic dimension (a dim_param) takes any size."""
        if name not in self.shapes:
            return declared
        shape = tuple(self.shapes[name])
        if len(shape) != len(declared.shape) or any(
                isinstance(d, int) and d != s for d, s in zip(declared.shape, shape)) or \
                not all(isinstance(s, int) and s >= 0 for s in shape):
            raise FormatError(f"{self.label}: input {name!r} is declared {declared}; the shape "
                              f"{list(shape)} given for it does not fit")
        return TensorType(shape, declared.dtype)

    def _converters(self) -> list[Any]:
        found = []
        for node in self.model.graph.node:
            where = _node_text(node, self.opset)
            if node.domain not in ("", "ai.onnx"):
                raise UnsupportedError(f"{self.label}: {where}: operators of domain "
                                       f"{node.domain!r} are not supported (only the default "
                                       "ai.onnx domain)")
            convert = ops.CONVERTERS.get(node.op_type)
            if convert is None:
                raise UnsupportedError(f"{self.label}: {where}: graphkernel has no converter "
                                       "for this operator (docs/onnx.md lists those it has)")
            found.append(convert)
        return found

    def _convert(self, node: onnx.NodeProto, convert: Any, values: dict[str, Any]) -> None:
        where = _node_text(node, self.opset)
        inputs: list[Any] = []
        for name in node.input:
            if name == "":
                inputs.append(None)  # an omitted optional input
            elif name in values:
                inputs.append(values[name])
            else:
                raise FormatError(f"{self.label}: {where}: input {name!r} is not made by an "
                                  "earlier node, an input or an initializer (a missing "
                                  "initializer, or a cycle)")
        context = ops.NodeContext(node, self.opset, f"{self.label}: {where}", self.label,
                                  self.size_sources)
        try:
            results = ops.run(convert, context, inputs)
        except GraphKernelError as err:
            if err.problem.startswith(f"{self.label}: {where}"):
                raise
            raise type(err)(f"{self.label}: {where}: {err.problem}") from None
        if len(results) < len([o for o in node.output if o]):
            raise UnsupportedError(f"{self.label}: {where}: only its first {len(results)} "
                                   "output(s) are supported")
        for name, result in zip(node.output, results):
            if name:
                if name in values:
                    raise FormatError(f"{self.label}: {where}: output {name!r} is made twice")
                values[name] = result


def _node_text(node: onnx.NodeProto, opset: int) -> str:
    name = f"{node.name!r} " if node.name else ""
    return f"node {name}({node.op_type}, opset {opset})"


def _as_tensor(value: Any, name: str, label: str) -> Tensor:
    if isinstance(value, Tensor):
        return value
    return Tensor(ops.concrete(value, f"output {name!r}"))


__all__ = ["input_names", "load_bytes", "load_model", "load_path", "DynamicDims", "MIN_OPSET"]
