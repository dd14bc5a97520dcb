"""The graph IR as data: a JSON-able description plus named arrays, and back.

Nothing here runs code from the data: ops are looked up by name in the op table, attributes are
tagged plain values (ints, floats as exact hex, strings, tuples, lists, numpy dtypes and
scalars, bools, None), and the rebuilt graph is checked by the verifier (every node's type
inferred again from its inputs). Any departure from the format is a FormatError naming where.
Constants are stored once (arrays named "const<N>") and shared by every graph that uses them.
"""
from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from graphkernel.errors import FormatError, GraphKernelError, SourceLocation
from graphkernel.ir.graph import Constant, Graph, Input, Node, Value
from graphkernel.ir.opset import OPS
from graphkernel.ir.types import (
    SUPPORTED_DTYPES,
    SymSize,
    TensorType,
    TupleType,
    ValueType,
    is_symbol_name,
)
from graphkernel.ir.verifier import verify

_DTYPES = {dt.name: dt for dt in SUPPORTED_DTYPES}
# numpy works `dtype.name` out afresh on every read (~10 us): a graph of a thousand nodes
# writes a few thousand types, and the warm path writes the graph twice (compile-cache key,
# plan key)
_DTYPE_NAMES = {dt: name for name, dt in _DTYPES.items()}
_MAX_DEPTH = 16  # composites nest a few levels at most (a user GraphKernel, then fusion)
_MAX_DIM = 1 << 40
# String attributes are choices (GeLU's approximate="tanh"): never free text.
_ATTR_TEXT = re.compile(r"[A-Za-z0-9_]{0,64}")


# -- writing -------------------------------------------------------------------------------
def encode_dim(dim: int | SymSize) -> Any:
    """A size: a number, or a dynamic size as {"coef": 2, "symbols": ["N"]} (2*N)."""
    if isinstance(dim, SymSize):
        return {"coef": dim.coef, "symbols": list(dim.names)}
    return dim


def dtype_name(dtype: np.dtype) -> str:
    """`dtype.name`, looked up for the supported dtypes."""
    return _DTYPE_NAMES.get(dtype) or dtype.name


def encode_type(type_: ValueType) -> dict[str, Any]:
    if isinstance(type_, TupleType):
        return {"tuple": [encode_type(t) for t in type_.items]}
    return {"shape": [encode_dim(d) for d in type_.shape], "dtype": dtype_name(type_.dtype)}


