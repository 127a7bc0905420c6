"""The front door: ``schedule_live(instance, *, method=...)`` and its closed tables of names."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import replace

from blitzplan._checks import MAX_SECONDS, is_finite_number
from blitzplan.errors import InvalidInputError
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.loop import OLD_ORDERS, simulate
from blitzplan.live.policies import POLICIES, ZigZag
from blitzplan.live.relaxation import RelaxedPlan
from blitzplan.live.schedule import (
    Schedule,
    check_objective,
    empty_schedule,
    evaluate_objective,
    relative_gap,
    timetable,
)
from blitzplan.live.work_meter import WorkMeter
from blitzplan.solvers.backends import (
    BACKENDS,
    OPTIMALITY_REL_GAP,
    SolveStatus,
    load_backend,
    older_objects_frozen,
)

__all__ = [
    "BOUND_SAFETY",
    "BOUND_WALL_SAFETY",
    "DEFAULT_BACKEND",
    "DEFAULT_IMPROVE_S",
    "HEURISTIC_BOUND_S",
    "LIMIT_SLACK_S",
    "METHODS",
    "schedule_live",
]

METHODS: dict[str, str] = {
    "stop_the_world": "N does nothing until fully loaded, then serves whole batches",
    "best_effort": "N runs every layer it has for each batch it takes, then hands off",
    "zigzag": "the paper's priority-queue policy with an admission window (the default)",
    "exact": "the proven optimum from a backend: bnb (the default), highs, cbc, cpsat, enumerate",
    "improve": "ZigZag improved by local search within time_limit_s (default 0.1 s)",
}
"""The closed table of methods."""

DEFAULT_BACKEND = "bnb"
"""The backend ``method="exact"`` uses when none is named."""

DEFAULT_IMPROVE_S = 0.1
"""The budget of ``method="improve"`` when ``time_limit_s`` is None."""

LIMIT_SLACK_S = 0.25
"""``method="exact"`` with ``time_limit_s`` returns within ``time_limit_s + LIMIT_SLACK_S`` of
wall-clock time (the ZigZag hint, the relaxation, building the model, handing it to the
solver, solving, reading back and re-timing all count; the slack covers reading the last answer
back and re-timing it). Measured, not asserted: ``benchmarks/limits.py``."""


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
:func:`~blitzplan.live.relaxation_slots.quick_step_count`). On light instances the
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

_MIN_LEFT_S = 1e-3
"""What a solver is given when the hint took the whole limit (it then keeps the hint)."""


def _check_options(
    method: str, backend: str | None, time_limit_s: float | None, old_order: str
) -> None:
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if old_order not in OLD_ORDERS:
        raise InvalidInputError(
            f"old_order must be one of {', '.join(OLD_ORDERS)}, got {old_order!r}"
        )
    if time_limit_s is not None and not (is_finite_number(time_limit_s) and time_limit_s > 0):
        raise InvalidInputError(f"time_limit_s must be a number > 0 or None, got {time_limit_s!r}")
    if time_limit_s is not None and time_limit_s > MAX_SECONDS:
        raise InvalidInputError(
            f"time_limit_s must be at most {MAX_SECONDS:g} s, got {time_limit_s!r}"
        )
    if backend is not None and method != "exact":
        raise InvalidInputError(f"backend applies to method='exact' only, got backend={backend!r}")
    if backend is not None and backend not in BACKENDS:
        raise InvalidInputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


@functools.lru_cache(maxsize=256)
def _heuristic(
    instance: LiveScalingInstance, method: str, objective: str, old_order: str
) -> Schedule:
    """Run a policy, bound it by the relaxation, and settle its status; once per distinct
    instance (a fleet of equal pairs, as a burst on a uniform fleet plans, simulates once; the
    policies are deterministic and the schedule is frozen)."""
    return _settle(_relaxation_bounded(instance, _policy(instance, method, objective, old_order)))


@functools.lru_cache(maxsize=256)
def _policy(instance: LiveScalingInstance, method: str, objective: str, old_order: str) -> Schedule:
    """The policy's schedule alone, once per distinct instance."""
    return simulate(POLICIES[method](), instance, objective=objective, old_order=old_order)


