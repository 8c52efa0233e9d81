"""Tests for loadax/sources/huggingface.py: Hugging Face datasets on disk, locally and remotely."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import record_pipelines
from equivalence import BATCH, EPOCHS, digests, digests_in_every_mode, loader
from helpers import assert_batches_equal

from loadax import ConcatenatedDataset, InMemoryDataset, MappedDataset, RangeDataset, ZippedDataset
from loadax.sources.huggingface import HuggingFaceDataset


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test may reach the Hub; worker processes inherit this environment."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def expected_rows() -> list[dict[str, Any]]:
    return [{"name": f"p{i}", "age": i, "scores": [i / 4, -i / 4]} for i in range(12)]


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """12 rows of {"name": str, "age": int, "scores": [float, float]}, saved with save_to_disk."""
    rows = expected_rows()
    path = tmp_path / "people"
    datasets.Dataset.from_dict({key: [row[key] for row in rows] for key in rows[0]}).save_to_disk(
        str(path)
    )
    return path


def test_rows_match_the_saved_dataset(saved: Path) -> None:
    dataset = HuggingFaceDataset.load_from_disk(saved, format="python")
    assert len(dataset) == 12
    assert dataset.columns == ("name", "age", "scores")
    assert list(dataset) == expected_rows()
    assert dataset[-1] == expected_rows()[-1]
    assert dataset[-12] == expected_rows()[0]


def test_a_dataset_object_is_wrapped_as_it_is(saved: Path) -> None:
    source = datasets.load_from_disk(str(saved))
    assert isinstance(source, datasets.Dataset)
    assert list(HuggingFaceDataset(source.select([3, 1]), format="python")) == [
        expected_rows()[3],
        expected_rows()[1],
    ]


def test_columns_pick_and_order_the_keys(saved: Path) -> None:
    dataset = HuggingFaceDataset.load_from_disk(saved, columns=["scores", "name"], format="python")
    assert dataset.columns == ("scores", "name")
    assert dataset[6] == {"scores": [1.5, -1.5], "name": "p6"}
    assert list(dataset[0]) == ["scores", "name"]


def test_getitems_equals_per_index_reads(saved: Path) -> None:
    dataset = HuggingFaceDataset.load_from_disk(saved, format="python")
    indices = [11, 0, 4, 4, -2, 9]
    batched = dataset.__getitems__(indices)
    assert batched == [dataset[index] for index in indices]
    assert batched == [expected_rows()[index] for index in indices]
    batched[2]["age"] = -1  # repeated rows are separate dicts
    assert batched[3]["age"] == 4
    assert dataset.__getitems__([]) == []


def test_the_numpy_format_by_default_gives_arrays_and_numpy_scalars(saved: Path) -> None:
    dataset = HuggingFaceDataset.load_from_disk(saved, columns=["age", "scores"])
    first, second = dataset.__getitems__([5, 2])
    assert isinstance(first["age"], np.integer)
    assert int(first["age"]) == 5
    assert isinstance(first["scores"], np.ndarray)
    np.testing.assert_array_equal(first["scores"], [1.25, -1.25])
    np.testing.assert_array_equal(second["scores"], [0.5, -0.5])
    source = datasets.load_from_disk(str(saved))
    assert HuggingFaceDataset(source, format=None)[0]["scores"] == [0.0, -0.0]  # its own: python
    kept = HuggingFaceDataset(source.with_format("numpy"), format=None)
    assert isinstance(kept[0]["scores"], np.ndarray)


def test_out_of_range_indices_raise_index_error(saved: Path) -> None:
    dataset = HuggingFaceDataset.load_from_disk(saved)
    for index in (12, -13):
        with pytest.raises(IndexError, match=f"index {index} is out of range for HuggingFace"):
            dataset[index]


def test_a_dataset_dict_is_refused_naming_its_splits(saved: Path, tmp_path: Path) -> None:
    source = datasets.load_from_disk(str(saved))
    both = datasets.DatasetDict({"train": source, "test": source.select([0, 1])})
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train', 'test'\]; pick one"):
        HuggingFaceDataset(both)
    both.save_to_disk(str(tmp_path / "both"))
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train', 'test'\]"):
        HuggingFaceDataset.load_from_disk(tmp_path / "both")
    test = HuggingFaceDataset.load_from_disk(tmp_path / "both", split="test", format="python")
    assert list(test) == expected_rows()[:2]
    with pytest.raises(ValueError, match=r"both.* has no split 'valid'; its splits are"):
        HuggingFaceDataset.load_from_disk(tmp_path / "both", split="valid")
    with pytest.raises(ValueError, match=r"people.* holds one split, not 'train'"):
        HuggingFaceDataset.load_from_disk(saved, split="train")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"columns": ["age", "height"]}, r"no column 'height'; its columns are \['name', 'age'"),
        ({"columns": "age"}, "columns must be a sequence of str"),
        ({"columns": ["age", "age"]}, "name a column twice"),
        ({"format": "torch"}, r"format must be None or one of \['python', 'numpy'\]"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(
    saved: Path, arguments: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        HuggingFaceDataset.load_from_disk(saved, **arguments)


def test_objects_that_are_not_datasets_are_refused(saved: Path) -> None:
    with pytest.raises(ValueError, match=r"must be a datasets\.Dataset, got list"):
        HuggingFaceDataset(expected_rows())
    streamed = datasets.load_from_disk(str(saved)).to_iterable_dataset()
    with pytest.raises(ValueError, match="IterableDataset, which has no random access"):
        HuggingFaceDataset(streamed)
    tables = datasets.load_from_disk(str(saved)).with_format("arrow")
    with pytest.raises(ValueError, match="format 'arrow', which reads tables"):
        HuggingFaceDataset(tables, format=None)
    assert HuggingFaceDataset(tables, format="python")[0] == expected_rows()[0]


def test_missing_and_foreign_directories_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no saved dataset at .*absent"):
        HuggingFaceDataset.load_from_disk(tmp_path / "absent")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("not a dataset")
    with pytest.raises(ValueError, match=r"notes.* is not a dataset saved by save_to_disk"):
        HuggingFaceDataset.load_from_disk(tmp_path / "notes")


def in_memory_rows(records: int) -> InMemoryDataset[dict[str, Any]]:
    x, labels = record_pipelines.row_values(records)
    return InMemoryDataset([{"x": x[i], "label": labels[i]} for i in range(records)])


def test_a_threaded_loader_gives_the_in_memory_batches(tmp_path: Path) -> None:
    path = record_pipelines.write_huggingface_rows(tmp_path, records=45)
    expected = list(loader(in_memory_rows(45)))
    assert len(expected) == 2 * 6
    dataset = HuggingFaceDataset.load_from_disk(path)
    assert_batches_equal(loader(dataset), expected)


def test_in_process_and_remote_workers_give_the_local_batches(tmp_path: Path) -> None:
    reference = digests_in_every_mode(tmp_path, "record_pipelines", "huggingface_rows")
    assert len(reference) == 2 * 5
    assert reference == digests(loader(in_memory_rows(40)))


GRID = np.arange(48, dtype=np.float32).reshape(16, 3)


def grid_rows() -> datasets.Dataset:
    """16 rows of {"x": 3 float32, "label": int}: a list column, as tokenized text would be."""
    return datasets.Dataset.from_dict({"x": GRID, "label": np.arange(16)})


def test_a_dataset_given_as_is_gives_the_batches_of_huggingface_dataset() -> None:
    rows = grid_rows()
    batches = list(loader(rows))
    assert_batches_equal(batches, list(loader(HuggingFaceDataset(rows))))
    # One array per list column, of its feature's dtype: what the rows as arrays give.
    assert [(batch["x"].shape, batch["x"].dtype) for batch in batches] == [
        ((BATCH, 3), np.float32)
    ] * (16 // BATCH * EPOCHS)
    arrays = InMemoryDataset([{"x": x, "label": label} for label, x in enumerate(GRID)])
    assert_batches_equal(batches, list(loader(arrays)))
    # The dataset ops read it the same way.
    assert_batches_equal(list(loader(MappedDataset(rows, dict))), batches)
    assert_batches_equal(list(loader(ConcatenatedDataset([rows]))), batches)
    joined = list(loader(ZippedDataset({"row": rows, "n": RangeDataset(0, 16)})))
    assert_batches_equal([batch["row"] for batch in joined], batches)


def test_a_dataset_dict_or_stream_given_as_is_is_refused_naming_it() -> None:
    rows = grid_rows()
    splits = datasets.DatasetDict({"train": rows, "test": rows})
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train', 'test'\]; pick one"):
        loader(splits)
    with pytest.raises(ValueError, match="IterableDataset, which has no random access"):
        MappedDataset(rows.to_iterable_dataset(), dict)


AS_IS_IN_PROCESSES = """
import datasets, numpy as np
from loadax import Batcher, DataLoader

