"""The errors of the process executor: a loader process that died, could not start, or lost its
item. (Their names predate the rule that "worker" means a loadax-worker; they are public.)"""

from __future__ import annotations

from loadax.errors import RemoteCause
from loadax.plan.work import Work


class WorkerProcessError(RuntimeError):
    """A loader process died, could not load the pipeline, or raised what cannot be pickled.

    >>> import os
    >>> from loadax import Batcher, DataLoader, RangeDataset
    >>> from loadax.execution.processes import WorkerProcessError
    >>> dying = RangeDataset(3, 5).map(os._exit)  # the process exits (code 3) at record 0
    >>> loader = DataLoader(Batcher()).batch_size(2).workers(1, kind="processes").build(dying)
    >>> with iter(loader) as batches:
    ...     try:
    ...         next(batches)
    ...     except WorkerProcessError as error:
    ...         print(error)
    the batch of step 0 was not loaded: loader process 0 (pid ...) exited with code 3
    """


class WorkerProcessLost(WorkerProcessError):
    """The process loading a work item died, or was stopped past its deadline: the item's own
    records may be what kills it. `work` is the item, `reason` what happened to the process."""

    def __init__(self, work: Work, reason: str) -> None:
        super().__init__(f"{work} was not loaded: {reason}")
        self.work, self.reason = work, reason


class ChildRaised(WorkerProcessError, RemoteCause):
    """What a loader process raised, when the exception itself could not be pickled back: its
    type's name (`type_name`) and its message, printed as "TypeName: message"."""

    def __str__(self) -> str:
        return f"{self.type_name}: {self.args[0]}"
