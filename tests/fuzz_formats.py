"""The file formats tests/file_fuzz.py mutates, read and written at the byte level: zip archives
(GKIR exports and compile-cache entries) with their JSON manifest and .npy arrays, and
MindSpore's .ckpt protobuf; each with the mutations a recipe names (`mutate_npy`,
`mutate_ckpt`)."""
from __future__ import annotations

import hashlib
import io
import json
import struct
import warnings
import zipfile
from typing import Any


# -- zip archives (GKIR and .gkc) ---------------------------------------------------------------
def read_zip(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {name: zf.read(name) for name in zf.namelist()}


def write_zip(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        warnings.simplefilter("ignore")  # a name twice is one of the mutations
        for name, blob in entries:
            zf.writestr(name, blob)
    return buf.getvalue()


# A compile-cache entry keeps its graph's code text (these fields) in an entry of its own; the
# mutations see it as part of the manifest, one JSON document, as the reader joins them.
GRAPH_ENTRY, GRAPH_FIELDS = "graph.json", ("graph", "constants", "types")


def document(entries: dict[str, bytes]) -> dict[str, Any]:
    """The manifest, joined with the graph entry's fields where the archive has one."""
    manifest = json.loads(entries["manifest.json"])
    if GRAPH_ENTRY in entries:
        manifest.update(json.loads(entries[GRAPH_ENTRY]))
    return manifest  # type: ignore[no-any-return]


def forge(entries: list[tuple[str, bytes]], manifest: dict[str, Any]) -> bytes:
    """The archive with the manifest's sums and the checksum recomputed (a deliberate forgery:
    the mutation reaches the parser instead of the checksum check). Where the archive has a
    graph entry, the graph's fields of `manifest` (a `document`) are written there."""
    manifest = dict(manifest)
    if any(name == GRAPH_ENTRY for name, _ in entries):
        code = json.dumps({k: manifest.pop(k) for k in GRAPH_FIELDS if k in manifest}).encode()
        entries = [(n, code if n == GRAPH_ENTRY else b) for n, b in entries]
    manifest["entries"] = {name: hashlib.sha256(blob).hexdigest() for name, blob in entries
                           if name not in ("manifest.json", "checksum.sha256")}
    text = json.dumps(manifest).encode()  # NaN and Infinity as Python writes them
    out = [("manifest.json", text),
           ("checksum.sha256", (hashlib.sha256(text).hexdigest() + "\n").encode())]
    return write_zip(out + [(n, b) for n, b in entries
                            if n not in ("manifest.json", "checksum.sha256")])


def json_paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every path into a JSON value (dict keys and list indexes), the per-entry sums left out
    (forge recomputes them)."""
    out = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            if not path and key == "entries":
                continue
            out += json_paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value[:8]):  # long lists: their first items stand for all
            out += json_paths(item, path + (i,))
    return out


def json_parent(doc: Any, path: list) -> Any:
    """The object holding `path`'s last key. A path through a node's "type" where the type is
    an index into the document's type table ("types") changes that node's type alone: the node
    is given a copy of its table entry first (the forgery a recipe written against types
    written out per node meant)."""
    root = doc
    for key in path[:-1]:
        inner = doc[key]
        if key == "type" and type(inner) is int and isinstance(root.get("types"), list) and \
                0 <= inner < len(root["types"]):
            root["types"].append(json.loads(json.dumps(root["types"][inner])))
            inner = doc[key] = len(root["types"]) - 1
            inner = root["types"][inner]
        doc = inner
    return doc


def npy_bytes(header: dict[str, Any], data: bytes) -> bytes:
    """An .npy file with this header dictionary written as text (numpy refuses to write bad
    shapes; a forger does not)."""
    text = "{" + ", ".join(f"'{k}': {v!r}" for k, v in header.items()) + ", }"
    pad = 64 - (10 + len(text) + 1) % 64
    text = text + " " * pad + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1") + data


def npy_parts(blob: bytes) -> tuple[dict[str, Any], bytes]:
    import ast
    size = struct.unpack("<H", blob[8:10])[0]
    return ast.literal_eval(blob[10:10 + size].decode("latin1")), blob[10 + size:]


def mutate_npy(blob: bytes, what: str, value: Any) -> bytes:
    header, data = npy_parts(blob)
    if what == "shape":
        header["shape"] = tuple(value)
    elif what == "descr":
        header["descr"] = value
    elif what == "fortran":
        header["fortran_order"] = bool(value)
    elif what == "fill":  # every element this value, in the array's own dtype
        import numpy as np
        dtype = np.dtype(header["descr"])
        with np.errstate(all="ignore"):
            data = np.full(len(data) // max(dtype.itemsize, 1), value).astype(dtype).tobytes()
    elif what == "cut":
        data = data[:value]
    elif what == "grow":
        data = data + b"\x7f" * value
    return npy_bytes(header, data)


# -- checkpoints ------------------------------------------------------------------------------
def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value >> 7 else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _message(data: bytes) -> list[tuple[int, int, Any]]:
    """The fields of a well-formed message (the seed files only)."""
    out, pos = [], 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        if key & 7 == 0:
            value, pos = _read_varint(data, pos)
        else:
            size, pos = _read_varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        out.append((key >> 3, key & 7, value))
    return out


def ckpt_entries(data: bytes) -> list[dict[str, Any]]:
    """[{name, dims, type, content}] of a checkpoint written by save_checkpoint."""
    out = []
    for _, _, value in _message(data):
        entry: dict[str, Any] = {"dims": []}
        for number, _, v in _message(value):
            if number == 1:
                entry["name"] = v
            else:
                for n, _, t in _message(v):
                    if n == 1:
                        entry["dims"].append(t - (1 << 64) if t >= 1 << 63 else t)
                    elif n == 2:
                        entry["type"] = t.decode()
                    elif n == 3:
                        entry["content"] = t
        out.append(entry)
    return out


def ckpt_bytes(entries: list[dict[str, Any]]) -> bytes:
    out = b""
    for e in entries:
        tensor = b"".join(b"\x08" + _varint(d) for d in e["dims"]) + \
            _field(2, e["type"].encode("utf-8", "surrogateescape")) + _field(3, e["content"])
        out += _field(1, _field(1, e["name"]) + _field(2, tensor) + e.get("extra", b""))
    return out


def mutate_ckpt(data: bytes, i: int, what: str, value: Any) -> bytes:
    entries = ckpt_entries(data)
    e = entries[i % len(entries)]
    if what == "dims":
        e["dims"] = list(value)
    elif what == "type":
        e["type"] = value
    elif what == "negate":  # two dims negated: the element count, and so the size, fits
        dims = e["dims"] if len(e["dims"]) > 1 else [1, *e["dims"], 1][:2]
        e["dims"] = [-dims[0], -dims[1], *dims[2:]]
    elif what == "wrap":  # 2**32 * 2**32 wraps to 0 in int64: an empty content fits it
        e["dims"], e["content"] = [2 ** 32, 2 ** 32], b""
    elif what == "cut":
        e["content"] = e["content"][:value]
    elif what == "grow":
        e["content"] = e["content"] + b"\xff" * value
    elif what == "fill":  # the bytes of one value repeated: NaN, inf, -1, 2**31 ...
        import numpy as np
        with np.errstate(all="ignore"):
            one = np.array(value).astype({"Float16": "<f2", "Float32": "<f4", "Float64": "<f8",
                                          "Int32": "<i4", "Int64": "<i8", "Bool": "|u1"}
                                         [e["type"]]).tobytes()
        e["content"] = (one * (len(e["content"]) // len(one) + 1))[:len(e["content"])]
    elif what == "name":
        e["name"] = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    elif what == "swapname":
        other = entries[value % len(entries)]
        e["name"], other["name"] = other["name"], e["name"]
    elif what == "drop":
        entries.remove(e)
    elif what == "twice":
        entries.append(dict(e))
    elif what == "extra":  # a field MindSpore's readers skip: a varint or a group
        e["extra"] = bytes(value)
    return ckpt_bytes(entries)
