"""Batch inference with an exported graph (a GKIR file) on a dask.distributed cluster.

    from distributed import Client
    from graphkernel.tools.dask_inference import ExportedGraph
    client = Client("tcp://scheduler:8786")        # or Client(LocalCluster(...))
    model = ExportedGraph.from_file("net.gkir").register(client)
    y = model.map_blocks(x)                         # x: a dask array, chunked along rows
    df_out = model.map_partitions(df, ["a", "b", "c"])  # a dask dataframe's columns as input

`register` sends the file's bytes to every worker once (a WorkerPlugin, so workers that join
later get it too); each worker process loads it once, compiles it on its first chunk through
its node's kernel cache, and keeps the compiled graph, keyed by the file's sha256, for every
later chunk. Tasks carry only that key.

A shape-generic export (a dynamic batch dimension: `Cell.set_inputs` with None, automatic
dynamic shapes, an ONNX `dim_param`) runs each chunk whole, whatever its row count: ragged
chunks and empty partitions need nothing, and each worker compiles once for every chunk size.
An export of a fixed batch runs a chunk's rows in batches of that size; a ragged last batch is
refused unless `pad=True` (zero rows added and their results dropped: right only when each
output row depends on its own input row alone, as in the usual inference nets, not after an op
that mixes rows). `pad` is still useful for such a graph (one exported before dynamic sizes, or
from a cell that cannot be shape-generic) and is ignored for a shape-generic one.
"""
from __future__ import annotations

import functools
import hashlib
import io
import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphkernel.errors import InputError
from graphkernel.frontend.export import LoadedGraph, load
from graphkernel.frontend.tensor import Tensor
from graphkernel.ir.types import SymSize
from graphkernel.nn.graph_cell import GraphCell

# Per worker process: the graphs registered with it (file sha256 -> bytes) and the cells
# loaded from them, each with a lock (a worker runs tasks on several threads; one compiled
# graph reuses its buffers between calls).
_FILES: dict[str, bytes] = {}
_CELLS: dict[str, tuple[GraphCell, threading.Lock]] = {}
_GUARD = threading.Lock()


def worker_cell(checksum: str) -> tuple[GraphCell, threading.Lock]:
    """The cell of a registered graph in this process, loaded on first use."""
    with _GUARD:
        found = _CELLS.get(checksum)
        if found is None:
            if checksum not in _FILES:
                raise InputError(f"graph {checksum[:12]} was not registered with this worker; "
                                 "call ExportedGraph.register(client) first")
            found = (GraphCell(load(io.BytesIO(_FILES[checksum]))), threading.Lock())
            _CELLS[checksum] = found
        return found


def loads_in_this_process() -> int:
    """How many graphs this process has loaded (tests check each worker loads once)."""
    return len(_CELLS)


def compiles_in_this_process(checksum: str) -> int:
    """How many times this process compiled the registered graph `checksum` (0: it ran none
    of its chunks); a shape-generic graph compiles once for every chunk size."""
    with _GUARD:
        found = _CELLS.get(checksum)
    return 0 if found is None else found[0].compile_count


def run_rows(cell: GraphCell, lock: threading.Lock, blocks: list[np.ndarray], output: int,
             pad: bool) -> np.ndarray:
    """Run the graph over the rows of `blocks` (one array per graph input), batch by batch."""
    signature = cell._loaded.signature
    if len(blocks) != len(signature):
        raise InputError(f"{cell._loaded.name} takes {len(signature)} input(s), got "
                         f"{len(blocks)}")
    rows = blocks[0].shape[0]
    batch: Any = signature[0][1].shape[0] if signature[0][1].shape else 0
    if isinstance(batch, SymSize):  # shape-generic: the whole chunk is one call
        batch = max(rows, 1)
    for block, (name, type_) in zip(blocks, signature):
        if not _is_numeric(block.dtype):
            raise InputError(f"input {name!r}: a chunk of dtype {block.dtype} is not numbers; "
                             f"the exported graph takes {type_.dtype}")
        if block.shape[0] != rows or len(block.shape) != type_.rank or any(
                not isinstance(want, SymSize) and want != have
                for want, have in zip(type_.shape[1:], block.shape[1:])):
            raise InputError(f"input {name!r}: a chunk of shape {block.shape} does not fit the "
                             f"exported {type_} (rows of {list(type_.shape[1:])})")
    if rows % batch and not pad:
        raise InputError(f"a chunk of {rows} rows is not a multiple of the exported batch of "
                         f"{batch}; rechunk, or pass pad=True if each output row depends on its "
                         "own input row only")
    outs = []
    for start in range(0, rows, batch):
        parts = []
        for block, (_, type_) in zip(blocks, signature):
            part = np.ascontiguousarray(block[start:start + batch], dtype=type_.dtype)
            if part.shape[0] < batch:
                filler = np.zeros((batch - part.shape[0], *part.shape[1:]), part.dtype)
                part = np.concatenate([part, filler])
            parts.append(Tensor(part))
        with lock:
            result = cell(*parts)
        result = result[output] if isinstance(result, tuple) else result
        outs.append(result.asnumpy()[:min(batch, rows - start)])
    if not outs:  # an empty chunk (a 0-row block, an empty partition): no rows out either
        out = cell._loaded.graph.outputs[output].tensor_type
        return np.zeros((0, *out.shape[1:]), out.dtype)
    return np.concatenate(outs)


