"""The digest of the code and values a pipeline holds, walked depth-first: what a pipeline's
fingerprint (`loadax.identity.fingerprint`) covers besides its probe.

Functions by their bytecode, constants, closures, defaults and the module-level names they use;
partials, methods, callable objects and classes by what they hold, not by the module they are in
(so code run as a script and imported agree); library code (the standard library, installed
packages, loadax) by its name. Nothing in a digest is a memory address, a
`hash()` or the iteration order of a set, so two processes, two hosts or a restart agree.
"""

from __future__ import annotations

import datetime
import decimal
import enum
import fractions
import functools
import operator
import os
import pickle
import site
import sys
import sysconfig
import types
from collections.abc import Callable, Iterable, Mapping
from pathlib import PurePath
from typing import Any

import numpy as np

from loadax.identity.digests import hashed, leaf_digest, plain, text

LARGE = 256
"""A list, tuple, dict or set with more items than this is data: hashed by type and length."""
SMALL_ARRAY_BYTES = 4096
"""A numpy array up to this size is hashed by content too (a larger one is the probe's job)."""
MAX_DEPTH = 64
"""Objects nested deeper than this are hashed by type (it bounds the walk's recursion)."""

_ABOVE_ALL = sys.maxsize  # no reference back up the walk's path
# Class attributes that are bookkeeping, or that the walk covers otherwise.
_CLASS_BOOKKEEPING = frozenset({"__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"})
_BUILTIN_CALLABLES = (
    types.BuiltinFunctionType,
    types.MethodWrapperType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
)
_REDUCED_CALLABLES = (operator.itemgetter, operator.attrgetter, operator.methodcaller)


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Where the standard library and installed packages live."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(sorted(os.path.join(os.path.realpath(root), "") for root in roots))


@functools.lru_cache(maxsize=4096)
def _installed(file: str) -> bool:
    return os.path.realpath(file).startswith(_library_roots())


