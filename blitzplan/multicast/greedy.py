"""The BlitzScale greedy chain planner.

1. Sources are the eligible ones of the problem (decode/idle instances of the same identity, else
   the host copy; prefill instances only when allowed), each a node striping over its NICs.
2. ``k = min(#sources, #target nodes, live or #sources)`` chains. Sources with a target on their
   own host come first (an NVLink chain), then those sharing a leaf with targets, then the widest.
3. Target nodes, widest first, join the chain whose source shares their host, else a chain whose
   source or tail shares their leaf, else the chain with the fewest GPUs so far.
4. Each chain is ordered by decreasing ingress bandwidth (same-host nodes first), so the slowest
   nodes sit at the tails, which are the live candidates.
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


def _ingress_bytes_per_s(topology: Topology, node: PlanNode) -> float:
    nics = {topology.nic_of(g) for g in node.gpus}
    return sum(
        topology.bytes_per_s((leaf, nic))
        for nic in nics
        if (leaf := topology.leaf_of_nic(nic)) is not None
    )


def greedy_structure(problem: Problem) -> list[tuple[int, list[int]]]:
    """``(source index, target indices in chain order)`` per chain."""
    topo = problem.topology
    sources, targets = problem.sources, problem.targets
    wanted = problem.live if problem.live > 0 else len(sources)
    k = min(len(sources), len(targets), wanted)
    target_hosts = set().union(*(_hosts(topo, t) for t in targets))
    target_leaves = set().union(*(_leaves(topo, t) for t in targets))

    def source_rank(i: int) -> tuple[bool, int, int, int]:
        s = sources[i]
        shared_leaves = len(_leaves(topo, s) & target_leaves)
        return (not (_hosts(topo, s) & target_hosts), -shared_leaves, -len(s.egress), i)

    chosen = sorted(range(len(sources)), key=source_rank)[:k]
    chains: dict[int, list[int]] = {c: [] for c in chosen}
    load = dict.fromkeys(chosen, 0)
    width = {t: _ingress_bytes_per_s(topo, targets[t]) for t in range(len(targets))}
    for t in sorted(range(len(targets)), key=lambda t: (-len(targets[t].gpus), -width[t], t)):
        node = targets[t]
        same_host = [c for c in chosen if _hosts(topo, sources[c]) & _hosts(topo, node)]
        same_leaf = [
            c
            for c in chosen
            if (_leaves(topo, sources[c]) | _tail_leaves(topo, problem, chains[c]))
            & _leaves(topo, node)
        ]
        pool = same_host or same_leaf or chosen
        pick = min(pool, key=lambda c: (load[c], chosen.index(c)))
        chains[pick].append(t)
        load[pick] += len(node.gpus)
    structure = []
    for c in chosen:
        host = _hosts(topo, sources[c])
        ordered = sorted(
            chains[c],
            key=lambda t: (not (_hosts(topo, targets[t]) & host), -width[t], t),
        )
        if ordered:
            structure.append((c, ordered))
    return structure


def _tail_leaves(topology: Topology, problem: Problem, chain: list[int]) -> set[str | None]:
    return _leaves(topology, problem.targets[chain[-1]]) if chain else set()
