"""The schedules the live branch and bound (:mod:`blitzplan.live.exact.bnb`) offers its incumbent.

A node's relaxed plan becomes a schedule two ways: repaired (N list-scheduled against the plan,
:func:`~blitzplan.live.bound.relaxation.repair`), once per plan, and sequenced, when an order
of N's operations meets every due time of the plan (:func:`~blitzplan.live.exact.nmachine.sequence`,
backed off while it keeps giving up). After the root bounds a new incumbent the search found
is polished by the local search (:data:`REPOLISH_MOVES`), and the incumbent's best split jump
with N in the preemptive program's order is polished and offered
(:mod:`blitzplan.live.preemptive_order`, :data:`PREEMPTIVE_MOVES`), then under FIFO the points
a descent over the splits on the preemptive program's score reaches from it and from the
root's capacity program's best plan; under a free O order the root offers the point of that
descent from its incumbent, O's blocks moved too (:mod:`blitzplan.live.preemptive_descent`).
Every schedule goes through
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
    "DESCENT_GAP",
    "DESCENT_ROUNDS",
    "DESCENT_SCORE_SHARE",
    "DESCENT_SHARE",
    "FREE_DESCENT_MAX_S",
    "FREE_DESCENT_MOVES",
    "PREEMPTIVE_GAP",
    "PREEMPTIVE_MOVES",
    "PREEMPTIVE_ORDERS",
    "PREEMPTIVE_SHARE",
    "PROGRAM_DESCENT_GAP",
    "PROGRAM_DESCENT_MIN_LEFT_S",
    "PROGRAM_DESCENT_SHARE",
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
DESCENT_SHARE = 0.5
"""The most of the time left that a descent from the incumbent and its polish take (after
the jump's; :meth:`Offers.preempted`)."""

DESCENT_GAP = 0.01
"""The descent from the incumbent runs only while the gap (relative to the incumbent) is at
least this: its time is the search's, which proves instances at narrower gaps."""

DESCENT_ROUNDS = 3
"""The most rounds of the descent one offer runs: each from the incumbent the round before
left, while it lowers the incumbent."""

PROGRAM_DESCENT_GAP = 0.002
"""The capacity program's best relaxed plan at the root (:meth:`Offers.programmed`) seeds a
descent too, before the incumbent's jump, while the gap is at least this: on (80,8) FIFO
seed 7 of ``benchmarks/partition.py`` (gap 3.2%) the program's plan finishes one batch on N
where every incumbent finished two; descended and polished it gave 1.8277 against 1.8652; on
seed 9 (0.23%) 1.5086 against 1.5101 (neither incumbent moves in 60 CPU s of the search:
docs/benchmarks.md, s27-h2). Seed 5 (0.13%), whose proof needs the search's time, is left
out as by :data:`PREEMPTIVE_GAP`."""

PROGRAM_DESCENT_MIN_LEFT_S = 2.0
"""The program's plan is not descended from with less time left than this: in 1 CPU s calls
on (32,16) FIFO it cost four of ten incumbents (seed 8: gap 1.32 -> 1.45%) and seed 1's bound
(2.80 -> 4.84%) (docs/benchmarks.md, s27-h2)."""

PROGRAM_DESCENT_SHARE = 0.25
"""The most of the time left that the descent from the program's plan and its polish take."""

FREE_DESCENT_MAX_S = 1.5
"""Under a free O order the root's descent from its incumbent (:meth:`Offers.preempted` with
``descend``, in place of the jump) and its polish take :data:`DESCENT_SHARE` of the time left
but at most this: in bnb's 10 CPU s calls on ``benchmarks/partition.py`` it lowered the root's
incumbent on 6 of 8 open (32,16) seeds and 5 of 5 (80,16) seeds by 0.05-1.29% in 0.35-1.46 s
((32,16) mean gap 1.06 -> 0.67%), where it reached its local minimum in 0.9-1.1 CPU s
(docs/benchmarks.md, s27-h4)."""

FREE_DESCENT_MOVES = 20_000
"""The most moves of the polish of that descent's point (list-scheduled, it is often above the
incumbent before it: (32,16) seed 2 0.501000, polished 0.490699, against 0.495221)."""

DESCENT_SCORE_SHARE = 0.7
"""The share of :data:`DESCENT_SHARE`'s time the descent's scoring may take; its polish gets
the rest."""

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
        self.programs: list[RelaxedPlan] = []
        """The capacity program's best relaxed plans not yet descended from (:meth:`programmed`)."""

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

    def programmed(self, plan: RelaxedPlan) -> None:
        """A best relaxed plan of the root's capacity program: offered repaired
        (:meth:`repaired`), and kept for the descent of :meth:`preempted`."""
        self.repaired(plan)
        self.programs.append(plan)

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
        wide = not math.isinf(start.incumbent.objective) and start.gap_at_least(WIDE_GAP)
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
        :data:`PREEMPTIVE_ORDERS`. The bnb search's N orders come from relaxed plans: with
        them the same jump misses what this order finds. Then, at a gap of
        :data:`DESCENT_GAP` or more, up to :data:`DESCENT_ROUNDS` rounds of the preemptive
        descent (:func:`~blitzplan.live.preemptive_descent.preemptive_descent`) from the
        incumbent, each in :data:`DESCENT_SHARE` of the time left, while they lower it. Before
        the jump, the capacity program's best plan kept at the root is descended from
        (:meth:`_programmed`). Under another O order (free) only the root's call
        (``descend``) offers anything: :meth:`_free_descent`."""
        start = self.start
        if start.objective != "mean_latency" or not start.incumbent.has_ops or start.proven():
            return
        if start.old_order not in PREEMPTIVE_ORDERS:
            if descend:
                self._free_descent(until_s)
            return
        self._programmed(until_s)
        best = start.incumbent
        if start.proven() or not start.gap_at_least(PREEMPTIVE_GAP):
            return
        key = (best.split, best.old_sequence())
        if key in self.jumped:
            return
        self.jumped.add(key)
        now = time.perf_counter()
        deadline = now + PREEMPTIVE_SHARE * (until_s - now)
        found = preemptive_jump(start.instance, best.split, key[1], deadline_s=deadline)
        for step in range(DESCENT_ROUNDS + 1):
            if found is None or time.perf_counter() >= deadline:
                return
            self._offer_polished(found, deadline)
            if step == DESCENT_ROUNDS or start.proven() or (step and start.incumbent is best):
                return  # a round of the descent that lowered nothing ends them
            if not start.gap_at_least(DESCENT_GAP):
                return
            best = start.incumbent
            key = (best.split, best.old_sequence())
            self.jumped.add(key)
            now = time.perf_counter()
            deadline = now + DESCENT_SHARE * (until_s - now)
            scored_by = now + DESCENT_SCORE_SHARE * (deadline - now)
            found = preemptive_descent(start.instance, best.split, key[1], deadline_s=scored_by)

    def _free_descent(self, until_s: float) -> None:
        """The preemptive descent from the incumbent with O's blocks moved too, at a gap of
        :data:`PREEMPTIVE_GAP` or more, in :data:`DESCENT_SCORE_SHARE` of
        :data:`DESCENT_SHARE` of the time left to ``until_s`` (:data:`FREE_DESCENT_MAX_S` at
        most), its point polished by :data:`FREE_DESCENT_MOVES` moves in the rest."""
        start, best = self.start, self.start.incumbent
        if not start.gap_at_least(PREEMPTIVE_GAP):
            return
        now = time.perf_counter()
        deadline = now + min(DESCENT_SHARE * (until_s - now), FREE_DESCENT_MAX_S)
        scored_by = now + DESCENT_SCORE_SHARE * (deadline - now)
        old = best.old_sequence()
        found = preemptive_descent(start.instance, best.split, old, deadline_s=scored_by, free=True)
        if found is not None and time.perf_counter() < deadline:
            self._offer_polished(found, deadline, FREE_DESCENT_MOVES)

    def _programmed(self, until_s: float) -> None:
        """The preemptive descent from the last of the capacity program's best plans not yet
        descended from (:meth:`programmed`; the others are dropped), its end polished and
        offered, in :data:`PROGRAM_DESCENT_SHARE` of the time left to ``until_s``, while the
        gap is at least :data:`PROGRAM_DESCENT_GAP` and at least
        :data:`PROGRAM_DESCENT_MIN_LEFT_S` is left."""
        start = self.start
        plans, self.programs = self.programs, []
        now = time.perf_counter()
        if not plans or not start.gap_at_least(PROGRAM_DESCENT_GAP):
            return
        if until_s - now < PROGRAM_DESCENT_MIN_LEFT_S:
            return
        deadline = now + PROGRAM_DESCENT_SHARE * (until_s - now)
        scored_by = now + DESCENT_SCORE_SHARE * (deadline - now)
        plan = plans[-1]
        found = preemptive_descent(
            start.instance, list(plan.split), list(plan.old_sequence), deadline_s=scored_by
        )
        if found is not None:
            self._offer_polished(found, deadline)

    def _offer_polished(
        self, found: Jump, deadline_s: float, moves: int = PREEMPTIVE_MOVES
    ) -> None:
        """Offer ``found`` (splits, N's and O's orders) polished by ``moves`` moves of the
        local search by ``deadline_s``; within 3% of the incumbent the offer re-orders it."""
        from blitzplan.live.improve import polish

        start = self.start
        args = (start.objective, start.old_order, start.backend)
        polished = polish(
            start.instance,
            decode(start.instance, *found[:3], *args),
            objective=start.objective,
            old_order=start.old_order,
            deadline_s=deadline_s,
            bound=start.bound,
            max_moves=moves,
        )
        if math.isfinite(polished.value):
            start.offer(decode(start.instance, polished.split, polished.new, polished.old, *args))
