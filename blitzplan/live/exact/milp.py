"""The exact live-scaling MILP solved by HiGHS or CBC: rounds of solve, cut and grow.

The model is :class:`~blitzplan.live.exact.milp_model.LiveMilpModel` (its docstring states
every variable and constraint family). Each round warm-starts the solver from the incumbent,
decodes its answer (kept only if it beats the incumbent and the checker passes it), raises the
proven bound, and adds the N disjunctions its answer violates; a round whose answer has no
overlap on N is optimal. With a time limit every round's solver limit comes from the wall clock,
and a round that does not fit is not started (see :mod:`blitzplan.solvers.pulp_run`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from blitzplan.live.bound.relaxation import RelaxedPlan, repair
from blitzplan.live.exact.common import (
    MIN_ROUND_S,
    OutOfTime,
    Start,
    decode,
    finish,
    start_point,
)
from blitzplan.live.exact.milp_model import BAND, MAX_SEEDED, LiveMilpModel, planned_overlaps
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import Schedule
from blitzplan.solvers.pulp_run import solve_once

__all__ = ["BAND", "solve_milp"]


def _offer_answer(model: LiveMilpModel, start: Start) -> list[tuple[int, int, int, int]]:
    """Decode the solver's answer two ways (its N order; EDF against its O starts), keep the
    better if it beats the incumbent, and return the layer pairs that overlap in it."""
    split, new_order, old_order, overlaps = model.read()
    args = (start.objective, start.old_order, start.backend)
    start.offer(decode(start.instance, split, new_order, old_order, *args))
    plan = RelaxedPlan(old_order, split, math.nan, model.planned_old_start_s)
    start.offer(decode(start.instance, *repair(start.instance, plan), *args))
    return overlaps


@dataclass
class _Costs:
    """What a round costs around the solve itself, learned round by round (the worst seen)."""

    hand_off_s: float
    """Warm start and PuLP's hand-off to the solver, before the solver starts."""
    read_back_s: float
    """Reading the solver's answer back into PuLP."""
    after_s: float
    """Decoding the answer and growing the model, after reading it back."""

    def round_fits(self, left_s: float) -> bool:
        return left_s >= self.hand_off_s + self.read_back_s + self.after_s + MIN_ROUND_S


def solve_milp(
    instance: LiveScalingInstance,
    *,
    backend: str,
    objective: str,
    old_order: str,
    time_limit_s: float | None,
    hint: Schedule | None,
    use_relaxation: bool = True,
    warm_start: bool = True,
) -> Schedule:
    """The optimum through PuLP on ``backend`` ("highs" or "cbc"); see the module docstring.

    ``use_relaxation=False`` drops the relaxation (its bound, cut, plan and the local search):
    the model alone, warm-started from ``hint``. ``warm_start=False``: no starting solution.
    With ``time_limit_s`` every round's solver limit comes from the wall clock (see
    :mod:`blitzplan.solvers.pulp_run`); a round that does not fit is not started.
    """
    import pulp

    start = start_point(
        instance,
        objective=objective,
        old_order=old_order,
        backend=backend,
        time_limit_s=time_limit_s,
        hint=hint,
        relax=use_relaxation,
        warm=warm_start,
    )
    if start.proven():
        return finish(start, message="proven by the N-capacity relaxation")
    built = time.perf_counter()
    try:
        model = LiveMilpModel(pulp, start, start.bound)
        planned = planned_overlaps(model, start.plan.split) if start.plan is not None else []
        if len(planned) * (2 * BAND + 1) ** 2 <= MAX_SEEDED:
            model.add_disjunctions(planned)
    except OutOfTime:
        return finish(start, message=f"no time left to build the {backend} model")
    # first guesses from the build (PuLP's hand-off costs about twice building), then learned
    build_s = time.perf_counter() - built
    costs = _Costs(hand_off_s=2 * build_s, read_back_s=build_s / 2, after_s=build_s / 2)
    rounds, note, failed = _rounds(model, start, backend, costs)
    message = f"{rounds} round(s), {len(model.y)} N disjunctions{note}"
    return finish(start, message=message, failed=failed)


def _rounds(
    model: LiveMilpModel, start: Start, backend: str, costs: _Costs
) -> tuple[int, str, bool]:
    """Solve, cut and grow until optimal, proven or out of time: (rounds, note, failed)."""
    pulp, rounds = model.pulp, 0
    while costs.round_fits(start.left_s()):
        rounds += 1
        began = time.perf_counter()
        if math.isfinite(start.incumbent.objective):
            model.set_start(start.incumbent)
        called = time.perf_counter()
        try:
            found = solve_once(
                pulp,
                model.prob,
                backend,
                stop_by_s=start.deadline_s - costs.after_s,
                read_back_s=costs.read_back_s,
            )
        except pulp.PulpSolverError as exc:  # the solver process failed; keep what we have
            return rounds, f"; {backend} failed: {exc}", True
        if found.note:
            return rounds, f"; {found.note}", False
        costs.hand_off_s = max(costs.hand_off_s, called - began + found.hand_off_s)
        costs.read_back_s = max(costs.read_back_s, found.read_back_s)
        if found.bound == math.inf:
            refused = start.infeasible_round(backend)
            return rounds, f"; {refused}" if refused else "", bool(refused)
        after = time.perf_counter()
        start.raise_bound(model.from_model(found.bound))
        overlaps = _offer_answer(model, start) if found.has_solution else []
        if found.optimal and not overlaps:
            break  # optimal for a relaxation and feasible: optimal
        model.set_cut(start.bound)
        if start.proven() or not found.has_solution or not costs.round_fits(start.left_s()):
            break
        try:
            if model.add_disjunctions(overlaps) == 0:
                break
        except OutOfTime:
            break
        costs.after_s = max(costs.after_s, time.perf_counter() - after)
    return rounds, "", False
