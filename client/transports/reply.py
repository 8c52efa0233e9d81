"""What a transport hands over for a batch request: the reply's header and payload frames,
unverified; and the DATA_LOSS error that refuses a reply, in the one wording every layer uses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from loadax.errors import WorkerError
from loadax.wire.failures import BAD_REPLY
from loadax.wire.v1 import worker_pb2 as wire

Buffer = bytes | memoryview


class Reply(NamedTuple):
    """The header and the payload frames of a batch reply, as received (no copy): checked and
    decoded above the transport, by `loadax.client.replies.ReplyDecoder.verify`. `checksum` is
    the payload's checksum of the kind the header names, when the transport computed it as the
    bytes came (None: the decoder computes it)."""

    header: wire.BatchResponse
    payload: Sequence[Buffer]
    checksum: int | None = None


def bad_reply(worker: str, request: wire.BatchRequest, difference: str) -> WorkerError:
    """The DATA_LOSS error that refuses `worker`'s reply to `request` for `difference`: a reply
    that fails its checks, or a transport's framing that does not hold.

    >>> from loadax.wire.v1 import worker_pb2 as wire
    >>> error = bad_reply("grpc://a:1", wire.BatchRequest(step=3), "it is cut short")
    >>> error.code, error.message
    ('DATA_LOSS', 'grpc://a:1 sent a bad reply to step 3: it is cut short')
    """
    return WorkerError(BAD_REPLY, f"{worker} sent a bad reply to {_asked(request)}: {difference}")


def _asked(request: wire.BatchRequest) -> str:
    if request.HasField("window"):
        window = request.window
        return f"window {window.index} of data shard {window.shard} of {window.shards}"
    return f"step {request.step}"
