"""Reply checksums of every kind: the same value however the payload is cut (and for XXH3 in
chunks, in whatever order and by whichever thread its chunks are hashed), negotiated per request
(a worker answers the kind asked for if it has it, the weighted sums otherwise, and says which),
and checked by the client whether the transport computed it as the bytes came or not."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import xxhash

from loadax import Plan
from loadax.client.replies import ReplyDecoder
from loadax.errors import WorkerError
from loadax.plan.work import StepWork
from loadax.wire import checksum
from loadax.wire.codec import encode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import batch_request
from loadax.wire.v1 import worker_pb2 as wire

KINDS = (wire.CHECKSUM_WEIGHTED_SUM, wire.CHECKSUM_XXH3_64, wire.CHECKSUM_XXH3_CHUNKS)


def frames() -> list[bytes | memoryview]:
    rng = np.random.default_rng(0)
    return encode_frames({"x": rng.random((4, 3000), dtype=np.float32), "label": np.arange(4)})


def request(kind: int) -> wire.BatchRequest:
    made = batch_request("p", "f" * 64, Plan(40, 4), StepWork(0))
    made.checksum = kind  # type: ignore[assignment]
    return made


@pytest.mark.parametrize("kind", KINDS)
def test_a_checksum_depends_on_the_bytes_not_on_their_pieces(kind: int) -> None:
    joined = b"".join(frames())
    whole = checksum.payload_checksum([joined], kind)
    for piece in (1, 7, 8192, checksum.CHUNK_BYTES + 1, 1 << 20):
        cut = [joined[start : start + piece] for start in range(0, len(joined), piece)]
        assert checksum.payload_checksum(cut, kind) == whole
    changed = bytearray(joined)
    changed[len(changed) // 2] ^= 1
    assert checksum.payload_checksum([changed], kind) != whole


def test_a_client_asks_for_the_fastest_checksum_it_has() -> None:
    asked = batch_request("p", "f", Plan(40, 4), StepWork(0)).checksum
    assert asked == checksum.PREFERRED == wire.CHECKSUM_XXH3_CHUNKS  # the dev install has xxhash


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_answers_the_kind_asked_and_the_client_checks_it(kind: int) -> None:
    asked = request(kind)
    batch = EncodedBatch.answering(asked, asked.fingerprint, frames())
    assert batch.header.checksum_kind == kind
    decoder = ReplyDecoder("w")
    decoded = decoder.decode(asked, batch.header, batch.frames)
    assert decoded["label"].tolist() == [0, 1, 2, 3]
    # The transport's own computation is what the decoder compares.
    assert decoder.decode(asked, batch.header, batch.frames, batch.checksum)["x"].shape == (4, 3000)
    with pytest.raises(WorkerError, match="its payload's checksum is 0000000000000000"):
        decoder.decode(asked, batch.header, batch.frames, 0)


def test_a_kind_the_worker_lacks_is_answered_with_the_weighted_sums() -> None:
    asked = request(99)  # a kind from a newer client
    batch = EncodedBatch.answering(asked, asked.fingerprint, frames())
    assert batch.header.checksum_kind == wire.CHECKSUM_WEIGHTED_SUM
    assert ReplyDecoder("w").decode(asked, batch.header, batch.frames)["label"].shape == (4,)


def test_a_kind_the_client_cannot_compute_is_refused() -> None:
    asked = request(wire.CHECKSUM_WEIGHTED_SUM)
    header = EncodedBatch.answering(asked, asked.fingerprint, frames()).header
    header.checksum_kind = 99  # type: ignore[assignment]
    with pytest.raises(WorkerError, match="its checksum is a 99, which this client cannot compute"):
        ReplyDecoder("w").decode(asked, header, frames())
    with pytest.raises(ValueError, match="cannot compute the checksum 99"):
        checksum.new_hasher(99)


def test_a_batch_built_for_one_kind_answers_a_request_for_another_with_its_own() -> None:
    # A worker's shared replies: built for a client with xxhash, served to one without.
    built = EncodedBatch.answering(request(wire.CHECKSUM_XXH3_64), "f" * 64, frames())
    older = request(wire.CHECKSUM_WEIGHTED_SUM)
    answered = built.checksummed_for(older)
    assert answered.header.checksum_kind == wire.CHECKSUM_WEIGHTED_SUM
    assert ReplyDecoder("w").decode(older, answered.header, answered.frames)["label"].shape == (4,)
    assert built.checksummed_for(request(wire.CHECKSUM_XXH3_64)) is built


def test_xxh3_in_chunks_is_xxh3_of_each_chunks_xxh3_and_catches_swapped_chunks() -> None:
    size = checksum.CHUNK_BYTES
    payload = np.random.default_rng(1).bytes(2 * size + 100)
    chunks = [payload[start : start + size] for start in range(0, len(payload), size)]
    digests = np.array([xxhash.xxh3_64_intdigest(chunk) for chunk in chunks], "<u8")
    kind = wire.CHECKSUM_XXH3_CHUNKS
    whole = checksum.payload_checksum([payload], kind)
    assert whole == xxhash.xxh3_64_intdigest(digests.tobytes())
    assert checksum.payload_checksum([chunks[1] + chunks[0] + chunks[2]], kind) != whole
    assert checksum.payload_checksum([payload + b"\0"], kind) != whole  # the length counts
    assert checksum.payload_checksum([b""], kind) == xxhash.xxh3_64_intdigest(b"")


def test_chunk_digests_written_in_any_order_and_parts_give_the_same_checksum() -> None:
    payload = np.frombuffer(np.random.default_rng(2).bytes(3 * checksum.CHUNK_BYTES + 5), np.uint8)
    expected = checksum.payload_checksum([payload.data], wire.CHECKSUM_XXH3_CHUNKS)
    cuts = [0, 1, 1000, checksum.CHUNK_BYTES, checksum.CHUNK_BYTES * 2 + 7, payload.size]
    parts = list(itertools.pairwise(cuts))
    for order in (parts, parts[::-1], parts[2:] + parts[:2]):
        data = np.zeros_like(payload)
        digests = checksum.ChunkDigests(data, payload.size)
        for start, stop in order:
            data[start:stop] = payload[start:stop]
            digests.written(start, stop)
        assert digests.value() == expected
    # Bytes never declared written are hashed at the end, as they are then.
    digests = checksum.ChunkDigests(payload.copy(), payload.size)
    digests.written(0, checksum.CHUNK_BYTES)
    assert digests.value() == expected
    with pytest.raises(ValueError, match="bytes 5 to 3 are not within a payload of"):
        digests.written(5, 3)


def test_a_worker_without_the_chunked_kind_answers_a_client_that_asks_for_it() -> None:
    # A worker that lacks XXH3 in chunks (here: no xxhash) answers the weighted sums, checked.
    asked = request(wire.CHECKSUM_XXH3_CHUNKS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(checksum, "XXH3_AVAILABLE", False)
        assert not checksum.available(wire.CHECKSUM_XXH3_CHUNKS)
        batch = EncodedBatch.answering(asked, asked.fingerprint, frames())
    assert batch.header.checksum_kind == wire.CHECKSUM_WEIGHTED_SUM
    assert ReplyDecoder("w").decode(asked, batch.header, batch.frames)["label"].shape == (4,)
