"""One pipeline identity per job: real JAX processes whose loaders reach workers of different
code all fail at build, naming each process's fingerprint; with the same code they load."""

from __future__ import annotations

import pathlib

import pytest
from processes import run_jax_processes

CHECK = pathlib.Path(__file__).parent / "multihost_identity_check.py"


def test_processes_bound_to_different_code_all_raise_at_build() -> None:
    outputs = run_jax_processes(CHECK, 2, 2, "--mixed")
    for output in outputs:
        (line,) = [line for line in output.splitlines() if line.startswith("raised: ")]
        assert "bound their loaders of pipeline 'numbers' to different pipeline identities" in line
        assert "process 0: fingerprint " in line
        assert "process 1: fingerprint " in line
        assert "in-process Worker" in line  # each process's targets


def test_processes_bound_to_the_same_code_load() -> None:
    outputs = run_jax_processes(CHECK, 2, 2)
    fingerprints, seats = set(), []
    for output in outputs:
        assert "raised" not in output, output
        (fingerprint,) = [line for line in output.splitlines() if line.startswith("fingerprint ")]
        fingerprints.add(fingerprint)
        assert any(line.startswith("digest ") for line in output.splitlines()), output
        (seat,) = [line for line in output.splitlines() if line.startswith("seat ")]
        seats.append(float(seat.removeprefix("seat ")))
    assert len(fingerprints) == 1
    # The job's 2 processes sit half the ring apart, so their arcs of workers do not overlap.
    assert (seats[1] - seats[0]) % 1.0 == pytest.approx(0.5)