def encode_attr(value: Any, where: str) -> Any:
    """A tagged JSON value; anything the format cannot hold is an error naming `where`."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return {"float": value.hex()}
    if isinstance(value, np.dtype):
        return {"dtype": dtype_name(value)}
    if isinstance(value, SymSize):  # a dynamic size in a shape attribute (a broadcast's)
        return {"size": encode_dim(value)}
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return {"scalar": dtype_name(value.dtype), "value": encode_attr(value.item(), where)}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [encode_attr(v, where) for v in value]}
    raise FormatError(f"{where} is a {type(value).__name__} ({value!r:.60}); an export holds "
                      "ints, floats, strings, tuples, lists, dtypes, bools and dynamic sizes")


class _Writer:
    def __init__(self, tables: bool) -> None:
        self.constants: list[dict[str, Any]] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.const_ids: dict[int, int] = {}
        # Each distinct source location and value type once, by its index (None: written out
        # per node). A model's layers are made by the same lines and mostly share a few types:
        # a 12-layer stack repeats each location 12 times.
        self.locations: dict[SourceLocation, int] | None = {} if tables else None
        self.types: dict[ValueType, int] | None = {} if tables else None

    def type(self, type_: ValueType) -> Any:
        if self.types is None:
            return encode_type(type_)
        index = self.types.get(type_)
        if index is None:
            index = self.types[type_] = len(self.types)
        return index

    def location(self, loc: SourceLocation | None) -> Any:
        if loc is None:
            return None
        if self.locations is None:
            return [loc.filename, loc.lineno, loc.function, loc.text]
        index = self.locations.get(loc)
        if index is None:
            index = self.locations[loc] = len(self.locations)
        return index

    def ref(self, value: Value, ids: dict[int, int], where: str) -> list[Any]:
        if isinstance(value, Constant):
            if value.uid not in self.const_ids:
                key = f"const{len(self.constants)}"
                self.const_ids[value.uid] = len(self.constants)
                self.constants.append({"name": value.name, "array": key,
                                       "type": encode_type(value.type)})
                self.arrays[key] = value.value
            return ["c", self.const_ids[value.uid]]
        if value.uid not in ids:
            raise FormatError(f"{where} uses {value.name}, which is not in its graph")
        return ["v", ids[value.uid]]

    def graph(self, graph: Graph, where: str) -> dict[str, Any]:
        ids: dict[int, int] = {}
        inputs = []
        for inp in graph.inputs:
            ids[inp.uid] = len(ids)
            inputs.append({"name": inp.name, "kind": inp.kind, "type": self.type(inp.type)})
        nodes = []
        for node in graph.nodes:
            here = f"{where}/{node.name}"
            nodes.append({
                "op": node.op, "name": node.name,
                "inputs": [self.ref(v, ids, here) for v in node.inputs],
                "attrs": {k: encode_attr(v, f"{here} attribute {k}")
                          for k, v in node.attrs.items()},
                "type": self.type(node.type),
                "loc": self.location(node.loc),
                "notes": {k: encode_attr(v, f"{here} note {k}") for k, v in node.notes.items()},
                "subgraph": None if node.subgraph is None else self.graph(node.subgraph, here),
            })
            ids[node.uid] = len(ids)
        weights = {inp.uid: i for i, inp in enumerate(graph.inputs)}
        return {"name": graph.name, "inputs": inputs, "nodes": nodes,
                "outputs": [self.ref(v, ids, f"{where} output") for v in graph.outputs],
                "returns_tuple": graph.returns_tuple,
                "assigns": [[weights[w.uid], self.ref(v, ids, f"{where} assign")]
                            for w, v in graph.assigns],
                "effects": [self.ref(v, ids, f"{where} effect") for v in graph.effects]}


def graph_to_data(graph: Graph, tables: bool = False
                  ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The description of `graph` (JSON-able) and the arrays it names (its constants).
    `tables`: each distinct source location and each distinct type of an input or a node
    written once, in "locations" and "types", and a node's "loc" and "type" (an input's
    "type") its index there (read back with `data_to_graph(..., tables=True)`); else each
    written out in full."""
    writer = _Writer(tables)
    description = writer.graph(graph, graph.name)
    data: dict[str, Any] = {"graph": description, "constants": writer.constants}
    if writer.locations is not None and writer.types is not None:
        data["locations"] = [[loc.filename, loc.lineno, loc.function, loc.text]
                             for loc in writer.locations]
        data["types"] = [encode_type(t) for t in writer.types]
    return data, writer.arrays


def code_text(data: dict[str, Any]) -> str:
    """`graph_to_data(..., tables=True)`'s description as text with its location table left
    out (its type table kept): what of a graph decides its generated code (the user's source
    lines name where an op came from in messages and never reach the code; an edit above a
    model keeps the nodes' indices into the table). Keys in the order written, as the graph
    holds them (its nodes' notes keep their order): the same graph gives the same text."""
    return json.dumps({"graph": data["graph"], "constants": data["constants"],
                       "types": data["types"]})


