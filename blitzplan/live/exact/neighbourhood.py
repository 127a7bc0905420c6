"""A large-neighbourhood search on the exact search's incumbent (:mod:`blitzplan.live.exact.bnb`).

Late in a search whose gap is small, the incumbent, not the bound, can hold the proof back:
on (40,12) FIFO seed 0 of ``benchmarks/partition.py`` a 10 s search ended at 0.8333 against a
bound of 0.8305, and a 60 s one found 0.830565 (docs/benchmarks.md, s17-h1). Here each step
frees a window of :data:`WINDOW` consecutive batches (each may run up to :data:`REACH` layers
more or fewer on N than in the incumbent), fixes every other batch's split to the incumbent's,
and solves that neighbourhood on CP-SAT under the incumbent's value
(:func:`~blitzplan.live.exact.node_cpsat.node_cpsat`, N's order and O's free within it). The
windows move by half a window a step, around the batches, from the incumbent of the moment.

What CP-SAT proves about a neighbourhood holds only there: no bound is taken from it. A
schedule it finds is offered to the incumbent, which keeps it only when the independent
checker passes it and it is better. The search stops at ``until_s``, once the incumbent is
proven, or after a round of windows around the batches that found nothing better (one worker,
each window's time capped: a second round from the same incumbent would repeat the first).
"""

from __future__ import annotations

import math
import time

from blitzplan.live.exact.common import Start
from blitzplan.live.exact.node_cpsat import (
    MIN_SOLVE_S,
    NODE_CPSAT_OBJECTIVES,
    _cp_model,
    node_cpsat,
)
from blitzplan.live.relaxation import Restriction

__all__ = ["CALL_MAX_S", "GAP", "REACH", "SHARE", "WINDOW", "neighbourhood_search"]

GAP = 0.001
"""The search is started only once the relative gap between the incumbent and the bound (the
exact search's own, or ``start``'s when higher) is at most this. One call at a time (load
3.3-4), (40,12) FIFO seed 0 was proven in 9.1 s so (without the search: 0.0033% gap at 10 s)
and seed 2 in 8.3 s (without: 8.6 s); started at 1%, 3 s into the call, it took time from the
search's CP-SAT nodes, which were still improving the incumbent, and proved neither."""

SHARE = 0.3
"""The share of the time left (to ``until_s``) that the search gets."""

WINDOW = 4
"""How many consecutive batches (by index) one step frees. On (40,12) FIFO seeds 0 and 2, from
their 10 s incumbents, windows of 4 at a reach of 2 found 0.830735 and 0.61338 in 4 s (0.8333
and 0.61427 before); the whole incumbent's neighbourhood at a reach of 1 found nothing in 3 s on
seed 2 (s17-h1)."""

REACH = 2
"""How many layers more or fewer on N a freed batch may run than in the incumbent."""

CALL_MAX_S = 0.5
"""The most time one window gets on CP-SAT, its model's making included."""


def neighbourhood_search(
    start: Start, until_s: float, *, search_bound: float = -math.inf
) -> int | None:
    """Improve ``start``'s incumbent window by window for :data:`SHARE` of the time to
    ``until_s`` (a ``time.perf_counter()`` instant; never past ``start``'s deadline); the
    number of windows given to CP-SAT, or None (nothing done) while the gap to the higher of
    ``search_bound`` and ``start``'s bound is above :data:`GAP`. Nothing is done either
    without a schedule with operations, for an objective CP-SAT's cap is not written for, or
    without OR-Tools at hand (0 windows)."""
    upper, lower = start.incumbent.objective, max(start.bound, search_bound)
    if not math.isfinite(upper) or upper - lower > GAP * abs(upper):
        return None
    if start.objective not in NODE_CPSAT_OBJECTIVES or _cp_model(start) is None:
        return 0
    n, L = start.instance.num_batches, start.instance.num_layers
    window, step = min(WINDOW, n), max(1, min(WINDOW, n) // 2)
    calls = first = idle = 0
    longest_s = MIN_SOLVE_S
    now = time.perf_counter()
    until_s = now + SHARE * (min(until_s, start.deadline_s) - now)
    while not start.proven() and start.incumbent.has_ops and idle < n:
        left_s = until_s - time.perf_counter()
        if left_s < longest_s:  # a window's model alone might not be made in time
            break
        split = start.incumbent.split
        free = {(first + j) % n for j in range(window)}
        low = tuple(max(0, k - REACH) if i in free else k for i, k in enumerate(split))
        high = tuple(min(L, k + REACH) if i in free else k for i, k in enumerate(split))
        before = start.incumbent.objective
        began = time.perf_counter()
        restriction = Restriction(low, high, ((),) * n)
        solved = node_cpsat(start, restriction, before, min(CALL_MAX_S, left_s))
        longest_s = max(longest_s, min(time.perf_counter() - began, CALL_MAX_S))
        calls += 1
        if solved is not None and solved.schedule is not None:
            start.offer(solved.schedule)
        idle = 0 if start.incumbent.objective < before else idle + step
        first = (first + step) % n
    return calls
