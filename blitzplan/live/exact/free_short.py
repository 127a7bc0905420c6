"""The root bounds of a short call (:data:`~blitzplan.live.exact.root_bounds.CAPACITY_SHORT_S`)
under a free O order and the mean latency.

There the capacity program (:func:`~blitzplan.live.bound.dp.capacity_bound`, with the pair
bound of :mod:`blitzplan.live.bound.last_blocks`) either ends within a few hundredths of a
second and is then the strongest bound ((32,8) of ``benchmarks/partition.py``: 0.03-0.05 CPU s,
0.995-0.997 of the 1 s incumbent, where the slot bound gave 0.97 in 0.37 s), or needs seconds
((32,16): 0.5-16 s) and, cut short, gives nothing above its floor. So it runs first, as a
probe in :data:`FREE_PROBE_SHARE` of the time left; if it ended, the slot bound is skipped;
if not, the slot bound (:mod:`blitzplan.live.bound.slots`, its priced choices offered as
schedules: :mod:`blitzplan.live.exact.priced`) gets :data:`FREE_SLOT_SHARE` of the time left,
where it rises with its steps."""

from __future__ import annotations

import time

from blitzplan.live.bound.dp import SEARCH_SHARE, capacity_bound
from blitzplan.live.bound.slots import slot_setup_s
from blitzplan.live.exact.common import Start
from blitzplan.live.exact.priced import priced_search

__all__ = ["FREE_PROBE_SHARE", "FREE_SLOTS", "FREE_SLOT_SHARE", "free_short_bounds"]

FREE_PROBE_SHARE = 0.15
"""The share of the time left the capacity program gets first in a short free call."""

FREE_SLOT_SHARE = 0.75
"""The share of the time left the slot bound gets after a probe that did not end."""

FREE_SLOTS = 100
"""The slot bound's grid there, with the program's latency floor."""

SLOT_MIN_S = 0.1
"""A slot bound budget below this is not started (a step takes 20-100 ms at these sizes)."""


def free_short_bounds(start: Start, root_bound: float, polish_share: float, moves: int) -> bool:
    """The capacity program as a probe, then (unless it ended) the slot bound; True when the
    capacity program ended (see the module docstring). ``polish_share`` and ``moves``: the
    local search after the slot bound's priced schedules."""
    budget = FREE_PROBE_SHARE * start.left_s()
    if start.proven() or budget <= 0:
        return False
    began = time.perf_counter()
    bound = capacity_bound(
        start.instance,
        objective=start.objective,
        old_order=start.old_order,
        lower_bound=max(root_bound, start.bound),
        upper_bound=start.incumbent.objective,
        time_limit_s=budget,
    )
    ended = time.perf_counter() - began < SEARCH_SHARE * budget
    start.raise_bound(bound)
    if ended or start.proven():
        return ended
    slot_s = FREE_SLOT_SHARE * start.left_s()
    setup_s = slot_setup_s(start.instance) * start.slowdown()
    if start.incumbent.has_ops and slot_s >= max(SLOT_MIN_S, setup_s):
        priced_search(
            start,
            budget_s=slot_s,
            polish_share=polish_share,
            moves=moves,
            slots=FREE_SLOTS,
            latency_floor=True,
        )
    return False
