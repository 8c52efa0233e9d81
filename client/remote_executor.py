"""The executor of a remote loader's iterators: it hands work items' requests to the fleet's
driver instead of loading them."""

from __future__ import annotations

import functools
from typing import Any

from loadax.client.driver import Driver
from loadax.execution.executor import Executor, FuturePending, Pending
from loadax.iterators.stats import StatsRecorder
from loadax.plan.planner import Plan
from loadax.plan.work import Work
from loadax.wire.plans import batch_request


class RemoteExecutor(Executor[Any]):
    """Hands work items' requests to the driver, which sends them as the policy's depth allows
    (in step order); each request is made on the driver's thread, not the training loop's, and
    names the loader (`client`: the id the workers share their threads fairly by)."""

    def __init__(
        self,
        driver: Driver,
        pipeline: str,
        fingerprint: str,
        stats: StatsRecorder,
        budget: int,
        client: str,
    ) -> None:
        self._driver, self._pipeline, self._fingerprint = driver, pipeline, fingerprint
        self._client = client
        self._stats, self._memory_budget = stats, budget

    def lookahead(self, prefetch: int) -> int:
        """`prefetch` plus the fleet's depth, within the memory budget once batches are known."""
        ahead = prefetch + self._driver.depth()
        largest = self._stats.largest
        return min(ahead, max(self._memory_budget // largest, 1)) if largest else ahead

    def submit(self, plan: Plan, work: Work) -> Pending[Any]:
        make = functools.partial(
            batch_request, self._pipeline, self._fingerprint, plan, work, self._client
        )
        return FuturePending(self._driver.submit(work.ordinal, make))

    def release(self, wait: bool) -> None:
        """The connections belong to the loader, not to one iterator."""
