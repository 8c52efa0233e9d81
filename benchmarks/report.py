"""RESULTS.md from the suite's results: the performance targets, then one table per workload.

Rates are medians over rounds; each loadax table compares the best loadax configuration of the
workload with every other system as a ratio measured in the same rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import fleet_report
from catalog import TENSORFLOW, TITLES, UNITS
from results import Results, cpu_per_gb, faults_per_gb, is_loadax, is_peer, number, verdict
from workloads import T1_BATCH_BYTES

MIB = 1 << 20
FLEET = Path(__file__).with_name("FLEET.md")
"""The fleet's results measured apart: the simulator's calibration and R3 (written by
fleet_sim_calibration.py and fleet_sim_r3.py) and gRPC through a proxy (proxy_check.py)."""
PLANS = Path(__file__).with_name("PLANS.md")
"""P2's counts, measured apart (written by p2_plans.py)."""
REUSE = Path(__file__).with_name("R5.md")
"""R5, each batch computed once between jobs and across epochs (written by r5_reuse.py)."""
W4 = Path(__file__).with_name("W4.md")
"""W4, tar shards in S3 against webdataset, measured apart (written by w4_tar.py)."""
SIZING = Path(__file__).with_name("SIZING.md")
"""R4 autoscale and R1 with local members, measured apart (r4_autoscale.py, r1_local_members.py)."""
PROFILES = Path(__file__).with_name("PROFILES.md")
"""The profiles that explain the missed transport targets, measured apart and kept by hand."""
RECEIVED = ("R1", *T1_BATCH_BYTES)
"""The workloads whose tables show the receiving process's CPU and page faults per GB."""


def render(document: Mapping[str, Any]) -> str:
    results = Results(document)
    meta = results.meta
    lines = [
        "# Benchmark results",
        "",
        f"`{meta['command']}`, {meta['date']}: {meta['scale']} scale, {meta['rounds']} "
        f"round(s), {meta['wall_s']:.0f} s in all, on {meta['machine']} (load average "
        f"{meta['load_before']} before, {meta['load_after']} after).",
        "",
        "Each run is its own process; systems alternate within each round (A B A B). A rate is "
        "elements (or bytes) / wall time from creating the iterator to the last batch, start-up "
        "included; **first batch** is the time to the first one. Cells are medians over rounds, "
        "with min - max. **peak RSS** is the run's `ru_maxrss`. For a remote client the memory "
        "bound is **base + (held + 2) x batch bytes**, held being the batches it holds ahead "
        "(prefetch, plus 2 requests in flight per worker) and base its RSS before the loader "
        "was built: a row says whether every round stayed within it. **CPU s/GB** (R1, T1) is "
        "the receiving process's user + system CPU seconds per GB of batches over the same time "
        "(`getrusage`), **faults/GB** its minor page faults per GB. A run marked * was stopped "
        f"after {meta['max_seconds']:g} s.",
        "",
        "## Targets",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        *(
            f"| {target} | {measured} | {verdict} |"
            for target, measured, verdict in targets(results)
        ),
    ]
    for workload in results.systems:
        heading = f"## {TITLES[workload].format(**results.workloads[workload])}"
        if workload == "R2":
            lines += ["", heading, "", *fleet_report.tables(results)]
            lines += ["", "Every R2 run:", "", *workload_table(results, workload)]
        else:
            lines += ["", heading, "", *workload_table(results, workload)]
    lines += ["", FLEET.read_text().rstrip(), "", PLANS.read_text().rstrip()]
    lines += ["", REUSE.read_text().rstrip()]
    lines += ["", W4.read_text().rstrip(), "", SIZING.read_text().rstrip()]
    lines += ["", PROFILES.read_text().rstrip()]
    return "\n".join(lines) + "\n"


