"""What a suite run measured, read back from its document: every run by workload and system,
medians over rounds, and how tables show numbers and verdicts."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from typing import Any

from catalog import UNITS

Metric = Callable[[Mapping[str, Any]], float]
"""A number read from one run's record (lower is better for the costs below)."""


class Results:
    """The runs of one suite run, by workload and system."""

    def __init__(self, document: Mapping[str, Any]) -> None:
        self.meta: Mapping[str, Any] = document["meta"]
        self.systems: Mapping[str, list[dict[str, Any]]] = document["systems"]
        self.workloads: Mapping[str, dict[str, Any]] = document["workloads"]
        self._runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for run in document["runs"]:
            self._runs.setdefault((run["workload"], run["system"]), []).append(run)

    def runs(self, workload: str, system: str, status: str = "ok") -> list[dict[str, Any]]:
        return [r for r in self._runs.get((workload, system), []) if r["status"] == status]

    def rates(self, workload: str, system: str) -> list[float]:
        return [rate(workload, run) for run in self.runs(workload, system)]

    def median(self, workload: str, system: str, metric: Metric | None = None) -> float | None:
        """The median over rounds of the rate, or of `metric` (None if no run succeeded)."""
        runs = self.runs(workload, system)
        values = self.rates(workload, system) if metric is None else [metric(r) for r in runs]
        return statistics.median(values) if values else None

    def best(self, workload: str, keep: Callable[[dict[str, Any]], bool]) -> tuple[str, float]:
        """The system with the highest median among those `keep` accepts ("", 0.0 if none ran)."""
        candidates = [
            (median, system["name"])
            for system in self.systems.get(workload, [])
            if keep(system) and (median := self.median(workload, system["name"])) is not None
        ]
        if not candidates:
            return "", 0.0
        median, name = max(candidates)
        return name, median


def rate(workload: str, run: Mapping[str, Any]) -> float:
    """The headline rate of a run in its workload's unit."""
    if UNITS[workload] == "GB/s":
        return float(run["bytes_per_s"]) / 1e9
    return float(run["elements_per_s"])


def cpu_per_gb(run: Mapping[str, Any]) -> float:
    """The running (receiving) process's user + system CPU seconds per GB of batches."""
    return float(run["cpu_s"]) / float(run["bytes"]) * 1e9


def faults_per_gb(run: Mapping[str, Any]) -> float:
    """The running process's minor page faults per GB of batches."""
    return float(run["minor_faults"]) / float(run["bytes"]) * 1e9


def is_loadax(system: Mapping[str, Any]) -> bool:
    return bool(system["role"] == "loadax")


def is_peer(system: Mapping[str, Any]) -> bool:
    return bool(system["role"] == "peer")


def number(value: float) -> str:
    """3 significant digits, with k / M / G."""
    for scale, suffix in ((1e9, " G"), (1e6, " M"), (1e3, " k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def verdict(met: bool) -> str:
    return "met" if met else "**missed**"
