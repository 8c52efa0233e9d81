"""`LoaderOptions`: everything a loader builder has been told, checked as it is set."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, get_args

from jax.sharding import Mesh

from loadax.delivery.sharding import DataAxis, ShardingStrategy
from loadax.execution.autotune import DEFAULT_MEMORY_BUDGET_MB
from loadax.execution.record_errors import RecordErrors
from loadax.plan.blocks import BlockShuffle
from loadax.plan.buckets import LengthBuckets, LengthsOf
from loadax.plan.permutation import IndexArray
from loadax.plan.planner import Plan
from loadax.validation import require_bool, require_int

DEFAULT_CONCURRENCY = 1
"""Loading threads of a loader by default (`.workers(n)` sets them)."""
DEFAULT_PREFETCH = 2

RAISE = RecordErrors()
"""The default bad-record policy: a record that fails ends iteration with its `RecordError`."""

LoadingKind = Literal["threads", "processes"]
"""What loads the batches of a local loader: its own threads or child processes."""


@dataclasses.dataclass(frozen=True, slots=True)
class LoaderOptions:
    """Everything a `DataLoader` builder has been told; checked as it is set."""

    batch_size: int | None = None
    shuffle: bool = False
    seed: int = 0
    blocks: BlockShuffle | None = None  # shuffle(block_size=, window=)
    num_epochs: int | None = 1
    drop_remainder: bool = False
    concurrency: int = DEFAULT_CONCURRENCY  # loading threads or processes; 0: the calling thread
    loading_kind: LoadingKind = "threads"
    prefetch: int | None = None  # None: DEFAULT_PREFETCH with loading threads, none without
    mesh: Mesh | None = None
    data_axis: DataAxis | None = None
    device_prefetch: int | None = None  # None: yield host batches
    batch_size_changes: tuple[tuple[int, int], ...] = ()  # (step, size) after step 0
    buckets: LengthBuckets | LengthsOf | None = None
    record_errors: RecordErrors = RAISE
    autotune_workers: bool = False  # workers("auto"): `concurrency` is where it starts
    autotune_prefetch: bool = False  # prefetch("auto")
    memory_budget_mb: int = DEFAULT_MEMORY_BUDGET_MB  # what autotune may hold

    def __post_init__(self) -> None:
        optional = ("batch_size", "num_epochs", "prefetch", "device_prefetch")
        for name, minimum in (
            ("batch_size", 1),
            ("seed", 0),
            ("num_epochs", 1),
            ("concurrency", 0),
            ("prefetch", 1),
            ("device_prefetch", 0),
            ("memory_budget_mb", 1),
        ):
            value = getattr(self, name)
            if value is not None or name not in optional:
                shown = "workers" if name == "concurrency" else name  # the builder call's name
                object.__setattr__(self, name, require_int(shown, value, minimum=minimum))
        require_bool("shuffle", self.shuffle)
        require_bool("drop_remainder", self.drop_remainder)
        if self.loading_kind not in get_args(LoadingKind):
            raise ValueError(
                f"workers(kind=...) must be one of {list(get_args(LoadingKind))}, "
                f"got {self.loading_kind!r}"
            )
        if self.loading_kind == "processes" and self.concurrency == 0:
            raise ValueError(
                "workers(0, kind='processes') starts no process: workers(0) loads each batch "
                "in the calling thread; ask for workers(n) with n >= 1"
            )
        if (self.prefetch is not None or self.autotune_prefetch) and self.concurrency == 0:
            asked = "'auto'" if self.autotune_prefetch else str(self.prefetch)
            raise ValueError(
                f"prefetch({asked}) needs workers(n) with n >= 1: "
                "workers(0) loads each batch in the calling thread when it is asked for"
            )

    def sharding_strategy(self) -> ShardingStrategy:
        return ShardingStrategy(self.mesh, self.data_axis)

    def calls(self) -> str:
        """The builder calls that set these options, those left at their defaults left out."""
        calls = []
        if self.batch_size_changes:
            schedule = [(0, self.batch_size), *self.batch_size_changes]
            calls.append(f"batch_size_schedule({schedule})")
        elif self.batch_size is not None:
            calls.append(f"batch_size({self.batch_size})")
        if self.buckets is not None:
            calls.append(f"bucket_by_length(<{type(self.buckets).__name__}>)")
        if self.shuffle:
            blocks, windowed = self.blocks, ""
            if blocks is not None:
                windowed = f", block_size={blocks.block_size}, window={blocks.window}"
            calls.append(f"shuffle(seed={self.seed}{windowed})")
        if self.num_epochs != 1:
            calls.append(f"num_epochs({self.num_epochs})")
        if self.drop_remainder:
            calls.append("drop_remainder()")
        workers = "'auto'" if self.autotune_workers else self.concurrency
        if self.loading_kind != "threads":
            calls.append(f"workers({workers}, kind={self.loading_kind!r})")
        elif self.autotune_workers or self.concurrency != DEFAULT_CONCURRENCY:
            calls.append(f"workers({workers})")
        if self.autotune_prefetch:
            calls.append("prefetch('auto')")
        elif self.prefetch is not None:
            calls.append(f"prefetch({self.prefetch})")
        if self.memory_budget_mb != DEFAULT_MEMORY_BUDGET_MB:
            calls.append(f"memory_budget_mb({self.memory_budget_mb})")
        if self.mesh is not None:
            calls.append(f"shard(<mesh {dict(self.mesh.shape)}>, {self.data_axis!r})")
        if self.device_prefetch is not None:
            calls.append(f"device_prefetch({self.device_prefetch})")
        if self.record_errors != RAISE:
            calls.append(self.record_errors.call())
        return "".join(f".{call}" for call in calls)

    def plan(
        self, num_records: int, read: Callable[[IndexArray], Sequence[Any]] | None = None
    ) -> Plan:
        """The plan of `num_records` records; `read` reads records by index, for the lengths
        of `bucket_by_length(function)` (None: a loader without the records refuses one)."""
        if self.batch_size is None:
            raise ValueError("batch_size is required: call .batch_size(n) before .build()")
        buckets = self.buckets
        if isinstance(buckets, LengthsOf):
            if read is None:
                raise ValueError(
                    "bucket_by_length(function) needs the records to measure; this loader has "
                    "none of its own: pass an array of lengths"
                )
            buckets = buckets.buckets(num_records, read)
        return Plan(
            num_records=num_records,
            batch_size=self.batch_size,
            seed=self.seed,
            shuffle=self.shuffle,
            num_epochs=self.num_epochs,
            drop_remainder=self.drop_remainder,
            batch_size_changes=self.batch_size_changes,
            buckets=buckets,
            blocks=self.blocks,
        )
