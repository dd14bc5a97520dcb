"""The container of a GKIR file (frontend/export.py) and of a compile-cache entry
(frontend/compile_cache.py): a zip of stored (uncompressed) entries, `manifest.json` listing the
sha256 of every other entry, and `checksum.sha256` holding the manifest's own sha256. Written
under a temporary name and renamed (readers see the old file or the whole new one); read with
every size bounded and every sum checked, so a truncated or altered file is a FormatError."""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import tempfile
import zipfile
from typing import Any, BinaryIO

import numpy as np

from graphkernel.errors import FormatError, GraphKernelError
from graphkernel.ir.types import SUPPORTED_DTYPES

MANIFEST, CHECKSUM = "manifest.json", "checksum.sha256"
MAX_MANIFEST = 256 << 20


def npy(array: np.ndarray) -> bytes:
    """`array` in numpy's format (C order, no pickles)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(array, order="C"), allow_pickle=False)
    return buf.getvalue()


def write(path: str, manifest: dict[str, Any], entries: dict[str, bytes], prefix: str,
          indent: int | None = 1) -> None:
    """Write `manifest` (given the sums of `entries` as its "entries") and `entries` to `path`
    atomically: a temporary file named `prefix`... in the same folder, then a rename."""
    manifest = {**manifest, "entries": {name: hashlib.sha256(blob).hexdigest()
                                        for name, blob in entries.items()}}
    text = json.dumps(manifest, indent=indent).encode()
    entries = {MANIFEST: text, CHECKSUM: (hashlib.sha256(text).hexdigest() + "\n").encode(),
               **entries}
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as fh, zipfile.ZipFile(fh, "w", zipfile.ZIP_STORED) as zf:
            for name, blob in entries.items():
                zf.writestr(name, blob)
        os.replace(tmp, path)  # readers see the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_entries(path: str, source: str | BinaryIO, kind: str) -> dict[str, bytes]:
    """Every entry of the zip at `source` (`path` names it in errors; `kind` says what the file
    should be)."""
    try:
        size = _size(source)
        with zipfile.ZipFile(source) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            if len(set(names)) != len(names):
                raise FormatError(f"{path}: an entry appears twice (altered file)")
            out = {}
            for info in infos:
                # Stored entries only: sizes are what the file holds (no zip bombs).
                if info.compress_type != zipfile.ZIP_STORED or info.file_size > MAX_MANIFEST * 64:
                    raise FormatError(f"{path}: entry {info.filename!r} is compressed or "
                                      "oversized; graphkernel writes stored entries")
                if info.compress_size > size - info.header_offset:
                    raise FormatError(f"{path}: entry {info.filename!r} declares "
                                      f"{info.compress_size} bytes, more than the file holds "
                                      f"after it ({max(size - info.header_offset, 0)}): a "
                                      "truncated or altered file")
                out[info.filename] = zf.read(info)
            return out
    except FileNotFoundError:
        raise FormatError(f"{path}: no such file") from None
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as exc:
        if isinstance(exc, GraphKernelError):
            raise
        reason = str(exc) or f"{type(exc).__name__} while reading it"  # EOFError() says nothing
        raise FormatError(f"{path} is not a readable {kind} file (truncated or corrupted?): "
                          f"{reason}") from None


def _size(source: str | BinaryIO) -> int:
    """The length of the file at `source` in bytes (a file object is left where it was)."""
    if isinstance(source, (str, os.PathLike)):
        return os.path.getsize(source)
    here = source.tell()
    end = source.seek(0, os.SEEK_END)
    source.seek(here)
    return end


def parse_manifest(path: str, entries: dict[str, bytes], kind: str) -> dict[str, Any]:
    """The manifest as a JSON object (not yet checked against its checksum: see
    `check_sums`)."""
    if MANIFEST not in entries:
        raise FormatError(f"{path} has no {MANIFEST}: not a {kind} file")
    try:
        manifest = json.loads(entries[MANIFEST])
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{path}: {MANIFEST} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict):
        raise FormatError(f"{path} is not a {kind} file")
    return manifest


def check_sums(path: str, entries: dict[str, bytes], manifest: dict[str, Any],
               entry_name: re.Pattern[str]) -> None:
    """The manifest matches its checksum, lists exactly the other entries (each named as
    `entry_name` allows) and each entry matches its sum."""
    want = entries.get(CHECKSUM, b"").decode("ascii", "replace").strip()
    if hashlib.sha256(entries[MANIFEST]).hexdigest() != want:
        raise FormatError(f"{path}: the manifest does not match its checksum (altered or "
                          "corrupted file)")
    sums = manifest.get("entries")
    if not isinstance(sums, dict):
        raise FormatError(f"{path}: the manifest lists no entries")
    extra = set(entries) - set(sums) - {MANIFEST, CHECKSUM}
    extra |= {name for name in sums if not entry_name.fullmatch(str(name))}
    if extra:
        raise FormatError(f"{path}: unexpected entries {sorted(extra)} (altered file)")
    for name, digest in sums.items():
        if name not in entries:
            raise FormatError(f"{path}: entry {name!r} is missing (truncated file?)")
        if hashlib.sha256(entries[name]).hexdigest() != digest:
            raise FormatError(f"{path}: entry {name!r} does not match its checksum (altered or "
                              "corrupted file)")


ARRAY_NAME = re.compile(r"arrays/[a-z]+[0-9]+\.npy")


# The header numpy writes for a C-order array (format 1.0): read without np.load's parser, which
# costs ~40 us an array (a warm compile of BERT-tiny reads 43 constants).
_NPY_HEADER = re.compile(rb"\x93NUMPY\x01\x00..\{'descr': '([<>|][a-z][0-9]{1,2})', "
                         rb"'fortran_order': False, 'shape': \(((?:[0-9]+, ?)*[0-9]*)\), \} *\n",
                         re.DOTALL)


_MAX_RANK = 32  # numpy allows 64 (32 before numpy 2); no graph value has this many


def _plain_npy(blob: bytes) -> np.ndarray | str | None:
    """A C-order array of a supported dtype as np.save writes it; or what is wrong with such
    an entry (its header's shape past its bytes, too many dimensions); or None when the entry
    is not in that form (_other_npy decides)."""
    match = _NPY_HEADER.match(blob)
    if match is None:
        return None
    try:
        dtype = np.dtype(match[1].decode())
    except TypeError:
        return None
    if dtype not in SUPPORTED_DTYPES:
        return None
    shape = tuple(int(d) for d in match[2].split(b",") if d.strip())
    return _dense(blob[match.end():], dtype, shape)


def _dense(data: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | str:
    """`data` as a C-order array of `shape`, or why the header's shape does not fit the bytes.
    Checked before any array is made: np.load allocates the declared size first, and numpy's
    int64 product of a forged shape wraps around (Python's exact integers here)."""
    if len(shape) > _MAX_RANK:
        return f"its header declares {len(shape)} dimensions, more than {_MAX_RANK}"
    need = dtype.itemsize * math.prod(shape)
    if len(data) != need:
        return (f"its header declares shape {shape} of {dtype} ({need} bytes), but "
                f"{len(data)} bytes follow")
    return np.frombuffer(data, dtype).reshape(shape).copy()


def _other_npy(blob: bytes) -> np.ndarray | str:
    """An entry in another form np.save writes (Fortran order, another header version), or
    why it is not one: its header read and checked against its bytes before any array is
    made, never with pickles."""
    stream = io.BytesIO(blob)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0) else
                       np.lib.format.read_array_header_2_0)
        shape, fortran, dtype = read_header(stream)
    except (ValueError, OverflowError, OSError, EOFError, TypeError, SyntaxError) as exc:
        return f"not an npy array ({exc})"
    if dtype not in SUPPORTED_DTYPES:
        return f"it has unsupported dtype {dtype}"
    out = _dense(blob[stream.tell():], dtype, tuple(shape[::-1] if fortran else shape))
    if isinstance(out, str) or not fortran:
        return out
    return np.ascontiguousarray(out.T)


def constant_arrays(entries: dict[str, bytes], manifest: dict[str, Any], path: str
                    ) -> dict[str, np.ndarray]:
    """The arrays the manifest's constants name (ir/serialize.py's "constants" list)."""
    constants = manifest.get("constants")
    if not isinstance(constants, list):
        raise FormatError(f"{path}: the manifest has no constants list")
    return {rec["array"]: array(entries, rec.get("array"), path)
            for rec in constants if isinstance(rec, dict) and "array" in rec}


def array(entries: dict[str, bytes], key: Any, path: str) -> np.ndarray:
    """The array entry `arrays/<key>.npy`, read without pickles, of a supported dtype, C order."""
    name = f"arrays/{key}.npy"
    if not isinstance(key, str) or name not in entries:
        raise FormatError(f"{path}: array {key!r:.40} is missing")
    out = _plain_npy(entries[name])
    if out is None:
        out = _other_npy(entries[name])
    if isinstance(out, str):
        raise FormatError(f"{path}: array {key} is unreadable: {out}")
    return out
