"""What every exact live-scaling backend shares: the starting point, the bound, and the wrap-up.

Before a solver runs, the N-capacity relaxation (:mod:`~blitzplan.live.bound.relaxation`) gives a
proven lower bound and a repaired schedule; with the ZigZag hint, the better of the two is the
incumbent. A solver's answer is decoded into orders, re-timed by
:func:`~blitzplan.live.schedule.timetable` and kept only if it beats the incumbent; the status is
OPTIMAL only when the incumbent meets a proven bound. The incumbent is only ever replaced by a
schedule the independent checker (:func:`~blitzplan.live.schedule_checks.validate_schedule`) passes,
and no solver round can discard it: a round that fails or claims the problem infeasible while a
schedule is known leaves it standing (FEASIBLE with its gap).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from blitzplan.live.bound.dp import relaxation_bound
from blitzplan.live.bound.relaxation import RelaxedPlan, repair
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import Schedule, build_schedule, empty_schedule, relative_gap
from blitzplan.live.tail_order import reorder_tail
from blitzplan.solvers.backends import OPTIMALITY_REL_GAP, SolveStatus, quiet_stdout

__all__ = [
    "OPTIMALITY_REL_GAP",
    "REORDER_NEAR",
    "OutOfTime",
    "Start",
    "decode",
    "finish",
    "quiet_stdout",
    "start_point",
]


MIN_ROUND_S = 0.05
"""A solver round is not started with less time than this left."""

RELAXATION_SHARE = 0.4
"""The most of a time limit the relaxation bound may take before a solver starts."""

RELAXATION_MAX_S = 10.0
"""The relaxation's budget without a time limit (stopped early, its bound is weaker but valid)."""

POLISH_SHARE = 0.05
"""The share of a time limit spent improving the incumbent by local search before solving."""

POLISH_MAX_S = 1.0
"""The most time that local search gets, whatever the limit."""

POLISH_MOVES = 2000
"""Moves the local search tries (its time cap rarely binds, so runs repeat exactly)."""


REORDER_NEAR = 0.03
"""A schedule offered within this (relatively) of the incumbent gets its batches that finish
on N re-ordered there first (:meth:`Start.offer`): on (32,16) FIFO of
``benchmarks/partition.py`` that order lowered 10 s incumbents by 0.8-2.5%."""


class OutOfTime(Exception):
    """Building a model ran into the deadline."""


@dataclass
class Start:
    """The incumbent schedule, the best proven lower bound, and the clock of the solve."""

    instance: LiveScalingInstance
    objective: str
    old_order: str
    backend: str
    incumbent: Schedule
    bound: float
    plan: RelaxedPlan | None
    started_s: float
    deadline_s: float
    started_cpu_s: float = field(default_factory=time.thread_time)

    def left_s(self) -> float:
        return self.deadline_s - time.perf_counter()

    def slowdown(self) -> float:
        """How many wall seconds a second of this thread's CPU time has taken since the start
        (at least 1): what load stretches a step's CPU estimate by, before it is started."""
        cpu_s = time.thread_time() - self.started_cpu_s
        wall_s = time.perf_counter() - self.started_s
        return max(1.0, wall_s / cpu_s) if cpu_s > 0 else 1.0

    def check_time(self) -> None:
        """Raise OutOfTime once the deadline has passed (building a model can take longer
        than solving it)."""
        if time.perf_counter() > self.deadline_s:
            raise OutOfTime

    def offer(self, schedule: Schedule) -> None:
        """Keep ``schedule`` if it is better than the incumbent and the checker passes it (its
        status is settled later, by :func:`finish`). A schedule within
        :data:`REORDER_NEAR` of the incumbent is first given the best order of the batches it
        finishes on N (:func:`~blitzplan.live.tail_order.reorder_tail`: every order when it
        beats the incumbent as it is, else shortest first: on (32,16) FIFO seed 2 the offers
        took 11% of a 10 s call with its neighbouring swaps too)."""
        from blitzplan.live.schedule_checks import validate_schedule

        if schedule.objective < (1 + REORDER_NEAR) * self.incumbent.objective:
            schedule = self._reordered(schedule)
        unsettled = replace(schedule, status=SolveStatus.UNKNOWN)
        better = schedule.objective < self.incumbent.objective
        if better and validate_schedule(self.instance, unsettled).ok:
            self.incumbent = schedule

    def _reordered(self, schedule: Schedule) -> Schedule:
        """``schedule`` with the batches it finishes on N re-ordered there, if that is better."""
        old = schedule.old_sequence()
        args = (schedule.split, schedule.new_sequence(), old, self.objective, schedule.objective)
        every = schedule.objective < self.incumbent.objective
        found = reorder_tail(self.instance, *args, every_order=every)
        if found is None:
            return schedule
        order = (self.objective, self.old_order, self.backend)
        return decode(self.instance, schedule.split, found[0], old, *order)

    def infeasible_round(self, solver: str) -> str:
        """A solver round found its model infeasible. Every round's model relaxes the problem,
        but only a hard SLO can make the problem infeasible, and a known schedule proves it is
        not: then the solver is wrong (numerics), the round counts as failed, and the answer is
        why; otherwise the bound becomes +inf (proven infeasible) and the answer is ""."""
        if self.objective == "hard_slo" and math.isinf(self.incumbent.objective):
            self.raise_bound(math.inf)
            return ""
        known = "a schedule is known" if self.incumbent.has_ops else "one always exists"
        return f"{solver} called a round infeasible though {known}"

    def polish(
        self,
        seconds: float,
        *,
        max_s: float = POLISH_MAX_S,
        moves: int = POLISH_MOVES,
        blocks: bool = False,
    ) -> None:
        """Local search from the incumbent for at most ``seconds`` (and ``max_s``, and the time
        left) and ``moves`` tried moves (stops once proven; not started past the deadline),
        after the split jumps of :mod:`blitzplan.live.split_jump` (a batch moved whole to O or
        to N: on (80,16) FIFO they lowered bnb's 10 s incumbents by up to 5%)."""
        if self.proven() or math.isinf(self.incumbent.objective) or self.left_s() <= 0:
            return
        from blitzplan.live.improve import polish

        limit = time.perf_counter() + min(seconds, max_s, max(self.left_s(), 0.0))
        found = polish(
            self.instance,
            self.incumbent,
            objective=self.objective,
            old_order=self.old_order,
            deadline_s=limit,
            bound=self.bound,
            max_moves=moves,
            blocks=blocks,
        )
        if found.value < self.incumbent.objective:
            args = (self.objective, self.old_order, self.backend)
            self.offer(decode(self.instance, found.split, found.new, found.old, *args))

    def raise_bound(self, bound: float) -> None:
        if not math.isnan(bound):
            self.bound = max(self.bound, bound)

    def gap_at_least(self, share: float) -> bool:
        """Whether the incumbent lies at least ``share`` (relatively) above the bound."""
        upper = self.incumbent.objective
        return upper - self.bound >= share * abs(upper)

    def proven(self) -> bool:
        """Whether the incumbent is proven optimal (or no schedule can exist)."""
        value = self.incumbent.objective
        if math.isinf(value):
            return self.bound == math.inf
        return self.bound >= value or value - self.bound <= OPTIMALITY_REL_GAP * abs(value)


