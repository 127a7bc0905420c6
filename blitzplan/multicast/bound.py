"""A certified lower bound on the objective of any plan under the same cost model.

Every bound is a cut: the bytes a new instance needs must cross every set of edges that separates
it from all holders, and no flow gets more of an edge than what the background flows leave
(``Problem.residual``). For instance ``i`` with startup ``s_i``, per-GPU shard ``S`` still
missing and distinct bytes ``D = tp * S``:

* **max-flow**: ``D / maxflow(holders -> i's GPUs)`` on the topology graph where flows may pass
  through switches, NICs and the GPUs a plan may send or relay through (sources, their spare
  GPUs, new instances, relays), leave the network only by NICs some plan node may send through
  and enter it only by NICs of new instances and relays (a plan uses no other NIC); when no
  target node lies outside ``i``'s host, none leaves by a NIC of that host (a lane inside one
  host takes no NIC, and no node elsewhere could forward it back). Holders are the sources and,
  when an earlier plan delivered units, the new instances holding them (they may forward
  those). Capacities are rounded up to whole MB/s, so the flow is never underestimated.
* **ingress**: each of ``i``'s GPUs receives ``S`` over its in-edges;
* **host**: with no holder on its host, ``D`` crosses the edges into the host;
* **source egress**: with no holder or new instance on a holder's host, ``D`` leaves the holders
  through their exits' NIC uplinks;
* **leaf** (all_ready): with no holder among the hosts wired only to one leaf, ``D`` crosses the
  edges into that leaf's region.

``LB_i = s_i + max(...)``. all_ready takes the largest; sum_ready the sum; live_ready the
``live``-th smallest (any live set has ``live`` instances). Max-flows are computed for at most
:data:`MAX_FLOWS` instances (those with the largest cut bounds first); the rest keep their cuts,
which are bounds too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from blitzplan.multicast.plan_types import NewInstance
from blitzplan.multicast.setup import Problem
from blitzplan.topologies import Topology

__all__ = [
    "MAX_FLOWS",
    "Bound",
    "emission_bound",
    "forced_live_bound",
    "instance_bounds",
    "lower_bound",
]

MAX_FLOWS = 16
"""At most this many max-flow computations per plan."""
_MB = 1e6
_BIG = 2**30


class Bound(float):
    """A lower bound in seconds that also says which cut gave it."""

    kind: str

    def __new__(cls, value: float, kind: str = "") -> Bound:
        self = super().__new__(cls, value)
        self.kind = kind
        return self


def _cap_into(problem: Problem, region: set[str]) -> float:
    topo = problem.topology
    return sum(
        problem.residual[(u, v)]
        for v in region
        for u in topo.graph.predecessors(v)
        if u not in region
    )


def _holder_nodes(problem: Problem) -> set[str]:
    nodes = {n for s in problem.sources for n in s.host_local_nodes}
    nodes |= {g for t in problem.targets if t.present for g in t.gpus}
    return nodes


def _holder_hosts(problem: Problem) -> set[str]:
    topo = problem.topology
    return {str(topo.graph.nodes[n]["host"]) for n in _holder_nodes(problem)}


def _missing_bytes(problem: Problem, name: str) -> float:
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


def _cut_bounds(problem: Problem) -> dict[str, tuple[float, str]]:
    topo = problem.topology
    holder_hosts = _holder_hosts(problem)
    egress = _egress_capacity(problem)
    out: dict[str, tuple[float, str]] = {}
    for inst in problem.instances:
        shard = _missing_bytes(problem, inst.name)
        distinct = problem.tp * shard
        cuts = [(max(_ratio(shard, _cap_into(problem, {g})) for g in inst.gpus), "ingress")]
        host = topo.host_of(inst.gpus[0])
        if host not in holder_hosts:
            region = set(topo.nodes_of_host(host))
            cuts.append((_ratio(distinct, _cap_into(problem, region)), f"host {host}"))
            cuts.append((_ratio(distinct, egress), "source egress"))
        value, kind = max(cuts)
        out[inst.name] = (inst.startup_s + value, f"{kind} of {inst.name}")
    return out


def _ratio(num: float, den: float) -> float:
    if num <= 0:
        return 0.0
    return num / den if den > 0 else math.inf


def _leaf_bounds(problem: Problem) -> list[tuple[float, str]]:
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
        distinct = problem.tp * max(_missing_bytes(problem, i.name) for i in members)
        value = _ratio(distinct, _cap_into(problem, region))
        bounds.append((min(i.startup_s for i in members) + value, f"leaf {leaf}"))
    return bounds


class _FlowGraph:
    """The topology as a sparse integer graph for :func:`scipy.sparse.csgraph.maximum_flow`.

    Edges a plan may not use carry capacity 0; a super-source feeds every holder and every new
    instance GPU has an edge to a super-sink whose capacity is opened per query."""

    def __init__(self, problem: Problem, extra_holders: Iterable[str] = ()) -> None:
        from scipy.sparse import csr_matrix

        topo = problem.topology
        base = _base_arrays(topo)
        n = len(base["names"])
        index = base["index"]
        self.source, self.sink, self.size = n, n + 1, n + 2
        passes = base["routing"].copy()
        for name in self._transit(problem):
            passes[index[name]] = True
        exit_nics, entry_nics = self._nics(problem)
        exit_ok = np.zeros(n, dtype=bool)
        entry_ok = np.zeros(n, dtype=bool)
        exit_ok[[index[x] for x in exit_nics]] = True
        entry_ok[[index[x] for x in entry_nics]] = True
        u, v = base["u"], base["v"]
        is_nic, is_fabric = base["nic"], base["fabric"]
        usable = passes[u] & passes[v]
        usable &= ~(is_nic[u] & is_fabric[v] & ~exit_ok[u])
        usable &= ~(is_fabric[u] & is_nic[v] & ~entry_ok[v])
        residual = np.fromiter((problem.residual[e] for e in base["edges"]), dtype=float)
        caps = np.where(usable, np.minimum(np.ceil(residual / _MB), _BIG), 0).astype(np.int64)
        holders = [index[h] for h in _holder_nodes(problem) | set(extra_holders)]
        gpus = sorted({index[g] for t in problem.targets for g in t.gpus})
        rows = np.concatenate([u, np.full(len(holders), self.source), gpus])
        cols = np.concatenate([v, holders, np.full(len(gpus), self.sink)])
        data = np.concatenate([caps, np.full(len(holders), _BIG), np.zeros(len(gpus))])
        matrix = csr_matrix((data.astype(np.int32), (rows, cols)), shape=(self.size, self.size))
        matrix.sort_indices()
        self.matrix = matrix
        self.exit_slots: dict[str, list[int]] = {}
        for k in np.nonzero(usable & is_nic[u] & is_fabric[v])[0]:
            a, b = int(u[k]), int(v[k])
            lo, hi = matrix.indptr[a], matrix.indptr[a + 1]
            slot = lo + int(np.searchsorted(matrix.indices[lo:hi], b))
            host = str(topo.graph.nodes[base["names"][a]]["host"])
            self.exit_slots.setdefault(host, []).append(slot)
        self.sink_slot = {}
        for g in gpus:
            lo, hi = matrix.indptr[g], matrix.indptr[g + 1]
            where = lo + int(np.searchsorted(matrix.indices[lo:hi], self.sink))
            self.sink_slot[base["names"][g]] = where
        self.index = index

    @staticmethod
    def _transit(problem: Problem) -> set[str]:
        nodes = _holder_nodes(problem)
        for node in (*problem.sources, *problem.targets):
            nodes |= {e for e in node.exits if problem.topology.kind(e) == "gpu"}
            nodes |= set(node.gpus) | set(node.relays)
        return nodes

    @staticmethod
    def _nics(problem: Problem) -> tuple[set[str], set[str]]:
        topo = problem.topology
        exits = {
            e if topo.kind(e) == "nic" else topo.nic_of(e)
            for node in (*problem.sources, *problem.targets)
            for e in node.exits
        }
        exits |= {topo.nic_of(g) for t in problem.targets if t.present for g in t.gpus}
        entries = {topo.nic_of(g) for t in problem.targets for g in (*t.gpus, *t.relays)}
        return exits, entries

    def max_flow(self, sinks: Iterable[str], *, host: str | None = None) -> float:
        """Max-flow from every holder into ``sinks``, in bytes per second (rounded up). With
        ``host``, no flow leaves by a NIC of that host (a lane to a GPU of the same host never
        takes a NIC)."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import maximum_flow

        data = self.matrix.data.copy()
        for gpu in sinks:
            data[self.sink_slot[gpu]] = _BIG
        for slot in self.exit_slots.get(host or "", []):
            data[slot] = 0
        matrix = csr_matrix(
            (data, self.matrix.indices, self.matrix.indptr), shape=self.matrix.shape
        )
        return float(maximum_flow(matrix, self.source, self.sink).flow_value) * _MB


