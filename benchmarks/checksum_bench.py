"""What verifying a reply costs: payload checksums over a W2 batch (64 float32 224x224x3 images
and their labels, 38.5 MB), and the client's whole check of a reply (`ReplyDecoder.decode`:
identity, request digest, checksum, decode, schema). A client checksums a reply's frames as each
lands in its buffer (`client/transports/zmq_receive.py`): "as received" copies the batch into a
reused buffer in 1 MiB pieces, as the receive does, with and without XXH3 of each piece as it
lands; the difference is what the checksum adds there. A same-host worker stacks a batch into
its client's memory file row by row and hashes XXH3's chunks as the rows complete them
("stacked, each chunk hashed as it is complete"), against one pass over the stacked batch.

Usage: `python benchmarks/checksum_bench.py [--repeats N] [--batch-ms MS] [--json PATH]`.
Each candidate runs over several distinct batches in turn, so that no batch is still in the
CPU's cache from the run before (as a received batch is not); `--batch-ms` (an R1 batch's time)
adds each one's share of it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from workloads import CROP_SIDE, SEED

from loadax.client.replies import ReplyDecoder
from loadax.plan.planner import Plan
from loadax.plan.work import StepWork
from loadax.wire.checksum import ChunkDigests, new_hasher, payload_checksum
from loadax.wire.codec import encode_frames
from loadax.wire.payloads import EncodedBatch
from loadax.wire.plans import batch_request
from loadax.wire.schema import batch_schema
from loadax.wire.v1 import worker_pb2 as wire

BATCH = 64
PIECE = 1 << 20  # a ZeroMQ payload frame (PAYLOAD_FRAME_BYTES)
DISTINCT_BATCHES = 4  # 154 MB in turn: more than any CPU cache
Frames = Sequence[bytes | memoryview]


def w2_frames(seed: int) -> list[bytes | memoryview]:
    rng = np.random.default_rng(SEED + seed)
    return encode_frames(
        {
            "image": rng.random((BATCH, CROP_SIDE, CROP_SIDE, 3), dtype=np.float32),
            "label": np.arange(BATCH, dtype=np.int64),
        }
    )


def _crc32(frames: Frames) -> int:
    value = 0
    for frame in frames:
        value = zlib.crc32(frame, value)
    return value


def _adler32(frames: Frames) -> int:
    value = 1
    for frame in frames:
        value = zlib.adler32(frame, value)
    return value


def _block_sums(frames: Frames) -> int:
    """A plain sum of uint64 words (no weights): the floor of what any numpy checksum costs."""
    total = 0
    for frame in frames:
        view = memoryview(frame).cast("B")
        words = len(view) // 8
        total += int(np.add.reduce(np.frombuffer(view, dtype="<u8", count=words)))
    return total


def _as_received(hashed: bool) -> Callable[[Frames], Any]:
    """Copy `frames` into a reused buffer in pieces (what receiving does), checksumming each
    piece (XXH3) right after it is copied if `hashed`."""
    buffer = np.empty(0, np.uint8)

    def receive(frames: Frames) -> int | None:
        nonlocal buffer
        size = sum(len(frame) for frame in frames)
        if len(buffer) < size:
            buffer = np.empty(size, np.uint8)
        hasher = new_hasher(wire.CHECKSUM_XXH3_64) if hashed else None
        offset = 0
        for frame in frames:
            view = memoryview(frame).cast("B")
            for start in range(0, len(view), PIECE):
                piece = view[start : start + PIECE]
                landed = buffer[offset : offset + len(piece)]
                landed[:] = np.frombuffer(piece, np.uint8)
                if hasher is not None:
                    hasher.update(landed.data)
                offset += len(piece)
        return None if hasher is None else hasher.value()

    return receive


def _stacked(hashed: bool, as_written: bool = False) -> Callable[[Frames], Any]:
    """Copy `frames` into a reused buffer one image row at a time (what a same-host worker's
    stacking does), then if `hashed` XXH3 in chunks over it, or (`as_written`) each chunk as
    soon as the rows copied complete it (`ChunkDigests`, what the loading threads do)."""
    buffer = np.empty(0, np.uint8)
    row = CROP_SIDE * CROP_SIDE * 3 * 4

    def stack(frames: Frames) -> int | None:
        nonlocal buffer
        size = sum(len(frame) for frame in frames)
        if len(buffer) < size:
            buffer = np.empty(size, np.uint8)
        chunks = ChunkDigests(buffer, size) if as_written else None
        offset = 0
        for frame in frames:
            view = np.frombuffer(memoryview(frame).cast("B"), np.uint8)
            for start in range(0, len(view), row):
                piece = view[start : start + row]
                buffer[offset : offset + len(piece)] = piece
                if chunks is not None:
                    chunks.written(offset, offset + len(piece))
                offset += len(piece)
        if chunks is not None:
            return chunks.value()
        if not hashed:
            return None
        return payload_checksum([buffer[:size].data], wire.CHECKSUM_XXH3_CHUNKS)

    return stack


def _verifier() -> Callable[[Frames], Any]:
    """The client's whole check of a reply to step 0, as a target runs it."""
    plan = Plan(BATCH * 10, BATCH)
    request = batch_request("w2", "f" * 64, plan, StepWork(0))
    decoder = ReplyDecoder("bench")
    probe = {"image": np.zeros((1, CROP_SIDE, CROP_SIDE, 3), np.float32), "label": np.arange(1)}
    schema = batch_schema([(probe, 1)])
    assert schema is not None
    decoder.learn(
        wire.HandshakeResponse(pipeline="w2", fingerprint=request.fingerprint, schema=schema)
    )
    headers: dict[int, wire.BatchResponse] = {}

    def verify(frames: Frames) -> Any:
        header = headers.get(id(frames))
        if header is None:
            header = EncodedBatch.answering(request, request.fingerprint, frames).header
            headers[id(frames)] = header
        return decoder.decode(request, header, frames)

    return verify


