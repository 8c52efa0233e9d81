"""WebDataset-style tar shards as a dataset: record i is the i-th sample (the files sharing a
key) of the shards in order, read by ranged reads through an index of each shard's members.

Samples are grouped by webdataset's own functions. Its indexed reader, `wids`, does not fit:
it imports torch, copies whole shards to local disk before reading one sample, and keeps its
index as a pickle (code a shard's neighbour could make us run)."""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

import numpy as np
from webdataset.tariterators import (  # type: ignore[import-untyped]
    base_plus_ext,
    group_by_keys,
    meta_prefix,
    meta_suffix,
)

from loadax.plan.permutation import IndexArray
from loadax.sources.images import MODES, _decoded, _pillow
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.sharded import ShardedDataset
from loadax.sources.shards import Index
from loadax.validation import require_bool

_SKIPPED = re.compile(r"__[^/]*__($|/)")  # webdataset's default skip_meta: its own metadata
IMAGES = frozenset(
    ("bmp", "gif", "jpeg", "jpg", "pbm", "pgm", "png", "pnm", "ppm", "tif", "tiff", "webp")
)
"""Extensions decoded as images (to uint8 arrays of shape (height, width, channels))."""
_TEXTS = frozenset(("txt", "text", "transcript"))
_INTS = frozenset(("cls", "cls2", "class", "count", "index", "inx", "id"))
_JSONS = frozenset(("json", "jsn"))


