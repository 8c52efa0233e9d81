"""A pipeline pickled once for loader processes, and the diagnosis of what cannot be pickled.

A pipeline that cannot be pickled is refused when the loader is built, naming the exact part
(e.g. `pipeline.dataset._fn`) that stopped it, not when the first process starts.
"""

from __future__ import annotations

import pickle
from typing import Any, Generic

from typing_extensions import TypeVar

from loadax.execution.pipeline import Pipeline

B = TypeVar("B", default=Any)


class PickledPipeline(Generic[B]):
    """A pipeline pickled once for loader processes; one that cannot be is a ValueError."""

    data: bytes

    @classmethod
    def built_by(cls, recipe: object) -> PickledPipeline[Any]:
        """What unpickling `recipe` builds (its `__reduce__` makes the pipeline), for pipelines
        that processes make rather than receive."""
        made = cls.__new__(cls)
        made.data = pickle.dumps(recipe, protocol=pickle.HIGHEST_PROTOCOL)
        return made

    def __init__(self, pipeline: Pipeline[Any, B]) -> None:
        try:
            self.data = pickle.dumps(pipeline, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            path, part, cause = _unpicklable_part(pipeline, "pipeline", error, set())
            raise ValueError(
                f"loader processes need a picklable pipeline, but {path} ({part!r:.120}) cannot be "
                f"pickled: {cause}. Define the functions it uses (map, filter, batcher, decode) at "
                "module level in an importable module, not as lambdas or local functions"
            ) from None


def _unpicklable_part(
    value: Any, path: str, error: Exception, seen: set[int]
) -> tuple[str, Any, Exception]:
    """The innermost part of `value` (which `error` stopped pickling) that cannot be pickled."""
    for name, part in _parts(value):
        if id(part) in seen:
            continue
        seen.add(id(part))
        try:
            pickle.dumps(part)
        except Exception as part_error:
            return _unpicklable_part(part, path + name, part_error, seen)
    return path, value, error


def _parts(value: Any) -> list[tuple[str, Any]]:
    """The items or attributes of `value`, each with how to name it after its parent's name."""
    if isinstance(value, dict):
        return [(f"[{key!r}]", item) for key, item in value.items()]
    if isinstance(value, list | tuple):
        return [(f"[{position}]", item) for position, item in enumerate(value)]
    attributes = dict(getattr(value, "__dict__", {}))
    for cls in type(value).__mro__:
        slots = getattr(cls, "__slots__", ())
        for name in [slots] if isinstance(slots, str) else slots:
            if hasattr(value, name):
                attributes[name] = getattr(value, name)
    return [(f".{name}", item) for name, item in attributes.items()]
