"""The bounds the exact search (:mod:`blitzplan.live.exact.bnb`) computes once, at a root its
first share of search did not settle: a local search from the incumbent, then under mean
latency and a free O order the slot bound (its priced choices offered as schedules,
:mod:`blitzplan.live.exact.priced`) and the capacity bound
(:func:`~blitzplan.live.bound.dp.capacity_bound`), each in its share of the time left; each
stops once the incumbent meets the bound so far. The time left goes to the search. Under a
free order the capacity program first gets a small share (:data:`CAPACITY_PROBE_SHARE`):
where it ends there it is the root's program, and where the gap it leaves is narrow
(:data:`SLOT_SKIP_GAP`) the slot bound's priced schedules are not polished.

A short call (a few seconds: :data:`CAPACITY_SHORT_S`) is ordered for the strongest bound
it can return: where the relaxation is far from the incumbent the Lagrangian bound's first
steps (:func:`~blitzplan.live.bound.lagrange.lagrangian_bound`) come first (the cheapest lift,
kept at once), then the capacity program gets most of the time (it ends there on small
instances and is then the strongest), under mean latency and FIFO the busy bound
(:func:`~blitzplan.live.bound.busy.busy_bound`) runs near the incumbent, and the search after
them branches without the nodes' capacity programs (:class:`Strengthened`); under a free
order the slot bound there runs on a coarser grid with its program's latency floor
(:data:`~blitzplan.live.exact.priced.SHORT_SLOTS`) and with more of the time
(:data:`SHORT_SLOT_SHARE`), the capacity program after it is a probe
(:data:`SHORT_PROBE_SHARE`: where it ends it is the strongest bound; on (32,16) it mostly
cannot end in a second), and the slot bound's best priced
schedules are polished after the probe, with the time left where it did not end. A long
call runs neither the busy bound nor the Lagrangian bound after the capacity program: on the
benchmark's classes at 10 CPU s (seeds 0-9, both orders) each ran and never ended above the
capacity bound (docs/benchmarks.md, s24-h5); the nodes keep the busy bound
(:mod:`blitzplan.live.exact.node_bound`)."""

from __future__ import annotations

import math
import time
from typing import NamedTuple

from blitzplan.live.bound.busy import busy_bound, busy_point
from blitzplan.live.bound.dp import CAPACITY_FIRST_STEP, SEARCH_SHARE, capacity_bound
from blitzplan.live.bound.lagrange import far_from, lagrangian_bound
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.exact.common import Start
from blitzplan.live.exact.offers import Offers
from blitzplan.live.exact.priced import (
    POLISH_MOVES,
    polish_priced,
    polish_shares,
    slot_search,
    slot_wanted,
)
from blitzplan.live.schedule import Schedule

__all__ = [
    "BUSY_SHORT_GAP",
    "BUSY_SHORT_SHARE",
    "CAPACITY_FLOOR_S",
    "CAPACITY_PROBE_SHARE",
    "CAPACITY_SHARE_OF_LIMIT",
    "CAPACITY_SHORT_S",
    "CAPACITY_SHORT_SHARE",
    "FREE_CAPACITY_SHARE",
    "FREE_FIRST_STEP",
    "QUICK_LAGRANGE_SHARE",
    "SHORT_NODE_CAPACITY",
    "SHORT_PRICED_SHARE",
    "SHORT_PRICED_STARTS",
    "SHORT_PROBE_MIN_S",
    "SHORT_PROBE_SHARE",
    "SHORT_SLOT_SHARE",
    "SLOT_SHARE_OF_LIMIT",
    "SLOT_SKIP_GAP",
    "Strengthened",
    "strengthen",
]

CAPACITY_SHARE_OF_LIMIT = 0.25
"""The share of the time left after the local search that the capacity bound gets."""

CAPACITY_MAX_S = 10.0
"""The capacity bound's budget without a time limit (cut short, it is weaker but valid)."""

