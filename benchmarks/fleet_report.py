"""R2's part of RESULTS.md: its targets' verdicts, and its tables (scaling, first batch,
straggler, faults) built from the runs that `fleet.RUNS` names."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import fleet
from fleet import FleetRun
from results import Results, number, verdict

R2 = "R2"
MIN_EFFICIENCY = 0.9
MIN_STRAGGLER_FRACTION = 0.9
MAX_GAP_S = 2.0
MAX_FIRST_BATCH_S = 0.1


def targets(results: Results) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each of R2's targets, when R2 ran."""
    if R2 not in results.systems:
        return []
    workers, cost = fleet.EFFICIENCY_WORKERS, fleet.EFFICIENCY_COST_MS
    efficiency = {_transport(t): _efficiency(results, t, workers, cost) for t in fleet.TRANSPORTS}
    straggler = {_transport(t): _straggler(results, t) for t in fleet.TRANSPORTS}
    faults = [
        FleetRun(t, fleet.FAULT_WORKERS, fleet.FAULT_COST_MS, fault=fault)
        for fault in fleet.FAULTS
        for t in fleet.TRANSPORTS
    ]
    gaps = {
        f"{_transport(run.transport)} {run.fault}{' (capped)' * _capped(results, run)}": _gap(
            results, run
        )
        for run in faults
    }
    # At smaller scales a worker makes a few batches only: start-up, not scaling, sets the rate.
    judged = results.meta["scale"] == "full"
    first = {
        f"{_transport(t)} {cost} ms": _extra(results, FleetRun(t, workers, cost), "first_batch_s")
        for cost in fleet.COSTS_MS
        for t in fleet.TRANSPORTS
    }
    return [
        _verdicts(
            f"R2: scaling efficiency ≥ {MIN_EFFICIENCY:.0%} at {workers} workers ({cost} ms)",
            efficiency,
            lambda value: value >= MIN_EFFICIENCY,
            "{:.0%}",
            judged,
        ),
        _verdicts(
            f"R2: 1 of 4 workers {fleet.SLOWDOWN}x slower ≥ {MIN_STRAGGLER_FRACTION:.0%} of 3 "
            "healthy workers' rate",
            straggler,
            lambda value: value >= MIN_STRAGGLER_FRACTION,
            "{:.0%}",
            judged,
        ),
        _verdicts(
            f"R2: no gap > {MAX_GAP_S:g} s between batches after a fault of 1 of "
            f"{fleet.FAULT_WORKERS} workers",
            gaps,
            lambda value: value <= MAX_GAP_S,
            "{:.2f} s",
        ),
        _verdicts(
            f"R2: first batch ≤ {MAX_FIRST_BATCH_S:g} s after build() with {workers} workers",
            first,
            lambda value: value <= MAX_FIRST_BATCH_S,
            "{:.3f} s",
        ),
    ]


def tables(results: Results) -> list[str]:
    cap = fleet.STALL_CAP_S.get(results.meta["scale"], 0.0)
    per_worker = ", ".join(
        f"{number(fleet.THREADS * 1000 / cost)} records/s at {cost} ms" for cost in fleet.COSTS_MS
    )
    return [
        "Records/s: medians of records / wall time from `iter(loader)` (after `build()`) to the "
        "last batch. Efficiency (in brackets): rate with N workers ÷ (N x rate with 1). A "
        f"worker's ideal is {fleet.THREADS} threads ÷ the cost: {per_worker}.",
        "",
        *_scaling(results),
        "",
        *_first_batches(results),
        "",
        *_stragglers(results),
        "",
        f"The client's own cost, with a training step of {fleet.STEP_MS} ms (a sleep) after each "
        f"batch so that the batch is mostly ready: the time `next()` takes and the client "
        f"process's CPU (user + system) per batch, {fleet.CLIENT_COST_WORKERS} workers at "
        f"{fleet.CLIENT_COST_MS} ms.",
        "",
        *_client_cost(results),
        "",
        f"The longest gap between batches after one of {fleet.FAULT_WORKERS} workers "
        f"({fleet.FAULT_COST_MS} ms) is signalled, after a quarter of the batches, beside the "
        "longest before it. *capped*: the SIGSTOPped worker was continued (SIGCONT) "
        f"{cap:g} s after the fault, during that gap, which would have been longer.",
        "",
        *_faults(results),
    ]


def _scaling(results: Results) -> list[str]:
    counts = fleet.WORKER_COUNTS
    lines = [
        "| transport | cost | " + " | ".join(f"{n} worker{'s' * (n > 1)}" for n in counts) + " |",
        "|---|---|" + "---|" * len(counts),
    ]
    for cost in fleet.COSTS_MS:
        for transport in fleet.TRANSPORTS:
            one = _rate(results, FleetRun(transport, 1, cost))
            cells = []
            for workers in counts:
                value = _rate(results, FleetRun(transport, workers, cost))
                cell = _failed_or_missing(results, FleetRun(transport, workers, cost))
                if value is not None:
                    cell = number(value)
                    if one and workers > 1:
                        cell += f" ({value / (workers * one):.0%})"
                cells.append(cell)
            lines.append(f"| {_transport(transport)} | {cost} ms | " + " | ".join(cells) + " |")
    return lines


