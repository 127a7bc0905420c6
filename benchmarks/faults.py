"""Fault campaign benchmark: replan() after random failures, one plan or two overlapping ones.

Each case is a scenario (six clusters and requests, and seven off-grid models served at another
TP degree), none, one or two failures (a source, a new instance, a GPU, a NIC, a PCIe switch, a
root complex, host DRAM, an NVSwitch, a host, a leaf, the spine or a link) and a time before,
during or after the load; a third of the cases replan a second plan made while the first still
loads (``tests/overlap_campaign.py``). The independent checkers of ``tests/fault_campaign.py``
judge every outcome: a clear error, or a plan valid on what survives that touches no failed
part, resends nothing, keeps roles, live status and options, names every survivor it cannot
finish, and, in bytes, gives every new GPU its buffer once, holds only what the old document's
steps had delivered (``validate_replan``), sends from instances of another TP degree only bytes
their ranks hold, and streams from no instance its own plan can no longer finish.

Run: .venv/bin/python benchmarks/faults.py [cases]   (default 10200; BLITZPLAN_QUICK=1: 60)
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
from tests.overlap_campaign import random_overlap, run_overlap

QUICK = os.environ.get("BLITZPLAN_QUICK") == "1"
SEED = 2026
OVERLAP_SHARE = 1 / 3
DEFECTS = (
    ("two-document byte defects", "across documents:"),
    ("one-document byte defects", "program: "),
    ("holdings the source lacks", ("lacks bytes", "does not hold bytes")),
    ("streams from instances that cannot finish", "streams from "),
)


def main() -> None:
    cases = int(sys.argv[1]) if len(sys.argv) > 1 else (60 if QUICK else 10200)
    rng = random.Random(SEED)
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    while len(outcomes) < cases:
        outcome = _one(rng, timed=len(outcomes) % 10 == 0)
        if outcome is not None:
            outcomes.append(outcome)
    wall = time.perf_counter() - started
    print(
        f"# Fault campaign, {date.today()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, seed {SEED}, {wall:.0f} s"
    )
    print()
    print(_totals(outcomes))
    print()
    print(_bar(outcomes))
    print()
    print(_by_group(outcomes))
    print()
    print(_by_kind(outcomes))
    print()
    print(_timing(outcomes))
    print()
    print(_messages(outcomes))
    for o in [o for o in outcomes if o.problems][:12]:
        print(f"  !! {o.scenario} {list(o.failures)} at {o.at_s:.3f} s: {o.problems[:2]}")


def _one(rng: random.Random, *, timed: bool) -> Outcome | None:
    if rng.random() < OVERLAP_SHARE:
        case = random_overlap(rng)
        return None if case is None else run_overlap(*case)
    scenario, failures, fraction = random_case(rng)
    return run_case(scenario, failures, fraction, time_fresh=timed)


def _label(outcome: Outcome) -> str:
    if outcome.kind == "crash":
        return "crash"
    return "invalid" if outcome.problems else outcome.kind


def _count(outcomes: list[Outcome], needle: str | tuple[str, ...]) -> int:
    needles = (needle,) if isinstance(needle, str) else needle
    return sum(any(any(n in p for n in needles) for p in o.problems) for o in outcomes)


def _totals(outcomes: list[Outcome]) -> str:
    labels = collections.Counter(_label(o) for o in outcomes)
    return format_table(
        ["cases (replans)", "plans", "clear errors", "crashes", "invalid"],
        [[len(outcomes), labels["plan"], labels["error"], labels["crash"], labels["invalid"]]],
    )


def _bar(outcomes: list[Outcome]) -> str:
    planned = [o for o in outcomes if o.kind == "plan"]
    return format_table(
        ["issue 18 bar, over every planned replan", "cases with it"],
        [[name, _count(planned, needle)] for name, needle in DEFECTS],
    )


def _by_group(outcomes: list[Outcome]) -> str:
    rows = []
    groups = {
        "one plan": lambda o: o.group == "one plan",
        "off-grid model, other TP": lambda o: o.group == "off-grid",
        "overlapping plans": lambda o: o.group == "overlap",
        "no failure (any group)": lambda o: not o.failures,
    }
    for name, member in groups.items():
        mine = [o for o in outcomes if member(o)]
        labels = collections.Counter(_label(o) for o in mine)
        rows.append(
            [name, len(mine), labels["plan"], labels["error"], labels["crash"], labels["invalid"]]
        )
    return format_table(["cases", "count", "plans", "errors", "crashes", "invalid"], rows)


def _by_kind(outcomes: list[Outcome]) -> str:
    by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for outcome in outcomes:
        for kind in [_kind_of(f) for f in outcome.failures] or ["none"]:
            by_kind[kind][_label(outcome)] += 1
    rows = [
        [kind, sum(c.values()), c["plan"], c["error"], c["crash"], c["invalid"]]
        for kind in (*KINDS, "none")
        for c in [by_kind.get(kind, collections.Counter())]
    ]
    return format_table(["failure kind", "cases", "plans", "errors", "crashes", "invalid"], rows)


def _timing(outcomes: list[Outcome]) -> str:
    timed = [o for o in outcomes if o.kind == "plan" and o.fresh_s > 0]
    if not timed:
        return "(no replan timed)"
    ratios = sorted(o.replan_s / o.fresh_s for o in timed)
    return format_table(
        ["plans timed", "replan median ms", "fresh plan median ms", "ratio median", "ratio p95"],
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


def _messages(outcomes: list[Outcome]) -> str:
    errors = [o for o in outcomes if o.kind == "error"]
    shapes = collections.Counter(_shape(o.message) for o in errors)
    return format_table(
        ["count", "clear error (numbers elided)"], [[c, m] for m, c in shapes.most_common(10)]
    )


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
