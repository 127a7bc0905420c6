"""Fault campaign benchmark: replan() after random single and double failures of every kind.

Each case is a scenario (six clusters and requests), one or two failures (a source, a new
instance, a GPU, a NIC, a PCIe switch, a root complex, host DRAM, an NVSwitch, a host, a leaf,
the spine or a link) and a time before, during or after the load. The independent checker of
``tests/fault_campaign.py`` judges every outcome: a clear error, or a plan valid on what survives
that touches no failed part, resends nothing, keeps roles, live status and options, and names
every survivor it cannot finish. Crashes and invalid plans should both be 0.

Run: .venv/bin/python benchmarks/faults.py [cases]   (default 5000; BLITZPLAN_QUICK=1: 60)
Prints what it measured on this machine; nothing is asserted, the README quotes the tables.
"""

from __future__ import annotations

import collections
import os
import platform
import random
import re
import statistics
import sys
import time
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.fault_campaign

from blitzplan._table import format_table
from tests.fault_campaign import KINDS, Outcome, random_case, run_case

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
SEED = 2026


def main() -> None:
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else (60 if QUICK else 5000)
    rng = random.Random(SEED)
    outcomes: list[Outcome] = []
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    started = time.perf_counter()
    for _ in range(cases):
        scenario, failures, fraction = random_case(rng)
        outcome = run_case(scenario, failures, fraction)
        outcomes.append(outcome)
        label = "crash" if outcome.kind == "crash" else ("invalid" if outcome.problems else "ok")
        for kind in _failure_kinds(failures):
            by_kind[kind][outcome.kind if label == "ok" else label] += 1
    wall = time.perf_counter() - started
    plans = [o for o in outcomes if o.kind == "plan"]
    crashes = [o for o in outcomes if o.kind == "crash"]
    invalid = [o for o in outcomes if o.problems and o.kind != "crash"]
    errors = [o for o in outcomes if o.kind == "error"]
    print(
        f"# Fault campaign, {date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, seed {SEED}, {wall:.0f} s"
    )
    print()
    print(
        format_table(
            ["cases", "plans", "clear errors", "crashes", "invalid plans"],
            [
                [
                    len(outcomes),
                    len(plans),
                    len(errors) - len([o for o in errors if o.problems]),
                    len(crashes),
                    len(invalid),
                ]
            ],
        )
    )
    print()
    rows = []
    for kind in KINDS:
        counts = by_kind.get(kind, collections.Counter())
        rows.append(
            [
                kind,
                sum(counts.values()),
                counts["plan"],
                counts["error"],
                counts["crash"],
                counts["invalid"],
            ]
        )
    print(format_table(["failure kind", "cases", "plans", "errors", "crashes", "invalid"], rows))
    print()
    timed = [o for o in plans if o.fresh_s > 0]
    if timed:
        ratios = sorted(o.replan_s / o.fresh_s for o in timed)
        print(
            format_table(
                [
                    "plans timed",
                    "replan median ms",
                    "fresh plan median ms",
                    "replan/fresh median",
                    "replan/fresh p95",
                ],
                [
                    [
                        len(timed),
                        f"{1e3 * statistics.median(o.replan_s for o in timed):.1f}",
                        f"{1e3 * statistics.median(o.fresh_s for o in timed):.1f}",
                        f"{statistics.median(ratios):.2f}",
                        f"{ratios[int(0.95 * (len(ratios) - 1))]:.2f}",
                    ]
                ],
            )
        )
        print()
    messages = collections.Counter(_shape(o.message) for o in errors)
    print(
        format_table(
            ["count", "clear error (numbers elided)"], [[c, m] for m, c in messages.most_common(8)]
        )
    )
    for o in crashes[:10] + invalid[:10]:
        print(f"  !! {o.scenario} {list(o.failures)} at {o.at_s:.3f} s: {o.problems[:2]}")


def _failure_kinds(failures: list[object]) -> list[str]:
    return [_kind_of(f) for f in failures]


_KIND_WORDS = (
    ("nvswitch", "nvswitch"),
    ("/nic", "nic"),
    ("/pcie", "pcie"),
    ("/rc", "rc"),
    ("/mem", "dram"),
    ("/gpu", "gpu"),
    ("leaf", "leaf"),
    ("spine", "spine"),
)


def _kind_of(failure: object) -> str:
    if isinstance(failure, tuple):
        return "link"
    name = str(failure)
    if name.startswith("new"):
        return "new"
    for word, kind in _KIND_WORDS:
        if word in name:
            return kind
    if "/" not in name and name.startswith("h"):
        return "host"
    return "source"


def _shape(message: str) -> str:
    first = message.split("; ")[0]
    return re.sub(r"\d+(\.\d+)?", "N", first)[:110]


if __name__ == "__main__":
    main()
