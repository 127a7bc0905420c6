"""The bound printed beside a heuristic's schedule (what ``plan()`` and the demo show next to a
live pair's objective): the N-capacity relaxation, raised under a FIFO order by the Lagrangian
bound and under the free order by the slot bound, in :data:`HEURISTIC_BOUND_S` of counted work,
once per distinct instance (``functools.lru_cache``)."""

from __future__ import annotations

import functools
import math

from blitzplan.live.bound.relaxation import RelaxedPlan
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import evaluate_objective, timetable
from blitzplan.live.work_meter import WorkMeter
from blitzplan.solvers.backends import OPTIMALITY_REL_GAP

__all__ = [
    "BOUND_SAFETY",
    "BOUND_WALL_SAFETY",
    "FREE_RELAXATION_SHARE",
    "HEURISTIC_BOUND_S",
    "SLOT_GAP",
    "relaxation_value",
]

HEURISTIC_BOUND_S = 0.25
"""The budget of the relaxation's bound beside a heuristic's schedule (the value ``plan()``
prints next to a live pair's objective), once per distinct instance, in *counted* seconds
(:mod:`~blitzplan.live.work_meter`): the states the relaxation merges and searches, its local
search's moves and the Lagrangian's steps are each priced by an estimate of their CPU time on a
2-core x86_64 machine (fitted to measured CPU time), and the bound stops when their sum reaches
this budget (about what the clocked budget took on a quiet machine): the same instance gives
the same bound, and a plan the same ``plan_id``, on every run, however loaded the machine.
Under a FIFO order the Lagrangian bound gets what the relaxation leaves of it, under the free
order the slot bound (when :data:`SLOT_GAP` is open; its steps counted by
:func:`~blitzplan.live.bound.slots.quick_step_count`). On light instances the
relaxation is solved in milliseconds and is the optimum or close to it; stopped by the budget
its bound is weaker but still valid. Real clocks are only safety nets: :data:`BOUND_SAFETY`
times this on the thread's CPU time, :data:`BOUND_WALL_SAFETY` times it on the wall clock."""

BOUND_SAFETY = 4.0
"""The printed bound's safety net on the calling thread's CPU time, as a multiple of
:data:`HEURISTIC_BOUND_S` (1 s): a bound still running then (on a machine more than 4x slower
than the calibration) stops at once, weaker, still valid, and then may differ from run to run.
Under the counted budget a bound takes about 0.25 s of CPU on the paper's sizes (medians per
class 0.19-0.26 s measured on a loaded 2-core x86_64, up to 0.46 s there at load 9)."""

BOUND_WALL_SAFETY = 16.0
"""The printed bound's safety net on the wall clock, as a multiple of :data:`HEURISTIC_BOUND_S`
(4 s): far out, because load stretches the wall time of the same work (on a 2-core machine at
load 5 with two more busy processes, a bound's process got a quarter to an eighth of a core: a
wall net of 4x stopped most FIFO bounds there, and their plans changed from run to run)."""

SLOT_GAP = 0.1
"""Under the free order (mean latency) the slot bound runs beside a heuristic only when the
relaxation's bound is more than this share below the best schedule known (the heuristic's or
the relaxation's plan repaired): within it the printed bound is already that close to the
optimum."""

_MIN_SLOT_S = 0.02
"""The least counted time left worth starting the slot bound with (a step takes 2-15 ms)."""

FREE_RELAXATION_SHARE = 0.5
"""Under the free order (mean latency), when the slot bound's steps fit (:func:`_slots_fit`),
the relaxation gets this share of :data:`HEURISTIC_BOUND_S` and the slot bound what it leaves
(on (32,16) the relaxation's search otherwise takes all of it; it proves its own optimum there
or stops with a weak bound). It was 0.4 while a slot step cost twice as much. With the steps of
s14-h2, 0.4 / 0.5 / 0.6 print the same means on ``benchmarks/partition.py``'s (32,16), (40,12)
and (80,16) (seeds 0-4; per seed within 0.003); from 0.5 the relaxation of 16 equal 512-token
batches (40 layers) completes (prints 0.420 / 0.451 / 0.451 of ZigZag's 0.454), while the
demo cluster's pairs of ``benchmarks/plan_ids.py`` lose up to 0.9% at 0.5 and 2.3% at 0.6 (their
slot steps); at 0.8 (80,16)'s steps no longer fit."""

_MIN_WALL_S = 1e-3
"""The least wall time the slot bound is handed (its counted steps are its real limit)."""


