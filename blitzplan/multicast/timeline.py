"""Building a plan's flows and computing its timeline with the pipelined recurrence.

For hop ``k`` into node ``R`` from node ``S``, with lane ``j`` carrying ``b_j(l)`` bytes of unit
``l`` at its fair-share rate ``r_j`` (all flows of the hop's phase plus background flows)::

    tau_k(l) = max_j b_j(l) / r_j                      # the unit streaming over the hop
    c_k(l)   = max_j min(chunk, b_j(l)) / r_j          # its last chunk, forwarded after arrival
    t_k(-1)  = start_k
    t_k(l)   = max(avail_S(l) + c_k(l) + lat_k, t_k(l-1) + tau_k(l))

``avail_S(l)`` is 0 for sources, the unit's arrival (or, when the hop's lanes do not line up with
the sender's stripes, its completion after the all-gather) for a forwarding target node, and the
sender's whole-model completion for store-and-forward hops. ``start_k`` is the latest of the
sender's first chunk, the receiver's ``startup_s``, and the end of the hops in ``after``.
A striped node then completes unit ``l`` with its NVLink ring all-gather:
``done(l) = max(t(l), done(l-1)) + max_j a_j(l) / g_j + lat``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.types import AllGather, Hop, Lane, NewInstance, NodeKind, PlanNode
from blitzplan.topologies import Flow, Topology

__all__ = ["PlanBuilder", "Timeline", "evaluate", "lane_edges"]


def lane_edges(
    topology: Topology, holder: str, exit_: str, dst: str
) -> tuple[tuple[str, str], ...]:
    """The edges a lane crosses: from ``holder`` (over NVLink to ``exit_`` when they differ and
    the receiver is on another host) out through ``exit_``'s NIC to ``dst``."""
    if topology.kind(holder) in ("host_mem", "ssd"):
        nic = exit_ if topology.kind(exit_) == "nic" else None
        return topology.path_edges(holder, dst, src_nic=nic)
    if holder == exit_ or topology.host_of(holder) == topology.graph.nodes[dst]["host"]:
        return topology.path_edges(holder, dst)
    return topology.path_edges(holder, exit_) + topology.path_edges(exit_, dst)


@dataclass
class PlanBuilder:
    """Collects nodes, instances, hops and all-gathers, creating one flow per lane."""

    topology: Topology
    nodes: list[PlanNode] = field(default_factory=list)
    instances: list[NewInstance] = field(default_factory=list)
    hops: list[Hop] = field(default_factory=list)
    allgathers: list[AllGather] = field(default_factory=list)
    flows: list[Flow] = field(default_factory=list)
    flow_phase: list[int] = field(default_factory=list)
    flow_latency_s: list[float] = field(default_factory=list)

    def add_node(self, node: PlanNode) -> int:
        node = PlanNode(**{**node.__dict__, "id": len(self.nodes)})
        self.nodes.append(node)
        return node.id

    def _lane(
        self, holder: str, exit_: str, dst: str, fraction: float, stripe: int, phase: int
    ) -> Lane:
        edges = lane_edges(self.topology, holder, exit_, dst)
        self.flows.append(Flow(edges, name=f"{holder}->{dst}"))
        self.flow_phase.append(phase)
        self.flow_latency_s.append(sum(self.topology.latency_s(e) for e in edges))
        return Lane(len(self.flows) - 1, holder, exit_, dst, fraction, stripe)

    def add_hop(
        self,
        sender: int,
        receiver: int,
        lanes: Sequence[tuple[str, str, str, float, int]],
        *,
        phase: int = 0,
        pipelined: bool = True,
        after: Sequence[int] = (),
    ) -> int:
        """Add a hop; ``lanes`` are ``(holder, exit, dst, fraction, stripe)``."""
        built = tuple(self._lane(*lane, phase) for lane in lanes)
        self.hops.append(Hop(sender, receiver, built, phase, pipelined, tuple(after)))
        return len(self.hops) - 1

    def add_allgather(self, node: int, *, phase: int = 0) -> None:
        """A ring all-gather among the GPUs of each TP rank of a striped node."""
        target = self.nodes[node]
        m, tp = target.stripes, target.tp
        if m == 1:
            return
        lanes = []
        for rank in range(tp):
            ring = [target.gpus[i * tp + rank] for i in range(m)]
            for i, gpu in enumerate(ring):
                nxt = ring[(i + 1) % m]
                lanes.append(self._lane(gpu, gpu, nxt, (m - 1) / m, i, phase))
        self.allgathers.append(AllGather(node, tuple(lanes), phase))


@dataclass(frozen=True)
class Timeline:
    """Rates and times of a built plan."""

    rates: tuple[float, ...]
    arrival_s: tuple[tuple[float, ...], ...]
    done_s: dict[int, tuple[float, ...]]
    first_s: dict[int, float]
    hop_end_s: tuple[float, ...]


def _need(node: PlanNode, unit_bytes: Sequence[int]) -> list[float]:
    """Bytes one receiving GPU (a stage: its host) needs per unit; 0 for units it has."""
    scale = node.tp if node.kind is NodeKind.STAGE else 1
    return [0.0 if node.has(u) else float(scale * b) for u, b in enumerate(unit_bytes)]


