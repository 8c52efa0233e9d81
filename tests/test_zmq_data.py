"""The data socket of the ZeroMQ transport (`loadax.wire.zmq_data`): batch replies on a plain TCP
connection beside the worker's ROUTER socket, received straight into the client's buffer."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from helpers import assert_batches_equal
from processes import free_port
from verifying import Verifying
from workers import WorkerProcess, worker_process

import loadax
from loadax.client.security import ClientSecurity
from loadax.client.transports import Transport
from loadax.client.transports import zmq_data as zmq_data_client
from loadax.client.transports.zmq import ZmqTransport
from loadax.client.transports.zmq_data import open_data_socket
from loadax.errors import WorkerError
from loadax.server import zmq_server
from loadax.server.config import load_config
from loadax.server.config_checks import ConfigError
from loadax.server.config_security import CurveConfig
from loadax.server.worker import Worker
from loadax.server.zmq_data import DataPort
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_data, zmq_frames
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 10.0  # the most any test waits for something that should happen at once
TOKEN = "s3cret"
NUMBERS = loadax.Pipeline(
    loadax.RangeDataset(0, 100).map(
        lambda i: {"x": np.full(3000, i, dtype=np.float32), "y": np.int64(2 * i)}
    ),
    loadax.Batcher(),
)
PLAN = loadax.Plan(100, 8, seed=3, shuffle=True, num_epochs=2)
SERVED = '[pipelines.numbers]\nfactory = "pipelines:numbers"\n'


@pytest.fixture(scope="module")
def worker() -> Iterator[Worker]:
    worker = Worker({"numbers": NUMBERS})
    yield worker
    worker.close()


def count_sends(
    monkeypatch: pytest.MonkeyPatch, port: type[Any], reply_id: Callable[..., int]
) -> list[int]:
    """The ids of the replies that every `port` (a worker's data port class) sends on a data
    socket from now on, each the `reply_id` of its `send`'s arguments after the port."""
    sent: list[int] = []
    send = port.send

    def counted(self: Any, *arguments: Any) -> bool:
        taken: bool = send(self, *arguments)
        if taken:
            sent.append(reply_id(*arguments))
        return taken

    monkeypatch.setattr(port, "send", counted)
    return sent


@pytest.fixture
def sent_on_data_sockets(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The request ids of the replies every `DataPort` sends on a data socket."""
    return count_sends(monkeypatch, DataPort, lambda identity, request_id, batch: request_id)


class WaitsForDataSocket:
    """Before a transport's class: its handshake returns once the data socket it offers is open
    (or given up), so that the batches asked for next come there (it opens in the background)."""

    def handshake(
        self, request: wire.HandshakeRequest, timeout: float = WAIT_S
    ) -> wire.HandshakeResponse:
        response: wire.HandshakeResponse = super().handshake(request, timeout)  # type: ignore[misc]
        self.data_socket_open(timeout)  # type: ignore[attr-defined]
        return response


class OpenedZmq(WaitsForDataSocket, ZmqTransport):
    pass


def handshake_request(pipeline: str = "numbers", plan: loadax.Plan = PLAN) -> wire.HandshakeRequest:
    return wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline=pipeline, plan=plan_to_wire(plan)
    )


def load(
    endpoint: str,
    steps: list[int],
    pipeline: str = "numbers",
    plan: loadax.Plan = PLAN,
    **options: Any,
) -> tuple[wire.HandshakeResponse, list[Any]]:
    """The handshake with the worker at `endpoint` (from another host: no shared memory), and
    the batches of `pipeline` under `plan` of `steps` (the last one's rows 1 and 3 only),
    verified."""
    with OpenedZmq(endpoint.replace("tcp://", "zmq://"), shared_memory=False, **options) as sent:
        target = Verifying(sent)
        response = target.transport.handshake(handshake_request(pipeline, plan), WAIT_S)
        requests = [
            wire.BatchRequest(
                pipeline=pipeline,
                fingerprint=response.fingerprint,
                plan=plan_to_wire(plan),
                step=step,
                rows=[1, 3] if index == len(steps) - 1 else None,
            )
            for index, step in enumerate(steps)
        ]
        replies = [target.transport.send(request) for request in requests]
        return response, [
            target.verify(*each, WAIT_S) for each in zip(requests, replies, strict=True)
        ]


def expected(steps: list[int]) -> list[Any]:
    return [NUMBERS.load(PLAN, step, [1, 3] if step == steps[-1] else None) for step in steps]


def test_batches_over_the_data_socket_are_the_local_loaders(
    worker: Worker, sent_on_data_sockets: list[int]
) -> None:
    server = ZmqServer(worker, "tcp://127.0.0.1:0")
    steps = [0, 5, 12, 24, 25]  # 24: the short last batch of the second epoch
    try:
        response, batches = load(server.start(), steps)
    finally:
        server.stop(grace=WAIT_S)
    assert response.data_port == server.data_port != 0
    assert len(response.data_nonce) == zmq_data.NONCE_BYTES
    assert len(sent_on_data_sockets) == len(steps)
    assert_batches_equal(batches, expected(steps))


def test_a_handshake_returns_once_the_data_socket_it_offers_is_open(
    worker: Worker, monkeypatch: pytest.MonkeyPatch, sent_on_data_sockets: list[int]
) -> None:
    """The first batches come on it, not over ZeroMQ (a plain transport, which waits for it a
    few times its handshake's time: long here, so that a loaded machine does not decide)."""
    monkeypatch.setattr(zmq_data_client, "FIRST_WAIT_S", WAIT_S)
    monkeypatch.setattr(zmq_data_client, "FIRST_WAIT_ROUND_TRIPS", 1e9)
    server = ZmqServer(worker, "tcp://127.0.0.1:0")
    try:
        address = server.start().replace("tcp://", "zmq://")
        with ZmqTransport(address, shared_memory=False) as transport:
            target = Verifying(transport)
            response = transport.handshake(handshake_request(), WAIT_S)
            assert transport.data_socket_open(0.0)
            request = wire.BatchRequest(
                pipeline="numbers",
                fingerprint=response.fingerprint,
                plan=plan_to_wire(PLAN),
                step=3,
            )
            batch = target.verify(request, transport.send(request), WAIT_S)
    finally:
        server.stop(grace=WAIT_S)
    assert len(sent_on_data_sockets) == 1
    assert_batches_equal([batch], [NUMBERS.load(PLAN, 3, None)])


# Rows of an odd size (1.26 MiB), 4 a batch: the client receives a payload in pieces of 2 MiB,
# wakes for at most 2 MiB of it and checksums it in chunks of 256 KiB, and none of them ends
# where a row, another or the payload does.
WIDE_ROW_BYTES = (1 << 20) + (1 << 18) + 12_345
WIDE = loadax.Pipeline(
    loadax.RangeDataset(0, 12).map(
        lambda i: np.random.default_rng(i).integers(0, 256, WIDE_ROW_BYTES, dtype=np.uint8)
    ),
    loadax.Batcher(),
)
WIDE_PLAN = loadax.Plan(12, 4, seed=1, shuffle=True, num_epochs=1)


def test_a_batch_of_many_pieces_comes_whole_over_the_data_socket(
    sent_on_data_sockets: list[int],
) -> None:
    worker = Worker({"wide": WIDE})
    server = ZmqServer(worker, "tcp://127.0.0.1:0")
    steps = [0, 1, 2]
    try:
        _, batches = load(server.start(), steps, "wide", WIDE_PLAN)
    finally:
        server.stop(grace=WAIT_S)
        worker.close()
    assert len(sent_on_data_sockets) == len(steps)
    assert_batches_equal(
        batches,
        [WIDE.load(WIDE_PLAN, step, [1, 3] if step == steps[-1] else None) for step in steps],
    )
    assert batches[0].nbytes == 4 * WIDE_ROW_BYTES


@pytest.mark.parametrize("off", ["worker", "client", "curve"])
def test_without_a_data_socket_replies_come_over_zeromq(
    worker: Worker, sent_on_data_sockets: list[int], off: str
) -> None:
    server_key, server_secret = zmq.curve_keypair()
    curve = CurveConfig(server_key, server_secret) if off == "curve" else None
    server = ZmqServer(
        worker, "tcp://127.0.0.1:0", data_port=None if off == "worker" else 0, curve=curve
    )
    options: dict[str, Any] = {"data_socket": off != "client"}
    if curve is not None:  # CURVE protects ZeroMQ, not a plain socket: payloads stay inside
        options["security"] = ClientSecurity(curve_server_key=server_key.decode())
    try:
        response, batches = load(server.start(), [3, 7], **options)
    finally:
        server.stop(grace=WAIT_S)
    assert response.data_port == 0
    assert sent_on_data_sockets == []
    assert_batches_equal(batches, expected([3, 7]))


@pytest.mark.parametrize(
    ("same_host", "takes_requests"), [(True, True), (True, False), (False, True)]
)
def test_a_client_opens_a_data_socket_unless_it_would_carry_nothing(
    worker: Worker,
    monkeypatch: pytest.MonkeyPatch,
    sent_on_data_sockets: list[int],
    same_host: bool,
    takes_requests: bool,
) -> None:
    """A worker that writes batches into the client's memory files answers with headers only:
    a data socket carries its requests and those headers if it takes requests there, and
    nothing otherwise (as an older worker's): then none is opened (its connection and hello
    would delay the first batch)."""
    opened: list[str] = []
    open_socket = zmq_data_client.open_data_socket

    def counted(address: str, *rest: Any) -> socket.socket | None:
        opened.append(address)
        return open_socket(address, *rest)

    monkeypatch.setattr(zmq_data_client, "open_data_socket", counted)
    if not takes_requests:
        monkeypatch.setattr(zmq_server, "DataPort", lambda host, port, _: DataPort(host, port))
    server = ZmqServer(worker, "tcp://127.0.0.1:0")
    steps = [2, 9]
    try:
        endpoint = server.start().replace("tcp://", "zmq://")
        with OpenedZmq(endpoint, shared_memory=same_host) as transport:
            target = Verifying(transport)
            response = target.handshake(handshake_request(), WAIT_S)
            batches = [
                target.load(
                    wire.BatchRequest(
                        pipeline="numbers",
                        fingerprint=response.fingerprint,
                        plan=plan_to_wire(PLAN),
                        step=step,
                    ),
                    WAIT_S,
                )
                for step in steps
            ]
    finally:
        server.stop(grace=WAIT_S)
    assert_batches_equal(batches, [NUMBERS.load(PLAN, step) for step in steps])
    assert response.shared_memory == same_host
    assert opened == ([endpoint] if takes_requests else [])
    assert len(sent_on_data_sockets) == (2 if takes_requests else 0)  # batches, or headers


def test_a_data_port_that_cannot_be_reached_leaves_replies_on_zeromq(
    caplog: pytest.LogCaptureFixture,
) -> None:
    offered = wire.HandshakeResponse(data_port=free_port(), data_nonce=bytes(16))
    with caplog.at_level(logging.INFO):
        assert open_data_socket("zmq://127.0.0.1:1", offered) is None
    assert "batch replies come over ZeroMQ" in caplog.text


def raw_nonce(endpoint: str) -> bytes:
    """A nonce from a handshake that asks for a data socket, over a DEALER of its own."""
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    with context.socket(zmq.DEALER) as dealer:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(endpoint)
        request = handshake_request()
        request.data_socket = True
        dealer.send_multipart(zmq_frames.request_frames(1, request, TOKEN))
        assert dealer.poll(int(WAIT_S * 1000)), "no handshake reply"
        reply = zmq_frames.parse_reply(dealer.recv_multipart(), wire.HandshakeResponse)
    return reply.response.data_nonce


def closed_by_worker(port: int, sent: bytes, after: bytes = b"") -> bytes:
    """What the worker answers on a data socket that sends `sent`, then `after`, before it
    closes it (it must)."""
    with socket.create_connection(("127.0.0.1", port), WAIT_S) as peer:
        peer.settimeout(WAIT_S)
        peer.sendall(sent)
        answer = b""
        try:
            if after:
                answer = peer.recv(len(zmq_data.ACCEPTED))
                peer.sendall(after)
            left = peer.recv(64)
        except ConnectionResetError:  # closed with bytes it never read
            left = b""
        assert left == b"", "the worker left the data socket open"
    return answer


def test_the_worker_closes_data_sockets_that_misbehave_and_serves_on(
    worker: Worker, sent_on_data_sockets: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    server = ZmqServer(worker, "tcp://127.0.0.1:0", token=TOKEN)
    endpoint = server.start()
    port = server.data_port
    assert port is not None
    try:
        # b"junk" declares a message of 0x6A756E6B bytes: more than a request may hold.
        refuses_what_misbehaves(
            port, lambda: raw_nonce(endpoint), caplog, "declares 1786080875 bytes, more than"
        )
        _, batches = load(endpoint, [2, 9], security=ClientSecurity(token=TOKEN))
    finally:
        server.stop(grace=WAIT_S)
    assert len(sent_on_data_sockets) == 2
    assert_batches_equal(batches, expected([2, 9]))


def refuses_what_misbehaves(
    port: int,
    nonce: Callable[[], bytes],
    caplog: pytest.LogCaptureFixture,
    junk: str = "it sent bytes after its hello",
) -> None:
    """The worker's data port `port` (its token `TOKEN`) takes a hello on the nonce that
    `nonce()` has a handshake offer, without the token (as a client sends it) or with any (as an
    older client sends its own: ignored); it logs and closes data sockets that send what is not
    a hello, a nonce never offered or one spent, bytes after their hello that it refuses for
    `junk`, or close before it."""
    spent = nonce()
    with caplog.at_level(logging.WARNING, logger="loadax.server.zmq_data"):
        closed_by_worker(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        closed_by_worker(port, zmq_data.hello(bytes(16)))  # a nonce never offered
        taken = closed_by_worker(port, zmq_data.hello(spent), b"junk")
        closed_by_worker(port, zmq_data.hello(spent))
        old = closed_by_worker(port, older_hello(nonce(), "not the token"), b"junk")
        with socket.create_connection(("127.0.0.1", port), WAIT_S):
            pass  # closed before its hello
    assert taken == old == zmq_data.ACCEPTED
    refusals = [record.getMessage() for record in caplog.records]
    for why, times in (
        ("starts b'LDXD\\x01', got b'GET /'", 1),
        ("its nonce was never offered, or was used already", 2),
        (junk, 2),
    ):
        assert sum(why in line for line in refusals) == times, (why, refusals)


def older_hello(nonce: bytes, token: str) -> bytes:
    """The hello of a client before the token left it: the nonce, then `token`."""
    return zmq_data.HELLO_HEAD.pack(zmq_data.HELLO_MAGIC, nonce, len(token)) + token.encode()


def test_a_hello_refused_as_an_older_worker_with_a_token_does_leaves_replies_on_zeromq(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An older worker with a token wants it in the hello: it closes the data socket, and batch
    replies come over ZeroMQ."""
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def refuse() -> None:
            peer, _ = listener.accept()
            with peer:
                peer.recv(zmq_data.HELLO_HEAD.size, socket.MSG_WAITALL)

        older = threading.Thread(target=refuse)
        older.start()
        offered = wire.HandshakeResponse(data_port=listener.getsockname()[1], data_nonce=bytes(16))
        with caplog.at_level(logging.WARNING):
            assert open_data_socket("zmq://127.0.0.1:1", offered) is None
        older.join(WAIT_S)
    assert "refused the hello (a worker older than this client" in caplog.text
    assert "batch replies come over ZeroMQ" in caplog.text


BLOBS = """
[pipelines.blobs]
factory = "pipelines:blobs"
args = { records = 64, floats = 524288 }
"""


def test_a_worker_killed_mid_stream_fails_what_it_held_at_once(tmp_path: Path) -> None:
    with worker_process(tmp_path, BLOBS, grpc=False, zmq=True) as process:
        assert process.zmq is not None
        with OpenedZmq(process.zmq, shared_memory=False) as transport:
            failed = killed_while_streaming(process, transport)
    for error in failed:
        assert "lost the connection" in error.message


def killed_while_streaming(process: WorkerProcess, transport: Transport) -> list[WorkerError]:
    """The errors of the requests for 8 MiB batches of `BLOBS` that `transport` sends on its
    data socket, its worker `process` killed as they stream: each fails at once, UNAVAILABLE."""
    blobs = loadax.Plan(64, 4, num_epochs=1)
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline="blobs", plan=plan_to_wire(blobs)
    )
    response = transport.handshake(request, WAIT_S)
    assert response.data_port
    replies = [
        transport.send(
            wire.BatchRequest(
                pipeline="blobs",
                fingerprint=response.fingerprint,
                plan=plan_to_wire(blobs),
                step=step,
            )
        )
        for step in range(16)
    ]
    replies[0].result(WAIT_S)  # the batches are streaming
    os.kill(process.process.pid, signal.SIGKILL)
    waiting = wait(replies, WAIT_S).not_done
    assert not waiting, "requests still wait on a worker that was killed"
    failed = [reply.exception() for reply in replies if reply.exception() is not None]
    assert failed, "every batch arrived before the worker was killed"
    for error in failed:
        assert isinstance(error, WorkerError), error
        assert error.code == "UNAVAILABLE", error
    return [error for error in failed if isinstance(error, WorkerError)]


@pytest.mark.parametrize(
    ("value", "port"), [("", 0), ("zmq_data_port = 7001", 7001), ("zmq_data_port = false", None)]
)
def test_the_config_sets_the_data_port_or_turns_it_off(
    tmp_path: Path, value: str, port: int | None
) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(f'[server]\nzmq = "tcp://127.0.0.1:0"\n{value}\n{SERVED}')
    assert load_config(path).zmq_data_port == port


@pytest.mark.parametrize("value", ["true", "-1", "70000", '"7001"'])
def test_a_bad_data_port_is_a_config_error_naming_the_key(tmp_path: Path, value: str) -> None:
    path = tmp_path / "worker.toml"
    path.write_text(f'[server]\nzmq = "tcp://127.0.0.1:0"\nzmq_data_port = {value}\n{SERVED}')
    with pytest.raises(ConfigError, match=r"worker.toml: \[server\].zmq_data_port must be a port"):
        load_config(path)


def test_a_worker_back_at_its_address_gets_a_new_data_socket(
    worker: Worker, sent_on_data_sockets: list[int]
) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    first = ZmqServer(worker, endpoint)
    first.start()
    with OpenedZmq(endpoint.replace("tcp://", "zmq://"), shared_memory=False) as transport:
        target = Verifying(transport)
        fingerprint = transport.handshake(handshake_request(), WAIT_S).fingerprint

        def step(number: int) -> Any:
            request = wire.BatchRequest(
                pipeline="numbers", fingerprint=fingerprint, plan=plan_to_wire(PLAN), step=number
            )
            return target.verify(request, transport.send(request), WAIT_S)

        batches = [step(1)]
        first.stop(grace=WAIT_S)
        second = ZmqServer(worker, endpoint)
        second.start()
        try:
            transport.info(wire.InfoRequest(), WAIT_S)  # connected again
            # Until the new handshake is answered, replies come over ZeroMQ.
            while len(sent_on_data_sockets) < 2 and len(batches) < 100:
                batches.append(step(2))
        finally:
            second.stop(grace=WAIT_S)
    # The first worker's data socket sent the first batch; the second's sent the later ones
    # (one more than the loop waited for when its client read a reply before its worker counted it).
    assert len(sent_on_data_sockets) in (2, 3), sent_on_data_sockets
    assert_batches_equal(
        batches, [NUMBERS.load(PLAN, 1)] + [NUMBERS.load(PLAN, 2)] * (len(batches) - 1)
    )
