"""A plan under construction: its nodes, instances and lanes (one flow per lane, on its route),
grouped into hops and gathers; :mod:`~blitzplan.multicast.timeline.evaluate` times it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from blitzplan._checks import MAX_BYTES_PER_S, MIN_BYTES_PER_S
from blitzplan.errors import InfeasibleError, InvalidInputError
from blitzplan.multicast.plan_types import AllGather, Hop, Lane, NewInstance, PlanNode, built
from blitzplan.multicast.setup.node_memo import node_host
from blitzplan.topologies import Edge, Flow, Topology
from blitzplan.topologies.fairshare import quick_flow

__all__ = ["PlanBuilder", "lane_edges", "lane_route"]


def lane_edges(topology: Topology, holder: str, exit_: str, dst: str) -> tuple[Edge, ...]:
    """The edges a lane crosses: from ``holder`` (over NVLink to ``exit_`` when it differs),
    out through the exit's NIC (or the host NIC ``exit_``), to ``dst``; inside one host, the
    host's own route from ``holder`` to ``dst``."""
    local = node_host(topology, holder) == node_host(topology, dst)
    if local or exit_ == holder:
        return topology.path_edges(holder, dst)
    if topology.kind(exit_) == "nic":
        return topology.path_edges(holder, dst, src_nic=exit_)
    return topology.path_edges(holder, exit_) + topology.path_edges(exit_, dst)


def lane_route(
    topology: Topology, holder: str, exit_: str, dst: str
) -> tuple[str, tuple[Edge, ...], float]:
    """``(exit, edges, latency)`` of a lane, cached per topology; inside one host the exit is
    the holder (no NIC, no relay)."""
    cache = topology.memo.setdefault("lane_routes", {})
    key = (holder, exit_, dst)
    found = cache.get(key)
    if found is None:
        if node_host(topology, holder) == node_host(topology, dst):
            exit_ = holder
        try:
            edges = lane_edges(topology, holder, exit_, dst)
        except InvalidInputError as exc:  # a failure cut every route this method could use
            raise InfeasibleError(
                f"no route from {holder} to {dst}"
                + ("" if exit_ in (holder, dst) else f" by {exit_}")
                + f" in topology {topology.name!r}: this method has no other way to reach {dst}"
            ) from exc
        found = (exit_, edges, sum(topology.latency_s(e) for e in edges))
        cache[key] = found
    return found


_Route = tuple[str, tuple[Edge, ...], float, str, bool]
"""A lane's exit, edges, latency, flow name and whether its edges are distinct."""
_INF = math.inf


