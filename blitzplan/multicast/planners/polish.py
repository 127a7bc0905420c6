"""Local search over the greedy's decisions under the full cost model (its last step).

Moves: swap two forwarding nodes in the order, move a forwarding node to another position, or
replace one node of the live cover by another that still covers ``live`` instances. The first move
that improves the objective (fair shares and the lane timeline, not the fluid estimate) is taken,
until none does, ``max_evaluations`` plans have been built or the optional
:class:`~blitzplan.multicast.refine_budget.RefineBudget` (a clock) is spent. Without a clock the
budget is a count, so equal input gives an identical plan.
"""

from __future__ import annotations

from collections.abc import Iterator

from blitzplan.errors import InfeasibleError
from blitzplan.multicast.planners.greedy import Choice, Context, build, ordered
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, score

__all__ = ["neighbours", "polish"]

_EPS = 1e-9


def neighbours(problem: Problem, ctx: Context, choice: Choice, objective: str) -> Iterator[Choice]:
    live = set(choice.live_nodes)
    forwarders = [t for t in choice.order if t not in live]
    tail = [t for t in choice.order if t in live]

    def assemble(order: list[int]) -> Choice:
        full = tail + order if objective == "live_ready" else order + tail
        return Choice(tuple(full), choice.live_nodes)

    for a in range(len(forwarders)):
        for b in range(a + 1, len(forwarders)):
            swapped = list(forwarders)
            swapped[a], swapped[b] = swapped[b], swapped[a]
            yield assemble(swapped)
    for a, node in enumerate(forwarders):
        rest = forwarders[:a] + forwarders[a + 1 :]
        for position in range(len(rest) + 1):
            if position != a:
                yield assemble([*rest[:position], node, *rest[position:]])
    if problem.live_names:
        return  # the live instances are given
    offset = len(problem.sources)
    count = {t: sum(1 for i in problem.instances if i.node + offset == t) for t in ctx.targets}
    for old in choice.live_nodes:
        for new in forwarders:
            cover = tuple(new if t == old else t for t in choice.live_nodes)
            if sum(count[t] for t in cover) >= problem.live:
                yield Choice(ordered(problem, ctx, cover, objective), cover)


def polish(
    problem: Problem,
    ctx: Context,
    start: Choice,
    built: Built,
    objective: str,
    *,
    max_evaluations: int,
    budget: RefineBudget | None = None,
) -> tuple[Choice, Built]:
    """Improve ``start`` (already built as ``built``) by first-improvement local search."""
    best, value, choice = built, score(objective, built.ready_at_s, built.live), start
    seen = {start}
    evaluations = 0
    improved = True
    while improved and evaluations < max_evaluations:
        improved = False
        for candidate in neighbours(problem, ctx, choice, objective):
            if evaluations >= max_evaluations or (budget is not None and budget.spent()):
                return choice, best
            if candidate in seen:
                continue
            seen.add(candidate)
            evaluations += 1
            try:
                trial = build(problem, ctx, candidate)
            except InfeasibleError:
                continue
            trial_value = score(objective, trial.ready_at_s, trial.live)
            if trial_value < value * (1 - _EPS):
                best, value, choice, improved = trial, trial_value, candidate, True
                break
    return choice, best
