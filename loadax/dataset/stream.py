"""Streams: `filter` and `pack` change how many records make a batch, so they are not random-access.

A stream reads the records of a random-access dataset in plan order and passes them through its
ops one window at a time. Each data shard has a stream of its own: with `shards` data shards,
shard `s` reads positions s, s + shards, s + 2 * shards, ... of the plan's record order (epochs
back to back). Window `k` of a shard is its positions [k * window, (k + 1) * window); what a window
yields depends on nothing else, so windows load in parallel, locally or on any worker, and a
loader cuts batches from their outputs in order. The order is deterministic for a fixed number
of data shards; changing it changes the batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic

import numpy as np
from typing_extensions import TypeVar

from loadax.dataset.names import callable_name, dataset_repr, from_loadax
from loadax.dataset.packing import PackedRow, Packer, PackingStrategy
from loadax.dataset.protocol import Dataset, as_dataset
from loadax.errors import RecordError
from loadax.validation import require_int

T = TypeVar("T", default=Any)
U = TypeVar("U", default=Any)

DEFAULT_WINDOW = 256
"""Records per window: each window is one unit of work, locally or on a worker."""

Origins = list[tuple[int, int]] | None
"""(record index, epoch) of each item of a window, while items are still single records."""


@dataclasses.dataclass(frozen=True, slots=True)
class Items:
    """Which items of a stream a loader yields: those from `start` on, up to `stop` (None: all).

    `take` and `skip` set them; the loader that cuts the batches applies them, since how many
    items a window yields is known only once it is loaded. With several data shards, each shard
    yields its share: `start` and `stop` must be multiples of the number of shards.
    """

    start: int = 0
    stop: int | None = None

    def taken(self, count: int) -> Items:
        stop = self.start + require_int("take", count, minimum=0)
        return Items(self.start, stop if self.stop is None else min(stop, self.stop))

    def skipped(self, count: int) -> Items:
        start = self.start + require_int("skip", count, minimum=0)
        return Items(start if self.stop is None else min(start, self.stop), self.stop)

    def per_shard(self, shards: int) -> tuple[int, int | None]:
        """The items each of `shards` data shards skips, and how many it yields then (None: all)."""
        bounds = [self.start] if self.stop is None else [self.start, self.stop]
        if any(bound % shards for bound in bounds):
            raise ValueError(
                f"a stream's take/skip ({self!r}) must be multiples of its {shards} data shards, "
                "each of which yields its share of the items"
            )
        taken = None if self.stop is None else (self.stop - self.start) // shards
        return self.start // shards, taken

    def __repr__(self) -> str:
        calls = "" if self.start == 0 else f".skip({self.start})"
        return calls + ("" if self.stop is None else f".take({self.stop - self.start})")


ALL_ITEMS = Items()
"""A stream without `take` or `skip`."""


class Stream(Generic[T]):
    """The records of `dataset` in plan order, passed through stream ops, `window` at a time.

    `InMemoryDataset(texts).map(tokenize).filter(lambda t: len(t) > 2).pack(128)` is a stream;
    a loader batches it by stacking rows (the default `Batcher()`).

    >>> from loadax import Batcher, DataLoader, Stream
    >>> stream = Stream(["a", "bb", "ccc", "dddd"]).map(len).filter(lambda n: n > 1)
    >>> [batch.tolist() for batch in DataLoader(Batcher()).batch_size(2).build(stream)]
    [[2, 3], [4]]
    >>> stream
    Stream(['a', 'bb', 'ccc', 'dddd']).map(len).filter(<lambda>)
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        window: int = DEFAULT_WINDOW,
        ops: Sequence[Callable[[list[Any], Origins], tuple[list[Any], Origins]]] = (),
        items: Items = ALL_ITEMS,
    ) -> None:
        self.dataset = as_dataset(dataset, "a stream reads a random-access dataset")
        self.window = require_int("window", window, minimum=1)
        self.ops = tuple(ops)
        self.items = items

    def filter(self, predicate: Callable[[T], bool]) -> Stream[T]:
        """Keep the records for which `predicate` returns True."""
        return self._then(Filter(_callable("predicate", predicate)))

    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        """Apply `fn` to every item of the stream (records, or packed rows)."""
        return self._then(StreamMap(_callable("fn", fn)))

    def pack(
        self,
        length: int,
        *,
        pad_value: int | float = 0,
        truncate: bool = False,
        strategy: PackingStrategy = "first_fit",
    ) -> Stream[PackedRow]:
        """Pack token sequences into rows of `length`, with segment ids and positions.

        Sequences are packed within each window (a larger window packs tighter); `strategy` is
        "first_fit" or "best_fit" (less padding); see `loadax.dataset.packing.Packer`.
        """
        return self._then(Pack(Packer(length, pad_value, truncate, strategy)))

    def take(self, count: int) -> Stream[T]:
        """The first `count` items of the stream (all of them when there are fewer).

        `take` and `skip` come last: items are counted once the window's ops have made them.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> odd = RangeDataset(0, 20).filter(lambda x: x % 2 == 1)
        >>> [batch.tolist() for batch in DataLoader(Batcher()).batch_size(2).build(odd.take(3))]
        [[1, 3], [5]]
        """
        return Stream(self.dataset, window=self.window, ops=self.ops, items=self.items.taken(count))

    def skip(self, count: int) -> Stream[T]:
        """The items of the stream after its first `count`.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> odd = RangeDataset(0, 12).filter(lambda x: x % 2 == 1)
        >>> [batch.tolist() for batch in DataLoader(Batcher()).batch_size(2).build(odd.skip(3))]
        [[7, 9], [11]]
        """
        return Stream(
            self.dataset, window=self.window, ops=self.ops, items=self.items.skipped(count)
        )

    def apply(self, records: list[Any], origins: Origins) -> list[Any]:
        """What the ops make of the records of one window (`origins` names them in errors)."""
        items: list[Any] = records
        for op in self.ops:
            items, origins = op(items, origins)
        return items

    def __repr__(self) -> str:
        ops = "".join(f".{op!r}" for op in self.ops)
        window = "" if self.window == DEFAULT_WINDOW else f", window={self.window}"
        dataset = dataset_repr(self.dataset)
        # loadax's `dataset.filter(...)` and `.pack(...)` start a stream of the default window.
        chains = from_loadax(self.dataset) and hasattr(self.dataset, "filter")
        if chains and not window and self.ops and not isinstance(self.ops[0], StreamMap):
            return f"{dataset}{ops}{self.items!r}"
        return f"Stream({dataset}{window}){ops}{self.items!r}"

    def _then(self, op: Callable[[list[Any], Origins], tuple[list[Any], Origins]]) -> Stream[Any]:
        if self.items != ALL_ITEMS and not isinstance(op, StreamMap):
            raise ValueError(
                f"{op!r} after take/skip: take and skip count the stream's last items, so they "
                "come after every filter and pack (a map may follow them)"
            )
        return Stream(self.dataset, window=self.window, ops=(*self.ops, op), items=self.items)


