"""`LoaderIterator`: what iterating any loader gives, checkpointable, restorable and closable."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from typing_extensions import TypeVar

from loadax.state.checks import epoch_of

B = TypeVar("B", default=Any)


class LoaderIterator(Iterator[B], abc.ABC):
    """An iterator over a loader's batches that can be checkpointed, restored and closed.

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
    >>> with iter(loader) as iterator:
    ...     first = next(iterator).tolist()
    ...     state = iterator.get_state()
    >>> resumed = iter(loader)
    >>> resumed.set_state(state)
    >>> first, [batch.tolist() for batch in resumed]
    ([0, 1], [[2, 3], [4, 5]])
    """

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """A small JSON-able dict: restoring it yields exactly the batches that would come next.

        It records the loader's pipeline fingerprint (`Loader.fingerprint()`), computed at the
        first `get_state` or `set_state` of any of the loader's iterators.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
        >>> iterator = iter(loader)
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> sorted(state), state["step"], state["plan"]["batch_size"]
        (['fingerprint', 'plan', 'position', 'step', 'version'], 1, 2)
        >>> state["fingerprint"] == loader.fingerprint()
        True
        >>> iterator.close()
        """

    @abc.abstractmethod
    def set_state(
        self,
        state: dict[str, Any],
        *,
        allow_new_pipeline: bool = False,
        allow_new_batch_size: bool = False,
    ) -> None:
        """Continue from a state of `get_state()`; a state of another plan is a ValueError.

        So is a state saved by a loader of another pipeline (its fingerprint differs: the
        pipeline's code or its probe batch changed), unless `allow_new_pipeline`: then the new
        pipeline continues from the state's step. A state without a fingerprint (saved by loadax
        before fingerprints) is not checked.

        A state of a plan that differs in its batch size (or schedule) only is refused too,
        unless `allow_new_batch_size`: then the epoch under way continues from its first record
        not yet delivered, in this loader's batch sizes from the state's step on, and the later
        epochs are this loader's. Every record of the epoch comes once across the change.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(2)
        >>> iterator = iter(builder.build(RangeDataset(0, 6)))
        >>> _ = next(iterator)
        >>> iterator.set_state(iterator.get_state())  # restoring moves nothing
        >>> next(iterator).tolist()
        [2, 3]
        >>> shuffled = builder.shuffle(seed=1).build(RangeDataset(0, 6))
        >>> iter(shuffled).set_state(iterator.get_state())  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        ValueError: iterator state belongs to another plan: seed is 0 in the state but 1 in this
        loader; shuffle is False in the state but True in this loader
        >>> doubled = builder.build(RangeDataset(0, 6).map(lambda x: 2 * x))
        >>> tripled = builder.build(RangeDataset(0, 6).map(lambda x: 3 * x))
        >>> state = iter(doubled).get_state()
        >>> iter(tripled).set_state(state)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: iterator state was saved by a loader of pipeline ...
        >>> resumed = iter(tripled)
        >>> resumed.set_state(state, allow_new_pipeline=True)
        >>> next(resumed).tolist()
        [0, 3]
        >>> wider = DataLoader(Batcher()).batch_size(4).build(RangeDataset(0, 6))
        >>> resumed = iter(wider)
        >>> resumed.set_state(iterator.get_state(), allow_new_batch_size=True)
        >>> [batch.tolist() for batch in resumed]  # the epoch goes on from record 4
        [[4, 5]]
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Stop loading and release threads; the iterator is exhausted afterwards.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6)))
        >>> next(iterator).tolist()
        [0, 1]
        >>> iterator.close()
        >>> next(iterator, "exhausted")
        'exhausted'
        """

    @property
    def step(self) -> int:
        """The step of the batch `next()` yields next: how many batches of the whole plan come
        before it (`get_state()["step"]`; a stream counts the batches it yielded).

        So right after the n-th batch of a fresh `iter(loader)`, `step` is n; for
        `loader.epoch(e)`, steps go on from `e * steps_per_epoch`, as in a plan of many epochs.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
        >>> iterator = iter(loader)
        >>> [iterator.step for _ in iterator], iterator.step
        ([1, 2, 3], 3)
        >>> iterator = loader.epoch(2)
        >>> iterator.step, [iterator.step for _ in iterator]
        (6, [7, 8, 9])
        """
        return int(self.get_state()["step"])

    @property
    def epoch(self) -> int:
        """The epoch of the batch `next()` yields next; for `loader.epoch(e)`'s iterator, `e`.

        A plain iterator that has yielded the last batch of an epoch is in the next one (past
        the plan's end once it is exhausted). A stream's batches may span epochs: its epoch is
        that of the first record of the window its next batch starts in.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(RangeDataset(0, 4))
        >>> iterator = iter(loader)
        >>> iterator.epoch, next(iterator).tolist(), iterator.epoch, next(iterator).tolist()
        (0, [0, 1], 0, [2, 3])
        >>> iterator.epoch  # the last batch of epoch 0 is behind it
        1
        >>> iterator = loader.epoch(1)
        >>> [iterator.epoch for _ in iterator]
        [1, 1]
        """
        return epoch_of(self.get_state())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} at step {self.step}, epoch {self.epoch}>"

    def __enter__(self) -> LoaderIterator[B]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
