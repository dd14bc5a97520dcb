"""MindSpore's one-machine dataset pipeline: sources (`NumpySlicesDataset`, `GeneratorDataset`)
and the operations chained on them (`.shuffle`, `.batch`, `.map`, `.repeat`), read through
`create_tuple_iterator` / `create_dict_iterator`.

A dataset is a description: each pass over it walks the chain again as Python generators of
rows (a row is a tuple of numpy arrays, one per column). An iterator runs that walk in a
background thread that keeps up to `config.get_prefetch_size()` rows ready in a bounded queue,
so the next batch is prepared while a training step runs. An error raised in the pipeline (a
source, a map operation, a batch of ragged rows) is re-raised in the consumer as a
`DatasetError` naming where it came from; a consumer that stops early (a `break`, a dropped
iterator) stops the thread."""
from __future__ import annotations

import queue
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from graphkernel.dataset import config
from graphkernel.errors import GraphKernelError, InputError
from graphkernel.frontend.tensor import Tensor

Row = tuple[np.ndarray, ...]


class DatasetError(GraphKernelError, RuntimeError):
    """A dataset pipeline failed while producing rows: a source or a map operation raised, or
    a row does not fit (column count, batch of different shapes)."""


class Dataset:
    """A node of the pipeline; subclasses give `_rows()` (one pass) and the column names."""

    def __init__(self, column_names: Sequence[str]) -> None:
        self._columns = list(column_names)

    # -- what a dataset is --------------------------------------------------------------------
    def _rows(self) -> Iterator[Row]:
        raise NotImplementedError

    def get_col_names(self) -> list[str]:
        """The columns' names, in row order."""
        return list(self._columns)

    def get_dataset_size(self) -> int:
        """Rows (batches, after `.batch`) in one pass; -1 for a dataset repeated forever."""
        return sum(1 for _ in self._rows())

    # -- operations: each returns a new dataset over this one ---------------------------------
    def shuffle(self, buffer_size: int) -> Dataset:
        """Rows in random order, drawn from a buffer of `buffer_size` rows (MindSpore's)."""
        return ShuffleDataset(self, buffer_size)

    def batch(self, batch_size: int, drop_remainder: bool = False,
              num_parallel_workers: int | None = None) -> Dataset:
        """`batch_size` rows stacked into one (each column gains a leading axis); the last,
        shorter batch is kept unless `drop_remainder`."""
        return BatchDataset(self, batch_size, drop_remainder)

    def map(self, operations: Any, input_columns: str | Sequence[str] | None = None,
            output_columns: str | Sequence[str] | None = None,
            num_parallel_workers: int | None = None) -> Dataset:
        """Apply `operations` (a callable or a list applied in turn) to `input_columns` (the
        first column when not given); their results become `output_columns` (the input
        columns' names when not given)."""
        return MapDataset(self, operations, input_columns, output_columns)

    def repeat(self, count: int | None = None) -> Dataset:
        """The dataset `count` times over; None or -1 repeats forever."""
        return RepeatDataset(self, count)

    # -- reading ------------------------------------------------------------------------------
    def create_tuple_iterator(self, columns: Sequence[str] | None = None, num_epochs: int = -1,
                              output_numpy: bool = False, do_copy: bool = True
                              ) -> TupleIterator:
        """Rows as lists of Tensors (numpy arrays with output_numpy), the `columns` given
        (all when None). Each `for` over the iterator is one pass; `num_epochs` passes at
        most (-1: no limit)."""
        return TupleIterator(self, columns, num_epochs, output_numpy)

    def create_dict_iterator(self, num_epochs: int = -1, output_numpy: bool = False,
                             do_copy: bool = True) -> DictIterator:
        """Rows as {column name: Tensor} (numpy arrays with output_numpy)."""
        return DictIterator(self, None, num_epochs, output_numpy)

    def __iter__(self) -> Iterator[list[Any]]:
        return iter(self.create_tuple_iterator(num_epochs=1))


