"""Checkpoints in MindSpore's `.ckpt` format: `save_checkpoint(net, file)`,
`load_checkpoint(file) -> {name: Parameter}`, `load_param_into_net(net, params)`.

A `.ckpt` file is one protobuf message (MindSpore's checkpoint.proto):
    Checkpoint { repeated Value value = 1; }
    Value { string tag = 1; TensorProto tensor = 2; }
    TensorProto { repeated int64 dims = 1; string tensor_type = 2; bytes tensor_content = 3; }
Three messages of known fields: this module reads and writes the wire format directly (varints
and length-delimited fields) rather than depend on protobuf. Fields it does not know (MindSpore's
map tensors, checksums) are skipped when reading. tests/test_layers.py reads a file MindSpore
2.10 wrote, and writes the same parameters back byte for byte.

Entries are keyed by `Parameter.name`, as MindSpore keys them: a net's parameters keep their
names however the net is wrapped (TrainOneStepCell, WithLossCell), so a checkpoint saved from a
training step loads into the bare network. A checkpoint file is data from anywhere: every size,
dimension and type in it is checked, and loading refuses a value a parameter cannot hold."""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor

# MindSpore's tensor_type names.
_TYPE_NAMES: dict[np.dtype, str] = {np.dtype("float16"): "Float16", np.dtype("float32"): "Float32",
               np.dtype("float64"): "Float64", np.dtype("int32"): "Int32",
               np.dtype("int64"): "Int64", np.dtype("bool"): "Bool"}
_NAME_TYPES: dict[str, np.dtype] = {v: k for k, v in _TYPE_NAMES.items()}
_WIRE_VARINT, _WIRE_I64, _WIRE_BYTES, _WIRE_I32 = 0, 1, 2, 5
_MAX_RANK = 32  # numpy's arrays have at most 64 dimensions; no parameter has this many


class CheckpointError(InputError):
    """A checkpoint file that cannot be read, or parameters that do not fit a network."""


# -- protobuf wire format ---------------------------------------------------------------------

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 as two's complement, ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _WIRE_BYTES) + _varint(len(payload)) + payload


def _read_varint(data: bytes, pos: int, where: str) -> tuple[int, int]:
    shift = value = 0
    while True:
        if pos >= len(data):
            raise CheckpointError(f"{where}: truncated (a number runs past the end)")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & ((1 << 64) - 1), pos  # bits past 64 are dropped, as protobuf does
        shift += 7
        if shift > 63:
            raise CheckpointError(f"{where}: malformed number")


