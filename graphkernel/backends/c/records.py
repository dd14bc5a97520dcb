"""Small versioned JSON records this machine's measurements leave in the kernel cache (tuning
choices per kernel, backends/c/tuning.py; the machine's calibration, backends/c/calibration.py;
the files of library timings, blas_choice.py and onednn_choice.py).

A record is data from a file anyone with the cache folder may have written: `read_record`
checks its size, that it is JSON, its format name, version, key and CPU model, and says why
when one of them fails; the caller then checks each value it uses, by type and range."""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any

RECORD_MAX_BYTES = 1 << 16  # a record is a few hundred bytes: anything larger is not one


def read_bounded_json(path: str, max_bytes: int, what: str) -> tuple[Any, str | None]:
    """The JSON value in the file at `path`, read no further than `max_bytes`: (value, None);
    (None, None) when there is no file; (None, why) when it is unreadable, larger than
    `max_bytes`, not JSON, or JSON's null (so None always means no file or a reason). `what`
    names the file in the reasons ("tuning record")."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if len(data) > max_bytes:
        return None, f"larger than {max_bytes} bytes: not a {what}"
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None, "not JSON (truncated or corrupt)"
    return (value, None) if value is not None else (None, f"not a graphkernel {what}")


def read_record(path: str, record_format: str, version: int, key: str, cpu: str,
                what: str, keyed_by: str) -> tuple[dict[str, Any] | None, str | None]:
    """The record at `path` as a dict: (record, None); (None, None) when there is no file;
    (None, why) when there is one that is not a `record_format` record of `version` for `key`
    measured on CPU `cpu`. `what` names the record in the reasons ("tuning record"), `keyed_by`
    what its key stands for ("kernel or toolchain")."""
    record, why = read_bounded_json(path, RECORD_MAX_BYTES, what)
    if record is None:
        return None, why
    if not isinstance(record, dict) or record.get("format") != record_format:
        return None, f"not a graphkernel {what}"
    found = record.get("version")
    if found != version:
        return None, f"version {found!r:.20}; this graphkernel reads version {version}"
    if record.get("key") != key:
        return None, f"recorded for another {keyed_by} (its key differs)"
    if record.get("cpu_model") != cpu:
        return None, f"measured on another CPU ({record.get('cpu_model')!r:.60}, here {cpu!r})"
    return record, None


def write_record(folder: str, key: str, record: dict[str, Any]) -> str:
    """Store `record` as `folder`/KEY.json, atomically: a reader sees the old record or the
    new one, never half of one."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=key + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1, sort_keys=True)
        path = os.path.join(folder, key + ".json")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_timing_rows(path: str, record_format: str, version: int,
                     what: str) -> tuple[list[Any], str | None]:
    """The rows of a file of library timings (blas_choice.py, onednn_choice.py): ([], None) for
    no file; ([], why) for one that is unreadable or not a `record_format` file of `version`
    (`what` names it in the reason); each row is still the caller's to check."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return [], None
    except (OSError, ValueError) as exc:
        return [], f"the {what} {path} is unreadable ({exc})"
    if not isinstance(data, dict) or data.get("format") != record_format or \
            data.get("version") != version or not isinstance(data.get("records"), list):
        return [], f"the {what} {path} is not a {record_format} file of version {version}"
    return data["records"], None