def start_point(
    instance: LiveScalingInstance,
    *,
    objective: str,
    old_order: str,
    backend: str,
    time_limit_s: float | None,
    hint: Schedule | None,
    relax: bool = True,
    warm: bool = True,
) -> Start:
    """Where an exact backend starts.

    With ``relax``: the relaxation's bound (and plan). With ``warm``: the incumbent is the best
    of ``hint`` and the repaired relaxed plan, polished by a short local search; without, the
    solver starts from nothing (an UNKNOWN placeholder with an infinite objective).
    """
    started = time.perf_counter()
    deadline = math.inf if time_limit_s is None else started + time_limit_s
    nothing = empty_schedule(
        status=SolveStatus.UNKNOWN,
        objective=objective,
        method="exact",
        backend=backend,
        old_order=old_order,
        solve_s=0.0,
    )
    start = Start(
        instance, objective, old_order, backend, nothing, -math.inf, None, started, deadline
    )
    if relax:
        upper = hint.objective if hint is not None else math.inf
        budget = RELAXATION_MAX_S if time_limit_s is None else RELAXATION_SHARE * time_limit_s
        start.bound, start.plan, _ = relaxation_bound(
            instance,
            objective=objective,
            old_order=old_order,
            upper_bound=upper,
            time_limit_s=budget,
        )
    if not warm:
        return start
    if hint is not None and hint.has_ops:
        start.incumbent = replace(hint, method="exact", backend=backend)
    if start.plan is not None:
        start.offer(decode(instance, *repair(instance, start.plan), objective, old_order, backend))
        start.polish(POLISH_SHARE * (POLISH_MAX_S if time_limit_s is None else time_limit_s))
    return start


def decode(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Sequence[int],
    old_sequence: Sequence[int],
    objective: str,
    old_order: str,
    backend: str,
) -> Schedule:
    """A FEASIBLE schedule from orders (re-timed here, whatever times a solver held)."""
    return build_schedule(
        instance,
        split,
        new_sequence,
        old_sequence,
        objective=objective,
        method="exact",
        backend=backend,
        old_order=old_order,
        status=SolveStatus.FEASIBLE,
        solve_s=0.0,
    )


def finish(start: Start, *, message: str = "", failed: bool = False) -> Schedule:
    """The incumbent with its status (OPTIMAL only when it meets the proven bound) and bound;
    ERROR when the solver ``failed`` and there is no schedule at all."""
    best, bound = start.incumbent, start.bound
    elapsed = time.perf_counter() - start.started_s
    if bound == math.inf:
        return empty_schedule(
            status=SolveStatus.INFEASIBLE,
            objective=best.objective_name,
            method=best.method,
            solve_s=elapsed,
            old_order=best.old_order,
            backend=best.backend,
            message=message or "proven infeasible: a batch cannot meet its SLO",
        )
    if math.isinf(best.objective):
        status = SolveStatus.ERROR if failed and not best.has_ops else SolveStatus.UNKNOWN
    elif start.proven():
        status = SolveStatus.OPTIMAL
    else:
        status = SolveStatus.FEASIBLE
    bound = min(bound, best.objective)
    return replace(
        best,
        status=status,
        bound=bound,
        gap=relative_gap(best.objective, bound),
        solve_s=elapsed,
        message=message,
    )
