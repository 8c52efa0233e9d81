"""A pipeline's identity (its fingerprint) covers its code and its data, and nothing else: not
its name or config, where its objects live in memory, the hash seed, the process or the host. A
local loader and a worker compute the same one for the same pipeline."""

from __future__ import annotations

import contextlib
import doctest
import functools
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import identity_pipelines
import numpy as np
import pipelines
import pytest
from equivalence import digests
from workers import TESTS, WorkerProcess, pinned, worker_env, worker_process

import loadax
import loadax.identity.fingerprint
from loadax import Batcher, DataLoader, InMemoryDataset, NumpyDataset, Pipeline, Plan, RangeDataset
from loadax.client import RemoteDataLoader
from loadax.dataset.stream import Stream
from loadax.errors import WorkerError
from loadax.identity.code_walk import Walker
from loadax.identity.fingerprint import pipeline_fingerprint, probe_digest
from loadax.server.worker import Worker
from loadax.wire.plans import plan_to_wire
from loadax.wire.v1 import worker_pb2 as wire
from loadax.wire.v1 import worker_pb2_grpc

TIMEOUT = 30.0
RECORDS = 100  # records 0-3 make the probe; the functions below differ only from record 50 on

CROPS = '''"""Random images, cropped to CROP pixels: the code two workers disagree on."""

from typing import Any

import numpy as np

import loadax

CROP = {crop}


def crops(records: int = 16) -> loadax.Pipeline[Any, Any]:
    def image(index: int) -> dict[str, Any]:
        rng = np.random.default_rng(index)
        return {{"image": rng.integers(0, 256, size=(40, 40, 3), dtype=np.uint8)}}

    def crop(record: dict[str, Any]) -> dict[str, Any]:
        return {{"image": record["image"][:CROP, :CROP]}}

    return loadax.Pipeline(loadax.RangeDataset(0, records).map(image).map(crop), loadax.Batcher())
'''
SERVED = """
[pipelines.crops]
factory = "crops:crops"
[pipelines.partials]
factory = "identity_pipelines:partials"
[pipelines.stream]
factory = "identity_pipelines:stream_of_partials"
args = { window = 8 }
"""


def identity(pipeline: Pipeline[Any, Any]) -> str:
    return pipeline_fingerprint(pipeline)


def mapped(fn: Callable[[int], Any], records: int = RECORDS) -> Pipeline[Any, Any]:
    return Pipeline(RangeDataset(0, records).map(fn), Batcher())


def crops_module(directory: Path, crop: int) -> Path:
    """A directory holding module `crops`, whose crop is `crop` pixels."""
    directory.mkdir()
    (directory / "crops.py").write_text(CROPS.format(crop=crop))
    return directory


@contextlib.contextmanager
def crops_worker(
    home: Path, modules: Path, monkeypatch: pytest.MonkeyPatch, hash_seed: int
) -> Iterator[WorkerProcess]:
    """A real worker serving SERVED, importing `crops` from `modules`, with its own hash seed."""
    home.mkdir(exist_ok=True)
    with monkeypatch.context() as env:
        # worker_env() copies os.environ as the process starts (and puts tests/ first).
        env.setenv("PYTHONPATH", str(modules))
        env.setenv("PYTHONHASHSEED", str(hash_seed))
        with worker_process(home, SERVED) as worker:
            yield worker


def served(worker: WorkerProcess) -> dict[str, str]:
    """The fingerprint of each pipeline, as the worker's Info says."""
    with grpc.insecure_channel(worker.grpc_address) as channel:
        info = worker_pb2_grpc.WorkerStub(channel).Info(wire.InfoRequest(), timeout=TIMEOUT)
    return {pipeline.name: pipeline.fingerprint for pipeline in info.pipelines}


def test_workers_whose_factory_code_differs_serve_different_identities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wide, narrow = crops_module(tmp_path / "wide", 32), crops_module(tmp_path / "narrow", 24)
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(crops_worker(tmp_path / "a", wide, monkeypatch, 0))
        second = stack.enter_context(crops_worker(tmp_path / "b", narrow, monkeypatch, 0))
        one, other = served(first), served(second)
        assert one["crops"] != other["crops"]  # same config, other code
        assert (one["partials"], one["stream"]) == (other["partials"], other["stream"])
        # A client given both binds to the one it pins and never takes the other's batches.
        builder = RemoteDataLoader([first.grpc, second.grpc], pipeline="crops").batch_size(4)
        builder = builder.fingerprint(one["crops"])
        with builder.build() as loader:
            assert loader.targets == [first.grpc]
            assert list(loader.stats().left_out) == [second.grpc]
            shapes = {batch["image"].shape for batch in loader}
    assert shapes == {(4, 32, 32, 3)}