if __name__ == "__main__":
    x = np.arange(96, dtype=np.float32).reshape(32, 3)
    rows = datasets.Dataset.from_dict({"x": x, "label": np.arange(32)})
    builder = DataLoader(Batcher()).batch_size(4).workers(2, kind="processes")
    batches = list(builder.build(rows))
    assert [batch["x"].shape for batch in batches] == [(4, 3)] * 8, batches
    np.testing.assert_array_equal(np.concatenate([batch["x"] for batch in batches]), x)
    unfinished = iter(builder.build(rows))
    print(next(unfinished)["label"].tolist())
"""


def test_worker_processes_reading_it_end_without_leaking_semaphores(tmp_path: Path) -> None:
    # A process that imports `datasets` makes semaphores (tqdm's lock); killed, it leaves them
    # to the resource tracker, which warns at exit. Released processes end normally instead,
    # whether the loop finished or an iterator was left unfinished at exit.
    script = tmp_path / "as_is.py"
    script.write_text(AS_IS_IN_PROCESSES)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[0, 1, 2, 3]"]
    assert "leaked" not in result.stderr, result.stderr


def test_importing_loadax_does_not_import_datasets() -> None:
    # The adopter is registered by `import loadax`; the optional extra is imported only when used.
    code = "import sys, loadax; print('datasets' in sys.modules, loadax.HuggingFaceDataset)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split()[0] == "False"


def test_a_missing_datasets_package_is_named_with_the_extra_to_install(
    saved: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # what an import finds when it is not there
    with pytest.raises(ImportError, match=r"pip install 'loadax\[huggingface\]'"):
        HuggingFaceDataset.load_from_disk(saved)
