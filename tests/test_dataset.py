"""graphkernel.dataset, tested the way MindSpore's dataset tests are: sources
(NumpySlicesDataset, GeneratorDataset), shuffle/batch/map/repeat, the tuple and dict iterators,
get_dataset_size, and the background thread (errors reach the consumer, an early stop ends
the thread)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import graphkernel.dataset as ds
from graphkernel import Tensor
from graphkernel.dataset import DatasetError
from graphkernel.errors import InputError


def _dataset_threads() -> int:
    return sum(t.name == "graphkernel-dataset" for t in threading.enumerate())


def _wait_for_no_threads(timeout: float = 5.0) -> int:
    end = time.time() + timeout
    while _dataset_threads() and time.time() < end:
        time.sleep(0.02)
    return _dataset_threads()


def test_numpy_slices_dict_batch_map_in_order():
    """
    Feature: NumpySlicesDataset with map and batch
    Description: a dict of columns, unshuffled, mapped on one column and batched with the
        remainder kept
    Expectation: batches in order with the mapped values, the dataset size counts batches
    """
    data = {"x": np.arange(10, dtype=np.float32), "y": np.arange(10, dtype=np.int32)}
    dataset = ds.NumpySlicesDataset(data, shuffle=False)
    dataset = dataset.map(operations=lambda v: v * 2, input_columns="x").batch(4)
    assert dataset.get_col_names() == ["x", "y"]
    assert dataset.get_dataset_size() == 3
    rows = list(dataset.create_dict_iterator(output_numpy=True))
    assert [r["y"].tolist() for r in rows] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    np.testing.assert_array_equal(rows[2]["x"], [16.0, 18.0])
    assert rows[0]["x"].dtype == np.float32


def test_tuple_iterator_gives_tensors_and_each_for_is_one_epoch():
    """
    Feature: create_tuple_iterator
    Description: iterate the same iterator for two epochs; then num_epochs=1 for a second pass
    Expectation: lists of Tensors, the same rows each epoch; a spent iterator stops
    """
    dataset = ds.NumpySlicesDataset((np.arange(6).reshape(3, 2), np.arange(3)),
                                    shuffle=False)
    assert dataset.get_col_names() == ["column_0", "column_1"]
    iterator = dataset.create_tuple_iterator()
    epochs = [[[t.asnumpy().tolist() for t in row] for row in iterator] for _ in range(2)]
    assert epochs[0] == epochs[1] == [[[0, 1], 0], [[2, 3], 1], [[4, 5], 2]]
    assert all(isinstance(t, Tensor) for t in next(iter(dataset)))
    once = dataset.create_tuple_iterator(columns=["column_1"], num_epochs=1, output_numpy=True)
    assert [row[0].item() for row in once] == [0, 1, 2]
    assert list(once) == []


def test_shuffle_is_a_permutation_and_the_seed_repeats_it():
    """
    Feature: shuffle, dataset.config.set_seed
    Description: NumpySlicesDataset shuffled by default, then .shuffle(buffer_size), twice
        with the same seed
    Expectation: each epoch is a permutation of the rows; the same seed gives the same orders
    """
    def orders() -> list[list[int]]:
        ds.config.set_seed(7)
        dataset = ds.NumpySlicesDataset(list(range(50))).shuffle(buffer_size=10)
        iterator = dataset.create_tuple_iterator(output_numpy=True)
        return [[int(row[0]) for row in iterator] for _ in range(2)]

    first, again = orders(), orders()
    assert first == again
    assert sorted(first[0]) == sorted(first[1]) == list(range(50))
    assert first[0] != list(range(50)) and first[0] != first[1]


def test_generator_dataset_sources_and_repeat():
    """
    Feature: GeneratorDataset
    Description: a generator function, a random-access source and an iterable, repeated
    Expectation: the rows of each, the sizes counted, repeat(2) twice the rows
    """
    def gen():
        for i in range(5):
            yield np.array([i, i]), np.array(i * 10)

    class Source:
        def __getitem__(self, i):
            return np.full((2,), i, np.float32), np.int32(i)

        def __len__(self):
            return 4

    from_gen = ds.GeneratorDataset(gen, column_names=["data", "label"]).repeat(2)
    assert from_gen.get_dataset_size() == 10
    labels = [int(r["label"]) for r in from_gen.create_dict_iterator(output_numpy=True)]
    assert labels == [0, 10, 20, 30, 40] * 2
    random_access = ds.GeneratorDataset(Source(), ["data", "label"], shuffle=False).batch(3)
    assert random_access.get_dataset_size() == 2
    batches = list(random_access.create_tuple_iterator(output_numpy=True))
    np.testing.assert_array_equal(batches[0][1], [0, 1, 2])
    assert batches[0][0].shape == (3, 2)
    iterable = ds.GeneratorDataset([(np.ones(2),), (np.zeros(2),)], ["a"], shuffle=False)
    assert iterable.get_dataset_size() == 2


def test_map_to_new_columns_and_several_operations():
    """
    Feature: map with output_columns and a list of operations
    Description: two operations applied in turn; one input column split into two outputs
    Expectation: the outputs take the input column's place
    """
    dataset = ds.NumpySlicesDataset({"a": np.arange(3.0), "b": np.arange(3)}, shuffle=False)
    dataset = dataset.map([lambda v: v + 1, lambda v: (v, -v)], input_columns=["a"],
                          output_columns=["p", "q"])
    assert dataset.get_col_names() == ["p", "q", "b"]
    row = next(iter(dataset.create_tuple_iterator(output_numpy=True)))
    assert [float(v) for v in row] == [1.0, -1.0, 0.0]


def test_error_in_map_reaches_the_consumer_named():
    """
    Feature: errors in the pipeline's thread
    Description: a map operation raises at row 3
    Expectation: a DatasetError in the consumer naming the operation, column and row; the
        thread ends
    """
    def explode(v):
        if v == 3:
            raise ValueError("bad pixel")
        return v

    dataset = ds.NumpySlicesDataset(list(range(8)), shuffle=False).map(explode)
    with pytest.raises(DatasetError, match=r"'explode' on column\(s\) \['column_0'\] raised "
                                           r"ValueError at row 3: bad pixel"):
        list(dataset.create_tuple_iterator())
    assert _wait_for_no_threads() == 0


def test_generator_error_and_ragged_batch_are_dataset_errors():
    """
    Feature: errors from a source and from batch
    Description: a generator that raises; rows of different shapes batched
    Expectation: DatasetErrors saying what happened and where
    """
    def broken():
        yield (np.zeros(2),)
        raise KeyError("missing file")

    with pytest.raises(DatasetError, match="source raised KeyError at row 1"):
        list(ds.GeneratorDataset(broken, ["a"]).create_tuple_iterator())

    def ragged():
        yield (np.zeros(2),)
        yield (np.zeros(3),)

    with pytest.raises(DatasetError, match=r"batch 0: column 'a' has rows of different shapes"):
        list(ds.GeneratorDataset(ragged, ["a"]).batch(2).create_tuple_iterator())
    with pytest.raises(DatasetError, match="has 2 column"):
        list(ds.GeneratorDataset(lambda: iter([(1, 2)]), ["a", "b", "c"])
             .create_tuple_iterator())


def test_consumer_that_stops_early_ends_the_thread():
    """
    Feature: the background thread and a bounded queue
    Description: an endless generator; the consumer takes three rows and drops the iterator
    Expectation: the producer never runs far ahead (bounded queue), and its thread ends
    """
    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield (np.array(i),)
            i += 1

    ds.config.set_prefetch_size(4)
    try:
        iterator = ds.GeneratorDataset(endless, ["n"]).create_tuple_iterator(output_numpy=True)
        for count, _row in enumerate(iterator):
            if count == 2:
                break
        time.sleep(0.2)
        assert len(produced) <= 3 + 4 + 1  # taken, queued, one waiting to be put
        del iterator, _row
        assert _wait_for_no_threads() == 0
    finally:
        ds.config.set_prefetch_size(16)


def test_bad_arguments_are_input_errors():
    """
    Feature: argument checks
    Description: columns of different lengths, an unknown column, a bad batch size
    Expectation: InputErrors naming the problem
    """
    with pytest.raises(InputError, match="different lengths"):
        ds.NumpySlicesDataset({"a": np.zeros(3), "b": np.zeros(4)})
    dataset = ds.NumpySlicesDataset({"a": np.zeros(3)})
    with pytest.raises(InputError, match=r"input column\(s\) \['b'\] are not in"):
        dataset.map(abs, input_columns="b")
    with pytest.raises(InputError, match="batch_size must be an int >= 1"):
        dataset.batch(0)
    with pytest.raises(InputError, match="shuffle=True needs a random-access source"):
        ds.GeneratorDataset(lambda: iter([]), ["a"], shuffle=True)
    assert ds.NumpySlicesDataset(list(range(5))).repeat().get_dataset_size() == -1


def test_generator_object_source_is_one_pass_and_says_so():
    """
    Feature: GeneratorDataset over a generator object (gen() rather than gen)
    Description: read it once, then a second epoch
    Expectation: the first pass has the rows; the second is a DatasetError saying to pass the
        function, not an epoch silently empty
    """
    def gen():
        for i in range(3):
            yield (np.array(i),)

    iterator = ds.GeneratorDataset(gen(), ["n"]).create_tuple_iterator(output_numpy=True)
    assert [int(row[0]) for row in iterator] == [0, 1, 2]
    with pytest.raises(DatasetError, match=r"already read once.*pass the generator function"):
        list(iterator)
