"""How many new instances a deadline affords: the planning time measured on a cluster.

``plan()`` with ``deadline_s`` is anytime: a call that plans ``n`` new instances takes about
``a + b * n`` seconds on one cluster, so each plan records ``(n, seconds)`` (the whole call,
wall-clock) on the topology it planned on (its ``memo``, kept with the topology's route caches),
and a later plan under a deadline places only as many instances as the deadline affords on the
line through the recent records (the rest go to ``missing``); a deadline that affords none
(shorter than the cheapest plan, ``a``) gets a plan of nothing at once
(:mod:`blitzplan.scale.deadline`). The line is Siegel's repeated medians (:func:`planning_line`), so
one slow plan (the first on a cluster fills its route caches; a busy machine) moves it little.
The first plan on a topology has no record and plans everything.
"""

from __future__ import annotations

import math
import statistics

from blitzplan.topologies import Topology

__all__ = ["DEADLINE_SHARE", "KEPT", "affordable", "planning_costs", "planning_line", "record_rate"]

DEADLINE_SHARE = 0.8
"""The share of a deadline the line's estimate may fill (the rest is headroom for a call slower
than the recent ones)."""

KEPT = 8
"""Recent plans kept per topology to fit the line on."""

_KEY = "planning_time"


def record_rate(topology: Topology, instances: int, seconds: float) -> None:
    """Record that planning ``instances`` new instances on ``topology`` took ``seconds``. A plan
    of none (a deadline that afforded nothing) is kept apart, the latest only: it pins the line's
    intercept, so a line that once afforded nothing gets corrected."""
    if instances < 0 or not math.isfinite(seconds) or seconds <= 0:
        return
    book = topology.memo.setdefault(_KEY, {})
    if instances == 0:
        book["none"] = seconds
        return
    kept = book.setdefault("records", [])
    kept.append((instances, seconds))
    del kept[:-KEPT]


def affordable(topology: Topology, count: int, seconds: float, used_s: float = 0.0) -> int:
    """How many of ``count`` new instances a call of ``seconds`` affords on ``topology``, when
    ``used_s`` of them are spent (a call already slower than the line's fixed part has less
    left); all of them when no plan of some instances is recorded."""
    line = planning_costs(topology)
    if line is None:
        return count
    fixed, per = line
    budget = max(seconds, 0.0) * DEADLINE_SHARE - max(fixed, used_s)
    return max(0, min(count, math.floor(budget / per)))


def planning_costs(topology: Topology) -> tuple[float, float] | None:
    """``(a, b)``: a plan of ``n`` new instances on ``topology`` takes about ``a + b * n``
    seconds (:func:`planning_line` through the recent records; None before any)."""
    book = topology.memo.get(_KEY, {})
    records = book.get("records", [])
    if not records:
        return None
    return planning_line(records + ([(0, book["none"])] if "none" in book else []))


def planning_line(records: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b * n`` through ``records`` (Siegel's repeated medians: per
    record the median slope to the records of other sizes, ``b`` the median of those, ``a`` the
    median intercept; ``a >= 0``; with one size recorded or no rising slope, ``a = 0`` and ``b``
    the median of ``seconds / n``)."""
    slopes = []
    for n1, s1 in records:
        mine = [(s2 - s1) / (n2 - n1) for n2, s2 in records if n2 != n1]
        if mine:
            slopes.append(statistics.median(mine))
    per = statistics.median(slopes) if slopes else 0.0
    if per <= 0:
        return 0.0, statistics.median(seconds / n for n, seconds in records if n > 0)
    return max(0.0, statistics.median(seconds - per * n for n, seconds in records)), per
