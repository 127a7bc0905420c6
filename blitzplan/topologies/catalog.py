"""The YAML catalog of clusters, and loading a topology from a YAML or JSON file.

A file takes one of two forms. The *builder* form names a host model and a fabric::

    name: my-cluster
    host: {type: nvswitch, gpu: h100, gpus: 8, nic_gbps: 400, host_to_gpu_gbps: 400}
    cluster: {hosts: 4, hosts_per_leaf: 2, oversubscription: 2}

The *explicit* form lists nodes and links (full duplex) or edges (one direction)::

    name: tiny
    nodes:
      - {id: h0/gpu0, kind: gpu, host: h0, gpu: a100}
      - {id: h0/nic0, kind: nic, host: h0}
    links:
      - {a: h0/gpu0, b: h0/nic0, gbps: 100, latency_us: 1}

Rates are in Gbit/s (``*_gbps``), memory in GiB (``dram_gib``), latencies in microseconds.
Unknown keys are errors, so a typo never silently falls back to a default. A link slower than
:data:`MIN_LINK_GBPS` is refused (a weight transfer over it would take days: almost surely a unit
mistake), and so is an explicit topology with a host whose GPUs reach no GPU of another host (a
host without an uplink: nothing could be sent to it or from it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from blitzplan._checks import is_number
from blitzplan.errors import InvalidInputError
from blitzplan.topologies.builders import HostSpec, build_cluster, nvswitch_host, pcie_host
from blitzplan.topologies.graph import Topology
from blitzplan.units import GBPS, GIB, US

__all__ = ["MIN_LINK_GBPS", "list_topologies", "load_topology", "topology_from_dict"]

MIN_LINK_GBPS = 0.1
"""The slowest link a topology file may declare, Gbit/s (100 Mbit/s)."""

_HOST_KEYS = {
    "type",
    "gpu",
    "gpus",
    "nvlink_gbps",
    "gpu_pcie_gbps",
    "host_to_gpu_gbps",
    "nic_gbps",
    "gpus_per_pcie_switch",
    "gpus_per_nic",
    "dram_gib",
    "dram_gbps",
    "ssd_gbps",
}
_CLUSTER_KEYS = {"hosts", "hosts_per_leaf", "oversubscription", "rail_optimized"}
_TOP_KEYS = {"name", "description", "source", "host", "cluster", "nodes", "links", "edges"}
_NODE_KEYS = {"id", "kind", "switch", "host", "gpu", "nvlink_group", "dram_gib"}
_LINK_KEYS = {"a", "b", "src", "dst", "gbps", "latency_us", "medium"}


def _catalog_dir() -> resources.abc.Traversable:
    return resources.files("blitzplan") / "topologies"


def list_topologies() -> list[str]:
    """Names of the catalog entries :func:`load_topology` accepts."""
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in _catalog_dir().iterdir()
        if entry.name.endswith(".yaml")
    )


_LOADED: dict[tuple[str, float, int], Topology] = {}
"""Topologies already built, by file and its modification time and size (a control loop loads
the same cluster every step; a Topology is immutable, so one object serves every caller)."""


def load_topology(topology: str | Path) -> Topology:
    """A Topology from a catalog name (see :func:`list_topologies`) or a YAML/JSON file path.

    Loading the same unchanged file again returns the same (immutable) Topology, with its route
    caches warm."""
    if isinstance(topology, str) and topology in list_topologies():
        path = Path(str(_catalog_dir() / f"{topology}.yaml"))
        return _cached(
            path, lambda: topology_from_dict(yaml.safe_load(path.read_text()), source=topology)
        )
    if not isinstance(topology, str | Path):
        raise InvalidInputError(
            f"topology must be a catalog name or a path, got {type(topology).__name__}"
        )
    path = Path(topology)
    if not path.is_file():
        raise InvalidInputError(
            f"topology {str(topology)!r} is neither a catalog entry nor a file; "
            f"catalog: {', '.join(list_topologies())}"
        )
    return _cached(path, lambda: _from_file(path))


def _from_file(path: Path) -> Topology:
    try:
        data = (
            json.loads(path.read_text())
            if path.suffix == ".json"
            else yaml.safe_load(path.read_text())
        )
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"topology file {str(path)!r} does not parse: {exc}") from exc
    return topology_from_dict(data, source=str(path))


def _cached(path: Path, build: Callable[[], Topology]) -> Topology:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime, stat.st_size)
    if key not in _LOADED:
        _LOADED[key] = build()
    return _LOADED[key]


def topology_from_dict(data: object, *, source: str = "<dict>") -> Topology:
    """A Topology from the parsed contents of a topology file."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"topology {source!r} must be a mapping, got {type(data).__name__}")
    _check_keys(data, _TOP_KEYS, f"topology {source!r}")
    name = str(data.get("name", Path(source).stem))
    description = str(data.get("description", ""))
    if "host" in data:
        if any(key in data for key in ("nodes", "links", "edges")):
            raise InvalidInputError(
                f"topology {source!r} mixes the builder form (host) with nodes/links/edges"
            )
        cluster = _mapping(data.get("cluster", {}), f"topology {source!r} cluster")
        _check_keys(cluster, _CLUSTER_KEYS, f"topology {source!r} cluster")
        return build_cluster(
            _host_spec(_mapping(data["host"], f"topology {source!r} host"), source),
            hosts=cluster.get("hosts", 1),
            hosts_per_leaf=cluster.get("hosts_per_leaf"),
            oversubscription=float(cluster.get("oversubscription", 1.0)),
            rail_optimized=bool(cluster.get("rail_optimized", False)),
            name=name,
            description=description,
        )
    if "nodes" not in data:
        raise InvalidInputError(f"topology {source!r} needs either 'host' or 'nodes'")
    graph = _explicit_graph(data, source)
    _check_uplinks(graph, source)
    return Topology(graph, name=name, description=description)


