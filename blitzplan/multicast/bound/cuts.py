"""The cut bounds: bytes a new instance needs must cross every set of edges that separates it from
all holders, at most at what the background flows leave of them (see
:mod:`~blitzplan.multicast.bound.lower_bound` for the list).
"""

from __future__ import annotations

import math

from blitzplan.multicast.bound.max_flow import FlowGraph, holder_nodes
from blitzplan.multicast.setup.node_memo import node_edges, node_host
from blitzplan.multicast.setup.problem import Problem

__all__ = [
    "cap_into",
    "cut_bounds",
    "emission_bound",
    "forced_live_bound",
    "leaf_bounds",
    "missing_bytes",
    "ratio",
]


def cap_into(problem: Problem, region: set[str]) -> float:
    topo, residual = problem.topology, problem.residual
    return sum(
        [residual[e] for v in region for e in node_edges(topo, v, out=False) if e[0] not in region]
    )


def _holder_hosts(problem: Problem) -> set[str]:
    topo = problem.topology
    return {str(node_host(topo, n)) for n in holder_nodes(problem)}


def missing_bytes(problem: Problem, name: str) -> float:
    have = problem.delivered.get(name, ())
    return float(sum(b for u, b in enumerate(problem.unit_bytes) if not (have and have[u])))


def _egress_capacity(problem: Problem) -> float:
    """What holders can emit through their exits' NIC uplinks (inf when a target shares a
    holder's host: a target fed inside that host may forward through its own NICs)."""
    topo = problem.topology
    target_hosts = {topo.host_of(g) for node in problem.targets for g in node.gpus}
    if _holder_hosts(problem) & target_hosts or any(t.present for t in problem.targets):
        return math.inf
    total = 0.0
    for node in problem.sources:
        for exit_ in node.exits:
            nic = exit_ if topo.kind(exit_) == "nic" else topo.nic_of(exit_)
            leaf = topo.leaf_of_nic(nic)
            if leaf is not None:
                total += problem.residual[(nic, leaf)]
    return total


def cut_bounds(problem: Problem) -> dict[str, tuple[float, str]]:
    topo = problem.topology
    holder_hosts = _holder_hosts(problem)
    egress = _egress_capacity(problem)
    out: dict[str, tuple[float, str]] = {}
    into_host: dict[str, float] = {}  # instances of one host share its cut
    shards: dict[tuple[bool, ...], float] = {}  # and instances missing the same units their size
    for inst in problem.instances:
        have = tuple(problem.delivered.get(inst.name, ()))
        if have not in shards:
            shards[have] = missing_bytes(problem, inst.name)
        shard = shards[have]
        distinct = problem.tp * shard
        cuts = [(max(ratio(shard, cap_into(problem, {g})) for g in inst.gpus), "ingress")]
        host = topo.host_of(inst.gpus[0])
        if host not in holder_hosts:
            if host not in into_host:
                into_host[host] = cap_into(problem, set(topo.nodes_of_host(host)))
            cuts.append((ratio(distinct, into_host[host]), f"host {host}"))
            cuts.append((ratio(distinct, egress), "source egress"))
        value, kind = max(cuts)
        out[inst.name] = (inst.startup_s + value, f"{kind} of {inst.name}")
    return out


def ratio(num: float, den: float) -> float:
    if num <= 0:
        return 0.0
    return num / den if den > 0 else math.inf


def leaf_bounds(problem: Problem) -> list[tuple[float, str]]:
    topo = problem.topology
    holder_hosts = _holder_hosts(problem)
    hosts_of_leaf: dict[str, list[str]] = {}
    for host in topo.hosts():
        leaves = {topo.leaf_of_nic(nic) for nic in topo.nics_of_host(host)}
        if len(leaves) == 1 and None not in leaves:
            hosts_of_leaf.setdefault(str(leaves.pop()), []).append(host)
    bounds = []
    for leaf, hosts in hosts_of_leaf.items():
        if set(hosts) & holder_hosts:
            continue
        members = [i for i in problem.instances if topo.host_of(i.gpus[0]) in hosts]
        if not members:
            continue
        region = {leaf} | {n for h in hosts for n in topo.nodes_of_host(h)}
        distinct = problem.tp * max(missing_bytes(problem, i.name) for i in members)
        value = ratio(distinct, cap_into(problem, region))
        bounds.append((min(i.startup_s for i in members) + value, f"leaf {leaf}"))
    return bounds


