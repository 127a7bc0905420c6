"""The slot bound run for ``bnb`` under a free O order, its priced choices made schedules.

Every subgradient step of the slot bound (:mod:`blitzplan.live.bound.slots`) leaves each
batch a priced choice: its split, its layers' starts on N and its block's start on O. Made a
schedule (:func:`~blitzplan.live.bound.slots.priced_orders`: the priced splits, O in the
order of the priced starts, N list-scheduled against them), that is a Lagrangian heuristic: the
prices spread the batches' claims on both instances over time, where the N-capacity
relaxation's plan lets them crowd N. Each is offered to the incumbent, the steps aim at the
best known, and the best of them is then polished by the local search of
:mod:`blitzplan.live.improve`, better than the incumbent or not: a start of its own. On
(80,16) seed 0 of ``benchmarks/partition.py`` it went from 1.687 to 1.532 in 3 s where the
incumbent was 1.542; on (32,16) seed 1 `bnb`'s 10 s went from 0.731 to 0.669-0.674.
"""

from __future__ import annotations

import time

from blitzplan.live.bound.slot_prices import SlotPath
from blitzplan.live.bound.slots import priced_orders, slot_bound
from blitzplan.live.exact.common import Start, decode
from blitzplan.live.improve import polish
from blitzplan.live.schedule import Schedule

__all__ = ["priced_search"]


def priced_search(
    start: Start,
    *,
    budget_s: float,
    polish_share: float,
    moves: int,
    slots: int | None = None,
    latency_floor: bool = False,
) -> None:
    """The slot bound from the incumbent's completions and value within ``budget_s`` (its
    bound raises ``start``'s; ``slots`` and ``latency_floor``: its grid, see
    :func:`~blitzplan.live.bound.slots.slot_bound`), every step's priced choices offered as a
    schedule; then the best of those polished for ``polish_share`` of the time left (at most
    ``moves`` moves)."""
    best = start.incumbent
    args = (start.objective, start.old_order, start.backend)
    priced: list[Schedule] = []

    def offer(paths: list[SlotPath]) -> float:
        schedule = decode(start.instance, *priced_orders(start.instance, paths), *args)
        if not priced or schedule.objective < priced[0].objective:
            priced[:] = [schedule]
        start.offer(schedule)
        return start.incumbent.objective

    bound, _ = slot_bound(
        start.instance,
        upper_bound=best.objective,
        time_limit_s=budget_s,
        completion_s=best.completion_s,
        on_paths=offer,
        slots=slots,
        latency_floor=latency_floor,
    )
    start.raise_bound(bound)
    if not priced or start.proven():
        return
    found = polish(
        start.instance,
        priced[0],
        objective=start.objective,
        old_order=start.old_order,
        deadline_s=time.perf_counter() + polish_share * start.left_s(),
        bound=start.bound,
        max_moves=moves,
    )
    start.offer(decode(start.instance, found.split, found.new, found.old, *args))
