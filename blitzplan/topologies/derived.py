"""What a derived topology (:mod:`.links`: derated, or without failed parts) keeps of its parent.

Building a Topology copies its graph, checks every node and edge and finds each GPU's NIC; on a
1,024-GPU cluster that is a sizeable fraction of a second, and every route is then searched
again. A derived topology instead shares the parent's edge attribute dicts (a Topology never
changes its graph's) and keeps the routes and NICs the derivation cannot have changed: exactly
the ones a fresh build would find (the same subgraph searched in the same order), so plans on it
are the ones a fresh build gives.
"""

from __future__ import annotations

from collections.abc import Callable, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import networkx as nx

if TYPE_CHECKING:
    from blitzplan.topologies.fairshare import Edge
    from blitzplan.topologies.graph import Topology

__all__ = ["Kept", "copy_graph", "edge_data", "kept_nics", "kept_paths", "node_data"]


@dataclass(frozen=True)
class Kept:
    """What a derivation left as the parent has it: ``hosts`` whose nodes, links and node
    attributes are all there unchanged (None: every host, and every route: only link rates
    changed), and ``fabric``: every leaf and spine switch and every link of one."""

    hosts: frozenset[str] | None
    fabric: bool


def copy_graph(
    graph: nx.DiGraph[str],
    *,
    drop_nodes: Set[str] = frozenset(),
    drop_edges: Set[tuple[str, str]] = frozenset(),
    edge_data: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> nx.DiGraph[str]:
    """``graph``'s nodes and edges but the dropped ones, in its order (as ``nx.DiGraph(graph)``
    adds them): each node with a copy of its attributes, each edge with the parent's attribute
    dict (or ``edge_data`` of it). Filled through networkx's adjacency dicts (``_node``,
    ``_succ``, ``_pred``, the storage of every DiGraph since networkx 2.0): adding 10,000 edges
    one by one took longer than the rest of a replan."""
    out: nx.DiGraph[str] = nx.DiGraph()
    out.graph.update(graph.graph)
    new, old = cast(Any, out), cast(Any, graph)  # the storage networkx's stubs do not name
    nodes, succ, pred = new._node, new._succ, new._pred
    for node, data in old._node.items():
        if node not in drop_nodes:
            nodes[node] = dict(data)
            succ[node], pred[node] = {}, {}
    for u, around in old._succ.items():
        if u not in nodes:
            continue
        out_of = succ[u]
        for v, data in around.items():
            if v in nodes and (u, v) not in drop_edges:
                out_of[v] = pred[v][u] = edge_data(data) if edge_data else data
    return out


def node_data(graph: nx.DiGraph[str]) -> dict[str, dict[str, Any]]:
    """Each node's attribute dict, in the graph's order."""
    return dict(cast(Any, graph)._node)


def edge_data(graph: nx.DiGraph[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """Each edge's attribute dict, in the graph's order (``graph.edges(data=True)``'s, read
    from its adjacency dicts at a fraction of the view's cost)."""
    return {(u, v): d for u, around in cast(Any, graph)._succ.items() for v, d in around.items()}


def kept_paths(
    parent: Topology, graph: nx.DiGraph[str], same: Kept
) -> tuple[dict[tuple[str, ...], tuple[str, ...]], dict[tuple[str, str, str], tuple[Edge, ...]]]:
    """The parent's route caches a derived topology of ``graph`` keeps: all of them when every
    route is the same; else the paths inside kept hosts and, with the fabric kept, between NICs
    and between kept hosts (a route depends on its ends' hosts and the fabric only)."""
    paths = parent._paths
    if same.hosts is None:
        return dict(paths), dict(parent._edges)
    hosts, fabric = same.hosts, same.fabric
    host = {n: d.get("host") for n, d in parent._node_data.items()}
    alive = cast(Any, graph)._node
    kept: dict[tuple[str, ...], tuple[str, ...]] = {}
    for key, path in paths.items():
        kind, src, dst = key[:3]
        if src not in alive or dst not in alive:
            continue
        local = host[src] in hosts and host[dst] in hosts
        if (kind == "network" and fabric) or (local and (kind == "intra" or fabric)):
            kept[key] = path
    edges = {}
    if fabric:
        edges = {
            key: found
            for key, found in parent._edges.items()
            if key[0] in alive
            and key[1] in alive
            and host[key[0]] in hosts
            and host[key[1]] in hosts
        }
    return kept, edges


def kept_nics(parent: Topology, graph: nx.DiGraph[str], same: Kept) -> dict[str, str]:
    """The parent's NIC of each GPU of ``graph`` on a kept host whose ``nic`` attribute is
    unchanged (its NIC is the nearest its host's unchanged switches give)."""
    old, new = parent._node_data, cast(Any, graph)._node
    return {
        gpu: nic
        for gpu, nic in parent._nic_of.items()
        if gpu in new
        and (same.hosts is None or old[gpu]["host"] in same.hosts)
        and new[gpu].get("nic") == old[gpu].get("nic")
    }
