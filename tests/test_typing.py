"""mypy infers the batch type from the Batcher and rejects a Batcher of the wrong item type."""

from __future__ import annotations

import pathlib

from mypy import api

TYPING = pathlib.Path(__file__).parent / "typing"


def run_mypy(name: str) -> tuple[str, int]:
    stdout, stderr, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir=/dev/null", str(TYPING / name)]
    )
    return stdout + stderr, status


def test_batch_types_are_inferred_through_the_builder() -> None:
    output, status = run_mypy("inference.py")
    assert status == 0, output


def test_a_batcher_of_the_wrong_item_type_is_a_type_error() -> None:
    output, status = run_mypy("mismatch.py")
    assert status == 1, output
    assert 'mismatch.py:10: error: Argument 1 to "build"' in output
    assert output.count("error:") == 1, output
