"""Bad-record policies: what a loader does when one record of a batch fails to load.

`RecordErrors("skip")` drops the record from its batch, `"replace"` fills its row with the next
record of the same epoch that loads (in the epoch's delivery order, wrapping to its start).
Both sit above any executor (the calling thread, threads, processes, workers): a batch whose
load raises a `RecordError` is asked for again without the failing rows, and each replacement
is a one-row batch of the step that holds it, spliced in. So the batch depends only on which
records fail, never on who loaded it, and a worker computes nothing new. A storage outage is a
`StorageError`, never a `RecordError`: it is raised as ever. A budget per epoch turns a flood of
failures back into an error.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args

import jax
import numpy as np

from loadax.errors import PoisonedRecords, RecordError, TooManyBadRecords
from loadax.execution.executor import Executor, Pending
from loadax.iterators.stats import BadRecord
from loadax.logfields import fields
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan, row_positions
from loadax.plan.work import StepWork, Work

log = logging.getLogger(__name__)

RecordErrorMode = Literal["raise", "skip", "replace"]
DEFAULT_BUDGET = 0.001
"""Bad records allowed per epoch by default: 0.1 % of its records (at least 1)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RecordErrors:
    """The policy for records that fail: `mode`, and `budget`, the bad records allowed in one
    epoch before the loader raises `TooManyBadRecords` (an int; or a float < 1: that share of
    the epoch's records, at least 1).

    >>> from loadax.execution.record_errors import RecordErrors
    >>> RecordErrors("skip").allowed(50_000), RecordErrors("skip", 0.01).allowed(10)
    (50, 1)
    >>> RecordErrors("ignore")
    Traceback (most recent call last):
    ...
    ValueError: on_record_error must be one of ['raise', 'skip', 'replace'], got 'ignore'
    """

    mode: RecordErrorMode = "raise"
    budget: int | float = DEFAULT_BUDGET

    def __post_init__(self) -> None:
        if self.mode not in get_args(RecordErrorMode):
            raise ValueError(
                f"on_record_error must be one of {list(get_args(RecordErrorMode))}, "
                f"got {self.mode!r}"
            )
        budget = self.budget
        fraction = isinstance(budget, float) and 0 < budget < 1
        whole = isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0
        if not (fraction or whole):
            raise ValueError(
                "on_record_error(budget=...) must be an int >= 0 (bad records per epoch) or a "
                f"float in (0, 1) (a share of the epoch's records), got {budget!r}"
            )

    def allowed(self, records_per_epoch: int) -> int:
        """The bad records allowed in an epoch of `records_per_epoch` records."""
        if isinstance(self.budget, int):
            return self.budget
        return max(1, math.floor(self.budget * records_per_epoch))

    def call(self) -> str:
        """The builder call that sets this policy."""
        budget = "" if self.budget == DEFAULT_BUDGET else f", budget={self.budget!r}"
        return f"on_record_error({self.mode!r}{budget})"


class TolerantExecutor(Executor[Any]):
    """`executor`, with `policy` applied to the batches of random-access work; each bad record
    is reported to `report` when the training loop takes its batch (so in step order)."""

    def __init__(
        self, executor: Executor[Any], policy: RecordErrors, report: Callable[[BadRecord], None]
    ) -> None:
        self._executor, self._policy, self._report = executor, policy, report
        self._epoch = -1
        self._bad_by_step: dict[int, int] = {}  # of the epoch's steps loaded so far

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        if not isinstance(work, StepWork):
            raise TypeError("bad-record policies apply to batches, not to a stream's windows")
        return _Tolerant(self, plan, work)

    def lookahead(self, prefetch: int) -> int:
        return self._executor.lookahead(prefetch)

    def release(self, wait: bool) -> None:
        self._executor.release(wait)

    def load(self, plan: Plan, step: int, rows: IndexArray | None) -> Pending[Any]:
        """Start loading the `rows` of the batch of `step` (None: all of them)."""
        return self._executor.submit(plan, StepWork(step, rows))

    def counted(self, plan: Plan, step: int, bad: int, error: RecordError) -> None:
        """Note that `step` has `bad` bad records so far (a step loaded again after a restore
        counts once): `TooManyBadRecords` once its epoch has more than the budget."""
        epoch = plan.epoch(step)
        if epoch != self._epoch:
            self._epoch, self._bad_by_step = epoch, {}
        self._bad_by_step[step] = bad
        total, allowed = sum(self._bad_by_step.values()), self._policy.allowed(plan.num_records)
        if total > allowed:
            raise TooManyBadRecords(
                error,
                f"{total} bad records in epoch {epoch}, more than the on_record_error budget "
                f"of {allowed}",
            ) from error

    def reported(self, record: BadRecord) -> None:
        log.warning(
            "record %d (epoch %d) of step %d failed and was %s: %s",
            record.index,
            record.epoch,
            record.step,
            record.action,
            record.cause,
            extra=fields(event="bad_record", step=record.step, error=record.cause),
        )
        self._report(record)

    @property
    def mode(self) -> RecordErrorMode:
        return self._policy.mode

    def search_limit(self, plan: Plan) -> int:
        """How many failing records a replacement may pass over before the loader gives up."""
        return self._policy.allowed(plan.num_records)