def _is_numeric(dtype: Any) -> bool:
    """Whether values of `dtype` (numpy's or pandas') convert to a graph's number dtypes."""
    return getattr(dtype, "kind", "O") in "biuf"


def _check_columns(dtypes: Any, columns: list[str]) -> None:
    """Every chosen column exists and holds numbers (`dtypes`: a frame's column -> dtype)."""
    missing = [c for c in columns if c not in dtypes.index]
    if missing:
        raise InputError(f"column(s) {missing} are not in the dataframe (its columns: "
                         f"{list(dtypes.index)})")
    for column in columns:
        if not _is_numeric(dtypes[column]):
            raise InputError(f"column {column!r} holds {dtypes[column]} values, not numbers; "
                             "the graph's input is a matrix of numbers: convert or leave out "
                             "that column")


def _run_block(*blocks: np.ndarray, checksum: str, output: int, pad: bool) -> np.ndarray:
    cell, lock = worker_cell(checksum)
    return run_rows(cell, lock, list(blocks), output, pad)


def _run_partition(frame: Any, columns: list[str], names: list[str], checksum: str,
                   pad: bool) -> Any:
    import pandas as pd
    cell, lock = worker_cell(checksum)
    _check_columns(frame.dtypes, columns)  # a partition's real dtypes may differ from the meta
    matrix = frame[columns].to_numpy()
    out = run_rows(cell, lock, [matrix], 0, pad)
    return pd.DataFrame(out.reshape(len(frame), len(names)), index=frame.index, columns=names)


try:  # the plugin class needs distributed; the rest of this module does not
    from distributed import WorkerPlugin
except ImportError:  # pragma: no cover - distributed is in the test extra
    WorkerPlugin = object  # type: ignore[assignment,misc]  # dask absent: a stand-in base


class GraphPlugin(WorkerPlugin):
    """Sent to every worker once: makes the graph's bytes known there under their sha256."""

    def __init__(self, checksum: str, data: bytes) -> None:
        self.checksum = checksum
        self.data = data

    def setup(self, worker: Any) -> None:
        if hashlib.sha256(self.data).hexdigest() != self.checksum:
            raise InputError("the graph's bytes changed on the way to the worker")
        with _GUARD:
            _FILES[self.checksum] = self.data


@dataclass
class ExportedGraph:
    """A GKIR file to run on a Dask cluster (see the module's doc)."""

    data: bytes
    checksum: str
    loaded: LoadedGraph  # read here too: the signature and a check before anything is sent

    @classmethod
    def from_file(cls, path: str) -> ExportedGraph:
        with open(path, "rb") as fh:
            data = fh.read()
        return cls(data, hashlib.sha256(data).hexdigest(), load(io.BytesIO(data)))

    def register(self, client: Any) -> ExportedGraph:
        """Send the file to every worker of `client`'s cluster (and to later ones)."""
        client.register_plugin(GraphPlugin(self.checksum, self.data),
                               name=f"graphkernel-{self.checksum[:16]}")
        return self

    @property
    def batch(self) -> int | None:
        """The exported batch size; None for a shape-generic export (any row count)."""
        batch = self.loaded.signature[0][1].shape[0]
        return None if isinstance(batch, SymSize) else batch

    def _out_type(self, output: int) -> Any:
        graph = self.loaded.graph
        if not 0 <= output < len(graph.outputs):
            raise InputError(f"{self.loaded.name} has {len(graph.outputs)} output(s); "
                             f"output={output} is none of them")
        out = graph.outputs[output].tensor_type
        if not out.shape or not all(isinstance(d, int) for d in out.shape[1:]):
            raise InputError(f"{self.loaded.name} output {output} is {out}: Dask runs a graph "
                             "whose outputs are rows of a fixed size")
        return out

    def map_blocks(self, *arrays: Any, output: int = 0, pad: bool = False) -> Any:
        """The graph over dask arrays (one per input), chunked along rows only; a dask array
        of the chosen output, chunked like the inputs."""
        import dask.array as da
        signature = self.loaded.signature
        if len(arrays) != len(signature):
            raise InputError(f"{self.loaded.name} takes {len(signature)} input(s), got "
                             f"{len(arrays)} dask arrays")
        arrays = tuple(a.rechunk({i: -1 for i in range(1, a.ndim)}) for a in arrays)
        out = self._out_type(output)
        run = functools.partial(_run_block, checksum=self.checksum, output=output, pad=pad)
        return da.map_blocks(run, *arrays, dtype=out.dtype,
                             token=f"graphkernel-{self.loaded.name}",
                             chunks=(arrays[0].chunks[0], *((d,) for d in out.shape[1:])),
                             drop_axis=list(range(out.rank, arrays[0].ndim)) or None,
                             new_axis=list(range(arrays[0].ndim, out.rank)) or None,
                             meta=np.empty((0,) * out.rank, out.dtype))

    def map_partitions(self, frame: Any, columns: list[str], pad: bool = False,
                       prefix: str = "out") -> Any:
        """The graph over a dask dataframe: `columns` form the (rows, features) input; the
        result is a dask dataframe of the first output, columns `prefix0`, `prefix1`, ..."""
        import pandas as pd
        columns = list(columns)
        _check_columns(frame.dtypes, columns)
        out = self._out_type(0)
        width = math.prod(out.shape[1:])
        names = [f"{prefix}{i}" for i in range(width)]
        meta = pd.DataFrame({n: np.empty((0,), out.dtype) for n in names})
        return frame.map_partitions(_run_partition, columns, names, self.checksum, pad,
                                    meta=meta)