def _as_row(item: Any, columns: list[str], where: str) -> Row:
    """A source's item as a row: a tuple (or list) of values, one per column, or a single value
    for a one-column dataset."""
    if isinstance(item, tuple) or (isinstance(item, list) and len(columns) != 1):
        values = tuple(item)
    else:
        values = (item,)
    if len(values) != len(columns):
        raise DatasetError(f"{where} has {len(values)} column(s) but the dataset names "
                           f"{len(columns)}: {columns}")
    return tuple(np.asarray(v) for v in values)


def _shuffle_flag(shuffle: Any, owner: str) -> bool:
    if shuffle is None:
        return True  # MindSpore's default for a random-access source: random order
    if not isinstance(shuffle, bool):
        raise InputError(f"{owner}: shuffle must be True, False or None, got {shuffle!r}")
    return shuffle


def _count(value: Any, name: str, owner: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{owner}: {name} must be an int >= {minimum}, got {value!r}")
    return int(value)


class NumpySlicesDataset(Dataset):
    """Rows sliced along the first axis of `data`: a list (one column), a tuple of arrays (one
    column each, "column_0", ...) or a dict (a column per key). Shuffled by default, as
    MindSpore's."""

    def __init__(self, data: Any, column_names: Sequence[str] | None = None,
                 num_samples: int | None = None, num_parallel_workers: int = 1,
                 shuffle: bool | None = None) -> None:
        if isinstance(data, dict):
            names, arrays = list(data), [np.asarray(v) for v in data.values()]
        elif isinstance(data, tuple):
            names, arrays = [f"column_{i}" for i in range(len(data))], \
                [np.asarray(v) for v in data]
        elif isinstance(data, (list, np.ndarray)):
            names, arrays = ["column_0"], [np.asarray(data)]
        else:
            raise InputError("NumpySlicesDataset takes a list, a tuple of arrays or a dict of "
                             f"arrays, got {type(data).__name__}")
        if column_names is not None:
            column_names = [column_names] if isinstance(column_names, str) else \
                list(column_names)
            if len(column_names) != len(arrays):
                raise InputError(f"NumpySlicesDataset: {len(column_names)} column name(s) "
                                 f"{column_names} for {len(arrays)} column(s)")
            names = column_names
        if not arrays or any(a.ndim == 0 for a in arrays):
            raise InputError("NumpySlicesDataset: every column needs a first axis to slice "
                             "along (a scalar cannot be sliced)")
        lengths = {name: len(a) for name, a in zip(names, arrays)}
        if len(set(lengths.values())) != 1:
            raise InputError("NumpySlicesDataset: columns of different lengths along the "
                             f"first axis: {lengths}")
        super().__init__(names)
        self._arrays = arrays
        self._size = len(arrays[0])
        if num_samples is not None:
            self._size = min(self._size, _count(num_samples, "num_samples",
                                                "NumpySlicesDataset"))
        self._shuffle = _shuffle_flag(shuffle, "NumpySlicesDataset")
        self._rng = config.new_rng()

    def _rows(self) -> Iterator[Row]:
        total = len(self._arrays[0])
        order = self._rng.permutation(total)[:self._size] if self._shuffle else \
            range(self._size)
        for i in order:
            yield tuple(a[i] for a in self._arrays)

    def get_dataset_size(self) -> int:
        return self._size


class GeneratorDataset(Dataset):
    """Rows from Python: `source` is a generator function (called for each pass), an iterable,
    or a random-access object (`__getitem__` and `__len__`, read in shuffled order unless
    shuffle=False). Each item is a tuple of arrays, one per name in `column_names`."""

    def __init__(self, source: Any, column_names: str | Sequence[str] | None = None,
                 column_types: Any = None, schema: Any = None, num_samples: int | None = None,
                 num_parallel_workers: int = 1, shuffle: bool | None = None,
                 python_multiprocessing: bool = True) -> None:
        if column_names is None:
            column_names = ["column_0"]
        names = [column_names] if isinstance(column_names, str) else list(column_names)
        if not names or not all(isinstance(n, str) for n in names):
            raise InputError(f"GeneratorDataset: column_names must be a non-empty list of str, "
                             f"got {column_names!r}")
        super().__init__(names)
        self._random_access = hasattr(source, "__getitem__") and hasattr(source, "__len__")
        if not (self._random_access or callable(source) or hasattr(source, "__iter__")):
            raise InputError("GeneratorDataset: source must be a generator function, an "
                             "iterable, or a random-access object (__getitem__ and __len__), "
                             f"got {type(source).__name__}")
        self._source = source
        self._num_samples = None if num_samples is None else \
            _count(num_samples, "num_samples", "GeneratorDataset")
        self._shuffle = _shuffle_flag(shuffle, "GeneratorDataset") and self._random_access
        if shuffle and not self._random_access:
            raise InputError("GeneratorDataset: shuffle=True needs a random-access source "
                             "(__getitem__ and __len__); shuffle a generator's rows with "
                             ".shuffle(buffer_size)")
        self._rng = config.new_rng()
        self._size: int | None = None
        self._passes_begun = False

    def _items(self) -> Iterator[Any]:
        if self._random_access:
            n = len(self._source)
            order = self._rng.permutation(n) if self._shuffle else range(n)
            return (self._source[int(i)] for i in order)
        if callable(self._source):
            return iter(self._source())
        if iter(self._source) is self._source:  # an iterator (a generator object): one pass
            if self._passes_begun:
                raise DatasetError("GeneratorDataset: the source is an iterator, already read "
                                   "once: a second pass (epoch, repeat, get_dataset_size) "
                                   "would be empty; pass the generator function (gen, not "
                                   "gen()) or a list")
            self._passes_begun = True
        return iter(self._source)

    def _rows(self) -> Iterator[Row]:
        items = self._items()
        n = 0
        while self._num_samples is None or n < self._num_samples:
            try:
                item = next(items)
            except StopIteration:
                return
            except Exception as exc:
                raise DatasetError(f"GeneratorDataset: the source raised {type(exc).__name__} "
                                   f"at row {n}: {exc}") from exc
            yield _as_row(item, self._columns, f"GeneratorDataset: source row {n}")
            n += 1

    def get_dataset_size(self) -> int:
        if self._random_access:
            n = len(self._source)
            return n if self._num_samples is None else min(n, self._num_samples)
        if self._size is None:  # a generator: counted once, as MindSpore does
            self._size = super().get_dataset_size()
        return self._size


class _Derived(Dataset):
    def __init__(self, child: Dataset, column_names: Sequence[str] | None = None) -> None:
        if not isinstance(child, Dataset):
            raise InputError(f"{type(self).__name__} reads a dataset, got "
                             f"{type(child).__name__}")
        super().__init__(child.get_col_names() if column_names is None else column_names)
        self._child = child


class ShuffleDataset(_Derived):
    def __init__(self, child: Dataset, buffer_size: int) -> None:
        super().__init__(child)
        self._buffer_size = _count(buffer_size, "buffer_size", "shuffle", minimum=2)
        self._rng = config.new_rng()

    def _rows(self) -> Iterator[Row]:
        buffer: list[Row] = []
        for row in self._child._rows():
            if len(buffer) < self._buffer_size:
                buffer.append(row)
                continue
            k = int(self._rng.integers(len(buffer)))
            yield buffer[k]
            buffer[k] = row
        for k in self._rng.permutation(len(buffer)):
            yield buffer[k]

    def get_dataset_size(self) -> int:
        return self._child.get_dataset_size()


class BatchDataset(_Derived):
    def __init__(self, child: Dataset, batch_size: int, drop_remainder: bool) -> None:
        super().__init__(child)
        self._batch_size = _count(batch_size, "batch_size", "batch")
        self._drop_remainder = bool(drop_remainder)

    def _stack(self, rows: list[Row], index: int) -> Row:
        out = []
        for c, name in enumerate(self._columns):
            shapes = {r[c].shape for r in rows}
            if len(shapes) != 1:
                raise DatasetError(f"batch {index}: column {name!r} has rows of different "
                                   f"shapes {sorted(shapes)}; batch needs one shape per "
                                   "column (pad or resize them in a .map first)")
            out.append(np.stack([r[c] for r in rows]))
        return tuple(out)

    def _rows(self) -> Iterator[Row]:
        rows: list[Row] = []
        index = 0
        for row in self._child._rows():
            rows.append(row)
            if len(rows) == self._batch_size:
                yield self._stack(rows, index)
                rows, index = [], index + 1
        if rows and not self._drop_remainder:
            yield self._stack(rows, index)

    def get_dataset_size(self) -> int:
        n = self._child.get_dataset_size()
        if n < 0:
            return n
        return n // self._batch_size if self._drop_remainder else -(-n // self._batch_size)


def _names(value: str | Sequence[str] | None, what: str) -> list[str] | None:
    if value is None:
        return None
    names = [value] if isinstance(value, str) else list(value)
    if not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"map: {what} must be a column name or a list of them, got {value!r}")
    return names


