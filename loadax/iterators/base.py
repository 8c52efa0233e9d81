"""`LoaderIterator`: what iterating any loader gives, checkpointable, restorable and closable."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from typing import Any

from typing_extensions import TypeVar

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

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6)))
        >>> _ = next(iterator)
        >>> state = iterator.get_state()
        >>> sorted(state), state["step"], state["plan"]["batch_size"]
        (['plan', 'step', 'version'], 1, 2)
        >>> iterator.close()
        """

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a state of `get_state()`; a state of another plan is a ValueError.

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

    def __enter__(self) -> LoaderIterator[B]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
