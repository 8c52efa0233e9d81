"""Tests for loader processes: the batches and checkpoints of threads, errors, deaths, no leaks."""

from __future__ import annotations

import contextlib
import gc
import hashlib
import multiprocessing
import os
import pickle
import resource
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import jax
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from helpers import (
    assert_batches_equal,
    assert_equal_output_after_checkpoint,
    assert_records_equal,
)
from jax.sharding import Mesh
from process_pipelines import (
    KillOnce,
    Unloadable,
    a_set,
    failing_record,
    megabyte,
    noisy,
    nonempty,
    not_a_multiple_of_3,
    record,
    spectrum,
    stubborn,
    tokens,
    total,
)

from loadax import (
    Batcher,
    DataLoader,
    Loader,
    NumpyDataset,
    Pipeline,
    Plan,
    RangeDataset,
    RecordError,
    SQLiteDataset,
)
from loadax.dataset.stream import Stream
from loadax.execution.pickled import PickledPipeline
from loadax.execution.processes import ProcessExecutor, WorkerProcessError
from loadax.plan.work import StepWork
from loadax.sources.arrayrecord import ArrayRecordDataset
from loadax.sources.huggingface import HuggingFaceDataset
from loadax.sources.parquet import ParquetDataset
from loadax.sources.polars import PolarsDataset
from loadax.wire.codec import CodecError

SEGMENT_PREFIX = f"loadax{os.getpid()}_"


def processes(builder: DataLoader[Any, Any], count: int = 2) -> DataLoader[Any, Any]:
    return builder.workers(count, kind="processes")


def loader_processes() -> list[Any]:
    return [p for p in multiprocessing.active_children() if p.name.startswith("loadax-process")]


def our_segments() -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(SEGMENT_PREFIX)]


def drain(loader: Loader[Any]) -> list[Any]:
    """Every batch of a new iterator; it and the loader are closed even when one fails."""
    with loader, iter(loader) as iterator:
        return list(iterator)


def collectors() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loadax-process")]


def assert_nothing_left() -> None:
    """No process source's thread or process is alive, and no shared memory of ours is named."""
    gc.collect()  # abandoned iterators release their processes
    for thread in collectors():
        thread.join(timeout=10)
    assert collectors() == []
    assert loader_processes() == []
    assert our_segments() == []


def test_processes_yield_the_batches_of_threads_and_of_the_calling_thread() -> None:
    dataset = RangeDataset(0, 45).map(record).random_map(noisy, seed=5)
    builder = DataLoader(Batcher()).batch_size(8).shuffle(seed=3).num_epochs(2)
    expected = list(builder.workers(0).build(dataset))
    assert_batches_equal(builder.workers(2).build(dataset), expected)
    assert_batches_equal(processes(builder).build(dataset), expected)
    assert_batches_equal(processes(builder, 1).prefetch(4).build(dataset), expected)
    assert_batches_equal(processes(builder, 3).prefetch(1).build(dataset), expected)
    got = next(iter(processes(builder).build(dataset)))
    assert got["x"].flags.writeable  # copied out of shared memory, not a view of it
    assert_nothing_left()


def test_batches_come_out_into_reused_buffers_not_fresh_memory() -> None:
    # A fresh buffer for each batch of 34 MiB (past glibc's largest heap block, 32 MiB) would be
    # mapped afresh and faulted in page by page: 8,704 faults a batch.
    rows, pages = 34, 34 << 8
    dataset = RangeDataset(0, 16 * rows).map(megabyte)
    builder = DataLoader(Batcher()).batch_size(rows)
    expected = [digest(batch) for batch in builder.build(dataset)]
    got, faults = [], 0
    with processes(builder).build(dataset) as loader, iter(loader) as batches:
        for step, batch in enumerate(batches):
            got.append(digest(batch))
            if step == 7:  # the buffers for the batches alive at once are made by now
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert got == expected
    # 8 batches after the 8th: a few faults of this process's own, not 8 x 8,704.
    assert faults < 8 * pages // 4, faults
    assert_nothing_left()


def digest(batch: np.ndarray[Any, Any]) -> bytes:
    return hashlib.blake2b(memoryview(batch)).digest()


