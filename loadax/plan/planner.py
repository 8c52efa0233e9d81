"""The deterministic shard planner: which global records make the batch of each step.

A plan is pure and holds no state: the indices of step `s` are computed from the plan's
parameters alone, in O(1) memory for any number of records. Batches never span two epochs; the
last batch of an epoch is short unless `drop_remainder` is set. With `shuffle`, every epoch is a
different keyed permutation of the records.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import numpy.typing as npt

from loadax.plan.permutation import IndexArray, KeyPurpose, derive_key, permute
from loadax.validation import require_bool, require_int

PLAN_VERSION = 1
"""Bumped whenever a change would alter which records a step gets."""

Rows = slice | npt.ArrayLike
"""Positions within a batch: a slice, or a sequence/array of ints."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """Global record indices of every step for `num_records` records in batches of `batch_size`.

    >>> from loadax import Plan
    >>> plan = Plan(num_records=10, batch_size=4, seed=0, shuffle=True, num_epochs=2)
    >>> plan.num_steps, plan.indices(0).tolist(), plan.indices(3).tolist()
    (6, [9, 8, 6, 0], [3, 8, 6, 0])
    """

    num_records: int
    batch_size: int
    seed: int = 0
    shuffle: bool = False
    num_epochs: int | None = 1
    drop_remainder: bool = False
    # Derived once: every step asks for them.
    _steps_per_epoch: int = dataclasses.field(init=False, repr=False, compare=False)
    _num_steps: int | None = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, minimum in (
            ("num_records", 0),
            ("batch_size", 1),
            ("seed", 0),
            ("num_epochs", 1),
        ):
            value = getattr(self, name)
            if value is not None or name != "num_epochs":
                # Stored normalised, so that numpy ints still describe() as JSON.
                object.__setattr__(self, name, require_int(name, value, minimum=minimum))
        require_bool("shuffle", self.shuffle)
        require_bool("drop_remainder", self.drop_remainder)
        if self.drop_remainder:
            per_epoch = self.num_records // self.batch_size
        else:
            per_epoch = -(-self.num_records // self.batch_size)
        object.__setattr__(self, "_steps_per_epoch", per_epoch)
        epochs = self.num_epochs
        total = 0 if per_epoch == 0 else None if epochs is None else epochs * per_epoch
        object.__setattr__(self, "_num_steps", total)

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch, the short last one included unless `drop_remainder`.

        >>> from loadax import Plan
        >>> Plan(10, 4).steps_per_epoch, Plan(10, 4, drop_remainder=True).steps_per_epoch
        (3, 2)
        """
        return self._steps_per_epoch

    @property
    def num_steps(self) -> int | None:
        """Steps in the whole plan; None when it runs forever.

        >>> from loadax import Plan
        >>> Plan(10, 4, num_epochs=2).num_steps, Plan(10, 4, num_epochs=None).num_steps
        (6, None)
        """
        return self._num_steps

    def epoch(self, step: int) -> int:
        """The epoch that `step` belongs to.

        >>> from loadax import Plan
        >>> [Plan(10, 4, num_epochs=2).epoch(step) for step in range(6)]
        [0, 0, 0, 1, 1, 1]
        """
        return self._check_step(step) // self.steps_per_epoch

    def epoch_steps(self, epoch: int) -> range:
        """The steps of `epoch`: its batches, the short last one included unless
        `drop_remainder`. Defined for every epoch, also past `num_epochs` (see `extended_to`).

        >>> from loadax import Plan
        >>> plan = Plan(10, 4, num_epochs=2)
        >>> plan.epoch_steps(0), plan.epoch_steps(1), plan.epoch_steps(5)
        (range(0, 3), range(3, 6), range(15, 18))
        """
        epoch = require_int("epoch", epoch, minimum=0)
        return range(epoch * self.steps_per_epoch, (epoch + 1) * self.steps_per_epoch)

    def extended_to(self, epoch: int) -> Plan:
        """This plan if it runs `epoch`; else the same plan without an end (`num_epochs=None`).

        A step's records depend on everything but `num_epochs`, which only says where the plan
        ends: both plans give every step they share the same records.

        >>> from loadax import Plan
        >>> plan = Plan(10, 4, seed=1, shuffle=True, num_epochs=2)
        >>> plan.extended_to(1) is plan, plan.extended_to(2).num_epochs
        (True, None)
        >>> three = Plan(10, 4, seed=1, shuffle=True, num_epochs=3)
        >>> [three.indices(step).tolist() for step in (3, 6)]
        [[0, 6, 9, 8], [7, 1, 9, 0]]
        >>> [plan.extended_to(2).indices(step).tolist() for step in (3, 6)]
        [[0, 6, 9, 8], [7, 1, 9, 0]]
        """
        epoch = require_int("epoch", epoch, minimum=0)
        if self.num_epochs is None or epoch < self.num_epochs:
            return self
        return dataclasses.replace(self, num_epochs=None)

    def batch_length(self, step: int) -> int:
        """How many records the batch of `step` has (short only at the end of an epoch).

        >>> from loadax import Plan
        >>> [Plan(10, 4).batch_length(step) for step in range(3)]
        [4, 4, 2]
        """
        first = (self._check_step(step) % self.steps_per_epoch) * self.batch_size
        return min(self.batch_size, self.num_records - first)

    def indices(self, step: int, rows: Rows | None = None) -> IndexArray:
        """The global record indices of `step`, or of just `rows` (positions in its batch).

        >>> from loadax import Plan
        >>> Plan(10, 4).indices(1).tolist(), Plan(10, 4).indices(1, rows=[0, 3]).tolist()
        ([4, 5, 6, 7], [4, 7])
        """
        epoch = self.epoch(step)
        length = self.batch_length(step)
        first = (step % self.steps_per_epoch) * self.batch_size
        positions = first + row_positions(rows, length)
        if not self.shuffle:
            return positions
        key = derive_key(KeyPurpose.PLAN_SHUFFLE, self.seed, epoch)
        return permute(positions, self.num_records, key)

    def records_at(self, positions: IndexArray) -> tuple[IndexArray, IndexArray]:
        """The record index and epoch at each position of the plan's record order.

        The order is every epoch's records back to back (in their shuffled order with
        `shuffle`), as streams read them; batches play no part in it.

        >>> import numpy as np
        >>> from loadax import Plan
        >>> indices, epochs = Plan(3, 2, num_epochs=2).records_at(np.arange(6))
        >>> indices.tolist(), epochs.tolist()
        ([0, 1, 2, 0, 1, 2], [0, 0, 0, 1, 1, 1])
        """
        if self.num_records == 0:
            raise IndexError("a plan over no records has no positions")
        epochs, offsets = np.divmod(positions, self.num_records)
        if not self.shuffle:
            return offsets, epochs
        indices = np.empty_like(offsets)
        for epoch in np.unique(epochs).tolist():
            chosen = epochs == epoch
            key = derive_key(KeyPurpose.PLAN_SHUFFLE, self.seed, epoch)
            indices[chosen] = permute(offsets[chosen], self.num_records, key)
        return indices, epochs

    def describe(self) -> dict[str, Any]:
        """A JSON-able fingerprint: two plans with equal descriptions yield the same batches.

        >>> from loadax import Plan
        >>> Plan(10, 4).describe()  # doctest: +NORMALIZE_WHITESPACE
        {'version': 1, 'num_records': 10, 'batch_size': 4, 'seed': 0, 'shuffle': False,
         'num_epochs': 1, 'drop_remainder': False}
        """
        given = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        return {"version": PLAN_VERSION, **{k: v for k, v in given.items() if k[0] != "_"}}

    def _check_step(self, step: int) -> int:
        if type(step) is not int or step < 0:  # the common case skips the checked conversion
            step = require_int("step", step, minimum=0)
        total = self._num_steps
        if total is not None and step >= total:
            raise IndexError(f"step {step} is beyond the plan's {total} steps")
        return step


def row_positions(rows: Rows | None, length: int) -> IndexArray:
    """The positions `rows` names in a batch of `length` rows (None: all), checked."""
    if rows is None:
        return np.arange(length, dtype=np.int64)
    if isinstance(rows, slice):
        start, stop, stride = rows.indices(length)
        return np.arange(start, stop, stride, dtype=np.int64)
    positions = np.asarray(rows)
    if positions.ndim != 1 or not (
        positions.size == 0 or np.issubdtype(positions.dtype, np.integer)
    ):
        raise ValueError(f"rows must be a slice or a 1-D sequence of ints, got {rows!r}")
    if positions.size and (positions.min() < 0 or positions.max() >= length):
        raise IndexError(f"rows {positions.tolist()} fall outside the batch of {length} rows")
    return positions.astype(np.int64)
