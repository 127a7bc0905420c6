"""Cluster topologies: the graph, its builders, fair sharing of flows, and the YAML catalog."""

from blitzplan.topologies.builders import HostSpec, build_cluster, nvswitch_host, pcie_host
from blitzplan.topologies.catalog import list_topologies, load_topology, topology_from_dict
from blitzplan.topologies.fairshare import (
    Edge,
    Flow,
    fair_share_after,
    max_min_fair_share,
    residual_after,
)
from blitzplan.topologies.graph import NODE_KINDS, SWITCH_KINDS, Topology
from blitzplan.topologies.links import LINE_RATE, LINK_EFFICIENCY

__all__ = [
    "LINE_RATE",
    "LINK_EFFICIENCY",
    "NODE_KINDS",
    "SWITCH_KINDS",
    "Edge",
    "Flow",
    "HostSpec",
    "Topology",
    "build_cluster",
    "fair_share_after",
    "list_topologies",
    "load_topology",
    "max_min_fair_share",
    "nvswitch_host",
    "pcie_host",
    "residual_after",
    "topology_from_dict",
]
