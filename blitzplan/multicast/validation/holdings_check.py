"""The holdings part of the multicast certificate: every lane's holder holds what it sends.

Written apart from the planners: a source instance's GPU holds the stripes of its own TP rank
(the split coordinates of the target rank's stripe lie in the source rank's), and, for an
instance of another TP degree, every byte ``[round(lo * B), round(hi * B))`` of every carried
unit, which :meth:`~blitzplan.models.layout.Layout.reshard` checks byte by byte in the model's
layout; host memory holds everything; a target node forwards only what arrived at the holder
earlier in the plan (or the node had before: then from an instance GPU, never a relay).
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, layout
from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind

__all__ = ["check_holdings"]

_COORD = 1e-9


def check_holdings(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Every lane whose holder does not hold what it sends, as sentences (module docstring)."""
    return _from_rule(plan) + _check_resharded_bytes(state, plan)


def _held_by_rank(q: int, a: int, r: int, b: int, lo: float, hi: float) -> bool:
    """Whether rank ``q`` of an ``a``-way instance holds stripe [lo, hi) of rank ``r`` of ``b``:
    the split coordinates (r + lo)/b .. (r + hi)/b must lie in q/a .. (q+1)/a."""
    start = (Fraction(r) + Fraction(lo)) / b
    end = (Fraction(r) + Fraction(hi)) / b
    return Fraction(q, a) - Fraction(_COORD) <= start and end <= Fraction(q + 1, a) + Fraction(
        _COORD
    )


def _from_rule(plan: MulticastPlan) -> list[str]:
    out = []
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    into: dict[tuple[int, str], list[Lane]] = defaultdict(list)
    for lane in plan.lanes:
        into[(lane.receiver, lane.dst)].append(lane)
    for lane in plan.lanes:
        sender = plan.nodes[lane.sender]
        where = f"lane {lane.flow} ({lane.holder}->{lane.dst})"
        if sender.kind is NodeKind.INSTANCE:
            if lane.holder not in sender.gpus:
                out.append(f"{where}: {lane.holder} is not a GPU of {sender.label}")
            elif lane.rank == ALL_RANKS or not _held_by_rank(
                sender.gpus.index(lane.holder), sender.tp, lane.rank, tp, lane.lo, lane.hi
            ):
                out.append(
                    f"{where}: {lane.holder} does not hold rank {lane.rank} "
                    f"[{lane.lo:.6f}, {lane.hi:.6f})"
                )
        elif sender.kind in (NodeKind.HOST, NodeKind.CACHE):
            if lane.holder != sender.memory:
                out.append(f"{where}: {lane.holder} is not the memory of {sender.label}")
        else:
            out += _check_forwarded(plan, lane, into[(lane.sender, lane.holder)], where)
    return out


def _check_resharded_bytes(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """A lane from an instance of another TP degree sends, of every unit it carries, bytes
    ``[round(lo * B), round(hi * B))`` of its rank buffer: its holder's own buffer must contain
    each of them (:meth:`~blitzplan.models.layout.Layout.reshard`, byte by byte)."""
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    specs = {inst.id: inst.model for inst in state.instances}
    out: list[str] = []
    seen: dict[tuple[object, ...], str] = {}
    for lane in plan.lanes:
        sender = plan.nodes[lane.sender]
        if (
            sender.kind is not NodeKind.INSTANCE
            or sender.tp == tp
            or lane.holder not in sender.gpus
        ):
            continue
        spec = specs.get(sender.instance_id or "")
        if spec is None:
            continue  # _check_senders names it
        receiver = plan.nodes[lane.receiver]
        carried = [u for u in range(len(plan.unit_bytes)) if not receiver.has(u)]
        key = (spec, sender.tp, sender.gpus.index(lane.holder), lane.rank, lane.lo, lane.hi)
        if key not in seen:
            seen[key] = _lacked(spec, tp, key[1:], carried)
        if seen[key]:
            out.append(f"lane {lane.flow} ({lane.holder}->{lane.dst}): {seen[key]}")
    return out


def _lacked(
    spec: ModelSpec, tp: int, lane: tuple[int, int, int, float, float], units: list[int]
) -> str:
    """What the source rank lacks of the stripe (empty: nothing), by the layouts' bytes."""
    source_tp, source_rank, rank, lo, hi = lane
    try:
        target, source = layout(spec, tp), layout(spec, source_tp)
    except InvalidInputError as exc:
        return f"its bytes cannot be checked: {exc}"
    done: set[tuple[object, ...]] = set()
    for unit in units:
        shape = target.shape_key(unit)
        if shape in done:
            continue  # a unit laid out like one checked already (the layers)
        done.add(shape)
        try:
            target.reshard(unit, source, source_rank, rank, lo, hi)
        except InvalidInputError as exc:
            return f"unit {unit}: {exc}"
    return ""


def _check_forwarded(plan: MulticastPlan, lane: Lane, arrived: list[Lane], where: str) -> list[str]:
    """A target or stage forwards only what reached the holder (or the node had before)."""
    sender = plan.nodes[lane.sender]
    if sender.kind is NodeKind.STAGE:
        return [] if lane.holder == sender.memory and arrived else [f"{where}: stage holds nothing"]
    if lane.holder not in sender.gpus + sender.relays:
        return [f"{where}: {lane.holder} is not a GPU of node {sender.id}"]
    pieces = sorted(
        (x.lo, x.hi) for x in arrived if x.rank == lane.rank and x.hi > lane.lo and x.lo < lane.hi
    )
    covered = lane.lo
    for lo, hi in pieces:
        if lo <= covered + _COORD:
            covered = max(covered, hi)
    receiver = plan.nodes[lane.receiver]
    carried = [u for u in range(len(plan.unit_bytes)) if not receiver.has(u)]
    if any(not sender.has(u) for u in carried) and covered < lane.hi - _COORD:
        return [
            f"{where}: {lane.holder} never receives rank {lane.rank} [{lane.lo:.6f}, {lane.hi:.6f})"
        ]
    if any(sender.has(u) for u in carried) and lane.holder in sender.relays:
        return [f"{where}: relay {lane.holder} holds no unit the node had before"]
    return []
