"""loadax: deterministic, checkpointable data loading for JAX."""

from loadax.batcher import Batcher, stack
from loadax.dataset import (
    ConcatenatedDataset,
    Dataset,
    DatasetBase,
    MappedDataset,
    RandomMappedDataset,
    RepeatedDataset,
    ShuffledDataset,
    SlicedDataset,
    read_records,
)
from loadax.engine import BatchIterator, LoaderIterator
from loadax.errors import RecordError, WorkerError
from loadax.loader import DataLoader, Loader
from loadax.mix import MixedDataset
from loadax.numpy_source import NumpyDataset
from loadax.padding import PaddedStack, pad_batcher
from loadax.pipeline import Pipeline
from loadax.plan import Plan
from loadax.process_source import WorkerProcessError
from loadax.sources import InMemoryDataset, RangeDataset
from loadax.sqlite_source import SQLiteDataset
from loadax.stream import Stream

__version__ = "0.3.0"

__all__ = [
    "BatchIterator",
    "Batcher",
    "ConcatenatedDataset",
    "DataLoader",
    "Dataset",
    "DatasetBase",
    "InMemoryDataset",
    "Loader",
    "LoaderIterator",
    "MappedDataset",
    "MixedDataset",
    "NumpyDataset",
    "PaddedStack",
    "Pipeline",
    "Plan",
    "RandomMappedDataset",
    "RangeDataset",
    "RecordError",
    "RepeatedDataset",
    "SQLiteDataset",
    "ShuffledDataset",
    "SlicedDataset",
    "Stream",
    "WorkerError",
    "WorkerProcessError",
    "__version__",
    "pad_batcher",
    "read_records",
    "stack",
]