def _check_uplinks(graph: nx.DiGraph[str], source: str) -> None:
    """Every host's GPUs reach a GPU of every other host and are reached from one; the error
    names the host that reaches fewest others (the one without an uplink)."""
    hosts: dict[str, set[str]] = {}
    for node, attrs in graph.nodes(data=True):
        if attrs.get("kind") == "gpu" and attrs.get("host") is not None:
            hosts.setdefault(str(attrs["host"]), set()).add(node)
    if len(hosts) < 2:
        return
    linked: dict[str, set[str]] = {}
    for host, gpus in hosts.items():
        out = set().union(*(nx.descendants(graph, g) for g in gpus))
        into = set().union(*(nx.ancestors(graph, g) for g in gpus))
        linked[host] = {o for o, theirs in hosts.items() if o != host and out & theirs & into}
    host_of = {n: a.get("host") for n, a in graph.nodes(data=True)}
    uplinks = {h: 0 for h in hosts}
    for u, v in graph.edges():
        mine = host_of[u]
        if isinstance(mine, str) and mine in uplinks and host_of[v] != mine:
            uplinks[mine] += 1
    worst = min(sorted(hosts), key=lambda h: (len(linked[h]), uplinks[h]))
    if len(linked[worst]) < len(hosts) - 1:
        cut = sorted(set(hosts) - linked[worst] - {worst})
        raise InvalidInputError(
            f"topology {source!r}: host {worst!r} has no uplink: its GPUs neither reach nor are "
            f"reached from {', '.join(cut[:4])}{'...' if len(cut) > 4 else ''} (link its NIC to "
            "a switch)"
        )


