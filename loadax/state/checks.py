"""The iterator state's format: a small JSON-able dict, checked against the loader restoring it."""

from __future__ import annotations

from typing import Any

from loadax.plan.planner import Plan
from loadax.validation import is_int

STATE_VERSION = 1


def checked_step(state: Any, plan: Plan) -> int:
    """The step of an iterator state, after checking the state belongs to `plan`."""
    if not isinstance(state, dict):
        raise ValueError(f"iterator state must be a dict, got {type(state).__name__}")
    missing = {"version", "step", "plan"} - state.keys()
    if missing:
        raise ValueError(f"iterator state lacks {sorted(missing)}: got keys {sorted(state)}")
    if state["version"] != STATE_VERSION:
        raise ValueError(
            f"iterator state has version {state['version']!r}; this loadax reads {STATE_VERSION}"
        )
    expected = plan.describe()
    saved = state["plan"]
    if not isinstance(saved, dict):
        raise ValueError(f"iterator state has plan {saved!r}; it must be a dict")
    require_same(saved, expected, "plan")
    step = state["step"]
    total = plan.num_steps
    if not is_int(step, minimum=0):
        raise ValueError(f"iterator state has step {step!r}; it must be an int >= 0")
    if total is not None and step > total:
        raise ValueError(f"iterator state has step {step}, beyond the plan's {total} steps")
    return int(step)


def require_same(saved: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    """A ValueError naming every key whose value in a saved state differs from `expected`."""
    differences = [
        f"{key} is {saved.get(key)!r} in the state but {value!r} in this loader"
        for key, value in expected.items()
        if saved.get(key) != value
    ]
    if differences:
        raise ValueError(f"iterator state belongs to another {what}: " + "; ".join(differences))
