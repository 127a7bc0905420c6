"""How many new instances a deadline affords: the planning time measured on a cluster.

``plan()`` with ``deadline_s`` is anytime: the multicast, the program and the live pairs of ``n``
new instances take about ``a + b * n`` seconds on one cluster, so each plan records ``(n,
seconds)`` (from the multicast on, wall-clock) on the topology it planned on (its ``memo``, kept
with the topology's route caches), and a later plan under a deadline places only as many
instances as the time left affords on the least-squares line through the recent records (the rest
go to ``missing``). The first plan on a topology has no record and plans everything.
"""

from __future__ import annotations

import math

from blitzplan.topologies import Topology

__all__ = ["DEADLINE_SHARE", "KEPT", "affordable", "record_rate"]

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
    fixed, per = _line(records)
    budget = max(seconds_left, 0.0) * DEADLINE_SHARE - fixed
    return max(0, min(count, math.floor(budget / per))) if per > 0 else count


def _line(records: list[tuple[int, float]]) -> tuple[float, float]:
    """``(a, b)`` of ``seconds = a + b * n`` through ``records`` (least squares, ``a, b >= 0``;
    with one size recorded, ``a = 0``)."""
    n = len(records)
    mean_x = sum(x for x, _ in records) / n
    mean_y = sum(y for _, y in records) / n
    spread = sum((x - mean_x) ** 2 for x, _ in records)
    if spread == 0:
        return 0.0, mean_y / mean_x
    slope = sum((x - mean_x) * (y - mean_y) for x, y in records) / spread
    if slope <= 0:
        return 0.0, mean_y / mean_x
    return max(0.0, mean_y - slope * mean_x), slope