CAPACITY_SHORT_S = 1.0
"""A short call: :data:`CAPACITY_SHARE_OF_LIMIT` of the time left is under this (limits under
about 5.5 s; see :class:`Strengthened` for what changes there). On (32,16) FIFO the short path
beat the long one at 3 and 5 CPU s (mean gap 0.93 -> 0.50%, 0.87 -> 0.48%: seed 1 4.3 -> 0.9%,
its capacity program ending from the quick Lagrangian's floor; seeds 4, 7, 9 lost 0.006-0.035
point of the nodes' programs' lifts); at 10 s the long path stays (docs/benchmarks.md, s22-h4)."""

CAPACITY_FLOOR_S = 1.2
"""The capacity program gets at least this, where :data:`CAPACITY_SHORT_SHARE` of the time
left allows (else that share), in place of :data:`CAPACITY_SHARE_OF_LIMIT`: on
(32,16) FIFO of ``benchmarks/partition.py`` it ends in 0.12-0.3 CPU s on 7 of the 8 seeds
the search does not settle first (seed 1: 0.9) at 0.980-0.9998 of the 1 s incumbent, where
cut short at 0.15 s (its share of a 1 s call) it gave 0.83-0.99. With the rest of the short
path, 1 CPU s calls: (32,16) FIFO mean gap 5.35 -> 1.01%, (80,16) FIFO 12.3 -> 3.8%, (40,12)
and (80,8) FIFO within 0.01 point. Seed 1's program needs 0.83-1.1 s: with 0.5 s at most
it stayed 4.3-4.5% under the incumbent in 2 and 3 s calls (docs/benchmarks.md, s22-h4)."""

CAPACITY_SHORT_SHARE = 0.75
"""The most of the time left the capacity program's floor takes (see
:data:`CAPACITY_FLOOR_S`)."""

QUICK_LAGRANGE_SHARE = 0.15
"""In a short call (see :data:`CAPACITY_SHORT_S`), where the relaxation is far from the
incumbent, the Lagrangian bound first gets this share of the time left: its first steps are
the cheapest lift there (on (32,16) FIFO seed 1 0.82 -> 0.94 of the incumbent in 0.1 s, where
the capacity program needs 0.9 s to end), kept at once, and the capacity program starts from
it."""

BUSY_SHORT_GAP = 0.01
"""In a short call (:data:`CAPACITY_SHORT_S`) the busy bound runs only while the gap is under
this (relatively): on (32,16) FIFO, where it was wider after the capacity program (seeds 1, 2,
5, 8), the busy bound alone needed 0.75-4.3 s and ended under the capacity bound."""

BUSY_SHORT_SHARE = 0.75
"""The share of the time left the busy bound gets in a short call (see :data:`BUSY_SHORT_GAP`):
on (32,16) FIFO seed 4 it ends in 0.17-0.3 s and lifts the capacity bound from 0.9958 to
0.9994 of the incumbent (at 1 s, 0.5 of the time left was too little for it once the
incumbent was 0.1% worse; on (40,12) FIFO 0.5 and 0.75 gave the same bounds)."""

SHORT_NODE_CAPACITY = False
"""Whether the search after the root bounds of a short call gives its nodes their capacity
program (:data:`~blitzplan.live.exact.bnb.NODE_CAPACITY`): on (32,16) FIFO at 1 s, 1-3 such
programs fit there and lifted no bound but by their busy bound (now the root's, see
:data:`BUSY_SHORT_SHARE`); branching without them, the search's relaxed plans lowered the
incumbent of seed 3 by 0.47% and of seed 5 by 0.55%. On (40,12) and (80,8) FIFO they lifted
three bounds by 0.1-0.2 per mille."""

SLOT_SHARE_OF_LIMIT = 0.4
"""The share of the time left after the local search that the slot bound gets (mean latency,
free order; :mod:`blitzplan.live.bound.slots`), before the capacity bound. On (80,16) it
is the final bound and rises with its steps (0.5 against 0.25: gaps 22.3 / 18.6 / 27.2% ->
19.6 / 18.1 / 18.2% on three instances); on (32,16) the bounds were equal or higher."""

