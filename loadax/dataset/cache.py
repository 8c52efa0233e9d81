"""Where `cache()` keeps the records of a deterministic prefix: in memory, or one file per record
in a folder (local, `file://` or an object store's URL), keyed by the prefix's identity.

A record of a prefix without a shuffle or random map is a pure function of (the prefix, its
index), so it can be kept across epochs. The key is the prefix's identity: the walk of its code
and config (`loadax.identity.code_walk`, as a pipeline's fingerprint) and the digest of its first
record, so a changed prefix never reads an old cache. Each file names the identity and index it
holds and a checksum of its bytes; one that is short, damaged or another's is a miss, computed
and written again. Files are written whole: to a temporary name then renamed (local), or as one
object (an object store's writes are whole). Records are pickled, so a cache folder must be as
trusted as the pipeline's code.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import struct
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from loadax.dataset.records import Records, read_records
from loadax.dataset.stream import Stream
from loadax.identity.code_walk import Walker
from loadax.identity.digests import hashed
from loadax.plan.permutation import IndexArray
from loadax.reuse import ReuseCounts, ReuseStats
from loadax.sources.filesystems import Store, is_url, store_of
from loadax.sources.storage_errors import Location
from loadax.validation import require_int

MAGIC = b"LDXCACHE1"
_HEADER = struct.Struct("<9s32sqq16s")  # magic, identity, index, payload length, checksum
_SOURCE = "cache()"


class RecordCache:
    """The records of one prefix: in memory (`location` None) or in files under `location` (a
    local folder, `file:///...`, or `s3://...`/`gs://...`), at most `max_bytes` of them held in
    memory or written by this process (None: no limit); records past it are computed each time.

    It pickles as its options: each process (a loader's worker processes, a worker's) keeps its
    own memory and counts, and shares the files."""

    def __init__(self, location: str | os.PathLike[str] | None, max_bytes: int | None) -> None:
        if max_bytes is not None:
            require_int("max_bytes", max_bytes, minimum=1)
        if location is not None and not isinstance(location, str | os.PathLike):
            raise ValueError(f"cache path must be None, a folder or a URL, got {location!r}")
        self.location = None if location is None else os.fspath(location)
        self.max_bytes = max_bytes
        self._folder: _Folder | _StoreFolder | None = (
            None if self.location is None else _folder(self.location)
        )
        self._memory: dict[int, bytes] = {}
        self._held = 0
        self._identity: bytes | None = None
        self._lock = threading.Lock()
        self._counts = ReuseCounts()

    def __reduce__(self) -> tuple[Any, ...]:
        return (RecordCache, (self.location, self.max_bytes))

    def read(self, parent: Any, indices: IndexArray, epoch: int) -> list[Any]:
        """The records `indices` of `parent` (a prefix whose records do not vary by epoch): kept
        ones as kept, the others read from it in one call and kept."""
        identity = self._identity_of(parent)
        records: list[Any] = [None] * len(indices)
        missing = []
        for position, index in enumerate(indices.tolist()):
            payload = self._get(identity, index)
            if payload is None:
                missing.append(position)
                continue
            records[position] = pickle.loads(payload)
            self._counts.hit(len(payload))
        if missing:
            wanted = indices[missing]
            for position, index, record in zip(
                missing, wanted.tolist(), read_records(parent, wanted, epoch), strict=True
            ):
                records[position] = record
                self._counts.miss()
                self._put(identity, index, pickle.dumps(record, pickle.HIGHEST_PROTOCOL))
        return records

    def stats(self) -> ReuseStats:
        """Hits, misses and bytes saved by this process; the bytes it holds or wrote."""
        with self._lock:
            return self._counts.snapshot(self._held)

    def _identity_of(self, parent: Any) -> bytes:
        with self._lock:
            if self._identity is None:
                first = read_records(parent, _first(parent), 0)
                probe = pickle.dumps(first, pickle.HIGHEST_PROTOCOL)
                self._identity = hashed(b"cache", Walker().digest(parent), probe)
            return self._identity

    def _get(self, identity: bytes, index: int) -> bytes | None:
        if self._folder is None:
            with self._lock:
                return self._memory.get(index)
        return unpacked(self._folder.read(_name(identity, index)), identity, index)

    def _put(self, identity: bytes, index: int, payload: bytes) -> None:
        with self._lock:
            if self._folder is None and index in self._memory:
                return  # another thread read it at the same time
            if self.max_bytes is not None and self._held + len(payload) > self.max_bytes:
                return
            self._held += len(payload)
            if self._folder is None:
                self._memory[index] = payload
                return
        self._folder.write(_name(identity, index), packed(identity, index, payload))


def reuse_of(dataset: object) -> ReuseStats:
    """What the `cache()` ops in `dataset` (a dataset or stream) saved in this process.

    >>> from loadax import RangeDataset
    >>> cached = RangeDataset(0, 3).cache()
    >>> _ = list(cached), list(cached)
    >>> reuse_of(cached.map(str).filter(bool)).hits
    3
    """
    if isinstance(dataset, Stream):
        return reuse_of(dataset.dataset)
    if not isinstance(dataset, Records):
        return ReuseStats()
    total = sum((reuse_of(parent) for parent in dataset._parents()), ReuseStats())
    cache = getattr(dataset, "record_cache", None)
    return total + cache.stats() if isinstance(cache, RecordCache) else total


def packed(identity: bytes, index: int, payload: bytes) -> bytes:
    """A cache file: its header (what it holds, its length and checksum), then `payload`."""
    checksum = hashlib.blake2b(payload, digest_size=16).digest()
    return _HEADER.pack(MAGIC, identity, index, len(payload), checksum) + payload


def unpacked(data: bytes | None, identity: bytes, index: int) -> bytes | None:
    """The payload of a cache file, None when there is none or it is not whole, not this
    record's of this identity, or damaged.

    >>> whole = packed(bytes(32), 7, b"record")
    >>> unpacked(whole, bytes(32), 7), unpacked(whole[:-1], bytes(32), 7)
    (b'record', None)
    >>> unpacked(whole, bytes(32), 8), unpacked(whole, b"x" * 32, 7)
    (None, None)
    """
    if data is None or len(data) < _HEADER.size:
        return None
    magic, owner, held, length, checksum = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if (magic, owner, held, length) != (MAGIC, identity, index, len(payload)):
        return None
    if hashlib.blake2b(payload, digest_size=16).digest() != checksum:
        return None
    return payload


class _Folder:
    """Cache files in a local folder, written to a temporary name and renamed."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, name: str) -> bytes | None:
        try:
            return (self.root / name).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


