"""ONNX models in graphkernel: `graphkernel.load` recognises an ONNX model by its content (beside
GKIR exports) and builds the graph `nn.GraphCell` runs (onnx/importer.py); `backend` is an
`onnx.backend.base.Backend` for ONNX's own conformance tests.

The `onnx` package is an optional extra (`pip install graphkernel[onnx]`): this module imports it
only when an ONNX model is actually loaded.
"""
from __future__ import annotations

import io
import os
import zipfile
from typing import Any, BinaryIO

from graphkernel.errors import FormatError
from graphkernel.frontend import export as export_module
from graphkernel.frontend.export import LoadedGraph

_ZIP_MAGIC = b"PK\x03\x04"


def _is_onnx_proto(source: Any) -> bool:
    return type(source).__name__ == "ModelProto" and type(source).__module__.startswith("onnx")


def load(file_name: Any, trust_prebuilt: bool = False) -> LoadedGraph:
    """Load a GKIR export (graphkernel.export) or an ONNX model, told apart by content: a
    path, a binary file object, the file's bytes, or an `onnx.ModelProto`. Run the result with
    `nn.GraphCell(graphkernel.load(...))`. `trust_prebuilt` concerns GKIR exports only."""
    from graphkernel.onnx import importer  # the onnx package is needed from here on only

    if _is_onnx_proto(file_name):
        return importer.load_model(file_name)
    if isinstance(file_name, (bytes, bytearray, memoryview)):
        data = bytes(file_name)
        if data.startswith(_ZIP_MAGIC):
            return export_module.load(_bytes_file(data), trust_prebuilt)
        return importer.load_bytes(data, "<ONNX bytes>", folder=None)
    if isinstance(file_name, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(file_name))
        if _starts_like_zip(path) or zipfile.is_zipfile(path) or not os.path.isfile(path):
            # its errors name a missing file as the caller wrote it
            return export_module.load(os.fspath(file_name), trust_prebuilt)
        return importer.load_path(path)
    if hasattr(file_name, "read"):
        return _load_file_object(file_name, trust_prebuilt)
    raise FormatError(f"graphkernel.load takes a path, a binary file, bytes or an "
                      f"onnx.ModelProto, got {type(file_name).__name__}")


def _starts_like_zip(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == _ZIP_MAGIC
    except OSError:
        return False


def _load_file_object(file: BinaryIO, trust_prebuilt: bool) -> LoadedGraph:
    from graphkernel.onnx import importer

    start = file.tell() if file.seekable() else None
    head = file.read(4)
    if start is not None:
        file.seek(start)
        if head == _ZIP_MAGIC:
            return export_module.load(file, trust_prebuilt)
    data = head + file.read() if start is None else file.read()
    if not isinstance(data, bytes):
        raise FormatError(f"graphkernel.load: {getattr(file, 'name', 'the file')} is not opened "
                          "in binary mode")
    if data.startswith(_ZIP_MAGIC):
        return export_module.load(_bytes_file(data), trust_prebuilt)
    name = str(getattr(file, "name", "<ONNX file object>"))
    return importer.load_bytes(data, name, folder=None)


def _bytes_file(data: bytes) -> io.BytesIO:
    """Bytes as the binary file object the GKIR reader takes."""
    stream = io.BytesIO(data)
    stream.name = "<export bytes>"
    return stream


def export(net: Any, *inputs: Any, file_name: str, file_format: str = export_module.FORMAT,
           **options: Any) -> str:
    """MindSpore's `export`: `file_format="GKIR"` (the default) writes graphkernel's own format
    (frontend/export.py, with `include_library` and `options`); `"ONNX"` writes the network's
    forward graph as a standard ONNX model (onnx/exporter.py). Returns the path written."""
    if isinstance(file_format, str) and file_format.upper() == "ONNX":
        if options:
            raise FormatError(f"export to ONNX takes no {', '.join(sorted(options))}")
        from graphkernel.onnx import exporter  # the onnx package is needed from here on only

        return exporter.export_onnx(net, *inputs, file_name=file_name)
    return export_module.export(net, *inputs, file_name=file_name, file_format=file_format,
                                **options)


__all__ = ["export", "load"]
