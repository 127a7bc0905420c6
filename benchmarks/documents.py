"""ScalePlan documents on the busy fleet: the full document and the program export a data plane
reads, their sizes and the time to write and read (check included) each.

The busy fleet of benchmarks/plan.py: rail-leafspine-1024 serving llama-3-8b with 64 prefill and
64 decode instances; plan() adds 512 prefill instances (64 in quick mode). Reading means
``ScalePlan.from_json`` (the plan_id and the program rules checked) and ``read_program_json``
(program_id, spec and program rules checked) followed by the executor's own checks
(``check_runnable``: what ``blitzplan.executor``'s reader runs). Targets (issue 19): the export
at most 3 MB and 100 ms to read at +512.

Run: .venv/bin/python benchmarks/documents.py   (BLITZPLAN_QUICK=1: +64, fewer repeats)
Prints medians of wall-clock times measured on this machine, and of the CPU time the process
spent reading (less disturbed by other processes on a shared machine), the 1-minute load
average, and where the export's read time goes (the digest on the text, the program rules; the
rest is decoding into records); nothing is asserted.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import date

from plan import REPEATS, busy_rail, median_ms

from blitzplan._table import format_table
from blitzplan.executor.program.jobs import check_runnable
from blitzplan.scale import ScalePlan, ScaleRequest, plan
from blitzplan.scale.export import program_json
from blitzplan.wire.canonical import signed_as_written
from blitzplan.wire.scaleprogram import check_program, read_program_json

ADDED = 64 if os.environ.get("BLITZPLAN_QUICK") == "1" else 512


def median_cpu_ms(call: Callable[[], object]) -> float:
    runs = []
    for _ in range(REPEATS):
        start = time.process_time()
        call()
        runs.append(time.process_time() - start)
    return statistics.median(runs) * 1e3


def executor_read(export: str) -> object:
    """The export read as the executor reads it: every program rule, then its own checks."""
    program = read_program_json(export)
    check_runnable(program)
    return program


def main() -> None:
    print(
        f"blitzplan documents, {date.today()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}, median of {REPEATS}, "
        f"load {os.getloadavg()[0]:.1f}\n"
    )
    scale = plan(busy_rail(), ScaleRequest("llama-3-8b", prefill=ADDED, tp=1))
    full = scale.to_json()
    export = program_json(scale)
    print(f"busy rail-leafspine-1024, +{ADDED} llama-3-8b: {len(scale.steps)} steps\n")
    rows = [
        [
            "ScalePlan (to_json / from_json)",
            f"{len(full.encode()) / 1e6:.2f}",
            f"{median_ms(scale.to_json):.0f}",
            f"{median_ms(lambda: ScalePlan.from_json(full)):.0f}",
            f"{median_cpu_ms(lambda: ScalePlan.from_json(full)):.0f}",
            "-",
        ],
        [
            "program export (program_json / read_program_json)",
            f"{len(export.encode()) / 1e6:.2f}",
            f"{median_ms(lambda: program_json(scale)):.0f}",
            f"{median_ms(lambda: executor_read(export)):.0f}",
            f"{median_cpu_ms(lambda: executor_read(export)):.0f}",
            "3 MB, 100 ms" if ADDED == 512 else "(at +512: 3 MB, 100 ms)",
        ],
    ]
    headers = ["document", "MB", "write ms", "read ms", "read cpu ms", "target"]
    print(format_table(headers, rows))
    program = read_program_json(export)
    digest = median_cpu_ms(lambda: signed_as_written(export, "program_id"))
    rules = median_cpu_ms(lambda: check_program(program))
    runnable = median_cpu_ms(lambda: check_runnable(program))
    print(
        f"\nreading the export (cpu ms): {digest:.1f} the program_id on the canonical text, "
        f"{rules:.1f} the spec and program rules, {runnable:.1f} the executor's own checks, the "
        "rest decoding into records"
    )


if __name__ == "__main__":
    main()
