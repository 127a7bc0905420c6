"""How the greedy and exact methods plan the striped data plane: the greedy's plan, its
refinements (local search, a linear program over its lanes, a tree packing) when they could pay,
and the exact method's search from there, each with the certified bound it reports.

It sits after every stage of the pipeline (it drives them) and no stage imports it; the package's
:func:`~blitzplan.multicast.plan_multicast` checks the request, lays out the problem and calls
it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from blitzplan.multicast.bound.lower_bound import Bound, lower_bound
from blitzplan.multicast.exact.exact_search import exact_plan
from blitzplan.multicast.exact.tree_packing import repack
from blitzplan.multicast.planners.greedy import Context, build, build_lp, context, greedy_choice
from blitzplan.multicast.planners.polish import polish
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score

CLOSE_ENOUGH = 0.01
"""A greedy plan this close to the per-instance cuts (relative) skips its refinements."""
EXACT_REFINE_SHARE = 0.3
"""Under ``method="exact"`` with a time limit (and no ``refine_budget``), the greedy's local
search and linear program end by this share of it, counted from the call: a guard, not a
budget (on the 2-core machine they took 0.2-1.7 s at load 9, but 6.7 s at load 9-10 once), so
a loaded machine still leaves the exact method the rest."""
LP_MAX_NODES = 16
"""The greedy re-allocates its final order by linear program up to this many target nodes."""
POLISH_MAX_EVALUATIONS = 60
"""At most this many plans built by the greedy's local search."""
POLISH_LANE_BUDGET = 6_000
"""... and at most this many lanes built across those evaluations (a count, so plans stay
deterministic): small plans get the full search, large ones little or none."""
POLISH_MAX_NODES = 12
"""No local search beyond this many target nodes (its neighbourhood grows quadratically)."""


def striped_plan(
    problem: Problem,
    method: str,
    objective: str,
    polish_evaluations: int | None,
    time_limit_s: float | None,
    refine_budget: RefineBudget | None = None,
    check: Callable[[str], None] | None = None,
) -> tuple[Built, Bound]:
    """The greedy (and exact) plan with its bound. A greedy plan within
    :data:`CLOSE_ENOUGH` of the per-instance cuts is final as it is: no local search, no linear
    program, no max-flow bound (each could gain less than that). ``refine_budget`` skips the
    refinements when the most they could gain (the plan's time above those cuts) pays for no
    more plan and bounds their time by it; ``check`` is the deadline's checkpoint
    (:func:`~blitzplan.multicast.plan_multicast`). The exact method with ``time_limit_s`` (the
    time left of the call's limit) ends the greedy's local search and linear program by
    :data:`EXACT_REFINE_SHARE` of it and leaves the tree packing to its own, on the overlay
    program's live choice (the greedy's packing took 0.3-2.7 s of its 10 s at load 7-9, and in
    eight traced cases its plan was never the exact method's answer)."""
    entered = time.perf_counter()
    if method == "exact" and time_limit_s is not None and refine_budget is None:
        refine_budget = RefineBudget(None, deadline=entered + EXACT_REFINE_SHARE * time_limit_s)
    if check is not None:
        check("problem")
    ctx = context(problem, check)
    if check is not None:
        check("context")
    choice = first = greedy_choice(problem, ctx, objective)
    began = time.perf_counter()
    built = build(problem, ctx, choice, check)
    evaluation_s = time.perf_counter() - began  # one choice built, in this run (and its LP's)
    cheap = lower_bound(problem, objective, cheap=True)
    value = score(objective, built.ready_at_s, built.live)
    if method == "greedy" and value <= cheap * (1 + CLOSE_ENOUGH):
        return built, cheap
    budget = _polish_budget(ctx, built) if polish_evaluations is None else polish_evaluations
    lanes = len(built.builder.lanes)
    if budget > 0 and refine_budget is not None and not refine_budget.worth(lanes, value - cheap):
        budget = 0  # they could gain less than they would cost: the greedy's plan
    if budget > 0 and len(ctx.targets) <= LP_MAX_NODES:  # once per process: not the
        import scipy.optimize  # noqa: F401  (refinements' time, nor one evaluation's)
    if refine_budget is not None:
        refine_budget.start()
    choice, built = polish(
        problem, ctx, choice, built, objective, max_evaluations=budget, budget=refine_budget
    )
    if budget > 0 and len(ctx.targets) <= LP_MAX_NODES:  # 0: no refinement at all
        began = time.perf_counter()
        refined = build_lp(problem, ctx, choice, refine_budget)
        evaluation_s += time.perf_counter() - began
        if refined is not None and score(objective, refined.ready_at_s, refined.live) < score(
            objective, built.ready_at_s, built.live
        ):
            built = refined
    if budget == 0 and method != "exact":  # no refinement: no max-flow bound (fast, no SciPy)
        return built, cheap
    bound = lower_bound(problem, objective)
    packs = budget > 0 and objective == "all_ready" and len(ctx.targets) <= POLISH_MAX_NODES
    if packs and not (method == "exact" and time_limit_s is not None):  # (it packs them later)
        lives = [frozenset(n - len(problem.sources) for n in c.live_nodes) for c in (first, choice)]
        left = None if refine_budget is None else refine_budget.left()
        built = repack(problem, lives, built, bound, left)
    if method == "exact":  # from the greedy's plan (never worse), in the time left
        left = None if time_limit_s is None else time_limit_s - (time.perf_counter() - entered)
        return exact_plan(
            problem, ctx, objective, (choice, built), left, bound=bound, evaluation_s=evaluation_s
        )
    return built, bound


def _polish_budget(ctx: Context, built: Built) -> int:
    if len(ctx.targets) > POLISH_MAX_NODES:
        return 0
    per_evaluation = max(1, len(built.builder.lanes))
    return min(POLISH_MAX_EVALUATIONS, POLISH_LANE_BUDGET // per_evaluation)
