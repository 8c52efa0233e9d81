"""Every public name has a docstring with an example, and every example runs as a doctest."""

from __future__ import annotations

import doctest
import importlib
import inspect
import io
import re
from collections.abc import Mapping

import pytest

from loadax import DataLoader, DatasetBase, LoaderIterator, Plan

FLAGS = doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS

EXPORTING_MODULES = ("loadax", "loadax.client", "loadax.state.checkpoint")
"""Modules whose `__all__` lists public names."""

PUBLIC_NAMES = {
    "loadax.delivery.meshes": ("ddp_sharding", "fsdp_sharding", "devices_by_process"),
    "loadax.dataset.stream": ("Stream",),
    "loadax.plan.work": ("StepWork", "StreamWindow"),
    "loadax.dataset.packing": ("Packer",),
    "loadax.wire.codec": ("encode", "decode", "CodecError"),
    "loadax.sources.parquet": ("ParquetDataset",),
    "loadax.sources.polars": ("PolarsDataset",),
    "loadax.sources.huggingface": ("HuggingFaceDataset",),
    "loadax.sources.arrayrecord": ("ArrayRecordDataset",),
    "loadax.sources.tar": ("TarShardDataset",),
    "loadax.sources.tfrecord": ("TFRecordDataset",),
    "loadax.sources.handles": ("HandlePool",),
}
"""Public names of modules without an `__all__`."""

PUBLIC_METHODS: Mapping[type, tuple[str, ...]] = {
    DataLoader: (
        "batch_size",
        "shuffle",
        "num_epochs",
        "drop_remainder",
        "shard",
        "device_prefetch",
        "workers",
        "prefetch",
        "build",
    ),
    LoaderIterator: ("get_state", "set_state", "close"),
    DatasetBase: (
        "map",
        "filter",
        "pack",
        "shuffle",
        "slice",
        "concatenate",
        "repeat",
        "random_map",
    ),
    Plan: (
        "steps_per_epoch",
        "num_steps",
        "epoch",
        "batch_length",
        "indices",
        "records_at",
        "describe",
    ),
}

NOT_DOCUMENTED = {"loadax.__version__"}  # a str: the only docstring it has is str's

EXAMPLE = re.compile(r"^\s*>>> ", re.MULTILINE)


def public_objects() -> dict[str, object]:
    """Every public class, function, method and property, by its qualified name."""
    found: dict[str, object] = {}
    for module_name in EXPORTING_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            found[f"{module_name}.{name}"] = getattr(module, name)
    for module_name, names in PUBLIC_NAMES.items():
        module = importlib.import_module(module_name)
        for name in names:
            found[f"{module_name}.{name}"] = getattr(module, name)
    for owner, names in PUBLIC_METHODS.items():
        for name in names:
            found[f"{owner.__module__}.{owner.__qualname__}.{name}"] = getattr(owner, name)
    for name in NOT_DOCUMENTED:
        del found[name]
    return found


def doctested_modules() -> list[str]:
    """The modules that define the public names (methods live in their classes' modules)."""
    return sorted(
        {obj.__module__ for obj in public_objects().values() if not isinstance(obj, property)}
    )


def own_docstrings(obj: object) -> list[str]:
    """The docstrings written for `obj` itself: a class's own and its `__init__`'s."""
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        return [obj.__dict__.get("__doc__") or "", getattr(init, "__doc__", None) or ""]
    return [getattr(obj, "__doc__", None) or ""]


def offenders(objects: Mapping[str, object]) -> list[str]:
    """Each name whose object lacks a docstring, or an example in its own docstrings."""
    found = []
    for name, obj in sorted(objects.items()):
        docstrings = own_docstrings(obj)
        if not any(docstring.strip() for docstring in docstrings):
            found.append(f"{name}: no docstring")
        elif not any(EXAMPLE.search(docstring) for docstring in docstrings):
            found.append(f"{name}: no >>> example")
    return found


@pytest.mark.parametrize("module_name", doctested_modules())
def test_the_examples_of_each_module_run_and_pass(module_name: str) -> None:
    module = importlib.import_module(module_name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=report.write)
    assert runner.tries > 0, f"{module_name} holds public names but no examples"
    assert runner.failures == 0, report.getvalue()


def test_every_public_name_has_a_docstring_with_an_example() -> None:
    missing = offenders(public_objects())
    assert not missing, "public names without a docstring or example:\n" + "\n".join(missing)


def test_the_check_names_each_object_without_a_docstring_or_an_example() -> None:
    def shown() -> None:
        """Shows itself.

        >>> shown()
        """

    def described() -> None:
        """Says what it does, with no example."""

    def bare() -> None:
        pass

    class ShownByInit:
        def __init__(self) -> None:
            """>>> ShownByInit()"""

    class Undocumented:
        pass

    objects = {
        "shown": shown,
        "described": described,
        "bare": bare,
        "init": ShownByInit,
        "class": Undocumented,
    }
    assert offenders(objects) == [
        "bare: no docstring",
        "class: no docstring",
        "described: no >>> example",
    ]
