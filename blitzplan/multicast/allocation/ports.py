"""The ports of plan nodes: what each node can send and receive over the network and its host.

A *port* is a NIC a node can use, with the rate what background flows leave lets it move
(``min`` over the NIC's link to its leaf and the host path between the NIC and the node's GPU or
memory). A node's network egress is the sum of its exits' ports, its network ingress the sum of
its GPUs' and relays' ports. A node on a host that also has a holder, or an earlier forwarding
node, can besides take bytes over that host's own links: from host DRAM down the PCIe link of every
GPU of the node and of its relays (their NVLink then gathers the stripes), or from a GPU over
NVLink or PCIe; that *local* rate is the sum of the route bottlenecks to the node's GPUs, and each
local sender's own out-links cap what it serves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from blitzplan.multicast.plan_types import NodeKind, PlanNode
from blitzplan.multicast.setup.node_memo import node_edges, node_host
from blitzplan.multicast.setup.problem import Problem
from blitzplan.topologies import Topology

__all__ = ["Ports", "ports"]


@dataclass(frozen=True)
class Ports:
    """Per plan node: NIC ports out and in (NIC -> bytes/s), hosts, and local routes.

    ``local[(s, j)]`` is the rate sender ``s`` can feed target ``j`` over their shared host's own
    links, per receiving GPU; ``local_out[s]`` what ``s``'s own out-links allow in total."""

    out: dict[int, dict[str, float]]
    into: dict[int, dict[str, float]]
    hosts: dict[int, set[str]]
    leaf: dict[str, str]
    local: dict[tuple[int, int], dict[str, float]] = field(default_factory=dict)
    local_out: dict[int, float] = field(default_factory=dict)
    combined_out: dict[int, float] = field(default_factory=dict)
    """Per memory holder: what its host's PCIe switch uplinks carry in all (local and network)."""
    local_into: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    """Per target: ``(sender, local rate)`` of every sender sharing its host."""
    need: dict[int, float] = field(default_factory=dict)
    """Per target: the bytes it still needs."""
    floor: dict[int, float] = field(default_factory=dict)
    """Per target: the least time its instance GPUs' in-links allow (shard / in-capacity)."""
    leaf_sets: dict[tuple[int, str], frozenset[str]] = field(default_factory=dict)
    fabric: Topology | None = None
    """Set when failures split the network: senders then reach only some targets."""
    reach: dict[tuple[int, int], bool] = field(default_factory=dict)

    def reaches(self, sender: int, node: int) -> bool:
        """Whether ``sender`` reaches target ``node`` over the network: never from its own host
        (traffic inside a host takes the host's own links: a local route, or none after a
        failure), else always, unless a failure split the fabric."""
        if self.hosts.get(sender, set()) & self.hosts.get(node, set()):
            return False
        if self.fabric is None:
            return True
        key = (sender, node)
        found = self.reach.get(key)
        if found is None:
            topo = self.fabric
            found = any(
                topo.nics_connected(a, b)
                for a in self.out.get(sender, {})
                for b in self.into.get(node, {})
            )
            self.reach[key] = found
        return found

    def reaches_nic(self, sender: int, nic: str) -> bool:
        """Whether ``sender`` reaches receiving NIC ``nic`` over the network."""
        if self.fabric is None:
            return True
        topo = self.fabric
        return any(topo.nics_connected(a, nic) for a in self.out.get(sender, {}))

    def egress(self, node: int) -> float:
        return sum(self.out.get(node, {}).values())

    def ingress(self, node: int) -> float:
        return sum(self.into.get(node, {}).values())

    def local_rate(self, sender: int, node: int) -> float:
        return sum(self.local.get((sender, node), {}).values())

    def local_senders(self, node: int, available: set[int]) -> list[tuple[int, float]]:
        return [(s, r) for s, r in self.local_into.get(node, []) if s in available]

    def leaves_out(self, node: int) -> frozenset[str]:
        found = self.leaf_sets.get((node, "out"))  # a sort key of the allocation: kept
        return self._leaves(node, self.out, "out") if found is None else found

    def leaves_in(self, node: int) -> frozenset[str]:
        return self._leaves(node, self.into, "in")

    def _leaves(self, node: int, ports: dict[int, dict[str, float]], way: str) -> frozenset[str]:
        key = (node, way)
        found = self.leaf_sets.get(key)
        if found is None:
            found = frozenset(self.leaf[nic] for nic in ports.get(node, {}))
            self.leaf_sets[key] = found
        return found


def _rate(problem: Problem, edges: Sequence[tuple[str, str]]) -> float:
    return min((problem.residual.get(e, 0.0) for e in edges), default=math.inf)


