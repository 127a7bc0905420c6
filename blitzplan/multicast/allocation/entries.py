"""Which sender sends which stripe of a target node to which of its GPUs (steps 1-2 of
:mod:`~blitzplan.multicast.allocation.stripes`).

1. **Entries.** Each rank's ``[0, 1)`` is split over the node's instance GPUs of that rank and its
   relays in proportion to what each can receive (its NIC port for the network part, its route from
   each local sender for the local part), so every receiving link works for the same time;
   instance GPUs only receive their own rank, relays any.
2. **Senders.** Every entry's interval is shared out: each local sender gets, in every entry, the
   part its route to that entry carries; the network part goes to the network senders by shares,
   entry by entry, a sender with an exit under the entry's leaf first (no spine crossing).
"""

from __future__ import annotations

from collections.abc import Sequence

from blitzplan.multicast.allocation.allocate import Allocation
from blitzplan.multicast.allocation.ports import Ports
from blitzplan.multicast.plan_types import PlanNode
from blitzplan.multicast.setup.holdings import TOLERANCE
from blitzplan.multicast.setup.problem import Problem

__all__ = ["MIN_PIECE", "Piece", "assign_pieces"]

Piece = tuple[str, float, float]  # (gpu, lo, hi)

MIN_PIECE = 1e-6
"""No piece of a stripe shorter than this (of a rank's shard) gets its own lane."""


def assign_pieces(
    problem: Problem, node: PlanNode, port: Ports, alloc: Allocation, j: int
) -> list[tuple[int, int, str, float, float]]:
    """``(sender, rank, dst, lo, hi)`` pieces covering every rank of node ``j`` (steps 1-2)."""
    local = [(s, f) for s, f in alloc.local.get(j, ())]
    network = [(s, f) for s, f in alloc.network.get(j, ())]
    total = sum(f for _, f in local + network)
    local = [(s, f / total) for s, f in local]
    network = [(s, f / total) for s, f in network]
    weights, local_parts = _entry_weights(problem, node, port, j, local, network)
    entries = _entries(problem, node, weights)
    budget = {s: f * problem.tp for s, f in network}
    out: list[tuple[int, int, str, float, float]] = []
    for rank in range(problem.tp):
        for dst, lo, hi in entries[rank]:
            at = lo
            for s, part in local_parts.get(dst, []):
                end = at + (hi - lo) * part / weights[dst]
                if hi - end <= MIN_PIECE and not network:
                    end = hi
                if end - at > MIN_PIECE:
                    out.append((s, rank, dst, at, end))
                    at = end
            out += _network_pieces(problem, port, budget, network, rank, dst, at, hi)
            if hi - at > 0 and not network and out:  # rounding: the last local piece ends at hi
                s, r, d, a, _ = out[-1]
                out[-1] = (s, r, d, a, hi)
    return out


def _entry_weights(
    problem: Problem,
    node: PlanNode,
    port: Ports,
    j: int,
    local: list[tuple[int, float]],
    network: list[tuple[int, float]],
) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """Per receiving GPU: its weight (share of the node's bytes it receives), and per local
    sender the part of that weight it sends there."""
    topo = problem.topology
    members = node.gpus + node.relays
    share_net = sum(f for _, f in network)
    nic_of = {g: topo.nic_of(g) for g in members}
    sharing: dict[str, int] = {}
    for nic in nic_of.values():
        sharing[nic] = sharing.get(nic, 0) + 1
    into = port.into.get(j, {})
    net = {
        g: into.get(nic_of[g], 0.0) / sharing[nic_of[g]]
        if any(port.reaches_nic(s, nic_of[g]) for s, _ in network)
        else 0.0
        for g in members
    }
    total_net = sum(net.values())
    weights = {g: share_net * net[g] / total_net if total_net > 0 else 0.0 for g in members}
    parts: dict[str, list[tuple[int, float]]] = {}
    for s, f in local:
        routes = port.local.get((s, j), {})
        total = sum(routes.values())
        for g, rate in routes.items():
            weights[g] = weights.get(g, 0.0) + f * rate / total
            parts.setdefault(g, []).append((s, f * rate / total))
    return weights, parts


