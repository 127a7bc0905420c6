"""Achieved link rates and degraded topologies: two operations that derive a new Topology.

**Link efficiency.** A topology's edges carry line rates. Real transfers achieve a fraction of
them, and that fraction depends on the kind of link (an edge's ``medium``). The defaults, each from
a public measurement (``../shared/hardware/HARDWARE.md``):

* ``pcie`` 0.80: pinned host-to-GPU copies measure 25.1 GB/s on an A100's PCIe Gen4 x16 link,
  whose line rate is 31.5 GB/s per direction (nvbandwidth issue #42; HARDWARE.md section 2).
  Gen5 hosts measured lower (35.2 of 63 GB/s on an H100 cluster, 0.56, reported as an open
  issue), so 0.80 is the Gen4 figure the paper's testbeds have.
* ``nvlink`` 0.77: NCCL send/recv of 64 MiB between two GPUs of a node moves 228 GB/s on an A100
  DGX (300 GB/s per direction) and 348 GB/s on an H100 DGX (450 GB/s): 0.76 and 0.77 (vidur's
  profiles, HARDWARE.md section 5).
* ``network`` 0.72 (RDMA): the same profiles' inter-node send/recv of 64 MiB moves 35.9 GB/s on the
  H100 DGX profile. Assumed, as HARDWARE.md does not document that node: one 400 Gb/s NIC per GPU
  (the DGX H100 pairing), 50 GB/s, so 0.72. The A100 profile's inter-node figure (7.8 GB/s) has an
  unknown NIC and is not used.
* ``ssd`` 0.875: a PCIe 4.0 x4 NVMe drive reads about 7 GB/s of its ~8 GB/s interface
  (HARDWARE.md section 4).
* ``dram`` 1.0: no measurement; every path from host memory to a GPU also crosses PCIe, which
  bounds it.

``topology.with_link_efficiency()`` applies them; ``with_link_efficiency(1.0)`` gives line rate
back (the multicast benchmark's paper targets are stated at line rate). Each edge keeps its
``line_bytes_per_s``, so applying a table twice does not compound. The simulator applies the
defaults unless told otherwise (``simulate(..., link_efficiency=1.0)`` for line rate).

**Failed parts.** ``topology.without(nodes=..., links=...)`` removes nodes and links; a GPU whose
own NIC was cut off sends through the nearest NIC of its host that still reaches a leaf (over
PCIe), or any NIC it still reaches when its host lost the fabric; a GPU that reaches no NIC goes
too, and GPUs whose NVSwitch died lose their NVLink group.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import networkx as nx

from blitzplan._checks import MAX_BYTES_PER_S, MIN_BYTES_PER_S, check_bounded
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.topologies.derived import Kept, copy_graph

if TYPE_CHECKING:
    from blitzplan.topologies.graph import Topology

__all__ = [
    "LINE_RATE",
    "LINK_EFFICIENCY",
    "MEDIA",
    "derated",
    "derated_kept",
    "link_efficiency_table",
    "without",
]

LINK_EFFICIENCY: Mapping[str, float] = MappingProxyType(
    {"pcie": 0.80, "nvlink": 0.77, "network": 0.72, "ssd": 0.875, "dram": 1.0}
)
"""Achieved fraction of line rate per link medium (see the module docstring for the sources)."""
MEDIA = tuple(LINK_EFFICIENCY)
"""The link media a topology's edges may name."""
LINE_RATE = 1.0
"""``link_efficiency=LINE_RATE``: every link at its line rate."""
_DEFAULT_MEDIUM = "network"


def link_efficiency_table(efficiency: float | Mapping[str, float] | None) -> dict[str, float]:
    """A full medium -> fraction table: None gives the defaults, a number applies to every
    medium, a mapping overrides the defaults for the media it names."""
    if efficiency is None:
        return dict(LINK_EFFICIENCY)
    if isinstance(efficiency, Mapping):
        unknown = sorted(set(efficiency) - set(MEDIA))
        if unknown:
            raise InvalidInputError(
                f"link_efficiency names unknown media {unknown}; valid: {', '.join(MEDIA)}"
            )
        table = {**LINK_EFFICIENCY, **efficiency}
    else:
        table = dict.fromkeys(MEDIA, efficiency)
    for medium, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidInputError(f"link_efficiency[{medium!r}] must be a number, got {value!r}")
        if not 0 < value <= 1 or not math.isfinite(value):
            raise InvalidInputError(f"link_efficiency[{medium!r}] must be in (0, 1], got {value!r}")
    return {medium: float(value) for medium, value in table.items()}


