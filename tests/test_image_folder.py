"""Tests for loadax/sources/images.py: a class-per-directory tree of image files as records."""

from __future__ import annotations

import io
import pickle
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import assert_batches_equal
from PIL import Image

from loadax import (
    Batcher,
    DataLoader,
    ImageFolderDataset,
    Pipeline,
    RecordError,
    pad_batcher,
)
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker

H, W = 5, 7


def pixels(seed: int, channels: int | None = 3) -> np.ndarray[Any, Any]:
    """A random uint8 image of H x W (x channels), from `seed`."""
    shape = (H, W) if channels is None else (H, W, channels)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def saved(path: Path, image: Image.Image, **options: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, **options)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Classes bird, cat, dog (made in another order), RGB PNGs, one nested, plus files that are
    not listed: hidden ones, a text file, a hidden class, a file directly in the root."""
    root = tmp_path / "train"
    for name, seed in [("dog/b.png", 4), ("cat/z.png", 2), ("bird/a.png", 0), ("dog/a.png", 3)]:
        saved(root / name, Image.fromarray(pixels(seed)))
    saved(root / "cat/nested/m.png", Image.fromarray(pixels(1)))
    (root / "cat/notes.txt").write_text("not an image")
    (root / "cat/.hidden.png").write_bytes(b"skipped")
    saved(root / ".cache/x.png", Image.fromarray(pixels(9)))
    saved(root / "loose.png", Image.fromarray(pixels(9)))
    return root


# Record order: classes sorted, then each class's paths sorted ("nested/m.png" < "z.png").
ORDER = [("bird/a.png", 0, 0), ("cat/nested/m.png", 1, 1), ("cat/z.png", 1, 2)]
ORDER += [("dog/a.png", 2, 3), ("dog/b.png", 2, 4)]  # (file, label, seed)


def test_labels_follow_the_sorted_class_directories_and_files_their_sorted_paths(
    tree: Path,
) -> None:
    dataset = ImageFolderDataset(tree)
    assert dataset.classes == ("bird", "cat", "dog")
    assert dataset.root == str(tree)
    assert len(dataset) == len(ORDER)
    records = list(dataset)
    assert [record["label"] for record in records] == [label for _, label, _ in ORDER]
    for record, (name, _, seed) in zip(records, ORDER, strict=True):
        np.testing.assert_array_equal(record["image"], pixels(seed), err_msg=name)
        assert type(record["label"]) is int


def test_two_listings_of_one_tree_give_the_same_records(tree: Path) -> None:
    first, second = ImageFolderDataset(tree, decode=False), ImageFolderDataset(str(tree) + "/")
    assert second.classes == first.classes
    expected = [(tree / name).read_bytes() for name, _, _ in ORDER]
    assert [record["image"].tobytes() for record in first] == expected
    assert [record["label"] for record in second] == [record["label"] for record in first]


def test_batched_reads_equal_single_reads_with_negative_indices(tree: Path) -> None:
    dataset = ImageFolderDataset(tree)
    indices = [4, -5, 2, 2, -1]
    batched = dataset.__getitems__(indices)
    assert [record["label"] for record in batched] == [2, 0, 1, 1, 2]
    for record, index in zip(batched, indices, strict=True):
        np.testing.assert_array_equal(record["image"], dataset[index]["image"])
    with pytest.raises(IndexError, match="index 5 is out of range for ImageFolderDataset of 5"):
        dataset[5]


def test_png_modes_convert_by_the_documented_rule(tmp_path: Path) -> None:
    gray, rgba = pixels(10, channels=None), pixels(11, channels=4)
    saved(tmp_path / "a/gray.png", Image.fromarray(gray, mode="L"))
    saved(tmp_path / "a/rgba.png", Image.fromarray(rgba, mode="RGBA"))

    as_rgb = ImageFolderDataset(tmp_path)
    got_gray, got_rgba = (record["image"] for record in as_rgb)
    np.testing.assert_array_equal(got_gray, np.repeat(gray[:, :, None], 3, axis=2))
    np.testing.assert_array_equal(got_rgba, rgba[:, :, :3])  # alpha dropped

    as_rgba = ImageFolderDataset(tmp_path, mode="RGBA")
    np.testing.assert_array_equal(as_rgba[1]["image"], rgba)
    assert as_rgba[0]["image"].shape == (H, W, 4)
    assert (as_rgba[0]["image"][:, :, 3] == 255).all()

    as_gray = ImageFolderDataset(tmp_path, mode="L")
    assert as_gray[0]["image"].shape == (H, W, 1)
    np.testing.assert_array_equal(as_gray[0]["image"][:, :, 0], gray)


def test_palette_images_are_looked_up(tmp_path: Path) -> None:
    indices = np.random.default_rng(12).integers(0, 4, (H, W), dtype=np.uint8)
    palette = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0], [10, 20, 30]], dtype=np.uint8)
    image = Image.fromarray(indices, mode="P")
    image.putpalette(palette.flatten().tolist())
    saved(tmp_path / "a/palette.png", image)
    np.testing.assert_array_equal(ImageFolderDataset(tmp_path)[0]["image"], palette[indices])


def test_jpeg_decodes_close_to_what_was_saved(tmp_path: Path) -> None:
    smooth = np.linspace(0, 255, H * W * 3).reshape(H, W, 3).astype(np.uint8)
    saved(tmp_path / "a/photo.JPEG", Image.fromarray(smooth), quality=95)
    image = ImageFolderDataset(tmp_path)[0]["image"]
    assert (image.shape, image.dtype) == ((H, W, 3), np.uint8)
    assert np.abs(image.astype(int) - smooth.astype(int)).mean() < 8


def test_decoded_images_are_writable_arrays(tree: Path) -> None:
    image = ImageFolderDataset(tree)[0]["image"]
    image[0, 0] = 0  # an in-place augmentation must not fail
    assert image.flags.writeable


def test_without_decode_the_image_is_the_files_bytes(tree: Path) -> None:
    dataset = ImageFolderDataset(tree, decode=False)
    record = dataset[1]
    data = (tree / "cat/nested/m.png").read_bytes()
    assert (record["image"].dtype, record["image"].shape) == (np.uint8, (len(data),))
    assert record["image"].tobytes() == data
    assert record["label"] == 1
    with Image.open(io.BytesIO(record["image"])) as image:  # decodable as it is
        np.testing.assert_array_equal(np.asarray(image), pixels(1))


def test_raw_bytes_batch_with_pad_batcher(tree: Path) -> None:
    dataset = ImageFolderDataset(tree, decode=False)
    loader = DataLoader(pad_batcher(0, keys=["image"])).batch_size(5).workers(0).build(dataset)
    (batch,) = list(loader)
    sizes = [(tree / name).stat().st_size for name, _, _ in ORDER]
    assert batch["image"].shape == (5, max(sizes))
    assert batch["image_mask"].sum(axis=1).tolist() == sizes
    assert batch["image"][0, : sizes[0]].tobytes() == (tree / "bird/a.png").read_bytes()


def test_extensions_match_case_insensitively_and_can_be_chosen(tmp_path: Path) -> None:
    saved(tmp_path / "a/one.PNG", Image.fromarray(pixels(0)))
    saved(tmp_path / "a/two.bin", Image.fromarray(pixels(1)), format="PNG")
    assert len(ImageFolderDataset(tmp_path)) == 1
    chosen = ImageFolderDataset(tmp_path, extensions=[".BIN"])
    assert len(chosen) == 1
    np.testing.assert_array_equal(chosen[0]["image"], pixels(1))


def test_a_missing_pillow_is_named_with_the_extra_to_install(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # what an import finds when it is not there
    with pytest.raises(ImportError, match=r"pip install 'loadax\[images\]'"):
        ImageFolderDataset(tree)
    assert ImageFolderDataset(tree, decode=False)[0]["image"].size > 0


def test_a_missing_root_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=f"no directory at {re.escape(repr(str(missing)))}"):
        ImageFolderDataset(missing)


def test_a_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = saved(tmp_path / "one.png", Image.fromarray(pixels(0)))
    with pytest.raises(NotADirectoryError, match=f"{re.escape(repr(str(path)))} is a file"):
        ImageFolderDataset(path)


def test_a_root_without_class_directories_is_refused(tmp_path: Path) -> None:
    saved(tmp_path / "one.png", Image.fromarray(pixels(0)))
    (tmp_path / ".hidden").mkdir()
    with pytest.raises(ValueError, match=f"{re.escape(repr(str(tmp_path)))} holds no class"):
        ImageFolderDataset(tmp_path)


def test_a_class_directory_without_images_is_named(tree: Path) -> None:
    (tree / "empty").mkdir()
    (tree / "empty/readme.txt").write_text("no images here")
    with pytest.raises(
        ValueError, match=f"class directory {re.escape(repr(f'{tree}/empty'))} holds no image"
    ):
        ImageFolderDataset(tree)


def test_invalid_options_are_named(tree: Path) -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        ImageFolderDataset(tree, mode="CMYK")
    with pytest.raises(ValueError, match="decode must be a bool"):
        ImageFolderDataset(tree, decode="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="extensions must be a non-empty sequence"):
        ImageFolderDataset(tree, extensions=".png")
    with pytest.raises(ValueError, match=r"starting with '\.'"):
        ImageFolderDataset(tree, extensions=["png"])
    with pytest.raises(ValueError, match="root must be a path"):
        ImageFolderDataset(3)  # type: ignore[arg-type]


def test_an_undecodable_file_fails_its_record_naming_the_file(tree: Path) -> None:
    broken = tree / "cat/z.png"
    broken.write_bytes(b"not a png at all")
    truncated = tree / "dog/a.png"
    truncated.write_bytes(truncated.read_bytes()[:60])
    dataset = ImageFolderDataset(tree)
    with pytest.raises(
        ValueError, match=f"cannot decode {re.escape(repr(str(broken)))}: not an image"
    ):
        dataset[2]
    with pytest.raises(
        ValueError, match=f"cannot decode {re.escape(repr(str(truncated)))}: OSError"
    ):
        dataset[3]
    loader = DataLoader(Batcher()).batch_size(2).workers(0).build(dataset)
    with pytest.raises(RecordError, match="record 2 ") as caught:
        list(loader)
    assert caught.value.index == 2
    assert str(broken) in str(caught.value.__cause__)


def test_repr_names_the_root_and_counts(tree: Path) -> None:
    assert (
        repr(ImageFolderDataset(tree)) == f"ImageFolderDataset({str(tree)!r}, classes=3, files=5)"
    )
    assert repr(ImageFolderDataset(tree, decode=False, mode="L")) == (
        f"ImageFolderDataset({str(tree)!r}, classes=3, files=5, decode=False, mode='L')"
    )


def test_a_pickled_dataset_lists_again_and_refuses_a_changed_tree(tree: Path) -> None:
    dataset = ImageFolderDataset(tree, mode="L")
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.classes == dataset.classes
    assert repr(copy) == repr(dataset).replace(repr(str(tree)), repr(str(tree.absolute())))
    for got, want in zip(copy, dataset, strict=True):
        np.testing.assert_array_equal(got["image"], want["image"])
    pickled = pickle.dumps(dataset)
    saved(tree / "bird/new.png", Image.fromarray(pixels(20)))
    with pytest.raises(ValueError, match=r"changed since the dataset was made .*6 files"):
        pickle.loads(pickled)


def test_transforms_chain_and_a_threaded_loader_batches_the_records(tree: Path) -> None:
    dataset = ImageFolderDataset(tree).map(lambda r: {"x": r["image"][0, 0], "y": r["label"]})
    expected = [dataset[i] for i in range(5)]
    loader = DataLoader(Batcher()).batch_size(2).shuffle(seed=3).workers(2).build(dataset)
    batches = list(loader)
    assert [len(batch["y"]) for batch in batches] == [2, 2, 1]
    seen = sorted(
        (int(label), tuple(pixel))
        for batch in batches
        for label, pixel in zip(batch["y"], batch["x"].tolist(), strict=True)
    )
    assert seen == sorted((int(r["y"]), tuple(r["x"].tolist())) for r in expected)


def test_process_workers_and_a_remote_worker_give_the_local_batches(tree: Path) -> None:
    dataset = ImageFolderDataset(tree)
    builder = DataLoader(Batcher()).batch_size(2).shuffle(seed=1)
    expected = list(builder.workers(0).build(dataset))
    assert expected[0]["image"].shape == (2, H, W, 3)
    assert_batches_equal(builder.workers(2, kind="processes").build(dataset), expected)

    worker = Worker({"images": Pipeline(dataset, Batcher())}, threads=2)
    try:
        remote = RemoteDataLoader([worker], pipeline="images").batch_size(2).shuffle(seed=1)
        with remote.build() as batches:
            assert_batches_equal(batches, expected)
    finally:
        worker.close()
