"""The peers' virtualenvs under .bench/: created with pip on first use, then reused.

A stamp file records what was asked for and what pip could not install (with pip's reason), so a
later run neither reinstalls nor retries a package that has no wheel for this Python.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

STAMP = "loadax-bench.json"


@dataclasses.dataclass(frozen=True, slots=True)
class Environment:
    """A virtualenv, and the requirements pip could not install into it, with its reasons."""

    name: str
    python: Path
    unavailable: dict[str, str]

    def reason(self, requirement: str) -> str | None:
        """None if `requirement` is installed, else why not."""
        return self.unavailable.get(requirement)


def ensure(
    name: str, requirements: tuple[str, ...], root: Path, say: Callable[[str], None]
) -> Environment:
    """The virtualenv `root/name` with `requirements`, made (and stamped) unless it is already."""
    directory = root / name
    python = directory / "bin" / "python"
    stamp = directory / STAMP
    if stamp.is_file():
        recorded = json.loads(stamp.read_text())
        if recorded["requirements"] == list(requirements) and python.exists():
            return Environment(name, python, recorded["unavailable"])
    say(f"creating {directory} (pip install {' '.join(requirements)}); later runs reuse it")
    created = _run([sys.executable, "-m", "venv", "--clear", str(directory)])
    if created is not None:
        return Environment(name, python, dict.fromkeys(requirements, f"venv: {created}"))
    unavailable: dict[str, str] = {}
    if _pip(python, requirements) is not None:
        # Together they fail: install one at a time, so that one missing wheel costs one peer.
        for requirement in requirements:
            reason = _pip(python, (requirement,))
            if reason is not None:
                unavailable[requirement] = reason
    stamp.write_text(
        json.dumps({"requirements": list(requirements), "unavailable": unavailable}, indent=2)
    )
    return Environment(name, python, unavailable)


def _pip(python: Path, requirements: tuple[str, ...]) -> str | None:
    return _run([str(python), "-m", "pip", "install", "--quiet", *requirements])


def _run(command: list[str]) -> str | None:
    """None when `command` succeeds, else its error: the last ERROR line it printed."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return None
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or [f"exit status {result.returncode}"])[-1]
