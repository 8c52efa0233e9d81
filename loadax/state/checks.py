"""The iterator state's format: a small JSON-able dict, checked against the loader restoring it.

Every state holds `version`, `step` (the step the restored iterator yields next), `plan` and the
loader's pipeline `fingerprint`; the state of an iterator of one epoch (`Loader.epoch(e)`) holds
its `epoch` too, and a stream's its cursors (`stream`). A random-access loader's state holds the
`position` of its step (its epoch and the records of it delivered), so that a loader of another
batch size can continue the epoch (`allow_new_batch_size`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loadax.identity.fingerprint import SHORT_FINGERPRINT
from loadax.plan.planner import Plan
from loadax.plan.segments import Position
from loadax.validation import is_int

STATE_VERSION = 2
"""The version of the states saved; version 1 (before fingerprints) is the same without one."""
READ_VERSIONS = (1, STATE_VERSION)


BATCH_SIZE_KEYS = ("batch_size", "batch_size_changes", "start")
"""The parts of a plan's description that a new batch size (`allow_new_batch_size`) may change."""


def restored(state: Any, plan: Plan, allow_new_batch_size: bool) -> tuple[Plan, int]:
    """The plan an iterator of `plan` continues `state` with, and the state's step, checked.

    That is `plan` for a state of `plan`; `plan` resumed where the state's plan was resumed, for
    a state of an iterator of this loader that once restored with a new batch size; with
    `allow_new_batch_size`, `plan` resumed at the state's position, for a state of a plan that
    differs in its batch sizes only.
    """
    step = _checked(state, plan, allow_new_batch_size)
    saved = state["plan"]
    if saved == plan.describe():
        return plan, step
    start = saved.get("start")
    if isinstance(start, dict):
        try:
            same = plan.resumed(start["step"], Position(start["epoch"], start["delivered"]))
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise ValueError(f"iterator state has plan start {start!r}: {error}") from None
        if same.describe() == saved:
            return same, step
    if not allow_new_batch_size:
        raise _new_batch_size(_plan_differences(saved, plan, ()))
    return plan.resumed(step, _position(state, step)), step


def _new_batch_size(differences: str) -> ValueError:
    return ValueError(
        f"iterator state belongs to another plan: {differences}; restore with "
        "set_state(state, allow_new_batch_size=True) to continue its epoch in this "
        "loader's batch sizes"
    )


def checked_step(state: Any, plan: Plan, allow_new_batch_size: bool = False) -> int:
    """The step of an iterator state, after checking the state belongs to `plan` (or, with
    `allow_new_batch_size`, to a plan that differs in its batch sizes only)."""
    step = _checked(state, plan, allow_new_batch_size)
    return _in_plan(state, plan, step)


def checked_plan_step(state: Any, plan: Plan, allow_new_batch_size: bool) -> tuple[Plan, int]:
    """`restored`'s plan and step, the step checked to lie within that plan."""
    resumed, step = restored(state, plan, allow_new_batch_size)
    return resumed, _in_plan(state, resumed, step)


def checked_epoch_step(state: Any, plan: Plan, epoch: int) -> int:
    """The step of a state restored into an iterator of `epoch` of `plan` (as `restored` gives
    it): a step of that epoch, or the step right after it (the epoch's end, which is also the
    next epoch's start)."""
    step = int(state["step"])
    steps = plan.epoch_steps(epoch)
    if not steps.start <= step <= steps.stop:
        saved = state.get("epoch")
        if not is_int(saved, minimum=0):
            saved = plan.extended_to(epoch).position(step).epoch
        raise ValueError(
            f"iterator state has step {step}, in epoch {saved}; this iterator yields epoch "
            f"{epoch} (steps {steps.start} to {steps.stop - 1}): restore it into "
            f"loader.epoch({saved})"
        )
    return step


def _in_plan(state: dict[str, Any], plan: Plan, step: int) -> int:
    total = plan.num_steps
    if total is not None and step > total:
        epoch = state.get("epoch")
        where = (
            f"; it is a state of loader.epoch({epoch}): restore it into that iterator"
            if is_int(epoch, minimum=0)
            else ""
        )
        raise ValueError(f"iterator state has step {step}, beyond the plan's {total} steps{where}")
    return step


def _position(state: dict[str, Any], step: int) -> Position:
    """Where the state's step starts in its epoch: as the state records it, or (a state saved
    before states recorded it) as its plan, of one batch size, gives it."""
    position = state.get("position")
    if isinstance(position, dict) and {"epoch", "delivered"} <= position.keys():
        if not is_int(position["epoch"], minimum=0):
            raise ValueError(f"iterator state has position {position!r}: its epoch is no int")
        return Position(int(position["epoch"]), _cursor(position["delivered"]))
    saved = state["plan"]
    try:
        plain = Plan(**{key: saved[key] for key in _PLAIN_KEYS})
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(
            f"iterator state has no position and a plan {saved!r} it cannot be found from: {error}"
        ) from None
    return plain.position(step)


def _cursor(delivered: Any) -> Any:
    return tuple(delivered) if isinstance(delivered, list) else delivered


_PLAIN_KEYS = ("num_records", "batch_size", "seed", "shuffle", "num_epochs", "drop_remainder")