@functools.lru_cache(maxsize=64)
def relaxation_value(
    instance: LiveScalingInstance, objective: str, old_order: str, upper_bound: float
) -> float:
    """The relaxation's bound, once per instance (a fleet of equal pairs asks once), raised in
    what is left of :data:`HEURISTIC_BOUND_S` (counted work; real clocks only safety nets,
    :data:`BOUND_SAFETY`): under a FIFO order by the Lagrangian bound (its far grid, rounding
    and aim when the relaxation's bound is under ``QUICK_FAR`` of the heuristic's value), under
    the free order by the slot bound (:func:`_slot_value`)."""
    from blitzplan.live.bound.dp import relaxation_bound
    from blitzplan.live.bound.lagrange import (
        GRID_POINTS,
        QUICK_FAR_AIM_SHARE,
        QUICK_GRID_POINTS,
        lagrangian_bound,
        quick_free_step_s,
    )
    from blitzplan.live.bound.slots import QUICK_FAR

    meter = WorkMeter.with_safety(
        cpu_s=BOUND_SAFETY * HEURISTIC_BOUND_S, wall_s=BOUND_WALL_SAFETY * HEURISTIC_BOUND_S
    )
    share = FREE_RELAXATION_SHARE if _slots_fit(instance, objective, old_order) else 1.0
    bound, plan, _ = relaxation_bound(
        instance,
        objective=objective,
        old_order=old_order,
        upper_bound=upper_bound,
        time_limit_s=share * HEURISTIC_BOUND_S,
        clock=meter,
    )
    left = HEURISTIC_BOUND_S - meter.spent_s
    closed = upper_bound - bound <= OPTIMALITY_REL_GAP * abs(upper_bound)
    if left <= 0 or closed or meter.unsafe():
        return bound
    if old_order == "free":
        if share == 1.0:
            return bound
        return max(bound, _slot_value(instance, objective, upper_bound, plan, bound, meter))
    far = bound < QUICK_FAR * upper_bound
    priced = lagrangian_bound(
        instance,
        old_order=old_order,
        objective=objective,
        upper_bound=upper_bound,
        time_limit_s=left,
        free_step_s=quick_free_step_s(instance, far=far),
        clock=meter,
        grid_points=QUICK_GRID_POINTS if far else GRID_POINTS,
        aim_share=QUICK_FAR_AIM_SHARE if far else None,
    )
    return max(bound, priced)


def _slots_fit(instance: LiveScalingInstance, objective: str, old_order: str) -> bool:
    """Whether the slot bound may follow the relaxation: mean latency, the free order, and
    enough steps fit in what the relaxation leaves (on (80,16) they do not: with 0.1-0.15 s
    the slot bound did not pass the relaxation's bound, which then lost its time)."""
    from blitzplan.live.bound.slots import quick_steps_s

    if (old_order, objective) != ("free", "mean_latency"):
        return False
    return quick_steps_s(instance) <= (1 - FREE_RELAXATION_SHARE) * HEURISTIC_BOUND_S


def _slot_value(
    instance: LiveScalingInstance,
    objective: str,
    upper_bound: float,
    plan: RelaxedPlan,
    bound: float,
    meter: WorkMeter,
) -> float:
    """The slot bound (mean latency; it bounds every O order) in its counted steps (the wall
    clock left to ``meter``'s safety net its limit), from the better of the heuristic's value
    ``upper_bound`` and the relaxation's ``plan`` repaired (whose completions set its slots
    and first prices); ``-inf`` when :data:`SLOT_GAP` is closed, the counted time ``meter``
    leaves of :data:`HEURISTIC_BOUND_S` too short or the objective another."""
    from blitzplan.live.bound.relaxation import repair
    from blitzplan.live.bound.slots import quick_slot_bound, quick_step_count

    if objective != "mean_latency" or HEURISTIC_BOUND_S - meter.spent_s < _MIN_SLOT_S:
        return -math.inf
    _, _, completion = timetable(instance, *repair(instance, plan))
    known = min(upper_bound, evaluate_objective(instance, completion, objective))
    if bound >= (1 - SLOT_GAP) * known:
        return -math.inf
    return quick_slot_bound(
        instance,
        upper_bound=known,
        completion_s=completion,
        time_limit_s=max(meter.wall_left_s(), _MIN_WALL_S),
        floor=bound,
        steps=quick_step_count(instance, HEURISTIC_BOUND_S - meter.spent_s),
    )
