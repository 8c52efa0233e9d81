"""The determinism check: a pipeline's first batches, loaded twice, must be equal byte for byte.

Checkpoints, restarts and remote workers all rely on a batch being a pure function of its step;
a map that draws from `np.random` or `random` without a seed breaks that silently.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from loadax.iterators.base import LoaderIterator
from loadax.validation import require_int

HINT = (
    "does a function draw from np.random or random without a seed? Use random_map, whose rng "
    "depends only on (seed, epoch, record index)"
)


def check_determinism(fresh_iterator: Callable[[], LoaderIterator[Any]], steps: int) -> None:
    """Load the first `steps` batches from two iterators of `fresh_iterator()` and compare them:
    a ValueError naming the first step and leaf that differ.

    >>> import numpy as np
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> builder = DataLoader(Batcher()).batch_size(2)
    >>> builder.build(RangeDataset(0, 6)).check_determinism(steps=2)
    >>> noisy = RangeDataset(0, 6).map(lambda x: x + np.random.random())
    >>> builder.build(noisy).check_determinism()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: the pipeline is not deterministic: step 0, leaf <the batch> differs in its bytes ...
    """
    steps = require_int("steps", steps, minimum=1)
    first, second = (_first_batches(fresh_iterator(), steps) for _ in range(2))
    for step in range(max(len(first), len(second))):
        if step >= len(first) or step >= len(second):
            raise ValueError(
                f"the pipeline is not deterministic: step {step} is a batch in one load of it "
                f"and the end in the other ({HINT})"
            )
        difference = first_difference(first[step], second[step])
        if difference is not None:
            raise ValueError(
                f"the pipeline is not deterministic: step {step}, {difference} between two "
                f"loads of it ({HINT})"
            )


def first_difference(one: Any, other: Any) -> str | None:
    """What first differs between two batches ("leaf L differs in ..."), None when nothing does.

    >>> import numpy as np
    >>> first_difference({"x": np.arange(3)}, {"x": np.arange(3)}) is None
    True
    >>> first_difference({"x": np.arange(3)}, {"x": np.arange(1, 4)})
    "leaf ['x'] differs in its bytes"
    >>> first_difference({"x": np.arange(3)}, {"y": np.arange(3)})
    'the structure of the batch differs'
    """
    structure: Any = jax.tree.structure(one)  # Any: a PyTreeDef has no typed __ne__
    if structure != jax.tree.structure(other):
        return "the structure of the batch differs"
    leaves = jax.tree_util.tree_leaves_with_path(one)
    other_leaves = jax.tree_util.tree_leaves_with_path(other)
    for (path, leaf), (_, other_leaf) in zip(leaves, other_leaves, strict=True):
        what = _leaf_difference(np.asarray(leaf), np.asarray(other_leaf))
        if what is not None:
            return f"leaf {jax.tree_util.keystr(path) or '<the batch>'} differs in {what}"
    return None


def _leaf_difference(leaf: np.ndarray[Any, Any], other: np.ndarray[Any, Any]) -> str | None:
    if leaf.dtype != other.dtype:
        return f"dtype ({leaf.dtype} and {other.dtype})"
    if leaf.shape != other.shape:
        return f"shape ({leaf.shape} and {other.shape})"
    if leaf.dtype.hasobject:  # its bytes are addresses: compare the objects
        return None if leaf.tolist() == other.tolist() else "its values"
    return None if leaf.tobytes() == other.tobytes() else "its bytes"


def _first_batches(iterator: LoaderIterator[Any], steps: int) -> list[Any]:
    with iterator:
        return list(itertools.islice(iterator, steps))