class Walker:
    """Digests of objects, walked depth-first.

    Each object is walked once unless it lies on a cycle: a reference back up the current path
    is named by its distance, and an object on a cycle is walked again wherever it is reached
    (its digest depends on where the walk entered the cycle), so that no digest depends on the
    order in which a set's items or a dict's keys happen to be visited.
    """

    def __init__(self) -> None:
        self._done: dict[int, bytes] = {}
        self._path: dict[int, int] = {}  # id -> depth of the objects being walked
        self._highest: list[int] = []  # per object on the path: the shallowest depth referred to
        self._alive: list[Any] = []  # every object walked stays alive, so that ids stay unique
        self._library: dict[str, bool] = {}

    def digest(self, value: Any) -> bytes:
        leaf = leaf_digest(value)
        if leaf is not None:
            return leaf
        key = id(value)
        done = self._done.get(key)
        if done is not None:
            return done
        depth = len(self._path)
        if key in self._path:
            self._highest[-1] = min(self._highest[-1], self._path[key])
            return hashed(b"back", text(str(depth - self._path[key])))
        if depth >= MAX_DEPTH:
            self._highest[-1] = -1  # cut short here: its digest depends on where it was reached
            return hashed(b"deep", self._name(type(value)))
        self._path[key] = depth
        self._highest.append(_ABOVE_ALL)
        self._alive.append(value)
        try:
            digest = self._node(value)
        finally:
            del self._path[key]
            highest = self._highest.pop()
        if highest > depth:
            self._done[key] = digest
        elif self._highest:
            self._highest[-1] = min(self._highest[-1], highest)
        return digest

    def _node(self, value: Any) -> bytes:
        if isinstance(value, np.ndarray):
            return self._array(value)
        if isinstance(value, np.generic):
            if value.dtype.hasobject:
                return hashed(b"np object", self.digest(value.item()))
            return hashed(b"np scalar", text(value.dtype.str), value.tobytes())
        if isinstance(value, np.dtype):
            return hashed(b"dtype", text(str(value)))
        if isinstance(value, enum.Enum):
            return hashed(b"enum", self.digest(type(value)), text(value.name))
        if isinstance(value, tuple | list):
            return self._sequence(value)
        if isinstance(value, dict | types.MappingProxyType):
            return self._mapping(value)
        if isinstance(value, set | frozenset):
            return self._set(value)
        if isinstance(value, range | slice):
            return hashed(b"range", self.digest((value.start, value.stop, value.step)))
        if isinstance(value, str | bytes | bytearray | int | float):  # their subclasses
            return hashed(b"value", self.digest(type(value)), self.digest(plain(value)))
        if isinstance(value, PurePath | datetime.date | datetime.time | datetime.timedelta):
            return hashed(b"text", self.digest(type(value)), text(str(value)))
        if isinstance(value, decimal.Decimal | fractions.Fraction | complex):
            return hashed(b"text", self.digest(type(value)), text(str(value)))
        if isinstance(value, types.SimpleNamespace):
            return hashed(b"namespace", self.digest(dict(vars(value))))
        if isinstance(value, types.ModuleType):
            return hashed(b"module", text(value.__name__))
        if isinstance(value, types.FunctionType):
            return self._function(value)
        if isinstance(value, types.MethodType):
            return hashed(b"method", self.digest(value.__func__), self.digest(value.__self__))
        if isinstance(value, functools.partial):
            return hashed(
                b"partial",
                self.digest(type(value)),
                self.digest(value.func),
                self.digest(value.args),
                self.digest(value.keywords),
            )
        if isinstance(value, types.CodeType):
            return self._code(value)
        if isinstance(value, type):
            return self._class(value)
        if isinstance(value, staticmethod | classmethod):
            return hashed(b"wrapped", self.digest(type(value)), self.digest(value.__func__))
        if isinstance(value, functools.cached_property):
            return hashed(b"wrapped", self.digest(type(value)), self.digest(value.func))
        if isinstance(value, property):
            parts = (value.fget, value.fset, value.fdel)
            return hashed(b"property", *(self.digest(part) for part in parts))
        if isinstance(value, _BUILTIN_CALLABLES):
            return self._builtin(value)
        if isinstance(value, _REDUCED_CALLABLES):
            return hashed(b"reduced", self.digest(value.__reduce__()))
        return self._instance(value)

    def _array(self, array: np.ndarray[Any, Any]) -> bytes:
        shape = text(repr(tuple(array.shape)))
        if array.dtype.hasobject or array.nbytes > SMALL_ARRAY_BYTES:
            return hashed(b"array", text(array.dtype.str), shape)
        return hashed(b"array", text(array.dtype.str), shape, np.ascontiguousarray(array).tobytes())

    def _sequence(self, items: tuple[Any, ...] | list[Any]) -> bytes:
        kind = self._kind(items)
        if len(items) > LARGE:
            return hashed(b"large", kind, text(str(len(items))))
        return hashed(b"sequence", kind, *(self.digest(item) for item in items))

    def _mapping(self, mapping: Mapping[Any, Any]) -> bytes:
        kind = self._kind(mapping)
        if len(mapping) > LARGE:
            return hashed(b"large", kind, text(str(len(mapping))))
        pairs = sorted(
            hashed(self.digest(key), self.digest(value)) for key, value in mapping.items()
        )
        return hashed(b"mapping", kind, *pairs)

    def _set(self, items: set[Any] | frozenset[Any]) -> bytes:
        kind = self._kind(items)
        if len(items) > LARGE:
            return hashed(b"large", kind, text(str(len(items))))
        return hashed(b"set", kind, *sorted(self.digest(item) for item in items))

    def _kind(self, container: Any) -> bytes:
        """The builtin container types by name; a subclass (a namedtuple) by its class."""
        kind = type(container)
        if kind in (tuple, list, dict, set, frozenset, types.MappingProxyType):
            return text(kind.__name__)
        return self.digest(kind)

    def _function(self, function: types.FunctionType) -> bytes:
        module = function.__module__
        if self._is_library(module):
            return hashed(b"function", self._name(function))
        cells = []
        for cell in function.__closure__ or ():
            try:
                cells.append(self.digest(cell.cell_contents))
            except ValueError:  # a cell not yet filled
                cells.append(hashed(b"empty cell"))
        return hashed(
            b"function",
            _qualname(function),
            self.digest(function.__code__),
            self.digest(function.__defaults__),
            self.digest(function.__kwdefaults__),
            self.digest(dict(vars(function))),
            *cells,
            *self._globals(function.__code__, function.__globals__),
        )

    def _globals(self, code: types.CodeType, namespace: Mapping[str, Any]) -> list[bytes]:
        """The module-level names `code` uses, with their values; for a module of user code,
        the names the code may read from it too (`helpers.clip`)."""
        names = sorted(_names(code))
        used = []
        for name in names:
            if name not in namespace:
                continue  # a builtin, or an attribute's name
            value = namespace[name]
            used.append(hashed(text(name), self.digest(value)))
            if isinstance(value, types.ModuleType) and not self._is_library(value.__name__):
                members = vars(value)
                used.extend(
                    hashed(text(f"{name}.{member}"), self.digest(members[member]))
                    for member in names
                    if member in members
                )
        return used

    def _code(self, code: types.CodeType) -> bytes:
        # Line numbers and file names are left out: moving code does not change what it does.
        return hashed(
            b"code",
            text(code.co_name),
            text(
                f"{code.co_argcount} {code.co_posonlyargcount} {code.co_kwonlyargcount} "
                f"{code.co_flags}"
            ),
            code.co_code,
            *(self.digest(constant) for constant in code.co_consts),
            *(text("\0".join(names)) for names in _code_names(code)),
        )

    def _class(self, cls: type) -> bytes:
        if self._is_library(cls.__module__):
            return hashed(b"class", self._name(cls))
        attributes = sorted(
            hashed(text(name), self.digest(value))
            for name, value in vars(cls).items()
            if name not in _CLASS_BOOKKEEPING
        )
        bases = (self.digest(base) for base in cls.__bases__)
        return hashed(b"class", _qualname(cls), *bases, b"attributes", *attributes)

    def _builtin(self, function: Any) -> bytes:
        owner = getattr(function, "__self__", None)
        if owner is None or isinstance(owner, types.ModuleType):
            return hashed(b"builtin", self._name(function))
        # A bound builtin method (`"-".join`): what it is bound to counts.
        return hashed(b"builtin", self._name(function), self.digest(owner))

    def _instance(self, value: Any) -> bytes:
        """An object of a class of user code or of loadax, by its class and its attributes (or
        by what it pickles to, when its class says so); any other object by its class."""
        cls = type(value)
        if not self._walks_into(cls):
            parts = [self.digest(cls)]
            if callable(value):  # a ufunc by its name; lru_cache, jax.jit by what they wrap
                name = getattr(value, "__name__", None)
                parts.append(self.digest(name if isinstance(name, str) else None))
                parts.append(self.digest(_wrapped(value)))
            return hashed(b"object", *parts)
        if self._reduces(cls):
            try:
                reduced = value.__reduce_ex__(pickle.DEFAULT_PROTOCOL)
            except (TypeError, pickle.PicklingError):
                pass  # an object that refuses to be pickled is walked as any other
            else:
                if isinstance(reduced, str):
                    return hashed(b"global", self.digest(cls), text(reduced))
                return hashed(b"reduced", self.digest(cls), self.digest(tuple(reduced[:3])))
        return hashed(b"instance", self.digest(cls), *self._attributes(value))

    def _attributes(self, value: Any) -> Iterable[bytes]:
        attributes = dict(vars(value)) if hasattr(value, "__dict__") else {}
        for owner in type(value).__mro__:
            for slot in _slots(owner):
                if slot not in attributes and hasattr(value, slot):
                    attributes[slot] = getattr(value, slot)
        return (
            hashed(text(name), self.digest(attribute))
            for name, attribute in sorted(attributes.items())
        )

    def _walks_into(self, cls: type) -> bool:
        module = cls.__module__
        return module.partition(".")[0] == "loadax" or not self._is_library(module)

    def _reduces(self, cls: type) -> bool:
        """Whether a class of user code or loadax defines how its objects pickle."""
        for owner in cls.__mro__:
            if "__reduce__" in vars(owner) or "__reduce_ex__" in vars(owner):
                return owner is not object and self._walks_into(owner)
        return False

    def _is_library(self, module: Any) -> bool:
        """Whether `module` (a name) is code the walk names rather than reads: the standard
        library, installed packages and loadax."""
        if not isinstance(module, str):
            return False  # code of unknown origin: read it
        known = self._library.get(module)
        if known is None:
            known = self._library[module] = self._find_library(module)
        return known

    def _find_library(self, module: str) -> bool:
        if module.partition(".")[0] == "loadax":
            return True
        loaded = sys.modules.get(module)
        if loaded is None:
            return False  # code run by exec (a notebook, a README): read it
        file = getattr(loaded, "__file__", None)
        if not isinstance(file, str):
            return True  # built into the interpreter
        return _installed(file)

    def _name(self, value: Any) -> bytes:
        """`module.qualname` of a function or class."""
        owner = getattr(value, "__objclass__", None)
        module = getattr(value, "__module__", None)
        if module is None and isinstance(owner, type):
            module = f"{owner.__module__}.{owner.__qualname__}"
        qualname = getattr(value, "__qualname__", None) or getattr(value, "__name__", None)
        return text(f"{module}:{qualname}")


def _qualname(value: types.FunctionType | type) -> bytes:
    """The name of a function or class of user code: without its module, which is `__main__` in
    a script and the file's name where it is imported (what it does is walked)."""
    return text(value.__qualname__)


def _names(code: types.CodeType) -> set[str]:
    """The global and attribute names `code` and the code nested in it use."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            names |= _names(constant)
    return names


def _code_names(code: types.CodeType) -> tuple[tuple[str, ...], ...]:
    return (code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars)


def _slots(cls: type) -> list[str]:
    declared = vars(cls).get("__slots__", ())
    names = [declared] if isinstance(declared, str) else list(declared)
    private = f"_{cls.__name__.lstrip('_')}"
    return [
        private + name if name.startswith("__") and not name.endswith("__") else name
        for name in names
        if name not in ("__dict__", "__weakref__")
    ]


def _wrapped(value: Any) -> Callable[..., Any] | None:
    """The function a library object wraps (`functools.lru_cache`, `jax.jit`), if any."""
    namespace = getattr(value, "__dict__", None)
    wrapped = namespace.get("__wrapped__") if isinstance(namespace, dict) else None
    return wrapped if isinstance(wrapped, types.FunctionType | types.MethodType) else None
