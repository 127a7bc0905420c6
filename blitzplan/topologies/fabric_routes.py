"""Routes: inside a host (:func:`intra_host_path`), between two NICs through the leaf and spine
switches (:func:`fabric_path`), and end to end (:func:`route`, what ``Topology.path`` keeps).

The fabric route is networkx's bidirectional breadth-first search (``nx.shortest_path``) over the
subgraph of the leaves, the spines and the two NICs, step for step, so it breaks ties as that
search does. It reads the graph's adjacency dicts directly instead of through a filtered
view: on a 1,024-GPU cluster the view's searches took about a tenth of the first replan after
a GPU failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import networkx as nx

from blitzplan.errors import InvalidInputError

if TYPE_CHECKING:
    from blitzplan.topologies.graph import Topology

__all__ = ["fabric_path", "intra_host_path", "nearest_nic", "route"]

_Lists = Mapping[str, Mapping[str, Any]]


def fabric_path(topology: Topology, src_nic: str, dst_nic: str) -> tuple[str, ...] | None:
    """The fewest-hop route from ``src_nic`` to ``dst_nic`` through leaves and spines only
    (the one ``nx.shortest_path`` finds on that subgraph), None when there is none."""
    for nic in (src_nic, dst_nic):
        if nic not in topology.graph:
            raise nx.NodeNotFound(f"{nic} is not in the topology")
    if src_nic == dst_nic:
        return (src_nic,)
    switches, succ, pred = _fabric(topology)

    def passes(node: str) -> bool:
        return node in switches or node in (src_nic, dst_nic)

    met = _meet(succ, pred, passes, src_nic, dst_nic)
    if met is None:
        return None
    before, after, node = met
    path: list[str] = []
    step: str | None = node
    while step is not None:
        path.append(step)
        step = before[step]
    path.reverse()
    step = after[path[-1]]
    while step is not None:
        path.append(step)
        step = after[step]
    return tuple(path)


def _meet(
    succ: _Lists, pred: _Lists, allowed: Callable[[str], bool], source: str, target: str
) -> tuple[dict[str, str | None], dict[str, str | None], str] | None:
    """networkx's ``_bidirectional_pred_succ`` on the lists, ``allowed`` the node filter."""
    before: dict[str, str | None] = {source: None}
    after: dict[str, str | None] = {target: None}
    forward, reverse = [source], [target]
    while forward and reverse:
        if len(forward) <= len(reverse):
            level, forward = forward, []
            for v in level:
                for w in succ.get(v, ()):
                    if not allowed(w):
                        continue
                    if w not in before:
                        forward.append(w)
                        before[w] = v
                    if w in after:
                        return before, after, w
        else:
            level, reverse = reverse, []
            for v in level:
                for w in pred.get(v, ()):
                    if not allowed(w):
                        continue
                    if w not in after:
                        after[w] = v
                        reverse.append(w)
                    if w in before:
                        return before, after, w
    return None


def _fabric(topology: Topology) -> tuple[frozenset[str], _Lists, _Lists]:
    """The leaf and spine switches (kept on the topology), and the graph's successor and
    predecessor dicts (networkx's own, in its order)."""
    found = topology.memo.setdefault("fabric_switches", {}).get(())
    if found is None:
        found = frozenset(
            n for n, d in topology._node_data.items() if d.get("switch") in ("leaf", "spine")
        )
        topology.memo["fabric_switches"][()] = found
    raw = cast(Any, topology.graph)
    return found, raw._succ, raw._pred


def intra_host_path(topology: Topology, src: str, dst: str) -> tuple[str, ...] | None:
    """The fewest-hop path from ``src`` to ``dst`` inside one host, through its NVSwitch and PCIe
    switches only; None when there is none."""
    graph = topology.graph
    host = graph.nodes[src].get("host")
    local = set(topology.nodes_of_host(str(host))) if host else set()
    view = nx.subgraph_view(
        graph,
        filter_node=lambda n: (
            n in (src, dst) or (n in local and graph.nodes[n]["kind"] == "switch")
        ),
    )
    try:
        return tuple(nx.shortest_path(view, src, dst))
    except (nx.NetworkXNoPath, nx.NodeNotFound):
        return None


def route(topology: Topology, src: str, dst: str, src_nic: str | None) -> tuple[str, ...]:
    """The nodes of :meth:`Topology.path <blitzplan.topologies.Topology.path>` from ``src`` to
    ``dst``: the intra-host path inside a host; between hosts the shortest of the sender's NIC
    (``src_nic`` when given) to a receiver's NIC through the fabric, with the hops to and from
    those NICs. Raises InvalidInputError when the endpoints are wrong or no route exists."""
    graph = topology.graph
    for node in (src, dst):
        if topology._node(node).get("host") is None:
            raise InvalidInputError(f"path endpoints must be host-local nodes, got {node!r}")
    if src == dst:
        raise InvalidInputError(f"path needs two different nodes, got {src!r} twice")
    host = str(graph.nodes[src]["host"])
    if src_nic is not None and src_nic not in topology.nics_of_host(host):
        raise InvalidInputError(f"src_nic {src_nic!r} is not a NIC of host {host!r}")
    found: tuple[str, ...] | None = None
    if host == graph.nodes[dst]["host"]:
        found = topology._intra_host_path(src, dst)
    else:
        options = []
        for a in [src_nic] if src_nic else _egress_nics(topology, src):
            for b in _egress_nics(topology, dst):
                middle = topology._network_path(a, b)
                head = (src,) if a == src else topology._intra_host_path(src, a)
                tail = (dst,) if b == dst else topology._intra_host_path(b, dst)
                if middle and head and tail:
                    options.append(head[:-1] + middle + tail[1:])
        found = min(options, key=len) if options else None
    if found is None:
        raise InvalidInputError(f"no path from {src!r} to {dst!r} in topology {topology.name!r}")
    return found


def _egress_nics(topology: Topology, node: str) -> list[str]:
    """NICs ``node`` may use to reach the network: a GPU its own, memories any of the host."""
    kind = topology.graph.nodes[node]["kind"]
    if kind == "gpu":
        return [topology.nic_of(node)]
    if kind == "nic":
        return [node]
    host = str(topology.graph.nodes[node]["host"])
    return [nic for nic in topology.nics_of_host(host) if topology._intra_host_path(node, nic)]


def nearest_nic(topology: Topology, gpu: str) -> str | None:
    """The GPU's NIC: its ``nic`` attribute, else the host NIC fewest hops away inside the host
    (None when it reaches none)."""
    nics = topology.nics_of_host(topology.host_of(gpu))
    named = topology.graph.nodes[gpu].get("nic")
    if named is not None:
        if named not in nics:
            raise InvalidInputError(
                f"gpu {gpu!r} names nic {named!r}, which is not a NIC of its host"
            )
        nics = [named]
    reachable = [nic for nic in nics if topology._intra_host_path(gpu, nic) is not None]
    if not reachable:
        return None
    return min(reachable, key=lambda nic: len(topology._intra_host_path(gpu, nic) or ()))
