"""The root bounds of a short call (:data:`~blitzplan.live.exact.root_bounds.CAPACITY_SHORT_S`)
under a free O order and the mean latency.

There the capacity program (:func:`~blitzplan.live.bound.dp.capacity_bound`, with the pair
bound of :mod:`blitzplan.live.bound.last_blocks`) either ends within a few hundredths of a
second and is then the strongest bound ((32,8) of ``benchmarks/partition.py``: 0.03-0.05 CPU s,
0.995-0.997 of the 1 s incumbent, where the slot bound gave 0.97 in 0.37 s), or needs seconds
((32,16): 0.5-16 s) and, cut short, gives nothing above its floor. So it runs first, as a
probe in :data:`FREE_PROBE_SHARE` of the time left; if it ended, nothing follows. If not, the
slot bound (:mod:`blitzplan.live.bound.slots`, its priced choices offered as schedules:
:mod:`blitzplan.live.exact.priced`) gets :data:`FREE_SLOT_SHARE` of the time left, at most
:data:`FREE_SLOT_MAX_S`, on a coarser grid with the program's latency floor
(:data:`FREE_SLOTS`: on (32,16) 100 such slots in 0.4 CPU s bounded about as high as the
default 250 in 0.7 s), and then, where a call leaves it more time than the probe had (2-5 s
calls), the capacity program again from the slot bound's floor.

1 CPU s calls, seeds 0-19 (docs/benchmarks.md, s23-h4): (32,16) free mean gap 6.76 -> 5.30%
(max 13.5 -> 11.0%: a bound 0.5-1.7 points higher, and incumbents from the slot bound's
longer steps), (32,8) free unchanged (17 of 20 proven, the rest at 0.3-0.5%); 3 CPU s, seeds
0-9, (32,16) free 3.55 -> 3.45%. Under FIFO nothing changes."""

from __future__ import annotations

import time

from blitzplan.live.bound.dp import SEARCH_SHARE, capacity_bound
from blitzplan.live.bound.slots import slot_setup_s
from blitzplan.live.exact.common import Start
from blitzplan.live.exact.priced import priced_search

__all__ = [
    "FREE_AGAIN_SHARE",
    "FREE_PROBE_SHARE",
    "FREE_SLOTS",
    "FREE_SLOT_MAX_S",
    "FREE_SLOT_SHARE",
    "free_short_bounds",
]

FREE_PROBE_SHARE = 0.15
"""The share of the time left the capacity program gets first in a short free call: on
(32,8) free it ends there (0.03-0.05 CPU s of about 0.1); with 0.1 it was cut short on seeds 1
and 10 (gaps 0.49 / 0.32 -> 1.84 / 1.92%)."""

FREE_SLOT_SHARE = 0.75
"""The share of the time left the slot bound gets after a probe that did not end."""

FREE_SLOT_MAX_S = 0.6
"""The most the slot bound gets there."""

FREE_AGAIN_SHARE = 0.75
"""After the slot bound, the capacity program gets this share of the time left (from the slot
bound's floor), where that is more than the probe had."""

FREE_SLOTS = 100
"""The slot bound's grid there, with the program's latency floor."""

SLOT_MIN_S = 0.1
"""A slot bound budget below this is not started (a step takes 20-100 ms at these sizes)."""


def free_short_bounds(start: Start, root_bound: float, polish_share: float, moves: int) -> bool:
    """The capacity program as a probe, then (unless it ended) the slot bound and, given the
    time, the capacity program again; True when a capacity program ended (see the module
    docstring). ``root_bound``: the search's bound so far, the probe's floor; ``polish_share``
    and ``moves``: the local search after the slot bound's priced schedules."""
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
    slot_s = min(FREE_SLOT_SHARE * start.left_s(), FREE_SLOT_MAX_S)
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
    again = FREE_AGAIN_SHARE * start.left_s()
    if start.proven() or again <= budget:  # no more time than the probe had
        return False
    began = time.perf_counter()
    bound = capacity_bound(
        start.instance,
        objective=start.objective,
        old_order=start.old_order,
        lower_bound=start.bound,
        upper_bound=start.incumbent.objective,
        time_limit_s=again,
    )
    start.raise_bound(bound)
    return time.perf_counter() - began < SEARCH_SHARE * again
