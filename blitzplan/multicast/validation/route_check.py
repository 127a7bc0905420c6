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

import itertools
from collections import defaultdict

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
    """Lanes of different phases never stream over one edge at the same time."""
    if len(set(plan.flow_phase)) < 2:
        return []
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    windows: dict[Edge, dict[int, list[float]]] = defaultdict(dict)
    for lane in plan.lanes:
        f = lane.flow
        receiver = plan.nodes[lane.receiver]
        scale = tp if lane.rank == ALL_RANKS else 1
        size = sum(
            lane.fraction * scale * b for u, b in enumerate(plan.unit_bytes) if not receiver.has(u)
        )
        end = max(plan.lane_arrival_s[f], default=0.0)
        begin = end - size / plan.rates[f] if plan.rates[f] > 0 else -float("inf")
        for edge in plan.flows[f].edges:
            span = windows[edge].setdefault(plan.flow_phase[f], [begin, end])
            span[0], span[1] = min(span[0], begin), max(span[1], end)
    out = []
    for edge, spans in windows.items():
        ordered = sorted(spans.items(), key=lambda kv: kv[1][0])
        for (p, (_, e1)), (q, (b2, _)) in itertools.pairwise(ordered):
            if b2 < e1 - _TOL * max(1.0, e1):
                out.append(f"phases {p} and {q} stream over {edge} at the same time")
    return out