class TarShardDataset(ShardedDataset[dict[str, Any]]):
    """The samples of WebDataset-style tar shards: `{"__key__": str, "__url__": str, field: value}`.

    A sample is the run of consecutive files whose names share a key (`dir/000123.jpg` and
    `dir/000123.cls` make the sample `dir/000123` with fields "jpg" and "cls"; the field is
    everything after the first "." of the name, lower-cased), grouped by webdataset's own rules
    (`webdataset.tariterators.group_by_keys`), so that samples and their order are the ones
    webdataset iterates. With `decode` (the default) a field is decoded by its last extension:
    images (`IMAGES`) with Pillow into uint8 arrays of shape (height, width, channels) in
    `image_mode` ("RGB", "RGBA" or "L"), "json"/"jsn" with `json.loads`, "txt"/"text"/
    "transcript" as UTF-8 text, "cls"/"cls2"/"class"/"count"/"index"/"inx"/"id" as an int,
    "npy" with `numpy.load` (never unpickling); any other field, and every field without
    `decode`, is its bytes (bytes stack into fixed-width strings that drop trailing zero bytes:
    decode them in a `.map`, or batch with `Batcher(list)`). `fields` keeps only the fields
    named (and "__key__"/"__url__" only if named): a sample without one of them fails as a bad
    record naming its shard, key and offset.

    `paths` are shard files, globs of them (matches sorted), or URLs of objects in a store
    (`s3://bucket/train-*.tar`, `gs://...`) or paths in `filesystem`, reached as `ParquetDataset`
    says. Each shard is indexed once, by one sequential pass over its headers (a local file seeks
    past the members' data; an object is streamed once): the index, each member's offset and size
    grouped into samples, is cached in `index_dir` (by default `~/.cache/loadax/indexes`) as a
    `.npz` file, keyed by the shard's path or URL and checked against its size and modification
    time; a stale or damaged index is built again. Reading a sample is then one ranged read of its
    members' bytes; samples close together in a shard (within 64 KiB, or 1 MiB in a store, where a
    request's latency would cost more than reading through) are read in one request, so a batch
    read in order costs a few requests per shard, and a batch's requests to a store go out
    together, up to 16 at a time, each sample decoded as its bytes arrive. A shard read in order
    from a store is read ahead (`loadax.sources.readahead`): the next batches' bytes are on their
    way while this one's are decoded. Compressed shards (`.tar.gz`) cannot be read by range and are
    refused.

    >>> import io, tarfile, tempfile
    >>> from loadax.sources.tar import TarShardDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> with tarfile.open(f"{directory.name}/shard-0.tar", "w") as shard:
    ...     for name, data in [("a.txt", b"hello"), ("a.cls", b"3"), ("b.txt", b"bye"),
    ...                        ("b.cls", b"4")]:
    ...         member = tarfile.TarInfo(name)
    ...         member.size = len(data)
    ...         shard.addfile(member, io.BytesIO(data))
    >>> samples = TarShardDataset(f"{directory.name}/*.tar", index_dir=directory.name)
    >>> len(samples), samples[1]["__key__"], samples[1]["txt"], samples[1]["cls"]
    (2, 'b', 'bye', 4)
    >>> directory.cleanup()
    """

    kind = "tar"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        decode: bool = True,
        fields: Sequence[str] | None = None,
        image_mode: str = "RGB",
        filesystem: Any = None,
        retries: RetryPolicy = DEFAULT_RETRIES,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._decode = require_bool("decode", decode)
        if image_mode not in MODES:
            raise ValueError(
                f"TarShardDataset: image_mode must be one of {MODES}, got {image_mode!r}"
            )
        self._image_mode = image_mode
        if fields is not None and (
            isinstance(fields, str)
            or not isinstance(fields, Sequence)
            or not fields
            or not all(isinstance(field, str) and field for field in fields)
        ):
            raise ValueError(
                "TarShardDataset: fields must be None or a non-empty sequence of field names "
                f"such as ['jpg', 'cls'], got {fields!r}"
            )
        self._fields = None if fields is None else tuple(fields)
        if self._decode and any(
            _extension(field) in IMAGES for field in (self._fields or ("jpg",))
        ):
            _pillow("TarShardDataset")  # missing Pillow is said now, not in a loader process
        super().__init__(paths, filesystem, retries, index_dir)
        self._spans = [self._sample_spans(index) for index in self.indexes]

    def build_index(self, shard: int, file: BinaryIO, size: int) -> Index:
        name = self.shards.names[shard]
        members: list[tuple[str, int, int]] = []  # (name, data offset, size) of each file
        try:
            # A local file is read by seeking past the data; a store's object as a stream.
            with tarfile.open(fileobj=file, mode="r:" if file.seekable() else "r|") as archive:
                for member in archive:
                    if member.isreg() and _kept(member.name):
                        members.append((member.name, member.offset_data, member.size))
        except tarfile.TarError as error:
            compression = None if members else self._compression(shard, size)
            if compression is not None:
                raise ValueError(
                    f"TarShardDataset: cannot index {name!r}: it is {compression}-compressed, "
                    "and compressed shards cannot be read by range: store them as plain .tar"
                ) from None
            after = f" after byte {members[-1][1] + members[-1][2]}" if members else ""
            raise ValueError(
                f"TarShardDataset: cannot index {name!r}{after}: {error} (the shard is "
                "truncated or damaged)"
            ) from None
        entries = (
            {"fname": member, "data": position, "__url__": name}
            for position, (member, _, _) in enumerate(members)
        )
        try:
            samples = list(group_by_keys(entries, keys=base_plus_ext))
        except ValueError as error:  # a field twice in a row of one key
            raise ValueError(
                f"TarShardDataset: cannot group {name!r} into samples: {error}"
            ) from None
        field_names = sorted({field for sample in samples for field in sample} - _META)
        numbering = {field: number for number, field in enumerate(field_names)}
        positions: list[int] = []
        fields: list[int] = []
        firsts = [0]
        for sample in samples:
            chosen = sorted((sample[field], numbering[field]) for field in sample.keys() - _META)
            positions.extend(position for position, _ in chosen)
            fields.extend(number for _, number in chosen)
            firsts.append(len(positions))
        located = np.array([members[position][1:] for position in positions], dtype=np.int64)
        return {
            "offsets": located[:, 0] if len(located) else np.zeros(0, np.int64),
            "sizes": located[:, 1] if len(located) else np.zeros(0, np.int64),
            "fields": np.array(fields, dtype=np.int32),
            "firsts": np.array(firsts, dtype=np.int64),
            "keys": np.array([sample["__key__"] for sample in samples], dtype=np.str_),
            "field_names": np.array(field_names, dtype=np.str_),
        }

    def count(self, index: Index) -> int:
        return len(index["keys"])

    def spans(self, shard: int, records: IndexArray) -> tuple[IndexArray, IndexArray]:
        starts, ends = self._spans[shard]
        return starts[records], ends[records]

    def record(self, shard: int, number: int, data: memoryview, offset: int) -> dict[str, Any]:
        index = self.indexes[shard]
        key, url = str(index["keys"][number]), self.shards.names[shard]
        sample: dict[str, Any] = {"__key__": key, "__url__": url}
        first, last = int(index["firsts"][number]), int(index["firsts"][number + 1])
        names = index["field_names"]
        for member in range(first, last):
            field = str(names[index["fields"][member]])
            if self._fields is not None and field not in self._fields:
                continue
            start = int(index["offsets"][member]) - offset
            value = data[start : start + int(index["sizes"][member])]
            sample[field] = self._decoded(field, value, key, url, offset + start)
        if self._fields is None:
            return sample
        missing = [field for field in self._fields if field not in sample]
        if missing:
            present = sorted(str(field) for field in names[index["fields"][first:last]])
            raise ValueError(
                f"TarShardDataset: sample {key!r} of {url!r} (offset {offset}) has no field "
                f"{missing[0]!r}; its fields are {present}"
            )
        return {field: sample[field] for field in self._fields}

    def _decoded(self, field: str, value: memoryview, key: str, url: str, offset: int) -> Any:
        extension = _extension(field)
        decoder = _DECODERS.get(extension) if self._decode else None
        if self._decode and extension in IMAGES:
            where = f"{key}.{field} of {url!r} at offset {offset}"
            return _decoded(value, self._image_mode, where, "TarShardDataset")
        if decoder is None:
            return bytes(value)
        try:
            return decoder(value)
        except (ValueError, UnicodeDecodeError) as error:
            raise ValueError(
                f"TarShardDataset: cannot decode {key}.{field} of {url!r} at offset {offset} as "
                f"{extension}: {error}"
            ) from None

    def _compression(self, shard: int, size: int) -> str | None:
        """The compression a shard's first bytes name (gzip, bzip2, xz, zstd), or None."""
        head = self.shards.read_at(shard, 0, min(size, max(map(len, _MAGIC))))
        return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)

    def _sample_spans(self, index: Index) -> tuple[IndexArray, IndexArray]:
        """Each sample's byte range in its shard: from its first kept member's data to the
        end of its last (a sample with none of `fields` spans its first member)."""
        offsets, sizes, firsts = index["offsets"], index["sizes"], index["firsts"]
        if len(firsts) == 1:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        kept = np.ones(len(offsets), dtype=bool)
        if self._fields is not None:
            kept = np.isin(index["field_names"][index["fields"]], np.array(self._fields))
        starts = np.minimum.reduceat(np.where(kept, offsets, np.iinfo(np.int64).max), firsts[:-1])
        ends = np.maximum.reduceat(np.where(kept, offsets + sizes, -1), firsts[:-1])
        empty = ends < 0
        starts[empty] = offsets[firsts[:-1][empty]]
        ends[empty] = starts[empty]
        return starts, ends

    def __repr__(self) -> str:
        options = "" if self._decode else ", decode=False"
        options += "" if self._fields is None else f", fields={list(self._fields)!r}"
        options += "" if self._image_mode == "RGB" else f", image_mode={self._image_mode!r}"
        return f"TarShardDataset({list(self.paths)!r}{options})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path or URL (for loader processes): the copy loads the cached indexes.
        paths, filesystem, retries = self.shards.arguments()
        fields = None if self._fields is None else list(self._fields)
        arguments = (paths, self._decode, fields, self._image_mode, filesystem, retries)
        return (type(self), (*arguments, self.index_dir))


_META = frozenset(("__key__", "__url__"))
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _kept(name: str) -> bool:
    """Whether webdataset's iteration keeps the member `name` (it skips its metadata files)."""
    if "/" not in name and name.startswith(meta_prefix) and name.endswith(meta_suffix):
        return False
    return _SKIPPED.match(name) is None


def _extension(field: str) -> str:
    return field.rsplit(".", 1)[-1].lower()


def _npy(data: memoryview) -> Any:
    return np.load(io.BytesIO(data), allow_pickle=False)


def _text(data: memoryview) -> str:
    return bytes(data).decode("utf-8")


def _int(data: memoryview) -> int:
    return int(bytes(data))


def _json(data: memoryview) -> Any:
    return json.loads(bytes(data))


_DECODERS: dict[str, Callable[[memoryview], Any]] = {
    **dict.fromkeys(_TEXTS, _text),
    **dict.fromkeys(_INTS, _int),
    **dict.fromkeys(_JSONS, _json),
    "npy": _npy,
}