class _Tolerant:
    """One batch under a bad-record policy, settled when the training loop asks for it."""

    def __init__(self, owner: TolerantExecutor, plan: Plan, work: StepWork) -> None:
        self._owner, self._plan, self._step = owner, plan, work.step
        self._rows = row_positions(work.rows, plan.batch_length(work.step))
        self._pending = owner.load(plan, work.step, work.rows)

    def cancel(self) -> None:
        self._pending.cancel()

    def result(self, timeout: float | None = None) -> Any:
        owner, plan, step = self._owner, self._plan, self._step
        rows, bad = self._rows, []
        while True:
            try:
                batch = self._pending.result(timeout)
                break
            except PoisonedRecords:
                raise  # it kills what loads it: no record of it is known to be at fault
            except RecordError as error:
                row = _row_of(plan, step, rows, error)
                bad.append((row, error))
                owner.counted(plan, step, len(bad), error)
                rows = rows[rows != row]
                if not rows.size and owner.mode == "skip":
                    error.add_note(f"loadax: every record of the batch of step {step} failed")
                    raise
                if not rows.size:
                    batch = None
                    break
                self._pending = owner.load(plan, step, rows)
        if not bad:
            return batch
        bad.sort(key=lambda found: found[0])
        if owner.mode == "skip":
            for row, failure in bad:
                owner.reported(_bad_record(plan, step, row, failure, "skipped"))
            return batch
        replacements = {}
        for row, failure in bad:
            index, replacement = _replacement(owner, plan, step, row)
            replacements[row] = replacement
            owner.reported(_bad_record(plan, step, row, failure, f"replaced by record {index}"))
        return _spliced(self._rows, batch, replacements)


def _row_of(plan: Plan, step: int, rows: IndexArray, error: RecordError) -> int:
    """The row of the batch of `step` (among `rows`) whose record `error` names; a record error
    that names none of them is raised as it is."""
    indices = plan.indices(step, rows)
    matches = np.flatnonzero(indices == error.index)
    if error.epoch != plan.epoch(step) or not matches.size:
        raise error
    return int(rows[matches[0]])


def _bad_record(plan: Plan, step: int, row: int, error: RecordError, action: str) -> BadRecord:
    cause = error.__cause__
    kind = getattr(cause, "type_name", type(cause).__name__)
    return BadRecord(error.index, error.epoch, step, row, f"{kind}: {cause}", action)


def _replacement(owner: TolerantExecutor, plan: Plan, step: int, row: int) -> tuple[int, Any]:
    """The record index and the one-row batch of the next record of the epoch after the row
    `row` of step `step` that loads, in delivery order, wrapping to the epoch's start."""
    passed = 0
    for candidate_step, candidate_row in _after(plan, step, row):
        position = np.array([candidate_row], dtype=np.int64)
        try:
            batch = owner.load(plan, candidate_step, position).result()
        except PoisonedRecords:
            raise
        except RecordError as error:
            passed += 1
            if passed > owner.search_limit(plan):
                raise TooManyBadRecords(
                    error,
                    f"the {passed} records after row {row} of step {step} failed too, more "
                    "than the on_record_error budget; none could replace it",
                ) from error
            continue
        return int(plan.indices(candidate_step, position)[0]), batch
    raise RecordError(
        int(plan.indices(step, [row])[0]),
        plan.epoch(step),
        ValueError("no record of its epoch loads to replace it"),
    )


def _after(plan: Plan, step: int, row: int) -> Iterator[tuple[int, int]]:
    """The (step, row) of every record of the epoch of `step` after row `row` of it, in order,
    wrapping to the epoch's first step, up to the row before it."""
    steps = plan.epoch_steps(plan.epoch(step))
    order = [*range(step, steps.stop), *range(steps.start, step + 1)]
    for position, candidate in enumerate(order):
        length = plan.batch_length(candidate)
        first = row + 1 if position == 0 else 0
        last = row if position == len(order) - 1 else length
        for candidate_row in range(first, last):
            yield candidate, candidate_row


def _spliced(rows: IndexArray, batch: Any, replacements: dict[int, Any]) -> Any:
    """The batch of `rows`: each row from `replacements` if it is there, else the next of
    `batch`'s rows. Each leaf must hold one row per record along its first axis."""
    parts, start = [], 0
    try:
        for row in rows.tolist():
            if row in replacements:
                parts.append(replacements[row])
            else:
                parts.append(jax.tree.map(lambda leaf, at=start: leaf[at : at + 1], batch))
                start += 1
        return jax.tree.map(lambda *leaves: np.concatenate(leaves), *parts)
    except (TypeError, ValueError, IndexError) as error:
        raise ValueError(
            "on_record_error('replace') splices rows into the batch: each leaf of a batch must be "
            "an array with one row per record along its first axis, of one shape (as "
            f"Batcher() stacks them); splicing failed: {error}"
        ) from error
