"""The slot bound run for ``bnb`` under a free O order, its priced choices made schedules.

Every subgradient step of the slot bound (:mod:`blitzplan.live.bound.slots`) leaves each
batch a priced choice: its split, its layers' starts on N and its block's start on O. Made a
schedule (:func:`~blitzplan.live.bound.slots.priced_orders`: the priced splits, O in the
order of the priced starts, N list-scheduled against them), that is a Lagrangian heuristic: the
prices spread the batches' claims on both instances over time, where the N-capacity
relaxation's plan lets them crowd N. Each is offered to the incumbent, the steps aim at the
best known, and the best of them (up to :data:`PRICED_STARTS` distinct values, best first,
each in an even share of the time left for them) are then polished by the local search of
:mod:`blitzplan.live.improve`, better than the incumbent or not: starts of their own. On
(80,16) seed 0 of ``benchmarks/partition.py`` it went from 1.687 to 1.532 in 3 s where the
incumbent was 1.542; on (32,16) seed 1 `bnb`'s 10 s went from 0.731 to 0.669-0.674. Where a
start ends depends much on which it is (the split jumps decide most): on (80,16) seed 0 under
a free order the 8 best priced schedules of 2.5 s of steps (1.620-1.712) ended at 1.480-1.541
after the jumps and 0.3 s of moves, the best priced one at 1.485, the 2nd at 1.541
(docs/benchmarks.md, s23-h3).
"""

from __future__ import annotations

import time

from blitzplan.live.bound.slot_prices import SlotPath
from blitzplan.live.bound.slots import priced_orders, slot_bound, slot_setup_s
from blitzplan.live.exact.common import Start, decode
from blitzplan.live.improve import polish
from blitzplan.live.schedule import Schedule

__all__ = [
    "FREE_POLISH_SHARE",
    "POLISH_MOVES",
    "POLISH_SHARE_OF_LIMIT",
    "PRICED_POLISH_SHARE",
    "PRICED_STARTS",
    "SHORT_SLOTS",
    "SLOT_MIN_S",
    "polish_priced",
    "polish_shares",
    "priced_search",
    "slot_search",
    "slot_wanted",
]

PRICED_STARTS = 4
"""The most priced schedules (the best distinct values of the steps) that are polished, by
default (:mod:`~blitzplan.live.exact.root_bounds` polishes the best alone in a short call)."""


POLISH_SHARE_OF_LIMIT = 0.2
"""The share of the time left after the root that a local search from the incumbent gets
(:func:`~blitzplan.live.exact.root_bounds.strengthen`), and the polish of the priced schedules
after it, by default (:func:`polish_shares`)."""

PRICED_POLISH_SHARE = 0.4
"""Under a free order (mean latency), the share of the time left after the slot bound that
the polish of its best priced schedules gets (:func:`polish_priced`); the local
search from the incumbent before it then gets :data:`FREE_POLISH_SHARE`: on (80,16) the priced
starts, polished, end 2-5% below it (docs/benchmarks.md, s23-h3)."""

FREE_POLISH_SHARE = 0.05
"""The share of the time left after the root that the local search from the incumbent gets in
place of :data:`POLISH_SHARE_OF_LIMIT` where the slot bound runs after it (mean latency, a free
order; see :data:`PRICED_POLISH_SHARE`)."""

POLISH_MOVES = 20_000
"""The most moves that local search tries (a fixed budget: without a time limit, runs repeat)."""

SHORT_SLOTS = 100
"""The slot bound's grid in a short call
(:data:`~blitzplan.live.exact.root_bounds.CAPACITY_SHORT_S`), with its program's
latency floor (:class:`~blitzplan.live.bound.slot_prices.SlotPrices`), in place of
:data:`~blitzplan.live.bound.slot_prices.SLOTS` = 250 without it: its steps are cheaper and,
on (32,16) free of ``benchmarks/partition.py``, 100 such slots in 0.4 CPU s bounded about as
high as 250 in 0.7 s. 1 CPU s calls, seeds 0-9, free order, mean gap, base and this in one
run: (32,16) 6.22 -> 5.70%, (40,12) 1.82 -> 1.44%, (80,16) 25.6 -> 14.2% (a bound higher and
incumbents from more priced steps; docs/benchmarks.md, s23-h4)."""

SLOT_MIN_S = 0.1
"""A slot bound budget below this is not started (a step takes 20-100 ms at these sizes)."""