def derated(topology: Topology, efficiency: float | Mapping[str, float] | None) -> Topology:
    """``topology`` with every edge at its line rate times its medium's efficiency. A degraded
    topology is its parent's derated one without the same parts (:func:`derated_kept`): it keeps
    that one's routes."""
    table = link_efficiency_table(efficiency)
    origin = topology.memo.get("degraded_from", {}).get(())
    if origin is not None:
        parent, nodes, links = origin
        return without(derated_kept(parent, table), nodes, links)
    media = {str(d.get("medium", _DEFAULT_MEDIUM)) for _, _, d in topology.graph.edges(data=True)}
    for medium in sorted(media - set(table)):
        edge = next(
            (u, v)
            for u, v, d in topology.graph.edges(data=True)
            if str(d.get("medium", _DEFAULT_MEDIUM)) == medium
        )
        raise InvalidInputError(
            f"edge {edge[0]!r}->{edge[1]!r} has medium {medium!r}; valid: {', '.join(MEDIA)}"
        )

    def at_rate(data: dict[str, Any]) -> dict[str, Any]:
        line = float(data.get("line_bytes_per_s", data["bytes_per_s"]))
        rate = line * table[str(data.get("medium", _DEFAULT_MEDIUM))]
        return {**data, "line_bytes_per_s": line, "bytes_per_s": rate}

    graph = copy_graph(topology.graph, edge_data=at_rate)
    for src, dst, data in graph.edges(data=True):
        if data["bytes_per_s"] < MIN_BYTES_PER_S:
            check_bounded(
                f"edge {src!r}->{dst!r} bytes_per_s",
                data["bytes_per_s"],
                MIN_BYTES_PER_S,
                MAX_BYTES_PER_S,
                "bytes/s",
            )
    return topology._derive(graph, topology, topology.name, Kept(None, fabric=True))


def derated_kept(topology: Topology, efficiency: float | Mapping[str, float] | None) -> Topology:
    """:func:`derated`, kept on ``topology`` per efficiency table (planners reuse its route
    caches from plan to plan)."""
    key = tuple(sorted(link_efficiency_table(efficiency).items()))
    cache = topology.memo.setdefault("derated", {})
    if key not in cache:
        cache[key] = derated(topology, efficiency)
    return cache[key]  # type: ignore[no-any-return]


def without(
    topology: Topology, nodes: Iterable[str] = (), links: Iterable[tuple[str, str]] = ()
) -> Topology:
    """``topology`` without ``nodes`` and ``links`` (both directions of each).

    A GPU whose own NIC was cut off sends and receives through the nearest NIC of its host that
    still reaches a leaf (else the nearest NIC at all: its host lost the fabric, and the GPU is
    only unreachable over the network); a GPU that reaches no NIC of its host goes too. GPUs
    whose NVSwitch died keep PCIe only (no NVLink group). Raises InvalidInputError naming
    unknown parts, InfeasibleError when no GPU is left. The result keeps the routes and NICs
    the failures leave as they were (:mod:`.derived`)."""
    dead_nodes, dead_links, named = _dead(topology, nodes, links)
    if not dead_nodes and not dead_links:
        return topology
    graph = copy_graph(topology.graph, drop_nodes=dead_nodes, drop_edges=dead_links)
    unlinked = _unlink(topology, graph)
    touched = _touched_hosts(topology, dead_nodes, dead_links)
    candidates = [
        gpu
        for gpu in dict.fromkeys([*_gpus_on(topology, touched), *_unwired(topology)])
        if gpu not in dead_nodes
    ]
    # elsewhere a GPU whose NIC reaches a leaf keeps it: the failures changed nothing there
    lost = {gpu for gpu in candidates if not _rewire(topology, graph, gpu)}
    graph.remove_nodes_from(lost)
    if all(gpu in dead_nodes or gpu in lost for gpu in topology.gpus()):
        raise InfeasibleError(
            f"the failures (dead {sorted(dead_nodes)[:4]}...) leave no GPU in the topology: "
            "nothing can be planned"
        )
    old = topology.graph.nodes
    changed = [g for g in [*unlinked, *candidates] if g in graph and graph.nodes[g] != old[g]]
    hosts = {str(old[g]["host"]) for g in [*lost, *changed]} | touched
    fabric = _fabric_kept(topology, dead_nodes, dead_links)
    same = Kept(frozenset(topology.hosts()) - hosts, fabric)
    degraded = topology._derive(graph, topology, f"{topology.name} (degraded)", same)
    degraded.memo["degraded_from"] = {(): (topology, frozenset(dead_nodes), tuple(named))}
    return degraded


