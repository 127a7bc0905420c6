"""The cluster topology: a directed graph of GPUs, memories, NICs and switches.

Nodes carry ``kind`` (``gpu``, ``host_mem``, ``ssd``, ``nic``, ``switch``); switches also
carry ``switch`` (``nvswitch``, ``pcie``, ``leaf``, ``spine``). Host-local nodes (all but leaves
and the spine) carry ``host``; GPUs carry ``gpu`` (a GpuSpec name), ``nvlink_group`` (``None``
without NVLink peers) and optionally ``nic``; host memories carry ``dram_bytes``. Every directed
edge carries ``bytes_per_s`` and ``latency_s``; a full-duplex link is two edges, so only flows in
the same direction compete.

Routing: inside a host, traffic takes the fewest hops through the host's NVSwitch and PCIe
switches; between hosts it leaves through the sender's NIC (a GPU's own NIC), crosses leaves and
the spine, and enters through the receiver's NIC. GPUs and memories are never transit nodes: a GPU
that forwards data does so as a planned chain hop. Ties break by insertion order, so routes are
deterministic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import networkx as nx

from blitzplan.errors import InvalidInputError
from blitzplan.hardware import GpuSpec, get_gpu
from blitzplan.topologies.derived import Kept, edge_data, kept_nics, kept_paths, node_data
from blitzplan.topologies.fabric_routes import fabric_path, intra_host_path, nearest_nic, route
from blitzplan.topologies.fairshare import Edge, Flow, max_min_fair_share
from blitzplan.topologies.graph_checks import (
    NODE_KINDS,
    SWITCH_KINDS,
    check_gpus_reach_nics,
    validate_graph,
)

__all__ = ["NODE_KINDS", "SWITCH_KINDS", "Topology"]


class Topology:
    """A validated, frozen cluster graph with the queries the planners need.

    ``graph`` is a frozen :class:`networkx.DiGraph`; build a new Topology to change it.
    """

    def __init__(
        self, graph: nx.DiGraph[str], *, name: str = "custom", description: str = ""
    ) -> None:
        validate_graph(graph)
        self.graph: nx.DiGraph[str] = nx.freeze(graph.copy())
        self.name = name
        self.description = description
        self._paths: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._edges: dict[tuple[str, str, str], tuple[Edge, ...]] = {}
        self.memo: dict[str, dict[Any, Any]] = {}
        """Caches of derived data that planners keep per topology (the graph never changes)."""
        check_gpus_reach_nics(self)

    def __repr__(self) -> str:
        return (
            f"Topology({self.name!r}, hosts={len(self.hosts())}, gpus={len(self.gpus())}, "
            f"edges={self.graph.number_of_edges()})"
        )

    # --- nodes --------------------------------------------------------------------------------

    def _nodes_of_kind(self, kind: str) -> list[str]:
        return [node for node, data in self._node_data.items() if data["kind"] == kind]

    def kind(self, node: str) -> str:
        return str(self._node(node)["kind"])

    @cached_property
    def _gpus(self) -> tuple[str, ...]:
        return tuple(self._nodes_of_kind("gpu"))

    def gpus(self) -> list[str]:
        """Every GPU, in the order the topology was built."""
        return list(self._gpus)

    def nics(self) -> list[str]:
        return self._nodes_of_kind("nic")

    def hosts(self) -> list[str]:
        """Host names, in order of first appearance."""
        return list(self._hosts)

    @cached_property
    def _hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.graph.nodes[gpu]["host"] for gpu in self._gpus))

    def gpus_of_host(self, host: str) -> list[str]:
        gpus = self._gpus_by_host.get(host)
        if not gpus:
            raise InvalidInputError(f"host {host!r} is not in topology {self.name!r}")
        return list(gpus)

    @cached_property
    def _gpus_by_host(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for gpu in self._gpus:
            out.setdefault(str(self.graph.nodes[gpu]["host"]), []).append(gpu)
        return out

    def host_of(self, gpu: str) -> str:
        return str(self._gpu(gpu)["host"])

    def gpu_spec(self, gpu: str) -> GpuSpec:
        return get_gpu(str(self._gpu(gpu)["gpu"]))

    def host_mem(self, host: str) -> str:
        """The host-DRAM node of ``host``."""
        return self._host_node(host, "host_mem")

    def ssd(self, host: str) -> str:
        return self._host_node(host, "ssd")

    def dram_bytes(self, host: str) -> float:
        return float(self.graph.nodes[self.host_mem(host)]["dram_bytes"])

    def nvlink_group_of(self, gpu: str) -> tuple[str, ...]:
        """The GPUs joined to ``gpu`` by NVLink, itself included, in build order."""
        group = self._gpu(gpu).get("nvlink_group")
        return (gpu,) if group is None else self._nvlink_groups[group]

    @cached_property
    def _nvlink_groups(self) -> dict[str, tuple[str, ...]]:
        members: dict[str, list[str]] = {}
        for gpu in self._gpus:
            group = self.graph.nodes[gpu].get("nvlink_group")
            if group is not None:
                members.setdefault(group, []).append(gpu)
        return {group: tuple(gpus) for group, gpus in members.items()}

    def gpu_position(self, gpu: str) -> int:
        """The index of ``gpu`` in :meth:`gpus`."""
        self._gpu(gpu)
        return self._gpu_position[gpu]

    @cached_property
    def _gpu_position(self) -> dict[str, int]:
        return {gpu: i for i, gpu in enumerate(self._gpus)}

    def nic_of(self, gpu: str) -> str:
        """The NIC ``gpu`` sends and receives network traffic through (its rail)."""
        found = self._nic_of.get(gpu)  # only GPUs are keys: a hit needs no check
        if found is None:
            self._gpu(gpu)
            return self._nic_of[gpu]
        return found

    def nics_of_host(self, host: str) -> list[str]:
        return [n for n in self._host_nodes(host) if self.graph.nodes[n]["kind"] == "nic"]

    def leaf_of(self, gpu: str) -> str | None:
        """The leaf switch behind the GPU's NIC, or ``None`` when the NIC has no fabric."""
        return self.leaf_of_nic(self.nic_of(gpu))

    def leaf_of_nic(self, nic: str) -> str | None:
        """The leaf switch a NIC connects to, or ``None``."""
        found = self._leaf_by_nic.get(nic)  # only nodes are keys: a hit needs no check
        if found is None:
            self._node(nic)
        return found

    @cached_property
    def _leaf_by_nic(self) -> dict[str, str]:
        leaves: dict[str, str] = {}
        data = self._node_data
        for src, dst in self._edge_data:  # each NIC's out-edges in order: its first leaf
            if data[src]["kind"] == "nic" and data[dst].get("switch") == "leaf":
                leaves.setdefault(src, str(dst))
        return leaves

    def nodes_of_host(self, host: str) -> list[str]:
        """Every node that belongs to ``host`` (GPUs, memory, SSD, NICs, its switches)."""
        return list(self._host_nodes(host))

    @cached_property
    def _by_host(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = {}
        for node, data in self._node_data.items():
            if data.get("host"):
                result.setdefault(str(data["host"]), []).append(node)
        return result

    def _host_nodes(self, host: str) -> list[str]:
        if host not in self._by_host:
            raise InvalidInputError(f"host {host!r} is not in topology {self.name!r}")
        return self._by_host[host]

    @cached_property
    def _nic_of(self) -> dict[str, str]:
        """Each GPU's NIC: its ``nic`` attribute, else the nearest NIC on its host."""
        found = {gpu: nearest_nic(self, gpu) for gpu in self._gpus}
        return {gpu: nic for gpu, nic in found.items() if nic is not None}

    # --- paths and rates ------------------------------------------------------------------------

    def _intra_host_path(self, src: str, dst: str) -> tuple[str, ...] | None:
        """Fewest-hop path inside one host, through its NVSwitch and PCIe switches only."""
        key = ("intra", src, dst)
        if key not in self._paths:
            self._paths[key] = intra_host_path(self, src, dst) or ()  # none: remembered too
        return self._paths[key] or None

    def _network_path(self, src_nic: str, dst_nic: str) -> tuple[str, ...] | None:
        """Fewest-hop path between two NICs through leaf and spine switches only."""
        key = ("network", src_nic, dst_nic)
        if key not in self._paths:
            self._paths[key] = fabric_path(self, src_nic, dst_nic) or ()  # none: remembered too
        return self._paths[key] or None

    def nics_connected(self, src_nic: str, dst_nic: str) -> bool:
        """Whether traffic leaving NIC ``src_nic`` reaches NIC ``dst_nic`` through the switches
        (a failed leaf or spine may cut some pairs apart)."""
        return src_nic == dst_nic or self._network_path(src_nic, dst_nic) is not None

    def fabric_whole(self) -> bool:
        """Whether every leaf and spine switch reaches every other one: no failure has split the
        network in parts (a lone NIC cut from its leaf does not count)."""
        found = self.memo.setdefault("fabric_whole", {}).get(())
        if found is None:
            switches = [
                n for n, d in self._node_data.items() if d.get("switch") in ("leaf", "spine")
            ]
            found = len(switches) <= 1 or nx.is_strongly_connected(self.graph.subgraph(switches))
            self.memo["fabric_whole"][()] = found
        return bool(found)

    def path(self, src: str, dst: str, *, src_nic: str | None = None) -> tuple[str, ...]:
        """Nodes from ``src`` to ``dst`` along the route their traffic takes.

        Inside a host: fewest hops over its NVSwitch and PCIe switches. Between hosts: to the
        sender's NIC (a GPU's own NIC; for host memory or an SSD the host NIC nearest the
        receiver's, or ``src_nic`` when given), through leaves and the spine, then from the
        receiver's NIC. ``src_nic`` must be a NIC of the sender's host; inside a host it is unused.
        """
        key = ("path", src, dst, src_nic or "")
        known = self._paths.get(key)
        if known is None:
            known = self._paths[key] = route(self, src, dst, src_nic)
        return known

    def has_path(self, src: str, dst: str, *, src_nic: str | None = None) -> bool:
        """Whether :meth:`path` finds a route (after failures some do not exist)."""
        try:
            self.path_edges(src, dst, src_nic=src_nic)
        except InvalidInputError:
            return False
        return True

    def path_edges(self, src: str, dst: str, *, src_nic: str | None = None) -> tuple[Edge, ...]:
        key = (src, dst, src_nic or "")
        edges = self._edges.get(key)
        if edges is None:
            edges = tuple(itertools.pairwise(self.path(src, dst, src_nic=src_nic)))
            self._edges[key] = edges
        return edges

    def bytes_per_s(self, edge: Edge) -> float:
        return float(self._edge(edge)["bytes_per_s"])

    def latency_s(self, edge: Edge) -> float:
        return float(self._edge(edge)["latency_s"])

    def bottleneck_bytes_per_s(self, src: str, dst: str) -> float:
        """The smallest edge capacity on the path from ``src`` to ``dst``."""
        return min(self.bytes_per_s(edge) for edge in self.path_edges(src, dst))

    def path_latency_s(self, src: str, dst: str) -> float:
        return sum(self.latency_s(edge) for edge in self.path_edges(src, dst))

    @cached_property
    def capacity(self) -> dict[Edge, float]:
        """``bytes_per_s`` of every directed edge."""
        return {edge: float(d["bytes_per_s"]) for edge, d in self._edge_data.items()}

    def flow(
        self,
        src: str,
        dst: str,
        *,
        max_bytes_per_s: float = math.inf,
        name: str = "",
        src_nic: str | None = None,
    ) -> Flow:
        """A Flow from ``src`` to ``dst`` along :meth:`path`."""
        edges = self.path_edges(src, dst, src_nic=src_nic)
        return Flow(edges, max_bytes_per_s, name or f"{src}->{dst}")

    def fair_share(self, flows: Sequence[Flow]) -> tuple[float, ...]:
        """Max-min fair rates of ``flows`` running at once on this topology."""
        return max_min_fair_share(flows, self.capacity)

    # --- derived topologies ---------------------------------------------------------------

    def with_link_efficiency(
        self, efficiency: float | Mapping[str, float] | None = None
    ) -> Topology:
        """This topology with each link at its achieved rate: line rate times its medium's
        efficiency (None: the measured defaults of :data:`~blitzplan.topologies.links.
        LINK_EFFICIENCY`; ``1.0``: line rate)."""
        from blitzplan.topologies.links import derated

        return derated(self, efficiency)

    @property
    def link_efficiency(self) -> dict[str, float]:
        """Per medium, the fraction of line rate its edges run at (1.0 at line rate)."""
        found = self.memo.setdefault("link_efficiency", {}).get(())
        if found is None:
            found = {}
            for data in self._edge_data.values():  # each medium's first edge
                medium = str(data.get("medium", "network"))
                if medium not in found:
                    line = data.get("line_bytes_per_s", data["bytes_per_s"])
                    found[medium] = data["bytes_per_s"] / line
            self.memo["link_efficiency"][()] = found
        return dict(found)

    def without(
        self, *, nodes: Iterable[str] = (), links: Iterable[tuple[str, str]] = ()
    ) -> Topology:
        """This topology without failed ``nodes`` and ``links`` (see
        :func:`blitzplan.topologies.links.without`)."""
        from blitzplan.topologies.links import without

        return without(self, nodes, links)

    @classmethod
    def _derive(cls, graph: nx.DiGraph[str], parent: Topology, name: str, same: Kept) -> Topology:
        """A topology of ``graph``, which :mod:`.links` derived from ``parent`` and checked: not
        copied nor checked again; it keeps the parent's routes and NICs that ``same`` says the
        derivation left as they were (:func:`~blitzplan.topologies.derived.kept_paths`)."""
        topology = object.__new__(cls)
        topology.graph = nx.freeze(graph)
        topology.name, topology.description = name, parent.description
        topology.memo = {}
        topology._paths, topology._edges = kept_paths(parent, graph, same)
        nics = kept_nics(parent, graph, same)
        found = {gpu: nics.get(gpu) or nearest_nic(topology, gpu) for gpu in topology._gpus}
        topology.__dict__["_nic_of"] = {g: nic for g, nic in found.items() if nic is not None}
        check_gpus_reach_nics(topology)
        return topology

    # --- helpers ------------------------------------------------------------------------------

    @cached_property
    def _node_data(self) -> dict[str, dict[str, Any]]:
        return node_data(self.graph)

    @cached_property
    def _edge_data(self) -> dict[Edge, dict[str, Any]]:
        return edge_data(self.graph)

    def _node(self, node: str) -> dict[str, Any]:
        data = self._node_data.get(node)
        if data is None:
            raise InvalidInputError(f"node {node!r} is not in topology {self.name!r}")
        return data

    def _gpu(self, gpu: str) -> dict[str, Any]:
        data = self._node(gpu)
        if data["kind"] != "gpu":
            raise InvalidInputError(f"node {gpu!r} is a {data['kind']}, not a gpu")
        return data

    def _edge(self, edge: Edge) -> dict[str, Any]:
        data = self._edge_data.get(edge)
        if data is None:
            raise InvalidInputError(f"edge {edge!r} is not in topology {self.name!r}")
        return data

    def _host_node(self, host: str, kind: str) -> str:
        found = self._host_nodes_by_kind.get((host, kind))
        if found is None:
            raise InvalidInputError(f"host {host!r} has no {kind} node in topology {self.name!r}")
        return found

    @cached_property
    def _host_nodes_by_kind(self) -> dict[tuple[str, str], str]:
        """The first node of each kind on each host (its memory, its SSD)."""
        out: dict[tuple[str, str], str] = {}
        for node, data in self._node_data.items():
            host = data.get("host")
            if host is not None:
                out.setdefault((str(host), str(data["kind"])), str(node))
        return out
