"""Multicast planning: which sources send a model's weights to new instances, in which chains,
and when every unit lands (DESIGN.md sections 1.1-1.4 and 3)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast.assemble import OBJECTIVES, Built, evaluate_structure, finish, score
from blitzplan.multicast.baselines import BASELINES
from blitzplan.multicast.bound import lower_bound
from blitzplan.multicast.exact import exact_search
from blitzplan.multicast.greedy import greedy_structure
from blitzplan.multicast.polish import polish
from blitzplan.multicast.setup import Problem, prepare
from blitzplan.multicast.types import (
    AllGather,
    Chain,
    Hop,
    Lane,
    MulticastPlan,
    NewInstance,
    NodeKind,
    PlanNode,
)
from blitzplan.multicast.validate import validate_multicast
from blitzplan.solvers import SolveStatus
from blitzplan.units import MIB

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "METHODS",
    "OBJECTIVES",
    "AllGather",
    "Chain",
    "Hop",
    "Lane",
    "MulticastPlan",
    "NewInstance",
    "NodeKind",
    "PlanNode",
    "plan_multicast",
    "validate_multicast",
]

DEFAULT_CHUNK_BYTES = 16 * MIB
"""Chunk a hop forwards as soon as it has it (store-and-forward granularity of a chain)."""

METHODS = ("greedy", "exact", *BASELINES)
"""greedy: the BlitzScale planner; exact: exhaustive search of chain structures; the rest are
baseline data planes (see blitzplan.multicast.baselines)."""

_LOCAL_PLANES = ("allcache", "serverlessllm")


def plan_multicast(
    state: ClusterState,
    model: ModelSpec | str,
    *,
    count: int | None = None,
    targets: Sequence[Sequence[str]] | None = None,
    tp: int = 1,
    method: str = "greedy",
    objective: str = "all_ready",
    live: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    startup_s: float | Mapping[str, float] = 0.0,
    exclude: Iterable[str] = (),
    allow_prefill_sources: bool = False,
    time_limit_s: float | None = None,
    polish_evaluations: int | None = None,
    names: Sequence[str] | None = None,
    delivered: Mapping[str, Sequence[bool]] | None = None,
) -> MulticastPlan:
    """Plan loading ``model`` onto new instances: ``count`` placed on free GPUs, or ``targets``.

    ``live`` new instances are marked live (chain tails that forward nothing); ``exclude`` names
    failed sources (instance ids, GPUs, hosts) never to use; ``time_limit_s`` bounds the exact
    search (FEASIBLE with the gap when it runs out). The greedy ends with a local search of at
    most ``polish_evaluations`` structures (default: sized to the plan, none beyond 16 target
    nodes; 0 turns it off). ``names`` names the new instances (default ``new0, new1, ...``);
    ``delivered`` marks per name the units an earlier plan already delivered (:func:`replan`
    reuses them: they take no transfer and are ready at time 0). Every plan reports a certified
    ``lower_bound_s`` on its objective.
    """
    started = time.perf_counter()
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if objective not in OBJECTIVES:
        raise InvalidInputError(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}"
        )
    if objective == "live_ready" and live < 1:
        raise InvalidInputError(f"objective 'live_ready' needs live >= 1, got live={live!r}")
    if polish_evaluations is not None and (
        isinstance(polish_evaluations, bool)
        or not isinstance(polish_evaluations, int)
        or polish_evaluations < 0
    ):
        raise InvalidInputError(
            f"polish_evaluations must be an integer >= 0, got {polish_evaluations!r}"
        )
    if time_limit_s is not None and not time_limit_s > 0:
        raise InvalidInputError(f"time_limit_s must be > 0, got {time_limit_s!r}")
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    problem = prepare(
        state,
        spec,
        count=count,
        targets=targets,
        tp=tp,
        live=live,
        chunk_bytes=chunk_bytes,
        startup_s=startup_s,
        exclude=exclude,
        allow_prefill_sources=allow_prefill_sources,
        names=names,
        delivered=delivered,
    )
    bound = lower_bound(problem, objective, local_copies=method in _LOCAL_PLANES)
    if method in BASELINES:
        built = BASELINES[method](problem)
        status = SolveStatus.FEASIBLE
    else:
        structure = greedy_structure(problem)
        built = evaluate_structure(problem, structure)
        budget = (
            _polish_budget(problem, built) if polish_evaluations is None else polish_evaluations
        )
        built = polish(problem, structure, built, objective, max_evaluations=budget)
        status = SolveStatus.FEASIBLE
        if method == "exact":
            result = exact_search(problem, objective, built, bound, time_limit_s=time_limit_s)
            built = result.best
            status = SolveStatus.OPTIMAL if result.proven else SolveStatus.FEASIBLE
    if score(objective, built.ready_at_s, built.live) <= bound * (1 + 1e-9):
        status = SolveStatus.OPTIMAL  # meets the certified bound, so no plan is better
    return finish(
        problem,
        built,
        method=method,
        objective=objective,
        status=status,
        lower_bound_s=bound,
        solve_s=time.perf_counter() - started,
    )


POLISH_MAX_EVALUATIONS = 200
"""At most this many structures evaluated by the greedy's local search."""
POLISH_LANE_BUDGET = 8_000
"""... and at most this many flows built across those evaluations (a count, so plans stay
deterministic): small plans get the full search, large ones little or none."""
POLISH_MAX_NODES = 16
"""No local search beyond this many target nodes (its neighbourhood grows quadratically)."""


def _polish_budget(problem: Problem, built: Built) -> int:
    if len(problem.targets) > POLISH_MAX_NODES:
        return 0
    per_evaluation = max(1, len(built.builder.flows))
    return min(POLISH_MAX_EVALUATIONS, POLISH_LANE_BUDGET // per_evaluation)
