"""Batches through shared memory between a worker and a client on one host (loadax/wire/
shared_memory.py): found at the handshake, on by default over both transports, off by a
setting on either side, verified as any reply, and nothing left behind when either process is
killed."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pipelines
import pytest
from equivalence import digests
from workers import WorkerProcess, worker_env, worker_process, write_config

from loadax import DataLoader, Plan
from loadax.client import RemoteDataLoader
from loadax.client.member import handshake_request
from loadax.client.transports import connect
from loadax.client.transports.memory_files import Lease, MemoryFile, MemoryFiles
from loadax.server.config import ConfigError, load_config
from loadax.server.same_host import SameHost
from loadax.wire import shared_memory
from loadax.wire.checksum import payload_checksum
from loadax.wire.codec import encode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.v1 import worker_pb2 as wire

RECORDS, SIDE, BATCH = 24, 16, 4
SERVED = f"""
[pipelines.images]
factory = "pipelines:images"
args = {{ records = {RECORDS}, side = {SIDE} }}
"""
TRANSPORTS = ("grpc", "zmq")
WAIT_S = 20.0


def reference() -> list[str]:
    pipeline = pipelines.images(records=RECORDS, side=SIDE)
    return digests(DataLoader(pipeline.batcher).batch_size(BATCH).build(pipeline.dataset))


def memory_files(pid: int | str = "self") -> int:
    """How many descriptors and mappings of loadax memory files the process `pid` holds."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:loadax-")
        except FileNotFoundError:
            continue  # closed meanwhile
    return held + mapped(pid)


def baseline() -> int:
    """The memory files this process holds before a test: other tests' batches still alive (a
    test process runs many) keep theirs mapped."""
    gc.collect()
    return memory_files()


def mapped(pid: int | str = "self") -> int:
    """How many mappings of loadax memory files the process `pid` has: one for each file a
    batch came in (the file that handshakes name is never mapped)."""
    return Path(f"/proc/{pid}/maps").read_text().count("/memfd:loadax-")


def write(memory: wire.SharedMemory, frames: list[bytes | memoryview]) -> None:
    """Write a payload into the memory file `memory` names, as a worker does."""
    file = shared_memory.ClientFile(memory)
    try:
        file.write(frames)
    finally:
        file.close()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.02)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    with worker_process(tmp_path_factory.mktemp("served"), SERVED, zmq=True) as running:
        yield running


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_worker_on_the_host_says_so_unless_either_side_turns_it_off(
    worker: WorkerProcess, transport: str, tmp_path: Path
) -> None:
    asked = handshake_request("images", Plan(RECORDS, BATCH))
    for enabled in (True, False):
        transport_to = connect(worker.address(transport), shared_memory=enabled)
        try:
            assert transport_to.handshake(asked).shared_memory == enabled
        finally:
            transport_to.close()
    config = write_config(tmp_path, SERVED, zmq=True)
    config.write_text(config.read_text().replace("[server]", "[server]\nshared_memory = false"))
    before = baseline()
    with (
        worker_process(tmp_path, config=config) as refusing,
        RemoteDataLoader([refusing.address(transport)], pipeline="images")
        .batch_size(BATCH)
        .build() as loader,
    ):
        assert digests(loader) == reference()  # sent over the socket
        assert mapped() <= before


def test_either_setting_must_be_a_boolean(tmp_path: Path) -> None:
    config = write_config(tmp_path, SERVED)
    config.write_text(config.read_text().replace("[server]", '[server]\nshared_memory = "no"'))
    with pytest.raises(ConfigError, match=r"\[server\]\.shared_memory must be true or false"):
        load_config(config)
    with pytest.raises(ValueError, match="shared_memory must be True or False, got 'no'"):
        RemoteDataLoader(["zmq://127.0.0.1:1"], pipeline="images").shared_memory("no")  # type: ignore[arg-type]


