"""``replan()``: finish a ScalePlan after a source, target or link failed part-way through.

At ``at_s`` seconds into ``plan``, a unit counts as delivered to a new instance when the plan had
it complete on every GPU of the instance by then; those units are kept (ready now, no transfer)
and only the rest is planned again, from the sources that survive, on the topology without the
failed parts. Everything in the new plan is timed from the moment of replanning.

What fails is named in ``failed``: a source instance id, a new instance name, a GPU, a NIC or a
switch, a host, or a link as a ``(node, node)`` pair (both directions go). A failed GPU takes the
instance on it down; GPUs cut off from every NIC go with the parts that cut them off. Weights of
one identity only: surviving new instances keep their delivered units (all from the plan's model)
and receive the rest from sources of that same identity, so no instance ever mixes two.
New instances that had every unit by ``at_s`` are serving and join the sources.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import networkx as nx

from blitzplan.cluster import ClusterState, Instance, Role
from blitzplan.errors import InvalidInputError
from blitzplan.scale.plan import Options, Targets, realize
from blitzplan.scale.types import NewInstanceInfo, ScalePlan
from blitzplan.topologies import Topology

__all__ = ["recover", "replan"]

Failure = str | tuple[str, str]


def replan(
    plan: ScalePlan,
    state: ClusterState,
    *,
    at_s: float,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
    options: Options | None = None,
) -> ScalePlan:
    """A new ScalePlan that completes every surviving new instance of ``plan``.

    ``state`` is the cluster as it is now (its instances, queues and host copies; the new
    instances of ``plan`` are not in it yet). ``cancelled`` names new instances no longer wanted.
    """
    current, survivors, missing = recover(
        plan, state, at_s=at_s, failed=failed, cancelled=cancelled
    )
    options = options or Options(method=plan.method, live_method=plan.live_method)
    delivered = {info.name: tuple(t <= at_s for t in info.layer_ready_s) for info in survivors}
    targets = Targets(
        prefill=sum(1 for info in survivors if info.role == "prefill"),
        groups=tuple(info.gpus for info in survivors),
        names=tuple(info.name for info in survivors),
        delivered=delivered,
    )
    mine = [i for i in current.instances if i.identity == plan.model]
    released = {r.instance for r in plan.releases}
    mutated_ids = {m.instance for m in plan.mutations}
    staying = [
        i
        for i in mine
        if i.role is Role.PREFILL and i.id not in released and i.id not in mutated_ids
    ]
    mutated = [i for i in mine if i.id in mutated_ids]
    releases = tuple(r for r in plan.releases if r.instance in {i.id for i in mine})
    return realize(
        current,
        plan.spec,
        int(plan.request.get("tp", 1)),
        targets,
        options,
        request=plan.request,
        staying=staying,
        mutated=mutated,
        releases=releases,
        missing=missing,
    )


def recover(
    plan: ScalePlan,
    state: ClusterState,
    *,
    at_s: float,
    failed: Iterable[Failure] = (),
    cancelled: Iterable[str] = (),
) -> tuple[ClusterState, list[NewInstanceInfo], list[str]]:
    """The cluster after the failures (the state :func:`replan` plans on), the new instances
    still to complete, and what was lost."""
    if not isinstance(plan, ScalePlan):
        raise InvalidInputError(f"plan must be a ScalePlan, got {type(plan).__name__}")
    if not isinstance(at_s, int | float) or isinstance(at_s, bool) or not 0 <= at_s < math.inf:
        raise InvalidInputError(f"at_s must be a finite time >= 0, got {at_s!r}")
    names = {info.name for info in plan.new_instances}
    cancelled = set(cancelled)
    for name in sorted(cancelled - names):
        raise InvalidInputError(f"cancelled names {name!r}, which is not a new instance of plan")
    failures = list(failed)
    dead_nodes, dead_links, dead_names = _classify(state, names, failures)
    topology, lost_gpus = _degrade(state.topology, dead_nodes, dead_links)
    missing = [f"{f!r} failed at {at_s:.3f} s" for f in failures]
    survivors: list[NewInstanceInfo] = []
    complete: list[NewInstanceInfo] = []
    for info in plan.new_instances:
        if info.name in cancelled:
            missing.append(f"{info.name} cancelled")
        elif info.name in dead_names or set(info.gpus) & lost_gpus:
            missing.append(f"{info.name} lost with its GPUs {list(info.gpus)}")
        elif all(t <= at_s for t in info.layer_ready_s):
            complete.append(info)
        else:
            survivors.append(info)
    current = _rebuild(state, topology, lost_gpus, dead_names, plan, complete)
    return current, survivors, missing


def _classify(
    state: ClusterState, names: set[str], failures: list[Failure]
) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """Split failures into dead topology nodes, dead links and dead instances (ids, names)."""
    topo = state.topology
    nodes: set[str] = set()
    links: set[tuple[str, str]] = set()
    instances: set[str] = set()
    by_id = {i.id: i for i in state.instances}
    for item in failures:
        if isinstance(item, tuple):
            if len(item) != 2 or not topo.graph.has_edge(*item):
                raise InvalidInputError(f"failed names link {item!r}, which is not in the topology")
            links |= {(item[0], item[1]), (item[1], item[0])}
        elif item in by_id or item in names:
            instances.add(item)
        elif item in topo.hosts():
            nodes |= set(topo.nodes_of_host(item))
        elif item in topo.graph:
            nodes.add(item)
        else:
            raise InvalidInputError(
                f"failed names {item!r}, which is neither an instance, a node, a host nor a link"
            )
    return nodes, links, instances


def _degrade(
    topology: Topology, dead_nodes: set[str], dead_links: set[tuple[str, str]]
) -> tuple[Topology, set[str]]:
    """The topology without the dead parts, and every GPU lost with them. A GPU whose own NIC
    died sends through the nearest NIC of its host that still reaches a leaf, over PCIe."""
    if not dead_nodes and not dead_links:
        return topology, set()
    graph: nx.DiGraph[str] = nx.DiGraph(topology.graph)
    graph.remove_edges_from(dead_links)
    graph.remove_nodes_from(dead_nodes)
    lost = {g for g in topology.gpus() if g in dead_nodes}
    for gpu in topology.gpus():
        if gpu in lost:
            continue
        nic = topology.nic_of(gpu)
        if topology.leaf_of_nic(nic) is None:
            continue  # no fabric to lose
        local = {
            n
            for n in topology.nodes_of_host(topology.host_of(gpu))
            if n in graph and (n == gpu or graph.nodes[n]["kind"] in ("switch", "nic"))
        }
        hops = nx.single_source_shortest_path_length(graph.subgraph(local), gpu)
        if nic in hops and _wired(graph, nic):
            continue
        wired = sorted(
            (d, n) for n, d in hops.items() if graph.nodes[n]["kind"] == "nic" and _wired(graph, n)
        )
        if wired:
            graph.nodes[gpu]["nic"] = wired[0][1]  # its NIC is cut off: go through another
        else:
            lost.add(gpu)
    graph.remove_nodes_from(lost)
    if not any(d["kind"] == "gpu" for _, d in graph.nodes(data=True)):
        raise InvalidInputError("the failures leave no GPU in the topology")
    return Topology(graph, name=f"{topology.name} (degraded)"), lost


def _wired(graph: nx.DiGraph[str], nic: str) -> bool:
    """Whether ``nic`` still reaches a leaf switch."""
    return any(graph.nodes[n].get("switch") == "leaf" for n in graph.successors(nic))


def _rebuild(
    state: ClusterState,
    topology: Topology,
    lost_gpus: set[str],
    dead: set[str],
    plan: ScalePlan,
    complete: list[NewInstanceInfo],
) -> ClusterState:
    """The cluster now: surviving instances (same ids), host copies, background flows, and the
    new instances that are already complete."""
    if topology is state.topology and not dead and not complete:
        return state
    current = ClusterState(topology)
    for copy in state.pool.host_copies:
        if copy.node in topology.graph:
            current.pool.add(copy)
    for inst in state.instances:
        if inst.id in dead or set(inst.gpus) & lost_gpus:
            continue
        _copy_instance(current, inst)
    for info in complete:
        role = Role(info.role) if info.role in Role._value2member_map_ else Role.IDLE
        current.add_instance(plan.spec, gpus=list(info.gpus), role=role, instance_id=info.name)
    for flow in state.background_flows:
        if all(topology.graph.has_edge(*e) for e in flow.edges):
            current.add_flow(flow)
    return current


def _copy_instance(state: ClusterState, inst: Instance) -> None:
    state.add_instance(
        inst.model,
        gpus=list(inst.gpus),
        role=inst.role,
        queue=inst.queue,
        kv_bytes_used=inst.kv_bytes_used,
        instance_id=inst.id,
    )
