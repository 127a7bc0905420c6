"""The timeline of a built plan, lane by lane.

Every lane streams its stripe of each unit it carries in unit order. For lane ``f`` carrying
``b_f(u)`` bytes of unit ``u`` at rate ``r_f`` (max-min fair on what background flows leave, at
most the lane's pace) over a path of latency ``lat_f``::

    tau_f(u) = b_f(u) / r_f                       # the stripe of the unit streaming over the lane
    c_f(u)   = min(chunk, b_f(u)) / r_f           # its last chunk, sent on after it arrives
    t_f(-1)  = start_f
    t_f(u)   = max(avail_f(u) + c_f(u) + lat_f, t_f(u-1) + tau_f(u))

``avail_f(u)`` is 0 when the sender is a source (for a source still loading under an earlier
plan, when that plan delivers unit ``u`` to it: its node's ``ready_s``), else the latest arrival
of unit ``u`` over the lanes that brought the lane's stripe to its holder (the sender's
completion of every unit for a store-and-forward hop). ``start_f`` is the latest of the holder's
first chunk of the stripe (a loading source: its first carried unit's arrival), the receiver's
``startup_s`` and the end of every hop the lane's hop waits for. Units the receiver
already has take no time and read 0. A GPU has unit ``u`` when every lane into it that carries
``u`` has delivered it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.plan_types import ALL_RANKS, Hop, Lane, NewInstance, PlanNode
from blitzplan.multicast.setup.holdings import TOLERANCE, overlap
from blitzplan.multicast.timeline.readiness import hop_arrival, instance_ready

__all__ = [
    "Timeline",
    "held_from",
    "lane_dependencies",
    "lane_levels",
    "lane_scan",
    "need_matrix",
    "run_lanes",
    "startup_by_node",
]

_SOURCE_KINDS = ("instance", "host", "cache")
CHECK_EVERY = 256
"""A deadline's checkpoint is called at least every this many lanes where a step walks them one
by one (:func:`lane_dependencies`; lanes into one GPU of a plan in time slices, searched for
the stripes they overlap, took up to 0.1 ms each)."""
_Arrived = tuple[list[Lane], list[float], float]
"""Lanes into one ``(node, GPU)`` sorted by ``lo``, their ``lo`` values and their widest stripe."""
_NONE: _Arrived = ([], [], 0.0)


@dataclass(frozen=True)
class Timeline:
    """Rates and times of a built plan."""

    rates: tuple[float, ...]
    lane_arrival_s: np.ndarray
    """lanes x units: arrival of each carried unit, 0 where the lane carries nothing."""
    hop_arrival_s: tuple[tuple[float, ...], ...]
    layer_ready_s: dict[str, tuple[float, ...]]
    lane_start_s: np.ndarray | None = None
    """Per lane: when it may send its first byte (``start_f`` of the module docstring)."""
    lane_feeds: tuple[tuple[int, ...], ...] = ()
    """Per lane: the lanes whose arrivals it waits for."""
    timed_arrival_s: np.ndarray | None = None
    """The distinct rows of ``lane_arrival_s``: those of the lanes timed (lanes timed alike
    share one)."""
    lane_row: np.ndarray | None = None
    """Per lane: its row of ``timed_arrival_s``."""


def lane_dependencies(
    lanes: Sequence[Lane],
    nodes: Sequence[PlanNode],
    hops: Sequence[Hop],
    known: Sequence[list[int] | None] = (),
    check: Callable[[str], None] | None = None,
) -> list[list[int]]:
    """For each lane, the lanes whose arrivals it waits for (see the module docstring); entries
    of ``known`` that are not None are taken as given (the lists themselves: read only).
    ``check`` (a deadline's checkpoint) is called with ``timing`` every :data:`CHECK_EVERY`
    lanes (a plan in 128 time slices: 0.7 s for 11 k lanes)."""
    waiting = {lane.flow for hop in hops if not hop.pipelined for lane in hop.lanes}
    sources = {node.id for node in nodes if node.kind in _SOURCE_KINDS}
    arrivals: list[tuple[dict[tuple[int, str], _Arrived], dict[int, list[int]]]] = []
    deps: list[list[int]] = []
    given_count = len(known)
    for i, lane in enumerate(lanes):
        flow = lane.flow
        if check is not None and i % CHECK_EVERY == 0:
            check("timing")
        if lane.sender in sources:
            deps.append([])
            continue
        given = known[flow] if flow < given_count else None
        if given is not None and flow not in waiting:
            deps.append(given)
            continue
        if not arrivals:  # what lands where, gathered once when first needed
            arrivals.append(_arrivals(lanes))
        into, into_node = arrivals[0]
        if flow in waiting:
            deps.append(list(into_node.get(lane.sender, [])))
        else:
            deps.append(_feeding(into.get((lane.sender, lane.holder), _NONE), lane))
    return deps


def _arrivals(
    lanes: Sequence[Lane],
) -> tuple[dict[tuple[int, str], _Arrived], dict[int, list[int]]]:
    """The lanes into each ``(node, GPU)`` (by ``lo``), and the lane ids into each node."""
    grouped: dict[tuple[int, str], list[Lane]] = {}
    into_node: dict[int, list[int]] = {}
    for lane in lanes:
        grouped.setdefault((lane.receiver, lane.dst), []).append(lane)
        into_node.setdefault(lane.receiver, []).append(lane.flow)
    into = {}
    for key, arrived in grouped.items():
        arrived.sort(key=lambda x: x.lo)
        widest = max(x.hi - x.lo for x in arrived)
        into[key] = (arrived, [x.lo for x in arrived], widest)
    return into, into_node


def _feeding(arrived: _Arrived, lane: Lane) -> list[int]:
    """Lanes among ``arrived`` carrying some of ``lane``'s stripe. Those starting at least the
    widest stripe (and the tolerance) before ``lane.lo`` end before it: skipped by bisection
    (a plan in time slices has many thin lanes into one GPU)."""
    lanes, los, widest = arrived
    out = []
    first = bisect.bisect_right(los, lane.lo - widest - TOLERANCE)
    for other in itertools.islice(lanes, first, None):
        if other.lo >= lane.hi:
            break
        if (
            other.flow != lane.flow
            and (ALL_RANKS in (other.rank, lane.rank) or other.rank == lane.rank)
            and overlap((other.lo, other.hi), (lane.lo, lane.hi)) is not None
        ):
            out.append(other.flow)
    return out


def run_lanes(
    lanes: Sequence[Lane],
    nodes: Sequence[PlanNode],
    hops: Sequence[Hop],
    instances: Sequence[NewInstance],
    rates: Sequence[float],
    latency_s: Sequence[float],
    unit_bytes: Sequence[int],
    chunk_bytes: int,
    *,
    tp: int = 1,
    known: Sequence[list[int] | None] = (),
    check: Callable[[str], None] | None = None,
) -> Timeline:
    """The recurrence of the module docstring for every lane, then per-instance readiness.

    Lanes timed alike (:func:`_alike`: the gathers of one landed stripe, for one) run the
    recurrence once, on the first of them; the others take its times. The rest are evaluated
    level by level (a lane's level is one more than the deepest lane it waits for), every level
    at once with numpy. A hop that other hops wait for is a node of its own between its lanes
    and theirs (it ends with its last lane), so a wait costs one edge, not one per lane.
    ``check`` (a deadline's checkpoint) is called with ``timing`` as the lanes' dependencies
    are found (:func:`lane_dependencies`), once the lanes timed alike are known and once what
    each holds is, and with ``timeline`` before each level and before the hops' arrivals and
    the instances' readiness (each stage's checkpoints one after the other, as a caller's
    stages see them)."""
    units = len(unit_bytes)
    deps = lane_dependencies(lanes, nodes, hops, known, check)
    hop_of = [-1] * len(lanes)
    saf = np.zeros(len(lanes), dtype=bool)
    for h, hop in enumerate(hops):
        for lane in hop.lanes:
            hop_of[lane.flow] = h
            saf[lane.flow] = not hop.pipelined
    same = _alike(lanes, deps, hop_of, rates, latency_s)
    if check is not None:
        check("timing")
    firsts = sorted(set(same))  # the lanes timed; row k of the arrays below is firsts[k]
    row = {f: k for k, f in enumerate(firsts)}
    timed = [lanes[f] for f in firsts]
    timed_deps = [[row[same[d]] for d in deps[f]] for f in firsts]
    # a hop waited for is a node of its own after the timed lanes: it ends with its last lane
    waited = sorted({k for hop in hops for k in hop.after})
    node_of = {h: len(timed) + i for i, h in enumerate(waited)}
    hop_rows = [sorted({row[same[x.flow]] for x in hops[h].lanes}) for h in waited]
    timed_after = [
        [node_of[k] for k in hops[hop_of[f]].after] if hop_of[f] >= 0 else [] for f in firsts
    ]
    need = need_matrix(timed, nodes, unit_bytes, tp)
    held, held_first = held_from(timed, nodes, need)
    if check is not None:
        check("timing")
    startup = startup_by_node(instances)
    begin = np.array([startup.get(lane.receiver, 0.0) for lane in timed])
    take = np.asarray(firsts, dtype=np.intp)
    saf = saf[take]
    rate = np.asarray(rates, dtype=float)[take]
    latency = np.asarray(latency_s, dtype=float)[take]
    arrival = np.zeros((len(timed), units))
    first = np.zeros(len(timed))
    end = np.zeros(len(timed))
    hop_end = np.zeros(len(waited))
    starts = np.zeros(len(timed))
    for level in _levels(timed_deps + hop_rows, timed_after + [[] for _ in waited]):
        if check is not None:
            check("timeline")
        cut = bisect.bisect_left(level, len(timed))  # the level's lanes, then its hops
        for node in level[cut:]:
            rows_of = hop_rows[node - len(timed)]
            hop_end[node - len(timed)] = end[rows_of].max() if rows_of else 0.0
        level = level[:cut]
        if not level:
            continue
        avail, first_in, done_in = _gathered(level, timed_deps, arrival, first, end)
        after_end = np.zeros(len(level))
        if any(timed_after[f] for f in level):
            after_end = np.array(
                [max((hop_end[x - len(timed)] for x in timed_after[f]), default=0.0) for f in level]
            )
        idx = np.asarray(level)
        sf = saf[idx]
        avail = np.maximum(np.where(sf[:, None], done_in[:, None], avail), held[idx])
        start = np.maximum.reduce(
            [begin[idx], np.where(sf, done_in, first_in), after_end, held_first[idx]]
        )
        starts[idx] = start
        times, first[idx] = lane_scan(need[idx], avail, rate[idx], latency[idx], chunk_bytes, start)
        arrival[idx] = times
        end[idx] = times.max(axis=1) if units else start
    if check is not None:
        check("timeline")
    rows = np.fromiter((row[f] for f in same), dtype=np.intp, count=len(same))
    every = arrival[rows]
    feeds = {f: tuple(deps[f]) for f in firsts}  # lanes timed alike wait for the same lanes
    by_hop = hop_arrival(hops, every)
    if check is not None:
        check("timeline")
    return Timeline(
        tuple(rates),
        every,
        by_hop,
        instance_ready(lanes, nodes, instances, every),
        starts[rows],
        tuple(map(feeds.__getitem__, same)),
        arrival,
        rows,
    )


def _alike(
    lanes: Sequence[Lane],
    deps: Sequence[Sequence[int]],
    hop_of: Sequence[int],
    rates: Sequence[float],
    latency_s: Sequence[float],
) -> list[int]:
    """Per lane, the first lane timed exactly like it: the same sender, receiver, stripe,
    rank, hop, rate, latency and lanes it waits for give the recurrence the same inputs, so
    the same times (the gathers of one landed stripe to the other GPUs of its node)."""
    first: dict[tuple[object, ...], int] = {}
    out = []
    for lane, d, h, r, lat in zip(lanes, deps, hop_of, rates, latency_s, strict=True):
        key = (lane.sender, lane.receiver, lane.lo, lane.hi, lane.rank, h, r, lat, *d)
        out.append(first.setdefault(key, lane.flow))
    return out


def startup_by_node(instances: Sequence[NewInstance]) -> dict[int, float]:
    startup: dict[int, float] = {}
    for inst in instances:
        startup[inst.node] = max(startup.get(inst.node, 0.0), inst.startup_s)
    return startup


def _levels(deps: Sequence[Sequence[int]], after: Sequence[Sequence[int]]) -> list[list[int]]:
    """Lanes by level over what each waits for (its ``deps`` and ``after``); raises on a cycle."""
    needed = [set(d).union(a) if a or len(d) > 1 else d for d, a in zip(deps, after, strict=True)]
    grouped = lane_levels(needed)
    if grouped is None:
        raise InvalidInputError("the plan's lanes wait for each other in a cycle")
    return grouped


def lane_levels(needed: Sequence[Collection[int]]) -> list[list[int]] | None:
    """Lanes by level, each in lane order: a lane's level is one more than the deepest lane it
    waits for (``needed[lane]``; 0: it waits for none); None on a cycle."""
    count = [len(n) for n in needed]
    users: dict[int, list[int]] = {}
    for lane, wanted in enumerate(needed):
        for other in wanted:
            users.setdefault(other, []).append(lane)
    level = [lane for lane, c in enumerate(count) if c == 0]
    grouped: list[list[int]] = []
    while level:
        grouped.append(level)
        released = []
        for lane in level:
            for user in users.get(lane, ()):
                count[user] -= 1
                if count[user] == 0:
                    released.append(user)
        level = sorted(released)
    return grouped if sum(len(g) for g in grouped) == len(needed) else None


def need_matrix(
    lanes: Sequence[Lane], nodes: Sequence[PlanNode], unit_bytes: Sequence[int], tp: int
) -> np.ndarray:
    """Bytes of each unit each lane carries (0 for units its receiver already has)."""
    shard = np.asarray(unit_bytes, dtype=float)
    scale = np.array(
        [(lane.hi - lane.lo) * (tp if lane.rank == ALL_RANKS else 1) for lane in lanes]
    )
    need: np.ndarray = np.outer(scale, shard) if len(lanes) else np.zeros((0, len(shard)))
    into: dict[int, list[int]] = {}  # lanes into each receiver that has units from before
    for f, lane in enumerate(lanes):
        if nodes[lane.receiver].present:
            into.setdefault(lane.receiver, []).append(f)
    for receiver, rows in into.items():
        has = np.asarray(nodes[receiver].present, dtype=bool)
        need[np.ix_(np.asarray(rows), has)] = 0.0
    return need


def held_from(
    lanes: Sequence[Lane], nodes: Sequence[PlanNode], need: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per lane: when its sender holds each unit (a loading source's ``ready_s``, else 0), and
    when it holds the first unit the lane carries."""
    held = np.zeros(need.shape)
    first = np.zeros(len(lanes))
    for f, lane in enumerate(lanes):
        ready = nodes[lane.sender].ready_s
        if ready:
            held[f] = ready
            carried = need[f] > 0
            first[f] = held[f][carried].min() if carried.any() else 0.0
    return held, first


def _gathered(
    level: Sequence[int],
    deps: Sequence[Sequence[int]],
    arrival: np.ndarray,
    first: np.ndarray,
    end: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per lane of a level: latest arrival per unit over the lanes it waits for, their latest
    first chunk, and their latest end (all 0 for lanes fed by a source)."""
    m, units = len(level), arrival.shape[1]
    avail = np.zeros((m, units))
    first_in = np.zeros(m)
    done_in = np.zeros(m)
    fed = [k for k, f in enumerate(level) if deps[f]]
    if fed:
        flat = np.fromiter((d for k in fed for d in deps[level[k]]), dtype=np.intp)
        starts = np.cumsum([0] + [len(deps[level[k]]) for k in fed[:-1]])
        rows = np.asarray(fed)
        avail[rows] = np.maximum.reduceat(arrival[flat], starts, axis=0)
        first_in[rows] = np.maximum.reduceat(first[flat], starts)
        done_in[rows] = np.maximum.reduceat(end[flat], starts)
    return avail, first_in, done_in


def lane_scan(
    need: np.ndarray,
    avail: np.ndarray,
    rate: np.ndarray,
    latency: np.ndarray,
    chunk: int,
    start: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The recurrence for a batch of lanes (a max-plus scan over the units each carries)."""
    carried = need > 0
    blocked = rate <= 0
    inverse = (1.0 / np.where(blocked, 1.0, rate))[:, None]
    tau = np.where(carried, need * inverse, 0.0)
    c = np.where(carried, np.minimum(need, chunk) * inverse, 0.0)
    prefix = np.cumsum(tau, axis=1)
    lead = np.where(carried, avail + c + latency[:, None] - prefix, -np.inf)
    times = prefix + np.maximum(start[:, None], np.maximum.accumulate(lead, axis=1))
    times = np.where(carried, np.where(blocked[:, None], np.inf, times), 0.0)
    lead_chunk = c[np.arange(len(need)), np.argmax(carried, axis=1)]
    first = np.where(blocked, np.inf, start + lead_chunk + latency)
    return times, first