def _operation_name(op: Callable[..., Any]) -> str:
    return getattr(op, "__name__", None) or type(op).__name__


class MapDataset(_Derived):
    def __init__(self, child: Dataset, operations: Any,
                 input_columns: str | Sequence[str] | None,
                 output_columns: str | Sequence[str] | None) -> None:
        ops = list(operations) if isinstance(operations, (list, tuple)) else [operations]
        if not ops or not all(callable(op) for op in ops):
            raise InputError(f"map: operations must be a callable or a list of callables, got "
                             f"{operations!r}")
        columns = child.get_col_names()
        inputs = _names(input_columns, "input_columns") or columns[:1]
        missing = [n for n in inputs if n not in columns]
        if missing:
            raise InputError(f"map: input column(s) {missing} are not in the dataset's "
                             f"columns {columns}")
        outputs = _names(output_columns, "output_columns") or inputs
        # The outputs take the place of the first input column; the other inputs go.
        first = columns.index(inputs[0])
        kept = [n for n in columns if n not in inputs]
        position = len([n for n in columns[:first] if n not in inputs])
        names = kept[:position] + outputs + kept[position:]
        if len(set(names)) != len(names):
            raise InputError(f"map: output columns {outputs} repeat a column kept from "
                             f"{columns}")
        super().__init__(child, names)
        self._ops, self._inputs, self._outputs = ops, inputs, outputs
        self._input_index = [columns.index(n) for n in inputs]
        self._kept_index = [columns.index(n) for n in kept]
        self._position = position

    def _apply(self, row: Row, index: int) -> Row:
        values: tuple[Any, ...] = tuple(row[i] for i in self._input_index)
        for op in self._ops:
            try:
                result = op(*values)
            except Exception as exc:
                raise DatasetError(f"map: operation {_operation_name(op)!r} on column(s) "
                                   f"{self._inputs} raised {type(exc).__name__} at row "
                                   f"{index}: {exc}") from exc
            values = tuple(result) if isinstance(result, (tuple, list)) else (result,)
        if len(values) != len(self._outputs):
            raise DatasetError(f"map: the operations returned {len(values)} value(s) at row "
                               f"{index} for output column(s) {self._outputs}")
        kept = [row[i] for i in self._kept_index]
        outputs = [np.asarray(v.asnumpy() if isinstance(v, Tensor) else v) for v in values]
        return tuple(kept[:self._position] + outputs + kept[self._position:])

    def _rows(self) -> Iterator[Row]:
        for index, row in enumerate(self._child._rows()):
            yield self._apply(row, index)

    def get_dataset_size(self) -> int:
        return self._child.get_dataset_size()