FREE_CAPACITY_SHARE = 0.75
"""Under a free order, the share of the time left after the slot bound that the capacity
bound gets (:data:`CAPACITY_SHARE_OF_LIMIT` under FIFO): with the pair bound
(:mod:`blitzplan.live.bound.last_blocks`) its program costs more and gives more (on (32,16) of
``benchmarks/partition.py``, uncut, 0.979-0.997 of the best known on seeds 2, 5, 7, 8 where the
slot bound reaches 0.966-0.978)."""


CAPACITY_PROBE_SHARE = 0.03
"""Under a free order (mean latency, a call not short) the capacity program first gets this
share of the time left, before the slot bound: where it ends there (on (80,8) and (40,12)
of ``benchmarks/partition.py`` in 0.01-0.07 CPU s, at 1.0-1.8% above the slot bound that
3.4 s of a 10 s call gave) it is the root's bound, and it is not run again; where it is cut
short ((80,16), (32,16)) the slot bound and the capacity program run after it as before."""

SLOT_SKIP_GAP = 0.02
"""Where the capacity program ended first (:data:`CAPACITY_PROBE_SHARE`) and the gap it leaves
is under this (relatively), the slot bound runs but its priced schedules are not polished
(about 2 s of a 10 s call on (80,8)): the search gets that time. Without the slot bound too
(s26-h2) (80,8) free seeds 5 and 6 proved in 10 s but seed 0 did not (its bound is the slot
bound's; probe gap 0.5%); with it all three do, at 5.5-8.4 s (docs/benchmarks.md, final
runs of the twenty-sixth session)."""

FREE_FIRST_STEP = math.inf
"""Under a free order the capacity program runs once, against the incumbent (not against
rising targets from the bound so far, :data:`~blitzplan.live.bound.dp.CAPACITY_FIRST_STEP`):
with the pair bound a search costs about the same whatever its target (on (32,16) seed 8 of
``benchmarks/partition.py`` 1.75 CPU s against 0.9843 of the best known, 1.96 against 1.0),
so the first of two searches was time the second needed (docs/benchmarks.md, s23-h2)."""


SHORT_PROBE_SHARE = 0.3
"""In a short call under a free order (mean latency), the most of the time left the capacity
program gets, after the slot bound; where it does not end there, the slot bound's priced
schedules get the time (:data:`SHORT_PRICED_SHARE`)."""

SHORT_PROBE_MIN_S = 0.15
"""The capacity program's probe gets at least this (where its share of a short call allows:
at most :data:`CAPACITY_SHORT_SHARE` of the time left)."""

SHORT_SLOT_SHARE = 0.6
"""In a short call under a free order, the share of the time left after the local search that
the slot bound gets (:data:`SLOT_SHARE_OF_LIMIT` in a long one): there it is the final bound
where the capacity program does not end (:data:`SHORT_PROBE_SHARE`)."""

SHORT_PRICED_STARTS = 2
"""In a short call under a free order, how many of the slot bound's priced schedules are kept
to be polished where the capacity program did not end (:data:`SHORT_PROBE_SHARE`)."""

SHORT_PRICED_SHARE = 0.9
"""The share of the time left that those priced schedules' polish gets there."""


class Strengthened(NamedTuple):
    """What :func:`strengthen` tells the search after it."""

    ended: bool
    """The capacity program ended within its search's share of its budget (not cut short):
    its value is the program's at the root, which the root node need not run again."""
    short: bool
    """A short call (:data:`CAPACITY_SHORT_S`): the search after the root bounds branches
    without the nodes' capacity programs (:data:`SHORT_NODE_CAPACITY`)."""


