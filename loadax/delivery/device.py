"""Delivery to devices: an iterator of global jax.Arrays whose next batches are already copying.

`jax.device_put` returns before the copy is done, so distributing the next `depth` batches
ahead of time overlaps their host-to-device copies with the current training step. With a depth,
the global arrays are assembled on a thread of their own, in order, off the training loop's.
The loop meets the loader here, so this iterator counts what the loop takes and records (and
checks) the pipeline's fingerprint in its state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from loadax.delivery.sharding import ShardingStrategy
from loadax.iterators.base import LoaderIterator
from loadax.iterators.stats import StatsRecorder, array_bytes
from loadax.state.checks import check_fingerprint


class DeviceIterator(LoaderIterator[Any]):
    """Global device arrays of the batches of `host_batches`, `depth` of them copied ahead.

    Right after `next()` returns batch n, batches n+1 .. n+depth (those that exist) have been
    taken from `host_batches` and are being assembled and copied; with depth 0, none.
    `stats` counts what the loop takes (build `host_batches` with `counts_loop=False`), with
    the bytes of the host batches; `fingerprint` is as `BatchIterator`'s (build `host_batches`
    without one).
    """

    def __init__(
        self,
        host_batches: LoaderIterator[Any],
        sharding: ShardingStrategy,
        depth: int,
        *,
        stats: StatsRecorder | None = None,
        fingerprint: Callable[[], str] | None = None,
    ) -> None:
        self._host_batches, self._sharding, self._depth = host_batches, sharding, depth
        self._counts = (StatsRecorder() if stats is None else stats).counts(self)
        self._fingerprint = fingerprint
        # Each batch on the device: the host iterator's state from before it was loaded, the
        # bytes of its host batch and its global arrays.
        self._on_device: deque[tuple[dict[str, Any], int, Future[Any]]] = deque()
        self._assembler = (
            ThreadPoolExecutor(1, thread_name_prefix="loadax-device") if depth else None
        )
        # What taking the batch after those on the device raised: the loop gets it once it has
        # had them, and asking again before then would wait for the failure a second time.
        self._failed: BaseException | None = None

    def __next__(self) -> Any:
        started = self._counts.clock()
        try:
            if not self._on_device and self._failed is not None:
                failed, self._failed = self._failed, None
                raise failed
            self._fill(1, defer_errors=False)
            if not self._on_device:
                raise StopIteration
            _, size, batch = self._on_device.popleft()
            self._fill(self._depth, defer_errors=True)
            assembled = batch.result()
        except BaseException:
            self._counts.took(started, None)
            raise
        self._counts.took(started, size)
        return assembled

    def get_state(self) -> dict[str, Any]:
        # The batches already on the device have not reached the training loop yet.
        state = self._on_device[0][0] if self._on_device else self._host_batches.get_state()
        if self._fingerprint is None:
            return state
        return {**state, "fingerprint": self._fingerprint()}

    def set_state(
        self,
        state: dict[str, Any],
        *,
        allow_new_pipeline: bool = False,
        allow_new_batch_size: bool = False,
    ) -> None:
        if self._fingerprint is not None:
            check_fingerprint(state, self._fingerprint, allow_new_pipeline)
        self._host_batches.set_state(
            state,
            allow_new_pipeline=allow_new_pipeline,
            allow_new_batch_size=allow_new_batch_size,
        )
        self._on_device.clear()
        self._failed = None

    def close(self) -> None:
        self._host_batches.close()
        self._on_device.clear()
        if self._assembler is not None:
            self._assembler.shutdown(wait=False, cancel_futures=True)

    def _fill(self, count: int, defer_errors: bool) -> None:
        """Take host batches until `count` are on the device, or the host iterator ends."""
        while len(self._on_device) < count and self._failed is None:
            state = self._host_batches.get_state()
            try:
                batch = next(self._host_batches)
            except StopIteration:
                return
            except Exception as error:
                if defer_errors:
                    self._failed = error  # raised when the loop reaches the failed step
                    return
                raise
            self._on_device.append((state, array_bytes(batch), self._assemble(batch)))

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
