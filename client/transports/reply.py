"""What a transport hands over for a batch request: the reply's header and payload frames,
unverified (and what a member in this process says beside them); and the DATA_LOSS error that
refuses a reply, in the one wording every layer uses."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

from loadax.errors import WorkerError
from loadax.wire.failures import BAD_REPLY
from loadax.wire.v1 import worker_pb2 as wire

Buffer = bytes | memoryview


class Reply(NamedTuple):
    """The header and the payload frames of a batch reply, as received (no copy): checked and
    decoded above the transport, by `loadax.client.replies.ReplyDecoder.verify`. `checksum` is
    the payload's checksum of the kind the header names, when the transport computed it as the
    bytes came (None: the decoder computes it). `local`: what a member in this process says
    beside them (None for a worker's reply)."""

    header: wire.BatchResponse
    payload: Sequence[Buffer]
    checksum: int | None = None
    local: InProcess | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class InProcess:
    """What a local member (`loadax.client.local_members`) says beside its reply's header: the
    request object it answered (`answers`), which the decoder checks is the one asked, where a
    worker's reply names it by its digest (the member would compute it only for the check to
    compute it again); and, from a member of kind threads, the batch itself (`handed_over`, its
    payload then empty), in the form decoding its encoding would give (`loadax.wire.decoded_form`).

    Transports move bytes; this is the one exception, because such a batch is made and used in
    this process: encoding it only to decode it would give views of the same arrays, at the cost
    of two walks of its tree. The checks that mean something here stand (its identity, the
    request it answers, its schema and rows); a checksum and a size would compare bytes that
    nothing carried."""

    answers: wire.BatchRequest
    handed_over: bool = False
    batch: Any = None


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
