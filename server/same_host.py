"""The worker's end of batches through shared memory (`loadax.wire.shared_memory`), below both
servers: a handshake from a client on this host that can be written to is told so, and a batch
request that names a memory file of its client gets its batch stacked there (`file`) and its
payload written there (`place`), not sent."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator

from loadax.wire.limits import MAX_BATCH_BYTES
from loadax.wire.payloads import EncodedBatch, answer_checksum
from loadax.wire.shared_memory import ClientFile, Mappings, SharedMemoryError, can_open, host_id
from loadax.wire.v1 import worker_pb2 as wire

log = logging.getLogger(__name__)


class SameHost:
    """Writes payloads into the memory files of clients on this host, if `enabled`, keeping
    their mappings for the next batches (`Mappings`)."""

    def __init__(self, enabled: bool) -> None:
        self._enabled = enabled
        self._host = host_id()
        self._mappings = Mappings()

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

    @contextlib.contextmanager
    def file(
        self, request: wire.BatchRequest, max_bytes: int | None = None
    ) -> Iterator[ClientFile | None]:
        """The memory file `request` names, open while the block runs, to stack its batch into
        and `place` its payload in (of at most `max_bytes`, None: `MAX_BATCH_BYTES`); None if
        it names none or it cannot be opened (its client gone, or this worker not allowed to):
        then the batch is sent."""
        if not (self._enabled and request.HasField("shared_memory")):
            yield None
            return
        try:
            file = ClientFile(
                request.shared_memory,
                max_bytes or MAX_BATCH_BYTES,
                self._mappings,
                answer_checksum(request),
            )
        except SharedMemoryError as error:
            log.debug("sending the batch of step %d instead: %s", request.step, error)
            yield None
            return
        try:
            yield file
        finally:
            file.close()

    def place(
        self, request: wire.BatchRequest, batch: EncodedBatch, file: ClientFile | None
    ) -> EncodedBatch:
        """`batch`, written into `file` (the memory file `request` names, see `file`) if there
        is one (then its reply carries no payload), else as it is. Its checksum, if it has none
        of the kind that answers `request` yet, is computed as it is written. A file that cannot
        be written leaves the batch to be sent as usual."""
        if file is None:
            return batch
        kind = answer_checksum(request)
        fresh = batch.checksum is None or batch.checksum_kind != kind
        try:
            size, computed = file.write(batch.frames, kind if fresh else None)
        except SharedMemoryError as error:
            log.debug("sending the batch of step %d instead: %s", request.step, error)
            return batch
        checksum = batch.checksum if computed is None else computed
        return dataclasses.replace(
            batch, frames=(), shared_size=size, checksum=checksum, checksum_kind=kind
        )
