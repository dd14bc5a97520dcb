"""Checkpoints in MindSpore's `.ckpt` format: `save_checkpoint(net, file)`,
`load_checkpoint(file) -> {name: Parameter}`, `load_param_into_net(net, params)`.

A `.ckpt` file is one protobuf message of MindSpore's checkpoint.proto (checkpoint_proto.py
builds its message classes with the `protobuf` library): a Checkpoint holds Values, each a tag
(the parameter's name) and a TensorProto (dims, tensor_type, tensor_content). Fields graphkernel
does not know (MindSpore's map tensors, later additions) are skipped when reading, as protobuf
skips them. tests/test_layers.py checks the bytes against checkpoint.proto spelled out by hand;
bench/mindspore_parity.py loads files both ways with MindSpore 2.10 itself.

Entries are keyed by `Parameter.name`, as MindSpore keys them: a net's parameters keep their
names however the net is wrapped (TrainOneStepCell, WithLossCell), so a checkpoint saved from a
training step loads into the bare network. A checkpoint file is data from anywhere: protobuf
checks the wire format, and here every size, dimension and type in it is checked, and loading
refuses a value a parameter cannot hold."""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from graphkernel.common.checkpoint_proto import Checkpoint
from graphkernel.errors import InputError
from graphkernel.frontend.cell import Cell
from graphkernel.frontend.tensor import Parameter, Tensor

# MindSpore's tensor_type names.
_TYPE_NAMES: dict[np.dtype, str] = {np.dtype("float16"): "Float16", np.dtype("float32"): "Float32",
               np.dtype("float64"): "Float64", np.dtype("int32"): "Int32",
               np.dtype("int64"): "Int64", np.dtype("bool"): "Bool"}
_NAME_TYPES: dict[str, np.dtype] = {v: k for k, v in _TYPE_NAMES.items()}
_MAX_RANK = 32  # numpy's arrays have at most 64 dimensions; no parameter has this many


class CheckpointError(InputError):
    """A checkpoint file that cannot be read, or parameters that do not fit a network."""


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
    message = Checkpoint()
    for name, array in _named_arrays(save_obj):
        if array.dtype not in _TYPE_NAMES:
            raise CheckpointError(f"parameter {name!r} has dtype {array.dtype}, which a "
                                  "checkpoint here cannot hold")
        value = message.value.add()
        value.tag = name.encode()
        value.tensor.dims.extend(array.shape)
        value.tensor.tensor_type = _TYPE_NAMES[array.dtype].encode()
        value.tensor.tensor_content = np.ascontiguousarray(array).astype(
            array.dtype.newbyteorder("<")).tobytes()
    data = message.SerializeToString()
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".ckpt-", dir=folder)
    except OSError as exc:
        raise CheckpointError(f"cannot save checkpoint {path}: {exc.strerror} "
                              f"(folder {folder})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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

def _tensor(tensor: Any, where: str) -> np.ndarray:
    """The array a TensorProto holds, after checking that its type, dims and bytes agree."""
    dims = list(tensor.dims)
    type_name = tensor.tensor_type.decode("utf-8", "replace")
    content = tensor.tensor_content
    if type_name not in _NAME_TYPES:
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
    if not data:
        raise CheckpointError(f"{path} is empty: not a checkpoint (an interrupted copy?)")
    message = Checkpoint()
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise CheckpointError(f"{path}: not a MindSpore checkpoint, or a damaged one "
                              f"(protobuf: {exc})") from None
    params: dict[str, Parameter] = {}
    for value in message.value:
        if not value.HasField("tag") or not value.HasField("tensor"):
            continue  # a map tensor or another entry graphkernel has no use for
        name = value.tag.decode("utf-8", "replace")
        tensor = _tensor(value.tensor, f"{path}: {name}")
        if name in params:
            raise CheckpointError(f"{path}: the entry {name!r} appears twice (altered file?)")
        params[name] = Parameter(tensor, name)
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
