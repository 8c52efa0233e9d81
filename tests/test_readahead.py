"""The read-ahead of shards in a store (`loadax.sources.readahead`): what a run of requests in
order fetches ahead, what a random one does not, and the bytes it holds."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest

from loadax.sources.readahead import ReadAhead, joined

MIB = 1 << 20


class Shard:
    """Shards of known bytes, fetched at once: what `ReadAhead` asks for, in order."""

    def __init__(self, sizes: list[int]) -> None:
        self.data = [np.random.default_rng(n).bytes(size) for n, size in enumerate(sizes)]
        self.fetched: list[tuple[int, int, int]] = []

    def fetch(self, shard: int, offset: int, size: int) -> Future[bytes]:
        self.fetched.append((shard, offset, size))
        done: Future[bytes] = Future()
        done.set_result(self.data[shard][offset : offset + size])
        return done


def test_a_run_in_order_is_read_ahead_in_growing_blocks_into_the_next_shard() -> None:
    shards = Shard([40 * MIB, 3 * MIB])
    ahead = ReadAhead([40 * MIB, 3 * MIB])
    step, size = MIB + 1000, MIB + 300  # 700 bytes of headers between records
    served = []
    for offset in range(0, 40 * MIB - step, step):
        blocks = ahead.request(0, offset, size, shards.fetch)
        if blocks is not None:
            assert joined(blocks, offset, size) == shards.data[0][offset : offset + size]
            served.append(offset)
        fetched = [(start, size) for shard, start, size in shards.fetched if shard == 0]
        if fetched:
            assert sum(fetched[-1]) - offset - size <= 16 * MIB  # what is ahead, bounded
    # Two requests in a row start a run: the third reads ahead, and every later one is there.
    assert served == list(range(3 * step, 40 * MIB - step, step))
    assert fetched[0] == (3 * step - 700, 2 * size)  # as far ahead as twice a request at first
    assert max(size for _, size in fetched) == 4 * MIB
    assert [start for start, _ in fetched] == sorted({start for start, _ in fetched})  # once
    assert shards.fetched[-1][:2] == (1, 0)  # the next shard's start, before it is asked
    assert ahead.request(1, 512, 1000, shards.fetch) is not None


def test_random_requests_fetch_nothing_ahead() -> None:
    shards = Shard([8 * MIB])
    ahead = ReadAhead([8 * MIB])
    record = 60_000
    order = np.random.default_rng(0).permutation(8 * MIB // record)
    for number in order.tolist():
        assert ahead.request(0, number * record, record - 512, shards.fetch) is None
    assert shards.fetched == []
    # Two neighbours in a row by chance are not a run either; a third is.
    for number in (3, 4):
        assert ahead.request(0, number * record, record - 512, shards.fetch) is None
    assert shards.fetched == []
    ahead.request(0, 5 * record, record - 512, shards.fetch)
    assert shards.fetched == [(0, 6 * record - 512, 2 * (record - 512))]


def test_a_block_that_failed_fails_its_reader_and_is_fetched_again() -> None:
    shards = Shard([8 * MIB])
    ahead = ReadAhead([8 * MIB])
    failing: list[Future[bytes]] = []

    def fetch_failing(shard: int, offset: int, size: int) -> Future[bytes]:
        failing.append(Future())
        return failing[-1]

    for number in range(3):
        ahead.request(0, number * 1000, 1000, fetch_failing)  # the third reads ahead
    blocks = ahead.request(0, 3000, 1000, shards.fetch)
    assert blocks is not None
    failing[0].set_exception(OSError("the store is away"))
    with pytest.raises(OSError, match="the store is away"):
        joined(blocks, 3000, 1000)
    assert ahead.request(0, 4000, 1000, shards.fetch) is None  # read for itself
    blocks = ahead.request(0, 5000, 1000, shards.fetch)  # and ahead again
    assert blocks is not None
    assert joined(blocks, 5000, 1000) == shards.data[0][5000:6000]


def test_the_runs_of_the_shards_asked_least_recently_are_forgotten() -> None:
    shards = Shard([1000] * 1100)
    ahead = ReadAhead([1000] * 1100)
    for number in range(2):  # shard 0: two requests in a row
        ahead.request(0, number * 100, 100, shards.fetch)
    for shard in range(1, 1025):  # 1,024 other shards asked since: shard 0 is forgotten
        ahead.request(shard, 0, 100, shards.fetch)
    ahead.request(0, 200, 100, shards.fetch)  # would be the third in a row
    assert shards.fetched == []
    ahead.request(0, 300, 100, shards.fetch)
    ahead.request(0, 400, 100, shards.fetch)
    assert shards.fetched == [(0, 500, 200)]


def test_an_expected_window_is_fetched_once_and_serves_its_reads_in_any_order() -> None:
    shards = Shard([6 * MIB, 3 * MIB])
    ahead = ReadAhead([6 * MIB, 3 * MIB])
    window = [(0, 1000, 6 * MIB), (1, 0, 2 * MIB)]
    ahead.expect(window, shards.fetch)
    ahead.expect(window, shards.fetch)  # held already: nothing fetched again
    assert shards.fetched == [
        (0, 1000, 4 * MIB),
        (0, 1000 + 4 * MIB, 2 * MIB - 1000),
        (1, 0, 2 * MIB),
    ]
    for offset in [*range(1000, 6 * MIB - 70_000, 70_000)][::-1]:  # in order backwards: no run
        blocks = ahead.request(0, offset, 70_000, shards.fetch)
        assert blocks is not None
        assert joined(blocks, offset, 70_000) == shards.data[0][offset : offset + 70_000]
    assert ahead.request(1, 2 * MIB - 10, 20, shards.fetch) is None  # past the window
    assert len(shards.fetched) == 3


def test_expected_windows_hold_at_most_256_mib_the_least_recent_dropped() -> None:
    fetched: list[tuple[int, int, int]] = []

    def fetch(shard: int, offset: int, size: int) -> Future[bytes]:
        fetched.append((shard, offset, size))
        return Future()  # on its way

    ahead = ReadAhead([100 * MIB] * 4)
    windows = [[(shard, 0, 100 * MIB)] for shard in range(4)]
    for window in (windows[0], windows[1], windows[0], windows[2]):  # 1 least recent: dropped
        ahead.expect(window, fetch)
    assert [ahead.request(shard, 0, 10, fetch) is not None for shard in range(3)] == [
        True,
        False,
        True,
    ]
    count = len(fetched)
    ahead.expect([(3, 0, 100 * MIB), (1, 0, 100 * MIB), (2, 0, 57 * MIB)], fetch)  # too large
    assert len(fetched) == count
