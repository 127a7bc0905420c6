"""Do the exact live-scaling backends stop on time? (issue 11, item 6)

Run: .venv/bin/python benchmarks/limits.py   (BLITZPLAN_QUICK=1: 2 calls, 0.3 s, one size)

Each backend solves the same instance (built as in ``partition.py``: llama-3-8b on
paper-a100-16 for L=32, qwen2.5-72b TP4 on paper-a800-32 for L=80) ``CALLS`` times with each
time limit, and the table prints the wall time of ``schedule_live`` (the whole call: the ZigZag
hint, the relaxation, building the model, handing it to the solver, solving, reading back) and
its overrun past the limit. ``schedule_live`` promises to return within
``time_limit_s + LIMIT_SLACK_S``; "late" counts the calls that did not. The gap is the answer's
relative distance to its proven bound. Nothing is asserted: the README quotes the table.
"""

from __future__ import annotations

import collections
import os
import platform
import statistics
import time
from datetime import date

from partition import instance

from blitzplan import schedule_live
from blitzplan._table import format_table
from blitzplan.live.solve import LIMIT_SLACK_S

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
CALLS = 2 if QUICK else 25
LIMITS_S = (0.3,) if QUICK else (1.0, 2.0)
SIZES = [(32, 8)] if QUICK else [(32, 16), (80, 16)]
BACKENDS = ("bnb", "highs", "cbc", "cpsat")


def rows() -> list[list[object]]:
    table = []
    for layers, batches in SIZES:
        inst = instance(layers, batches, 0)
        for backend in BACKENDS:
            for limit in LIMITS_S:
                times, gaps, statuses = [], [], collections.Counter[str]()
                for _ in range(CALLS):
                    started = time.perf_counter()
                    result = schedule_live(
                        inst, method="exact", backend=backend, time_limit_s=limit
                    )
                    times.append(time.perf_counter() - started)
                    gaps.append(100 * (result.gap or 0.0))
                    statuses[result.status.value] += 1
                overruns = [max(0.0, t - limit) for t in times]
                table.append(
                    [
                        f"({layers},{batches})",
                        backend,
                        f"{limit:g}",
                        CALLS,
                        f"{statistics.median(times):.2f}",
                        f"{max(times):.2f}",
                        f"{statistics.median(overruns):.3f}",
                        f"{max(overruns):.3f}",
                        sum(t > limit + LIMIT_SLACK_S for t in times),
                        f"{statistics.median(gaps):.1f}",
                        ", ".join(f"{k} {v}" for k, v in sorted(statuses.items())),
                    ]
                )
    return table


def main() -> None:
    print(
        f"blitzplan solver time limits, {date.today()}, {platform.machine()}, "
        f"{os.cpu_count()} cpus, load average {os.getloadavg()[0]:.2f}, solver threads 1, "
        f"slack LIMIT_SLACK_S = {LIMIT_SLACK_S:g} s{', QUICK' if QUICK else ''}\n"
    )
    headers = [
        "(L,n)",
        "backend",
        "limit s",
        "calls",
        "median s",
        "max s",
        "median overrun s",
        "max overrun s",
        "late",
        "median gap %",
        "statuses",
    ]
    print(format_table(headers, rows()))
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
