"""W4's peers: webdataset's own pipeline in the calling process, and torch's DataLoader with 2
worker processes over it (webdataset splits the shards between the workers), reading the tar
shards over HTTP from the S3 server (webdataset streams each shard with curl). Each shuffles as
webdataset does: the shard order, then a buffer of 1,000 samples. Run by `w4_tar.py` as
`python peer_webdataset.py SYSTEM URL...`, in the peers' environment (torch) or loadax's
(webdataset alone); prints one JSON line: images, seconds, first_s.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from workloads import augment, record_rng, stack_records

BATCH = 64
SHUFFLE_BUFFER = 1000


def example(sample: dict[str, Any]) -> dict[str, Any]:
    """W2's work on a decoded sample, its random crop keyed by the sample's number (its key)."""
    rng = record_rng(int(sample["__key__"]))
    return {"image": augment(sample["jpg"], rng), "label": np.int64(sample["cls"])}


def pipeline(urls: list[str]) -> Any:
    wds: Any = importlib.import_module("webdataset")
    return (
        wds.WebDataset(urls, shardshuffle=len(urls), seed=0)
        .shuffle(SHUFFLE_BUFFER, seed=0)
        .decode("rgb8")
        .map(example)
        .batched(BATCH, collation_fn=stack_records, partial=True)
    )


def passed(batch: Any) -> Any:
    """torch's conversion of a batch: none (numpy batches, as a JAX user keeps them)."""
    return batch


def batches(system: str, urls: list[str]) -> Iterable[Any]:
    if system == "webdataset":
        result: Iterable[Any] = pipeline(urls)
        return result
    # By name: torch lives in the peers' environment only, not where mypy checks this file.
    data: Any = importlib.import_module("torch.utils.data")
    loader: Iterable[Any] = data.DataLoader(
        pipeline(urls), batch_size=None, num_workers=2, collate_fn=passed
    )
    return loader


def main() -> None:
    system, urls = sys.argv[1], sys.argv[2:]
    images, first = 0, None
    started = time.perf_counter()
    for batch in batches(system, urls):
        images += len(batch["label"])
        first = time.perf_counter() - started if first is None else first
    seconds = time.perf_counter() - started
    print(json.dumps({"images": images, "seconds": seconds, "first_s": first}))


if __name__ == "__main__":
    main()