def _relaxation_bounded(instance: LiveScalingInstance, schedule: Schedule) -> Schedule:
    """``schedule`` with the N-capacity relaxation's bound (searched for at most
    :data:`HEURISTIC_BOUND_S`; weaker, still valid, when cut) when it beats the one it has."""
    if not schedule.has_ops or math.isinf(schedule.objective):
        return schedule
    bound = _relaxation_value(
        instance, schedule.objective_name, schedule.old_order, schedule.objective
    )
    if schedule.bound is not None and bound <= schedule.bound:
        return schedule
    bound = min(bound, schedule.objective)
    return replace(schedule, bound=bound, gap=relative_gap(schedule.objective, bound))


def _settle(schedule: Schedule) -> Schedule:
    """OPTIMAL when it meets its proven bound; a missed hard SLO is UNKNOWN, or INFEASIBLE when
    the bound proves that no schedule meets it."""
    bound = schedule.bound
    if math.isinf(schedule.objective):
        if bound is not None and math.isinf(bound):
            return empty_schedule(
                status=SolveStatus.INFEASIBLE,
                objective=schedule.objective_name,
                method=schedule.method,
                old_order=schedule.old_order,
                solve_s=schedule.solve_s,
                message="a batch misses its SLO even with both instances to itself",
            )
        return replace(schedule, status=SolveStatus.UNKNOWN, message="missed a hard SLO")
    if bound is not None and schedule.objective <= bound:
        return replace(schedule, status=SolveStatus.OPTIMAL, gap=0.0)
    return schedule


@functools.lru_cache(maxsize=64)
def _relaxation_value(
    instance: LiveScalingInstance, objective: str, old_order: str, upper_bound: float
) -> float:
    """The relaxation's bound, once per instance (a fleet of equal pairs asks once), raised in
    what is left of :data:`HEURISTIC_BOUND_S` (counted work; real clocks only safety nets,
    :data:`BOUND_SAFETY`): under a FIFO order by the Lagrangian bound (its far grid, rounding
    and aim when the relaxation's bound is under ``QUICK_FAR`` of the heuristic's value), under
    the free order by the slot bound (:func:`_slot_value`)."""
    from blitzplan.live.relaxation_dp import relaxation_bound
    from blitzplan.live.relaxation_lagrange import (
        GRID_POINTS,
        QUICK_FAR_AIM_SHARE,
        QUICK_GRID_POINTS,
        lagrangian_bound,
        quick_free_step_s,
    )
    from blitzplan.live.relaxation_slots import QUICK_FAR

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
    from blitzplan.live.relaxation_slots import quick_steps_s

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
    from blitzplan.live.relaxation import repair
    from blitzplan.live.relaxation_slots import quick_slot_bound, quick_step_count

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
        time_limit_s=max(meter.wall_left_s(), _MIN_LEFT_S),
        floor=bound,
        steps=quick_step_count(instance, HEURISTIC_BOUND_S - meter.spent_s),
    )


