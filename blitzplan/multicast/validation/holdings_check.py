"""The holdings part of the multicast certificate: every lane's holder holds what it sends.

Written apart from the planners: a source instance's GPU holds the stripes of its own TP rank
(the split coordinates of the target rank's stripe lie in the source rank's), and, for an
instance of another TP degree, every byte ``[round(lo * B), round(hi * B))`` of every carried
unit, which :meth:`~blitzplan.models.layout.Layout.reshard` checks byte by byte in the model's
layout; host memory holds everything; a target node forwards only what arrived at the holder
earlier in the plan (or the node had before: then from an instance GPU, never a relay).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from fractions import Fraction

import numpy as np

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.models import ModelSpec, layout
from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind
from blitzplan.multicast.validation.lane_table import LaneTable, lane_table, same_rows

__all__ = ["check_holdings"]

_COORD = 1e-9


def check_holdings(
    state: ClusterState, plan: MulticastPlan, table: LaneTable | None = None
) -> list[str]:
    """Every lane whose holder does not hold what it sends, as sentences (module docstring);
    ``table``: the plan's lanes as columns, when the caller has them."""
    table = lane_table(plan) if table is None else table
    return _from_rule(plan, table) + _check_resharded_bytes(state, plan, table)


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


def _from_rule(plan: MulticastPlan, table: LaneTable) -> list[str]:
    """The rule per lane, judged for every lane of one sender, holder and rank at once (the
    sentences in the order of ``plan.lanes``)."""
    said: list[tuple[int, str]] = []  # (place in plan.lanes, sentence)
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    names = table.names
    width = len(names)
    into: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    lo_list, hi_list = table.lo.tolist(), table.hi.tolist()
    gpu = table.receiver * width + table.dst  # a GPU (or memory) of a node
    for k, r, a, b in zip(gpu.tolist(), table.rank.tolist(), lo_list, hi_list, strict=True):
        into[(k, r)].append((a, b))
    landed = set(gpu.tolist())
    chains = {key: _chains(pieces) for key, pieces in into.items()}
    units = range(len(plan.unit_bytes))
    carried: dict[tuple[int, int], tuple[bool, bool]] = {}  # whether the sender had / lacked
    for lanes in same_rows(table.sender, table.holder, table.rank):
        f = int(lanes[0])
        lane = table.lanes[f]
        sender = plan.nodes[lane.sender]
        lo, hi = table.lo[lanes], table.hi[lanes]
        bad: np.ndarray
        if sender.kind is NodeKind.INSTANCE:
            if lane.holder not in sender.gpus:
                said += _each(table, lanes, f"{lane.holder} is not a GPU of {sender.label}")
                continue
            if lane.rank == ALL_RANKS:
                bad = np.ones(len(lanes), bool)
            else:
                q = sender.gpus.index(lane.holder)
                bad = ~_held_by_ranks(q, sender.tp, lane.rank, tp, lo, hi)
            for i in np.flatnonzero(bad).tolist():
                one = table.lanes[lanes[i]]
                said.append(
                    (
                        int(table.at[lanes[i]]),
                        f"{_Where(one)}: {one.holder} does not hold rank {one.rank} "
                        f"[{one.lo:.6f}, {one.hi:.6f})",
                    )
                )
        elif sender.kind in (NodeKind.HOST, NodeKind.CACHE):
            if lane.holder != sender.memory:
                said += _each(table, lanes, f"{lane.holder} is not the memory of {sender.label}")
        elif sender.kind is NodeKind.STAGE:
            if lane.holder != sender.memory or (
                lane.sender * width + names.index(lane.holder) not in landed
            ):
                said += _each(table, lanes, "stage holds nothing")
        else:
            if lane.holder not in sender.gpus + sender.relays:
                said += _each(table, lanes, f"{lane.holder} is not a GPU of node {sender.id}")
                continue
            pairs = np.unique(table.receiver[lanes])
            lacks = np.zeros(len(lanes), bool)
            has = np.zeros(len(lanes), bool)
            for receiver in pairs.tolist():
                pair = (receiver, lane.sender)
                if pair not in carried:
                    needed = [u for u in units if not plan.nodes[receiver].has(u)]
                    carried[pair] = (
                        any(sender.has(u) for u in needed),
                        any(not sender.has(u) for u in needed),
                    )
                mine = table.receiver[lanes] == receiver
                has[mine], lacks[mine] = carried[pair]
            key = (lane.sender * width + names.index(lane.holder), lane.rank)
            covered = _covered(chains.get(key, _NO_CHAINS), lo)
            short = lacks & (covered < hi - _COORD)
            relay = ~short & has & (lane.holder in sender.relays)
            for i in np.flatnonzero(short | relay).tolist():
                one = table.lanes[lanes[i]]
                where = _Where(one)
                said.append(
                    (
                        int(table.at[lanes[i]]),
                        f"{where}: {one.holder} never receives rank {one.rank} "
                        f"[{one.lo:.6f}, {one.hi:.6f})"
                        if short[i]
                        else f"{where}: relay {one.holder} holds no unit the node had before",
                    )
                )
    said.sort(key=lambda x: x[0])
    return [sentence for _, sentence in said]