def _dead(
    topology: Topology, nodes: Iterable[str], links: Iterable[tuple[str, str]]
) -> tuple[set[str], set[tuple[str, str]], list[tuple[str, str]]]:
    """The dead nodes, the dead links both ways, and the links as named; InvalidInputError
    naming one that is not in the topology."""
    dead_nodes, dead_links, named = set(nodes), set(), []
    for node in sorted(dead_nodes):
        if node not in topology.graph:
            raise InvalidInputError(f"nodes names {node!r}, which is not in the topology")
    for link in links:
        if len(link) != 2 or not topology.graph.has_edge(*link):
            raise InvalidInputError(f"links names {link!r}, which is not a link of the topology")
        dead_links |= {(link[0], link[1]), (link[1], link[0])}
        named.append((link[0], link[1]))
    return dead_nodes, dead_links, named


def _unlink(topology: Topology, graph: nx.DiGraph[str]) -> list[str]:
    """GPUs of ``graph`` whose NVLink group's NVSwitch is not in it lose the group (no NVLink
    any more); they are returned."""
    out = []
    for group, members in topology._nvlink_groups.items():
        if group not in graph:
            for gpu in members:
                if gpu in graph:
                    graph.nodes[gpu]["nvlink_group"] = None
                    out.append(gpu)
    return out


def _gpus_on(topology: Topology, hosts: set[str]) -> list[str]:
    return [gpu for host in sorted(hosts) for gpu in topology._gpus_by_host.get(host, ())]


def _unwired(topology: Topology) -> tuple[str, ...]:
    """The GPUs whose NIC reaches no leaf (kept on the topology)."""
    found = topology.memo.setdefault("unwired", {}).get(())
    if found is None:
        leaves = topology._leaf_by_nic
        found = tuple(g for g, nic in topology._nic_of.items() if nic not in leaves)
        found += tuple(g for g in topology.gpus() if g not in topology._nic_of)
        topology.memo["unwired"][()] = found
    return found


def _fabric_kept(
    topology: Topology, dead_nodes: set[str], dead_links: set[tuple[str, str]]
) -> bool:
    """Whether no leaf or spine switch failed, nor a link of one."""
    data = topology.graph.nodes
    ends = dead_nodes | {node for link in dead_links for node in link}
    return not any(data[n].get("switch") in ("leaf", "spine") for n in ends)


def _touched_hosts(
    topology: Topology, dead_nodes: set[str], dead_links: set[tuple[str, str]]
) -> set[str]:
    """The hosts where the failures may change how a GPU reaches a NIC (:func:`_rewire`): a
    dead node or an end of a dead link is on the host, or one of its NICs links to a dead node."""
    graph = topology.graph
    ends = dead_nodes | {node for link in dead_links for node in link}
    ends |= {
        n for d in dead_nodes for n in graph.predecessors(d) if graph.nodes[n]["kind"] == "nic"
    }
    return {str(graph.nodes[n]["host"]) for n in ends if graph.nodes[n].get("host")}


def _rewire(topology: Topology, graph: nx.DiGraph[str], gpu: str) -> bool:
    """Keep ``gpu`` reaching a NIC: its own when it still reaches a leaf, else the nearest
    of its host that does, else the nearest at all (recorded on the node). False when it
    reaches none."""
    nic = topology.nic_of(gpu)
    local = {
        n
        for n in topology.nodes_of_host(topology.host_of(gpu))
        if n in graph and (n == gpu or graph.nodes[n]["kind"] in ("switch", "nic"))
    }
    hops = nx.single_source_shortest_path_length(graph.subgraph(local), gpu)
    nics = sorted((d, n) for n, d in hops.items() if graph.nodes[n]["kind"] == "nic")
    if nic in hops and (_wired(graph, nic) or not any(_wired(graph, n) for _, n in nics)):
        return True
    wired = [n for _, n in nics if _wired(graph, n)] or [n for _, n in nics]
    if not wired:
        return False
    graph.nodes[gpu]["nic"] = wired[0]
    return True


def _wired(graph: nx.DiGraph[str], nic: str) -> bool:
    """Whether ``nic`` still reaches a leaf switch."""
    return any(graph.nodes[n].get("switch") == "leaf" for n in graph.successors(nic))