def _first_batches(results: Results) -> list[str]:
    lines = [
        "| transport | cost | workers | build() (s) | first batch after build() (s) |",
        "|---|---|---|---|---|",
    ]
    for workers in fleet.FIRST_BATCH_WORKERS:
        for cost in fleet.COSTS_MS:
            for transport in fleet.TRANSPORTS:
                run = FleetRun(transport, workers, cost)
                cells = [
                    _seconds(_extra(results, run, "build_s"), "{:.3f}"),
                    _seconds(_extra(results, run, "first_batch_s"), "{:.3f}"),
                ]
                lines.append(
                    f"| {_transport(transport)} | {cost} ms | {workers} | "
                    + " | ".join(cells)
                    + " |"
                )
    return lines


def _stragglers(results: Results) -> list[str]:
    cost, slowdown = fleet.STRAGGLER_COST_MS, fleet.SLOWDOWN
    lines = [
        f"| transport ({cost} ms) | 3 workers (records/s) | 3 + 1 {slowdown}x slower "
        "(records/s) | with ÷ without |",
        "|---|---|---|---|",
    ]
    for transport in fleet.TRANSPORTS:
        healthy, slow = FleetRun(transport, 3, cost), FleetRun(transport, 4, cost, slow=1)
        fraction = _straggler(results, transport)
        cells = [
            _rate_cell(results, healthy),
            _rate_cell(results, slow),
            "—" if fraction is None else f"{fraction:.0%}",
        ]
        lines.append(f"| {_transport(transport)} | " + " | ".join(cells) + " |")
    return lines


def _client_cost(results: Results) -> list[str]:
    lines = [
        "| transport | next() median (µs) | next() p90 (µs) | client CPU per batch (µs) |",
        "|---|---|---|---|",
    ]
    for transport in fleet.TRANSPORTS:
        run = FleetRun(
            transport, fleet.CLIENT_COST_WORKERS, fleet.CLIENT_COST_MS, step_ms=fleet.STEP_MS
        )
        keys = ("next_us_p50", "next_us_p90", "client_cpu_us_per_batch")
        cells = [_seconds(_extra(results, run, key), "{:.0f}") for key in keys]
        lines.append(f"| {_transport(transport)} | " + " | ".join(cells) + " |")
    return lines


def _faults(results: Results) -> list[str]:
    lines = [
        "| transport | fault | longest gap after (s) | longest gap before (s) | records/s |",
        "|---|---|---|---|---|",
    ]
    for fault in fleet.FAULTS:
        for transport in fleet.TRANSPORTS:
            run = FleetRun(transport, fleet.FAULT_WORKERS, fleet.FAULT_COST_MS, fault=fault)
            after = _seconds(_gap(results, run), "{:.2f}") + " (capped)" * _capped(results, run)
            cells = [after, _seconds(_extra(results, run, "gap_before_fault_s"), "{:.2f}")]
            cells.append(_rate_cell(results, run))
            lines.append(f"| {_transport(transport)} | {fault} | " + " | ".join(cells) + " |")
    return lines


def _verdicts(
    target: str,
    values: dict[str, float | None],
    ok: Callable[[float], bool],
    form: str,
    judged: bool = True,
) -> tuple[str, str, str]:
    """A target row over several measurements: met when every one is, incomplete when some
    were not measured; not `judged` (only shown) below the full scale."""
    measured = {label: value for label, value in values.items() if value is not None}
    if not measured:
        return target, "not measured", "—"
    text = ", ".join(f"{label} {form.format(value)}" for label, value in measured.items())
    missing = [label for label in values if label not in measured]
    if not judged:
        return target, text, "— (judged at the full scale only)"
    result = verdict(all(ok(value) for value in measured.values()))
    if missing:
        text += f"; not measured: {', '.join(missing)}"
        result += " (incomplete)"
    return target, text, result


def _efficiency(results: Results, transport: str, workers: int, cost: int) -> float | None:
    one = _rate(results, FleetRun(transport, 1, cost))
    many = _rate(results, FleetRun(transport, workers, cost))
    return None if not one or many is None else many / (workers * one)


def _straggler(results: Results, transport: str) -> float | None:
    cost = fleet.STRAGGLER_COST_MS
    healthy = _rate(results, FleetRun(transport, 3, cost))
    slow = _rate(results, FleetRun(transport, 4, cost, slow=1))
    return None if not healthy or slow is None else slow / healthy


def _gap(results: Results, run: FleetRun) -> float | None:
    return _extra(results, run, "gap_after_fault_s")


def _capped(results: Results, run: FleetRun) -> bool:
    """Whether the longest gap after the fault was cut short in any round."""
    return any(record["extra"].get("gap_capped") for record in results.runs(R2, run.name))


def _rate(results: Results, run: FleetRun) -> float | None:
    return results.median(R2, run.name)


def _extra(results: Results, run: FleetRun, key: str) -> float | None:
    """The median of `key` over the run's rounds, from its record or its extra."""
    values = [
        float(value)
        for record in results.runs(R2, run.name)
        if (value := record.get(key, record["extra"].get(key))) is not None
    ]
    return statistics.median(values) if values else None


def _rate_cell(results: Results, run: FleetRun) -> str:
    value = _rate(results, run)
    return _failed_or_missing(results, run) if value is None else number(value)


def _seconds(value: float | None, form: str) -> str:
    return "—" if value is None else form.format(value)


def _failed_or_missing(results: Results, run: FleetRun) -> str:
    return "failed" if results.runs(R2, run.name, "failed") else "—"


def _transport(key: str) -> str:
    return fleet.TRANSPORTS[key]
