"""The worker's end of batches through shared memory (`loadax.wire.shared_memory`), below both
servers: a handshake from a client on this host that can be written to is told so, and a batch
request that names a memory file of its client gets its payload written there, not sent."""

from __future__ import annotations

import dataclasses
import logging

from loadax.wire.checksum import new_hasher
from loadax.wire.payloads import EncodedBatch, answer_checksum
from loadax.wire.shared_memory import SharedMemoryError, can_open, host_id, write_payload
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)


class SameHost:
    """Writes payloads into the memory files of clients on this host, if `enabled`."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._host = host_id()

    def announce(
        self, request: wire.HandshakeRequest, response: wire.HandshakeResponse
    ) -> wire.HandshakeResponse:
        """`response` to `request`, saying whether this worker writes into its client's memory
        files: enabled, on the client's host, and able to open the file it sent to try."""
        response.shared_memory = (
            self._enabled
            and bool(self._host)
            and request.host == self._host
            and request.HasField("probe")
            and can_open(request.probe)
        )
        return response

    def writes(self, request: wire.BatchRequest) -> bool:
        """Whether the payload answering `request` is to be written into its client's memory
        file (which `place` tries)."""
        return self._enabled and request.HasField("shared_memory")

    def place(self, request: wire.BatchRequest, batch: EncodedBatch) -> EncodedBatch:
        """`batch`, written into the memory file `request` names if it names one (then its
        reply carries no payload), else as it is. Its checksum, if it has none of the kind that
        answers `request` yet, is computed as it is written. A file that cannot be written (its
        client gone, or this worker not allowed to) leaves the batch to be sent as usual."""
        if not self.writes(request):
            return batch
        kind = answer_checksum(request)
        fresh = batch.checksum is None or batch.checksum_kind != kind
        hasher = new_hasher(kind) if fresh else None
        try:
            size = write_payload(request.shared_memory, batch.frames, hasher)
        except SharedMemoryError as error:
            log.debug("sending the batch of step %d instead: %s", request.step, error)
            return batch
        checksum = batch.checksum if hasher is None else hasher.value()
        return dataclasses.replace(
            batch, frames=(), shared_size=size, checksum=checksum, checksum_kind=kind
        )