def strengthen(start: Start, root_bound: float, offers: Offers | None = None) -> Strengthened:
    """Polish ``start``'s incumbent and raise its bound; ``root_bound`` is the search's least
    open bound so far (objective units), the capacity bound's floor. The capacity program's
    best relaxed plans go to ``offers`` (the search's; by default new ones) repaired: on (32,8)
    free seed 1 of ``benchmarks/partition.py`` that is the optimum (0.546432), where the 1 s
    call's incumbent was 0.547619 (docs/benchmarks.md, s24-h1). Each bound gets a share
    of the time left when it starts, and none starts past ``start``'s deadline. After the
    bounds the incumbent's best split jump with N in the preemptive program's order is
    offered (:meth:`~blitzplan.live.exact.offers.Offers.preempted`); under a free order, in a
    call not short where the capacity program's probe did not end (the slot bound's priced
    schedules gave the incumbent: (32,16), (80,16)), the preemptive descent's point from it.
    Where the probe ended ((40,12), (80,8)) the search keeps that time: on (40,12) at 10 CPU s
    the descent's 1.5 s lowered seed 8's incumbent by 0.18% and cost seed 1 the one the search
    found later (+0.15%); (80,8)'s proofs need the search's time (docs/benchmarks.md,
    s27-h4). In a short call (:data:`CAPACITY_SHORT_S`) the cheap lift comes first
    (:func:`_quick_lagrangian`) and the capacity program gets most of the time."""
    first, then, starts = polish_shares(start, short=_short(start))
    offers = offers or Offers(start)
    start.polish(first * start.left_s(), max_s=math.inf, moves=POLISH_MOVES)
    short = _short(start)
    report = Strengthened(ended=False, short=short)
    if start.proven():
        return report
    if not short and slot_wanted(start) and _capacity_probe(start, root_bound, offers):
        report = report._replace(ended=True)  # the program's value: not run again
        if not start.proven():
            polish = then if start.gap_at_least(SLOT_SKIP_GAP) else 0.0
            slot_search(start, _slot_budget(start), polish_share=polish, starts=starts)
        offers.preempted(start.deadline_s)  # no descent: the search's time (s27-h4)
        return report
    probe = short and slot_wanted(start)
    if probe:  # the priced schedules are polished after the capacity program
        budget = _slot_budget(start, SHORT_SLOT_SHARE)
        kept = slot_search(start, budget, short=True, polish_share=0.0, starts=SHORT_PRICED_STARTS)
    else:
        slot_search(start, _slot_budget(start), short=short, polish_share=then, starts=starts)
    if short:
        _quick_lagrangian(start, root_bound)
    share = FREE_CAPACITY_SHARE if start.old_order == "free" else CAPACITY_SHARE_OF_LIMIT
    budget = _capacity_budget(start.left_s(), share)
    if probe:
        budget = min(budget, max(SHORT_PROBE_SHARE * start.left_s(), SHORT_PROBE_MIN_S))
    if start.proven() or budget <= 0:  # none is started past the deadline
        return report
    searched = 1.0 if probe else SEARCH_SHARE  # the search's share of the budget
    ended = _capacity(start, root_bound, offers, budget, searched, open_floors=not probe)
    report = report._replace(ended=ended)  # a probe cut short returns its floor
    if probe:
        _polish_priced(start, kept, then, report.ended)
    if short:
        _busy_bound(start)
    offers.preempted(start.deadline_s, descend=not short)
    return report


def _short(start: Start) -> bool:
    """A short call: :data:`CAPACITY_SHARE_OF_LIMIT` of the time left now is under
    :data:`CAPACITY_SHORT_S`."""
    return CAPACITY_SHARE_OF_LIMIT * start.left_s() < CAPACITY_SHORT_S


def _slot_budget(start: Start, share: float = SLOT_SHARE_OF_LIMIT) -> float:
    """The slot bound's budget (:func:`~blitzplan.live.exact.priced.slot_search`): ``share``
    of the time left (:data:`SLOT_SHARE_OF_LIMIT`, :data:`SHORT_SLOT_SHARE` in a short call
    under a free order), at most :data:`CAPACITY_MAX_S`."""
    return min(share * start.left_s(), CAPACITY_MAX_S)


def _capacity_probe(start: Start, root_bound: float, offers: Offers) -> bool:
    """Under a free order (mean latency, a call not short), the capacity program before the
    slot bound in :data:`CAPACITY_PROBE_SHARE` of the time left (of :data:`CAPACITY_MAX_S`
    at most). True when it ended within its search's share of that budget (not cut short):
    its value is then the program's, which a second run cannot raise."""
    budget = CAPACITY_PROBE_SHARE * min(start.left_s(), CAPACITY_MAX_S)
    return budget > 0 and _capacity(start, root_bound, offers, budget, SEARCH_SHARE)