@dataclass
class PlanBuilder:
    """Collects nodes, instances and lanes (one flow per lane), grouped into hops and gathers."""

    topology: Topology
    nodes: list[PlanNode] = field(default_factory=list)
    instances: list[NewInstance] = field(default_factory=list)
    lanes: list[Lane] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    flow_phase: list[int] = field(default_factory=list)
    flow_latency_s: list[float] = field(default_factory=list)
    hop_of_lane: list[int] = field(default_factory=list)
    deps: list[list[int] | None] = field(default_factory=list)
    """Per lane, the lanes bringing its bytes to its holder when the constructor knows them."""
    hop_specs: list[tuple[int, int, int, bool, tuple[int, ...]]] = field(default_factory=list)
    hop_ids: dict[tuple[int, int, int], int] = field(default_factory=dict)
    """Each hop's id by ``(sender, receiver, phase)``."""
    _routes: dict[tuple[str, str, str], _Route] = field(init=False, repr=False)
    """:meth:`_route` by ``(holder, exit, dst)``, kept on the topology."""

    _hops: tuple[tuple[int, int], tuple[Hop, ...]] = field(
        default=((-1, -1), ()), init=False, repr=False
    )
    """:meth:`hops` as last built, with the lane and hop counts it was built at."""

    def __post_init__(self) -> None:
        self._routes = self.topology.memo.setdefault("lane_flows", {})

    def add_node(self, node: PlanNode) -> int:
        """Add ``node`` with its position as its id (the node itself when that is its id: it
        is frozen; else a copy)."""
        if node.id != len(self.nodes):
            node = built(PlanNode, **{**node.__dict__, "id": len(self.nodes)})
        self.nodes.append(node)
        return node.id

    def hop(
        self,
        sender: int,
        receiver: int,
        *,
        phase: int = 0,
        pipelined: bool = True,
        after: Sequence[int] = (),
    ) -> int:
        """The hop id for ``sender -> receiver`` (created on first use); -1 for gathers."""
        known = self.hop_ids.get((sender, receiver, phase))
        if known is not None:
            return known
        self.hop_specs.append((sender, receiver, phase, pipelined, tuple(after)))
        self.hop_ids[(sender, receiver, phase)] = len(self.hop_specs) - 1
        return len(self.hop_specs) - 1

    def add_lane(
        self,
        hop: int,
        holder: str,
        exit_: str,
        dst: str,
        rank: int,
        lo: float,
        hi: float,
        *,
        pace_bytes_per_s: float = math.inf,
        deps: list[int] | None = None,
    ) -> Lane:
        """A lane of hop ``hop``; ``deps`` are the lanes bringing its bytes to ``holder``
        (``None``: derive them from the lanes into the holder)."""
        sender, receiver, phase = self.hop_specs[hop][:3]
        return self._lane(
            sender,
            receiver,
            hop,
            phase,
            holder,
            exit_,
            dst,
            rank,
            lo,
            hi,
            pace=pace_bytes_per_s,
            deps=deps,
        )

    def add_gather(
        self,
        node: int,
        holder: str,
        dst: str,
        rank: int,
        lo: float,
        hi: float,
        *,
        phase: int = 0,
        deps: list[int] | None = None,
        pace_bytes_per_s: float = math.inf,
    ) -> Lane:
        """An NVLink copy of stripe ``[lo, hi)`` of ``rank`` from ``holder`` to ``dst``."""
        return self._lane(
            node,
            node,
            -1,
            phase,
            holder,
            holder,
            dst,
            rank,
            lo,
            hi,
            gather=True,
            deps=deps,
            pace=pace_bytes_per_s,
        )

    def add_gathers(
        self,
        node: int,
        holder: str,
        peers: Sequence[str],
        rank: int,
        lo: float,
        hi: float,
        deps: list[int],
        pace_bytes_per_s: float,
    ) -> list[int]:
        """:meth:`add_gather` to every GPU of ``peers`` but ``holder``, one pace and the same
        ``deps``; the new lanes' ids."""
        return [
            self.add_gather(
                node, holder, gpu, rank, lo, hi, deps=deps, pace_bytes_per_s=pace_bytes_per_s
            ).flow
            for gpu in peers
            if gpu != holder
        ]

    def _lane(
        self,
        sender: int,
        receiver: int,
        hop: int,
        phase: int,
        holder: str,
        exit_: str,
        dst: str,
        rank: int,
        lo: float,
        hi: float,
        *,
        gather: bool = False,
        pace: float | None = None,
        deps: list[int] | None = None,
    ) -> Lane:
        """A lane and (unless ``pace`` is None: the caller appends them) its flow and deps."""
        route = self._routes.get((holder, exit_, dst))
        if route is None:
            route = self._route(holder, exit_, dst)
        lane = object.__new__(Lane)  # as built(Lane, ...) makes it, without its field check
        lane.__dict__.update(
            flow=len(self.lanes),
            sender=sender,
            receiver=receiver,
            holder=holder,
            exit=route[0],
            dst=dst,
            rank=rank,
            lo=lo,
            hi=hi,
            gather=gather,
        )
        self.lanes.append(lane)
        self.flow_phase.append(phase)
        self.flow_latency_s.append(route[2])
        self.hop_of_lane.append(hop)
        if pace is not None:
            self.flows.append(self._flow(route, pace))
            self.deps.append(deps)
        return lane

    def _route(self, holder: str, exit_: str, dst: str) -> _Route:
        """:func:`lane_route` with the lane's flow name and whether its edges are distinct,
        kept per topology (as the route is)."""
        taken, edges, latency = lane_route(self.topology, holder, exit_, dst)
        distinct = type(edges) is tuple and 0 < len(edges) == len(set(edges))
        route = (taken, edges, latency, f"{holder}->{dst}", distinct)
        self._routes[holder, exit_, dst] = route
        return route

    @staticmethod
    def _flow(route: _Route, pace: float) -> Flow:
        """The lane's flow: :func:`~blitzplan.topologies.fairshare.quick_flow` of the route's
        edges and name at ``pace`` (raised to a sliver's), its edges' check done once."""
        if pace < MIN_BYTES_PER_S:  # a sliver's pace: any cap above it is as good
            pace = MIN_BYTES_PER_S
        if route[4] and type(pace) is float and (pace <= MAX_BYTES_PER_S or pace == _INF):
            flow = object.__new__(Flow)
            flow.__dict__.update(edges=route[1], max_bytes_per_s=pace, name=route[3])
            return flow
        return quick_flow(route[1], pace, route[3])

    def hops(self) -> tuple[Hop, ...]:
        """The hops with their lanes (kept until a lane or a hop is added: lanes and hops are
        only ever appended)."""
        size = (len(self.lanes), len(self.hop_specs))
        if self._hops[0] != size:
            self._hops = (size, self._grouped())
        return self._hops[1]

    def _grouped(self) -> tuple[Hop, ...]:
        grouped: list[list[Lane]] = [[] for _ in self.hop_specs]
        for lane, h in zip(self.lanes, self.hop_of_lane, strict=True):
            if h >= 0:
                grouped[h].append(lane)
        return tuple(
            Hop(s, r, tuple(lanes), phase, pipelined, after)
            for (s, r, phase, pipelined, after), lanes in zip(self.hop_specs, grouped, strict=True)
        )

    def allgathers(self) -> tuple[AllGather, ...]:
        by_node: dict[int, list[Lane]] = {}
        for lane in self.lanes:
            if lane.gather:
                by_node.setdefault(lane.receiver, []).append(lane)
        return tuple(
            AllGather(node, tuple(lanes), self.flow_phase[lanes[0].flow])
            for node, lanes in sorted(by_node.items())
        )