def forced_live_bound(problem: Problem) -> tuple[float, str] | None:
    """The cut of the nodes every live cover must use (all_ready only).

    A target node must hold a live instance in every plan when the other nodes together hold
    fewer than ``live`` instances; such a node sends nothing over the network (it may still feed
    target nodes of its own host over the host's links). So the forced nodes of each host get
    every byte they need from outside them at least once: from holders or other new instances.
    The sum over hosts crosses the max-flow into the forced nodes."""
    topo = problem.topology
    count: dict[int, int] = {}
    for inst in problem.instances:
        count[inst.node] = count.get(inst.node, 0) + 1
    total = len(problem.instances)
    forced = [j for j, m in count.items() if total - m < problem.live]
    if len(forced) < 2:
        return None
    per_host: dict[str, float] = {}
    for j in forced:
        host = topo.host_of(problem.targets[j].gpus[0])
        per_host[host] = max(per_host.get(host, 0.0), problem.node_bytes(problem.targets[j]))
    if len(per_host) < 2:
        return None
    members = [i for i in problem.instances if i.node in forced]
    others = {
        g for j, t in enumerate(problem.targets) if j not in forced for g in (*t.gpus, *t.relays)
    }
    graph = FlowGraph(problem, extra_holders=others)
    flow = graph.max_flow(g for i in members for g in i.gpus)
    value = min(i.startup_s for i in members) + ratio(sum(per_host.values()), flow)
    return value, f"max-flow into the {len(forced)} nodes every live choice uses"


def emission_bound(problem: Problem) -> tuple[float, str] | None:
    """All deliveries together (all_ready): every target node's bytes are sent to it by a
    holder or another target node, each copy once (lanes are unicast), so their sum crosses the
    senders' out-links. A sender region is an instance's GPUs and exits, host memory below its
    root complex, or a target node's GPUs and relays (their NVLink counts only where another
    target shares it); nodes holding live instances send nothing over the network, so the
    cheapest set of nodes able to hold ``live`` instances loses its links, unless it shares a
    host with another target (it may still feed that one over the host's own links)."""
    demand = sum(problem.node_bytes(t) for t in problem.targets)
    if demand <= 0 or not problem.targets:
        return None
    target_groups = _target_groups(problem)
    supply = 0.0
    for node in problem.sources:
        if node.memory is not None:
            supply += problem.below_root(node.memory)
        else:
            supply += _region_out(
                problem, set(node.gpus) | _gpu_exits(problem, node), target_groups
            )
    cuts = [
        _region_out(problem, set(t.gpus) | set(t.relays), target_groups, own=j)
        for j, t in enumerate(problem.targets)
    ]
    supply += sum(cuts) - _live_loss(problem, cuts)
    if supply <= 0:
        return None
    start = min(i.startup_s for i in problem.instances)
    return start + demand / supply, "out-links of every possible sender"


def _target_groups(problem: Problem) -> dict[tuple[str, ...], set[int]]:
    topo = problem.topology
    groups: dict[tuple[str, ...], set[int]] = {}
    for j, t in enumerate(problem.targets):
        groups.setdefault(topo.nvlink_group_of(t.gpus[0]), set()).add(j)
    return groups


def _gpu_exits(problem: Problem, node: object) -> set[str]:
    return {e for e in node.exits if problem.topology.kind(e) == "gpu"}  # type: ignore[attr-defined]


def _region_out(
    problem: Problem,
    region: set[str],
    target_groups: dict[tuple[str, ...], set[int]],
    own: int | None = None,
) -> float:
    """Capacity of the links leaving ``region``; its NVSwitch counts only when a target node
    other than ``own`` sits in the NVLink group."""
    topo = problem.topology
    total = 0.0
    for u in region:
        others = target_groups.get(topo.nvlink_group_of(u), set()) - (
            {own} if own is not None else set()
        )
        for v in topo.graph.successors(u):
            if v in region:
                continue
            if topo.graph.nodes[v].get("switch") == "nvswitch" and not others:
                continue
            total += problem.residual[(u, v)]
    return total


def _live_loss(problem: Problem, cuts: list[float]) -> float:
    """The least out-capacity a set of target nodes holding ``live`` instances loses (a node
    sharing its host with another target node loses nothing: see :func:`emission_bound`)."""
    if problem.live <= 0:
        return 0.0
    topo = problem.topology
    hosts: dict[str, int] = {}
    for t in problem.targets:
        host = topo.host_of(t.gpus[0])
        hosts[host] = hosts.get(host, 0) + 1
    count = [0] * len(problem.targets)
    for inst in problem.instances:
        count[inst.node] += 1
    loss = [
        0.0 if hosts[topo.host_of(t.gpus[0])] > 1 else cuts[j]
        for j, t in enumerate(problem.targets)
    ]
    best = [0.0] + [math.inf] * problem.live  # best[k]: least loss covering k live instances
    for j in range(len(problem.targets)):
        for k in range(problem.live, 0, -1):
            reach = best[max(0, k - count[j])] + loss[j]
            best[k] = min(best[k], reach)
    return best[problem.live] if math.isfinite(best[problem.live]) else 0.0