def epoch_of(state: dict[str, Any]) -> int:
    """The epoch an iterator with this state is in: the epoch of the step it yields next (for
    `Loader.epoch(e)`'s iterators, always `e`; for a stream, of the first record of the window
    its next batch starts in).

    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.state.checks import epoch_of
    >>> loader = DataLoader(Batcher()).batch_size(2).num_epochs(3).build(RangeDataset(0, 4))
    >>> state = iter(loader).get_state()
    >>> [epoch_of({**state, "step": step}) for step in range(7)]
    [0, 0, 1, 1, 2, 2, 3]
    >>> epoch_of(loader.epoch(1).get_state())
    1
    """
    if "epoch" in state:
        return int(state["epoch"])
    plan = state["plan"]
    records, batch_size = plan["num_records"], plan["batch_size"]
    if "stream" in state and records:
        stream = state["stream"]
        window, shards = stream["window"], stream["shards"]
        starts = [
            (cursor[0] * window * shards + int(shard)) // records
            for shard, cursor in stream["cursors"].items()
        ]
        return min(starts, default=0)
    if "position" in state and any(key in plan for key in (*BATCH_SIZE_KEYS[1:], "buckets")):
        return int(state["position"]["epoch"])  # the plan's batches are not all of one size
    per_epoch = records // batch_size if plan["drop_remainder"] else -(-records // batch_size)
    return int(state["step"]) // per_epoch if per_epoch else 0


def _checked(state: Any, plan: Plan, allow_new_batch_size: bool = False) -> int:
    """The step of a state whose version and plan are checked (its range is not); its batch
    sizes only when not `allow_new_batch_size`, and not when the state's plan was resumed with
    a new batch size (`restored` checks that)."""
    if not isinstance(state, dict):
        raise ValueError(f"iterator state must be a dict, got {type(state).__name__}")
    missing = {"version", "step", "plan"} - state.keys()
    if missing:
        raise ValueError(f"iterator state lacks {sorted(missing)}: got keys {sorted(state)}")
    if state["version"] not in READ_VERSIONS:
        raise ValueError(
            f"iterator state has version {state['version']!r}; this loadax reads versions "
            f"{' and '.join(map(str, READ_VERSIONS))}"
        )
    saved = state["plan"]
    if not isinstance(saved, dict):
        raise ValueError(f"iterator state has plan {saved!r}; it must be a dict")
    differences = _plan_differences(saved, plan, BATCH_SIZE_KEYS)
    if differences:
        raise ValueError(f"iterator state belongs to another plan: {differences}")
    if not (allow_new_batch_size or "start" in saved):
        differences = _plan_differences(saved, plan, ())
        if differences:
            raise _new_batch_size(differences)
    step = state["step"]
    if not is_int(step, minimum=0):
        raise ValueError(f"iterator state has step {step!r}; it must be an int >= 0")
    return int(step)


def check_fingerprint(state: Any, fingerprint: Callable[[], str], allow_new_pipeline: bool) -> None:
    """A ValueError when `state` was saved by a loader of another pipeline (its fingerprint is
    not `fingerprint()`), unless `allow_new_pipeline`. A state without one (version 1) passes,
    and so does what is no state at all (the checks of its plan name it).

    >>> from loadax.state.checks import check_fingerprint
    >>> check_fingerprint({"fingerprint": "ab" * 32}, lambda: "ab" * 32, False)
    >>> check_fingerprint({"fingerprint": "ab" * 32}, lambda: "cd" * 32, True)
    >>> check_fingerprint({"fingerprint": "ab" * 32}, lambda: "cd" * 32, False)
    ... # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: iterator state was saved by a loader of pipeline abababababab..., but this
    loader's pipeline is cdcdcdcdcdcd... (its code or its probe batch changed); restore with
    set_state(state, allow_new_pipeline=True) to continue with the new pipeline ...
    """
    saved = state.get("fingerprint") if isinstance(state, dict) else None
    if saved is None or allow_new_pipeline:
        return
    if not isinstance(saved, str):
        raise ValueError(f"iterator state has fingerprint {saved!r}; it must be a str")
    current = fingerprint()
    if saved != current:
        raise ValueError(
            f"iterator state was saved by a loader of pipeline {saved[:SHORT_FINGERPRINT]}..., "
            f"but this loader's pipeline is {current[:SHORT_FINGERPRINT]}... (its code or its "
            "probe batch changed); restore with set_state(state, allow_new_pipeline=True) to "
            "continue with the new pipeline from the state's step"
        )


def require_same(saved: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """A ValueError naming every key whose value in a saved state differs from `expected`."""
    differences = _differences(saved, expected, list(expected))
    if differences:
        raise ValueError(f"iterator state belongs to another {what}: {differences}")


def _plan_differences(saved: dict[str, Any], plan: Plan, ignored: tuple[str, ...]) -> str:
    """Every key of a saved plan or `plan`'s description but `ignored` whose values differ."""
    expected = plan.describe()
    keys = [key for key in {**expected, **saved} if key not in ignored]
    return _differences(saved, expected, keys)


def _differences(saved: dict[str, Any], expected: dict[str, Any], keys: list[str]) -> str:
    """Each of `keys` whose value differs between a saved state and `expected`."""
    return "; ".join(
        f"{key} is {saved.get(key)!r} in the state but {expected.get(key)!r} in this loader"
        for key in keys
        if saved.get(key) != expected.get(key)
    )