def slot_wanted(start: Start) -> bool:
    """Whether the slot bound is for ``start``: mean latency, O's order free."""
    return start.objective == "mean_latency" and start.old_order == "free"


def slot_search(
    start: Start,
    budget_s: float,
    *,
    short: bool = False,
    polish_share: float = POLISH_SHARE_OF_LIMIT,
    starts: int = 1,
) -> list[Schedule]:
    """:func:`priced_search` in ``budget_s`` where the slot bound is for ``start``
    (:func:`slot_wanted`) and its set-up fits there
    (:func:`~blitzplan.live.bound.slots.slot_setup_s`, stretched by the load seen so far:
    nothing cuts the set-up short); in a ``short`` call on :data:`SHORT_SLOTS` slots with the
    latency floor. The slot bound bounds every order, so under FIFO it is far below (0.54-0.76
    of the best schedule on (32,16), 0.87-0.94 under the free order): it is not run there.
    Returns the priced schedules kept (none where it did not run)."""
    setup_s = slot_setup_s(start.instance) * start.slowdown()  # it cannot stop before a step
    if not slot_wanted(start) or not start.incumbent.has_ops or budget_s < max(SLOT_MIN_S, setup_s):
        return []
    return priced_search(
        start,
        budget_s=budget_s,
        polish_share=polish_share,
        moves=POLISH_MOVES,
        slots=SHORT_SLOTS if short else None,
        latency_floor=short,
        starts=starts,
    )


def polish_shares(start: Start, *, short: bool) -> tuple[float, float, int]:
    """The shares of the time left that the local search from the incumbent and the polish of
    the slot bound's priced schedules get, and how many priced schedules are polished:
    :data:`FREE_POLISH_SHARE`, :data:`PRICED_POLISH_SHARE` and :data:`PRICED_STARTS` where the
    slot bound is for ``start`` (:func:`slot_wanted`) in a call not ``short``, else
    :data:`POLISH_SHARE_OF_LIMIT` both and the best priced schedule alone."""
    if slot_wanted(start) and not short:
        return FREE_POLISH_SHARE, PRICED_POLISH_SHARE, PRICED_STARTS
    return POLISH_SHARE_OF_LIMIT, POLISH_SHARE_OF_LIMIT, 1


def priced_search(
    start: Start,
    *,
    budget_s: float,
    polish_share: float,
    moves: int,
    slots: int | None = None,
    latency_floor: bool = False,
    starts: int = PRICED_STARTS,
) -> list[Schedule]:
    """The slot bound from the incumbent's completions and value within ``budget_s`` (its
    bound raises ``start``'s; ``slots`` and ``latency_floor``: its grid, see
    :func:`~blitzplan.live.bound.slots.slot_bound`), every step's priced choices offered as a
    schedule; then the ``starts`` best distinct of those polished (:func:`polish_priced`) in
    ``polish_share`` of the time left (none at 0). Returns them, best first, unpolished."""
    best = start.incumbent
    args = (start.objective, start.old_order, start.backend)
    priced: dict[float, Schedule] = {}

    def offer(paths: list[SlotPath]) -> float:
        schedule = decode(start.instance, *priced_orders(start.instance, paths), *args)
        _keep(priced, schedule, starts)
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
    kept = sorted(priced.values(), key=lambda schedule: schedule.objective)
    if polish_share > 0:
        polish_priced(start, kept, polish_share=polish_share, moves=moves)
    return kept


def polish_priced(start: Start, kept: list[Schedule], *, polish_share: float, moves: int) -> None:
    """Polish each of ``kept`` (priced schedules, best first) by local search, better than the
    incumbent or not, in even shares of ``polish_share`` of the time left (at most ``moves``
    moves each), and offer what it ends at."""
    args = (start.objective, start.old_order, start.backend)
    deadline = time.perf_counter() + polish_share * start.left_s()
    for count, schedule in enumerate(kept):
        now = time.perf_counter()
        if start.proven() or now >= deadline:
            return
        found = polish(
            start.instance,
            schedule,
            objective=start.objective,
            old_order=start.old_order,
            deadline_s=now + (deadline - now) / (len(kept) - count),
            bound=start.bound,
            max_moves=moves,
        )
        start.offer(decode(start.instance, found.split, found.new, found.old, *args))


def _keep(priced: dict[float, Schedule], schedule: Schedule, most: int) -> None:
    """Keep ``schedule`` among the ``most`` best distinct values in ``priced``."""
    if schedule.objective in priced:
        return
    priced[schedule.objective] = schedule
    if len(priced) > most:
        del priced[max(priced)]
