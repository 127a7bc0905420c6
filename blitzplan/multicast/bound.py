"""A certified lower bound on the objective of any plan under the same model.

Every bound is a cut: bytes that must cross a set of edges take at least bytes / capacity, since no
fair-share rate exceeds an edge's capacity. For new instance ``i`` with startup ``s_i``, per-GPU
shard ``S`` and distinct bytes ``D = tp * S`` (every rank's shard enters once):

* ingress: each of its GPUs receives ``S`` over its in-edges: ``S / cap_in(gpu)``;
* host cut: with no source on its host, ``D`` crosses the edges into the host;
* node NICs: with no source on its host, ``D`` enters its node through the NICs of the node's
  GPUs (lanes end through the receiver's own NIC; the rest of a stripe comes over NVLink);
* source egress: ``D`` leaves the eligible sources: over the NIC uplinks of the exits they may
  use (their own GPUs and non-prefill spare GPUs of their NVLink group, or the host's NICs) when
  no target shares a source's host, else over their out-edges;
* leaf cut (all_ready): with no source among the hosts wired only to one leaf, ``D`` crosses the
  edges into that leaf's region.

``LB_i = s_i + max(...)``; all_ready takes the max over instances and leaf regions, sum_ready the
sum, live_ready the smallest ``LB_i`` (any live set holds at least one instance).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from blitzplan.multicast.setup import Problem
from blitzplan.topologies import Topology

__all__ = ["instance_bounds", "lower_bound"]


def _cap_into(topology: Topology, region: set[str]) -> float:
    return sum(
        topology.bytes_per_s((u, v))
        for v in region
        for u in topology.graph.predecessors(v)
        if u not in region
    )


def _cap_out_of(topology: Topology, nodes: Iterable[str]) -> float:
    return sum(topology.bytes_per_s((u, v)) for u in nodes for v in topology.graph.successors(u))


def _host_region(topology: Topology, host: str) -> set[str]:
    return set(topology.nodes_of_host(host))


def _source_hosts(problem: Problem) -> set[str]:
    topo = problem.topology
    hosts = set()
    for node in problem.sources:
        for name in node.host_local_nodes:
            hosts.add(str(topo.graph.nodes[name]["host"]))
    return hosts


def _nic_uplinks(topology: Topology, gpus: Iterable[str]) -> float:
    """Capacity into the NICs of ``gpus`` from their leaves (infinite without a fabric)."""
    total = 0.0
    for nic in {topology.nic_of(g) for g in gpus}:
        leaf = topology.leaf_of_nic(nic)
        total += math.inf if leaf is None else topology.bytes_per_s((leaf, nic))
    return total


def _egress_capacity(problem: Problem) -> float:
    """What the sources can emit per second: their NICs' uplinks when every target is on another
    host (all bytes then leave through exits the plan space allows), else their out-edges."""
    topo = problem.topology
    target_hosts = {topo.host_of(g) for node in problem.targets for g in node.gpus}
    if not (_source_hosts(problem) & target_hosts):
        nics = {
            exit_ if topo.kind(exit_) == "nic" else topo.nic_of(exit_)
            for node in problem.sources
            for _, exit_ in node.egress
        }
        uplinks = [(nic, leaf) for nic in nics if (leaf := topo.leaf_of_nic(nic)) is not None]
        if uplinks:
            return sum(topo.bytes_per_s(edge) for edge in uplinks)
    return _cap_out_of(topo, {n for node in problem.sources for n in node.host_local_nodes})


def instance_bounds(problem: Problem, *, local_copies: bool = False) -> dict[str, float]:
    """The per-instance lower bound ``LB_i`` on its ready time.

    ``local_copies``: the data plane may read a copy on the instance's own host (the AllCache and
    ServerlessLLM baselines), so only the per-GPU ingress cut applies.
    """
    topo = problem.topology
    source_hosts = _source_hosts(problem)
    egress = _egress_capacity(problem)
    host_cut: dict[str, float] = {}
    node_nics = {i: _nic_uplinks(topo, node.gpus) for i, node in enumerate(problem.targets)}
    bounds: dict[str, float] = {}
    for inst in problem.instances:
        shard = _missing_bytes(problem, inst.name)
        distinct = problem.tp * shard
        host = topo.host_of(inst.gpus[0])
        if host not in host_cut:
            host_cut[host] = (
                0.0 if host in source_hosts else 1.0 / _cap_into(topo, _host_region(topo, host))
            )
        ingress = max(shard / _cap_into(topo, {g}) for g in inst.gpus)
        network = 0.0
        if not local_copies:
            own_nics = 0.0 if host in source_hosts else distinct / node_nics[inst.node]
            network = max(distinct * host_cut[host], distinct / egress, own_nics)
        bounds[inst.name] = inst.startup_s + max(ingress, network)
    return bounds


def _missing_bytes(problem: Problem, name: str) -> float:
    """One GPU's shard bytes of the units ``name`` still needs."""
    have = problem.delivered.get(name, ())
    return float(sum(b for u, b in enumerate(problem.unit_bytes) if not (have and have[u])))


def _leaf_bounds(problem: Problem) -> list[float]:
    topo = problem.topology
    source_hosts = _source_hosts(problem)
    hosts_of_leaf: dict[str, list[str]] = {}
    for host in topo.hosts():
        leaves = {topo.leaf_of_nic(nic) for nic in topo.nics_of_host(host)}
        if len(leaves) == 1 and None not in leaves:
            hosts_of_leaf.setdefault(str(leaves.pop()), []).append(host)
    bounds = []
    for leaf, hosts in hosts_of_leaf.items():
        wired = {h for h in hosts if set(topo.nics_of_host(h))}
        if wired & source_hosts:
            continue
        members = [i for i in problem.instances if topo.host_of(i.gpus[0]) in wired]
        if not members:
            continue
        region = {leaf} | {n for h in wired for n in _host_region(topo, h)}
        into = _cap_into(topo, region)
        distinct = problem.tp * max(_missing_bytes(problem, i.name) for i in members)
        if into > 0:
            bounds.append(min(i.startup_s for i in members) + distinct / into)
    return bounds


def lower_bound(problem: Problem, objective: str, *, local_copies: bool = False) -> float:
    """A lower bound on ``objective`` (seconds) for any plan of ``problem``."""
    per_instance = instance_bounds(problem, local_copies=local_copies)
    if objective == "sum_ready":
        return sum(per_instance.values())
    if objective == "live_ready":
        return min(per_instance.values())
    leaves = [] if local_copies else _leaf_bounds(problem)
    return max([*per_instance.values(), *leaves])
