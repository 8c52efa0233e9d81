"""`LoaderBuilder`: the builder methods every loader shares, local or remote; each returns a
new builder, so a partly configured builder can be shared."""

from __future__ import annotations

import copy as copy_module
import dataclasses
from collections.abc import Sequence
from typing import Any, Self

from jax.sharding import Mesh

from loadax.delivery.sharding import data_axis_of
from loadax.options import LoaderOptions


class LoaderBuilder:
    """The options every loader builder shares; each method returns a new builder."""

    def __init__(self, options: LoaderOptions | None = None) -> None:
        self._options = LoaderOptions() if options is None else options

    def batch_size(self, size: int) -> Self:
        """Records per batch (the global batch size once sharded).

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> len(DataLoader(Batcher()).batch_size(3).build(RangeDataset(0, 10)))
        4
        """
        return self._with(batch_size=size)

    def shuffle(self, seed: int = 0) -> Self:
        """Visit the records in a different keyed random order in every epoch.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(3).shuffle(seed=3).num_epochs(2)
        >>> [batch.tolist() for batch in builder.build(RangeDataset(0, 6))]
        [[3, 5, 2], [0, 4, 1], [4, 2, 0], [1, 3, 5]]
        """
        return self._with(shuffle=True, seed=seed)

    def num_epochs(self, epochs: int | None) -> Self:
        """Passes over the dataset; None repeats forever. Default 1.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).num_epochs(2).build(RangeDataset(0, 3))
        >>> [batch.tolist() for batch in loader]
        [[0, 1], [2], [0, 1], [2]]
        """
        return self._with(num_epochs=epochs)

    def drop_remainder(self, drop: bool = True) -> Self:
        """Drop the short last batch of each epoch.

        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> loader = DataLoader(Batcher()).batch_size(2).drop_remainder().build(RangeDataset(0, 5))
        >>> [batch.tolist() for batch in loader]
        [[0, 1], [2, 3]]
        """
        return self._with(drop_remainder=drop)

    def shard(self, mesh: Mesh, data_axis_name: str | Sequence[str] = "data") -> Self:
        """Split each global batch over `mesh` along `data_axis_name` (an axis or a tuple).

        `batch_size` is then the global batch size; this process loads only the rows that its
        own devices hold.

        >>> import jax
        >>> import numpy as np
        >>> from jax.sharding import Mesh
        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> mesh = Mesh(np.array(jax.devices()), ("data",))
        >>> loader = DataLoader(Batcher()).batch_size(8).shard(mesh).build(RangeDataset(0, 16))
        >>> next(iter(loader)).tolist()  # a single process holds every row
        [0, 1, 2, 3, 4, 5, 6, 7]
        """
        if not isinstance(mesh, Mesh):
            raise ValueError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        return self._with(mesh=mesh, data_axis=data_axis_of(mesh, data_axis_name))

    def device_prefetch(self, depth: int = 2) -> Self:
        """Yield global jax.Arrays, with the copies of the next `depth` batches under way.

        Right after a batch is yielded, exactly the `depth` batches after it have been loaded
        and are copying (0: each batch is loaded and copied when it is asked for).

        >>> import jax
        >>> from loadax import Batcher, DataLoader, RangeDataset
        >>> builder = DataLoader(Batcher()).batch_size(4).device_prefetch(2)
        >>> batch = next(iter(builder.build(RangeDataset(0, 8))))
        >>> isinstance(batch, jax.Array), batch.tolist()
        (True, [0, 1, 2, 3])
        """
        return self._with(device_prefetch=depth)

    def __repr__(self) -> str:
        return f"{self._repr_head()}{self._options.calls()}"

    def _repr_head(self) -> str:
        """How the builder was made, before its option calls (here: its arguments elided)."""
        return f"{type(self).__name__}(...)"

    def _with(self, **changes: Any) -> Self:
        copy = copy_module.copy(self)
        copy._options = dataclasses.replace(self._options, **changes)
        return copy