class RepeatDataset(_Derived):
    def __init__(self, child: Dataset, count: int | None) -> None:
        super().__init__(child)
        if count is None or (isinstance(count, (int, np.integer)) and count == -1):
            self._count = -1
        else:
            self._count = _count(count, "count", "repeat")

    def _rows(self) -> Iterator[Row]:
        n = 0
        while self._count < 0 or n < self._count:
            yield from self._child._rows()
            n += 1

    def get_dataset_size(self) -> int:
        if self._count < 0:
            return -1
        return self._child.get_dataset_size() * self._count


# -- iterators ----------------------------------------------------------------------------------

_ROW, _END, _ERROR = "row", "end", "error"


def _produce(rows: Iterator[Row], out: queue.Queue[tuple[str, Any]],
             stop: threading.Event) -> None:
    """The background thread: rows into the bounded queue until the pass ends, the consumer
    stops, or the pipeline raises (the error goes to the consumer)."""
    def put(item: tuple[str, Any]) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    try:
        for row in rows:
            if not put((_ROW, row)):
                return
        put((_END, None))
    except BaseException as exc:  # noqa: BLE001 (every failure reaches the consumer)
        put((_ERROR, exc))
    finally:
        close = getattr(rows, "close", None)
        if close is not None:
            close()


class _Pass:
    """One pass over a dataset, produced by a daemon thread."""

    def __init__(self, dataset: Dataset) -> None:
        self.queue: queue.Queue[tuple[str, Any]] = queue.Queue(config.get_prefetch_size())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=_produce, daemon=True,
                                       args=(dataset._rows(), self.queue, self.stop),
                                       name="graphkernel-dataset")
        self.thread.start()

    def next(self) -> Row | None:
        """The next row, None at the end of the pass."""
        while True:
            try:
                kind, value = self.queue.get(timeout=0.1)
            except queue.Empty:
                if not self.thread.is_alive() and self.queue.empty():
                    raise DatasetError("the dataset's thread ended without finishing the "
                                       "pass") from None
                continue
            if kind == _ROW:
                return value
            self.stop.set()
            if kind == _END:
                return None
            if isinstance(value, DatasetError):
                raise value
            raise DatasetError(f"the dataset pipeline raised {type(value).__name__}: "
                               f"{value}") from value


