"""``replan()``: finish a ScalePlan after something failed part-way through.

What a serving stack can rely on:

* **What fails** is named in ``failed``: a source instance id or a new instance's name (its
  *process*: the GPUs under it stay healthy and free, so they may relay or be placed on again),
  a GPU (the GPU and any instance on it), a NIC, a PCIe switch, a root complex, an NVSwitch, a
  leaf or the spine (the switch), a host's DRAM (its host copy of the model is gone), a whole
  host, or a link as a ``(node, node)`` pair (both directions go). ``cancelled`` names new
  instances no longer wanted.
* **At ``at_s`` seconds** into ``plan``, a unit counts as delivered to a new instance when the plan
  had it complete on every GPU of the instance by then; of the others, a GPU keeps (``held``)
  exactly the bytes of every step into it whose unit had arrived whole over the step
  (:func:`~blitzplan.scale.delivered.delivered`; :func:`~blitzplan.scale.validate_replan` checks
  it from the two documents). Delivered units and held bytes stay (no transfer) and only the
  rest is planned, from the sources that survive (their delivered units included), on
  the topology without the failed parts. New instances that had every unit are complete and
  serve: they join the sources. Everything in the new plan is timed from the moment of replanning.
* **Never slower than afresh.** When loading the survivors as if nothing were delivered ends at
  least :data:`RESEND_GAIN` earlier (the greedy may find fewer routes around what is held), the
  replan re-sends the delivered bytes instead and its ``notes`` say so. The fresh load is
  planned only when bounds cannot decide: a replan within that gain of its own certified bound,
  or of the fresh load's (every survivor GPU's in-links first, then its per-instance cuts),
  keeps what is held. A replan skips the
  greedy's refinements (no LP, no max-flow bound): it must be ready fast, and imports no solver.
* **While it is computed** (``now_s``, when the new plan starts, default ``at_s``): the data
  plane stops the old steps that touch a failed part or wait on one that does, runs the others
  (:func:`~blitzplan.scale.recovery.whole_steps`) until ``now_s``, then starts the new plan; what
  they are predicted to have delivered by ``now_s`` counts as held, and a step that lags its
  prediction finishes the held ranges before the new plan's steps read them.
* **A GPU is lost** when it fails, or when the failures cut it off from every NIC of its host; a
  GPU whose own NIC died sends and receives through the nearest NIC its host still reaches. A GPU
  whose host lost the fabric is not lost: it is only unreachable over the network. A GPU whose
  NVSwitch died keeps PCIe only; an instance of more than one GPU on it is lost (its tensor-parallel
  collectives fail) while its GPUs stay free.
* **Survivors keep** their roles, their live status and their live pairs, unless the failure
  forces a change (a live instance whose old instance died pairs again with another overloaded
  one); the plan's options carry over (a custom compute model is passed again); the startup still
  ahead of each survivor is what remains of the plan's.
* **Overlapping plans.** An instance still loading under an earlier plan is a source only while
  its loading record holds: when the failures hit what its arrivals depend on (the sources,
  forwarders, memories and links of its plan), the record is stale, the instance is no source,
  and the plan's ``notes`` say so (``recover(...).stale``): replan that earlier plan too.
* **What cannot be finished** is said: a surviving new instance no holder can reach any more is
  listed in ``missing`` with the reason (with ``strict``, an InfeasibleError says it instead),
  and when nothing is left to plan for the survivors the error names them all. When every
  survivor plans alone but they do not all plan together, they are taken survivor by survivor:
  those that do not plan with the ones before them are listed the same way.

Weights of one identity only: surviving new instances keep their delivered units (all from the
plan's model) and receive the rest from sources of that same identity, so no instance mixes two.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from blitzplan._collector import collector_relaxed
from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.multicast import plan_multicast
from blitzplan.scale.delivered import Held, delivered, held_bytes
from blitzplan.scale.fresh_load import fresh_bound_s, fresh_end_s, fresh_ingress_s, fresh_inputs
from blitzplan.scale.multiplan import replan_parts
from blitzplan.scale.plan_options import PlanOptions
from blitzplan.scale.planning import Planning
from blitzplan.scale.realize import Targets, realize
from blitzplan.scale.recovery import Failure, Recovery, recover, whole_steps
from blitzplan.scale.types import MultiPlan, NewInstanceInfo, Release, ScalePlan

__all__ = ["replan"]


_Plan = TypeVar("_Plan", ScalePlan, MultiPlan)
"""What ``replan`` takes and returns: a ScalePlan gives a ScalePlan, a MultiPlan a MultiPlan."""


def replan(
    plan: _Plan,
    state: ClusterState,
    *,
    at_s: float,
    now_s: float | None = None,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
    options: PlanOptions | None = None,
    compute: ComputeModel | None = None,
) -> _Plan:
    """A new ScalePlan that completes every surviving new instance of ``plan`` (module
    docstring). ``state`` is the cluster as it is now (its instances, queues and host copies;
    the new instances of ``plan`` are not in it yet). ``options`` replaces the plan's recorded
    options; ``compute`` is the compute model to use with the recorded ones. ``now_s``
    (default ``at_s``) is when the new plan starts, at least ``at_s``: the old plan's steps the
    failures leave whole run on until then, and what they deliver by then counts as held.
    A MultiPlan is repaired part by part in its priority order, one program
    (:func:`~blitzplan.scale.multiplan.replan_parts`)."""
    if isinstance(plan, MultiPlan):
        return replan_parts(
            plan,
            state,
            replan,
            at_s=at_s,
            now_s=now_s,
            failed=failed,
            cancelled=cancelled,
            options=options,
            compute=compute,
        )
    now = _now(at_s, now_s)
    with collector_relaxed():  # thousands of short-lived containers: no collector pass each call
        return _replan(plan, state, at_s, now, failed, cancelled, options, compute)


def _replan(
    plan: ScalePlan,
    state: ClusterState,
    at_s: float,
    now: float,
    failed: Iterable[Failure],
    cancelled: Iterable[str],
    options: PlanOptions | None,
    compute: ComputeModel | None,
) -> ScalePlan:
    recovery = recover(plan, state, at_s=at_s, failed=failed, cancelled=cancelled)
    options = options or plan.options
    ctx = _Context(plan, recovery, options, compute, _serving(plan, recovery.state), at_s, now)
    survivors = list(recovery.survivors)
    try:
        return _finish(ctx, survivors, list(recovery.lost))
    except InfeasibleError as exc:
        stranded = _stranded(plan, recovery, survivors, options)
        stranded = stranded or _apart(plan, recovery, survivors, options)
        if not stranded:
            raise exc from None
    if options.strict or len(stranded) == len(survivors):
        raise InfeasibleError("; ".join([*stranded.values(), *recovery.stale]))
    rest = [s for s in survivors if s.name not in stranded]
    return _finish(ctx, rest, [*recovery.lost, *stranded.values()])


@dataclass(frozen=True)
class _Context:
    """What every plan of one replan shares."""

    plan: ScalePlan
    recovery: Recovery
    options: PlanOptions
    compute: ComputeModel | None
    serving: _Serving
    at_s: float
    now_s: float


def _finish(ctx: _Context, survivors: list[NewInstanceInfo], missing: list[str]) -> ScalePlan:
    """The plan of ``survivors`` from what they hold, or afresh when that ends earlier."""
    held = _held(ctx, survivors)
    targets = _targets(ctx.plan, survivors, ctx.at_s, ctx.options, now=ctx.now_s, held=held)
    stale = ctx.recovery.stale
    kept = _realized(ctx, targets, held, missing, stale)
    if not held or kept.multicast is None:
        return kept
    end = _end_s(kept)
    if end <= kept.multicast.lower_bound_s * (1 + RESEND_GAIN):
        return kept  # no plan ends earlier: re-sending held bytes cannot beat the bound
    inputs = fresh_inputs(ctx.plan, ctx.recovery, targets, ctx.options)
    for bound in (fresh_ingress_s, fresh_bound_s):  # the cheaper first
        if end <= bound(inputs) * (1 + RESEND_GAIN):
            return kept  # a fresh load cannot end earlier than its bound: no second plan needed
    fresh = fresh_end_s(inputs)
    if not fresh < end * (1 - RESEND_GAIN):
        return kept
    note = (
        f"re-sends the bytes already delivered: loading the survivors afresh ends at "
        f"{fresh:.3f} s, keeping them at {end:.3f} s"
    )
    unheld = dataclasses.replace(targets, delivered={})
    return _realized(ctx, unheld, {}, missing, (*stale, note))


def _held(ctx: _Context, survivors: list[NewInstanceInfo]) -> Held:
    """What the survivors' GPUs have when the replan starts: what the old steps delivered by
    ``at_s``, and what the steps the failures left whole deliver by ``now_s``."""
    plan, mc = ctx.plan, ctx.plan.multicast
    if mc is None:
        return {}
    gpus = [g for info in survivors for g in info.gpus]
    held = delivered(plan.steps, mc.lane_arrival_s, mc.unit_bytes, ctx.at_s, gpus, plan.held)
    if ctx.now_s > ctx.at_s:
        whole = whole_steps(plan, ctx.recovery)
        held = delivered(whole, mc.lane_arrival_s, mc.unit_bytes, ctx.now_s, gpus, held)
    return held


def _realized(
    ctx: _Context, targets: Targets, held: Held, missing: list[str], notes: tuple[str, ...]
) -> ScalePlan:
    plan = ctx.plan
    return realize(
        ctx.recovery.state,
        plan.spec,
        int(plan.request.get("tp", 1)),
        targets,
        Planning(ctx.options, ctx.compute),
        request=plan.request,
        staying=ctx.serving.staying,
        mutated=ctx.serving.mutated,
        releases=ctx.serving.releases,
        missing=list(missing),
        held=held,
        notes=notes,
    )


RESEND_GAIN = 0.01
"""A replan re-sends delivered bytes when loading the survivors afresh ends at least this much
(relative) earlier than keeping them (the greedy may find fewer routes around what is held)."""


def _end_s(plan: ScalePlan) -> float:
    return max(plan.multicast.ready_at_s.values(), default=0.0) if plan.multicast else 0.0


def _now(at_s: float, now_s: float | None) -> float:
    if now_s is None:
        return at_s
    if isinstance(now_s, bool) or not isinstance(now_s, int | float) or not math.isfinite(now_s):
        raise InvalidInputError(f"now_s must be a finite time >= at_s, got {now_s!r}")
    if now_s < at_s:
        raise InvalidInputError(f"now_s must be >= at_s={at_s!r}, got {now_s!r}")
    return float(now_s)


def _targets(
    plan: ScalePlan,
    survivors: list[NewInstanceInfo],
    at_s: float,
    options: PlanOptions,
    *,
    now: float,
    held: Held,
) -> Targets:
    """The survivors as the replan's targets: a unit is delivered when it was complete at
    ``at_s``, or by ``now`` from held bytes alone (the steps that ran on)."""
    live = tuple(s.name for s in survivors if s.live)
    kept = {p.new: p.old for p in plan.live_pairs if p.new in live}
    whole = _whole_units(plan, held) if now > at_s else {}

    def done(info: NewInstanceInfo) -> tuple[bool, ...]:
        if not whole and type(at_s) is float:  # complete at at_s (nothing ran on after it)
            return tuple(map(at_s.__ge__, info.layer_ready_s))  # each t <= at_s
        if not whole:  # an int at_s: int.__ge__ does not compare with floats
            return tuple([t <= at_s for t in info.layer_ready_s])
        return tuple(
            t <= at_s or (t <= now and all(u in whole.get(g, ()) for g in info.gpus))
            for u, t in enumerate(info.layer_ready_s)
        )

    return Targets(
        prefill=sum(1 for info in survivors if info.role == "prefill"),
        groups=tuple(info.gpus for info in survivors),
        names=tuple(info.name for info in survivors),
        delivered={info.name: done(info) for info in survivors},
        roles={info.name: info.role for info in survivors},
        live=live,
        pairs=kept,
        startup_s={info.name: max(0.0, options.startup_s - now) for info in survivors},
    )


def _whole_units(plan: ScalePlan, held: Held) -> dict[str, set[int]]:
    """Per GPU, the units whose whole rank buffer ``held`` names."""
    if plan.multicast is None:
        return {}
    sizes = plan.multicast.unit_bytes
    return {
        gpu: {u for u, spans in units.items() if spans == [(0, sizes[u])]}
        for gpu, units in held_bytes(held, sizes).items()
    }


@dataclass(frozen=True)
class _Serving:
    staying: list[Instance]
    mutated: list[Instance]
    releases: tuple[Release, ...]


def _serving(plan: ScalePlan, current: ClusterState) -> _Serving:
    """The old instances of the plan's model that still serve, drain or mutate."""
    mine = [i for i in current.instances if i.identity == plan.model]
    released = {r.instance for r in plan.releases}
    mutated_ids = {m.instance for m in plan.mutations}
    new_names = {info.name for info in plan.new_instances}
    return _Serving(
        staying=[
            i
            for i in mine
            if i.role in (Role.PREFILL, Role.COLOCATED)
            and i.id not in released
            and i.id not in mutated_ids
            and i.id not in new_names
        ],
        mutated=[i for i in mine if i.id in mutated_ids],
        releases=tuple(r for r in plan.releases if r.instance in {i.id for i in mine}),
    )


