"""How many new instances a deadline affords: the planning time measured on a cluster.

``plan()`` with ``deadline_s`` is anytime: the multicast, the live pairs, the milestones and the
program of ``n`` new instances take about ``b * n`` seconds on one cluster, so each plan records
``(n, seconds)`` (from the multicast to the program's end, wall-clock) on the topology it planned
on (its ``memo``, kept with the topology's route caches), and a later plan under a deadline places
only as many instances as the time left affords at ``b``, the median of ``seconds / n`` over the
recent records (the rest go to ``missing``). The median is robust to one slow plan (the first on
a cluster fills its route caches; a busy machine); ``b`` includes each plan's share of what does
not grow with ``n``, so it errs towards planning fewer. The first plan on a topology has no
record and plans everything.
"""

from __future__ import annotations

import math
import statistics

from blitzplan.topologies import Topology

__all__ = ["DEADLINE_SHARE", "KEPT", "affordable", "per_instance_s", "record_rate"]

DEADLINE_SHARE = 0.8
"""The share of the time left a deadline lets the new instances' planning take (the rest covers
what does not grow with them: checks, milestones)."""

KEPT = 8
"""Recent plans kept per topology to fit the line on."""

_KEY = "planning_time"


def record_rate(topology: Topology, instances: int, seconds: float) -> None:
    """Record that planning ``instances`` new instances on ``topology`` took ``seconds``."""
    if instances > 0 and math.isfinite(seconds) and seconds > 0:
        kept = topology.memo.setdefault(_KEY, {}).setdefault("records", [])
        kept.append((instances, seconds))
        del kept[:-KEPT]


def affordable(topology: Topology, count: int, seconds_left: float) -> int:
    """How many of ``count`` new instances fit in ``seconds_left`` on ``topology`` (all of them
    when nothing is recorded)."""
    records = topology.memo.get(_KEY, {}).get("records", [])
    if not records:
        return count
    per = per_instance_s(records)
    budget = max(seconds_left, 0.0) * DEADLINE_SHARE
    return max(0, min(count, math.floor(budget / per)))


def per_instance_s(records: list[tuple[int, float]]) -> float:
    """The median of ``seconds / n`` over ``records``."""
    return statistics.median(seconds / n for n, seconds in records)