class TupleIterator:
    """Iterates a dataset in a background thread; each `for` over it is one pass."""

    def __init__(self, dataset: Dataset, columns: Sequence[str] | None, num_epochs: int,
                 output_numpy: bool) -> None:
        names = dataset.get_col_names()
        wanted = _names(columns, "columns") if columns is not None else names
        assert wanted is not None
        missing = [n for n in wanted if n not in names]
        if missing:
            raise InputError(f"create_tuple_iterator: column(s) {missing} are not in the "
                             f"dataset's columns {names}")
        if isinstance(num_epochs, bool) or not isinstance(num_epochs, (int, np.integer)) or \
                not (num_epochs == -1 or num_epochs >= 1):
            raise InputError(f"num_epochs must be -1 or an int >= 1, got {num_epochs!r}")
        self._dataset = dataset
        self._names = wanted
        self._index = [names.index(n) for n in wanted]
        self._num_epochs = int(num_epochs)
        self._output_numpy = output_numpy
        self._epochs = 0
        self._pass: _Pass | None = None
        # A dropped iterator (a consumer that stopped early) stops its thread.
        self._stopper = weakref.finalize(self, _stop_pass, [None])

    def __iter__(self) -> TupleIterator:
        return self

    def __next__(self) -> Any:
        if self._pass is None:
            if 0 <= self._num_epochs <= self._epochs:
                raise StopIteration
            self._epochs += 1
            self._pass = _Pass(self._dataset)
            self._stopper.detach()
            self._stopper = weakref.finalize(self, _stop_pass, [self._pass])
        try:
            row = self._pass.next()
        except BaseException:
            self.stop()
            raise
        if row is None:
            self._pass = None
            raise StopIteration
        values = [row[i] if self._output_numpy else Tensor(row[i]) for i in self._index]
        return self._shape(values)

    def _shape(self, values: list[Any]) -> Any:
        return values

    def stop(self) -> None:
        """End the current pass now (its thread stops); the next `for` starts a new one."""
        if self._pass is not None:
            self._pass.stop.set()
            self._pass = None


class DictIterator(TupleIterator):
    def _shape(self, values: list[Any]) -> Any:
        return dict(zip(self._names, values))


def _stop_pass(holder: list[_Pass | None]) -> None:
    if holder[0] is not None:
        holder[0].stop.set()
