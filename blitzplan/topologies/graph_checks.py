"""The checks a cluster graph passes before it becomes a :class:`~.graph.Topology`: node kinds
and their attributes, edge rates and latencies, and every GPU reaching a NIC."""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from blitzplan._checks import (
    MAX_BYTES,
    MAX_BYTES_PER_S,
    MAX_SECONDS,
    MIN_BYTES_PER_S,
    check_bounded,
    is_number,
)
from blitzplan.errors import InvalidInputError
from blitzplan.hardware import get_gpu

if TYPE_CHECKING:
    from blitzplan.topologies.graph import Topology

__all__ = [
    "HOST_LOCAL_KINDS",
    "HOST_LOCAL_SWITCHES",
    "NODE_KINDS",
    "SWITCH_KINDS",
    "check_gpus_reach_nics",
    "validate_graph",
]

NODE_KINDS = frozenset({"gpu", "host_mem", "ssd", "nic", "switch"})
SWITCH_KINDS = frozenset({"nvswitch", "pcie", "leaf", "spine"})
HOST_LOCAL_KINDS = frozenset({"gpu", "host_mem", "ssd", "nic"})
HOST_LOCAL_SWITCHES = frozenset({"nvswitch", "pcie"})


def validate_graph(graph: nx.DiGraph[str]) -> None:
    """InvalidInputError naming the first node or edge whose attributes break the module
    docstring of :mod:`.graph` (kinds, hosts, GPU specs, DRAM, rates, latencies)."""
    if not isinstance(graph, nx.DiGraph):
        raise InvalidInputError(f"graph must be a networkx.DiGraph, got {type(graph).__name__}")
    for node, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind not in NODE_KINDS:
            raise InvalidInputError(
                f"node {node!r} has kind {kind!r}; valid kinds: {', '.join(sorted(NODE_KINDS))}"
            )
        if kind == "switch" and data.get("switch") not in SWITCH_KINDS:
            raise InvalidInputError(
                f"switch {node!r} has switch type {data.get('switch')!r}; valid: "
                f"{', '.join(sorted(SWITCH_KINDS))}"
            )
        local = kind in HOST_LOCAL_KINDS or data.get("switch") in HOST_LOCAL_SWITCHES
        if local and not data.get("host"):
            raise InvalidInputError(f"{kind} node {node!r} needs a 'host' attribute")
        if kind == "gpu":
            get_gpu(str(data.get("gpu")))
        if kind == "host_mem":
            check_bounded(
                f"node {node!r} dram_bytes", data.get("dram_bytes"), 1, MAX_BYTES, "bytes"
            )
    for src, dst, data in graph.edges(data=True):
        rate = data.get("bytes_per_s")
        edge = f"edge {src!r}->{dst!r}"
        check_bounded(f"{edge} bytes_per_s", rate, MIN_BYTES_PER_S, MAX_BYTES_PER_S, "bytes/s")
        latency = data.get("latency_s")
        if not is_number(latency) or not 0 <= latency <= MAX_SECONDS:
            raise InvalidInputError(
                f"edge {src!r}->{dst!r} latency_s must be finite and >= 0 (at most "
                f"{MAX_SECONDS:g}), got {latency!r}"
            )
    if not any(data["kind"] == "gpu" for _, data in graph.nodes(data=True)):
        raise InvalidInputError("topology has no gpu node")


def check_gpus_reach_nics(topology: Topology) -> None:
    """InvalidInputError naming a GPU with no path to any NIC."""
    stranded = [gpu for gpu in topology.gpus() if gpu not in topology._nic_of]
    if stranded:
        raise InvalidInputError(
            f"gpu {stranded[0]!r} has no path to any NIC"
            + (f" ({len(stranded) - 1} more gpus alike)" if len(stranded) > 1 else "")
        )