def _base_arrays(topo: Topology) -> dict[str, Any]:
    """Index arrays of the topology's nodes and edges (cached on the topology)."""
    cached = topo.memo.get("flow_graph")
    if cached is not None:
        return cached["base"]  # type: ignore[no-any-return]
    names = list(topo.graph.nodes)
    index = {name: i for i, name in enumerate(names)}
    edges = list(topo.graph.edges)
    kinds = [topo.kind(n) for n in names]
    fabric = [topo.graph.nodes[n].get("switch") in ("leaf", "spine") for n in names]
    base: dict[str, Any] = {
        "names": names,
        "index": index,
        "edges": edges,
        "u": np.array([index[a] for a, _ in edges], dtype=np.int64),
        "v": np.array([index[b] for _, b in edges], dtype=np.int64),
        "routing": np.array([k in ("switch", "nic") for k in kinds], dtype=bool),
        "nic": np.array([k == "nic" for k in kinds], dtype=bool),
        "fabric": np.array(fabric, dtype=bool),
    }
    topo.memo["flow_graph"] = {"base": base}
    return base


def instance_bounds(
    problem: Problem, *, local_copies: bool = False, max_flows: int = MAX_FLOWS
) -> dict[str, tuple[float, str]]:
    """``LB_i`` per new instance with the cut that gives it.

    ``local_copies``: the data plane may read a copy on the instance's own host (the AllCache and
    ServerlessLLM baselines), so only the per-GPU ingress cut applies.
    """
    if local_copies:
        return {
            inst.name: (inst.startup_s + _ingress(problem, inst), f"ingress of {inst.name}")
            for inst in problem.instances
        }
    bounds = _cut_bounds(problem)
    picks = _flow_picks(problem, bounds, max_flows)
    if picks:
        graph = _FlowGraph(problem)
        for inst in picks:
            distinct = problem.tp * _missing_bytes(problem, inst.name)
            flow = graph.max_flow(inst.gpus, host=_sealed(problem, inst))
            value = inst.startup_s + _ratio(distinct, flow)
            if value > bounds[inst.name][0]:
                bounds[inst.name] = (value, f"max-flow into {inst.name}")
    return bounds