class _StoreFolder:
    """Cache files in an object store under a URL's prefix, each written as one object, by each
    thread on its own copy of the store's filesystem."""

    def __init__(self, store: Store, prefix: Location) -> None:
        self._store, self._prefix = store, prefix
        self._filesystems = store.filesystems()

    def read(self, name: str) -> bytes | None:
        try:
            return self._store.read(self._filesystems.get(), self._at(name), _SOURCE)
        except FileNotFoundError:  # StorageNotFound: not cached yet
            return None

    def write(self, name: str, data: bytes) -> None:
        location, filesystem = self._at(name), self._filesystems.get()

        def write_once() -> None:
            try:
                with filesystem.open_output_stream(location.path) as stream:
                    stream.write(data)
            except OSError as error:
                raise self._store.explain(error, location, _SOURCE) from None

        self._store.retried(write_once)

    def _at(self, name: str) -> Location:
        path = f"{self._prefix.path.rstrip('/')}/{name}"
        return Location(path, self._store.shown(path))


def _folder(location: str) -> _Folder | _StoreFolder:
    """Where files under `location` go: a local folder (a path or `file://`) or a store."""
    if location.startswith("file://"):
        return _Folder(Path(location.removeprefix("file://")))
    found = store_of([location], None, _SOURCE, expand=False) if is_url(location) else None
    if found is None:
        return _Folder(Path(location))
    store, (prefix,) = found
    return _StoreFolder(store, prefix)


def _name(identity: bytes, index: int) -> str:
    """A record's file: under its identity, in folders of at most 4,096 records."""
    return f"{identity.hex()[:32]}/{index >> 12}/{index}.rec"


def _first(parent: Any) -> IndexArray:
    """The index of the record whose digest is part of the identity (none of no records)."""
    return np.arange(min(1, len(parent)), dtype=np.int64)
