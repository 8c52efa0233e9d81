"""How datasets, functions and settings name themselves in reprs: short, readable, the way they
were written, and never a memory address or a whole list of records."""

from __future__ import annotations

import functools
import reprlib
from typing import Any

import numpy as np

_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother = 40, 80


def short_repr(value: Any) -> str:
    """`repr(value)`, cut short: at most a few items of a list, a shape for an array.

    >>> import numpy as np
    >>> from loadax.dataset.names import short_repr
    >>> short_repr(list(range(100))), short_repr(np.zeros((3, 2), np.float32))
    ('[0, 1, 2, 3, 4, 5, ...]', '<ndarray (3, 2) float32>')
    """
    if isinstance(value, np.ndarray):
        return f"<ndarray {value.shape} {value.dtype}>"
    if _default_repr(value):  # it would name a memory address
        return f"<{_local_name(type(value).__qualname__)} object>"
    return _SHORT.repr(value)


def from_loadax(value: Any) -> bool:
    """True for an instance of a loadax class, or of a subclass of one."""
    return any(klass.__module__.partition(".")[0] == "loadax" for klass in type(value).__mro__)


def dataset_repr(dataset: Any) -> str:
    """A dataset as a repr shows it: loadax's (and their subclasses) by their own repr, any
    other (a list, an array, a foreign source) cut short."""
    if from_loadax(dataset):
        return repr(dataset)
    if _default_repr(dataset):
        return f"<{_local_name(type(dataset).__qualname__)} of {len(dataset)} records>"
    return short_repr(dataset)


def chains(dataset: Any, method: str) -> bool:
    """True when `dataset` is one of loadax's datasets with `method`, so that an op made of it
    is written as a call of that method (a foreign dataset's own `map` is not loadax's)."""
    return from_loadax(dataset) and callable(getattr(dataset, method, None))


def op_repr(parent: Any, method: str, constructor: str, arguments: str) -> str:
    """An op as it is written: `parent.method(arguments)` when the parent chains (`chains`);
    else `constructor(parent, arguments)`.

    >>> from loadax import RangeDataset
    >>> from loadax.dataset.names import op_repr
    >>> op_repr(RangeDataset(0, 3), "map", "MappedDataset", "str")
    'RangeDataset(0, 3).map(str)'
    >>> op_repr([1, 2], "map", "MappedDataset", "str")
    'MappedDataset([1, 2], str)'
    """
    if chains(parent, method):
        return f"{parent!r}.{method}({arguments})"
    return f"{constructor}({dataset_repr(parent)}, {arguments})"


def callable_name(fn: Any) -> str:
    """A function by its name (without the `<locals>` of the function it was defined in), a
    partial by its function and arguments, a callable object by its repr.

    >>> import functools
    >>> from loadax.dataset.names import callable_name
    >>> def outer():
    ...     def decode(record):
    ...         return record
    ...     return decode
    >>> callable_name(outer()), callable_name(str.upper), callable_name(lambda x: x)
    ('decode', 'str.upper', '<lambda>')
    >>> callable_name(functools.partial(int, base=2))
    'partial(int, base=2)'
    """
    if isinstance(fn, functools.partial):
        arguments = [callable_name(fn.func)]
        arguments += [short_repr(value) for value in fn.args]
        arguments += [f"{key}={short_repr(value)}" for key, value in fn.keywords.items()]
        return f"partial({', '.join(arguments)})"
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if isinstance(name, str):
        return _local_name(name)
    return short_repr(fn)


def _default_repr(value: Any) -> bool:
    """True when `value`'s class has no repr of its own, only `object`'s."""
    return all("__repr__" not in vars(klass) for klass in type(value).__mro__[:-1])


def _local_name(qualname: str) -> str:
    """A qualified name without the functions it was defined in."""
    return qualname.rpartition("<locals>.")[2]
