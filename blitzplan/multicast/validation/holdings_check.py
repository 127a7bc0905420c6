"""The holdings part of the multicast certificate: every lane's holder holds what it sends.

Written apart from the planners: a source instance's GPU holds the stripes of its own TP rank
(the split coordinates of the target rank's stripe lie in the source rank's), and, for an
instance of another TP degree, every byte ``[round(lo * B), round(hi * B))`` of every carried
unit, which :meth:`~blitzplan.models.layout.Layout.reshard` checks byte by byte in the model's
layout; host memory holds everything; a target node forwards only what arrived at the holder
earlier in the plan (or the node had before: then from an instance GPU, never a relay).
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from fractions import Fraction

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, layout
from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind, PlanNode

__all__ = ["check_holdings"]

_COORD = 1e-9


def check_holdings(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Every lane whose holder does not hold what it sends, as sentences (module docstring)."""
    return _from_rule(plan) + _check_resharded_bytes(state, plan)


def _held_by_rank(q: int, a: int, r: int, b: int, lo: float, hi: float) -> bool:
    """Whether rank ``q`` of an ``a``-way instance holds stripe [lo, hi) of rank ``r`` of ``b``:
    the split coordinates (r + lo)/b .. (r + hi)/b must lie in q/a .. (q+1)/a (to ``_COORD``),
    that is ``lo`` at least ``b (q/a - _COORD) - r`` and ``hi`` at most ``b ((q+1)/a + _COORD)
    - r``, in exact arithmetic: against the nearest floats of the two limits first (a float
    above or below the nearest float of a limit is so of the limit), the fractions on a tie."""
    (low, low_f), (high, high_f) = _rank_limits(q, a, r, b)
    return (lo > low_f or (lo == low_f and low <= lo)) and (
        hi < high_f or (hi == high_f and hi <= high)
    )


@functools.lru_cache(maxsize=256)
def _rank_limits(q: int, a: int, r: int, b: int) -> tuple[tuple[Fraction, float], ...]:
    low = b * (Fraction(q, a) - Fraction(_COORD)) - r
    high = b * (Fraction(q + 1, a) + Fraction(_COORD)) - r
    return (low, float(low)), (high, float(high))


def _from_rule(plan: MulticastPlan) -> list[str]:
    out = []
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    into: dict[tuple[int, str, int], list[tuple[float, float]]] = defaultdict(list)
    landed: set[tuple[int, str]] = set()
    for lane in plan.lanes:
        into[(lane.receiver, lane.dst, lane.rank)].append((lane.lo, lane.hi))
        landed.add((lane.receiver, lane.dst))
    chains = {key: _chains(pieces) for key, pieces in into.items()}
    units = range(len(plan.unit_bytes))
    carried: dict[tuple[int, int], tuple[bool, bool]] = {}  # whether the sender had / lacked
    for lane in plan.lanes:
        sender = plan.nodes[lane.sender]
        where = _Where(lane)
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
        elif sender.kind is NodeKind.STAGE:
            if lane.holder != sender.memory or (lane.sender, lane.holder) not in landed:
                out.append(f"{where}: stage holds nothing")
        else:
            pair = (lane.receiver, lane.sender)
            if pair not in carried:
                needed = [u for u in units if not plan.nodes[lane.receiver].has(u)]
                carried[pair] = (
                    any(sender.has(u) for u in needed),
                    any(not sender.has(u) for u in needed),
                )
            had, lacked = carried[pair]
            chain = chains.get((lane.sender, lane.holder, lane.rank), _NO_CHAINS)
            out += _check_forwarded(sender, lane, chain, where, had=had, lacked=lacked)
    return out


def _covered(chains: tuple[list[float], list[float]], lo: float) -> float:
    """How far from ``lo`` the arrived stripes reach (:func:`_check_forwarded`)."""
    starts, ends = chains
    run = bisect.bisect_right(starts, lo + _COORD) - 1
    return max(lo, ends[run]) if run >= 0 else lo


class _Where:
    """Names a lane in a sentence, written only when one is."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def __format__(self, spec: str) -> str:
        return f"lane {self.lane.flow} ({self.lane.holder}->{self.lane.dst})"


_NO_CHAINS: tuple[list[float], list[float]] = ([], [])


def _chains(pieces: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """The stripes that arrived at one GPU, of one rank, as runs: sorted by (lo, hi), a stripe
    starting at most ``_COORD`` past the run's end extends it (starts and ends of the runs)."""
    starts: list[float] = []
    ends: list[float] = []
    for lo, hi in sorted(pieces):
        if ends and lo <= ends[-1] + _COORD:
            ends[-1] = max(ends[-1], hi)
        else:
            starts.append(lo)
            ends.append(hi)
    return starts, ends


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


def _check_forwarded(
    sender: PlanNode,
    lane: Lane,
    chains: tuple[list[float], list[float]],
    where: _Where,
    *,
    had: bool,
    lacked: bool,
) -> list[str]:
    """A target forwards only what reached the holder (or the node had before): sweeping the
    stripes of the lane's rank that arrived at the holder from ``lo``, each starting at most
    ``_COORD`` past what is covered extends it, up to ``hi`` (less ``_COORD``). The sweep ends
    in the run (:func:`_chains`) with the last start at most ``lo + _COORD``: runs before it end
    more than ``_COORD`` before its start, runs after it start more than ``_COORD`` past its end
    (``had`` / ``lacked``: whether the sender had some / lacked some unit the lane carries)."""
    if lane.holder not in sender.gpus + sender.relays:
        return [f"{where}: {lane.holder} is not a GPU of node {sender.id}"]
    if lacked and _covered(chains, lane.lo) < lane.hi - _COORD:
        return [
            f"{where}: {lane.holder} never receives rank {lane.rank} [{lane.lo:.6f}, {lane.hi:.6f})"
        ]
    if had and lane.holder in sender.relays:
        return [f"{where}: relay {lane.holder} holds no unit the node had before"]
    return []