def test_restore_at_every_step_yields_the_same_batches() -> None:
    dataset = RangeDataset(0, 30).map(record).random_map(noisy)
    builder = DataLoader(Batcher()).batch_size(8).shuffle(seed=1).num_epochs(2)
    assert_equal_output_after_checkpoint(processes(builder).build(dataset))
    assert_nothing_left()


@pytest.mark.parametrize(
    "stream",
    [
        Stream(RangeDataset(0, 120).map(record), window=16).filter(not_a_multiple_of_3),
        Stream(RangeDataset(0, 150).map(tokens), window=32).filter(nonempty).pack(16),
    ],
    ids=["filter", "pack"],
)
def test_stream_windows_are_those_of_threads_and_restore_at_every_step(stream: Stream[Any]) -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))  # two data shards, windows interleaved
    builder = DataLoader(Batcher()).batch_size(6).shard(mesh)
    expected = list(builder.workers(0).build(stream))
    assert len(expected) >= 4
    assert_batches_equal(builder.workers(2).build(stream), expected)
    loader = processes(builder).prefetch(3).build(stream)
    assert_batches_equal(loader, expected)
    assert_equal_output_after_checkpoint(loader)
    loader.close()
    assert_nothing_left()


def test_a_failing_record_is_the_record_error_of_threads_with_the_process_traceback() -> None:
    dataset = RangeDataset(0, 20).map(failing_record)
    builder = DataLoader(Batcher()).batch_size(4)
    with pytest.raises(RecordError) as threaded:
        drain(builder.workers(2).build(dataset))
    loader = processes(builder).build(dataset)
    iterator = iter(loader)
    assert_batches_equal([next(iterator)], [next(iter(builder.workers(0).build(dataset)))])
    with pytest.raises(RecordError) as failed:
        next(iterator)
    error = failed.value
    assert str(error) == "record 7 (epoch 0) failed: ValueError: record 7 is corrupt"
    assert str(error) == str(threaded.value)
    assert (error.index, error.epoch) == (7, 0)
    assert isinstance(error.__cause__, ValueError)
    notes = "\n".join(error.__notes__)
    assert "loader process" in notes
    assert "the batch of step 1" in notes
    assert "Traceback" in notes
    assert "failing_record" in notes
    # The state stays at the failed step: a retry fails the same way.
    assert iterator.get_state()["step"] == 1
    with pytest.raises(RecordError, match="record 7"):
        next(iterator)
    iterator.close()
    loader.close()
    assert_nothing_left()


def test_other_errors_keep_their_type_and_carry_the_process_traceback() -> None:
    builder = DataLoader(Batcher(total)).batch_size(4)
    dataset = RangeDataset(0, 12).map(record)
    with pytest.raises(KeyError) as threaded:
        drain(builder.workers(2).build(dataset))
    with pytest.raises(KeyError) as failed:
        drain(processes(builder).build(dataset))
    assert str(failed.value) == str(threaded.value)
    notes = "\n".join(failed.value.__notes__)
    assert "while collating the batch of step 1" in notes
    assert "loader process" in notes
    assert "in total" in notes

    with pytest.raises(CodecError, match="cannot encode a set") as unsendable:
        drain(processes(DataLoader(Batcher(a_set)).batch_size(4)).build(dataset))
    assert "loader processes send batches with loadax.wire.codec" in "\n".join(
        unsendable.value.__notes__
    )
    assert_nothing_left()


def test_an_error_that_cannot_be_unpickled_is_a_worker_process_error_naming_it() -> None:
    loader = processes(DataLoader(Batcher()).batch_size(2)).build(RangeDataset(0, 6).map(stubborn))
    with pytest.raises(
        RecordError, match=r"record 3 .*StubbornError: record 3 is stubborn"
    ) as failed:
        drain(loader)
    cause = failed.value.__cause__
    assert isinstance(cause, WorkerProcessError)
    assert str(cause) == "StubbornError: record 3 is stubborn (3)"
    assert "Traceback" in "\n".join(failed.value.__notes__)
    assert_nothing_left()