def test_a_file_is_reused_only_once_answered_and_nothing_made_from_it_is_alive() -> None:
    files = MemoryFiles()
    request = wire.BatchRequest(step=3)
    frames = encode_frames({"x": np.arange(1000, dtype=np.int64)})
    header = EncodedBatch(3, frames).header
    header.shared_memory = True

    answered = Lease(files, request)
    write(answered.request.shared_memory, frames)
    payload = answered.reply("w", header, [], None, 1 << 20).payload[0]
    answered.settle()
    assert bytes(payload) == b"".join(frames)
    # Its payload is alive: another request gets another file, allocated here as large.
    second = Lease(files, request)
    assert second.request.shared_memory.fd != answered.request.shared_memory.fd
    assert os.fstat(second.request.shared_memory.fd).st_size == len(b"".join(frames))
    second.settle()  # not answered: dropped
    del payload
    gc.collect()
    third = Lease(files, request)
    assert third.request.shared_memory == answered.request.shared_memory  # free: reused
    third.settle()
    files.close()


def answered_batch(files: MemoryFiles) -> memoryview:
    """A request's file, written and answered as a worker does: the batch's payload in it."""
    frames = encode_frames({"x": np.arange(1000, dtype=np.int64)})
    header = EncodedBatch(3, frames).header
    header.shared_memory = True
    lease = Lease(files, wire.BatchRequest(step=3))
    write(lease.request.shared_memory, frames)
    payload = lease.reply("w", header, [], None, 1 << 20).payload[0]
    lease.settle()
    return memoryview(payload)


def test_files_are_kept_for_the_batches_alive_lately_and_let_go_of_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[str] = []
    make = MemoryFile.__init__
    monkeypatch.setattr(
        MemoryFile, "__init__", lambda file, size=0: (make(file, size), made.append(file.name))[0]
    )
    files = MemoryFiles(spare=1, recent=8)
    alive = [answered_batch(files) for _ in range(4)]
    for _ in range(10):  # the user lets go of 3 batches at once, then takes 3: no file is made
        del alive[:3]
        alive += [answered_batch(files) for _ in range(3)]
    assert len(made) == 4
    hoard = [answered_batch(files) for _ in range(6)]  # the user holds 10
    assert (len(made), files.kept) == (10, 10)
    del hoard
    for _ in range(8):  # 8 lends later, 5 were needed at once at most: those and the spare
        alive.append(answered_batch(files))
        alive.pop(0)
    assert (len(made), files.kept) == (10, 6)
    files.close()


def test_a_file_whose_request_was_not_answered_is_never_written_into_a_later_batch() -> None:
    files = MemoryFiles()
    frames = encode_frames({"x": np.arange(1000, dtype=np.int64)})
    header = EncodedBatch(3, frames).header
    header.shared_memory = True
    # A worker that opened the file of a request then froze, and the request was given up.
    late = Lease(files, wire.BatchRequest(step=3))
    stale = shared_memory.open_client_file(late.request.shared_memory)
    late.settle()
    lease = Lease(files, wire.BatchRequest(step=4))
    assert lease.request.shared_memory.name != late.request.shared_memory.name
    write(lease.request.shared_memory, frames)
    batch = lease.reply("w", header, [], None, 1 << 20).payload[0]
    os.pwrite(stale, bytes(len(b"".join(frames))), 0)  # the frozen worker wakes up and writes
    os.close(stale)
    assert bytes(batch) == b"".join(frames)
    lease.settle()
    files.close()