def _host_spec(host: Mapping[str, Any], source: str) -> HostSpec:
    where = f"topology {source!r} host"
    _check_keys(host, _HOST_KEYS, where)
    kind = host.get("type", "nvswitch")
    options: dict[str, Any] = {
        "gpus": host.get("gpus", 8),
        "nic_bytes_per_s": _rate(host, "nic_gbps", where),
        "host_to_gpu_bytes_per_s": _rate(host, "host_to_gpu_gbps", where),
    }
    for key in ("gpus_per_pcie_switch", "gpus_per_nic"):
        if key in host:
            options[key] = host[key]
    if "dram_gib" in host:
        options["dram_bytes"] = _number(host, "dram_gib", where) * GIB
    for key, option in (
        ("dram_gbps", "dram_bytes_per_s"),
        ("ssd_gbps", "ssd_bytes_per_s"),
        ("gpu_pcie_gbps", "gpu_pcie_bytes_per_s"),
    ):
        if key in host:
            options[option] = _rate(host, key, where)
    if "gpu" not in host:
        raise InvalidInputError(f"{where} needs a 'gpu' (e.g. h100)")
    if kind == "nvswitch":
        if "nvlink_gbps" in host:
            options["nvlink_bytes_per_s"] = _rate(host, "nvlink_gbps", where)
        return nvswitch_host(str(host["gpu"]), **options)
    if kind == "pcie":
        if "nvlink_gbps" in host:
            raise InvalidInputError(f"{where}: a pcie host takes no nvlink_gbps")
        return pcie_host(str(host["gpu"]), **options)
    raise InvalidInputError(f"{where} type must be 'nvswitch' or 'pcie', got {kind!r}")


def _explicit_graph(data: Mapping[str, Any], source: str) -> nx.DiGraph[str]:
    graph: nx.DiGraph[str] = nx.DiGraph()
    for i, node in enumerate(_list(data.get("nodes"), f"topology {source!r} nodes")):
        where = f"topology {source!r} nodes[{i}]"
        node = _mapping(node, where)
        _check_keys(node, _NODE_KEYS, where)
        if "id" not in node:
            raise InvalidInputError(f"{where} needs an 'id'")
        attrs = {key: value for key, value in node.items() if key not in ("id", "dram_gib")}
        if "dram_gib" in node:
            attrs["dram_bytes"] = _number(node, "dram_gib", where) * GIB
        if str(node["id"]) in graph:
            raise InvalidInputError(f"{where} repeats node id {node['id']!r}")
        graph.add_node(str(node["id"]), **attrs)
    for key, duplex in (("links", True), ("edges", False)):
        for i, link in enumerate(_list(data.get(key, []), f"topology {source!r} {key}")):
            where = f"topology {source!r} {key}[{i}]"
            link = _mapping(link, where)
            _check_keys(link, _LINK_KEYS, where)
            ends = (link.get("a"), link.get("b")) if duplex else (link.get("src"), link.get("dst"))
            for end in ends:
                if end is None:
                    raise InvalidInputError(
                        f"{where} needs {'a and b' if duplex else 'src and dst'}"
                    )
                if str(end) not in graph:
                    raise InvalidInputError(f"{where} names missing node {end!r}")
            attrs = {
                "bytes_per_s": _rate(link, "gbps", where),
                "latency_s": _number(link, "latency_us", where, default=0.0) * US,
                "medium": str(link.get("medium", "network")),
            }
            a, b = str(ends[0]), str(ends[1])
            graph.add_edge(a, b, **attrs)
            if duplex:
                graph.add_edge(b, a, **attrs)
    return graph


def _check_keys(data: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InvalidInputError(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"{where} must be a mapping, got {value!r}")
    return value


def _list(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInputError(f"{where} must be a list, got {value!r}")
    return value


def _number(data: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    value = data.get(key, default)
    if value is None:
        raise InvalidInputError(f"{where} needs {key!r}")
    if not is_number(value):
        raise InvalidInputError(f"{where} {key} must be a number, got {value!r}")
    return float(value)


def _rate(data: Mapping[str, Any], key: str, where: str) -> float:
    value = _number(data, key, where)
    if not value >= MIN_LINK_GBPS:
        raise InvalidInputError(
            f"{where} {key} must be at least {MIN_LINK_GBPS:g} Gbit/s, got {value!r} (a model "
            "would take days to cross it: a unit mistake?)"
        )
    if not math.isfinite(value):
        raise InvalidInputError(f"{where} {key} must be finite, got {value!r}")
    return value * GBPS