def evaluate(
    builder: PlanBuilder,
    unit_bytes: Sequence[int],
    chunk_bytes: int,
    background: Sequence[Flow] = (),
) -> Timeline:
    """Fair-share rates per phase, then the recurrence over hops in order."""
    rates = _phase_rates(builder, background)
    incoming: dict[int, int] = {}
    for h, hop in enumerate(builder.hops):
        if hop.receiver in incoming:
            raise InvalidInputError(f"node {hop.receiver} receives over two hops")
        incoming[hop.receiver] = h
    startup = _startup_by_node(builder)
    gathers = {ag.node: ag for ag in builder.allgathers}
    arrivals: list[tuple[float, ...]] = []
    hop_end: list[float] = []
    done: dict[int, tuple[float, ...]] = {}
    first: dict[int, float] = {}
    units = len(unit_bytes)
    for hop in builder.hops:
        sender = builder.nodes[hop.sender]
        receiver = builder.nodes[hop.receiver]
        need = _need(receiver, unit_bytes)
        avail, sender_first = _availability(
            hop, sender, receiver, incoming, arrivals, done, first, units
        )
        start = max(sender_first, startup.get(hop.receiver, 0.0))
        for prior in hop.after:
            start = max(start, hop_end[prior])
        times, first_chunk = _hop_times(
            hop.lanes,
            rates,
            builder.flow_latency_s,
            need,
            chunk_bytes,
            avail,
            start,
            receiver.present,
        )
        arrivals.append(times)
        hop_end.append(times[-1])
        first[hop.receiver] = first_chunk
        gather = gathers.get(hop.receiver)
        done[hop.receiver] = (
            _gather_times(gather, rates, builder.flow_latency_s, need, times, receiver.present)
            if gather
            else times
        )
    return Timeline(tuple(rates), tuple(arrivals), done, first, tuple(hop_end))


def _phase_rates(builder: PlanBuilder, background: Sequence[Flow]) -> list[float]:
    rates = [0.0] * len(builder.flows)
    for phase in sorted(set(builder.flow_phase)):
        ids = [i for i, p in enumerate(builder.flow_phase) if p == phase]
        shared = builder.topology.fair_share([builder.flows[i] for i in ids] + list(background))
        for i, rate in zip(ids, shared, strict=False):
            rates[i] = rate
    return rates


def _startup_by_node(builder: PlanBuilder) -> dict[int, float]:
    startup: dict[int, float] = {}
    for inst in builder.instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    return startup


def aligned(sender: PlanNode, receiver: PlanNode) -> bool:
    """A target sender can forward stripes as they arrive when both nodes stripe alike."""
    return (
        sender.kind is NodeKind.TARGET
        and receiver.kind is NodeKind.TARGET
        and len(sender.gpus) == len(receiver.gpus)
        and sender.stripes == receiver.stripes
        and sender.tp == receiver.tp
    )


def _availability(
    hop: Hop,
    sender: PlanNode,
    receiver: PlanNode,
    incoming: dict[int, int],
    arrivals: list[tuple[float, ...]],
    done: dict[int, tuple[float, ...]],
    first: dict[int, float],
    units: int,
) -> tuple[list[float], float]:
    """When each unit is available at the sender, and when the sender can start sending."""
    if sender.id not in incoming:
        return [0.0] * units, 0.0
    if incoming[sender.id] >= len(arrivals):
        raise InvalidInputError(f"hop from node {sender.id} comes before the hop that feeds it")
    completed = done[sender.id]
    if not hop.pipelined:
        return [completed[-1]] * units, completed[-1]
    if aligned(sender, receiver):
        return list(arrivals[incoming[sender.id]]), first[sender.id]
    return list(completed), first[sender.id]


def _hop_times(
    lanes: Sequence[Lane],
    rates: Sequence[float],
    latency_s: Sequence[float],
    need: Sequence[float],
    chunk_bytes: int,
    avail: Sequence[float],
    start: float,
    present: Sequence[bool] = (),
) -> tuple[tuple[float, ...], float]:
    """The recurrence for one hop; returns per-unit arrival times and the first chunk's.

    Units the receiver already has (``present``) are there at time 0 and take no link time."""
    lat = max(latency_s[lane.flow] for lane in lanes)
    fraction = np.array([lane.fraction for lane in lanes])
    inverse = 1.0 / np.array([rates[lane.flow] for lane in lanes])
    lane_bytes = np.outer(need, fraction)
    tau = (lane_bytes * inverse).max(axis=1).tolist()
    chunk = (np.minimum(lane_bytes, chunk_bytes) * inverse).max(axis=1).tolist()
    times: list[float] = []
    previous = start
    for u in range(len(need)):
        if present and present[u]:
            times.append(0.0)
            continue
        previous = max(avail[u] + chunk[u] + lat, previous + tau[u])
        times.append(previous)
    first_chunk = start + chunk[0] + lat  # the sender forwards its first chunk on arrival
    return tuple(times), first_chunk


def _gather_times(
    gather: AllGather,
    rates: Sequence[float],
    latency_s: Sequence[float],
    need: Sequence[float],
    arrival: Sequence[float],
    present: Sequence[bool] = (),
) -> tuple[float, ...]:
    lat = max(latency_s[lane.flow] for lane in gather.lanes)
    slowest = max(lane.fraction / rates[lane.flow] for lane in gather.lanes)
    done: list[float] = []
    previous = 0.0
    for u, bytes_ in enumerate(need):
        if present and present[u]:
            done.append(0.0)
            continue
        previous = max(arrival[u], previous) + bytes_ * slowest + lat
        done.append(previous)
    return tuple(done)
