"""How a lane's route reads as a transfer step (:mod:`blitzplan.scale.program`): its kind, what
holds its source, the link it takes, its sending NIC and the relay it passes."""

from __future__ import annotations

from collections.abc import Sequence

from blitzplan.multicast.plan_types import Lane, MulticastPlan, NodeKind
from blitzplan.scale.transfer_steps import StepKind
from blitzplan.topologies import Topology

__all__ = ["ROUTES_BY_ID_KEPT", "StepRouter"]

ROUTES_BY_ID_KEPT = 1 << 16
"""Routes a topology keeps by the identity of their edges (then it starts over)."""


class StepRouter:
    """Kind, holder, link, sending NIC and relay of a lane, from the route its flow takes
    (node kinds, switch types and sender kinds looked up once each)."""

    def __init__(self, plan: MulticastPlan, topology: Topology) -> None:
        self.plan, self.topology, self.flows = plan, topology, plan.flows
        self.kinds: dict[str, str] = topology.memo.setdefault("node_kinds", {})
        self.routes: dict[tuple[tuple[str, str], ...], tuple[str | None, str]]
        self.routes = topology.memo.setdefault("route_links", {})
        self.holders: dict[tuple[int, str], str] = {}
        # routes by identity first (the planners take each route's edges from one cache)
        self.by_id: dict[int, tuple[tuple[tuple[str, str], ...], str | None, str]]
        self.by_id = topology.memo.setdefault("route_links_by_id", {})

    def kind(self, node: str) -> str:
        found = self.kinds.get(node)
        if found is None:
            found = self.kinds[node] = self.topology.kind(node)
        return found

    def __call__(self, lane: Lane) -> tuple[StepKind, str, str, str | None, str | None]:
        edges = self.flows[lane.flow].edges
        holder = lane.holder
        source_kind = self.kinds.get(holder) or self.kind(holder)
        known = self.by_id.get(id(edges))
        if known is None or known[0] is not edges:  # the entry holds its edges: ids stay theirs
            if len(self.by_id) >= ROUTES_BY_ID_KEPT:  # plans read from documents bring new ones
                self.by_id.clear()
            known = self.by_id[id(edges)] = (edges, *self.route(edges))
        _, nic, local = known
        relay = None
        exit_ = lane.exit
        if exit_ != holder and exit_ != nic and _crosses(edges, exit_):
            relay = exit_
        if source_kind == "ssd":
            step, link = StepKind.DISK_TO_HOST, "pcie"
        elif lane.gather:
            step, link = StepKind.ALLGATHER, local
        elif nic is not None:
            step, link = StepKind.NETWORK, "network"
        elif source_kind == "host_mem":
            step, link = StepKind.HOST_TO_DEVICE, "pcie"
        else:
            step, link = StepKind.DEVICE_TO_DEVICE, local
        what = self.holders.get((lane.sender, source_kind))
        if what is None:
            what = self.holder(lane.sender, source_kind)
        return step, what, link, nic, relay

    def holder(self, sender: int, source_kind: str) -> str:
        """What a lane's source is (``TransferStep.holder``)."""
        found = self.holders.get((sender, source_kind))
        if found is None:
            node = self.plan.nodes[sender]
            found = {
                NodeKind.INSTANCE: "loading" if node.ready_s else "instance",
                NodeKind.HOST: "memory",
                NodeKind.CACHE: "disk" if source_kind == "ssd" else "memory",
            }.get(node.kind, "plan")
            self.holders[(sender, source_kind)] = found
        return found

    def route(self, edges: tuple[tuple[str, str], ...]) -> tuple[str | None, str]:
        """The sending NIC of a route (its first NIC, None without one) and the link a route
        without one takes (``nvlink`` or ``pcie``), kept per route on the topology."""
        found = self.routes.get(edges)
        if found is None:
            kind = self.kind
            nic = edges[0][0] if kind(edges[0][0]) == "nic" else None
            if nic is None:
                nic = next((v for _, v in edges if kind(v) == "nic"), None)
            nodes = (edges[0][0], *(v for _, v in edges))
            found = self.routes[edges] = (nic, _local_link(nodes, self.topology))
        return found


def _crosses(edges: Sequence[tuple[str, str]], node: str) -> bool:
    """Whether a route of ``edges`` passes ``node``."""
    return edges[0][0] == node or any(v == node for _, v in edges)


def _local_link(nodes: Sequence[str], topology: Topology) -> str:
    middle = nodes[1:-1]
    if middle and all(topology.graph.nodes[n].get("switch") == "nvswitch" for n in middle):
        return "nvlink"
    return "pcie"
