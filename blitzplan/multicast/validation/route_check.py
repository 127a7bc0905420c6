"""Two rules of the plan space the bounds rely on, checked apart from the planners.

* **Routes**: a lane's flow takes the route its ``(holder, exit, destination)`` names: inside one
  host the host's own route; between hosts from the holder (over NVLink to the exit GPU when the
  exit is another GPU) out through the exit's NIC (or the named host NIC) to the destination's
  NIC and down to it. A lane cannot wander through other GPUs' NICs or back into its own host.
* **Phases**: lanes of different phases do not share links at the same time. On each edge, the
  lanes of one phase stream within the window from the earliest ``end - bytes / rate`` to the
  latest ``end`` of its lanes there; windows of different phases on one edge must not overlap.
  (A phase's fair-share rates assume it has its links to itself.)
"""

from __future__ import annotations

import math

import numpy as np

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind
from blitzplan.topologies import Edge, Topology

__all__ = ["check_phases", "check_routes"]

_TOL = 1e-6


def _expected(topo: Topology, lane: Lane) -> tuple[Edge, ...]:
    local = topo.graph.nodes[lane.holder]["host"] == topo.graph.nodes[lane.dst]["host"]
    if local or lane.exit == lane.holder:
        return topo.path_edges(lane.holder, lane.dst)
    if topo.kind(lane.exit) == "nic":
        return topo.path_edges(lane.holder, lane.dst, src_nic=lane.exit)
    return topo.path_edges(lane.holder, lane.exit) + topo.path_edges(lane.exit, lane.dst)


def check_routes(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Every lane's flow takes the route of its holder, exit and destination."""
    topo = state.topology
    out = []
    for lane in plan.lanes:
        if lane.flow >= len(plan.flows):
            continue  # the flow count is checked elsewhere
        remote = topo.graph.nodes[lane.holder]["host"] != topo.graph.nodes[lane.dst]["host"]
        if remote and lane.exit == lane.holder and topo.kind(lane.holder) not in ("gpu", "nic"):
            out.append(f"lane {lane.flow} leaves {lane.holder} for another host without a NIC")
            continue
        try:
            expected = _expected(topo, lane)
        except InvalidInputError:
            out.append(f"lane {lane.flow} has no route {lane.holder}->{lane.exit}->{lane.dst}")
            continue
        if tuple(plan.flows[lane.flow].edges) != tuple(expected):
            out.append(
                f"lane {lane.flow} ({lane.holder}->{lane.dst} by {lane.exit}) leaves the route "
                "its holder, exit and destination name"
            )
    return out


def check_phases(plan: MulticastPlan) -> list[str]:
    """Lanes of different phases never stream over one edge at the same time: a lane streams
    from ``end - bytes / rate`` to ``end`` (its last arrival), a phase on an edge from the
    earliest start to the latest end of its lanes there; on each edge, by start (ties in the
    order the phases first reach the edge, lane by lane), a phase starting before the one before
    it ends breaks the rule."""
    if len(set(plan.flow_phase)) < 2:
        return []
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    carried: dict[int, int] = {}  # per receiver, the bytes of the units it lacks
    edge_ids: dict[Edge, int] = {}
    begins: list[float] = []
    ends: list[float] = []
    edge_of: list[int] = []
    lane_of: list[int] = []
    for lane in plan.lanes:
        f = lane.flow
        total = carried.get(lane.receiver)
        if total is None:
            receiver = plan.nodes[lane.receiver]
            total = carried[lane.receiver] = sum(
                b for u, b in enumerate(plan.unit_bytes) if not receiver.has(u)
            )
        size = lane.fraction * (tp if lane.rank == ALL_RANKS else 1) * total
        end = max(plan.lane_arrival_s[f], default=0.0)
        begins.append(end - size / plan.rates[f] if plan.rates[f] > 0 else -math.inf)
        ends.append(end)
        for edge in plan.flows[f].edges:
            edge_of.append(edge_ids.setdefault(edge, len(edge_ids)))
            lane_of.append(len(ends) - 1)
    if not edge_of:
        return []
    rows = np.asarray(lane_of)
    phase_of = np.asarray(plan.flow_phase)[[x.flow for x in plan.lanes]][rows]
    edge_ix = np.asarray(edge_of)
    order = np.lexsort((phase_of, edge_ix))  # stable: each (edge, phase) in lane order
    key_edge, key_phase = edge_ix[order], phase_of[order]
    first = np.flatnonzero(
        np.r_[True, (key_edge[1:] != key_edge[:-1]) | (key_phase[1:] != key_phase[:-1])]
    )
    starts = np.minimum.reduceat(np.asarray(begins)[rows[order]], first)
    stops = np.maximum.reduceat(np.asarray(ends)[rows[order]], first)
    seen, at_edge, at_phase = order[first], key_edge[first], key_phase[first]
    spans = np.lexsort((seen, starts, at_edge))  # per edge by start, ties by first lane
    e1, b2 = stops[spans[:-1]], starts[spans[1:]]
    same = at_edge[spans[:-1]] == at_edge[spans[1:]]
    clash = np.flatnonzero(same & (b2 < e1 - _TOL * np.maximum(1.0, e1)))
    names = list(edge_ids)
    return [
        f"phases {at_phase[spans[i]]} and {at_phase[spans[i + 1]]} stream over "
        f"{names[at_edge[spans[i]]]} at the same time"
        for i in clash
    ]