def test_a_killed_process_fails_its_batch_and_is_replaced(tmp_path: Path) -> None:
    marker = tmp_path / "kill"
    dataset = RangeDataset(0, 24).map(KillOnce(marker, 9))
    builder = DataLoader(Batcher()).batch_size(4)
    expected = list(builder.workers(0).build(dataset))
    marker.touch()
    loader = processes(builder).build(dataset)
    iterator = iter(loader)
    got = [next(iterator), next(iterator)]
    with pytest.raises(
        WorkerProcessError,
        match=r"step 2 was not loaded: loader process \d \(pid \d+\) was killed by SIGKILL",
    ):
        next(iterator)
    assert iterator.get_state()["step"] == 2
    got.extend(iterator)  # a new process takes the dead one's place
    assert_batches_equal(got, expected)
    loader.close()
    assert_nothing_left()


def test_when_the_last_process_dies_the_queued_batches_fail_too(tmp_path: Path) -> None:
    marker = tmp_path / "kill"
    marker.touch()
    pipeline = Pipeline(RangeDataset(0, 12).map(KillOnce(marker, 1)), Batcher())
    plan = Plan(num_records=12, batch_size=4)
    executor = ProcessExecutor(PickledPipeline(pipeline), processes=1)
    pending = [executor.submit(plan, StepWork(step)) for step in range(3)]
    with pytest.raises(WorkerProcessError, match=r"step 0 was not loaded: .* killed by SIGKILL"):
        pending[0].result()
    for step in (1, 2):
        with pytest.raises(WorkerProcessError, match=rf"step {step} .* no loader process is left"):
            pending[step].result()
    assert_batches_equal([executor.submit(plan, StepWork(1)).result()], [pipeline.load(plan, 1)])
    executor.release(wait=True)
    assert_nothing_left()


def test_a_pipeline_that_cannot_be_loaded_in_a_process_fails_naming_why() -> None:
    dataset = RangeDataset(0, 8).map(Unloadable())
    loader = processes(DataLoader(Batcher()).batch_size(4), 1).build(dataset)
    with pytest.raises(WorkerProcessError, match="could not load the pipeline") as failed:
        drain(loader)
    assert "refuses to be unpickled here" in str(failed.value)
    assert_nothing_left()


def test_close_cancel_and_abandon_leave_no_process_thread_or_shared_memory_behind() -> None:
    dataset = RangeDataset(0, 64).map(record)
    loader = processes(DataLoader(Batcher()).batch_size(4)).prefetch(4).build(dataset)
    with iter(loader) as iterator:
        first = next(iterator)
        started = loader_processes()
        assert len(started) == 2
        iterator.set_state(iterator.get_state())  # cancels the batches in flight
        next(iterator)

    abandoned = iter(loader)
    next(abandoned)
    del abandoned
    gc.collect()

    with iter(loader) as iterator:
        assert_batches_equal([next(iterator)], [first])
    assert loader_processes() == started  # the loader's processes serve all its iterators
    loader.close()
    assert_nothing_left()
    with pytest.raises(ValueError, match="the loader is closed"):
        next(iter(loader))

    # A loader collected once its iterators are done leaves nothing either.
    iterator = iter(processes(DataLoader(Batcher()).batch_size(4)).build(dataset))
    next(iterator)
    iterator.close()
    del iterator
    assert_nothing_left()


def test_a_loaders_processes_serve_every_epoch_and_iterator() -> None:
    dataset = RangeDataset(0, 24).map(record).random_map(noisy, seed=1)
    builder = DataLoader(Batcher()).batch_size(8).shuffle(seed=2)
    with processes(builder).build(dataset) as loader:
        pids = set()
        for epoch in range(3):
            expected = list(builder.workers(0).build(dataset).epoch(epoch))
            assert_batches_equal(loader.epoch(epoch), expected)
            pids |= {process.pid for process in loader_processes()}
        assert_batches_equal(loader, builder.workers(0).build(dataset))
        pids |= {process.pid for process in loader_processes()}
        assert len(pids) == 2  # started once, for the first epoch
    assert_nothing_left()


def test_an_unpicklable_pipeline_is_refused_at_build_naming_the_function() -> None:
    builder = processes(DataLoader(Batcher()).batch_size(2))
    with pytest.raises(
        ValueError, match=r"pipeline\.dataset\._fn \(<function .*<lambda>.*module level"
    ):
        builder.build(RangeDataset(0, 4).map(lambda index: index))

    def local(records: list[Any]) -> Any:
        return records

    with pytest.raises(ValueError, match=r"pipeline\.batcher\._fn .*local object"):
        processes(DataLoader(Batcher(local)).batch_size(2)).build(RangeDataset(0, 4))


