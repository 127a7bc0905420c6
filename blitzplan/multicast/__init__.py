"""Multicast planning: which holders send a model's weights to new instances, as which stripes
over which NICs and relays, and when every unit lands (DESIGN.md sections 1.2-1.4 and 3).

The plan space is described in :mod:`blitzplan.multicast.plan_types`. The sub-packages form a
one-way pipeline, each importing only the stages before it (a test checks):

* ``setup/``: the :class:`~blitzplan.multicast.setup.problem.Problem`: targets, sources, holdings,
  link capacity left;
* ``allocation/``: ports, the widest-matrix allocation and its linear program, stripes as lanes
  written into a :class:`~blitzplan.multicast.allocation.plan_builder.PlanBuilder`;
* ``timeline/``: the cost model (fair-share rates, the pipelined recurrence) and the frozen plan;
* ``planners/``: the greedy, its local search and the baseline data planes;
* ``bound/``: the certified lower bound every plan reports (the cuts and max-flows; for the
  exact method also the overlay program over stripes, routes and live choices);
* ``exact/``: the tree packing (stripes on trees of routes, by column generation) and the
  search of the greedy's decisions, OPTIMAL only on that bound;
* ``validation/``: :func:`validate_multicast`, the independent checker.

:mod:`~blitzplan.multicast.methods` drives the stages for the greedy and exact methods (no stage
imports it); :func:`plan_multicast` checks a request, lays out its problem and calls it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Unpack

from blitzplan.cluster import ClusterState
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast.bound.lower_bound import lower_bound
from blitzplan.multicast.methods import CLOSE_ENOUGH, striped_plan
from blitzplan.multicast.plan_types import (
    ALL_RANKS,
    AllGather,
    Hop,
    Lane,
    MulticastPlan,
    NewInstance,
    NodeKind,
    PlanNode,
    Route,
)
from blitzplan.multicast.planners.baselines import BASELINES
from blitzplan.multicast.planners.greedy import context, greedy_choice
from blitzplan.multicast.refine_budget import RefineBudget
from blitzplan.multicast.setup.problem import PLACEMENTS, PrepareOptions, Problem, prepare
from blitzplan.multicast.timeline.assemble import OBJECTIVES, Built, finish, score
from blitzplan.multicast.validation.validate import validate_multicast
from blitzplan.solvers import SolveStatus
from blitzplan.units import MIB

__all__ = [
    "ALL_RANKS",
    "CLOSE_ENOUGH",
    "DEFAULT_CHUNK_BYTES",
    "METHODS",
    "OBJECTIVES",
    "PLACEMENTS",
    "AllGather",
    "Hop",
    "Lane",
    "MulticastPlan",
    "NewInstance",
    "NodeKind",
    "PlanNode",
    "Route",
    "plan_multicast",
    "validate_multicast",
]

DEFAULT_CHUNK_BYTES = 16 * MIB
"""Chunk a lane forwards as soon as it has it (store-and-forward granularity of a route)."""

METHODS = ("greedy", "exact", *BASELINES)
"""greedy: the BlitzScale planner; exact: the overlay program's bound, the tree packing on its
live choice and the search of the greedy's decisions, OPTIMAL only on the certified bound; the
rest are baseline data planes
(blitzplan.multicast.planners.baselines)."""

_LOCAL_PLANES = ("allcache", "serverlessllm")
_AUTO = "auto"


def plan_multicast(
    state: ClusterState,
    model: ModelSpec | str,
    *,
    count: int | None = None,
    targets: Sequence[Sequence[str]] | None = None,
    tp: int = 1,
    method: str = "greedy",
    objective: str = "all_ready",
    live: int | Sequence[str] = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    startup_s: float | Mapping[str, float] = 0.0,
    exclude: Iterable[str] = (),
    allow_prefill_sources: bool = False,
    time_limit_s: float | None = None,
    polish_evaluations: int | None = None,
    names: Sequence[str] | None = None,
    delivered: Mapping[str, Sequence[bool]] | None = None,
    placement: str = _AUTO,
    refine_budget: RefineBudget | None = None,
    afford: Callable[[int], int] | None = None,
    checkpoint: Callable[[str], None] | None = None,
) -> MulticastPlan:
    """Plan loading ``model`` onto new instances: ``count`` placed on free GPUs, or ``targets``.

    ``live`` new instances are marked live (they forward nothing over the network; a count, the
    planner choosing which, or their names); ``exclude``
    names failed sources (instance ids, GPUs, NICs, hosts) never to use; ``time_limit_s`` bounds
    the exact search (it answers OPTIMAL only when its plan meets the certified bound).
    ``placement`` (with ``count``): ``pack`` fills the fullest NVLink groups, ``spread`` one
    instance per group in turn (spare GPUs then relay over their NICs), ``auto`` takes the faster
    of the two under the fluid estimate (``pack`` on ties). The greedy ends with a local search of
    at most ``polish_evaluations`` plans and a linear program over its lanes, then, for
    ``all_ready`` when still 10% above its bound, a tree packing on its live choice (default:
    sized to the plan; 0 turns the refinements off, and the plan then reports the per-instance
    cut bound: no max-flow); ``refine_budget`` also bounds their time by what they could gain
    (:mod:`~blitzplan.multicast.refine_budget`; afterwards its ``cut`` says whether it skipped or
    stopped them; the best plan found is kept). ``names``
    names the new instances (default ``new0, new1, ...``); ``delivered`` marks per name the
    units an earlier plan already delivered (they take no transfer and read time 0). Every plan
    reports a certified ``lower_bound_s`` on its objective. ``afford`` (a deadline's
    checkpoint, with ``count``): once the problem is laid out, called with the number of new
    instances; an answer ``k`` below it (at least 1) plans the first ``k`` instead, as if
    ``count=k`` (the first ``k`` of ``names``, at most ``k`` live). ``checkpoint`` (a
    deadline's, greedy only) is called with a stage's name between the stages of the greedy and
    per target node as its lanes are built; it stops the call by raising.

    Background flows that end (an earlier plan's steps: ``ClusterState.flow_end_s``) share the
    links with this plan as if they ran throughout; when they leave a new instance no route,
    the plan waits until they have all ended (every new instance's ``startup_s`` is at least
    then) and plans without them. Its bound is then that of the plan space without them and
    without the wait.
    """
    started = time.perf_counter()
    _check_options(method, objective, live, polish_evaluations, time_limit_s, placement)
    spec = model if isinstance(model, ModelSpec) else load_model(model)
    options: PrepareOptions = {
        "need_sources": method not in _LOCAL_PLANES,
        "count": count,
        "targets": targets,
        "tp": tp,
        "live": live,
        "chunk_bytes": chunk_bytes,
        "startup_s": startup_s,
        "exclude": exclude,
        "allow_prefill_sources": allow_prefill_sources,
        "names": names,
        "delivered": delivered,
    }
    solve = (
        method,
        objective,
        polish_evaluations,
        time_limit_s,
        started,
        refine_budget,
        checkpoint,
    )
    ending = [f for f in state.background_flows if math.isfinite(state.flow_end_s(f))]
    try:
        problem = _afforded(state, spec, placement, options, (afford, checkpoint))
        return _solve(problem, problem, *solve)
    except InfeasibleError:
        if not ending:
            raise
    later = state.copy()  # the plan waits until the flows that end have ended
    later.clear_background_flows()
    for flow in state.background_flows:
        if flow not in ending:
            later.add_flow(flow, until_s=state.flow_end_s(flow))
    free = _afforded(later, spec, placement, options, (afford, checkpoint))
    wait = max(state.flow_end_s(f) for f in ending)
    waiting = tuple(
        dataclasses.replace(i, startup_s=max(i.startup_s, wait)) for i in free.instances
    )
    return _solve(dataclasses.replace(free, instances=waiting), free, *solve)


def _solve(
    problem: Problem,
    unwaited: Problem,
    method: str,
    objective: str,
    polish_evaluations: int | None,
    time_limit_s: float | None,
    started: float,
    refine_budget: RefineBudget | None = None,
    check: Callable[[str], None] | None = None,
) -> MulticastPlan:
    """The plan of ``problem`` with the certified bound of ``unwaited`` (the same problem
    without the wait for ending background flows, when there is one: no plan of either can
    beat it)."""
    local = method in _LOCAL_PLANES
    if method in BASELINES:
        built = BASELINES[method](problem)
        bound = lower_bound(unwaited, objective, local_copies=local)
    else:  # the time limit counts from the call (the layout too)
        limit = None if time_limit_s is None else time_limit_s - (time.perf_counter() - started)
        built, bound = striped_plan(
            problem, method, objective, polish_evaluations, limit, refine_budget, check
        )
        if unwaited is not problem:
            bound = lower_bound(unwaited, objective)
    _check_reachable(problem, built)
    status = SolveStatus.FEASIBLE
    if score(objective, built.ready_at_s, built.live) <= bound * (1 + 1e-9):
        status = SolveStatus.OPTIMAL  # meets the certified bound, so no plan is better
    return finish(
        problem,
        built,
        method=method,
        objective=objective,
        status=status,
        lower_bound_s=bound,
        started_s=started,
    )


def _check_reachable(problem: Problem, built: Built) -> None:
    """InfeasibleError naming a GPU no lane can reach (its routes cross a link the background
    flows fill) instead of a plan that never ends."""
    if all(math.isfinite(t) for t in built.ready_at_s.values()):
        return
    for lane, rate in zip(built.builder.lanes, built.timeline.rates, strict=True):
        if rate <= 0:
            edges = built.builder.flows[lane.flow].edges
            full = [e for e in edges if problem.residual.get(e, 0.0) <= 0]
            raise InfeasibleError(
                f"no route carries weights to {lane.dst}: background flows fill "
                f"{full[0] if full else edges} on every route this plan space allows"
            )
    stuck = sorted(n for n, t in built.ready_at_s.items() if not math.isfinite(t))
    raise InfeasibleError(f"no route carries weights to {', '.join(stuck)}")


def _check_options(
    method: str,
    objective: str,
    live: int | Sequence[str],
    polish_evaluations: int | None,
    time_limit_s: float | None,
    placement: str,
) -> None:
    if method not in METHODS:
        raise InvalidInputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if objective not in OBJECTIVES:
        raise InvalidInputError(
            f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}"
        )
    if objective == "live_ready" and not (
        (isinstance(live, int) and not isinstance(live, bool) and live >= 1)
        or (isinstance(live, Sequence) and not isinstance(live, str) and len(live) >= 1)
    ):
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
    if placement not in (*PLACEMENTS, _AUTO):
        raise InvalidInputError(
            f"placement must be one of {', '.join((*PLACEMENTS, _AUTO))}, got {placement!r}"
        )


def _problem(
    state: ClusterState, spec: ModelSpec, *, placement: str, **options: Unpack[PrepareOptions]
) -> Problem:
    """The problem, choosing the placement when ``auto`` (only with ``count``)."""
    if placement != _AUTO:
        return prepare(state, spec, placement=placement, **options)
    packed = prepare(state, spec, placement="pack", **options)
    count = options["count"]
    if count is None or count > AUTO_PLACEMENT_MAX or not packed.sources:
        return packed
    spread = prepare(state, spec, placement="spread", **options)
    if [i.gpus for i in spread.instances] == [i.gpus for i in packed.instances]:
        return packed
    return spread if _estimate(spread) < _estimate(packed) * (1 - 0.01) else packed


def _afforded(
    state: ClusterState,
    spec: ModelSpec,
    placement: str,
    options: PrepareOptions,
    deadline: tuple[Callable[[int], int] | None, Callable[[str], None] | None],
) -> Problem:
    """The problem of ``options``, or of as many new instances as ``afford`` says the time
    left affords (:func:`plan_multicast`); ``deadline`` is ``afford`` and the checkpoint."""
    afford, check = deadline
    problem = _problem(state, spec, placement=placement, **options)
    count = len(problem.instances)
    if afford is None or options["count"] is None:
        return problem
    if check is not None:
        check("layout")
    fewer = max(1, min(count, afford(count)))
    if fewer == count:
        return problem
    live, kept = options["live"], [i.name for i in problem.instances[:fewer]]
    changed: PrepareOptions = {
        **options,
        "count": fewer,
        "names": kept,
        "live": min(live, fewer) if isinstance(live, int) else [n for n in live if n in kept],
    }
    return _problem(state, spec, placement=placement, **changed)


def _estimate(problem: Problem) -> float:
    """The greedy's fluid time, without building lanes."""
    from blitzplan.multicast.allocation.allocate import fluid_time

    ctx = context(problem)
    choice = greedy_choice(problem, ctx, "all_ready")
    forwarding = frozenset(t for t in ctx.targets if t not in choice.live_nodes)
    return fluid_time(problem, ctx.nodes, ctx.port, choice.order, forwarding)


AUTO_PLACEMENT_MAX = 16
"""``placement="auto"`` weighs spreading against packing up to this many new instances; beyond it
packs (the two rarely differ when instances fill whole NVLink groups)."""
