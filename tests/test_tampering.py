"""A tampered worker costs time, never correctness: real worker processes on loopback, over gRPC
and ZeroMQ, one of them sending wrong replies (tests/tampered_worker.py), written into the client's
memory files or sent on the data socket."""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pipelines
import pytest
from equivalence import digests
from tampered_worker import TAMPERS
from test_grpc_data import OpenedGrpc
from test_zmq_data import OpenedZmq
from workers import WorkerProcess, worker_process

from loadax import DataLoader, WorkerError
from loadax.client import RemoteDataLoader, transports
from loadax.client.fleet_options import FleetOptions

RECORDS, FLOATS, BATCH, SEED = 48, 32, 4, 11
STEPS = RECORDS // BATCH
SERVED = f"""
[pipelines.blobs]
factory = "pipelines:blobs"
args = {{ records = {RECORDS}, floats = {FLOATS} }}
"""
LIMIT_S = 1.0
# What the client's check says of each tampered reply.
DIFFERENCES = {
    "a row less": r"leaf \['label'\] has 3 rows, the request asked for 4",
    "float16": r"leaf \['x'\] has dtype <f2, the schema says <f4",
    "an extra leaf": r"its tree is \{'extra': \*, 'label': \*, 'x': \*\}",
    "shifted labels": r"its payload's checksum is [0-9a-f]{16}, its header says [0-9a-f]{16}",
    "another step": r"it answers another request \(of step \d+\)",
    "junk": r"its payload does not decode: ",
}
# Each transport, and whether the client takes the same-host path (shared memory) or receives
# over the sockets, as from another host (on the data socket: its handshake waits for it, and the
# first batch of a pipeline goes there whatever its size); and whether the client is also tried
# alone with the tampered worker (once per way the payload travels).
TRANSPORTS = (
    ("grpc", True, True),
    ("zmq", True, False),
    ("zmq", False, True),
    ("grpc", False, False),
)


def test_every_tamper_has_its_expected_difference() -> None:
    assert DIFFERENCES.keys() == TAMPERS.keys()


@pytest.fixture
def data_sockets_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaders' transports whose handshake returns once the data socket it offers is open, so
    that the first batch goes there (it opens in the background, batches over gRPC or ZeroMQ
    meanwhile)."""
    monkeypatch.setattr(transports, "TRANSPORTS", {"grpc": OpenedGrpc, "zmq": OpenedZmq})


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("good"), SERVED, zmq=True) as worker:
        yield worker


@contextlib.contextmanager
def tampered(directory: Path, kind: str) -> Iterator[WorkerProcess]:
    launcher = ("-m", "tampered_worker", kind)
    with worker_process(directory, SERVED, zmq=True, launcher=launcher) as worker:
        yield worker


def reference(epochs: int = 1) -> list[str]:
    """The digests of the local loader's batches over `epochs` epochs."""
    pipeline = pipelines.blobs(records=RECORDS, floats=FLOATS)
    local = DataLoader(pipeline.batcher).batch_size(BATCH).shuffle(seed=SEED).workers(0)
    return digests(local.num_epochs(epochs).build(pipeline.dataset))


def remote(targets: list[str | None], shared_memory: bool = True) -> RemoteDataLoader:
    named = [target for target in targets if target is not None]
    assert len(named) == len(targets)
    loader = RemoteDataLoader(named, pipeline="blobs").batch_size(BATCH).shuffle(seed=SEED)
    loader = loader.shared_memory(shared_memory)
    # Every worker in from the start: with so short a timeout, a good one that joined late
    # could leave a bad one alone for a moment.
    return loader.no_worker_timeout(LIMIT_S).startup(min_workers=len(named))


@pytest.mark.usefixtures("data_sockets_opened")
@pytest.mark.parametrize("kind", list(TAMPERS))
def test_a_tampered_worker_is_quarantined_and_never_yields_a_batch(
    tmp_path: Path, good: WorkerProcess, kind: str
) -> None:
    difference = DIFFERENCES[kind]
    expected = reference()
    with tampered(tmp_path, kind) as bad:
        for transport, shared_memory, alone in TRANSPORTS:
            bad_target, good_target = getattr(bad, transport), getattr(good, transport)
            on_data_socket = f'"transport": "{transport}", "sent": '
            sent = bad.output().count(on_data_socket)
            # Beside a good worker: step 0 goes to the tampered one first.
            with remote([bad_target, good_target], shared_memory).build() as loader:
                assert loader.targets == [bad_target, good_target]
                assert digests(loader) == expected
                quarantined = loader.stats().workers[bad_target].quarantined
            if not shared_memory:  # its tampered reply went on the data socket
                bad.wait_for_output(f"{on_data_socket}{sent + 1}}}")
            assert quarantined is not None
            assert re.match(
                f"DATA_LOSS: {re.escape(bad_target)} sent a bad reply to step \\d+: {difference}",
                quarantined,
            ), quarantined
            if not alone:
                continue
            # Alone: a clear error naming what differed, and never a batch.
            with remote([bad_target], shared_memory).build() as loader:
                iterator = iter(loader)
                with pytest.raises(WorkerError) as raised:
                    next(iterator)
            message = raised.value.message
            assert raised.value.code == "UNAVAILABLE"
            assert message.startswith(f"no worker answered for {LIMIT_S:g} s"), message
            assert re.search(f"sent a bad reply to step \\d+: {difference}", message), message


def test_a_tampered_worker_probed_again_and_again_never_yields_a_batch(
    tmp_path: Path, good: WorkerProcess
) -> None:
    expected = reference(epochs=6)
    with tampered(tmp_path, "shifted labels") as bad:
        # A short quarantine: the bad worker is probed again and again while the run goes on.
        loader = remote([bad.grpc, good.grpc]).num_epochs(None).quarantine(0.01, 0.02)
        with loader.build() as running:
            seen = digests(itertools.islice(running, 6 * STEPS))
            stats = running.stats().workers[bad.grpc]
    assert seen == expected
    assert stats.requests > 1
    # Every probe it answered failed. Not counted as failures: the other request it held when
    # its first bad reply quarantined it (2 in flight per worker: cancelled, answered
    # elsewhere), and the last probe, which may still be out (or cancelled, answered elsewhere
    # first) when the run ends: a probe goes out only once the one before is over.
    in_flight = FleetOptions().in_flight_per_worker
    assert stats.failures >= stats.requests - (in_flight - 1) - 1