CANDIDATES: dict[str, Callable[[], Callable[[Frames], Any]]] = {
    "loadax payload_checksum XXH3 (xxhash)": lambda: (
        lambda frames: payload_checksum(frames, wire.CHECKSUM_XXH3_64)
    ),
    "loadax payload_checksum XXH3 in chunks": lambda: (
        lambda frames: payload_checksum(frames, wire.CHECKSUM_XXH3_CHUNKS)
    ),
    "loadax payload_checksum (weighted uint64 sums)": lambda: payload_checksum,
    "stacked row by row": lambda: _stacked(hashed=False),
    "stacked, then XXH3 in chunks over the batch": lambda: _stacked(hashed=True),
    "stacked, each chunk hashed as it is complete": lambda: _stacked(True, as_written=True),
    "as received: copy in 1 MiB pieces": lambda: _as_received(hashed=False),
    "as received: copy + XXH3 of each piece": lambda: _as_received(hashed=True),
    "zlib.crc32": lambda: _crc32,
    "zlib.adler32": lambda: _adler32,
    "numpy sum of uint64 words (no weights)": lambda: _block_sums,
    "client verification (ReplyDecoder.decode)": _verifier,
}


def measure(
    fn: Callable[[Frames], Any], batches: list[list[bytes | memoryview]], repeats: int
) -> list[float]:
    fn(batches[0])  # warm up (and, for the verifier, make each batch's header once)
    for frames in batches[1:]:
        fn(frames)
    seconds = []
    for run in range(repeats):
        frames = batches[run % len(batches)]
        start = time.perf_counter()
        fn(frames)
        seconds.append(time.perf_counter() - start)
    return seconds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=24, help="timed runs per candidate")
    parser.add_argument("--batch-ms", type=float, help="an R1 batch's time, for each one's share")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    batches = [w2_frames(seed) for seed in range(DISTINCT_BATCHES)]
    size = sum(len(frame) for frame in batches[0])
    results = []
    print(f"W2 batch: {size / 1e6:.1f} MB in {len(batches[0])} frames; median of {args.repeats}")
    for name, make in CANDIDATES.items():
        seconds = statistics.median(measure(make(), batches, args.repeats))
        result = {"name": name, "us_per_batch": seconds * 1e6, "gb_per_s": size / seconds / 1e9}
        line = f"{name:48} {seconds * 1e6:9.0f} us/batch {size / seconds / 1e9:7.2f} GB/s"
        if args.batch_ms:
            result["share_of_batch"] = seconds * 1e3 / args.batch_ms
            line += f" {100 * seconds * 1e3 / args.batch_ms:5.1f}% of a {args.batch_ms:g} ms batch"
        print(line)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps({"batch_bytes": size, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
