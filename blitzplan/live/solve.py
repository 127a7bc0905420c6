"""The front door: ``schedule_live(instance, *, method=...)`` and its closed tables of names."""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import replace

from blitzplan._checks import MAX_SECONDS, is_finite_number
from blitzplan._collector import older_objects_frozen
from blitzplan.errors import InvalidInputError
from blitzplan.live.bound.printed import relaxation_value
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.loop import OLD_ORDERS, simulate
from blitzplan.live.policies import POLICIES, ZigZag
from blitzplan.live.schedule import (
    Schedule,
    check_objective,
    empty_schedule,
    relative_gap,
)
from blitzplan.solvers.backends import (
    BACKENDS,
    SolveStatus,
    load_backend,
)

__all__ = [
    "DEFAULT_BACKEND",
    "DEFAULT_IMPROVE_S",
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
    bound = relaxation_value(
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
