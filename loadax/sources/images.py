"""Image files in one directory per class as a dataset: `{"image", "label"}` records, decoded
with Pillow (the `[images]` extra), or the files' raw bytes."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from loadax.dataset.ops import DatasetBase
from loadax.plan.permutation import IndexArray
from loadax.sources.filesystems import Store, path_in_store, store_of
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.storage_errors import Location
from loadax.validation import require_bool

MODES = ("RGB", "RGBA", "L")
"""The Pillow modes an image can be decoded to: 3, 4 or 1 channels of uint8."""

EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".pgm", ".png", ".ppm", ".tif", ".tiff", ".webp")
"""The file name endings listed by default (compared case-insensitively)."""


class ImageFolderDataset(DatasetBase[dict[str, Any]]):
    """The images under `root`, one subdirectory per class: `{"image": array, "label": int}`.

    The classes are the names of `root`'s subdirectories, sorted; class `c`'s label is `c`, and
    `classes` lists them. A class's files are those under its directory, at any depth, whose names
    end in one of `extensions` (case-insensitive); names starting with "." are skipped, and so
    are files directly in `root`. Record order is the classes in turn, each class's files sorted
    by their path: the same on every listing of the same tree. The tree is listed once, when the
    dataset is made, and must not change while it is read (a copy unpickled in a loader process
    lists it again and refuses a tree that changed).

    With `decode` (the default) each image is decoded with Pillow into a uint8 array of shape
    (height, width, channels), converted to `mode` by Pillow's `Image.convert`: "RGB" (the
    default: grayscale is repeated into 3 channels, alpha is dropped, palettes are looked up),
    "RGBA", or "L" (grayscale, 1 channel: every image keeps its channel axis). A file Pillow
    cannot decode fails its record with a ValueError naming the file, which a loader raises as a
    `RecordError`. With `decode=False` the image is the file's bytes as a 1-D uint8 array
    (stacking `bytes` would make fixed-width strings that drop trailing zero bytes): batch them
    with `pad_batcher` or `Batcher(list)`, or decode them in a `.map`. Pillow is needed only to
    decode: `pip install 'loadax[images]'`.

    `root` may be a prefix in an object store, by URL (`s3://bucket/train`, `gs://...`), or a
    path in `filesystem` (a `pyarrow.fs.FileSystem` or an fsspec filesystem); see
    `ParquetDataset` for how stores are reached. Its "directories" are the prefixes the store
    lists; the listing is made once, and each image is one whole-object read, each thread
    through its own copy of the filesystem, retried through an outage under `retries`.

    >>> import pathlib
    >>> import tempfile
    >>> from PIL import Image
    >>> from loadax import ImageFolderDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> root = pathlib.Path(directory.name)
    >>> for name, colour in [("cat/1.png", "red"), ("cat/2.png", "blue"), ("dog/1.jpg", "white")]:
    ...     (root / name).parent.mkdir(exist_ok=True)
    ...     Image.new("RGB", (4, 3), colour).save(root / name)
    >>> images = ImageFolderDataset(root)
    >>> images.classes, len(images), [record["label"] for record in images]
    (('cat', 'dog'), 3, [0, 0, 1])
    >>> record = images[1]
    >>> record["image"].shape, record["image"].dtype, record["image"][0, 0].tolist()
    ((3, 4, 3), dtype('uint8'), [0, 0, 255])
    >>> ImageFolderDataset(root, decode=False)[0]["image"][:4].tobytes()
    b'\\x89PNG'
    >>> directory.cleanup()
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        decode: bool = True,
        mode: str = "RGB",
        extensions: Sequence[str] = EXTENSIONS,
        filesystem: Any = None,
        retries: RetryPolicy = DEFAULT_RETRIES,
    ) -> None:
        if not isinstance(root, str | os.PathLike):
            raise ValueError(f"ImageFolderDataset: root must be a path, got {root!r}")
        self._decode = require_bool("decode", decode)
        if mode not in MODES:
            raise ValueError(f"ImageFolderDataset: mode must be one of {MODES}, got {mode!r}")
        self._mode = mode
        self._extensions = _extensions(extensions)
        if self._decode:
            _pillow()  # missing Pillow is said now, not at the first read in a loader process
        found = store_of([root], filesystem, "ImageFolderDataset", expand=False, retries=retries)
        self._files: _Files = _LOCAL if found is None else _StoreFiles(found[0])
        self._root = os.fspath(root) if found is None else found[1][0].shown
        self._classes, keys, counts = _listing(self._files, self._root, self._extensions)
        self._keys = tuple(keys)
        self._labels = np.repeat(np.arange(len(counts), dtype=np.int64), counts)

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def classes(self) -> tuple[str, ...]:
        """The class names, sorted: the label of a record is its class's position here."""
        return self._classes

    @property
    def root(self) -> str:
        """The directory the classes are listed from, as given (a prefix's URL in a store)."""
        return self._root

    def read(self, indices: IndexArray, epoch: int) -> list[dict[str, Any]]:
        records = []
        for index, label in zip(indices.tolist(), self._labels[indices].tolist(), strict=True):
            path = _joined(self._root, self._keys[index])
            data = self._files.read(path)
            image = _decoded(data, self._mode, repr(path)) if self._decode else _raw(data)
            records.append({"image": image, "label": label})
        return records

    def __repr__(self) -> str:
        options = "" if self._decode else ", decode=False"
        options += "" if self._mode == "RGB" else f", mode={self._mode!r}"
        if self._extensions != EXTENSIONS:
            options += f", extensions={self._extensions!r}"
        return (
            f"ImageFolderDataset({self._root!r}, classes={len(self._classes)}, "
            f"files={len(self._keys)}{options})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by root (for loader processes): the copy lists the tree again, and must find
        # what this one found, or its labels and records would silently differ.
        root = self._files.absolute(self._root)
        arguments: tuple[Any, ...] = (root, self._decode, self._mode, self._extensions)
        if isinstance(self._files, _StoreFiles):  # and the store, by its options
            store = self._files.store
            arguments += (store.user_filesystem, store.retries)
        return (_relisted, (arguments, _digest(self._classes, self._keys)))


def _relisted(arguments: tuple[Any, ...], digest: str) -> ImageFolderDataset:
    """An `ImageFolderDataset` of `arguments`, checked to list what the pickled one did."""
    dataset = ImageFolderDataset(*arguments)
    if _digest(dataset._classes, dataset._keys) != digest:
        raise ValueError(
            f"ImageFolderDataset: the tree under {dataset.root!r} changed since the dataset was "
            f"made (it now lists {len(dataset)} files in {len(dataset.classes)} classes): a "
            "dataset's files must not change while it is read"
        )
    return dataset


class _Files(Protocol):
    """What a dataset lists and reads its tree through: local paths, or a store's objects."""

    def absolute(self, path: str) -> str: ...

    def is_directory(self, path: str) -> bool | None: ...

    def directories(self, path: str) -> list[str]: ...

    def files(self, path: str) -> list[str]: ...

    def read(self, path: str) -> bytes: ...


class _LocalFiles:
    """The file system a dataset lists and reads: local paths. Every listing and read goes
    through these methods, so that another store (an object store's URLs) can take its place."""

    def absolute(self, path: str) -> str:
        return os.path.abspath(path)

    def is_directory(self, path: str) -> bool | None:
        """True for a directory, False for something else, None when nothing is there."""
        if os.path.isdir(path):
            return True
        return False if os.path.exists(path) else None

    def directories(self, path: str) -> list[str]:
        """The names of the subdirectories of `path` (symbolic links to directories too)."""
        with os.scandir(path) as entries:
            return [entry.name for entry in entries if entry.is_dir()]

    def files(self, path: str) -> list[str]:
        """The paths, relative to `path` and "/"-separated, of the files under it at any depth,
        skipping names that start with "." (symbolic links to subdirectories are not followed)."""
        found: list[str] = []
        for directory, subdirectories, names in os.walk(path):
            subdirectories[:] = [name for name in subdirectories if not name.startswith(".")]
            relative = os.path.relpath(directory, path)
            prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
            found.extend(prefix + name for name in names if not name.startswith("."))
        return found

    def read(self, path: str) -> bytes:
        with open(path, "rb") as file:
            return file.read()


_LOCAL = _LocalFiles()


class _StoreFiles:
    """A store's objects, listed and read as `_LocalFiles` reads a tree: paths are the URLs
    (or paths in the store) of a root and what lies under it, "directories" the prefixes the
    store lists. Each reading thread reads through its own copy of the filesystem."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._filesystems = store.filesystems()

    def absolute(self, path: str) -> str:
        return path  # a store's paths have no working directory to be relative to

    def is_directory(self, path: str) -> bool | None:
        kind = self.store.kind_of(self._location(path), "ImageFolderDataset")
        return None if kind is None else kind == "directory"

    def directories(self, path: str) -> list[str]:
        entries = self.store.listing(self._location(path), False, "ImageFolderDataset")
        return [name for name, directory in entries if directory]

    def files(self, path: str) -> list[str]:
        # As locally: names starting with "." are skipped, and everything under such a prefix.
        entries = self.store.listing(self._location(path), True, "ImageFolderDataset")
        return [
            name
            for name, directory in entries
            if not directory and not any(part.startswith(".") for part in name.split("/"))
        ]

    def read(self, path: str) -> bytes:
        return self.store.read(self._filesystems.get(), self._location(path), "ImageFolderDataset")

    def _location(self, path: str) -> Location:
        inner = path_in_store(path)
        return Location(inner, self.store.shown(inner))


def _joined(root: str, key: str) -> str:
    return root.rstrip("/") + "/" + key


def _listing(
    files: _Files, root: str, extensions: tuple[str, ...]
) -> tuple[tuple[str, ...], list[str], list[int]]:
    """The sorted class names under `root`, every class's file keys ("class/path", in record
    order), and the number of files of each class."""
    shown = repr(root)
    kind = files.is_directory(root)
    if kind is None:
        raise FileNotFoundError(f"ImageFolderDataset: no directory at {shown}")
    if not kind:
        raise NotADirectoryError(
            f"ImageFolderDataset: {shown} is a file; root must be a directory with one "
            "subdirectory per class"
        )
    classes = tuple(sorted(name for name in files.directories(root) if not name.startswith(".")))
    if not classes:
        raise ValueError(
            f"ImageFolderDataset: {shown} holds no class directories: put each class's images "
            "in a subdirectory named after the class"
        )
    keys: list[str] = []
    counts: list[int] = []
    for name in classes:
        found = sorted(
            key for key in files.files(_joined(root, name)) if key.lower().endswith(extensions)
        )
        if not found:
            raise ValueError(
                f"ImageFolderDataset: class directory {_joined(root, name)!r} holds no image "
                f"files (names ending in {', '.join(extensions)})"
            )
        keys.extend(f"{name}/{key}" for key in found)
        counts.append(len(found))
    return classes, keys, counts


def _extensions(extensions: Sequence[str]) -> tuple[str, ...]:
    if isinstance(extensions, str) or not isinstance(extensions, Sequence) or not extensions:
        raise ValueError(
            f"ImageFolderDataset: extensions must be a non-empty sequence of name endings such "
            f"as '.png', got {extensions!r}"
        )
    for extension in extensions:
        if not isinstance(extension, str) or not extension.startswith(".") or extension == ".":
            raise ValueError(
                f"ImageFolderDataset: each of extensions must be a str starting with '.', such "
                f"as '.png', got {extension!r}"
            )
    return tuple(extension.lower() for extension in extensions)


def _digest(classes: tuple[str, ...], keys: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in (*classes, "", *keys):  # "" cannot be a class name: it ends the classes
        encoded = part.encode("utf-8", "surrogateescape")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def _pillow(source: str = "ImageFolderDataset") -> Any:
    """Pillow's `Image` module, or an ImportError that says how to install it."""
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError(
            f"{source} decodes images with Pillow, which is not installed: "
            "pip install 'loadax[images]' (or pass decode=False for the files' bytes)"
        ) from error
    return Image


def _decoded(
    data: bytes | memoryview, mode: str, path: str, source: str = "ImageFolderDataset"
) -> np.ndarray[Any, Any]:
    """The image `data` decoded by Pillow and converted to `mode`; `path` names it in errors."""
    image_module = _pillow(source)
    try:
        with image_module.open(io.BytesIO(data)) as image:
            image.load()
            # A copy: numpy's view of a Pillow image is read-only, and a record should not be.
            # (`convert` to the image's own mode would copy it once more first.)
            array = np.array(image if image.mode == mode else image.convert(mode), dtype=np.uint8)
    except image_module.UnidentifiedImageError:
        raise ValueError(
            f"{source}: cannot decode {path}: not an image format Pillow recognises"
        ) from None
    except Exception as error:  # Pillow's plugins raise many kinds for a damaged file
        raise ValueError(
            f"{source}: cannot decode {path}: {type(error).__name__}: {error}"
        ) from error
    return array[:, :, np.newaxis] if array.ndim == 2 else array


def _raw(data: bytes) -> np.ndarray[Any, Any]:
    return np.frombuffer(bytearray(data), dtype=np.uint8)
