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

from collections.abc import Iterable
from dataclasses import dataclass

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError
from blitzplan.multicast import plan_multicast
from blitzplan.scale.delivered import delivered
from blitzplan.scale.plan import Options, Targets, realize
from blitzplan.scale.recovery import Failure, Recovery, recover
from blitzplan.scale.types import NewInstanceInfo, Release, ScalePlan

__all__ = ["replan"]


def replan(
    plan: ScalePlan,
    state: ClusterState,
    *,
    at_s: float,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
    options: Options | None = None,
    compute: ComputeModel | None = None,
) -> ScalePlan:
    """A new ScalePlan that completes every surviving new instance of ``plan`` (module
    docstring). ``state`` is the cluster as it is now (its instances, queues and host copies;
    the new instances of ``plan`` are not in it yet). ``options`` replaces the plan's recorded
    options; ``compute`` is the compute model to use with the recorded ones."""
    recovery = recover(plan, state, at_s=at_s, failed=failed, cancelled=cancelled)
    options = options or Options.of(plan.options, compute)
    survivors = list(recovery.survivors)

    serving = _serving(plan, recovery.state)

    def finish(survivors: list[NewInstanceInfo], missing: list[str]) -> ScalePlan:
        gpus = [g for info in survivors for g in info.gpus]
        mc = plan.multicast
        held = {}
        if mc is not None:
            held = delivered(plan.steps, mc.lane_arrival_s, mc.unit_bytes, at_s, gpus, plan.held)
        return realize(
            recovery.state,
            plan.spec,
            int(plan.request.get("tp", 1)),
            _targets(plan, survivors, at_s, options),
            options,
            request=plan.request,
            staying=serving.staying,
            mutated=serving.mutated,
            releases=serving.releases,
            missing=missing,
            held=held,
            notes=recovery.stale,
        )

    try:
        return finish(survivors, list(recovery.lost))
    except InfeasibleError as exc:
        stranded = _stranded(plan, recovery, survivors, options)
        stranded = stranded or _apart(plan, recovery, survivors, options)
        if not stranded:
            raise exc from None
    if options.strict or len(stranded) == len(survivors):
        raise InfeasibleError("; ".join([*stranded.values(), *recovery.stale]))
    rest = [s for s in survivors if s.name not in stranded]
    return finish(rest, [*recovery.lost, *stranded.values()])


def _targets(
    plan: ScalePlan, survivors: list[NewInstanceInfo], at_s: float, options: Options
) -> Targets:
    live = tuple(s.name for s in survivors if s.live)
    kept = {p.new: p.old for p in plan.live_pairs if p.new in live}
    return Targets(
        prefill=sum(1 for info in survivors if info.role == "prefill"),
        groups=tuple(info.gpus for info in survivors),
        names=tuple(info.name for info in survivors),
        delivered={info.name: tuple(t <= at_s for t in info.layer_ready_s) for info in survivors},
        roles={info.name: info.role for info in survivors},
        live=live,
        pairs=kept,
        startup_s={info.name: max(0.0, options.startup_s - at_s) for info in survivors},
    )


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
            if i.role is Role.PREFILL
            and i.id not in released
            and i.id not in mutated_ids
            and i.id not in new_names
        ],
        mutated=[i for i in mine if i.id in mutated_ids],
        releases=tuple(r for r in plan.releases if r.instance in {i.id for i in mine}),
    )


def _stranded(
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: Options
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
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: Options
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
    plan: ScalePlan, recovery: Recovery, survivors: list[NewInstanceInfo], options: Options
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
