"""TFRecord files as a dataset: record i is the i-th record of the files in order, a parsed
`tf.train.Example` or its bytes, read by ranged reads through an index of record offsets and
checked against the format's CRCs. No TensorFlow: the `tfrecord` package's protobuf classes
and CRC (the `[tfrecord]` extra)."""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np
from google.protobuf.message import DecodeError
from tfrecord.example_pb2 import Example  # type: ignore[import-untyped]
from tfrecord.writer import TFRecordWriter  # type: ignore[import-untyped]

from loadax.plan.permutation import IndexArray
from loadax.sources.retries import DEFAULT_RETRIES, RetryPolicy
from loadax.sources.sharded import ShardedDataset
from loadax.sources.shards import Index
from loadax.validation import require_bool

_HEADER = 12  # a record: its length (uint64), the length's masked CRC-32C (uint32),
_FOOTER = 4  # then its bytes, then their masked CRC-32C (uint32)
_SKIP = 1 << 20  # bytes read at a time past a record's data while a stream is indexed

masked_crc = TFRecordWriter.masked_crc


class TFRecordDataset(ShardedDataset[Any]):
    """The records of the TFRecord files at `paths`, file after file: with `parse` (the
    default) each a `tf.train.Example` as `{feature: value}`, sorted by name; else its bytes.

    A feature's value is an int64 array (`int64_list`), a float32 array (`float_list`), or
    for a `bytes_list` its one value as `bytes`, or a list of `bytes` when it holds any other
    number of values (never a fixed-width numpy string array, which would drop trailing zero
    bytes); a feature with no list set is `[]`. Other protos (`SequenceExample`) are read with
    `parse=False` and parsed in a `.map`.

    `paths` are files, globs of them (matches sorted), or URLs of objects in a store
    (`s3://bucket/train-*.tfrecord`, `gs://...`) or paths in `filesystem`, reached as
    `ParquetDataset` says. Each file is indexed once, by one pass over its record headers (each
    length checked against its CRC; a local file seeks past the data, an object is streamed once),
    and the index (each record's offset and length) is cached in `index_dir` (by default
    `~/.cache/loadax/indexes`) as a `.npz` file checked against the file's size and modification
    time, and built again when stale or damaged. Reading a record is one ranged read (records within
    64 KiB of each other in one request, 1 MiB in a store; a batch's requests to a store go out
    together, up to 16 at a time; a file read in order is read ahead), and every read checks the
    record's length and data against their CRCs: a corrupt record fails as a bad record naming its
    file and offset. Compressed (GZIP, ZLIB) files cannot be read by range and are refused.

    >>> import tempfile
    >>> from tfrecord import TFRecordWriter
    >>> from loadax.sources.tfrecord import TFRecordDataset
    >>> directory = tempfile.TemporaryDirectory()
    >>> writer = TFRecordWriter(f"{directory.name}/train.tfrecord")
    >>> for label in (3, 4):
    ...     writer.write({"label": (label, "int"), "text": (b"hi", "byte")})
    >>> writer.close()
    >>> records = TFRecordDataset(f"{directory.name}/*.tfrecord", index_dir=directory.name)
    >>> len(records), records[1]["label"], records[1]["text"]
    (2, array([4]), b'hi')
    >>> directory.cleanup()
    """

    kind = "tfrecord"

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        parse: bool = True,
        filesystem: Any = None,
        retries: RetryPolicy = DEFAULT_RETRIES,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self._parse = require_bool("parse", parse)
        super().__init__(paths, filesystem, retries, index_dir)

    def build_index(self, shard: int, file: BinaryIO, size: int) -> Index:
        name = self.shards.names[shard]
        offsets, lengths = [], []
        position = 0
        while position < size:
            header = _read(file, _HEADER)
            length = self._length(header, name, position)
            end = position + _HEADER + length + _FOOTER
            if end > size:
                raise ValueError(
                    f"TFRecordDataset: {name!r} is truncated: its record at offset {position} "
                    f"ends at byte {end}, past the file's {size} bytes"
                )
            if file.seekable():
                file.seek(end)
            else:
                for skipped in range(0, length + _FOOTER, _SKIP):
                    _read(file, min(_SKIP, length + _FOOTER - skipped))
            offsets.append(position)
            lengths.append(length)
            position = end
        return {
            "offsets": np.array(offsets, dtype=np.int64),
            "lengths": np.array(lengths, dtype=np.int64),
        }

    def count(self, index: Index) -> int:
        return len(index["offsets"])

    def spans(self, shard: int, records: IndexArray) -> tuple[IndexArray, IndexArray]:
        index = self.indexes[shard]
        starts = index["offsets"][records]
        return starts, starts + index["lengths"][records] + _HEADER + _FOOTER

    def record(self, shard: int, number: int, data: memoryview, offset: int) -> Any:
        name = self.shards.names[shard]
        length = self._length(data[:_HEADER], name, offset)
        expected = int(self.indexes[shard]["lengths"][number])
        if length != expected:
            raise ValueError(
                f"TFRecordDataset: the record at offset {offset} of {name!r} is {length} bytes "
                f"long, but was {expected} when the file was indexed: the file changed"
            )
        payload = data[_HEADER : _HEADER + length]
        if masked_crc(payload) != data[_HEADER + length :]:
            raise ValueError(
                f"TFRecordDataset: the record at offset {offset} of {name!r} is corrupt: its "
                "data does not match its CRC"
            )
        if not self._parse:
            return bytes(payload)
        try:
            example = Example.FromString(payload)
        except DecodeError as error:
            raise ValueError(
                f"TFRecordDataset: the record at offset {offset} of {name!r} is not a "
                f"tf.train.Example ({error}); pass parse=False for its bytes"
            ) from None
        features = example.features.feature
        return {key: _value(features[key]) for key in sorted(features)}

    def _length(self, header: bytes | memoryview, name: str, offset: int) -> int:
        """The length a record's header declares, checked against the header's CRC."""
        if len(header) < _HEADER:
            raise ValueError(
                f"TFRecordDataset: {name!r} ends inside the header of the record at offset "
                f"{offset}: the file is truncated"
            )
        if masked_crc(header[:8]) != header[8:_HEADER]:
            raise ValueError(
                f"TFRecordDataset: the record at offset {offset} of {name!r} has a corrupt "
                "header (its length does not match its CRC): the file is damaged, compressed "
                "(GZIP or ZLIB files cannot be read by range: decompress them), or not TFRecord"
            )
        return int(struct.unpack("<Q", header[:8])[0])

    def __repr__(self) -> str:
        options = "" if self._parse else ", parse=False"
        return f"TFRecordDataset({list(self.paths)!r}{options})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by path or URL (for loader processes): the copy loads the cached indexes.
        paths, filesystem, retries = self.shards.arguments()
        return (type(self), (paths, self._parse, filesystem, retries, self.index_dir))


def _read(file: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes of `file` (fewer only at its end)."""
    chunks, left = [], size
    while left:
        chunk = file.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _value(feature: Any) -> Any:
    kind = feature.WhichOneof("kind")
    if kind == "int64_list":
        return np.array(feature.int64_list.value, dtype=np.int64)
    if kind == "float_list":
        return np.array(feature.float_list.value, dtype=np.float32)
    if kind == "bytes_list":
        values = list(feature.bytes_list.value)
        return values[0] if len(values) == 1 else values
    return []