def test_the_loading_kind_is_checked() -> None:
    builder = DataLoader(Batcher()).batch_size(2)
    with pytest.raises(
        ValueError,
        match=r"workers\(kind=\.\.\.\) must be one of \['threads', 'processes'\], got 'fork'",
    ):
        builder.workers(2, kind="fork")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"workers\(0, kind='processes'\) starts no process"):
        builder.workers(0, kind="processes")
    assert builder.workers(0, kind="threads").build(RangeDataset(0, 2)) is not None


def test_a_numpy_file_pipeline_reads_the_same_in_processes(tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.random.default_rng(0).random((24, 16, 16), dtype=np.float32))
    dataset = NumpyDataset(path).map(spectrum)
    builder = DataLoader(Batcher()).batch_size(8).shuffle(seed=2)
    assert_batches_equal(processes(builder).build(dataset), builder.workers(0).build(dataset))
    assert_nothing_left()


def _numpy(tmp_path: Path) -> Any:
    np.save(tmp_path / "rows.npy", np.arange(20_000, dtype=np.int64).reshape(2_000, 10))
    return NumpyDataset(tmp_path / "rows.npy")


def _numpy_loaded(tmp_path: Path) -> Any:
    np.save(tmp_path / "rows.npy", np.arange(20_000, dtype=np.int64).reshape(2_000, 10))
    return NumpyDataset(tmp_path / "rows.npy", mmap=False)


def _sqlite_table(tmp_path: Path) -> Any:
    path = tmp_path / "rows.db"
    with contextlib.closing(sqlite3.connect(path)) as connection, connection:
        connection.execute("CREATE TABLE t (id INTEGER, name TEXT)")
        connection.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"n{i}") for i in range(2_000)])
    dataset = SQLiteDataset(path, table="t", columns=["name"])
    dataset[0]  # a connection is open when it is pickled
    return dataset


def _sqlite_query(tmp_path: Path) -> Any:
    _sqlite_table(tmp_path).close()
    return SQLiteDataset(tmp_path / "rows.db", query="SELECT id FROM t ORDER BY id DESC")


def _parquet(tmp_path: Path) -> Any:
    table = pa.table({"id": np.arange(2_000), "name": [f"n{i}" for i in range(2_000)]})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=300)
    dataset = ParquetDataset([tmp_path / "rows.parquet"], columns=["id"])
    dataset[5]  # a file is open, a row group cached, when it is pickled
    return dataset


def _arrayrecord(tmp_path: Path) -> Any:
    path = tmp_path / "rows.array_record"
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for index in range(2_000):
        writer.write(b"record %d" % index)
    writer.close()
    dataset = ArrayRecordDataset(path, decode=len)
    dataset[0]
    return dataset


def _huggingface(tmp_path: Path) -> Any:
    rows = {"id": list(range(2_000)), "name": [f"n{i}" for i in range(2_000)]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "hf"))
    return HuggingFaceDataset.load_from_disk(tmp_path / "hf", format="numpy")


@pytest.mark.parametrize(
    "make",
    [_numpy, _numpy_loaded, _sqlite_table, _sqlite_query, _parquet, _arrayrecord, _huggingface],
)
def test_file_sources_pickle_by_path_and_read_the_same_records(
    tmp_path: Path, make: Callable[[Path], Any]
) -> None:
    dataset = make(tmp_path)
    data = pickle.dumps(dataset)
    assert len(data) < 2_000, f"{len(data)} bytes: the records were pickled"
    copy = pickle.loads(data)
    indices = np.array([1_999, 0, 517, 3, 517])
    want, got = dataset.read(indices, 0), copy.read(indices, 0)
    if isinstance(want[0], dict):
        assert_records_equal(got, want)
    else:
        assert_batches_equal(got, want)
    assert len(copy) == len(dataset) == 2_000


def test_a_polars_source_pickles_with_its_frame() -> None:
    dataset = PolarsDataset(pl.DataFrame({"id": [3, 1, 2], "name": ["c", "a", "b"]}), ["name"])
    copy = pickle.loads(pickle.dumps(dataset))
    assert_records_equal(copy.read(np.array([2, 0]), 0), dataset.read(np.array([2, 0]), 0))