def _capacity(
    start: Start,
    root_bound: float,
    offers: Offers,
    budget: float,
    searched: float,
    open_floors: bool = True,
) -> bool:
    """The capacity program (:func:`~blitzplan.live.bound.dp.capacity_bound`) in ``budget``
    seconds against the incumbent: its bound raises ``start``'s, its best relaxed plans go
    to ``offers`` repaired. True when it ended within ``searched`` of its budget."""
    began = time.perf_counter()
    bound = capacity_bound(
        start.instance,
        objective=start.objective,
        old_order=start.old_order,
        lower_bound=max(root_bound, start.bound),
        upper_bound=start.incumbent.objective,
        time_limit_s=budget,
        first_step=FREE_FIRST_STEP if start.old_order == "free" else CAPACITY_FIRST_STEP,
        on_plan=offers.programmed,
        open_floors=open_floors,
    )
    start.raise_bound(bound)
    return time.perf_counter() - began < searched * budget


def _capacity_budget(left_s: float, share: float) -> float:
    """The capacity program's budget, ``left_s`` left: ``share`` of it
    (:data:`CAPACITY_SHARE_OF_LIMIT`, :data:`FREE_CAPACITY_SHARE` under a free order), but
    at least :data:`CAPACITY_FLOOR_S` where :data:`CAPACITY_SHORT_SHARE` of it allows (else
    that share)."""
    floor = min(CAPACITY_SHORT_SHARE * left_s, CAPACITY_FLOOR_S)
    return min(max(share * left_s, floor), CAPACITY_MAX_S)


def _quick_lagrangian(start: Start, root_bound: float) -> None:
    """In a short call, the Lagrangian bound's first steps (mean latency, O in FIFO order,
    the relaxation far from the incumbent: :func:`~blitzplan.live.bound.lagrange.far_from`)
    in :data:`QUICK_LAGRANGE_SHARE` of the time left, kept at once: the capacity program then
    starts from it."""
    upper = start.incumbent.objective
    wanted = start.objective == "mean_latency" and start.old_order == "fifo"
    budget = QUICK_LAGRANGE_SHARE * start.left_s()
    if start.proven() or not wanted or not far_from(root_bound, upper) or budget <= 0:
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
    """In a short call, the busy bound (mean latency, O in FIFO order;
    :mod:`blitzplan.live.bound.busy`) counted from the layer arrival where the incumbent's
    splits keep N busiest, while the gap is under :data:`BUSY_SHORT_GAP`, in
    :data:`BUSY_SHORT_SHARE` of the time left (cut short, it claims nothing)."""
    best = start.incumbent
    budget = min(BUSY_SHORT_SHARE * start.left_s(), CAPACITY_MAX_S)
    wanted = start.objective == "mean_latency" and start.old_order == "fifo"
    if start.gap_at_least(BUSY_SHORT_GAP):
        return
    if start.proven() or not wanted or not best.has_ops or budget <= 0:
        return
    relax = Relaxation(start.instance, start.objective)
    at = busy_point(relax, best.split)
    until = time.perf_counter() + budget
    bound = busy_bound(relax, relax.obj.scaled(best.objective), at, until)
    start.raise_bound(relax.obj.final(bound))


def _polish_priced(start: Start, kept: list[Schedule], share: float, ended: bool) -> None:
    """In a short call under a free order, after the capacity program: the best of ``kept``
    (the slot bound's priced schedules, best first) polished in ``share`` of the time left
    where the program ended (the search after it then gets the rest), else all of them in
    :data:`SHORT_PRICED_SHARE` (the search would branch few nodes from the slot bound)."""
    if ended:
        polish_priced(start, kept[:1], polish_share=share, moves=POLISH_MOVES)
    else:
        polish_priced(start, kept, polish_share=SHORT_PRICED_SHARE, moves=POLISH_MOVES)
