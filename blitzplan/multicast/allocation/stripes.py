"""From an allocation to lanes: which stripe intervals go from which holder, exit and relay.

For each target node, in forwarding order:

1-2. **Entries and senders** (:mod:`~blitzplan.multicast.allocation.entries`): each rank's
   ``[0, 1)`` split over the node's receiving GPUs, and each entry's interval shared out among
   the node's senders.
3. **Holders.** A source sends each piece from the GPU holding it (TP re-sharding by
   :mod:`~blitzplan.multicast.setup.holdings`); a forwarding node from the GPU it landed on, so it
   forwards each chunk as it arrives.
4. **Exits.** A network piece leaves by the holder's own NIC when that NIC is under the
   destination's leaf and has budget left at the planned rate, else by the exits under that leaf,
   else by any exit, most budget left first, split over several when one has too little (spare
   GPUs relay over NVLink). Every lane is paced to finish at the allocation's fluid time.
5. **Gathers.** What lands on one GPU is copied over NVLink to every other instance GPU of its
   rank in the node, one lane per contiguous interval, paced at twice the rate its bytes land.
6. **Headroom.** A lane that forwards (or gathers) starts a chunk after the bytes it forwards
   begin to arrive; :func:`relax_paces` lets it run faster than its pace, up to twice, where its
   links have room the other lanes' paces leave, so it catches up instead of ending a chunk late.

The builder records, for every lane, the lanes that bring its bytes to its holder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import repeat

from blitzplan.multicast.allocation.allocate import Allocation
from blitzplan.multicast.allocation.entries import MIN_PIECE, Piece, assign_pieces
from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.allocation.ports import Ports
from blitzplan.multicast.plan_types import Lane, NodeKind, PlanNode
from blitzplan.multicast.setup.holdings import TOLERANCE, holder_segments, overlap
from blitzplan.multicast.setup.node_memo import node_host
from blitzplan.multicast.setup.problem import Problem
from blitzplan.topologies import Edge, Topology
from blitzplan.topologies.fairshare import quick_flow

__all__ = ["build_lanes", "relax_paces"]

GATHER_HEADROOM = 2.0
"""Gathers are paced at this multiple of the rate their bytes land at, so a gather that starts
late catches up while it never crowds other flows off an NVLink."""
Landing = tuple[str, float, float, int]  # (gpu, lo, hi, lane id)


class _Exits:
    """Per sender NIC, the bytes its lanes already carry, against its budget at ``fluid_s``."""

    def __init__(self, builder: PlanBuilder, port: Ports, fluid_s: float) -> None:
        self.builder, self.port, self.fluid_s = builder, port, fluid_s
        self.used: dict[tuple[int, str], float] = {}
        self.nics: dict[str, str] = {}

    def nic(self, exit_: str) -> str:
        if exit_ not in self.nics:
            topo = self.builder.topology
            self.nics[exit_] = exit_ if topo.kind(exit_) == "nic" else topo.nic_of(exit_)
        return self.nics[exit_]

    def left(self, sender: int, exit_: str) -> float:
        rate = self.port.out.get(sender, {}).get(self.nic(exit_), 0.0)
        return rate * self.fluid_s - self.used.get((sender, self.nic(exit_)), 0.0)

    def choose(self, sender: int, holder: str, dst: str, size: float) -> list[tuple[str, float]]:
        """``(exit, fraction of the piece)`` pairs covering the piece (step 4)."""
        topo = self.builder.topology
        leaf = topo.leaf_of(dst)
        rates = self.port.out.get(sender, {})
        options = [
            e
            for e in self.builder.nodes[sender].exits
            if self.nic(e) in rates and _routable(topo, holder, e, dst)
        ]
        if not options:
            return [(holder, 1.0)]
        same = [e for e in options if topo.leaf_of_nic(self.nic(e)) == leaf]
        if holder in same and self.left(sender, holder) >= size * (1 - 1e-6):
            return [(holder, 1.0)]
        chosen: list[tuple[str, float]] = []
        remaining = size
        for pool in (same, options):
            for e in sorted(pool, key=lambda e: (-self.left(sender, e), e != holder)):
                if remaining <= size * MIN_PIECE:
                    break
                room = self.left(sender, e)
                if room <= size * MIN_PIECE or any(e == c for c, _ in chosen):
                    continue
                take = remaining if remaining - room <= size * MIN_PIECE else room
                chosen.append((e, take / size if size > 0 else 1.0))
                remaining -= take
        if not chosen:  # over budget everywhere: the exit with most room takes it all
            best = max(options, key=lambda e: self.left(sender, e))
            return [(best, 1.0)]
        if remaining > 0:
            e, fraction = chosen[-1]
            chosen[-1] = (e, fraction + remaining / size)
        return chosen

    def spend(self, sender: int, exit_: str, size: float) -> None:
        key = (sender, self.nic(exit_))
        self.used[key] = self.used.get(key, 0.0) + size


def build_lanes(
    problem: Problem,
    builder: PlanBuilder,
    port: Ports,
    alloc: Allocation,
    check: Callable[[str], None] | None = None,
) -> None:
    """Add every lane and gather of ``alloc`` to ``builder`` (nodes already added); ``check``
    (a deadline's checkpoint) is called before each target node."""
    landed: dict[int, dict[int, list[Landing]]] = {}
    gathered: dict[int, dict[int, list[Landing]]] = {}
    exits = _Exits(builder, port, alloc.fluid_s)
    for j in alloc.order:
        if check is not None:
            check("lanes")
        if not alloc.senders(j):
            continue
        node = builder.nodes[j]
        carried = float(sum(b for u, b in enumerate(problem.unit_bytes) if not node.has(u)))
        pieces = assign_pieces(problem, node, port, alloc, j)
        landed[j] = {r: [] for r in range(problem.tp)}
        for sender, rank, dst, lo, hi in pieces:
            hop = builder.hop(sender, j)
            for holder, a, b, deps in _holders(
                builder.nodes[sender], (landed, gathered), rank, lo, hi, problem.tp
            ):
                for lane, x, y in _lanes(
                    builder, exits, alloc, hop, sender, holder, dst, rank, a, b, carried, deps
                ):
                    landed[j][rank].append((dst, x, y, lane))
        pace = GATHER_HEADROOM * carried / alloc.fluid_s if alloc.fluid_s > 0 else math.inf
        gathered[j] = _gathers(builder, node, landed[j], pace)


def _holders(
    sender: PlanNode,
    arrivals: tuple[dict[int, dict[int, list[Landing]]], dict[int, dict[int, list[Landing]]]],
    rank: int,
    lo: float,
    hi: float,
    tp: int,
) -> list[tuple[str, float, float, list[tuple[int, float, float]]]]:
    """Who at ``sender`` holds ``[lo, hi)`` of ``rank``, split where the holder changes, with
    the lanes ``(id, lo, hi)`` that bring it there (``arrivals``: per node and rank, what
    landed on its GPUs and relays, and what its gathers copied to its instance GPUs). A node
    that had units before this plan forwards from its instance GPUs only (its relays lack
    those units), once the bytes have landed or been gathered there."""
    if sender.kind is NodeKind.HOST:
        return [(str(sender.memory), lo, hi, [])]
    if sender.kind is NodeKind.INSTANCE:
        segments = [(sender.gpus[q], a, b) for a, b, q in holder_segments(sender.tp, rank, tp)]
        return [(g, a, b, []) for g, a, b in _cut(segments, lo, hi)]
    landed, gathered = arrivals
    arrived = landed.get(sender.id, {}).get(rank)
    if not arrived or sender.present:  # an instance GPU of the rank holds it (from before)
        gpu = next(g for g in sender.gpus if sender.rank_of(g) == rank)
        pieces = [*(arrived or []), *gathered.get(sender.id, {}).get(rank, [])]
        deps = [(lane, a, b) for g, a, b, lane in pieces if g == gpu]
        return [(gpu, lo, hi, [d for d in deps if overlap(d[1:], (lo, hi)) is not None])]
    out: list[tuple[str, float, float, list[tuple[int, float, float]]]] = []
    for gpu, a, b, lane in sorted(arrived, key=lambda x: x[1]):
        common = overlap((a, b), (lo, hi))
        if common is None:
            continue
        if out and out[-1][0] == gpu and abs(out[-1][2] - common[0]) <= TOLERANCE:
            out[-1] = (gpu, out[-1][1], common[1], [*out[-1][3], (lane, a, b)])
        else:
            out.append((gpu, common[0], common[1], [(lane, a, b)]))
    return out


def _cut(pieces: Sequence[Piece], lo: float, hi: float) -> list[Piece]:
    out = []
    for gpu, a, b in pieces:
        common = overlap((a, b), (lo, hi))
        if common is not None:
            out.append((gpu, common[0], common[1]))
    return out


def _lanes(
    builder: PlanBuilder,
    exits: _Exits,
    alloc: Allocation,
    hop: int,
    sender: int,
    holder: str,
    dst: str,
    rank: int,
    lo: float,
    hi: float,
    carried: float,
    feeds: list[tuple[int, float, float]],
) -> list[tuple[int, float, float]]:
    """Lanes ``(id, lo, hi)`` for one held piece: one per exit it leaves by (step 4)."""
    topo = builder.topology
    size = (hi - lo) * carried
    pace = 1.0 / alloc.fluid_s if alloc.fluid_s > 0 else math.inf
    local = node_host(topo, holder) == node_host(topo, dst)
    if local:
        lane = builder.add_lane(
            hop,
            holder,
            holder,
            dst,
            rank,
            lo,
            hi,
            pace_bytes_per_s=size * pace,
            deps=_within(feeds, lo, hi),
        )
        return [(lane.flow, lo, hi)]
    out = []
    at = lo
    choices = exits.choose(sender, holder, dst, size)
    for k, (exit_, fraction) in enumerate(choices):
        end = hi if k == len(choices) - 1 else at + (hi - lo) * fraction
        if end - at <= TOLERANCE:
            continue
        part = (end - at) * carried
        exits.spend(sender, exit_, part)
        lane = builder.add_lane(
            hop,
            holder,
            exit_,
            dst,
            rank,
            at,
            end,
            pace_bytes_per_s=part * pace,
            deps=_within(feeds, at, end),
        )
        out.append((lane.flow, at, end))
        at = end
    return out


def _routable(topo: Topology, holder: str, exit_: str, dst: str) -> bool:
    """Whether a lane from ``holder`` by ``exit_`` to ``dst`` has a route (after failures some
    pairs have none; kept per topology, whose routes never change)."""
    known: dict[tuple[str, str, str], bool] = topo.memo.setdefault("routable", {})
    found = known.get((holder, exit_, dst))
    if found is None:
        if topo.kind(exit_) == "nic":
            found = topo.has_path(holder, dst, src_nic=exit_)
        else:
            first = exit_ == holder or topo.has_path(holder, exit_)
            found = first and topo.has_path(exit_, dst)
        known[(holder, exit_, dst)] = found
    return found


def _within(feeds: list[tuple[int, float, float]], lo: float, hi: float) -> list[int]:
    """The feeding lanes that carry part of ``[lo, hi)``."""
    return [lane for lane, a, b in feeds if overlap((a, b), (lo, hi)) is not None]


def _gathers(
    builder: PlanBuilder, node: PlanNode, landed: dict[int, list[Landing]], pace: float
) -> dict[int, list[Landing]]:
    """NVLink copies of every contiguous interval that landed on one GPU (step 5); per rank,
    what they land on each instance GPU."""
    out: dict[int, list[Landing]] = {rank: [] for rank in landed}
    for rank, pieces in landed.items():
        peers = [g for g in node.gpus if node.rank_of(g) == rank]
        if len(peers) <= 1 and all(p[0] in peers for p in pieces):
            continue
        by_gpu: dict[str, list[tuple[float, float, int]]] = {}
        for gpu, lo, hi, lane in pieces:
            by_gpu.setdefault(gpu, []).append((lo, hi, lane))
        into = out[rank]
        for holder, parts in by_gpu.items():
            for lo, hi, deps in _runs(parts):
                flows = builder.add_gathers(
                    node.id, holder, peers, rank, lo, hi, deps, (hi - lo) * pace
                )
                into.extend(zip([g for g in peers if g != holder], repeat(lo), repeat(hi), flows))
    return out


def _runs(parts: list[tuple[float, float, int]]) -> list[tuple[float, float, list[int]]]:
    """Contiguous runs of intervals, each with the lanes that make it up."""
    runs: list[tuple[float, float, list[int]]] = []
    for lo, hi, lane in sorted(parts):
        if runs and abs(runs[-1][1] - lo) <= TOLERANCE:
            runs[-1] = (runs[-1][0], hi, [*runs[-1][2], lane])
        else:
            runs.append((lo, hi, [lane]))
    return runs


FORWARD_HEADROOM = 2.0
"""A forwarding or gathering lane may be paced up to this multiple of its planned rate."""
CHECK_EVERY = 64
"""Lanes between two calls of a deadline's checkpoint in :func:`relax_paces`."""


def relax_paces(
    builder: PlanBuilder,
    residual: Mapping[Edge, float],
    check: Callable[[str], None] | None = None,
) -> None:
    """Raise the pace of every forwarding and gathering lane into the room its links have left
    (module docstring, step 6). Every pace stays within what the links carry together, so the
    fair shares remain the paces. ``check`` (a deadline's checkpoint) is called every
    :data:`CHECK_EVERY` lanes."""
    load: dict[Edge, float] = {}
    get = load.get
    for flow in builder.flows:
        pace = flow.max_bytes_per_s
        for edge in flow.edges:
            load[edge] = get(edge, 0.0) + pace
    flows, isfinite = builder.flows, math.isfinite
    forwarding = {node.id for node in builder.nodes if node.kind is NodeKind.TARGET}
    for lane in builder.lanes if check is None else _checked(builder.lanes, check):
        if lane.sender not in forwarding:
            continue
        flow = flows[lane.flow]
        pace = flow.max_bytes_per_s
        if not isfinite(pace):
            continue
        extra = pace * (FORWARD_HEADROOM - 1)
        for edge in flow.edges:  # the least room any of its links has left, at most ``extra``
            room = residual.get(edge, 0.0) - load[edge]
            if room < extra:
                extra = room
        if extra <= 0:
            continue
        for edge in flow.edges:
            load[edge] += extra
        flows[lane.flow] = quick_flow(flow.edges, pace + extra, flow.name)


def _checked(lanes: Sequence[Lane], check: Callable[[str], None]) -> Iterator[Lane]:
    """``lanes``, ``check("pacing")`` called before every :data:`CHECK_EVERY`-th (a loop
    without a deadline iterates the list itself: no test per lane)."""
    for k, lane in enumerate(lanes):
        if not k % CHECK_EVERY:
            check("pacing")
        yield lane