def _entries(problem: Problem, node: PlanNode, weights: dict[str, float]) -> dict[int, list[Piece]]:
    """Per rank, ``[0, 1)`` split over the GPUs that receive it in proportion to ``weights``."""
    tp = problem.tp
    own = {
        r: [g for g in node.gpus if node.rank_of(g) == r and weights.get(g, 0) > 0]
        for r in range(tp)
    }
    relays = [g for g in node.relays if weights.get(g, 0) > 0]
    total = sum(weights.values())
    per_coordinate = tp / total if total > 0 else 0.0
    own_share = {
        r: min(1.0, per_coordinate * sum(weights[g] for g in own[r])) if relays else 1.0
        for r in range(tp)
    }
    out: dict[int, list[Piece]] = {}
    for r in range(tp):
        out[r] = _split(own[r], [weights[g] for g in own[r]], 0.0, own_share[r]) if own[r] else []
        if not out[r]:
            own_share[r] = 0.0
    deficits = [(r, own_share[r], 1.0) for r in range(tp) if own_share[r] < 1.0 - TOLERANCE]
    for r, piece in _spread(relays, [weights[g] for g in relays], deficits):
        out[r].append(piece)
    return out


def _split(gpus: Sequence[str], weights: Sequence[float], lo: float, hi: float) -> list[Piece]:
    """``[lo, hi)`` cut in proportion to ``weights``."""
    total = sum(weights)
    out = []
    at = lo
    for i, (gpu, w) in enumerate(zip(gpus, weights, strict=True)):
        end = hi if i == len(gpus) - 1 else at + (hi - lo) * w / total
        if end - at > TOLERANCE:
            out.append((gpu, at, end))
        at = end
    return out


def _spread(
    relays: Sequence[str], weights: Sequence[float], deficits: Sequence[tuple[int, float, float]]
) -> list[tuple[int, Piece]]:
    """Cover each rank's missing ``[lo, hi)`` with relays in proportion to their weights."""
    need = sum(hi - lo for _, lo, hi in deficits)
    if not relays or need <= 0:
        return []
    total = sum(weights)
    budgets = [need * w / total for w in weights]
    out: list[tuple[int, Piece]] = []
    k = 0
    for rank, lo, hi in deficits:
        at = lo
        while hi - at > TOLERANCE and k < len(relays):
            end = min(hi, at + budgets[k])
            if end - at > TOLERANCE:
                out.append((rank, (relays[k], at, end)))
            budgets[k] -= end - at
            at = end
            if budgets[k] <= TOLERANCE:
                k += 1
        if hi - at > TOLERANCE:
            out.append((rank, (relays[-1], at, hi)))
    return out


def _network_pieces(
    problem: Problem,
    port: Ports,
    budget: dict[int, float],
    network: list[tuple[int, float]],
    rank: int,
    dst: str,
    lo: float,
    hi: float,
) -> list[tuple[int, int, str, float, float]]:
    """Share ``[lo, hi)`` of one entry among network senders (step 2)."""
    if hi - lo <= TOLERANCE or not network:
        return []
    leaf = problem.topology.leaf_of(dst)
    nic = problem.topology.nic_of(dst)
    reach = [s for s, _ in network if port.reaches_nic(s, nic)] or [s for s, _ in network]
    leaves_out = port.leaves_out
    keyed = sorted(  # the position breaks ties as the stable sort did
        [(leaf not in leaves_out(s), -budget[s], k, s) for k, s in enumerate(reach)]
    )
    order = [key[-1] for key in keyed]
    out: list[tuple[int, int, str, float, float]] = []
    at = lo
    for s in order:
        if hi - at <= MIN_PIECE:
            break
        take = min(hi - at, budget[s])
        if take <= MIN_PIECE:
            continue
        if hi - at - take <= MIN_PIECE:
            take = hi - at  # no sliver left behind
        out.append((s, rank, dst, at, at + take))
        budget[s] -= take
        at += take
    if hi - at > 0 and out:  # rounding: the last piece takes the rest
        s, r, d, a, _ = out[-1]
        out[-1] = (s, r, d, a, hi)
        budget[s] -= hi - at
    elif hi - at > 0:
        s = max(reach, key=lambda s: budget[s])
        out.append((s, rank, dst, at, hi))
        budget[s] -= hi - at
    return out
