"""With device prefetch, `stats()` counts the batches the training loop took, not those the
device iterator took ahead of it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loadax import Batcher, DataLoader, RangeDataset


@pytest.mark.parametrize("device_prefetch", [None, 0, 2])
def test_stats_count_the_batches_the_loop_took(device_prefetch: int | None) -> None:
    builder = DataLoader(Batcher()).batch_size(4).workers(2)
    if device_prefetch is not None:
        builder = builder.device_prefetch(device_prefetch)
    loader = builder.build(RangeDataset(0, 80).map(np.int64))  # 20 steps
    with iter(loader) as iterator:
        taken = list(itertools.islice(iterator, 10))
        stats = loader.stats()
    assert [np.asarray(batch)[0] for batch in taken] == list(range(0, 40, 4))
    assert (stats.batches, stats.bytes) == (10, 10 * 4 * 8)
    assert 0 <= stats.waited_seconds <= stats.seconds


def test_a_stream_with_device_prefetch_counts_the_batches_the_loop_took() -> None:
    stream = RangeDataset(0, 80).map(np.int64).filter(lambda x: x % 2 == 0)  # 10 batches
    loader = DataLoader(Batcher()).batch_size(4).device_prefetch(2).build(stream)
    with iter(loader) as iterator:
        next(iterator), next(iterator), next(iterator)
        assert loader.stats().batches == 3
        assert len(list(iterator)) == 7
    assert loader.stats().batches == 10
