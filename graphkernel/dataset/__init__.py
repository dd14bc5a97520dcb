"""`graphkernel.dataset`, MindSpore's `mindspore.dataset` for one machine: sources
(`NumpySlicesDataset`, `GeneratorDataset`), `.shuffle/.batch/.map/.repeat`, and iterators
(`create_tuple_iterator`, `create_dict_iterator`) that read ahead in a background thread."""
from graphkernel.dataset import config
from graphkernel.dataset.datasets import (
    BatchDataset,
    Dataset,
    DatasetError,
    DictIterator,
    GeneratorDataset,
    MapDataset,
    NumpySlicesDataset,
    RepeatDataset,
    ShuffleDataset,
    TupleIterator,
)

__all__ = ["BatchDataset", "Dataset", "DatasetError", "DictIterator", "GeneratorDataset",
           "MapDataset", "NumpySlicesDataset", "RepeatDataset", "ShuffleDataset",
           "TupleIterator", "config"]
