"""Saying so when a loader's epochs are silently repeated.

A loader is a stateless definition: every `iter(loader)` starts at step 0 of its plan. So
`for epoch in range(E): for batch in loader:` on a loader of one epoch gives epoch 0's batches
E times, in the same order, shuffled or not. When a loader's batches differ between epochs (a
shuffle, a random map), that is almost never what was meant: the second time an iterator runs
through the whole plan from step 0, a `RepeatedEpochWarning` says what to use instead,
`loader.epoch(e)` or `.num_epochs(E)`. Iterators that were restored, or stopped early, are not
full passes: comparing a run with a resumed one does not warn.
"""

from __future__ import annotations

import threading
import warnings


class RepeatedEpochWarning(UserWarning):
    """A loader whose batches differ between epochs ran through its plan from step 0 twice.

    Both passes yielded the same epochs, in the same order: iterate `loader.epoch(e)` for a new
    order in each epoch e, or build the loader with `.num_epochs(E)`. Ignore it where the same
    batches twice are what you mean (a test that compares two runs):
    `warnings.filterwarnings("ignore", category=RepeatedEpochWarning)`.

    >>> import warnings
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> loader = DataLoader(Batcher()).batch_size(2).shuffle(seed=0).build(RangeDataset(0, 4))
    >>> first = [batch.tolist() for batch in loader]
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     again = [batch.tolist() for batch in loader]
    >>> again == first, [type(warning.message).__name__ for warning in caught]
    (True, ['RepeatedEpochWarning'])
    """


class Passes:
    """Counts a loader's full passes: iterators that ran from step 0, unrestored, to the end.

    `varies` says whether the loader's batches differ between epochs; only then does the second
    full pass warn, once per loader.
    """

    def __init__(self, varies: bool) -> None:
        self._varies = varies
        self._count = 0
        self._lock = threading.Lock()

    def finished(self, stacklevel: int) -> None:
        """An iterator made a full pass; `stacklevel` is the caller's distance from the loop."""
        with self._lock:
            self._count += 1
            second = self._count == 2
        if second and self._varies:
            warnings.warn(
                "this loader has now run through its plan twice from step 0, with the same "
                "epochs in the same order both times, though its batches differ between epochs "
                "(a shuffle or a random map): iter(loader) always starts at step 0. For a new "
                "order in each epoch, iterate loader.epoch(e) for e in range(E), or build it "
                "with .num_epochs(E)",
                RepeatedEpochWarning,
                stacklevel=stacklevel + 1,
            )
