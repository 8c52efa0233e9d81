"""A ZeroMQ client's cancel reaches the worker: a request no handler has taken is let go of at
once, the reply of one loading is dropped and what it holds let go of once it is built. (A real
client served at once after cancelling: tests/test_admission_release.py, both transports.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import zmq

import loadax
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.server.worker import Worker
from loadax.server.zmq_server import ZmqServer
from loadax.wire import zmq_frames
from loadax.wire.plans import batch_request, plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire

WAIT_S = 10.0
PLAN = loadax.Plan(64, batch_size=1)
HANDLERS = 2  # the server's handler threads, and the batches loading at once
IN_FLIGHT = 4  # max_in_flight_per_client


class Gate:
    """Records that, once `armed`, wait for `opened`; each loading batch (of one record) is
    told by `loading`."""

    def __init__(self) -> None:
        self.armed = False
        self.opened = threading.Event()
        self.loading = threading.Semaphore(0)

    def record(self, index: int) -> dict[str, Any]:
        if self.armed:
            self.loading.release()
            self.opened.wait(WAIT_S)
        return {"x": np.int64(index)}


@pytest.fixture
def served() -> Iterator[tuple[Gate, ZmqServer, Worker, zmq.Socket[bytes]]]:
    """A ZeroMQ server of the pipeline "gated" (`Gate`), and a DEALER connected to it."""
    gate = Gate()
    worker = Worker(
        {"gated": loadax.Pipeline(loadax.RangeDataset(0, 64).map(gate.record), loadax.Batcher())},
        threads=HANDLERS,
    )
    server = ZmqServer(
        worker, "tcp://127.0.0.1:0", threads=HANDLERS, max_in_flight_per_client=IN_FLIGHT
    )
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.rcvtimeo = int(WAIT_S * 1000)
    dealer.connect(server.start())
    try:
        yield gate, server, worker, dealer
    finally:
        gate.opened.set()
        dealer.close()
        context.term()
        server.stop(0)
        worker.close()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.01)


def reply_id(dealer: zmq.Socket[bytes]) -> int:
    """The request id of the next reply on `dealer`; its worker's error raised."""
    reply = zmq_frames.parse_batch_reply(dealer.recv_multipart())
    return reply.request_id


def batch(dealer: zmq.Socket[bytes]) -> Callable[[int], list[bytes]]:
    """The frames of the request, of request id `step`, for batch `step` of "gated"."""
    dealer.send_multipart(
        zmq_frames.request_frames(
            0,
            wire.HandshakeRequest(
                library_version=loadax.__version__, pipeline="gated", plan=plan_to_wire(PLAN)
            ),
        )
    )
    fingerprint = zmq_frames.parse_reply(
        dealer.recv_multipart(), wire.HandshakeResponse
    ).response.fingerprint
    return lambda step: zmq_frames.request_frames(
        step, batch_request("gated", fingerprint, PLAN, StepWork(step))
    )


def test_a_cancel_lets_go_at_once_of_what_waits_and_drops_the_replies_of_what_loads(
    served: tuple[Gate, ZmqServer, Worker, zmq.Socket[bytes]],
) -> None:
    """The client's IN_FLIGHT requests, HANDLERS of them loading, are all cancelled: those
    waiting for a handler are let go of at once, and a new request is admitted; once the
    loading ones are built, their replies are never sent, and nothing stays held."""
    gate, server, worker, dealer = served
    request = batch(dealer)
    wait_until(lambda: server.ledger.in_flight == 0, "the handshake's reply let go of")
    gate.armed = True
    for step in range(1, IN_FLIGHT + 1):
        dealer.send_multipart(request(step))
    for _ in range(HANDLERS):
        assert gate.loading.acquire(timeout=WAIT_S), "the batches never started loading"
    wait_until(lambda: server.ledger.in_flight == IN_FLIGHT, "every request admitted")
    for step in range(1, IN_FLIGHT + 1):
        dealer.send_multipart(zmq_frames.cancel_frames(step))
    wait_until(
        lambda: server.ledger.in_flight == HANDLERS, "the requests no handler took let go of"
    )
    assert worker.memory_budget.reserved > 0  # those loading
    dealer.send_multipart(request(IN_FLIGHT + 1))  # refused RESOURCE_EXHAUSTED without cancels
    gate.opened.set()
    # The loading ones are built before a handler takes the new one: a reply to either would
    # have come first.
    assert reply_id(dealer) == IN_FLIGHT + 1
    wait_until(
        lambda: (
            (server.ledger.held, server.ledger.held_bytes, worker.memory_budget.reserved)
            == (0, 0, 0)
        ),
        "every request and its memory let go of",
    )


def test_a_cancel_of_a_request_answered_or_unknown_is_ignored_and_a_malformed_one_refused(
    served: tuple[Gate, ZmqServer, Worker, zmq.Socket[bytes]],
) -> None:
    _, server, _, dealer = served
    request = batch(dealer)
    dealer.send_multipart(request(1))
    assert reply_id(dealer) == 1
    dealer.send_multipart(zmq_frames.cancel_frames(1))  # answered already
    dealer.send_multipart(zmq_frames.cancel_frames(99))  # never sent
    dealer.send_multipart([*zmq_frames.cancel_frames(7)[:2], b"junk"])
    with pytest.raises(WorkerError, match="the body of a Cancel is empty, got 4 bytes") as caught:
        reply_id(dealer)  # the first reply: the cancels before it have none
    assert caught.value.code == "INVALID_ARGUMENT"
    dealer.send_multipart(request(2))
    assert reply_id(dealer) == 2
    wait_until(lambda: server.ledger.held == 0, "every request let go of")
