"""mypy infers the batch type from the Batcher and rejects a Batcher of the wrong item type."""

from __future__ import annotations

import pathlib

import pytest
from mypy import api

TYPING = pathlib.Path(__file__).parent / "typing"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """One mypy cache for the module: the second run does not analyse loadax and jax again."""
    return tmp_path_factory.mktemp("mypy-cache")


def run_mypy(name: str, cache: pathlib.Path) -> tuple[str, int]:
    stdout, stderr, status = api.run(["--strict", f"--cache-dir={cache}", str(TYPING / name)])
    return stdout + stderr, status


def test_batch_types_are_inferred_through_the_builder(cache: pathlib.Path) -> None:
    output, status = run_mypy("inference.py", cache)
    assert status == 0, output


def test_a_batcher_of_the_wrong_item_type_is_a_type_error(cache: pathlib.Path) -> None:
    output, status = run_mypy("mismatch.py", cache)
    assert status == 1, output
    assert 'mismatch.py:10: error: Argument 1 to "build"' in output
    assert output.count("error:") == 1, output
