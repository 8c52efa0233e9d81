"""loadax: deterministic, checkpointable data loading for JAX."""

from loadax.collate.batcher import Batcher, stack
from loadax.collate.padding import PaddedStack, pad_batcher
from loadax.dataset.mix import MixedDataset
from loadax.dataset.ops import (
    CachedDataset,
    ConcatenatedDataset,
    DatasetBase,
    MappedDataset,
    RandomMappedDataset,
    RepeatedDataset,
    ShuffledDataset,
    SlicedDataset,
)
from loadax.dataset.protocol import Dataset
from loadax.dataset.records import read_records
from loadax.dataset.stream import Stream
from loadax.dataset.zipped import ZippedDataset
from loadax.errors import PoisonedRecords, RecordError, StorageError, WorkerError
from loadax.execution.pipeline import Pipeline
from loadax.execution.process_errors import WorkerProcessError
from loadax.iterators.base import LoaderIterator
from loadax.iterators.batches import BatchIterator
from loadax.iterators.passes import RepeatedEpochWarning
from loadax.iterators.stats import LoaderStats
from loadax.loader import DataLoader, Loader
from loadax.plan.planner import Plan
from loadax.sources.huggingface import HuggingFaceDataset
from loadax.sources.images import ImageFolderDataset
from loadax.sources.memory import InMemoryDataset, RangeDataset
from loadax.sources.numpy import NumpyDataset
from loadax.sources.retries import RetryPolicy
from loadax.sources.sqlite import SQLiteDataset

__version__ = "0.3.0"

__all__ = [
    "BatchIterator",
    "Batcher",
    "CachedDataset",
    "ConcatenatedDataset",
    "DataLoader",
    "Dataset",
    "DatasetBase",
    "HuggingFaceDataset",
    "ImageFolderDataset",
    "InMemoryDataset",
    "Loader",
    "LoaderIterator",
    "LoaderStats",
    "MappedDataset",
    "MixedDataset",
    "NumpyDataset",
    "PaddedStack",
    "Pipeline",
    "Plan",
    "PoisonedRecords",
    "RandomMappedDataset",
    "RangeDataset",
    "RecordError",
    "RepeatedDataset",
    "RepeatedEpochWarning",
    "RetryPolicy",
    "SQLiteDataset",
    "ShuffledDataset",
    "SlicedDataset",
    "StorageError",
    "Stream",
    "WorkerError",
    "WorkerProcessError",
    "ZippedDataset",
    "__version__",
    "pad_batcher",
    "read_records",
    "stack",
]
