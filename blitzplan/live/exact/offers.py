"""The schedules the live branch and bound (:mod:`blitzplan.live.exact.bnb`) offers its incumbent.

A node's relaxed plan becomes a schedule two ways: repaired (N list-scheduled against the plan,
:func:`~blitzplan.live.bound.relaxation.repair`), once per plan, and sequenced, when an order
of N's operations meets every due time of the plan (:func:`~blitzplan.live.exact.nmachine.sequence`,
backed off while it keeps giving up). After the root bounds a new incumbent the search found
is polished by the local search (:data:`REPOLISH_MOVES`), and the incumbent's best split jump
with N in the preemptive program's order is polished and offered
(:mod:`blitzplan.live.preemptive_order`, :data:`PREEMPTIVE_MOVES`); under a free O order, the
point a descent on the preemptive program's score reaches from it
(:mod:`blitzplan.live.preemptive_descent`, :data:`DESCENT_ORDERS`). Every schedule goes through
:meth:`~blitzplan.live.exact.common.Start.offer`, which keeps it only when the independent
checker passes it.
"""

from __future__ import annotations

import math
import time

from blitzplan.live.bound.plan_floor import plan_floor
from blitzplan.live.bound.relaxation import RelaxedPlan, repair
from blitzplan.live.exact.common import Start, decode
from blitzplan.live.exact.nmachine import NOp, sequence
from blitzplan.live.preemptive_descent import preemptive_descent
from blitzplan.live.preemptive_order import Jump, preemptive_jump
from blitzplan.live.schedule import Schedule

__all__ = [
    "DESCENT_MAX_S",
    "DESCENT_MOVES",
    "DESCENT_ORDERS",
    "DESCENT_SEARCH_SHARE",
    "DESCENT_SHARE",
    "PREEMPTIVE_GAP",
    "PREEMPTIVE_MOVES",
    "PREEMPTIVE_ORDERS",
    "PREEMPTIVE_SHARE",
    "REPOLISH_EVERY_S",
    "REPOLISH_MOVES",
    "REPOLISH_SHARE",
    "SEQUENCE_BACK_OFF",
    "SEQUENCE_STEPS",
    "WIDE_GAP",
    "WIDE_SHARE",
    "Offers",
]

SEQUENCE_STEPS = 500
"""The most steps the N sequencer may take for one relaxed plan before the node branches."""

SEQUENCE_BACK_OFF = 64
"""While the sequencer keeps giving up, it runs on one relaxed plan in at most this many."""

REPOLISH_MOVES = 5_000
"""After the root bounds, an incumbent the search found is polished by this many moves of the
local search (:func:`~blitzplan.live.improve.polish`) before the next node: the search's
schedules come from relaxed plans, repaired or sequenced, never polished. On (32,16) of
``benchmarks/partition.py`` 5,000 moves took 0.3-0.5 s of CPU and lowered bnb's 10 s
incumbents by up to 0.55% (FIFO seed 3: 0.516617 -> 0.513797)."""

REPOLISH_EVERY_S = 1.0
"""The search polishes a new incumbent at most once in this many seconds."""

REPOLISH_SHARE = 0.2
"""The most of the time left that one such polish may take."""

PREEMPTIVE_MOVES = 2_000
"""The moves of the local search that polish the incumbent's best split jump with N in the
preemptive program's order (:meth:`Offers.preempted`). From bnb's 1 s incumbents of (32,16)
FIFO of ``benchmarks/partition.py`` (seeds 0-9) such a jump, polished by 2,000 moves (0.2-0.4
CPU s), was lower on 7: seed 2 0.651176 -> 0.646766, seed 8 0.634190 -> 0.632835."""

PREEMPTIVE_SHARE = 0.25
"""The most of the time left that the jump and its polish take (:meth:`Offers.preempted`)."""

PREEMPTIVE_GAP = 0.002
"""The jump is offered only while the gap (relative to the incumbent) is at least this: on
``benchmarks/partition.py``'s (80,8) FIFO seed 5 (gaps 0.13, 0.11, 0.10% at its three
incumbents) its three jumps took 0.7 s of a 10 s call, the time the search needed to find
the optimum (proven at 9.5 s without them, unproven with them); the jumps that lowered (32,16)
FIFO incumbents did so at gaps of 0.3-1.9%."""

