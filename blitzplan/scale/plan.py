"""``plan()``: one scaling decision, from the cluster state and a request to a ScalePlan.

``plan()`` is a short driver over one module per planning rule, each a rule a serving stack
can predict (read their docstrings for the rule itself):

1. :mod:`.mutations` -- **role changes**: a request that removes prefill and adds decode
   instances changes roles in place (a rebalance: no weights move); an added decode instance
   first comes from a prefill instance changing role in place, replaced by a live-scaled
   prefill instance; decode pre-scaling with ``prescale_decode``.
2. :mod:`.releases` -- **scale-down**: what is left to remove drains, least loaded first.
3. :mod:`.room` -- **room**: the new instances the free GPUs hold; the rest is ``missing``.
   When the multicast finds no route to some placed instances and free GPUs exist that no
   holder reaches (a host whose uplink failed), the instances are placed on the reachable free
   GPUs only (in placement order, the holders' leaves first) and the hosts cut off are named:
   in ``missing`` when the request is short of room for it, else in ``notes``.
4. :mod:`.realize` -- **multicast and roles**: every new instance loads in one multicast plan;
   as many chain tails as there are old instances with a queue are live.
5. :mod:`.pairing` -- **live pairs**: live tails, earliest first layer first, pair with the old
   instances, most queued tokens first, each pair's schedule predicted by the live method.
6. :mod:`.milestones` -- first and full added capacity, queue drain (and with
   ``compare_baselines`` those of the AllCache and ServerlessLLM data planes).

Every option is a field of :class:`~blitzplan.scale.plan_options.PlanOptions`, given as one
object (``options=``) or as keywords. A request that cannot be met in full (not enough free
reachable GPUs, fewer instances to remove than asked) gives a plan for what is possible and
lists what is missing, unless ``strict``.

Several requests at once (``plan(state, [r1, r2, ...])``) give one
:class:`~blitzplan.scale.types.MultiPlan`: :mod:`.multiplan` says how they share the cluster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, overload

from blitzplan._collector import collector_paused, collector_relaxed
from blitzplan.cluster import ClusterState
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.models import ModelSpec, load_model
from blitzplan.multicast import validate_multicast
from blitzplan.multicast.planning_rate import DeadlinePassed, record_stop
from blitzplan.scale.byte_checks import check_source_bytes
from blitzplan.scale.deadline import collect_due, stopped_plan, too_short, too_short_plan
from blitzplan.scale.mutations import RoleChanges, role_changes
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import Targets, at_efficiency, realize
from blitzplan.scale.room import fit, reachable_slots
from blitzplan.scale.types import MultiPlan, ScalePlan, ScaleRequest

__all__ = ["plan", "validate_plan"]


@overload
def plan(
    state: ClusterState,
    request: ScaleRequest,
    *,
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
    **keywords: Any,
) -> ScalePlan: ...
@overload
def plan(
    state: ClusterState,
    request: Sequence[ScaleRequest],
    *,
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
    **keywords: Any,
) -> MultiPlan: ...
def plan(
    state: ClusterState,
    request: ScaleRequest | Sequence[ScaleRequest],
    *,
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
    **keywords: Any,
) -> ScalePlan | MultiPlan:
    """Plan the scaling ``request`` asks for on ``state`` (module docstring); a list of
    requests gives a MultiPlan (:mod:`.multiplan`).

    ``options`` (default: :class:`PlanOptions`'s defaults) with ``keywords``, any of its
    fields, changed: ``plan(state, request, deadline_s=0.1)``. ``compute`` times layers
    (default: a roofline on each GPU's spec); it is not recorded in the plan.

    **Anytime under** ``deadline_s``: the call returns by its deadline the best plan found so
    far; what it left out is in ``missing``, why in ``notes`` (``deadline_s: ...``), and the
    document is valid as any plan is. What that plan is depends on where the time ran out
    (:mod:`.deadline`, :mod:`blitzplan.multicast.planning_rate`):

    * before any work (the deadline is no longer than the cheapest answer, recent calls spent
      longer before their first checkpoint, or the recorded planning times afford no new
      instance): nothing was planned: no role change, release or new instance;
    * at the start (placement): only the new instances the recorded times afford are placed,
      the rest are ``missing`` (after a call under a deadline at least as long was stopped
      there: those they afford at twice the recorded load per stop, halved back by each call
      that fits; a call that load affords none is answered at once with nothing); once the
      multicast's problem is laid out it asks again at the load the call met so far and may
      place fewer;
    * in the multicast greedy (its stages, and its loops over nodes, lanes, groups of flows
      and the timeline's levels) or the transfer program, before a multicast plan is timed and
      its program built there is no partial transfer to keep (a plan's link shares and times
      hold only for all of its lanes): a stop keeps the role changes that move no weights
      (rebalances in place) and the releases; every new instance, and each mutation that
      waits for a new instance to replace it, is ``missing``. A loop stops before a step as
      long as its last would end past the stop point; from the allocation to the program's
      first step, a call whose own pace (at the shares of a plan of its size) ends past it
      does not go on: it plans afresh the share of its new instances the time left affords
      (the plan of that many, complete; at most twice: the last attempt goes on until its
      clock stops it); once the program is built, a call whose milestones and document would
      end past the stop point stops;
    * refinements: never run under a deadline; the greedy's plan is the plan (noted when it is
      more than 1 % above its bound);
    * live pairs: the pairs found by the stop point are kept, the other live instances load
      without a pair (noted);
    * milestones and the document: not stopped (the stop point keeps the time the cheapest
      answer takes);
    * the cyclic garbage collector: paused from the call's first line to its return (the
      caller's setting restored, also on an error); the pass the call's allocations made due
      runs before it returns when the time left affords its cost projected long, else the
      youngest generation's alone when that fits (the older pass then runs at a later
      allocation of the caller's), else at the caller's next allocation.
    """
    if isinstance(request, Sequence) and not isinstance(request, str):
        from blitzplan.scale.multiplan import plan_requests

        return plan_requests(state, request, plan, options=options, compute=compute, **keywords)
    # the collector is paused from the first line (reading the options allocates): under a
    # deadline no pass runs inside the call but the one :func:`collect_due` affords
    paused = collector_paused()
    with paused:
        run = Planning.timed(PlanOptions.of(options, **keywords), compute)
        if run.bounded():
            planned = _planned(state, request, run)
            if paused.enabled:
                collect_due(run)
            return planned
    with collector_relaxed():
        return _planned(state, request, run)


def _planned(state: ClusterState, request: ScaleRequest, run: Planning) -> ScalePlan:
    """The plan of one request (:func:`plan`), the collector relaxed around it."""
    options = run.options
    if not isinstance(request, ScaleRequest):
        raise InvalidInputError(f"request must be a ScaleRequest, got {type(request).__name__}")
    spec = request.model if isinstance(request.model, ModelSpec) else load_model(request.model)
    spec.check_tp(request.tp)
    identity = spec.identity  # one object for a preset: `is` spares comparing its fields
    mine = [i for i in state.instances if i.identity is identity or i.identity == identity]
    why = too_short(state, request, run)
    if why is not None:
        return too_short_plan(state, spec, request, run, mine, why)
    missing: list[str] = []
    changes = role_changes(mine, request, options, missing)
    try:
        return _realized(state, spec, request, changes, run, missing)
    except DeadlinePassed as passed:  # the best plan found so far, in time
        began = time.thread_time()
        passed.__traceback__ = None  # the partial plan is freed now, within the answer's time
        topology = at_efficiency(state, options.link_efficiency).topology
        record_stop(topology, options.deadline_s or 0.0)
        return stopped_plan(state, spec, request, run, changes, (passed, began, missing))
    except InfeasibleError:
        slots, cut = reachable_slots(
            state, spec, request.tp, allow_prefill_sources=options.allow_prefill_sources
        )
        if not cut:
            raise
    return _realized(state, spec, request, changes, run, missing, slots=slots, cut=cut)


def _realized(
    state: ClusterState,
    spec: ModelSpec,
    request: ScaleRequest,
    changes: RoleChanges,
    run: Planning,
    missing: list[str],
    *,
    slots: list[tuple[str, ...]] | None = None,
    cut: Sequence[str] = (),
) -> ScalePlan:
    """The plan of ``changes`` on the free GPUs, or on ``slots``, the reachable ones: then the
    ``cut`` sentences (the hosts no holder reaches) are in ``missing`` when the request is
    short of room, else in the notes."""
    counts = (changes.prefill, changes.decode, changes.prescale, changes.colocated)
    missing, before = list(missing), len(missing)
    prefill, decode, colocated = fit(state, spec, request.tp, counts, missing, slots=slots)
    short = len(missing) > before
    missing = [*missing[:before], *(cut if short else ()), *missing[before:]]
    if run.options.strict and missing:
        raise InfeasibleError("; ".join(missing))
    count = prefill + decode + colocated
    targets = Targets(count=count, prefill=prefill, colocated=colocated)
    if slots is not None and count:
        groups, names = tuple(slots[:count]), _names(state, count)
        targets = Targets(prefill=prefill, colocated=colocated, groups=groups, names=names)
    return realize(
        state,
        spec,
        request.tp,
        targets,
        run,
        request=_recorded(request),
        staying=changes.staying,
        mutated=changes.mutated,
        releases=changes.releases,
        missing=missing,
        notes=() if short else cut,
        replaced=changes.replaced,
    )


def _recorded(request: ScaleRequest) -> dict[str, int]:
    """What the plan records of the request (``colocated`` only when asked)."""
    counts = {"prefill": request.prefill, "decode": request.decode, "tp": request.tp}
    return counts | ({"colocated": request.colocated} if request.colocated else {})


def _names(state: ClusterState, count: int) -> tuple[str, ...]:
    return tuple(state.fresh_names("new", count))


def validate_plan(state: ClusterState, plan: ScalePlan) -> tuple[str, ...]:
    """Every rule ``plan``'s multicast breaks on ``state`` (the state it was made on), checked
    at the link efficiency the plan was computed at (:func:`~blitzplan.validate_multicast`),
    and every byte a step sends from an instance of another TP degree that its source rank
    lacks (:func:`~blitzplan.scale.byte_checks.check_source_bytes`)."""
    if plan.multicast is None:
        return ()
    derated = at_efficiency(state, plan.options.link_efficiency)
    return validate_multicast(derated, plan.multicast) + check_source_bytes(plan)
