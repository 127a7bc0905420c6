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
  (:func:`~blitzplan.scale.program.delivered`; :func:`~blitzplan.scale.validate_replan` checks
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

import math
from collections.abc import Iterable
from dataclasses import dataclass

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.compute import ComputeModel
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.multicast import plan_multicast
from blitzplan.scale.plan import Options, Targets, realize
from blitzplan.scale.program import delivered
from blitzplan.scale.types import NewInstanceInfo, Release, ScalePlan
from blitzplan.topologies import Topology

__all__ = ["Recovery", "degrade", "recover", "replan"]

Failure = str | tuple[str, str]


@dataclass(frozen=True)
class Recovery:
    """The cluster after the failures and what became of the plan's new instances.

    ``state`` is the cluster on the surviving topology with the instances that survive (same
    ids), the host copies that survive, the background flows that still run, and the new
    instances that were complete (named as in the plan). ``survivors`` are the new instances
    still loading; ``lost`` says, one sentence per new instance, why it can no longer be loaded;
    ``removed`` says the same of every serving instance that no longer serves; ``stale`` of
    every instance loading under an earlier plan that can no longer count on its record.
    """

    state: ClusterState
    survivors: tuple[NewInstanceInfo, ...]
    complete: tuple[NewInstanceInfo, ...]
    lost: tuple[str, ...]
    removed: tuple[str, ...] = ()
    stale: tuple[str, ...] = ()
    """One sentence per instance loading under an earlier plan that the failures cut off from
    what its loading record depends on: it stays, loading, but is no source any more."""


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


def recover(
    plan: ScalePlan,
    state: ClusterState,
    *,
    at_s: float,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
) -> Recovery:
    """The cluster after the failures (the state :func:`replan` plans on) and the fate of every
    new instance of ``plan``."""
    if not isinstance(plan, ScalePlan):
        raise InvalidInputError(f"plan must be a ScalePlan, got {type(plan).__name__}")
    if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not 0 <= at_s < math.inf:
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    names = {info.name for info in plan.new_instances}
    cancelled = set(_names("cancelled", cancelled))
    for name in sorted(cancelled - names):
        raise InvalidInputError(f"cancelled names {name!r}, which is not a new instance of plan")
    failures = _failures(failed)
    broken = _classify(state, names, failures)
    topology, lost_gpus = degrade(state.topology, broken.nodes, broken.links)
    unlinked = _unlinked(state.topology, broken.nodes)
    lost: list[str] = []
    removed: list[str] = []
    for inst in state.instances:
        if inst.id in broken.processes:
            removed.append(f"{inst.id}'s process failed; its GPUs {list(inst.gpus)} are free")
        elif set(inst.gpus) & lost_gpus:
            removed.append(f"{inst.id} lost with its GPUs {sorted(set(inst.gpus) & lost_gpus)}")
        elif len(inst.gpus) > 1 and set(inst.gpus) & unlinked:
            broken.processes.add(inst.id)
            removed.append(f"{inst.id} lost: its tensor-parallel GPUs lost their NVSwitch")
    survivors: list[NewInstanceInfo] = []
    complete: list[NewInstanceInfo] = []
    for info in plan.new_instances:
        done = all(t <= at_s for t in info.layer_ready_s)
        if info.name in cancelled:
            lost.append(f"{info.name} cancelled")
        elif info.name in broken.processes:
            lost.append(f"{info.name}'s process failed; its GPUs {list(info.gpus)} are free")
        elif set(info.gpus) & lost_gpus:
            lost.append(f"{info.name} lost with its GPUs {sorted(set(info.gpus) & lost_gpus)}")
        elif len(info.gpus) > 1 and set(info.gpus) & unlinked:
            lost.append(f"{info.name} lost: its tensor-parallel GPUs lost their NVSwitch")
        elif done:
            complete.append(info)
        else:
            survivors.append(info)
    gone = {i.id for i in state.instances if set(i.gpus) & lost_gpus}
    stale = _stale(state, topology, broken.processes | broken.memories | gone, bool(failures))
    current = _rebuild(state, topology, lost_gpus, broken, plan, complete, set(stale))
    return Recovery(
        current,
        tuple(survivors),
        tuple(complete),
        tuple(lost),
        tuple(removed),
        tuple(stale.values()),
    )


def _stale(
    state: ClusterState, topology: Topology, failed: set[str], anything: bool
) -> dict[str, str]:
    """Instances loading under an earlier plan whose record the failures left stale
    (:meth:`~blitzplan.cluster.Loading.stale_after`; one that streams from a stale one is
    stale too), each with the sentence that says so."""
    out: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for inst in state.instances:
            if inst.loading is None or inst.id in out or inst.id in failed:
                continue
            why = inst.loading.stale_after(failed | set(out), topology, anything_failed=anything)
            if why is not None:
                out[inst.id] = (
                    f"{inst.id}, loading under an earlier plan, is no source: {why}; that plan "
                    "needs a replan too"
                )
                changed = True
    return out


@dataclass(frozen=True)
class _Broken:
    nodes: set[str]
    links: set[tuple[str, str]]
    processes: set[str]
    memories: set[str]


def _unlinked(topology: Topology, dead_nodes: set[str]) -> set[str]:
    """GPUs that survive but whose NVSwitch died: a tensor-parallel instance on them loses its
    collectives (its process fails); a single-GPU instance serves on."""
    return {
        g
        for g in topology.gpus()
        if g not in dead_nodes and topology.graph.nodes[g].get("nvlink_group") in dead_nodes
    }


def _names(what: str, items: Iterable[str]) -> list[str]:
    if isinstance(items, str) or not isinstance(items, Iterable):
        raise InvalidInputError(f"{what} must be a collection of names, got {items!r}")
    return list(items)


def _failures(failed: Iterable[Failure]) -> list[Failure]:
    if isinstance(failed, str) or not isinstance(failed, Iterable):
        raise InvalidInputError(
            f"failed must be a collection of names and (node, node) links, got {failed!r}"
        )
    out: list[Failure] = []
    for item in failed:
        if isinstance(item, str):
            out.append(item)
        elif (
            isinstance(item, tuple | list)
            and len(item) == 2
            and all(isinstance(x, str) for x in item)
        ):
            out.append((item[0], item[1]))
        else:
            raise InvalidInputError(
                f"failed names {item!r}: each failure is a name or a (node, node) link"
            )
    return out


def _classify(state: ClusterState, names: set[str], failures: list[Failure]) -> _Broken:
    """Split failures into dead topology nodes and links, dead processes and lost memories."""
    topo = state.topology
    broken = _Broken(set(), set(), set(), set())
    by_id = {i.id for i in state.instances}
    for item in failures:
        if isinstance(item, tuple):
            if not topo.graph.has_edge(*item):
                raise InvalidInputError(f"failed names link {item!r}, which is not in the topology")
            broken.links.update({(item[0], item[1]), (item[1], item[0])})
        elif item in by_id or item in names:
            broken.processes.add(item)
        elif item in topo.hosts():
            broken.nodes.update(topo.nodes_of_host(item))
        elif item in topo.graph and topo.kind(item) in ("host_mem", "ssd"):
            broken.memories.add(item)  # the data it held is gone; the node stays (no transit)
        elif item in topo.graph:
            broken.nodes.add(item)
        else:
            raise InvalidInputError(
                f"failed names {item!r}, which is neither an instance, a node, a host nor a link"
            )
    return broken


def degrade(
    topology: Topology, dead_nodes: set[str], dead_links: set[tuple[str, str]]
) -> tuple[Topology, set[str]]:
    """The topology without the dead parts (:meth:`~blitzplan.topologies.Topology.without`),
    and every GPU lost with them (failed, or cut off from every NIC of its host). The same
    failures give the same degraded topology (kept on the original, the last
    :data:`DEGRADED_KEPT` of them), so a replan and the ``recover`` after it share its caches."""
    key = (frozenset(dead_nodes), frozenset(dead_links))
    kept = topology.memo.setdefault("degraded", {})
    if key not in kept:
        degraded = topology.without(nodes=dead_nodes, links=dead_links)
        while len(kept) >= DEGRADED_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = (degraded, frozenset(set(topology.gpus()) - set(degraded.gpus())))
    degraded, lost = kept[key]
    return degraded, set(lost)


DEGRADED_KEPT = 16
"""Degraded topologies kept per topology (the most recent failure sets)."""


def _rebuild(
    state: ClusterState,
    topology: Topology,
    lost_gpus: set[str],
    broken: _Broken,
    plan: ScalePlan,
    complete: list[NewInstanceInfo],
    stale: set[str],
) -> ClusterState:
    """The cluster now: surviving instances (same ids; a stale loading record dropped), host
    copies, background flows, and the new instances that are already complete."""
    if (
        topology is state.topology
        and not broken.processes
        and not broken.memories
        and not complete
        and not stale
    ):
        return state
    current = ClusterState(topology)
    for copy in state.pool.host_copies:
        if copy.node in topology.graph and copy.node not in broken.memories:
            current.pool.add(copy)
    for inst in state.instances:
        if inst.id in broken.processes or set(inst.gpus) & lost_gpus:
            continue
        if not set(inst.gpus) <= set(topology.gpus()):
            continue
        _copy_instance(current, inst, keep_loading=inst.id not in stale)
    known = {i.id for i in current.instances}
    for info in complete:
        if info.name in known:
            continue  # the caller's state already has it
        role = Role(info.role) if info.role in Role._value2member_map_ else Role.IDLE
        current.add_instance(plan.spec, gpus=list(info.gpus), role=role, instance_id=info.name)
    for flow in state.background_flows:
        if all(topology.graph.has_edge(*e) for e in flow.edges):
            current.add_flow(flow, until_s=state.flow_end_s(flow))
    return current


def _copy_instance(state: ClusterState, inst: Instance, *, keep_loading: bool) -> None:
    state.add_instance(
        inst.model,
        gpus=list(inst.gpus),
        role=inst.role,
        queue=inst.queue,
        kv_bytes_used=inst.kv_bytes_used,
        instance_id=inst.id,
        loading=inst.loading if keep_loading else None,  # a source while its record holds
    )