def workload_table(results: Results, workload: str) -> list[str]:
    unit = UNITS[workload]
    best_name, best = results.best(workload, is_loadax)
    with_mb, with_cpu = workload == "R1", workload in RECEIVED
    header = ["system", f"{unit} (median)", "min - max"]
    header += ["MB/s"] if with_mb else []
    header += ["CPU s/GB", "faults/GB"] if with_cpu else []
    header += [f"{best_name or 'loadax'} ÷ this", "first batch (s)", "peak RSS (MiB)"]
    header += ["memory bound"]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for system in results.systems[workload]:
        name = system["name"]
        shown = f"**{name}**" if is_loadax(system) else name
        runs = results.runs(workload, name)
        if not runs:
            problems = results.runs(workload, name, "unavailable") or results.runs(
                workload, name, "failed"
            )
            why = f"{problems[0]['status']}: {problems[0]['reason']}" if problems else "not run"
            lines.append(f"| {shown} | {why} |" + " |" * (len(header) - 2))
            continue
        rates = results.rates(workload, name)
        median = statistics.median(rates)
        failed = len(results.runs(workload, name, "failed"))
        capped = "*" if any(run["capped"] for run in runs) else ""
        cells = [
            shown + (f" ({failed} failed)" if failed else ""),
            f"{number(median)}{capped}",
            f"{number(min(rates))} - {number(max(rates))}",
        ]
        if with_mb:
            cells.append(number(statistics.median(run["bytes_per_s"] / 1e6 for run in runs)))
        if with_cpu:
            cells.append(f"{statistics.median(cpu_per_gb(run) for run in runs):.2f}")
            cells.append(number(statistics.median(faults_per_gb(run) for run in runs)))
        cells += [
            "—" if is_loadax(system) or not median else f"{best / median:.2f}x",
            _median_of(runs, "first_batch_s", "{:.3f}"),
            _median_of(runs, "peak_rss_bytes", "{:.0f}", MIB),
            memory_bound(runs),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if workload == "P1":
        lines += ["", *p1_memory(results)]
    return lines


def _median_of(runs: Iterable[Mapping[str, Any]], key: str, form: str, scale: float = 1) -> str:
    values = [run[key] / scale for run in runs if run.get(key) is not None]
    return form.format(statistics.median(values)) if values else "—"


def memory_bound(runs: list[dict[str, Any]]) -> str:
    bounded = [run for run in runs if run.get("memory_bound_bytes") is not None]
    if not bounded:
        return "—"
    worst = max(bounded, key=lambda run: run["peak_rss_bytes"] - run["memory_bound_bytes"])
    within = all(run["peak_rss_bytes"] <= run["memory_bound_bytes"] for run in bounded)
    return f"{'within' if within else '**over**'} {worst['memory_bound_bytes'] / MIB:.0f}"


def p1_memory(results: Results) -> list[str]:
    lines = ["Peak memory of one `plan.indices(step)` call (tracemalloc), by plan size:", ""]
    for system in results.systems["P1"]:
        runs = results.runs("P1", system["name"])
        if runs:
            peaks = runs[0]["extra"]["peak_bytes_by_records"]
            shown = ", ".join(
                f"10^{len(key) - 1}: {value / MIB:.1f} MiB" for key, value in peaks.items()
            )
            lines.append(f"- {system['name']}: {shown}")
    return lines


def targets(results: Results) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for every performance target loadax has set itself."""
    rows: list[tuple[str, str, str]] = []

    def ratio(target: str, workload: str, minimum: float, subject: Any, other: Any) -> None:
        """subject and other: a system name, or a filter (its best system)."""
        name, value = _pick(results, workload, subject)
        other_name, other_value = _pick(results, workload, other)
        if not value or not other_value:
            rows.append((target, "not measured", "—"))
            return
        measured = _versus(name, value, other_name, other_value, UNITS[workload])
        result = verdict(value / other_value >= minimum)
        missing = [] if isinstance(other, str) else _not_measured(results, workload, other)
        if missing:
            measured += f"; not measured: {', '.join(missing)}"
            result += " (incomplete)"
        rows.append((target, measured, result))

    def cost(target: str, workload: str, maximum: float, subject: str, other: str) -> None:
        """The client CPU per GB of system `subject` at most `maximum` x that of `other`."""
        value, other_value = (
            results.median(workload, name, cpu_per_gb) for name in (subject, other)
        )
        if value is None or not other_value:
            rows.append((target, "not measured", "—"))
            return
        measured = _versus(subject, value, other, other_value, "s/GB")
        rows.append((target, measured, verdict(value / other_value <= maximum)))

    def is_numpy_peer(system: Mapping[str, Any]) -> bool:
        return is_peer(system) and system["package"] != TENSORFLOW

    def is_service(system: Mapping[str, Any]) -> bool:
        return is_peer(system) and "service" in system["name"]

    def is_zeromq(system: Mapping[str, Any]) -> bool:
        return is_loadax(system) and "ZeroMQ" in system["name"]

    def is_grpc(system: Mapping[str, Any]) -> bool:
        return is_loadax(system) and "gRPC" in system["name"]

    ratio("W1: loadax ≥ 3x the best peer", "W1", 3.0, is_loadax, is_peer)
    ratio("W2: loadax ≥ 1.3x the best peer", "W2", 1.3, is_loadax, is_peer)
    ratio("W3: loadax ≥ the best numpy-based peer", "W3", 1.0, is_loadax, is_numpy_peer)
    ratio("W3: 2-worker speed-up ≥ 1.8x", "W3", 1.8, "loadax 2w", "loadax 0w")
    ratio("R1: remote ≥ 3x tf.data service", "R1", 3.0, is_loadax, is_service)
    ratio("R1: ZeroMQ ≥ 0.8x local mode", "R1", 0.8, is_zeromq, "loadax 2w")
    ratio("R1: gRPC ≥ 0.6x local mode", "R1", 0.6, is_grpc, "loadax 2w")
    ratio("R1: gRPC 2 workers ≥ gRPC 1 worker", "R1", 1.0, "loadax gRPC 2w", "loadax gRPC 1w")
    zeromq, grpc, tcp, grpcio = "loadax ZeroMQ", "loadax gRPC", "raw TCP", "gRPC raw bytes"
    for workload, size in T1_BATCH_BYTES.items():
        t1 = f"T1 {size // MIB} MiB"
        ratio(f"{t1}: ZeroMQ ≥ 80% of raw TCP", workload, 0.8, zeromq, tcp)
        ratio(f"{t1}: gRPC ≥ 90% of gRPC raw bytes", workload, 0.9, grpc, grpcio)
        cost(f"{t1}: ZeroMQ client CPU/GB ≤ 1.3x raw TCP's", workload, 1.3, zeromq, tcp)
        cost(f"{t1}: gRPC client CPU/GB ≤ 0.8x gRPC raw bytes'", workload, 0.8, grpc, grpcio)
    # The target's design: a header plus out-of-band array buffers (what ZeroMQ sends).
    for direction in ("encode_frames", "decode"):
        rows.append(_at_least(results, "codec", f"loadax.wire.codec {direction}", 3.0, "GB/s"))
    for system in results.systems.get("P1", []):
        rows.append(_at_least(results, "P1", system["name"], 10e6, "indices/s"))
    rows.append(_p1_constant_memory(results))
    rows.append(_first_batch(results, ("W1", "W2", "W3"), 0.1, "local"))
    rows.append(_first_batch(results, ("R1",), 0.5, "remote"))
    rows.append(_within_bound(results))
    rows += fleet_report.targets(results)
    return rows


def _versus(name: str, value: float, other_name: str, other_value: float, unit: str) -> str:
    return (
        f"{value / other_value:.2f}x ({name} {number(value)} vs {other_name} "
        f"{number(other_value)} {unit})"
    )


def _pick(results: Results, workload: str, which: Any) -> tuple[str, float]:
    if isinstance(which, str):
        return which, results.median(workload, which) or 0.0
    return results.best(workload, which)


def _not_measured(
    results: Results, workload: str, keep: Callable[[dict[str, Any]], bool]
) -> list[str]:
    """The systems `keep` accepts that have no successful run: a comparison leaves them out."""
    return [
        system["name"]
        for system in results.systems.get(workload, [])
        if keep(system) and results.median(workload, system["name"]) is None
    ]


def _at_least(
    results: Results, workload: str, system: str, minimum: float, unit: str
) -> tuple[str, str, str]:
    target = f"{workload}: {system} ≥ {number(minimum)} {unit}"
    value = results.median(workload, system)
    if value is None:
        return target, "not measured", "—"
    return target, f"{number(value)} {unit}", verdict(value >= minimum)


def _p1_constant_memory(results: Results) -> tuple[str, str, str]:
    target = "P1: O(1) memory (a 10^12-record plan needs < 2x a 10^7 one)"
    measured, met = [], True
    for system in results.systems.get("P1", []):
        for run in results.runs("P1", system["name"])[:1]:
            peaks = run["extra"]["peak_bytes_by_records"]
            small, large = peaks[str(10**7)], peaks[str(10**12)]
            measured.append(f"{large / max(small, 1):.2f}x at batch {run['extra']['batch_size']:,}")
            met = met and large < 2 * small
    if not measured:
        return target, "not measured", "—"
    return target, "; ".join(measured), verdict(met)


def _first_batch(
    results: Results, workloads: tuple[str, ...], limit: float, where: str
) -> tuple[str, str, str]:
    target = f"first batch ≤ {limit} s {where} ({', '.join(workloads)})"
    medians = [
        (statistics.median(run["first_batch_s"] for run in runs), f"{workload} {system['name']}")
        for workload in workloads
        for system in results.systems.get(workload, [])
        if is_loadax(system) and (runs := results.runs(workload, system["name"]))
    ]
    if not medians:
        return target, "not measured", "—"
    worst, name = max(medians)
    return target, f"slowest median {worst:.3f} s ({name})", verdict(worst <= limit)


def _within_bound(results: Results) -> tuple[str, str, str]:
    target = "client RSS ≤ base + (held + 2) x batch bytes"
    bounded = [
        (run["peak_rss_bytes"] - run["memory_bound_bytes"], workload, system["name"])
        for workload, systems in results.systems.items()
        for system in systems
        for run in results.runs(workload, system["name"])
        if run.get("memory_bound_bytes") is not None
    ]
    if not bounded:
        return target, "not measured", "—"
    margin, workload, name = max(bounded)
    over = f"{margin / MIB:.0f} MiB over" if margin > 0 else f"{-margin / MIB:.0f} MiB to spare"
    workloads = ", ".join(dict.fromkeys(where for _, where, _ in bounded))
    measured = f"{len(bounded)} remote runs ({workloads}); tightest: {workload} {name}, {over}"
    return target, measured, verdict(margin <= 0)