def schedule_live(
    instance: LiveScalingInstance,
    *,
    method: str = "zigzag",
    objective: str = "mean_latency",
    backend: str | None = None,
    time_limit_s: float | None = None,
    old_order: str = "free",
    warm_start: bool = True,
    bound: bool = True,
) -> Schedule:
    """Plan how a partly loaded new instance and the old one share the queued batches.

    ``method`` is one of :data:`METHODS`; ``objective`` one of
    :data:`~blitzplan.live.schedule.OBJECTIVES`. ``method="exact"`` solves to proven optimality
    with ``backend`` (default :data:`DEFAULT_BACKEND`); with ``time_limit_s`` it returns within
    that much wall-clock time plus :data:`LIMIT_SLACK_S` (then FEASIBLE with a bound and a gap
    when not proven). A solver round that fails, is stopped or killed, or calls infeasible a
    problem that a known schedule solves never discards that schedule: the answer is the best
    schedule the checker passed, FEASIBLE with its gap (OPTIMAL only when the bound proves it).
    With ``warm_start``, ZigZag's schedule
    and the repaired N-capacity relaxation, polished by a short local search, are its starting
    point; without, the solver starts from nothing (the relaxation's bound still applies).
    ``method="improve"`` spends ``time_limit_s`` (default 0.1 s) improving ZigZag; the
    heuristics ignore it. ``old_order="fifo"`` makes O run blocks in release order. An SLO no
    schedule can meet under ``objective="hard_slo"`` gives status INFEASIBLE; bad arguments
    raise InvalidInputError, a missing backend SolverUnavailableError. ``bound=False`` (a
    deadline's) gives a heuristic's schedule without the relaxation's bound, which takes
    :data:`HEURISTIC_BOUND_S` of counted work per distinct instance (about that much CPU time;
    the wall time it takes grows with the machine's load): its status says only what the
    policy proved.
    """
    if not isinstance(instance, LiveScalingInstance):
        raise InvalidInputError(
            f"instance must be a LiveScalingInstance, got {type(instance).__name__}"
        )
    _check_options(method, backend, time_limit_s, old_order)
    check_objective(objective, instance)
    started = time.perf_counter()
    if method in POLICIES and not bound:  # a deadline's: no time for the bound
        result = _settle(_policy(instance, method, objective, old_order))
    elif method in POLICIES:
        result = _heuristic(instance, method, objective, old_order)
    elif method == "improve":
        from blitzplan.live.improve import improve

        budget = DEFAULT_IMPROVE_S if time_limit_s is None else float(time_limit_s)
        result = _settle(
            improve(instance, objective=objective, old_order=old_order, time_limit_s=budget)
        )
    else:
        result = _exact(
            instance,
            backend=backend or DEFAULT_BACKEND,
            objective=objective,
            old_order=old_order,
            time_limit_s=time_limit_s,
            warm_start=warm_start,
            started_s=started,
        )
    return _timed(result, time.perf_counter() - started)


def _timed(schedule: Schedule, solve_s: float) -> Schedule:
    """``replace(schedule, solve_s=solve_s)`` without the frozen ``__init__`` (14 fields set
    one by one: most of a cached heuristic's call); Schedule has no ``__post_init__``."""
    timed = object.__new__(Schedule)
    timed.__dict__.update(schedule.__dict__, solve_s=solve_s)
    return timed


def _exact(
    instance: LiveScalingInstance,
    *,
    backend: str,
    objective: str,
    old_order: str,
    time_limit_s: float | None,
    warm_start: bool,
    started_s: float,
) -> Schedule:
    """The exact solve; the time since ``started_s`` (importing the backend's libraries and
    its solve function's module, the ZigZag hint) is taken off ``time_limit_s``."""
    load_backend(backend, time_limit_s=time_limit_s)
    if backend == "enumerate":
        from blitzplan.live.exact.enumerate import solve_enumerate

        return solve_enumerate(
            instance, objective=objective, old_order=old_order, time_limit_s=time_limit_s
        )
    solve = _solver(backend)  # imported before the time left is taken
    hint = None
    if warm_start:
        hint = _settle(simulate(ZigZag(), instance, objective=objective, old_order=old_order))
    if hint is not None and not hint.has_ops:
        return replace(hint, method="exact", backend=backend)  # proven infeasible already
    if time_limit_s is not None:
        time_limit_s = max(time_limit_s - (time.perf_counter() - started_s), _MIN_LEFT_S)
    with older_objects_frozen():  # the collector's full passes walk the search's objects only
        return solve(
            instance,
            objective=objective,
            old_order=old_order,
            time_limit_s=time_limit_s,
            hint=hint,
            warm_start=warm_start,
        )


def _solver(backend: str) -> Callable[..., Schedule]:
    """The solve function of an exact backend other than ``enumerate`` (imported when used)."""
    if backend == "bnb":
        from blitzplan.live.exact.bnb import solve_bnb

        return solve_bnb
    if backend == "cpsat":
        from blitzplan.live.exact.cpsat import solve_cpsat

        return solve_cpsat
    from blitzplan.live.exact.milp import solve_milp

    return functools.partial(solve_milp, backend=backend)
