"""The generated protobuf code in loadax/wire/v1 matches worker.proto; its messages round-trip."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from loadax.wire.v1 import worker_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTO = "proto/loadax/wire/v1/worker.proto"
GENERATED = Path("loadax/wire/v1")


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh `make proto` output, in a temporary folder."""
    tmp_path = tmp_path_factory.mktemp("proto")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            PROTO,
        ],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return tmp_path


@pytest.mark.parametrize("name", ["worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py"])
def test_generated_code_is_up_to_date_with_the_proto(regenerated: Path, name: str) -> None:
    fresh = (regenerated / GENERATED / name).read_bytes()
    committed = (ROOT / GENERATED / name).read_bytes()
    assert fresh == committed, f"{GENERATED / name} is stale: run `make proto`"


def test_batch_request_round_trips_with_its_rows() -> None:
    request = worker_pb2.BatchRequest(
        pipeline="train",
        fingerprint="abc123",
        plan=worker_pb2.Plan(num_records=1000, batch_size=32, seed=7, shuffle=True),
        step=2**40,
        rows=[0, 3, 31],
    )
    decoded = worker_pb2.BatchRequest.FromString(request.SerializeToString())
    assert decoded == request
    assert list(decoded.rows) == [0, 3, 31]
    assert decoded.step == 2**40
    assert decoded.plan.batch_size == 32
    assert decoded.plan.shuffle is True


def test_plan_without_num_epochs_round_trips_as_absent() -> None:
    plan = worker_pb2.Plan(num_records=10, batch_size=2, seed=1, drop_remainder=True)
    decoded = worker_pb2.Plan.FromString(plan.SerializeToString())
    assert decoded == plan
    assert not decoded.HasField("num_epochs")
    assert decoded.drop_remainder is True


@pytest.mark.parametrize("num_epochs", [0, 1, 2**64 - 1])
def test_plan_with_num_epochs_round_trips_it_even_when_zero(num_epochs: int) -> None:
    plan = worker_pb2.Plan(num_records=10, batch_size=2, num_epochs=num_epochs)
    decoded = worker_pb2.Plan.FromString(plan.SerializeToString())
    assert decoded == plan
    assert decoded.HasField("num_epochs")
    assert decoded.num_epochs == num_epochs
