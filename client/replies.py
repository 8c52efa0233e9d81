"""The one decoder of batch replies, whichever target received them.

A batch that does not decode is the worker's fault, not the caller's: it becomes a DATA_LOSS
`WorkerError` naming the worker, which the dispatcher treats like any failed request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loadax.errors import WorkerError
from loadax.wire.codec import CodecError, decode_frames


def decode_batch(payload: Sequence[bytes | memoryview], step: int, worker: str) -> Any:
    """The batch of `step` that `worker` sent as `payload` (the frames of its encoding); its
    arrays are read-only views of the frames, which they keep alive."""
    try:
        return decode_frames(payload)
    except CodecError as error:
        raise WorkerError(
            "DATA_LOSS", f"undecodable batch of step {step} from {worker}: {error}"
        ) from error
