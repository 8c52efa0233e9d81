"""P2 variable-length plans: padding and the step-time proxy, plain shuffle vs bucket_by_length;
padding of first-fit vs best-fit packing.

100,000 records with lognormal lengths (median 256 tokens, sigma 1.0, cut at 4,096), global
batch 256 over 8 replicas of 32 rows, each replica padded to its own longest row. The numbers
are counts, not timings: one run gives them exactly. Writes its section into PLANS.md (which
report.render puts into RESULTS.md) and RESULTS.md's copy.

Usage: `python benchmarks/p2_plans.py [--records 100000]`
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import numpy.typing as npt
from fleet_sim import RESULTS, write_section

from loadax import Plan
from loadax.dataset.packing import row_members
from loadax.plan.buckets import LengthBuckets

PLANS = Path(__file__).with_name("PLANS.md")
TITLE = "P2 variable-length plans"
BATCH, REPLICAS, ROW = 256, 8, 4096
WINDOWS = (256, 1024, 4096)  # 256: a stream's default window


def lengths_of(records: int) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(0)
    return np.clip(rng.lognormal(np.log(256), 1.0, records), 1, ROW).astype(np.int64)


def replica_costs(plan: Plan, lengths: npt.NDArray[np.int64]) -> tuple[float, int, float]:
    """Padding ÷ real tokens, the step-time proxy (the largest replica's padded tokens per step,
    summed over the epoch) and the planning time of the epoch's indices."""
    assert plan.num_steps is not None
    started = time.perf_counter()
    steps = [plan.indices(step) for step in range(plan.num_steps)]
    planned = time.perf_counter() - started
    padded = proxy = real = 0
    for indices in steps:
        rows = lengths[indices].reshape(REPLICAS, -1)
        per_replica = rows.max(axis=1) * rows.shape[1]
        padded += int(per_replica.sum())
        proxy += int(per_replica.max())
        real += int(rows.sum())
    return (padded - real) / real, proxy, planned


def packing_padding(lengths: npt.NDArray[np.int64], window: int, strategy: str) -> int:
    """Padding tokens of rows of ROW packed within consecutive windows of sequences."""
    rows = 0
    for start in range(0, lengths.size, window):
        rows += len(row_members(lengths[start : start + window].tolist(), ROW, strategy))
    return rows * ROW - int(lengths.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    lengths = lengths_of(args.records)
    plain = Plan(args.records, BATCH, seed=1, shuffle=True, drop_remainder=True)
    cases = [("plain shuffle", plain, 0.0)]
    for buckets in (8, 16, 32):
        started = time.perf_counter()
        grouped = LengthBuckets(lengths, num_buckets=buckets)
        made = time.perf_counter() - started
        plan = Plan(args.records, BATCH, 1, True, 1, True, buckets=grouped)
        cases.append((f"bucket_by_length(num_buckets={buckets})", plan, made))
    results = [(name, *replica_costs(plan, lengths), made) for name, plan, made in cases]
    _, base_padding, base_proxy, _, _ = results[0]
    lines = [
        f"{args.records:,} records, lognormal lengths (median 256, sigma 1.0, cut at {ROW:,}; "
        f"{int(lengths.sum()):,} tokens), global batch {BATCH} over {REPLICAS} replicas, each "
        "padded to its own longest row, one epoch (remainders dropped). Target: "
        "bucket_by_length >= 2x less of both than plain shuffle.",
        "",
        "| plan | padding ÷ real tokens | step-time proxy (tokens) | plain ÷ this: padding, "
        "proxy | buckets made (s) | epoch planned (s) |",
        "|---|---|---|---|---|---|",
    ]
    for name, padding, proxy, planned, made in results:
        lines.append(
            f"| {name} | {padding:.3f} | {proxy:,} | {base_padding / padding:.2f}x, "
            f"{base_proxy / proxy:.2f}x | {made:.3f} | {planned:.2f} |"
        )
    lines += [
        "",
        f"Packing the same sequences (in record order) into rows of {ROW:,}, within windows of "
        "consecutive sequences (a stream's window; 256 by default). Target: best-fit >= 20 % "
        "fewer padding tokens than first-fit at a window of >= 1,024.",
        "",
        "| window | first-fit padding tokens | best-fit padding tokens | best-fit saves |",
        "|---|---|---|---|",
    ]
    for window in WINDOWS:
        first = packing_padding(lengths, window, "first_fit")
        best = packing_padding(lengths, window, "best_fit")
        lines.append(f"| {window:,} | {first:,} | {best:,} | {1 - best / first:.1%} |")
    lines += ["", "`python benchmarks/p2_plans.py`; counts are exact, times on 2 shared cores."]
    print("\n".join(lines))
    for path in (PLANS, RESULTS):
        write_section(path, TITLE, lines)


if __name__ == "__main__":
    main()
