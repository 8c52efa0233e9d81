"""Orbax integration: a loadax iterator's state saved next to the model by a `CheckpointManager`.

Needs the optional extra (`pip install 'loadax[orbax]'`); nothing else in loadax imports it.
Every JAX process has its own iterator, so each writes its own `process_<index>.json` in the item
directory. A loadax state is global (the plan and the next step, equal in every process), so a
process without a file of its own (the number of processes changed) restores process 0's.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any

import jax
import orbax.checkpoint as ocp  # type: ignore[import-untyped]
from etils import epath  # type: ignore[import-untyped]

from loadax.iterators.base import LoaderIterator
from loadax.iterators.streams import merged_state
from loadax.validation import require_bool

__all__ = ["LoaderCheckpointHandler", "LoaderRestore", "LoaderSave", "state_file"]


def state_file(directory: epath.Path, process_index: int) -> epath.Path:
    """The file that process `process_index` writes its iterator's state to.

    >>> from loadax.state.checkpoint import state_file
    >>> str(state_file("/checkpoints/7/loader", process_index=3))
    '/checkpoints/7/loader/process_3.json'
    """
    return epath.Path(directory) / f"process_{process_index}.json"


class LoaderCheckpointHandler(ocp.CheckpointHandler):  # type: ignore[misc]
    """Saves and restores a `LoaderIterator`'s state as JSON, one file per JAX process.

    A `CheckpointManager` uses it through `LoaderSave` and `LoaderRestore`; used directly:

    >>> import tempfile
    >>> from etils import epath
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.state.checkpoint import LoaderCheckpointHandler, LoaderRestore, LoaderSave
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
    >>> iterator = iter(loader)
    >>> next(iterator).tolist()
    [0, 1]
    >>> directory = tempfile.TemporaryDirectory()
    >>> handler = LoaderCheckpointHandler()
    >>> handler.save(epath.Path(directory.name), LoaderSave(iterator))
    >>> handler.restore(epath.Path(directory.name))["step"]  # without an iterator: the state
    1
    >>> resumed = handler.restore(epath.Path(directory.name), LoaderRestore(iter(loader)))
    >>> [batch.tolist() for batch in resumed]
    [[2, 3], [4, 5]]
    >>> directory.cleanup()
    """

    def save(self, directory: epath.Path, args: LoaderSave) -> None:
        """Write this process's iterator state atomically: a temporary file, then a rename."""
        state = args.iterator.get_state()
        final = state_file(directory, jax.process_index())
        temporary = final.parent / f".{final.name}.{uuid.uuid4().hex}.tmp"
        temporary.write_text(json.dumps(state))
        temporary.replace(final)

    def restore(
        self, directory: epath.Path, args: LoaderRestore | None = None
    ) -> LoaderIterator[Any] | dict[str, Any]:
        """Restore into `args.iterator` and return it; without an iterator, return the state.

        Reads this process's file, or process 0's where this process has none. A stream's
        state merges the cursors of every process's file, so each process finds its shards.
        """
        directory = epath.Path(directory)
        if not directory.exists():
            raise FileNotFoundError(f"no loadax iterator checkpoint at {directory}")
        own, first = state_file(directory, jax.process_index()), state_file(directory, 0)
        path = own if own.exists() else first
        if not path.exists():
            found = sorted(child.name for child in directory.iterdir())
            raise FileNotFoundError(
                f"no loadax iterator state in {directory}: neither {own.name} nor "
                f"{first.name} exists (it holds {found})"
            )
        state = _read_state(path)
        if "stream" in state:
            state = merged_state(
                [_read_state(file) for file in sorted(directory.glob("process_*.json"))]
            )
        if args is None or args.iterator is None:
            return state
        # Rejects a state of another plan, naming the difference, or of another pipeline.
        args.iterator.set_state(state, allow_new_pipeline=args.allow_new_pipeline)
        return args.iterator


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)
@dataclasses.dataclass
class LoaderSave(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Save the state of `iterator`, a local or remote loader's iterator.

    >>> import tempfile
    >>> import orbax.checkpoint as ocp
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.state.checkpoint import LoaderSave
    >>> iterator = iter(DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6)))
    >>> next(iterator).tolist()
    [0, 1]
    >>> directory = tempfile.TemporaryDirectory()
    >>> with ocp.CheckpointManager(directory.name) as manager:
    ...     manager.save(1, args=ocp.args.Composite(loader=LoaderSave(iterator)))
    ...     manager.wait_until_finished()
    ...     manager.restore(1).loader["step"]
    True
    1
    >>> directory.cleanup()
    """

    iterator: LoaderIterator[Any]

    def __post_init__(self) -> None:
        if not isinstance(self.iterator, LoaderIterator):
            raise TypeError(_not_an_iterator("LoaderSave", self.iterator))


@ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class LoaderRestore(ocp.args.CheckpointArgs):  # type: ignore[misc]
    """Restore into `iterator`, which the restore returns; with none, it returns the state.

    A state saved by a loader of another pipeline (its fingerprint differs) is refused unless
    `allow_new_pipeline` (see `LoaderIterator.set_state`).

    >>> import tempfile
    >>> import orbax.checkpoint as ocp
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.state.checkpoint import LoaderRestore, LoaderSave
    >>> loader = DataLoader(Batcher()).batch_size(2).build(RangeDataset(0, 6))
    >>> iterator = iter(loader)
    >>> next(iterator).tolist()
    [0, 1]
    >>> directory = tempfile.TemporaryDirectory()
    >>> with ocp.CheckpointManager(directory.name) as manager:
    ...     _ = manager.save(1, args=ocp.args.Composite(loader=LoaderSave(iterator)))
    ...     manager.wait_until_finished()
    ...     args = ocp.args.Composite(loader=LoaderRestore(iter(loader)))
    ...     restored = manager.restore(1, args=args)
    >>> [batch.tolist() for batch in restored.loader]
    [[2, 3], [4, 5]]
    >>> directory.cleanup()
    """

    iterator: LoaderIterator[Any] | None = None
    allow_new_pipeline: bool = False

    def __post_init__(self) -> None:
        if self.iterator is not None and not isinstance(self.iterator, LoaderIterator):
            raise TypeError(_not_an_iterator("LoaderRestore", self.iterator))
        require_bool("LoaderRestore's allow_new_pipeline", self.allow_new_pipeline)


def _read_state(path: epath.Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not a loadax iterator state: {error}") from None
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a loadax iterator state")
    return state


def _not_an_iterator(where: str, value: object) -> str:
    return f"{where} needs a loadax iterator (iter(loader)), got {type(value).__name__}"
