"""The BlitzScale greedy chain planner.

1. Sources are the eligible ones of the problem (decode/idle instances of the same identity, else
   the host copy; prefill instances only when allowed), each a node striping over its NICs.
2. ``k = min(#sources, #target nodes)`` chains, one per source, widest sources first. (The paper
   takes ``min(#sources, #live wanted, #target nodes)``; using every source is never slower and
   still leaves at least as many chain tails as live instances wanted whenever sources allow.)
3. Target nodes, widest first, each join the chain whose estimated rate after appending them is
   highest: a hop runs at most at the narrower of the sender's egress and the receiver's ingress
   (NIC uplinks, or NVLink inside a host), and across leaves at most at the leaf uplink. Ties go
   to a chain under the same leaf, then to the shorter chain. Appending widest-first orders each
   chain by decreasing bandwidth, so the slowest nodes sit at the tails: the live candidates.
4. :mod:`blitzplan.multicast.polish` then moves or swaps nodes while the real cost model (fair
   shares and the pipelined timeline) says it helps, within a deterministic budget.
"""

from __future__ import annotations

from blitzplan.multicast.setup import Problem
from blitzplan.multicast.types import PlanNode
from blitzplan.topologies import Topology

__all__ = ["greedy_structure"]


def _hosts(topology: Topology, node: PlanNode) -> set[str]:
    return {str(topology.graph.nodes[n]["host"]) for n in node.host_local_nodes}


def _leaves(topology: Topology, node: PlanNode) -> set[str | None]:
    if node.gpus:
        return {topology.leaf_of(g) for g in node.gpus}
    return {topology.leaf_of_nic(exit_) for _, exit_ in node.egress}


def _nic_rates(topology: Topology, node: PlanNode) -> dict[str, float]:
    """Each NIC a node can use, with the rate it can push through it."""
    rates: dict[str, float] = {}
    for holder, exit_ in node.egress:
        nic = exit_ if topology.kind(exit_) == "nic" else topology.nic_of(exit_)
        leaf = topology.leaf_of_nic(nic)
        if leaf is None:
            continue
        inside = topology.bottleneck_bytes_per_s(holder, nic) if holder != nic else float("inf")
        rates[nic] = max(rates.get(nic, 0.0), min(topology.bytes_per_s((nic, leaf)), inside))
    return rates


def _hop_rate(topology: Topology, sender: PlanNode, receiver: PlanNode) -> float:
    """An optimistic rate for a hop: the narrower side, capped by the leaf uplink it crosses."""
    same_host = _hosts(topology, sender) & _hosts(topology, receiver)
    if same_host and sender.gpus:
        per_gpu = topology.bottleneck_bytes_per_s(sender.gpus[0], receiver.gpus[0])
        return per_gpu * min(len(sender.gpus), len(receiver.gpus))
    if same_host:
        memory = sender.memory or ""
        return sum(topology.bottleneck_bytes_per_s(memory, g) for g in receiver.gpus)
    out = sum(_nic_rates(topology, sender).values())
    into = sum(_nic_rates(topology, receiver).values())
    rate = min(out, into)
    if not (_leaves(topology, sender) & _leaves(topology, receiver)):
        uplinks = [
            topology.bytes_per_s((leaf, "spine"))
            for leaf in _leaves(topology, receiver)
            if leaf is not None and topology.graph.has_edge(leaf, "spine")
        ]
        if uplinks:
            rate = min(rate, sum(uplinks))
    return rate


def greedy_structure(problem: Problem) -> list[tuple[int, list[int]]]:
    """``(source index, target indices in chain order)`` per chain."""
    topo = problem.topology
    sources, targets = problem.sources, problem.targets
    k = min(len(sources), len(targets))
    width = {t: sum(_nic_rates(topo, targets[t]).values()) for t in range(len(targets))}
    chosen = sorted(
        range(len(sources)),
        key=lambda i: (-sum(_nic_rates(topo, sources[i]).values()), -len(sources[i].egress), i),
    )[:k]
    chains: dict[int, list[int]] = {c: [] for c in chosen}
    rate = dict.fromkeys(chosen, float("inf"))
    for t in sorted(range(len(targets)), key=lambda t: (-width[t], -len(targets[t].gpus), t)):
        node = targets[t]

        def after(c: int, node: PlanNode = node) -> float:
            tail = targets[chains[c][-1]] if chains[c] else sources[c]
            return min(rate[c], _hop_rate(topo, tail, node))

        def preference(c: int, node: PlanNode = node) -> tuple[float, bool, int, int]:
            tail = targets[chains[c][-1]] if chains[c] else sources[c]
            shares_leaf = bool(_leaves(topo, tail) & _leaves(topo, node))
            return (-after(c), not shares_leaf, len(chains[c]), chosen.index(c))

        pick = min(chosen, key=preference)
        rate[pick] = after(pick)
        chains[pick].append(t)
    return [(c, chains[c]) for c in chosen if chains[c]]
