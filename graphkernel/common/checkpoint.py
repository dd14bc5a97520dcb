"""Checkpoints in MindSpore's `.ckpt` format: `save_checkpoint(net, file)`,
`load_checkpoint(file) -> {name: Parameter}`, `load_param_into_net(net, params)`.

A `.ckpt` file is one protobuf message (MindSpore's checkpoint.proto):
    Checkpoint { repeated Value value = 1; }
    Value { string tag = 1; TensorProto tensor = 2; }
    TensorProto { repeated int64 dims = 1; string tensor_type = 2; bytes tensor_content = 3; }
Three messages of known fields: this module reads and writes the wire format directly (varints
and length-delimited fields) rather than depend on protobuf. Fields it does not know (MindSpore's
map tensors, checksums) are skipped when reading. tests/test_layers.py reads a file MindSpore
2.10 wrote, and writes the same parameters back byte for byte."""
from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor

# MindSpore's tensor_type names.
_TYPE_NAMES = {np.dtype("float16"): "Float16", np.dtype("float32"): "Float32",
               np.dtype("float64"): "Float64", np.dtype("int32"): "Int32",
               np.dtype("int64"): "Int64", np.dtype("bool"): "Bool"}
_NAME_TYPES = {v: k for k, v in _TYPE_NAMES.items()}
_WIRE_VARINT, _WIRE_I64, _WIRE_BYTES, _WIRE_I32 = 0, 1, 2, 5


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
            return value, pos
        shift += 7
        if shift > 63:
            raise CheckpointError(f"{where}: malformed number")


def _fields(data: bytes, where: str) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of one message; bytes fields as memory slices."""
    out, pos = [], 0
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
            value, pos = data[pos:pos + step], pos + step
        else:
            raise CheckpointError(f"{where}: not a MindSpore checkpoint (wire type {wire})")
        out.append((number, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# -- writing ----------------------------------------------------------------------------------

def _by_name(net: Cell) -> dict[str, Parameter]:
    """A cell's parameters by Parameter.name, each once: the names MindSpore keys checkpoints
    by (auto_prefix's "fc1.weight"), which wrappers such as TrainOneStepCell keep, where the
    attribute path would read "network._backbone.fc1.weight"."""
    out: dict[str, Parameter] = {}
    for path, param in net.parameters_and_names():
        name = param.name or path
        if out.setdefault(name, param) is not param:
            raise CheckpointError(f"two different parameters of {type(net).__name__} are both "
                                  f"named {name!r} (the second at {path!r}); a checkpoint keys "
                                  "parameters by name: give them distinct names")
    return out


def _named_arrays(save_obj: Any) -> list[tuple[str, np.ndarray]]:
    if isinstance(save_obj, Cell):
        return [(name, p.asnumpy()) for name, p in _by_name(save_obj).items()]
    if isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list):  # MindSpore's [{"name": ..., "data": ...}, ...]
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
    fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(message))
        os.replace(tmp, path)
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
    if type_name not in _NAME_TYPES:
        raise CheckpointError(f"{where}: tensor type {type_name!r} is not one graphkernel "
                              f"computes in ({', '.join(_NAME_TYPES)})")
    dtype = _NAME_TYPES[type_name]
    # A 0-d tensor has no dims: one element.
    count = int(np.prod(dims)) if dims else 1
    if len(content) != count * dtype.itemsize:
        raise CheckpointError(f"{where}: {len(content)} bytes for a {type_name} tensor of shape "
                              f"{tuple(dims)}")
    return np.frombuffer(content, dtype.newbyteorder("<")).astype(dtype).reshape(dims)


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
        params[name] = Parameter(tensor, name)
    if not params and data:
        raise CheckpointError(f"{path} holds no tensors: not a MindSpore checkpoint")
    return params


def load_param_into_net(net: Cell, parameter_dict: dict[str, Any],
                        strict_load: bool = False) -> tuple[list[str], list[str]]:
    """Copy values into the net's parameters by name. Returns (the net's parameters not
    loaded, the checkpoint's entries not used), as MindSpore 2.x does."""
    own = _by_name(net)
    used = set()
    for name, param in own.items():
        if name not in parameter_dict:
            continue
        value = parameter_dict[name]
        array = value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)
        if tuple(array.shape) != param.shape:
            raise CheckpointError(f"parameter {name!r}: the checkpoint's shape "
                                  f"{tuple(array.shape)} differs from the net's {param.shape}")
        param.set_data(array.astype(param.dtype))
        used.add(name)
    not_loaded = [n for n in own if n not in used]
    unused = [n for n in parameter_dict if n not in used]
    if strict_load and (not_loaded or unused):
        raise CheckpointError(f"strict load: parameters not loaded {not_loaded}, checkpoint "
                              f"entries unused {unused}")
    return not_loaded, unused
