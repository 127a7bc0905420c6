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
from blitzplan.multicast.validation.lane_table import LaneTable, by_value, flow_routes, lane_table
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
    """Every lane's flow takes the route of its holder, exit and destination (judged once per
    holder, exit, destination and route)."""
    topo = state.topology
    out = []
    found: dict[tuple[object, ...], str] = {}
    for lane in plan.lanes:
        if lane.flow >= len(plan.flows):
            continue  # the flow count is checked elsewhere
        edges = plan.flows[lane.flow].edges
        key = (lane.holder, lane.exit, lane.dst, id(edges))  # the plan keeps every route alive
        said = found.get(key)
        if said is None:
            said = found[key] = _route_fault(topo, lane, edges)
        if said:
            out.append(f"lane {lane.flow} {said}")
    return out


def _route_fault(topo: Topology, lane: Lane, edges: tuple[Edge, ...]) -> str:
    """What is wrong with ``edges`` as the route of ``lane`` (empty: nothing)."""
    remote = topo.graph.nodes[lane.holder]["host"] != topo.graph.nodes[lane.dst]["host"]
    if remote and lane.exit == lane.holder and topo.kind(lane.holder) not in ("gpu", "nic"):
        return f"leaves {lane.holder} for another host without a NIC"
    try:
        expected = _expected(topo, lane)
    except InvalidInputError:
        return f"has no route {lane.holder}->{lane.exit}->{lane.dst}"
    if tuple(edges) != tuple(expected):
        return (
            f"({lane.holder}->{lane.dst} by {lane.exit}) leaves the route "
            "its holder, exit and destination name"
        )
    return ""


def check_phases(
    plan: MulticastPlan, table: LaneTable | None = None, ends: np.ndarray | None = None
) -> list[str]:
    """Lanes of different phases never stream over one edge at the same time: a lane streams
    from ``end - bytes / rate`` to ``end`` (its last arrival), a phase on an edge from the
    earliest start to the latest end of its lanes there; on each edge, by start (ties in the
    order the phases first reach the edge, lane by lane), a phase starting before the one before
    it ends breaks the rule. ``table``: the plan's lanes as columns, ``ends`` each lane's last
    arrival in the plan (by flow), when the caller has them."""
    if len(set(plan.flow_phase)) < 2:
        return []
    table = lane_table(plan) if table is None else table
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    carried = np.array(  # per node, the bytes of the units it lacks
        [sum(b for u, b in enumerate(plan.unit_bytes) if not node.has(u)) for node in plan.nodes],
        float,
    ).reshape(len(plan.nodes))
    flows = table.flow
    size = (table.hi - table.lo) * np.where(table.rank == ALL_RANKS, tp, 1)
    size = size * carried[table.receiver]
    if ends is None or ends.shape != (len(plan.flows),):
        ends = np.array([max(row, default=0.0) for row in plan.lane_arrival_s], float)
    end = ends[flows]
    rate = np.asarray(plan.rates, float)[flows]
    with np.errstate(divide="ignore", invalid="ignore"):
        begin = np.where(rate > 0, end - size / np.where(rate > 0, rate, 1.0), -math.inf)
    routes, route_of = flow_routes(plan)
    route = route_of[flows]
    edge_ids: dict[Edge, int] = {}
    lane_of, edge_of, seq_of = [], [], []
    width = max((len(r) for r in routes), default=0)
    for r, lanes in by_value(route).items():
        for k, edge in enumerate(routes[r]):
            lane_of.append(lanes)
            edge_of.append(np.full(len(lanes), edge_ids.setdefault(edge, len(edge_ids))))
            seq_of.append(table.at[lanes] * width + k)  # lane by lane, each lane's edges in order
    if not lane_of:
        return []
    rows = np.concatenate(lane_of)
    edge_ix = np.concatenate(edge_of)
    seq = np.concatenate(seq_of)
    phase_of = np.asarray(plan.flow_phase)[flows][rows]
    order = np.lexsort((seq, phase_of, edge_ix))  # each (edge, phase) in lane order
    key_edge, key_phase = edge_ix[order], phase_of[order]
    first = np.flatnonzero(
        np.r_[True, (key_edge[1:] != key_edge[:-1]) | (key_phase[1:] != key_phase[:-1])]
    )
    starts = np.minimum.reduceat(begin[rows[order]], first)
    stops = np.maximum.reduceat(end[rows[order]], first)
    seen, at_edge, at_phase = seq[order[first]], key_edge[first], key_phase[first]
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
