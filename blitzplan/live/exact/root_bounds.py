"""The bounds the exact search (:mod:`blitzplan.live.exact.bnb`) computes once, at a root its
first share of search did not settle: a local search from the incumbent, then under mean
latency and a free O order the slot bound (its priced choices offered as schedules,
:mod:`blitzplan.live.exact.priced`), the capacity bound
(:func:`~blitzplan.live.bound.dp.capacity_bound`), under mean latency and FIFO the busy
bound (:func:`~blitzplan.live.bound.busy.busy_bound`) and, while the gap is still at least
:data:`LAGRANGE_MIN_GAP`, the Lagrangian bound
(:func:`~blitzplan.live.bound.lagrange.lagrangian_bound`), each in its share of the time
left; each stops once the incumbent meets the bound so far."""

from __future__ import annotations

import math
import time

from blitzplan.live.bound.busy import busy_bound, busy_point
from blitzplan.live.bound.dp import capacity_bound
from blitzplan.live.bound.lagrange import FAR_SHARE_OF_LIMIT, far_from, lagrangian_bound
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.slots import slot_setup_s
from blitzplan.live.exact.common import Start
from blitzplan.live.exact.priced import priced_search

__all__ = [
    "BUSY_SHARE_OF_LIMIT",
    "CAPACITY_SHARE_OF_LIMIT",
    "FREE_CAPACITY_SHARE",
    "LAGRANGE_SHARE_OF_LIMIT",
    "POLISH_SHARE_OF_LIMIT",
    "SLOT_SHARE_OF_LIMIT",
    "strengthen",
]

POLISH_SHARE_OF_LIMIT = 0.2
"""The share of the time left after the root that a local search from the incumbent gets."""

POLISH_MOVES = 20_000
"""The most moves that local search tries (a fixed budget: without a time limit, runs repeat)."""

CAPACITY_SHARE_OF_LIMIT = 0.25
"""The share of the time left after the local search that the capacity bound gets."""

CAPACITY_MAX_S = 10.0
"""The capacity bound's budget without a time limit (cut short, it is weaker but valid)."""

LAGRANGE_SHARE_OF_LIMIT = 0.15
"""The share of the time left after the capacity bound that the Lagrangian bound gets (O in
FIFO order, mean latency), when the gap is still at least :data:`LAGRANGE_MIN_GAP`."""

LAGRANGE_MIN_GAP = 0.01
"""Below this relative gap the search, not the Lagrangian bound, is left to close it."""

LAGRANGE_MIN_S = 0.2
"""A Lagrangian budget below this is not started (a step takes 50-100 ms of CPU at 80 layers
and 16 batches)."""

BUSY_SHARE_OF_LIMIT = 0.25
"""The share of the time left after the capacity bound that the busy bound gets (mean latency,
O in FIFO order)."""

SLOT_SHARE_OF_LIMIT = 0.4
"""The share of the time left after the local search that the slot bound gets (mean latency,
free order; :mod:`blitzplan.live.bound.slots`), before the capacity bound. On (80,16) it
is the final bound and rises with its steps (0.5 against 0.25: gaps 22.3 / 18.6 / 27.2% ->
19.6 / 18.1 / 18.2% on three instances); on (32,16) the bounds were equal or higher."""

SLOT_MIN_S = 0.1
"""A slot bound budget below this is not started (a step takes 20-100 ms at these sizes)."""

FREE_CAPACITY_SHARE = 0.5
"""Under a free order, the share of the time left after the slot bound that the capacity
bound gets (:data:`CAPACITY_SHARE_OF_LIMIT` under FIFO): with the pair bound
(:mod:`blitzplan.live.bound.pairs`) its program costs more and gives more (on (32,16) of
``benchmarks/partition.py``, uncut, 0.979-0.997 of the best known on seeds 2, 5, 7, 8 where the
slot bound reaches 0.966-0.978)."""


def strengthen(start: Start, root_bound: float) -> None:
    """Polish ``start``'s incumbent and raise its bound; ``root_bound`` is the search's least
    open bound so far (objective units), the capacity bound's floor. Each bound gets a share
    of the time left when it starts, and none starts past ``start``'s deadline."""
    start.polish(POLISH_SHARE_OF_LIMIT * start.left_s(), max_s=math.inf, moves=POLISH_MOVES)
    if start.proven():
        return
    _slot_bound(start)
    share = FREE_CAPACITY_SHARE if start.old_order == "free" else CAPACITY_SHARE_OF_LIMIT
    budget = min(share * start.left_s(), CAPACITY_MAX_S)
    if start.proven() or budget <= 0:  # none is started past the deadline
        return
    bound = capacity_bound(
        start.instance,
        objective=start.objective,
        old_order=start.old_order,
        lower_bound=max(root_bound, start.bound),
        upper_bound=start.incumbent.objective,
        time_limit_s=budget,
    )
    start.raise_bound(bound)
    _busy_bound(start)
    upper = start.incumbent.objective
    if start.proven() or upper - start.bound < LAGRANGE_MIN_GAP * abs(upper):
        return
    share = FAR_SHARE_OF_LIMIT if far_from(root_bound, upper) else LAGRANGE_SHARE_OF_LIMIT
    budget = min(share * start.left_s(), CAPACITY_MAX_S)
    if budget < LAGRANGE_MIN_S:
        return
    start.raise_bound(
        lagrangian_bound(
            start.instance,
            old_order=start.old_order,
            objective=start.objective,
            upper_bound=upper,
            time_limit_s=budget,
            relaxed=root_bound,
        )
    )


def _busy_bound(start: Start) -> None:
    """The busy bound (mean latency, O in FIFO order; :mod:`blitzplan.live.bound.busy`)
    counted from the layer arrival where the incumbent's splits keep N busiest, in
    :data:`BUSY_SHARE_OF_LIMIT` of the time left (cut short, it claims nothing)."""
    best = start.incumbent
    budget = min(BUSY_SHARE_OF_LIMIT * start.left_s(), CAPACITY_MAX_S)
    wanted = start.objective == "mean_latency" and start.old_order == "fifo"
    if start.proven() or not wanted or not best.has_ops or budget <= 0:
        return
    relax = Relaxation(start.instance, start.objective)
    at = busy_point(relax, best.split)
    until = time.perf_counter() + budget
    bound = busy_bound(relax, relax.obj.scaled(best.objective), at, until)
    start.raise_bound(relax.obj.final(bound))


def _slot_bound(start: Start) -> None:
    """The slot bound (mean latency, O's order free) from the incumbent's completions and
    value, in :data:`SLOT_SHARE_OF_LIMIT` of the time left, when its set-up fits there
    (:func:`~blitzplan.live.bound.slots.slot_setup_s`, stretched by the load seen so far:
    nothing cuts the set-up short). It bounds every order, so
    under FIFO it is far below (0.54-0.76 of the best schedule on (32,16), 0.87-0.94 under
    the free order): it is not run there. Every step's priced choices are offered as a
    schedule, the best of them then polished (:mod:`blitzplan.live.exact.priced`)."""
    best = start.incumbent
    budget = min(SLOT_SHARE_OF_LIMIT * start.left_s(), CAPACITY_MAX_S)
    wanted = start.objective == "mean_latency" and start.old_order == "free"
    setup_s = slot_setup_s(start.instance) * start.slowdown()  # it cannot stop before a step
    if not wanted or not best.has_ops or budget < max(SLOT_MIN_S, setup_s):
        return
    priced_search(start, budget_s=budget, polish_share=POLISH_SHARE_OF_LIMIT, moves=POLISH_MOVES)
