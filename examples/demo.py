"""The loadax demo: a local, shuffled, multi-threaded pipeline over synthetic images.

It reports time to first batch and throughput, then checkpoints an iterator and resumes a fresh one.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, TypedDict

import numpy as np
import numpy.typing as npt

import loadax

IMAGE_SIDE = 64
CROP_SIDE = 56
NUM_CLASSES = 10
AUGMENT_SEED = 7
SHUFFLE_SEED = 0
PREFETCH = 4
CHECKPOINT_AFTER = 3  # batches taken before the checkpoint


class RawRecord(TypedDict):
    image: npt.NDArray[np.uint8]
    label: int


class Example(TypedDict):
    image: npt.NDArray[np.float32]
    label: int


class Batch(TypedDict):
    image: npt.NDArray[np.float32]
    label: npt.NDArray[np.int64]


def make_record(index: int) -> RawRecord:
    """Record `index` of the synthetic dataset: the same bytes every time it is read."""
    rng = np.random.default_rng(index)
    image = rng.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
    return {"image": image, "label": int(rng.integers(NUM_CLASSES))}


def augment(record: RawRecord, rng: np.random.Generator) -> RawRecord:
    """A random crop and a random horizontal flip; `rng` is keyed by (seed, epoch, record)."""
    top, left = rng.integers(0, IMAGE_SIDE - CROP_SIDE + 1, size=2)
    image = record["image"][top : top + CROP_SIDE, left : left + CROP_SIDE]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return {"image": image, "label": record["label"]}


def normalise(record: RawRecord) -> Example:
    image = record["image"].astype(np.float32) / np.float32(255) - np.float32(0.5)
    return {"image": image, "label": record["label"]}


def build_loader(records: int, batch_size: int, workers: int, epochs: int) -> loadax.Loader[Batch]:
    dataset = (
        loadax.RangeDataset(0, records)
        .map(make_record)
        .random_map(augment, seed=AUGMENT_SEED)
        .map(normalise)
    )
    builder = (
        loadax.DataLoader(loadax.Batcher())
        .batch_size(batch_size)
        .shuffle(seed=SHUFFLE_SEED)
        .num_epochs(epochs)
        .workers(workers)
    )
    if workers:  # without workers there is nothing to prefetch with
        builder = builder.prefetch(PREFETCH)
    return builder.build(dataset)


def describe_batch(batch: Batch) -> str:
    image, label = batch["image"], batch["label"]
    return f"image={image.shape} {image.dtype}, label={label.shape} {label.dtype}"


def batches_equal(first: Batch, second: Batch) -> bool:
    return first.keys() == second.keys() and all(
        np.array_equal(first[name], second[name]) for name in ("image", "label")
    )


def timed_run(loader: loadax.Loader[Batch]) -> list[str]:
    """Iterate the whole loader; throughput counts from creating the iterator to the last batch."""
    start = time.perf_counter()
    first_batch_s = 0.0
    batches = records = first_size = last_size = 0
    first_shapes = ""
    with iter(loader) as iterator:
        for batch in iterator:
            last_size = len(batch["label"])
            if not batches:
                first_batch_s = time.perf_counter() - start
                first_shapes, first_size = describe_batch(batch), last_size
            batches += 1
            records += last_size
    elapsed = time.perf_counter() - start
    short = " (short: a batch never spans two epochs)" if last_size < first_size else ""
    return [
        f"time to first batch: {first_batch_s * 1e3:.1f} ms",
        f"throughput: {records / elapsed:,.0f} records/s, {batches / elapsed:,.1f} batches/s "
        f"({records} records in {batches} batches, {elapsed:.2f} s)",
        f"batch shapes: {first_shapes}",
        f"last batch: {last_size} records{short}",
    ]


def resume_check(loader: loadax.Loader[Batch], after: int) -> tuple[bool, list[str]]:
    """Checkpoint after `after` batches, restore a fresh iterator, and compare all that follows."""
    with iter(loader) as original:
        for _ in range(after):
            next(original)
        checkpoint = json.dumps(original.get_state())  # what a training job would save
        expected = list(original)
    with iter(loader) as resumed:
        resumed.set_state(json.loads(checkpoint))
        actual = list(resumed)
    identical = len(expected) == len(actual) and all(
        batches_equal(want, got) for want, got in zip(expected, actual, strict=False)
    )
    verdict = "identical" if identical else "MISMATCH"
    return identical, [
        f"state after {after} batches: {checkpoint}",
        f"resume check: {verdict} (a fresh iterator restored at step {after} yielded "
        f"{len(actual)} batches; the original yielded {len(expected)})",
    ]


def report(lines: list[str]) -> None:
    print("\n".join(lines))


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=positive_int, default=2048)
    parser.add_argument("--batch-size", type=positive_int, default=64)
    parser.add_argument("--workers", type=non_negative_int, default=2)
    parser.add_argument("--epochs", type=positive_int, default=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loader = build_loader(args.records, args.batch_size, args.workers, args.epochs)
    config: dict[str, Any] = {
        "records": args.records,
        "record": f"uint8 {(IMAGE_SIDE, IMAGE_SIDE, 3)} -> random {CROP_SIDE}x{CROP_SIDE} crop "
        "+ flip -> float32",
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "shuffle_seed": SHUFFLE_SEED,
        "workers": args.workers,
        "prefetch": PREFETCH if args.workers else 0,
        "batches": len(loader),
    }
    lines = ["loadax demo (local pipeline)", f"config: {json.dumps(config)}"]
    lines += timed_run(loader)
    identical, check_lines = resume_check(loader, min(CHECKPOINT_AFTER, len(loader) - 1))
    report(lines + check_lines)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
