"""The schema of a pipeline's batches: what a worker announces in its handshake and the client
checks every batch against.

A schema is the batch's tree (dicts, lists, tuples, None) and, per leaf, its dtype and number of
dimensions, and whether its leading dimension counts the batch's rows. Trailing dimensions are
left out (a padding batcher varies them), and so is the width of text and bytes dtypes ("<U",
"|S"), which follows the longest value of a batch. A list whose items all look alike is one
item long in the tree, so that a batcher that returns a list per row fits any number of rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadax.wire.codec import dtype_name
from loadax.wire.v1 import worker_pb2 as wire

_WIDTHLESS = frozenset("SU")  # text and bytes: their width varies from batch to batch


@dataclasses.dataclass(frozen=True, slots=True)
class Leaf:
    """One leaf of a decoded batch, as a schema sees it."""

    path: str  # where the leaf is in the batch, e.g. "['image']"
    dtype: str
    ndim: int
    length: int | None  # the leading dimension; None for a Python value or a 0-d array


@dataclasses.dataclass(frozen=True, slots=True)
class Description:
    """A decoded batch as a schema sees it: its tree and its leaves."""

    tree: str
    leaves: list[Leaf]

    def alike(self, other: Description) -> bool:
        """Same tree, and the same dtype and number of dimensions leaf by leaf."""
        return self.tree == other.tree and [(leaf.dtype, leaf.ndim) for leaf in self.leaves] == [
            (leaf.dtype, leaf.ndim) for leaf in other.leaves
        ]


def describe(batch: Any) -> Description:
    """The tree of a decoded batch, each leaf `*`, and its leaves in the order the tree writes them.

    >>> import numpy as np
    >>> from loadax.wire.schema import describe
    >>> description = describe({"label": np.arange(2), "image": np.zeros((2, 3), np.float32)})
    >>> description.tree, [(leaf.path, leaf.dtype, leaf.ndim) for leaf in description.leaves]
    ("{'image': *, 'label': *}", [("['image']", '<f4', 2), ("['label']", '<i8', 1)])
    """
    return _describe_at(batch, "")


def batch_schema(probes: Sequence[tuple[Any, int | None]]) -> wire.BatchSchema | None:
    """The schema of batches like `probes`: decoded batches, each with the number of rows it
    holds (None for a stream's window). A leaf's leading dimension counts rows when it does in
    every probe. None when the probes do not look alike, or none is given: no schema to check.

    >>> import numpy as np
    >>> from loadax.wire.schema import batch_schema
    >>> schema = batch_schema([({"x": np.zeros((n, 5))}, n) for n in (1, 3)])
    >>> schema.tree, [(leaf.dtype, leaf.ndim, leaf.rows_first) for leaf in schema.leaves]
    ("{'x': *}", [('<f8', 2, True)])
    """
    if not probes:
        return None
    descriptions = [describe(batch) for batch, _ in probes]
    first = descriptions[0]
    if not all(first.alike(other) for other in descriptions[1:]):
        return None
    leaves = [
        wire.LeafSchema(
            dtype=leaf.dtype,
            ndim=leaf.ndim,
            rows_first=all(
                rows is not None and description.leaves[position].length == rows
                for description, (_, rows) in zip(descriptions, probes, strict=True)
            ),
        )
        for position, leaf in enumerate(first.leaves)
    ]
    return wire.BatchSchema(tree=first.tree, leaves=leaves)


def schema_difference(batch: Any, schema: wire.BatchSchema, rows: int | None) -> str | None:
    """What in the decoded `batch` differs from `schema`, said plainly; None when nothing does.
    `rows`: how many rows the batch must hold; None for a stream's window, whose rows vary and
    which may be None (no row survived).

    >>> import numpy as np
    >>> from loadax.wire.schema import batch_schema, schema_difference
    >>> schema = batch_schema([({"x": np.zeros((n, 5))}, n) for n in (1, 3)])
    >>> schema_difference({"x": np.zeros((4, 7))}, schema, rows=4) is None
    True
    >>> schema_difference({"x": np.zeros((2, 5))}, schema, rows=4)
    "leaf ['x'] has 2 rows, the request asked for 4"
    >>> schema_difference({"x": np.zeros((4, 5), np.float32)}, schema, rows=4)
    "leaf ['x'] has dtype <f4, the schema says <f8"
    """
    if batch is None and rows is None:
        return None
    description = describe(batch)
    if description.tree != schema.tree:
        return f"its tree is {description.tree:.200}, the schema's is {schema.tree:.200}"
    if len(description.leaves) != len(schema.leaves):
        return (
            f"it has {len(description.leaves)} leaves, the schema {len(schema.leaves)} for the "
            f"same tree {schema.tree:.200}"
        )
    for leaf, expected in zip(description.leaves, schema.leaves, strict=True):
        if leaf.dtype != expected.dtype:
            return f"leaf {leaf.path} has dtype {leaf.dtype}, the schema says {expected.dtype}"
        if leaf.ndim != expected.ndim:
            return f"leaf {leaf.path} has {leaf.ndim} dimensions, the schema says {expected.ndim}"
        if expected.rows_first and rows is not None and leaf.length != rows:
            return f"leaf {leaf.path} has {leaf.length} rows, the request asked for {rows}"
    return None


def _walk(value: Any, path: str, leaves: list[Leaf]) -> str:
    if isinstance(value, np.ndarray):
        dtype = dtype_name(value.dtype)
        if value.dtype.kind in _WIDTHLESS:
            dtype = dtype.rstrip("0123456789")
        length = value.shape[0] if value.ndim else None
        leaves.append(Leaf(path or "(the batch)", dtype, value.ndim, length))
        return "*"
    if value is None:
        return "None"
    if isinstance(value, dict):
        entries = sorted(value.items(), key=lambda entry: repr(entry[0]))
        inner = [f"{key!r}: {_walk(item, f'{path}[{key!r}]', leaves)}" for key, item in entries]
        return "{" + ", ".join(inner) + "}"
    if isinstance(value, tuple):
        inner = [_walk(item, f"{path}[{position}]", leaves) for position, item in enumerate(value)]
        return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
    if isinstance(value, list):
        items = [_describe_at(item, f"{path}[{position}]") for position, item in enumerate(value)]
        if items and all(items[0].alike(item) for item in items[1:]):
            leaves.extend(items[0].leaves)
            return f"[{items[0].tree}, ...]"
        for item in items:
            leaves.extend(item.leaves)
        return "[" + ", ".join(item.tree for item in items) + "]"
    leaves.append(Leaf(path or "(the batch)", type(value).__name__, 0, None))
    return "*"


def _describe_at(value: Any, path: str) -> Description:
    leaves: list[Leaf] = []
    return Description(_walk(value, path, leaves), leaves)
