"""Delivery to devices: an iterator of global jax.Arrays whose next batches are already copying.

`jax.device_put` returns before the copy is done, so distributing the next `depth` batches
ahead of time overlaps their host-to-device copies with the current training step. With a depth,
the global arrays are assembled on a thread of their own, in order, off the training loop's.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loadax.delivery.sharding import ShardingStrategy
from loadax.iterators.base import LoaderIterator


class DeviceIterator(LoaderIterator[Any]):
    """Global device arrays of the batches of `host_batches`, `depth` of them copied ahead.

    Right after `next()` returns batch n, batches n+1 .. n+depth (those that exist) have been
    taken from `host_batches` and are being assembled and copied; with depth 0, none.
    """

    def __init__(
        self, host_batches: LoaderIterator[Any], sharding: ShardingStrategy, depth: int
    ) -> None:
        self._host_batches, self._sharding, self._depth = host_batches, sharding, depth
        # Each batch on the device, with the host iterator's state from before it was loaded.
        self._on_device: deque[tuple[dict[str, Any], Future[Any]]] = deque()
        self._assembler = (
            ThreadPoolExecutor(1, thread_name_prefix="loadax-device") if depth else None
        )

    def __next__(self) -> Any:
        self._fill(1, defer_errors=False)
        if not self._on_device:
            raise StopIteration
        _, batch = self._on_device.popleft()
        self._fill(self._depth, defer_errors=True)
        return batch.result()

    def get_state(self) -> dict[str, Any]:
        # The batches already on the device have not reached the training loop yet.
        if self._on_device:
            return self._on_device[0][0]
        return self._host_batches.get_state()

    def set_state(self, state: dict[str, Any]) -> None:
        self._host_batches.set_state(state)
        self._on_device.clear()

    def close(self) -> None:
        self._host_batches.close()
        self._on_device.clear()
        if self._assembler is not None:
            self._assembler.shutdown(wait=False, cancel_futures=True)

    def _fill(self, count: int, defer_errors: bool) -> None:
        """Take host batches until `count` are on the device, or the host iterator ends."""
        while len(self._on_device) < count:
            state = self._host_batches.get_state()
            try:
                batch = next(self._host_batches)
            except StopIteration:
                return
            except Exception:
                if defer_errors:
                    return  # it is raised again when the loop reaches the failed step
                raise
            self._on_device.append((state, self._assemble(batch)))

    def _assemble(self, batch: Any) -> Future[Any]:
        """The global arrays of `batch`: on the assembling thread with a depth, else now."""
        distribute = self._sharding.distribute_global_batch
        if self._assembler is not None:
            return self._assembler.submit(distribute, batch)
        assembled: Future[Any] = Future()
        try:
            assembled.set_result(distribute(batch))
        except Exception as error:
            assembled.set_exception(error)
        return assembled
