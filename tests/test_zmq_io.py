"""The process's ZeroMQ I/O thread (`loadax.client.transports.zmq_io`): one target whose serving
raises does not stop it serving the others."""

from __future__ import annotations

import logging
import socket
import threading

import pytest

from loadax.client.transports import zmq_io

WAIT_S = 10.0  # the most anything here waits for what should happen at once


class Failing:
    """A target with a plain socket watched, whose serving raises (a bug in it)."""

    def __init__(self, io: zmq_io.ZmqIo) -> None:
        self.ours, self.theirs = socket.socketpair()
        self.watched = threading.Event()
        self.served = 0
        self._io = io

    def serve(self) -> bool:
        if not self.watched.is_set():
            self._io.watch(self.ours, self)
            self.watched.set()
            return False
        self.served += 1
        raise RuntimeError("a bug in this target")


class Counting:
    """A target that counts its turns."""

    def __init__(self) -> None:
        self.turn = threading.Event()

    def serve(self) -> bool:
        self.turn.set()
        return False


def test_a_target_that_raises_is_let_go_and_the_others_are_served_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    io = zmq_io.SHARED.acquire()
    failing = Failing(io)
    try:
        io.wake(failing)
        assert failing.watched.wait(WAIT_S)
        with caplog.at_level(logging.ERROR, logger=zmq_io.__name__):
            failing.theirs.send(b"x")  # its socket is readable: it is served, and raises
            for _ in range(3):  # the thread goes on: each target woken is served
                later = Counting()
                io.wake(later)
                assert later.turn.wait(WAIT_S)
        assert failing.served == 1  # let go: its socket, still readable, is no longer watched
        assert "serving it failed" in caplog.text
    finally:
        zmq_io.SHARED.release(io)
        failing.ours.close()
        failing.theirs.close()


def test_waking_a_thread_whose_pipe_is_gone_says_what_became_of_it() -> None:
    io = zmq_io.ZmqIo()
    io.close()  # stopped and joined: its wake-up pipe is closed
    with pytest.raises(RuntimeError, match="has exited and was asked to stop"):
        io.wake(Counting())
