"""``recover()``: the cluster after failures part-way through a ScalePlan, and the fate of its
new instances (what :func:`~blitzplan.scale.replan.replan` plans on; its module docstring is the
contract: what a failure names, which GPUs and instances are lost, which loading records go
stale)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from blitzplan.cluster import ClusterState, HostCopy, Instance, Role
from blitzplan.errors import InvalidInputError
from blitzplan.hostcopies import rebuild_host_copies, unloadable_models
from blitzplan.models import ModelSpec
from blitzplan.scale.types import MultiPlan, NewInstanceInfo, ScalePlan

if TYPE_CHECKING:
    from blitzplan.scale.transfer_steps import TransferStep
from blitzplan.topologies import Topology

__all__ = [
    "DEGRADED_KEPT",
    "Failure",
    "Recovery",
    "degrade",
    "recover",
    "whole_steps",
    "without_evictions",
]

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
    host_copies: tuple[str, ...] = ()
    """One sentence per host copy lost with its host or memory (where it is to be rebuilt, or
    that no host has room: :func:`~blitzplan.hostcopies.rebuild_host_copies`) and per model
    left with no host copy, none rebuilding and no instance
    (:func:`~blitzplan.hostcopies.unloadable_models`)."""
    rebuilds: tuple[HostCopy, ...] = ()
    """The lost host copies placed again under the surviving hosts' DRAM: not in ``state`` yet
    (their bytes take a rebuild); add each with ``state.pool.add`` once it is there."""


def recover(
    plan: ScalePlan | MultiPlan,
    state: ClusterState,
    *,
    at_s: float,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
) -> Recovery:
    """The cluster after the failures (the state :func:`replan` plans on) and the fate of every
    new instance of ``plan``.

    A MultiPlan recovers as a whole: its evictions are done (those still in ``state`` are taken
    out, as :func:`~blitzplan.scale.multiplan.replan_parts` does), a failure or cancellation
    naming a new instance of any part applies to it, and ``state`` is the cluster the replanned
    MultiPlan starts from (every part's complete new instances serving), the one to
    :func:`~blitzplan.apply_plan` it to."""
    parts, state = _parts(plan, state)
    if isinstance(at_s, bool) or not isinstance(at_s, int | float) or not 0 <= at_s < math.inf:
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    for part in parts:
        part.check_cluster(state)
    infos = [info for part in parts for info in part.new_instances]
    names = {info.name for info in infos}
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
    for info in infos:
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
    specs = {info.name: part.spec for part in parts for info in part.new_instances}
    current = _rebuild(state, topology, lost_gpus, broken, specs, complete, set(stale))
    avoid = _hosts_of(state, broken.memories)
    rebuilds, copies = rebuild_host_copies(state, current, avoid=avoid)
    copies += unloadable_models(state, current, rebuilds)
    return Recovery(
        current,
        tuple(survivors),
        tuple(complete),
        tuple(lost),
        tuple(removed),
        tuple(stale.values()),
        copies,
        rebuilds,
    )


def _parts(
    plan: ScalePlan | MultiPlan, state: ClusterState
) -> tuple[tuple[ScalePlan, ...], ClusterState]:
    """The plans to recover and the cluster they start on (a MultiPlan's evictions done)."""
    if isinstance(plan, MultiPlan):
        return plan.plans, without_evictions(plan, state)
    if not isinstance(plan, ScalePlan):
        raise InvalidInputError(
            f"plan must be a ScalePlan or a MultiPlan, got {type(plan).__name__}"
        )
    return (plan,), state


def without_evictions(multi: MultiPlan, state: ClusterState) -> ClusterState:
    """A copy of ``state`` without the instances ``multi`` evicted (released when it started)
    that are still in it."""
    current = state.copy()
    for eviction in multi.evictions:
        if eviction.instance in {i.id for i in current.instances}:
            current.remove_instance(eviction.instance)
    return current


def _hosts_of(state: ClusterState, memories: set[str]) -> set[str]:
    """The hosts whose memory nodes are among ``memories``."""
    return {h for h in state.topology.hosts() if state.topology.host_mem(h) in memories}


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
    if not dead_nodes:
        return set()
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
    specs: Mapping[str, ModelSpec],
    complete: list[NewInstanceInfo],
    stale: set[str],
) -> ClusterState:
    """The cluster now: surviving instances (same ids; a stale loading record dropped), host
    copies, background flows, and the new instances that are already complete (``specs``
    gives each new instance's model)."""
    if (
        topology is state.topology
        and not broken.processes
        and not broken.memories
        and not complete
        and not stale
    ):
        return state
    if topology is state.topology and not broken.memories and not complete and not stale:
        current = state.copy()  # only processes failed: the rest stays as it is
        for inst in state.instances:
            if inst.id in broken.processes:
                current.remove_instance(inst.id)
        return current
    current = ClusterState(topology)
    current.restore_counters(state.counters)  # ids stay never reused across a failure
    for copy in state.pool.host_copies:
        if copy.node in topology.graph and copy.node not in broken.memories:
            current.pool.add(copy)
    alive = set(topology.gpus())
    kept = [
        inst
        for inst in state.instances
        if inst.id not in broken.processes
        and not set(inst.gpus) & lost_gpus
        and alive.issuperset(inst.gpus)
    ]
    for is_stale, run in itertools.groupby(kept, key=lambda i: i.id in stale):  # in order
        if is_stale:
            for inst in run:
                _without_record(current, inst)
        else:
            current.keep_instances(run)  # as they are: checked when they were added
    known = {i.id for i in current.instances}
    for info in complete:
        if info.name in known:
            continue  # the caller's state already has it
        role = Role(info.role) if info.role in Role._value2member_map_ else Role.IDLE
        current.add_instance(
            specs[info.name], gpus=list(info.gpus), role=role, instance_id=info.name
        )
    for flow in state.background_flows:
        if all(topology.graph.has_edge(*e) for e in flow.edges):
            current.add_flow(flow, until_s=state.flow_end_s(flow))
    return current


def _without_record(state: ClusterState, inst: Instance) -> None:
    """Add ``inst`` to ``state`` without its stale loading record (no source any more)."""
    state.add_instance(
        inst.model,
        gpus=list(inst.gpus),
        role=inst.role,
        queue=inst.queue,
        kv_bytes_used=inst.kv_bytes_used,
        instance_id=inst.id,
    )


def whole_steps(plan: ScalePlan, recovery: Recovery) -> tuple[TransferStep, ...]:
    """The steps of ``plan`` the failures leave whole, which a data plane runs on until the
    replan starts: every link of the step's route survives, its source still holds what it
    sends (a serving instance that survives with no loading record, the surviving host copy,
    or a GPU of a new instance that survives or is complete, or a relay), and so does every
    step it waits for (``feeds``, ``after``). When anything failed, a source loading under an
    earlier plan is left out (its record may be stale)."""
    if plan.multicast is None:
        return ()
    current = recovery.state
    graph = current.topology.graph
    holding = {g for i in current.instances if i.loading is None for g in i.gpus}
    holding |= {g for info in (*recovery.survivors, *recovery.complete) for g in info.gpus}
    memories = {copy.node for copy in current.pool.host_copies}
    new_gpus = {g for info in plan.new_instances for g in info.gpus}
    anything = bool(recovery.lost or recovery.removed or recovery.stale)
    by_id = {step.id: step for step in plan.steps}
    whole: dict[int, bool] = {}

    def source_holds(step: TransferStep) -> bool:
        if step.holder == "memory":
            return step.source in memories
        if step.holder == "loading":
            return not anything and step.source in holding
        if step.holder == "plan" and step.source not in new_gpus:
            return step.source in graph  # a relay: what it forwards comes over its feeds
        return step.source in holding or step.holder == "disk"

    def ok(sid: int) -> bool:
        if sid not in whole:
            whole[sid] = False  # no cycle counts itself whole
            step = by_id[sid]
            edges = plan.multicast.flows[sid].edges if plan.multicast else ()
            whole[sid] = (
                source_holds(step)
                and all(graph.has_edge(u, v) for u, v in edges)
                and all(ok(d) for d in (*step.feeds, *step.after) if d in by_id)
            )
        return whole[sid]

    return tuple(step for step in plan.steps if ok(step.id))