def _callable(name: str, fn: Any) -> Any:
    if not callable(fn):
        raise ValueError(f"{name} must be callable, got {fn!r}")
    return fn


@dataclasses.dataclass(frozen=True, slots=True)
class Filter:
    """Keeps the items for which `predicate` returns a true bool."""

    predicate: Callable[[Any], bool]

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        kept, kept_origins = [], []
        for position, item in enumerate(items):
            verdict = _each(self.predicate, item, position, origins, "filtering")
            if not isinstance(verdict, bool | np.bool_):
                raise _failure(
                    position,
                    origins,
                    TypeError(
                        f"filter predicate {callable_name(self.predicate)} returned {verdict!r}; "
                        "it must return a bool"
                    ),
                    "filtering",
                )
            if verdict:
                kept.append(item)
                if origins is not None:
                    kept_origins.append(origins[position])
        return kept, None if origins is None else kept_origins

    def __repr__(self) -> str:
        return f"filter({callable_name(self.predicate)})"


@dataclasses.dataclass(frozen=True, slots=True)
class StreamMap:
    """Applies `fn` to every item."""

    fn: Callable[[Any], Any]

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        mapped = [
            _each(self.fn, item, position, origins, "mapping")
            for position, item in enumerate(items)
        ]
        return mapped, origins

    def __repr__(self) -> str:
        return f"map({callable_name(self.fn)})"


@dataclasses.dataclass(frozen=True, slots=True)
class Pack:
    """Packs the window's sequences into rows; after it, items are rows, not records."""

    packer: Packer

    def __call__(self, items: list[Any], origins: Origins) -> tuple[list[Any], Origins]:
        indices = None if origins is None else [index for index, _ in origins]
        return self.packer(items, indices), None

    def __repr__(self) -> str:
        packer = self.packer
        options = "" if packer.pad_value == 0 else f", pad_value={packer.pad_value!r}"
        options += ", truncate=True" if packer.truncate else ""
        options += f", strategy={packer.strategy!r}" if packer.strategy != "first_fit" else ""
        return f"pack({packer.length}{options})"


def _each(fn: Callable[[Any], Any], item: Any, position: int, origins: Origins, what: str) -> Any:
    try:
        return fn(item)
    except Exception as error:
        raise _failure(position, origins, error, what) from error


def _failure(position: int, origins: Origins, error: Exception, what: str) -> Exception:
    """An error naming the record (or, after packing, the row) that `error` happened on."""
    if origins is not None:
        index, epoch = origins[position]
        failure = RecordError(index, epoch, error)
        failure.__cause__ = error
        return failure
    error.add_note(f"loadax: while {what} packed row {position} of its window")
    return error
