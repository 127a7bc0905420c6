"""Per-node facts of a topology's graph the planners read per lane or per node, kept on the
topology (its graph never changes): a dict lookup instead of the graph's views."""

from __future__ import annotations

from blitzplan.topologies import Edge, Topology

__all__ = ["node_edges", "node_host"]


def node_host(topology: Topology, node: str) -> object:
    """The ``host`` attribute of ``node`` (KeyError without one), kept per topology (a dict
    lookup instead of the graph's node view)."""
    hosts: dict[str, object] = topology.memo.setdefault("node_hosts", {})
    found = hosts.get(node)
    if found is None:
        found = hosts[node] = topology.graph.nodes[node]["host"]
    return found


def node_edges(topology: Topology, node: str, *, out: bool) -> tuple[Edge, ...]:
    """The edges out of ``node`` (``out``) or into it, in the graph's order, kept per
    topology."""
    kept: dict[tuple[str, bool], tuple[Edge, ...]] = topology.memo.setdefault("node_edges", {})
    found = kept.get((node, out))
    if found is None:
        graph = topology.graph
        if out:
            found = tuple((node, v) for v in graph.successors(node))
        else:
            found = tuple((u, node) for u in graph.predecessors(node))
        kept[node, out] = found
    return found