def _each(table: LaneTable, lanes: np.ndarray, what: str) -> list[tuple[int, str]]:
    """``what`` said of every lane of ``lanes``, each with its place in ``plan.lanes``."""
    return [(int(table.at[f]), f"{_Where(table.lanes[f])}: {what}") for f in lanes.tolist()]


def _held_by_ranks(q: int, a: int, r: int, b: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """:func:`_held_by_rank` of every stripe ``[lo[i], hi[i])`` (the fractions read only on a
    tie with a limit's nearest float)."""
    (_, low_f), (_, high_f) = _rank_limits(q, a, r, b)
    ok: np.ndarray = ((lo > low_f) | (lo == low_f)) & ((hi < high_f) | (hi == high_f))
    for i in np.flatnonzero(ok & ((lo == low_f) | (hi == high_f))).tolist():
        ok[i] = _held_by_rank(q, a, r, b, float(lo[i]), float(hi[i]))
    return ok


def _covered(chains: tuple[list[float], list[float]], lo: np.ndarray) -> np.ndarray:
    """How far from each ``lo`` the arrived stripes reach: to the end of the run with the last
    start at most ``lo + _COORD`` (runs before it end more than ``_COORD`` before its start),
    when that is past ``lo``. A target forwards only what reached the holder (or the node had
    before): sweeping the stripes of the lane's rank that arrived at the holder from ``lo``,
    each starting at most ``_COORD`` past what is covered extends it, up to ``hi`` (less
    ``_COORD``); the sweep ends in that run (:func:`_chains`)."""
    starts, ends = chains
    run = np.searchsorted(np.asarray(starts, float), lo + _COORD, side="right") - 1
    reach = np.asarray(ends, float)[np.maximum(run, 0)] if ends else lo
    return np.where((run >= 0) & (reach > lo), reach, lo)


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


def _check_resharded_bytes(state: ClusterState, plan: MulticastPlan, table: LaneTable) -> list[str]:
    """A lane from an instance of another TP degree sends, of every unit it carries, bytes
    ``[round(lo * B), round(hi * B))`` of its rank buffer: its holder's own buffer must contain
    each of them (:meth:`~blitzplan.models.layout.Layout.reshard`, byte by byte)."""
    tp = next((n.tp for n in plan.nodes if n.kind is NodeKind.TARGET), 1)
    specs = {inst.id: inst.model for inst in state.instances}
    out: list[str] = []
    seen: dict[tuple[object, ...], str] = {}
    other = np.array([n.kind is NodeKind.INSTANCE and n.tp != tp for n in plan.nodes], bool)
    lanes = np.flatnonzero(other.reshape(len(plan.nodes))[table.sender])
    for f in lanes[np.argsort(table.at[lanes])].tolist():  # in the order of plan.lanes
        lane = table.lanes[f]
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