def test_the_same_code_and_config_have_one_identity_in_every_process_and_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two copies of one module in two directories, and each process with its own hash seed.
    copies = crops_module(tmp_path / "one", 32), crops_module(tmp_path / "two", 32)
    with crops_worker(tmp_path / "a", copies[0], monkeypatch, 1) as first:
        before = served(first)
        with crops_worker(tmp_path / "b", copies[1], monkeypatch, 2) as second:
            assert served(second) == before
    with crops_worker(tmp_path / "a", copies[0], monkeypatch, 3) as restarted:
        assert served(restarted) == before
    # `loadax-worker --check` builds the same pipelines, so it reports the same identities.
    config = tmp_path / "a" / "worker.toml"
    checked = subprocess.run(
        [sys.executable, "-m", "loadax.server.main", "--config", str(config), "--check", "--json"],
        capture_output=True,
        text=True,
        env={**worker_env(), "PYTHONPATH": f"{TESTS}{os.pathsep}{copies[1]}"},
        timeout=120,
        check=True,
    )
    report = json.loads(checked.stdout)["pipelines"]
    assert {pipeline["name"]: pipeline["fingerprint"] for pipeline in report} == before
    assert len(set(before.values())) == 3


def clip_below(limit: int) -> Callable[[int], int]:
    return lambda value: value if value < limit else 0


def below(limit: int) -> Callable[[int], bool]:
    return lambda value: value < limit


# Pairs of pipelines that load the same first records (the same probe) but differ in code.
CODE_CHANGES: dict[str, Callable[[int], Pipeline[Any, Any]]] = {
    "bytecode": lambda variant: mapped(
        (lambda value: value if value < 50 else 0)
        if variant
        else (lambda value: value if value <= 50 else 0)
    ),
    "constant": lambda variant: mapped(
        (lambda value: value if value < 50 else 0)
        if variant
        else (lambda value: value if value < 60 else 0)
    ),
    "closure": lambda variant: mapped(clip_below(50 if variant else 60)),
    "partial": lambda variant: mapped(
        functools.partial(identity_pipelines.clip, limit=50 if variant else 60)
    ),
    "callable object": lambda variant: mapped(identity_pipelines.Clip(50 if variant else 60)),
    "builtin": lambda variant: mapped(abs if variant else int),
    "stream filter": lambda variant: Pipeline(
        Stream(RangeDataset(0, RECORDS), window=4).filter(below(50 if variant else 60)),
        Batcher(),
    ),
    "batcher": lambda variant: Pipeline(
        RangeDataset(0, 0),
        Batcher(functools.partial(identity_pipelines.total, offset=1 if variant else 2)),
    ),
}


@pytest.mark.parametrize("change", sorted(CODE_CHANGES))
def test_a_change_of_code_the_probe_cannot_see_changes_the_identity(change: str) -> None:
    make = CODE_CHANGES[change]
    assert probe_digest(make(1)) == probe_digest(make(0))
    assert identity(make(1)) == identity(make(1))
    assert identity(make(1)) != identity(make(0))


