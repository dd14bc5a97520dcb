"""Plan records: a warm build finds its kernel library from the plan, without writing the C
(backends/c/backend.py computes the plan key and says what a record holds).

A record is a file in the kernel cache anyone with the folder may have written: `read` checks
its size, that it is JSON, its format, version and the key it was written for; the caller checks
every field before use."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from typing import Any

from graphkernel.backends.c.cache import STALE_SECONDS, ensure_private_dir, is_key
from graphkernel.backends.c.records import read_bounded_json
from graphkernel.errors import CacheError

PLAN_FOLDER = "plans"  # under the cache folder; library trimming skips sub-folders
PLAN_FORMAT = "graphkernel plan record"
PLAN_VERSION = 1
PLAN_MAX_BYTES = 1 << 20  # a record names a library and its kernels: larger is not one
MAX_PLAN_RECORDS = 4000  # beyond this many the least recently used go when one is written


def plan_record_path(folder: str, plan_key: str) -> str:
    return os.path.join(folder, PLAN_FOLDER, plan_key + ".json")


def read_plan_record(folder: str, plan_key: str) -> tuple[dict[str, Any] | None, str | None]:
    """The record written under `plan_key` (`backends/c/backend.py` says what it holds):
    (its fields, None); (None, None) when there is none; (None, why) when the file is not a
    record of this format for this key. Its fields are data from anyone: the caller checks
    each before use."""
    if not is_key(plan_key):
        raise CacheError(f"not a plan key: {plan_key!r:.40}")
    path = plan_record_path(folder, plan_key)
    record, why = read_bounded_json(path, PLAN_MAX_BYTES, "plan record")
    if record is None:
        return None, None if why is None else f"{path} is {why}"
    if not isinstance(record, dict) or record.get("format") != PLAN_FORMAT or \
            record.get("version") != PLAN_VERSION:
        return None, f"{path} is not a {PLAN_FORMAT} of version {PLAN_VERSION}"
    if record.get("plan_key") != plan_key:
        return None, (f"{path} was written for plan {record.get('plan_key')!r:.40}, not "
                      f"{plan_key} (a swapped or copied record)")
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: trimming removes the oldest first
    return record, None


def write_plan_record(folder: str, plan_key: str, fields: dict[str, Any]) -> str | None:
    """Write the record for `plan_key` (atomically, in a private folder); None, or why it was
    not written (a folder that cannot take it is no error: the next build writes the C
    again)."""
    record = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "plan_key": plan_key, **fields}
    try:
        plans = ensure_private_dir(os.path.join(folder, PLAN_FOLDER))
        fd, tmp = tempfile.mkstemp(prefix=f".{plan_key}.", suffix=".tmp", dir=plans)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(record, fh, sort_keys=True)
            os.replace(tmp, plan_record_path(folder, plan_key))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except (OSError, CacheError) as exc:
        return f"plan record not stored: {exc}"
    _trim_plan_records(plans)
    return None


def _trim_plan_records(plans: str, limit: int = MAX_PLAN_RECORDS) -> None:
    """Keep at most `limit` records, least recently used removed first; a temporary file
    older than any write (its writer was killed) goes too."""
    try:
        names = os.listdir(plans)
    except OSError:
        return
    now = time.time()
    dated = []
    for name in names:
        path = os.path.join(plans, name)
        with contextlib.suppress(OSError):
            mtime = os.stat(path, follow_symlinks=False).st_mtime
            if name.startswith(".") and now - mtime > STALE_SECONDS:
                os.unlink(path)
            elif name.endswith(".json"):
                dated.append((mtime, path))
    for _, path in sorted(dated)[:max(len(dated) - limit, 0)]:
        with contextlib.suppress(OSError):
            os.unlink(path)