PREEMPTIVE_ORDERS = ("fifo",)
"""The O orders under which the jump is offered: under a free order, 1 CPU s calls on (32,16),
(40,12) and (80,16), seeds 0-9, gained on 6 instances and lost on 3 (mean gaps 5.71 / 0.95 /
14.42% -> 5.82 / 0.96 / 14.31%: its time is the priced starts' and the search's)."""
DESCENT_ORDERS = ("free",)
"""The O orders under which :meth:`Offers.preempted` offers the preemptive descent's point
(:func:`~blitzplan.live.preemptive_descent.preemptive_descent`) in place of the jump: in
bnb's 10 CPU s calls under a free order on ``benchmarks/partition.py`` it lowered the root's
incumbent on 6 of 8 open (32,16) seeds and 5 of 5 (80,16) seeds by 0.05-1.29% in 0.35-1.46 s
((32,16) mean gap 1.06 -> 0.67%; docs/benchmarks.md, s27-h4)."""

DESCENT_SHARE = 0.5
"""The most of the time left that the descent and the polish of its point take."""

DESCENT_MAX_S = 1.5
"""The most seconds they take (without it, a long call's root would give them its search's
time: the descent reached its local minimum in 0.9-1.1 CPU s on (32,16))."""

DESCENT_SEARCH_SHARE = 0.7
"""The descent's share of that time; its point's polish gets the rest."""

DESCENT_MOVES = 20_000
"""The most moves of that polish (the descent's point, list-scheduled, is often above the
incumbent before it: (32,16) seed 2 0.501000, polished 0.490699, against 0.495221)."""

WIDE_GAP = 0.01
"""Under a free O order, where the gap after the root bounds is at least this (relatively),
the incumbent they leave is polished again by the search (:meth:`Offers.rooted`), in
:data:`WIDE_SHARE` of the time left: the root's last polish (the slot bound's priced starts)
ends short of a local optimum (0.5 s more moves from bnb's 10 s (80,16) free incumbents of
``benchmarks/partition.py`` lowered each by 0.1-0.9%), and at such gaps the search rarely
lowers either side (docs/benchmarks.md, s25-h2)."""

WIDE_SHARE = 0.5
"""The most of the time left that the polish of :data:`WIDE_GAP` may take."""