def ports(
    problem: Problem, nodes: Sequence[PlanNode], check: Callable[[str], None] | None = None
) -> Ports:
    """The NIC ports and local routes of every source and target node (ids = positions);
    ``check`` (a deadline's checkpoint) is called per node."""
    topo = problem.topology
    out: dict[int, dict[str, float]] = {}
    into: dict[int, dict[str, float]] = {}
    hosts: dict[int, set[str]] = {}
    leaf_of: dict[str, str] = {}
    for node in nodes:
        if check is not None:
            check("ports")
        hosts[node.id] = {str(node_host(topo, n)) for n in node.host_local_nodes}
        out[node.id] = _nic_ports(problem, node, leaf_of, outgoing=True)
        if node.kind is NodeKind.TARGET:
            into[node.id] = _nic_ports(problem, node, leaf_of, outgoing=False)
    port = Ports(out, into, hosts, leaf_of, fabric=None if topo.fabric_whole() else topo)
    _local_routes(problem, nodes, port)
    for (s, j), routes in port.local.items():
        if routes:
            port.local_into.setdefault(j, []).append((s, sum(routes.values())))
    for node in nodes:
        if node.kind is NodeKind.TARGET:
            port.need[node.id] = problem.node_bytes(node)
            shard = port.need[node.id] / problem.tp
            port.floor[node.id] = max(
                shard / max(_in_capacity(problem, g), 1e-300) for g in node.gpus
            )
    return port


def _in_capacity(problem: Problem, gpu: str) -> float:
    residual = problem.residual
    return sum([residual[e] for e in node_edges(problem.topology, gpu, out=False)])


def _nic_ports(
    problem: Problem, node: PlanNode, leaf_of: dict[str, str], *, outgoing: bool
) -> dict[str, float]:
    topo = problem.topology
    residual = problem.residual
    found: dict[str, float] = {}
    members = node.exits if outgoing else node.gpus + node.relays
    for member in members:
        routed = _port_route(topo, member, node.memory if outgoing else None, outgoing)
        if routed is None:
            continue
        nic, leaf, edges = routed
        rate = math.inf  # the least residual over the port's edges
        for edge in edges:
            left = residual.get(edge, 0.0)
            if left < rate:
                rate = left
        leaf_of[nic] = leaf
        found[nic] = max(found.get(nic, 0.0), rate)
    return {nic: rate for nic, rate in found.items() if rate > 0}


_PortRoute = tuple[str, str, tuple[tuple[str, str], ...]]
"""A port's NIC, its leaf, and the edges whose least residual is the port's rate."""


def _port_route(
    topo: Topology, member: str, memory: str | None, outgoing: bool
) -> _PortRoute | None:
    """``(nic, leaf, edges)`` of one port of ``member`` (None: its NIC reaches no leaf): the
    NIC's link to its leaf (or from it, ``outgoing=False``) first, then the host path between
    the NIC and the member (or ``memory``, for a host NIC sending a memory holder's bytes);
    the rate is the least residual over the edges. Kept per topology, whose routes never
    change."""
    cache: dict[tuple[str, str | None, bool], _PortRoute | None]
    cache = topo.memo.setdefault("port_routes", {})
    key = (member, memory, outgoing)
    if key in cache:
        return cache[key]
    nic = member if topo.kind(member) == "nic" else topo.nic_of(member)
    leaf = topo.leaf_of_nic(nic)
    found: _PortRoute | None = None
    if leaf is not None:
        if outgoing:
            start = memory if topo.kind(member) == "nic" and memory else member
            inside = tuple(topo.path_edges(start, nic)) if start != nic else ()
            found = (nic, leaf, ((nic, leaf), *inside))
        else:
            found = (nic, leaf, ((leaf, nic), *topo.path_edges(nic, member)))
    cache[key] = found
    return found


def _local_routes(problem: Problem, nodes: Sequence[PlanNode], port: Ports) -> None:
    """Fill ``port.local`` and ``port.local_out`` for sender/target pairs sharing a host."""
    topo, residual = problem.topology, problem.residual
    targets = [n for n in nodes if n.kind is NodeKind.TARGET]
    for sender in nodes:
        if sender.kind not in (NodeKind.INSTANCE, NodeKind.HOST, NodeKind.TARGET):
            continue
        start = sender.memory or sender.gpus[0]
        port.local_out[sender.id] = sum([residual[e] for e in node_edges(topo, start, out=True)])
        if sender.memory:
            port.combined_out[sender.id] = problem.below_root(sender.memory)
        for target in targets:
            if target.id == sender.id or not port.hosts[sender.id] & port.hosts[target.id]:
                continue
            same_group = sender.gpus and set(sender.gpus) & set(
                topo.nvlink_group_of(target.gpus[0])
            )
            members = (
                target.gpus if same_group or not sender.memory else target.gpus + (target.relays)
            )
            rates = {
                g: _rate(problem, topo.path_edges(start, g))
                for g in members
                if topo.has_path(start, g)
            }
            port.local[(sender.id, target.id)] = {g: r for g, r in rates.items() if r > 0}