@pytest.mark.parametrize(
    "kind", [wire.CHECKSUM_XXH3_CHUNKS, wire.CHECKSUM_XXH3_64, wire.CHECKSUM_WEIGHTED_SUM]
)
def test_a_payload_not_yet_checksummed_is_checksummed_as_it_is_written(kind: int) -> None:
    file = MemoryFile()
    frames = encode_frames({"x": np.arange(300_000, dtype=np.int64), "y": np.ones(7)})
    request = wire.BatchRequest(step=2, checksum=kind, shared_memory=file.wire)
    built = EncodedBatch.answering(request, "f", frames, checksummed=False)
    assert built.checksum is None
    with pytest.raises(ValueError, match="checksum of the batch of step 2 was never computed"):
        _ = built.header
    same_host = SameHost(enabled=True)
    with same_host.file(request) as client_file:
        placed = same_host.place(request, built, client_file)
    joined = b"".join(frames)
    assert placed.frames == ()
    assert placed.shared_size == len(joined)
    assert (placed.checksum, placed.checksum_kind) == (payload_checksum(frames, kind), kind)
    assert os.pread(file.wire.fd, len(joined), 0) == joined
    # A file that cannot be written leaves it to be sent, checksummed then.
    elsewhere = wire.BatchRequest(
        step=2, checksum=kind, shared_memory=wire.SharedMemory(pid=2**31, fd=3, name=file.wire.name)
    )
    with same_host.file(elsewhere) as client_file:
        assert client_file is None
        sent = same_host.place(elsewhere, built, client_file).checksummed_for(elsewhere)
    assert sent.frames == frames
    assert sent.checksum == placed.checksum
    file.close()


def test_a_file_that_is_not_the_one_named_is_refused_and_the_batch_sent_instead() -> None:
    file = MemoryFile()
    named = file.wire
    unsealed = MemoryFile.__new__(MemoryFile)
    unsealed.name, unsealed.fd = "0" * 16, os.memfd_create(f"loadax-{'0' * 16}", os.MFD_CLOEXEC)
    for wrong, reason in (
        (wire.SharedMemory(pid=named.pid, fd=named.fd, name="0" * 16), "is not the memory file"),
        (wire.SharedMemory(pid=named.pid, fd=0, name=named.name), "is not the memory file"),
        (wire.SharedMemory(pid=named.pid, fd=named.fd, name="../x"), "is not the name of"),
        (wire.SharedMemory(pid=2**31, fd=3, name=named.name), "cannot open /proc/"),
        (unsealed.wire, "is not sealed against shrinking"),  # its client could crash a mapper
    ):
        with pytest.raises(shared_memory.SharedMemoryError, match=reason):
            shared_memory.open_client_file(wrong)
        request = wire.BatchRequest(step=1, shared_memory=wrong)
        batch = EncodedBatch(1, [b"LDX1..."])
        same_host = SameHost(enabled=True)
        with same_host.file(request) as client_file:
            assert same_host.place(request, batch, client_file) is batch  # sent
    assert shared_memory.can_open(named)
    file.close()
    os.close(unsealed.fd)


CLIENT = """
import sys
from loadax.client import RemoteDataLoader
loader = RemoteDataLoader([sys.argv[1]], pipeline="images").batch_size(4).num_epochs(None).build()
for index, batch in enumerate(loader):
    if index == 2:
        print("receiving", flush=True)
"""


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_client_killed_leaves_nothing_in_the_worker(
    worker: WorkerProcess, transport: str
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CLIENT), worker.address(transport)],
        stdout=subprocess.PIPE,
        text=True,
        env=worker_env(),
    ) as client:
        try:
            assert client.stdout is not None
            assert client.stdout.readline() == "receiving\n"
            assert mapped(client.pid) > 0  # its batches come through shared memory
        finally:
            client.send_signal(signal.SIGKILL)
            client.wait(WAIT_S)
    wait_until(lambda: memory_files(worker.process.pid) == 0, "the worker let go of every file")
    assert not [name for name in os.listdir("/dev/shm") if name.startswith("loadax")]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_worker_killed_leaves_the_batches_held_intact_and_nothing_behind(
    transport: str, tmp_path: Path
) -> None:
    expected = reference()
    before = baseline()
    with worker_process(tmp_path, SERVED, zmq=True) as dying:
        loader = RemoteDataLoader([dying.address(transport)], pipeline="images").batch_size(BATCH)
        with loader.build() as built:
            held = list(built)
            assert mapped() > before
            dying.process.send_signal(signal.SIGKILL)
            dying.process.wait(WAIT_S)
            assert digests(held) == expected
    del held
    gc.collect()
    assert memory_files() <= before