class Offers:
    """The search's offers to ``start``'s incumbent and the incumbent's polish."""

    def __init__(self, start: Start) -> None:
        self.start = start
        self.offers = 0
        self.seen: set[tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]] = set()
        """The relaxed plans already offered repaired (see :meth:`repaired`)."""
        self.sequence_every = 1
        """The sequencer runs on one relaxed plan in this many (see :meth:`_back_off`)."""
        self.polished: Schedule | None = None
        """The incumbent last polished (None until the root bounds: no polish before them)."""
        self.polished_at = -math.inf
        self.jumped: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        """The incumbents' splits and O orders whose preemptive jump was offered."""
        self.owed = False
        """Whether the incumbent is polished again though it was polished (see :meth:`rooted`)."""

    def repaired(self, plan: RelaxedPlan) -> None:
        """Offer the plan, repaired (N list-scheduled against it), as a schedule, unless one
        with the same splits, O order and O starts (all the repair reads) was: on (80,8) and
        (40,12) FIFO 70% of the plans bounded in 10 s were such repeats. Nor is it when no
        schedule of its splits and O order can beat the incumbent
        (:func:`~blitzplan.live.bound.plan_floor.plan_floor`)."""
        key = (plan.split, plan.old_sequence, plan.planned_old_start_s)
        if key in self.seen:
            return
        self.seen.add(key)
        start = self.start
        if plan_floor(start.instance, plan, start.objective) >= start.incumbent.objective:
            return  # no schedule of its splits and O order beats the incumbent
        args = (start.objective, start.old_order, start.backend)
        start.offer(decode(start.instance, *repair(start.instance, plan), *args))

    def sequenced(self, plan: RelaxedPlan, ops: list[NOp]) -> None:
        """Offer the plan as a schedule with N's order from the sequencer, if it finds one
        (preemptive N can carry the plan out)."""
        start = self.start
        self.offers += 1
        if self.offers % self.sequence_every:
            return
        order, proven = sequence(ops, deadline_s=start.deadline_s, max_steps=SEQUENCE_STEPS)
        self._back_off(order is not None, proven)
        if order is not None:
            args = (start.objective, start.old_order, start.backend)
            start.offer(decode(start.instance, plan.split, order, plan.old_sequence, *args))

    def _back_off(self, found: bool, proven: bool) -> None:
        """The sequencer runs on every plan while it finds orders, and on ever fewer (every
        2nd, 4th, ... :data:`SEQUENCE_BACK_OFF`-th) while it gives up: on large instances it
        rarely finds one, costs more than the node, and the repaired plan and the branching
        do without it."""
        if found:
            self.sequence_every = max(1, self.sequence_every // 2)
        elif not proven:
            self.sequence_every = min(2 * self.sequence_every, SEQUENCE_BACK_OFF)

    def rooted(self) -> None:
        """The root bounds are done: their incumbent counts as polished, but under a free O
        order at a gap of :data:`WIDE_GAP` or more it is owed one more polish (the search's
        first, in :data:`WIDE_SHARE` of the time left)."""
        start = self.start
        upper = start.incumbent.objective
        wide = not math.isinf(upper) and upper - start.bound >= WIDE_GAP * abs(upper)
        self.owed = start.old_order == "free" and wide
        self.polished = start.incumbent

    def repolish(self, until_s: float) -> None:
        """Polish an incumbent the search found (see :data:`REPOLISH_MOVES`), or the root's
        when it is owed one (:meth:`rooted`); under a free O order O's blocks are then
        ordered (:mod:`~blitzplan.live.block_order`); then its split jump is offered
        (:meth:`preempted`)."""
        start, now = self.start, time.perf_counter()
        if self.polished is None or (start.incumbent is self.polished and not self.owed):
            return
        if now - self.polished_at < REPOLISH_EVERY_S:
            return
        share = WIDE_SHARE if self.owed else REPOLISH_SHARE
        self.polished_at, self.owed = now, False
        start.polish(share * (until_s - now), max_s=math.inf, moves=REPOLISH_MOVES, blocks=True)
        self.preempted(until_s)
        self.polished = start.incumbent

    def preempted(self, until_s: float, descend: bool = False) -> None:
        """Offer the incumbent's best split jump with N list-scheduled in the preemptive
        program's order (:func:`~blitzplan.live.preemptive_order.preemptive_jump`), polished
        by :data:`PREEMPTIVE_MOVES` moves of the local search, all in
        :data:`PREEMPTIVE_SHARE` of the time left to ``until_s`` (a ``time.perf_counter()``
        instant); once per splits and O order, under mean latency and an O order of
        :data:`PREEMPTIVE_ORDERS`. The bnb search's N orders
        come from relaxed plans: with them the same jump misses what this order finds. With
        ``descend`` (the root bounds' call) under an O order of :data:`DESCENT_ORDERS`, the
        point of the preemptive descent from the incumbent
        (:func:`~blitzplan.live.preemptive_descent.preemptive_descent`, in
        :data:`DESCENT_SEARCH_SHARE` of the time) polished by :data:`DESCENT_MOVES` moves in
        its place, all in :data:`DESCENT_SHARE` of the time left (:data:`DESCENT_MAX_S` at
        most)."""
        from blitzplan.live.improve import polish

        start, best = self.start, self.start.incumbent
        descent = descend and start.old_order in DESCENT_ORDERS
        jump = start.old_order in PREEMPTIVE_ORDERS
        wanted = start.objective == "mean_latency" and (jump or descent)
        if not wanted or not best.has_ops or start.proven():
            return
        if best.objective - start.bound < PREEMPTIVE_GAP * abs(best.objective):
            return
        key = (best.split, best.old_sequence())
        if key in self.jumped:
            return
        self.jumped.add(key)
        now = time.perf_counter()
        found: Jump | None
        if descent:
            deadline = now + min(DESCENT_SHARE * (until_s - now), DESCENT_MAX_S)
            until = now + DESCENT_SEARCH_SHARE * (deadline - now)
            free = start.old_order == "free"
            found = preemptive_descent(
                start.instance, best.split, key[1], deadline_s=until, free=free
            )
        else:
            deadline = now + PREEMPTIVE_SHARE * (until_s - now)
            found = preemptive_jump(start.instance, best.split, key[1], deadline_s=deadline)
        if found is None or time.perf_counter() >= deadline:
            return
        args = (start.objective, start.old_order, start.backend)
        jumped = decode(start.instance, *found[:3], *args)
        polished = polish(
            start.instance,
            jumped,
            objective=start.objective,
            old_order=start.old_order,
            deadline_s=deadline,
            bound=start.bound,
            max_moves=DESCENT_MOVES if descent else PREEMPTIVE_MOVES,
        )
        if math.isfinite(polished.value):  # within 3% of the incumbent the offer re-orders it
            start.offer(decode(start.instance, polished.split, polished.new, polished.old, *args))