def test_a_module_level_constant_a_function_reads_is_part_of_the_identity(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = mapped(identity_pipelines.clipped_at_limit)
    before = identity(pipeline)
    monkeypatch.setattr(identity_pipelines, "LIMIT", 60)
    assert identity(pipeline) != before
    monkeypatch.setattr(identity_pipelines, "LIMIT", 50)
    assert identity(pipeline) == before


def test_the_data_changes_the_identity_through_the_probe(tmp_path: Path) -> None:
    # Too large to walk: only the probe tells these lists apart.
    numbers = list(range(1000))
    changed = [7, *numbers[1:]]
    listed = Pipeline(InMemoryDataset(numbers), Batcher())
    assert identity(Pipeline(InMemoryDataset(list(numbers)), Batcher())) == identity(listed)
    assert identity(Pipeline(InMemoryDataset(changed), Batcher())) != identity(listed)
    # The same code over another file at the same path.
    path = tmp_path / "rows.npy"
    np.save(path, np.arange(4000).reshape(1000, 4))
    before = identity(Pipeline(NumpyDataset(path), Batcher()))
    assert identity(Pipeline(NumpyDataset(path), Batcher())) == before
    np.save(path, np.arange(4000).reshape(1000, 4)[::-1])
    assert identity(Pipeline(NumpyDataset(path), Batcher())) != before


def test_a_pipeline_whose_probe_fails_still_has_a_stable_identity(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = identity(pipelines.failing(records=20, bad=2))
    assert "the probe of its fingerprint failed: RecordError" in caplog.text
    assert identity(pipelines.failing(records=20, bad=2)) == first
    assert identity(pipelines.failing(records=20, bad=3)) != first


def test_a_worker_announces_what_its_pipeline_does_whatever_its_name() -> None:
    # The name and the config are not part of it; what the factory's args build is.
    worker = Worker({"numbers": pipelines.numbers(30), "other": pipelines.numbers(30)}, threads=1)
    try:
        announced = {p.name: p.fingerprint for p in worker.info(wire.InfoRequest()).pipelines}
    finally:
        worker.close()
    assert announced == dict.fromkeys(announced, identity(pipelines.numbers(30)))
    assert identity(pipelines.numbers(31)) != announced["numbers"]


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.peer: Node | None = None


class Holder:
    def __init__(self, nodes: frozenset[Node]) -> None:
        self.nodes = nodes

    def __call__(self, value: int) -> int:
        return value


def cyclic() -> Pipeline[Any, Any]:
    """Objects in a set (ordered by their addresses) that refer to each other in a ring."""
    nodes = [Node(name) for name in "abcd"]
    for node, peer in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        node.peer = peer
    return mapped(Holder(frozenset(nodes)))


def test_cycles_and_sets_of_objects_give_one_identity_whatever_their_addresses() -> None:
    built = [cyclic() for _ in range(20)]  # all alive at once: each at other addresses
    assert len({identity(pipeline) for pipeline in built}) == 1


def test_equal_pipelines_built_twice_have_one_identity() -> None:
    for make in (
        identity_pipelines.partials,
        identity_pipelines.stream_of_partials,
        pipelines.images,
    ):
        assert identity(make()) == identity(make())


IN_A_SUBPROCESS = """
import identity_pipelines
from loadax.identity.fingerprint import pipeline_fingerprint
for name in ("partials", "stream_of_partials"):
    print(pipeline_fingerprint(getattr(identity_pipelines, name)()))
"""


def test_the_identity_holds_no_address_nor_hash_seed() -> None:
    expected = [
        identity(getattr(identity_pipelines, name)()) for name in ("partials", "stream_of_partials")
    ]
    for seed in ("0", "1"):
        result = subprocess.run(
            [sys.executable, "-c", IN_A_SUBPROCESS],
            capture_output=True,
            text=True,
            env={**worker_env(), "PYTHONHASHSEED": seed},
            timeout=120,
            check=True,
        )
        assert result.stdout.split() == expected, result.stderr


def test_the_walk_does_not_read_large_data_element_by_element(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    many = list(range(2_000_000))
    pipeline = Pipeline(InMemoryDataset(many).map(identity_pipelines.Clip(50)), Batcher())
    walked = 0
    digest = Walker.digest

    def counted(walker: Walker, value: Any) -> bytes:
        nonlocal walked
        walked += 1
        return digest(walker, value)

    monkeypatch.setattr(Walker, "digest", counted)
    identity(pipeline)
    assert 0 < walked < 10_000  # the list is hashed by its type and length


def test_a_worker_refuses_a_request_made_for_another_identity() -> None:
    plan = Plan(RECORDS, batch_size=4)
    good = Worker({"p": mapped(identity_pipelines.Clip(50))}, threads=1)
    other = Worker({"p": mapped(identity_pipelines.Clip(60))}, threads=1)
    try:
        handshake = wire.HandshakeRequest(
            library_version=loadax.__version__,
            pipeline="p",
            plan=plan_to_wire(plan),
        )
        expected = good.handshake(handshake).fingerprint
        assert other.handshake(handshake).fingerprint != expected
        request = wire.BatchRequest(
            pipeline="p", fingerprint=expected, plan=plan_to_wire(plan), step=0
        )
        good.load_batch(request)
        with pytest.raises(WorkerError, match="pipeline 'p' has fingerprint") as refused:
            other.load_batch(request)
        assert refused.value.code == "FAILED_PRECONDITION"
    finally:
        good.close()
        other.close()


def test_the_examples_of_the_fingerprint_module_run() -> None:
    failed, attempted = doctest.testmod(loadax.identity.fingerprint)
    assert (failed, attempted > 0) == (0, True)


PARTIALS = """
[pipelines.partials]
factory = "identity_pipelines:partials"
[pipelines.stream]
factory = "identity_pipelines:stream_of_partials"
args = { window = 8 }
"""


@pytest.mark.parametrize("transport", ["grpc", "zmq"])
def test_the_only_worker_restarted_mid_run_serves_partials_and_callable_objects_identically(
    tmp_path: Path, transport: str
) -> None:
    made = {
        "partials": identity_pipelines.partials(),
        "stream": identity_pipelines.stream_of_partials(window=8),
    }
    with pinned(tmp_path, transport) as fleet:
        target = fleet.start(PARTIALS)
        for name, pipeline in made.items():
            local = DataLoader(pipeline.batcher).batch_size(4).shuffle(seed=3).workers(0)
            expected = digests(local.build(pipeline.dataset))
            remote = RemoteDataLoader([target], pipeline=name).batch_size(4).shuffle(seed=3)
            with remote.build() as loader:
                iterator = iter(loader)
                seen = [next(iterator) for _ in range(3)]
                fleet.restart(0, PARTIALS)  # kill -9, then the same code and config again
                seen += list(iterator)
            assert digests(seen) == expected, name


def handshake_fingerprint(worker: Worker, plan: Plan) -> str:
    request = wire.HandshakeRequest(
        library_version=loadax.__version__, pipeline="p", plan=plan_to_wire(plan)
    )
    return worker.handshake(request).fingerprint


@pytest.mark.parametrize(
    "make",
    [
        identity_pipelines.partials,
        functools.partial(identity_pipelines.stream_of_partials, window=8),
    ],
)
def test_a_local_loader_and_a_worker_have_one_fingerprint_and_share_checkpoints(
    make: Callable[[], Pipeline[Any, Any]],
) -> None:
    pipeline = make()
    local = DataLoader(pipeline.batcher).batch_size(4).shuffle(seed=3).build(pipeline.dataset)
    worker = Worker({"p": make()}, threads=2)
    remote_builder = RemoteDataLoader([worker], pipeline="p").batch_size(4).shuffle(seed=3)
    try:
        with remote_builder.build() as remote:
            fingerprint = local.fingerprint()
            assert handshake_fingerprint(worker, local.plan) == fingerprint
            assert remote.fingerprint() == fingerprint
            # A local checkpoint resumes remotely, and a remote one locally.
            for saved_by, resumed_by in ((local, remote), (remote, local)):
                iterator = iter(saved_by)
                next(iterator), next(iterator)
                state = json.loads(json.dumps(iterator.get_state()))
                assert state["fingerprint"] == fingerprint
                resumed = iter(resumed_by)
                resumed.set_state(state)
                assert digests(resumed) == digests(iterator)
    finally:
        worker.close()


def test_a_remote_loader_refuses_the_checkpoint_of_another_pipeline() -> None:
    local = DataLoader(Batcher()).batch_size(4).build(RangeDataset(0, RECORDS).map(clip_below(50)))
    worker = Worker({"p": mapped(clip_below(60))}, threads=1)
    try:
        with RemoteDataLoader([worker], pipeline="p").batch_size(4).build() as remote:
            iterator = iter(local)
            next(iterator)
            resumed = iter(remote)
            with pytest.raises(ValueError, match="allow_new_pipeline=True"):
                resumed.set_state(iterator.get_state())
            resumed.set_state(iterator.get_state(), allow_new_pipeline=True)
            assert resumed.step == 1
    finally:
        worker.close()


SCRIPT = """
import numpy as np

import loadax
from loadax.identity.fingerprint import pipeline_fingerprint


def scaled(index: int) -> dict[str, np.int64]:
    return {"x": np.int64(3 * index)}


def pipeline() -> loadax.Pipeline:
    return loadax.Pipeline(loadax.RangeDataset(0, 16).map(scaled), loadax.Batcher())


if __name__ == "__main__":
    print(pipeline_fingerprint(pipeline()))
"""


def test_code_run_as_a_script_and_imported_has_one_fingerprint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A training script's own functions are in __main__; a worker imports them by file name.
    script = tmp_path / "scaled_script.py"
    script.write_text(SCRIPT)
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=worker_env(),
        timeout=120,
        check=True,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    imported = importlib.import_module("scaled_script")
    assert run.stdout.split() == [identity(imported.pipeline())]