def _stranded(
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: PlanOptions
) -> dict[str, str]:
    """Survivors no holder can reach any more (each tried alone), with the reason."""
    out = {}
    for info in survivors:
        try:
            _reach(plan, recovery, [info], options)
        except InfeasibleError as exc:
            out[info.name] = f"{info.name} cannot be finished: {exc}"
    return out


def _apart(
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: PlanOptions
) -> dict[str, str]:
    """When every survivor plans alone but not all together: survivor by survivor, those that
    do not plan together with the ones kept before them, with the reason."""
    kept: list[NewInstanceInfo] = []
    out = {}
    for info in survivors:
        try:
            _reach(plan, recovery, [*kept, info], options)
        except InfeasibleError as exc:
            names = ", ".join(k.name for k in kept)
            out[info.name] = f"{info.name} cannot be finished together with {names}: {exc}"
            continue
        kept.append(info)
    return out


def _reach(
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: PlanOptions
) -> None:
    """Raise InfeasibleError unless a plan reaches every one of ``survivors``."""
    plan_multicast(
        recovery.state,
        plan.spec,
        targets=[list(s.gpus) for s in survivors],
        names=[s.name for s in survivors],
        tp=int(plan.request.get("tp", 1)),
        allow_prefill_sources=options.allow_prefill_sources,
        chunk_bytes=options.chunk_bytes,
        polish_evaluations=0,
    )