def _fields(data: bytes, where: str) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message; bytes fields as memory slices."""
    out: list[tuple[int, int, Any]] = []
    pos = 0
    value: Any  # an integer (varint) or a memory slice (the other wire types)
    while pos < len(data):
        key, pos = _read_varint(data, pos, where)
        number, wire = key >> 3, key & 7
        if wire == _WIRE_VARINT:
            value, pos = _read_varint(data, pos, where)
        elif wire == _WIRE_BYTES:
            size, pos = _read_varint(data, pos, where)
            if pos + size > len(data):
                raise CheckpointError(f"{where}: truncated (a field runs past the end)")
            value, pos = data[pos:pos + size], pos + size
        elif wire in (_WIRE_I64, _WIRE_I32):
            step = 8 if wire == _WIRE_I64 else 4
            if pos + step > len(data):
                raise CheckpointError(f"{where}: truncated (a field runs past the end)")
            value, pos = data[pos:pos + step], pos + step
        else:
            raise CheckpointError(f"{where}: not a MindSpore checkpoint (wire type {wire})")
        out.append((number, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# -- writing ----------------------------------------------------------------------------------

def _cell_parameters(net: Cell) -> list[tuple[str, Parameter]]:
    """(checkpoint key, Parameter) of each of the net's parameters, once: the key is the
    Parameter's name (MindSpore's), or its attribute path when it has none."""
    seen: set[int] = set()
    out = []
    for path, param in net.parameters_and_names():
        if id(param) not in seen:  # a shared parameter is one entry
            seen.add(id(param))
            out.append((param.name or path, param))
    return out


def _named_arrays(save_obj: Any) -> list[tuple[str, np.ndarray]]:
    if isinstance(save_obj, Cell):
        named = _cell_parameters(save_obj)
        keys = [key for key, _ in named]
        twice = sorted({key for key in keys if keys.count(key) > 1})
        if twice:
            raise CheckpointError(f"save_checkpoint: two different parameters of "
                                  f"{type(save_obj).__name__} are both named {twice[0]!r}; "
                                  "a checkpoint keys parameters by name: rename one")
        return [(key, p.asnumpy()) for key, p in named]
    if isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list):  # MindSpore's [{"name": ..., "data": ...}, ...]
        if not all(isinstance(e, dict) and "name" in e and "data" in e for e in save_obj):
            raise CheckpointError("save_checkpoint: a list to save holds {'name': ..., "
                                  "'data': ...} dicts only")
        items = [(entry["name"], entry["data"]) for entry in save_obj]
    else:
        raise CheckpointError(f"save_checkpoint saves a Cell, a dict or a list of "
                              f"{{'name', 'data'}} dicts, not a {type(save_obj).__name__}")
    return [(str(name), value.asnumpy() if isinstance(value, Tensor) else np.asarray(value))
            for name, value in items]


def save_checkpoint(save_obj: Any, ckpt_file_name: str) -> None:
    """Write the parameters of a Cell (or a dict / MindSpore-style list) to a .ckpt file,
    atomically: a reader never sees half a file, and a failed save leaves the old one."""
    path = os.fspath(ckpt_file_name)
    if not path.endswith(".ckpt"):
        path += ".ckpt"  # as MindSpore does
    message = bytearray()
    for name, array in _named_arrays(save_obj):
        if array.dtype not in _TYPE_NAMES:
            raise CheckpointError(f"parameter {name!r} has dtype {array.dtype}, which a "
                                  "checkpoint here cannot hold")
        dims = b"".join(_varint(1 << 3 | _WIRE_VARINT) + _varint(d) for d in array.shape)
        tensor = dims + _field(2, _TYPE_NAMES[array.dtype].encode()) + \
            _field(3, np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes())
        message += _field(1, _field(1, name.encode()) + _field(2, tensor))
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)
    except OSError as exc:
        raise CheckpointError(f"cannot save checkpoint {path}: {exc.strerror} "
                              f"(folder {folder})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(message))
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name moves to them
        os.replace(tmp, path)
    except OSError as exc:
        os.unlink(tmp)
        raise CheckpointError(f"cannot save checkpoint {path}: {exc.strerror}; "
                              "any file there is left as it was") from None
    except BaseException:
        os.unlink(tmp)
        raise


# -- reading ----------------------------------------------------------------------------------

def _tensor(data: bytes, where: str) -> np.ndarray:
    dims: list[int] = []
    type_name, content = None, b""
    for number, wire, value in _fields(data, where):
        if number == 1 and wire == _WIRE_VARINT:
            dims.append(_signed(value))
        elif number == 1 and wire == _WIRE_BYTES:  # packed dims
            pos = 0
            while pos < len(value):
                d, pos = _read_varint(value, pos, where)
                dims.append(_signed(d))
        elif number == 2:
            type_name = bytes(value).decode("utf-8", "replace")
        elif number == 3:
            content = bytes(value)
    if type_name is None or type_name not in _NAME_TYPES:
        raise CheckpointError(f"{where}: tensor type {type_name!r} is not one graphkernel "
                              f"computes in ({', '.join(_NAME_TYPES)})")
    dtype = _NAME_TYPES[type_name]
    if len(dims) > _MAX_RANK or any(d < 0 for d in dims):
        raise CheckpointError(f"{where}: bad shape {tuple(dims)!s:.200} (dimensions are "
                              f"0 or more, at most {_MAX_RANK} of them)")
    count = math.prod(dims)  # Python's integers: a huge shape cannot wrap around to fit
    if len(content) != count * dtype.itemsize:
        raise CheckpointError(f"{where}: {len(content)} bytes for a {type_name} tensor of shape "
                              f"{tuple(dims)}")
    array = np.frombuffer(content, dtype.newbyteorder("<")).astype(dtype).reshape(dims)
    if dtype == np.bool_ and not np.isin(np.frombuffer(content, np.uint8), (0, 1)).all():
        raise CheckpointError(f"{where}: a Bool tensor holds bytes other than 0 and 1")
    return array


def load_checkpoint(ckpt_file_name: str) -> dict[str, Parameter]:
    """{name: Parameter} from a .ckpt file (written here or by MindSpore)."""
    path = os.fspath(ckpt_file_name)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}") from None
    params: dict[str, Parameter] = {}
    for number, wire, value in _fields(data, path):
        if number != 1 or wire != _WIRE_BYTES:
            continue
        name, tensor = None, None
        for n, w, v in _fields(bytes(value), path):
            if n == 1 and w == _WIRE_BYTES:
                name = bytes(v).decode("utf-8", "replace")
            elif n == 2 and w == _WIRE_BYTES:
                tensor = _tensor(bytes(v), f"{path}: {name}")
        if name is None or tensor is None:
            continue  # a map tensor or another entry graphkernel has no use for
        if name in params:
            raise CheckpointError(f"{path}: the entry {name!r} appears twice (altered file?)")
        params[name] = Parameter(tensor, name)
    if not data:
        raise CheckpointError(f"{path} is empty: not a checkpoint (an interrupted copy?)")
    if not params:
        raise CheckpointError(f"{path} holds no tensors: not a MindSpore checkpoint")
    return params


def _value_for(param: Parameter, name: str, value: Any, strict_load: bool) -> np.ndarray:
    """The checkpoint's value for `param`, in its dtype; refused when the shape differs, the
    kind of number differs (float against int or bool, as MindSpore refuses it), or the
    conversion would change a value (1e300 into float32, 2**40 into int32). Rounding between
    float types is no change of value here (MindSpore converts float32 to float16 too)."""
    array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
    if array.dtype not in _TYPE_NAMES:
        raise CheckpointError(f"parameter {name!r}: the checkpoint's value has dtype "
                              f"{array.dtype}, not a number type a parameter holds")
    if tuple(array.shape) != param.shape:
        raise CheckpointError(f"parameter {name!r}: the checkpoint's shape "
                              f"{tuple(array.shape)} differs from the net's {param.shape}")
    want = np.dtype(param.dtype)
    if array.dtype == want:
        return array
    kinds = {array.dtype.kind, want.kind}
    if strict_load or not (kinds == {"f"} or kinds <= {"i", "u"}):
        raise CheckpointError(f"parameter {name!r}: the checkpoint holds {array.dtype}, the "
                              f"net's parameter is {want}; not converting "
                              f"{'under strict_load' if strict_load else 'between kinds'}")
    with np.errstate(over="ignore", invalid="ignore"):  # overflow is looked for just below
        converted = array.astype(want)
    if want.kind == "f":
        changed = np.isinf(converted) & np.isfinite(array)
    else:
        changed = converted.astype(array.dtype) != array
    if changed.any():
        bad, became = array[changed].flat[0].item(), converted[changed].flat[0].item()
        raise CheckpointError(f"parameter {name!r}: the checkpoint's {array.dtype} value "
                              f"{bad!r} does not fit the net's {want} (it would become "
                              f"{became!r})")
    return converted


def load_param_into_net(net: Cell, parameter_dict: dict[str, Any],
                        strict_load: bool = False) -> tuple[list[str], list[str]]:
    """Copy values into the net's parameters, each found by its `Parameter.name` (as
    MindSpore does; files of older graphkernels keyed by attribute path load too). Returns
    (names of the net's parameters not loaded, checkpoint entries not used), as MindSpore 2.x
    does. Nothing is loaded when any value is refused; a checkpoint of which no entry fits the
    net is an error, never a silent no-op."""
    if not isinstance(net, Cell):
        raise CheckpointError(f"load_param_into_net loads into a Cell, not a "
                              f"{type(net).__name__}")
    if not isinstance(parameter_dict, dict):
        raise CheckpointError(f"load_param_into_net takes a dict of parameters (from "
                              f"load_checkpoint), not a {type(parameter_dict).__name__}")
    paths = {id(p): path for path, p in reversed(net.parameters_and_names())}
    named = _cell_parameters(net)
    names = {key for key, _ in named}
    planned: list[tuple[Parameter, np.ndarray]] = []
    not_loaded: list[str] = []
    used: set[str] = set()
    for name, param in named:
        key: str | None = name
        if key not in parameter_dict:
            # Older graphkernels keyed entries by attribute path ("network.fc1.weight").
            path = paths[id(param)]
            key = path if path in parameter_dict and path not in names else None
        if key is None:
            not_loaded.append(name)
            continue
        planned.append((param, _value_for(param, name, parameter_dict[key], strict_load)))
        used.add(key)
    unused = [str(n) for n in parameter_dict if n not in used]
    if named and not planned:
        raise CheckpointError(
            f"none of the {len(named)} parameters of {type(net).__name__} "
            f"({_some(not_loaded)}) is in the checkpoint, whose {len(parameter_dict)} "
            f"entries are {_some(unused) or 'none'}: nothing loaded (another network's "
            "checkpoint?)")
    if strict_load and (not_loaded or unused):
        raise CheckpointError(f"strict load: parameters not loaded {not_loaded}, checkpoint "
                              f"entries unused {unused}")
    for param, array in planned:
        param.set_data(array)
    return not_loaded, unused


def _some(names: list[str], most: int = 4) -> str:
    more = f", ... ({len(names) - most} more)" if len(names) > most else ""
    return ", ".join(repr(n) for n in names[:most]) + more
