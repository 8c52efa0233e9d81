"""A real `loadax-worker` whose batch replies are wrong in one way, as a buggy, corrupted or
stale worker's would be: `python -m tampered_worker KIND --config worker.toml`.

It answers handshakes honestly (so a client binds to it) and tampers with each batch after the
worker made it. A change of structure comes with a header that matches it (the worker's own bug);
changed values keep the header of the true batch (corruption after the header was made). It prints
a line for each reply sent on a data socket, `{"event": "data socket", "transport": ..., "sent": N}`
(N: that transport's count so far), so that a test knows which way its replies went.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from loadax.errors import WorkerError
from loadax.server import grpc_data, main, zmq_server
from loadax.server.worker import Worker
from loadax.server.zmq_data import DataPort
from loadax.wire.checksum import payload_checksum
from loadax.wire.codec import decode_frames, encode_frames
from loadax.wire.payloads import EncodedBatch, answer_checksum
from loadax.wire.shared_memory import ClientFile
from loadax.wire.v1 import worker_pb2 as wire

Tamper = Callable[[Worker, wire.BatchRequest, EncodedBatch], EncodedBatch]


def _forged(request: wire.BatchRequest, made: EncodedBatch, batch: Any) -> EncodedBatch:
    """`batch` with a header that matches it."""
    return EncodedBatch.answering(request, made.fingerprint, encode_frames(batch))


def _batch(made: EncodedBatch) -> dict[str, Any]:
    batch: dict[str, Any] = decode_frames(made.frames)
    return batch


def a_row_less(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    return _forged(request, made, {key: leaf[:-1] for key, leaf in _batch(made).items()})


def float16(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    batch = _batch(made)
    return _forged(request, made, {**batch, "x": batch["x"].astype(np.float16)})


def an_extra_leaf(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    batch = _batch(made)
    return _forged(request, made, {**batch, "extra": np.zeros(len(batch["label"]))})


def shifted_labels(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    batch = _batch(made)
    shifted = encode_frames({**batch, "label": batch["label"] + 1})
    # The true batch's checksum, whether or not the worker had computed it yet (a payload for
    # the client's memory file is checksummed as it is written).
    kind = answer_checksum(request)
    checksum = payload_checksum(made.frames, kind)
    return EncodedBatch(made.step, shifted, made.fingerprint, made.request_digest, checksum, kind)


def another_step(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    other = wire.BatchRequest()
    other.CopyFrom(request)
    other.step = request.step + 1
    try:
        return _honest(worker, other)
    except WorkerError:  # the last step: answer the one before
        other.step = request.step - 1
        return _honest(worker, other)


def junk(worker: Worker, request: wire.BatchRequest, made: EncodedBatch) -> EncodedBatch:
    return EncodedBatch.answering(request, made.fingerprint, [bytes(range(256)) * 16])


TAMPERS: dict[str, Tamper] = {
    "a row less": a_row_less,
    "float16": float16,
    "an extra leaf": an_extra_leaf,
    "shifted labels": shifted_labels,
    "another step": another_step,
    "junk": junk,
}
_honest = Worker.load_batch


def tampering(tamper: Tamper) -> Callable[..., EncodedBatch]:
    def load_batch(
        worker: Worker,
        request: wire.BatchRequest,
        max_reply_bytes: int | None = None,
        *,
        checksummed: bool = True,
        into: ClientFile | None = None,
    ) -> EncodedBatch:
        # Made in the worker's memory (not `into` the client's file): the tamper takes it apart.
        made = _honest(worker, request, max_reply_bytes, checksummed=checksummed)
        return tamper(worker, request, made)

    return load_batch


_SENT = {"grpc": itertools.count(1), "zmq": itertools.count(1)}


def _told(transport: str, sent: bool) -> bool:
    """`sent` (whether a reply went on a data socket of `transport`), printed if it did."""
    if sent:
        line = {"event": "data socket", "transport": transport, "sent": next(_SENT[transport])}
        print(json.dumps(line), flush=True)
    return sent


class _ZmqDataPort(DataPort):
    def send(self, identity: bytes, request_id: int, batch: EncodedBatch) -> bool:
        return _told("zmq", super().send(identity, request_id, batch))


_grpc_send = grpc_data.GrpcDataPort.send


def _grpc_told(
    port: grpc_data.GrpcDataPort, request: wire.BatchRequest, batch: EncodedBatch
) -> bool:
    return _told("grpc", _grpc_send(port, request, batch))


if __name__ == "__main__":
    kind, *argv = sys.argv[1:]
    Worker.load_batch = tampering(TAMPERS[kind])  # type: ignore[method-assign]
    zmq_server.DataPort = _ZmqDataPort  # type: ignore[misc]
    grpc_data.GrpcDataPort.send = _grpc_told  # type: ignore[method-assign]
    main.main(argv)