def _sealed(problem: Problem, inst: NewInstance) -> str | None:
    """``inst``'s host when no byte for it may leave that host by a NIC: a lane to a GPU of the
    same host takes none, and no target node elsewhere could send the byte back (forwarding);
    else None."""
    host = problem.topology.host_of(inst.gpus[0])
    elsewhere = any(
        problem.topology.host_of(g) != host for t in problem.targets for g in (*t.gpus, *t.relays)
    )
    return None if elsewhere else host


def _ingress(problem: Problem, inst: NewInstance) -> float:
    shard = _missing_bytes(problem, inst.name)
    return max(_ratio(shard, _cap_into(problem, {g})) for g in inst.gpus)


def _flow_picks(
    problem: Problem, bounds: dict[str, tuple[float, str]], max_flows: int
) -> list[NewInstance]:
    """One instance per target node first (largest cut bound first), then the rest."""
    ranked = sorted(problem.instances, key=lambda i: (-bounds[i.name][0], i.name))
    first: dict[int, NewInstance] = {}
    for inst in ranked:
        first.setdefault(inst.node, inst)
    rest = [i for i in ranked if first[i.node] is not i]
    return [*first.values(), *rest][:max_flows]


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
    graph = _FlowGraph(problem, extra_holders=others)
    flow = graph.max_flow(g for i in members for g in i.gpus)
    value = min(i.startup_s for i in members) + _ratio(sum(per_host.values()), flow)
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
            supply += _below_root_capacity(problem, node.memory)
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


def _below_root_capacity(problem: Problem, memory: str) -> float:
    topo = problem.topology
    total = 0.0
    for root in topo.graph.successors(memory):
        down = sum(
            problem.residual[(root, v)]
            for v in topo.graph.successors(root)
            if topo.kind(v) not in ("host_mem", "ssd")
        )
        total += min(problem.residual[(memory, root)], down)
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


def lower_bound(
    problem: Problem, objective: str, *, local_copies: bool = False, cheap: bool = False
) -> Bound:
    """A lower bound on ``objective`` (seconds) for any plan of ``problem``; ``cheap`` keeps to
    the per-instance cuts (no max-flow, no multi-node cuts): a weaker bound, quickly."""
    per_instance = instance_bounds(
        problem, local_copies=local_copies, max_flows=0 if cheap else MAX_FLOWS
    )
    values = sorted(per_instance.values())
    if objective == "sum_ready":
        return Bound(sum(v for v, _ in values), "sum of per-instance bounds")
    if objective == "live_ready":
        k = max(1, problem.live)
        return Bound(*values[k - 1]) if values else Bound(0.0)
    if not problem.instances:
        return Bound(0.0)
    cuts = [] if local_copies or cheap else _leaf_bounds(problem)
    if not (local_copies or cheap):
        cuts += [c for c in (forced_live_bound(problem), emission_bound(problem)) if c is not None]
    return Bound(*max([*values, *cuts]))