# -- reading -------------------------------------------------------------------------------
def _expect(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise FormatError(f"{where}: {what}")


def _field(record: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    # Messages are formatted only on failure: a graph of a few hundred nodes reads ~2000 fields.
    _expect(isinstance(record, dict), where, "expected an object")
    if key not in record:
        raise FormatError(f"{where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind in (int, (int,))):
        raise FormatError(f"{where}: field {key!r} has the wrong kind ({type(value).__name__})")
    return value


def decode_dtype(name: Any, where: str) -> np.dtype:
    if not (isinstance(name, str) and name in _DTYPES):
        raise FormatError(f"{where}: unknown dtype {name!r}")
    return _DTYPES[name]


def decode_type(data: Any, where: str, depth: int = 0) -> ValueType:
    _expect(isinstance(data, dict), where, "a type must be an object")
    if "tuple" in data:
        _expect(depth == 0, where, "nested tuple type")
        items = _field(data, "tuple", list, where)
        types = tuple(decode_type(t, where, 1) for t in items)
        return TupleType(types)  # type: ignore[arg-type]  # depth 1: tensor types only
    shape = _field(data, "shape", list, where)
    if len(shape) > 32:
        raise FormatError(f"{where}: bad shape {shape!r:.80}")
    return TensorType(tuple(decode_dim(d, where) for d in shape),
                      decode_dtype(data.get("dtype"), where))


def decode_dim(data: Any, where: str) -> int | SymSize:
    """A size `encode_dim` wrote. A dynamic size names only symbols the compiler names (they
    become C locals of generated kernels): anything else is refused, never spliced into code."""
    if type(data) is int:
        if not 0 <= data < _MAX_DIM:
            raise FormatError(f"{where}: bad size {data!r}")
        return data
    _expect(isinstance(data, dict) and set(data) == {"coef", "symbols"}, where,
            f"bad size {data!r:.80}")
    coef, names = data["coef"], data["symbols"]
    _expect(type(coef) is int and 0 < coef < _MAX_DIM, where,
            f"bad dynamic size: coefficient {coef!r:.40}")
    _expect(isinstance(names, list) and 0 < len(names) <= 8 and
            all(is_symbol_name(n) for n in names), where,
            f"bad dynamic size: symbols {names!r:.80} (a symbol is named N, M, K, L, P, Q, R, "
            "S or N8, N9, ...)")
    return SymSize(coef, tuple(names))


def decode_attr(data: Any, where: str, depth: int = 0, free_text: bool = False) -> Any:
    """An attribute's value; strings are choices (identifiers) unless `free_text` (an op's
    `text_attrs`, such as Print's texts, which are only ever written out, never into code)."""
    _expect(depth < 8, where, "attribute nested too deep")
    if data is None or isinstance(data, (bool, int)):
        return data
    if isinstance(data, str):
        if _ATTR_TEXT.fullmatch(data) is None and not (free_text and len(data) < 100_000):
            raise FormatError(f"{where}: bad text value {data!r:.40}")
        return data
    if not (isinstance(data, dict) and len(data) in (1, 2)):
        raise FormatError(f"{where}: bad value {data!r:.60}")
    if "float" in data:
        try:
            return float.fromhex(data["float"])
        except (TypeError, ValueError):
            raise FormatError(f"{where}: bad float {data['float']!r:.40}") from None
    if "dtype" in data:
        return decode_dtype(data["dtype"], where)
    if "size" in data:
        size = decode_dim(data["size"], where)
        _expect(isinstance(size, SymSize), where, "bad dynamic size")
        return size
    if "scalar" in data:
        dtype = decode_dtype(data["scalar"], where)
        inner = decode_attr(data.get("value"), where, depth + 1)
        _expect(isinstance(inner, (bool, int, float)), where, "bad scalar")
        try:
            return dtype.type(inner)
        except (OverflowError, ValueError):
            raise FormatError(f"{where}: {inner!r} is no {dtype.name}") from None
    for kind in ("tuple", "list"):
        if kind in data:
            if not isinstance(data[kind], list):
                raise FormatError(f"{where}: bad {kind}")
            items = [decode_attr(v, where, depth + 1, free_text) for v in data[kind]]
            return tuple(items) if kind == "tuple" else items
    raise FormatError(f"{where}: unknown value tag in {data!r:.60}")


def _decode_note(data: Any, where: str, depth: int = 0) -> Any:
    """Notes are text for people (dumps, reports): any strings, lists of them, numbers."""
    if isinstance(data, str) and len(data) < 100_000:
        return data
    if isinstance(data, dict) and isinstance(data.get("list"), list) and depth < 4:
        return [_decode_note(v, where, depth + 1) for v in data["list"]]
    return decode_attr(data, where)


def _decode_location(data: Any, where: str) -> SourceLocation:
    _expect(isinstance(data, list) and len(data) == 4 and
            all(isinstance(x, str) for x in (data[0], data[2], data[3])) and
            type(data[1]) is int, where, "bad source location")
    return SourceLocation(*data)


class _Reader:
    def __init__(self, constants: list[Constant], locations: list[SourceLocation] | None,
                 types: list[ValueType] | None) -> None:
        self.constants = constants
        # None: each node's location and type written out in full
        self.locations = locations
        self.types = types

    def type(self, rec: Any, where: str) -> ValueType:
        """The "type" of an input's or a node's record: written out, or an index into the type
        table (each entry decoded and checked once)."""
        if self.types is None:
            return decode_type(_field(rec, "type", dict, where), where)
        index = _field(rec, "type", int, where)
        if not 0 <= index < len(self.types):
            raise FormatError(f"{where}: type {index} is no index into the type table")
        return self.types[index]

    def ref(self, data: Any, values: list[Value], where: str) -> Value:
        # Messages are formatted only on failure: a reference is read per operand.
        if not (isinstance(data, list) and len(data) == 2 and type(data[1]) is int):
            raise FormatError(f"{where}: bad value reference {data!r:.40}")
        table: list[Any] = self.constants if data[0] == "c" else values
        if not (data[0] in ("c", "v") and 0 <= data[1] < len(table)):
            raise FormatError(f"{where}: reference {data!r} points at no value")
        return table[data[1]]

    def graph(self, data: Any, where: str, depth: int = 0) -> Graph:
        _expect(depth <= _MAX_DEPTH, where, "composites nested too deep")
        name = _field(data, "name", str, where)
        values: list[Value] = []
        inputs: list[Input] = []
        for i, rec in enumerate(_field(data, "inputs", list, where)):
            here = f"{where} input {i}"
            kind = _field(rec, "kind", str, here)
            if kind not in ("input", "weight"):
                raise FormatError(f"{here}: unknown input kind {kind!r}")
            type_ = self.type(rec, here)
            _expect(isinstance(type_, TensorType), here, "an input is a tensor")
            inp = Input(type_, _field(rec, "name", str, here), kind)  # type: ignore[arg-type]  # _expect checked it
            inputs.append(inp)
            values.append(inp)
        nodes = []
        for i, rec in enumerate(_field(data, "nodes", list, where)):
            node = self.node(rec, values, f"{where} node {i}", depth)
            nodes.append(node)
            values.append(node)
        outputs = [self.ref(r, values, f"{where} output")
                   for r in _field(data, "outputs", list, where)]
        graph = Graph(name, inputs, nodes, outputs)
        graph.returns_tuple = _field(data, "returns_tuple", bool, where)
        for rec in _field(data, "assigns", list, where):
            _expect(isinstance(rec, list) and len(rec) == 2 and type(rec[0]) is int and
                    0 <= rec[0] < len(inputs), where, f"bad assign {rec!r:.40}")
            graph.assigns.append((inputs[rec[0]], self.ref(rec[1], values, f"{where} assign")))
        effects = data.get("effects", [])  # absent in files from before Print
        _expect(isinstance(effects, list), where, "effects is a list")
        for rec in effects:
            value = self.ref(rec, values, f"{where} effect")
            _expect(isinstance(value, Node) and value.op in OPS and OPS[value.op].effect, where,
                    f"effect {rec!r:.40} is not a node of an op with an effect (Print)")
            graph.effects.append(value)
        return graph

    def node(self, rec: Any, values: list[Value], where: str, depth: int) -> Node:
        op = _field(rec, "op", str, where)
        name = _field(rec, "name", str, where)
        where = f"{where} ({name})"
        sub_data = rec.get("subgraph") if isinstance(rec, dict) else None
        if sub_data is not None:
            if op != "Composite":
                raise FormatError(f"{where}: a {op} node has no subgraph")
        elif op not in OPS:
            raise FormatError(f"{where}: unknown op {op!r}")
        inputs = [self.ref(r, values, where) for r in _field(rec, "inputs", list, where)]
        text_attrs = OPS[op].text_attrs if op in OPS else ()
        attrs = {k: decode_attr(v, f"{where} attribute {k}", free_text=k in text_attrs)
                 for k, v in _field(rec, "attrs", dict, where).items()}
        loc_data = rec.get("loc")
        loc = None
        if loc_data is not None:
            if self.locations is None:
                loc = _decode_location(loc_data, where)
            else:
                if not (type(loc_data) is int and 0 <= loc_data < len(self.locations)):
                    raise FormatError(f"{where}: source location {loc_data!r:.40} is no index "
                                      "into the location table")
                loc = self.locations[loc_data]
        subgraph = None if sub_data is None else self.graph(sub_data, where, depth + 1)
        node = Node(op, inputs, attrs, self.type(rec, where), name, loc, subgraph)
        node.notes = {k: _decode_note(v, f"{where} note {k}")
                      for k, v in _field(rec, "notes", dict, where).items()}
        return node


def data_to_graph(data: Any, arrays: dict[str, np.ndarray], tables: bool = False
                  ) -> Graph:
    """Rebuild a graph from `graph_to_data`'s description and arrays, verified: every node's
    type inferred again from its inputs. A file's sums say it is whole, not that its types are
    true (anyone who can write it can write matching sums), and a type that does not follow
    from its inputs would size the buffers generated code writes through. Always checked.
    `tables`: the description was written with one (`graph_to_data`), and must be."""
    constants = []
    for i, rec in enumerate(_field(data, "constants", list, "constants")):
        where = f"constant {i}"
        key = _field(rec, "array", str, where)
        _expect(key in arrays, where, f"array {key!r} is missing")
        type_ = decode_type(_field(rec, "type", dict, where), where)
        _expect(isinstance(type_, TensorType), where, "a constant is a tensor")
        check_array(arrays[key], type_, where)  # type: ignore[arg-type]  # _expect checked it
        constants.append(Constant(arrays[key], _field(rec, "name", str, where)))
    locations, types = None, None
    if tables:
        locations = [_decode_location(rec, f"location {i}")
                     for i, rec in enumerate(_field(data, "locations", list, "locations"))]
        types = [decode_type(rec, f"type {i}")
                 for i, rec in enumerate(_field(data, "types", list, "types"))]
    graph = _Reader(constants, locations, types).graph(_field(data, "graph", dict, "graph"),
                                                       "graph")
    _check_attrs(graph, "graph")
    try:
        verify(graph)
    except GraphKernelError as exc:  # a type that does not follow from its inputs
        raise FormatError(f"the graph does not check: {exc.problem}") from None
    return graph


def _check_attrs(graph: Graph, where: str) -> None:
    """Each node's attributes are ones its op declares, each of its declared kind (a composite
    has none): they reach shape inference, the runtime and generated C."""
    for node in graph.nodes:
        here = f"{where}/{node.name}"
        if node.subgraph is not None:
            if node.attrs:
                raise FormatError(f"{here}: a composite has no attributes, got "
                                  f"{sorted(node.attrs)!r:.60}")
            _check_attrs(node.subgraph, here)
            continue
        try:
            OPS[node.op].check_attr_kinds(node.attrs)
        except GraphKernelError as exc:
            raise FormatError(f"{here}: {exc.problem}") from None


def check_array(array: np.ndarray, type_: TensorType, where: str) -> None:
    """An array read from a file has exactly the declared dtype and shape."""
    _expect(array.dtype == type_.dtype and tuple(array.shape) == type_.shape, where,
            f"array is {array.dtype}{list(array.shape)}, declared {type_}")
