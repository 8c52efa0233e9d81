"""The same batches in every mode: locally, from an in-process worker and from a gRPC worker."""

from __future__ import annotations

import hashlib
import importlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from workers import worker_process

from loadax import Batcher, DataLoader, Loader
from loadax.client import RemoteDataLoader
from loadax.server.worker import Worker
from loadax.wire.codec import decode_frames, encode_frames

BATCH, SEED, EPOCHS = 8, 5, 2


def digests(batches: Iterable[Any]) -> list[str]:
    """One hash per batch over every leaf's dtype, shape and bytes."""
    result = []
    for batch in batches:
        digest = hashlib.sha256()
        for leaf in jax.tree.leaves(batch):
            array = np.asarray(leaf)
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        result.append(digest.hexdigest())
    return result


def forms(batches: Iterable[Any]) -> list[str]:
    """One text per batch naming every node's type, each dict's keys in order, and each array's
    dtype, shape, contiguity and bytes (a digest): stricter than `digests`, which reads the
    leaves alone, so that a tree's structure and its Python leaves count too."""
    return [_form(batch) for batch in batches]


def through_codec(batches: Iterable[Any]) -> list[Any]:
    """Each of `batches` as encoding and decoding it gives it back: a worker's reply's form."""
    return [decode_frames(encode_frames(batch)) for batch in batches]


def _form(node: Any) -> str:
    kind = type(node).__name__
    if isinstance(node, np.ndarray):
        digest = hashlib.sha256(node.tobytes()).hexdigest()[:16]
        contiguous = "C" if node.flags.c_contiguous else "strided"
        return f"{kind}({node.dtype!r} {node.dtype.str} {node.shape} {contiguous} {digest})"
    if isinstance(node, dict):
        return f"{kind}{{{', '.join(f'{key!r}: {_form(value)}' for key, value in node.items())}}}"
    if isinstance(node, list | tuple):
        return f"{kind}({', '.join(_form(item) for item in node)})"
    return f"{kind}({node!r})"


def loader(dataset: Any) -> Loader[Any]:
    """The local loader every source is checked with: shuffled, 2 epochs, 4 threads."""
    return (
        DataLoader(Batcher())
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .num_epochs(EPOCHS)
        .workers(4)
        .build(dataset)
    )


def remote(targets: list[Any], pipeline: str) -> RemoteDataLoader:
    return (
        RemoteDataLoader(targets, pipeline=pipeline)
        .batch_size(BATCH)
        .shuffle(seed=SEED)
        .num_epochs(EPOCHS)
        .prefetch(4)
    )


def digests_in_every_mode(tmp_path: Path, module: str, factory: str) -> list[str]:
    """The batch digests of the pipeline `module:factory(directory)`, after checking that an
    in-process worker and a real gRPC worker give exactly the local ones."""
    data = tmp_path / "data"
    data.mkdir()
    build = getattr(importlib.import_module(module), factory)
    reference = digests(loader(build(str(data)).dataset))

    worker = Worker({factory: build(str(data))}, threads=2)
    try:
        with remote([worker], factory).build() as built:
            assert digests(built) == reference
    finally:
        worker.close()

    config = (
        f"[pipelines.{factory}]\n"
        f'factory = "{module}:{factory}"\n'
        f"args = {{ directory = {json.dumps(str(data))} }}\n"
    )
    with (
        worker_process(tmp_path, config) as process,
        remote([process.grpc], factory).build() as built,
    ):
        assert digests(built) == reference
    return reference
