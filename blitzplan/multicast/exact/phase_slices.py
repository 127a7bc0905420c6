"""A one-phase plan cut into time slices: every stripe sent as ``phases`` thinner stripes, one
after the other, each slice its own phase.

Under the cost model a lane forwards unit ``u`` ``min(chunk, its stripe of u) / rate`` after its
holder got it (:mod:`~blitzplan.multicast.timeline.lane_times`). A stripe cut into ``m`` slices
sent in turn at the same rate pays ``1 / m`` of that per hop once the slices are thinner than a
chunk, so a chain's per-hop cost falls towards its latency as ``m`` grows: the cost model has no
per-hop term that every plan must pay (see :mod:`~blitzplan.multicast.bound.lower_bound`).

How: the stripe boundaries of all lanes (per rank; those of all-rank lanes in every rank) cut
``[0, 1)`` into atoms, and each lane's atoms are cut into ``phases`` equal parts; slice ``k`` holds
part ``k`` of every atom, so a lane's slice is fed exactly by its feeders' slice ``k``. A lane
becomes one lane per atom per slice, paced at its share of the lane's pace. A node's gathers
(NVLink copies inside it, which cannot wait for a hop) become a hop of the node to itself. Slice
``k`` of a hop starts once slice ``k - 1`` of every hop sharing a link with it has ended, so on
every link the phases stream one after the other (:func:`phases_apart` checks it again).

Staggered, a lane whose bytes crossed ``d`` lanes before it (its longest chain of feeders; a
gather counted as a lane) sends slice ``k`` in phase ``k + d`` and waits, on every link it
shares, for the latest slice of an earlier phase: a shallow lane sharing a link with a deep one
no longer waits for the deep one's previous slice (which waits for its feeders' data), it
streams beside the deep one's slice ``k - d``. A hop whose lanes carry bytes of different
depths (a node fed both by a holder and by a relay) is cut into one group per depth, each in
its own phases (a hop's depth by its node's distance from the holders made the relay's part
wait a slice per hop it lacks: case 193 of the benchmark, 2.1x its plan in one phase); the
groups of one hop wait for the same hops, since they make one hop per phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.exact.slice_timing import SNAP, SlicedTimes, atoms_of
from blitzplan.multicast.plan_types import ALL_RANKS, Lane
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, run
from blitzplan.topologies import Edge

__all__ = [
    "BY_LANE",
    "BY_SENDER",
    "SNAP",
    "phases_apart",
    "slice_layout",
    "slice_phases",
    "sliced_until",
    "staggering",
]

_APART = 1e-7
"""Relative overlap of two phases' windows taken as float noise."""
_TAIL = 0.6
"""A timed slicing's timeline and phases check take about this share of the time its lanes
take to make (0.5 measured on a 68 k-lane slicing)."""


def slice_phases(
    problem: Problem,
    built: Built,
    phases: int,
    *,
    staggered: int = False,
    timed: SlicedTimes | None = None,
) -> Built:
    """``built`` (one phase, no hop waiting for another) with every stripe sent as ``phases``
    slices in turn (module docstring), evaluated under the cost model. ``staggered`` (True or
    :data:`BY_LANE`): a lane whose bytes crossed ``d`` lanes before it sends slice ``k`` in
    phase ``k + d`` (:data:`BY_SENDER`: ``d`` its sender's distance from the holders;
    :func:`slice_layout`), so on a shared link a shallow lane's slice ``k`` streams with a
    deep lane's slice ``k - d`` instead of waiting for its ``k - 1``.
    ``timed``: this slicing's times from its pattern
    (:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`, the same rates, arrivals,
    starts and feeders), put in place of evaluating the plan lane by lane."""
    if isinstance(phases, bool) or not isinstance(phases, int) or phases < 1:
        raise InvalidInputError(f"phases must be a positive integer, got {phases!r}")
    old = built.builder
    if any(p != 0 for p in old.flow_phase) or any(spec[4] for spec in old.hop_specs):
        raise InvalidInputError("slice_phases takes a plan of one phase whose hops wait for none")
    with collector_paused():
        return _sliced(problem, built, phases, staggered, timed, None)


def sliced_until(
    problem: Problem,
    built: Built,
    phases: int,
    staggered: int,
    timed: SlicedTimes | None,
    deadline: float | None,
) -> Built | None:
    """:func:`slice_phases` of a plan it takes, or None as soon as the build, at the pace of
    its lanes so far (once an eighth of them are made), would not end by ``deadline`` (a
    :func:`time.perf_counter` value; None: no clock): lanes left, then :data:`_TAIL` times
    the lanes' time for the timeline and the phases check. An untimed slicing (evaluated
    lane by lane, at a pace not known before) stops once its deadline has passed, between
    phases of lanes made or levels of lanes evaluated."""
    try:
        with collector_paused():
            return _sliced(problem, built, phases, staggered, timed, deadline)
    except _Late:
        return None


def _sliced(
    problem: Problem,
    built: Built,
    phases: int,
    staggered: int,
    timed: SlicedTimes | None,
    deadline: float | None,
) -> Built:
    """The slicing built (:class:`_Late` as soon as ``deadline`` is missed). Run with the
    collector paused: tens of thousands of lanes, flows and lists, none in a cycle, whose
    collections took half of the build (68 k lanes: 1.3-1.7 s, 0.6-0.85 s without)."""
    began = time.perf_counter()
    old = built.builder
    new = PlanBuilder(old.topology)
    for node in old.nodes:
        new.add_node(node)
    new.instances.extend(old.instances)
    cuts = _atom_cuts(old.lanes, problem.tp)
    groups, group_of, offset, sharing = slice_layout(built, staggered)
    lanes_of: list[list[Lane]] = [[] for _ in groups]
    atoms = {lane.flow: atoms_of(lane, cuts) for lane in old.lanes}
    for lane in old.lanes:
        lanes_of[group_of[lane.flow]].append(lane)
    ids: dict[tuple[int, int], int] = {}  # (group, phase) -> hop id
    first = [0]  # per group, its first lane of the pattern (one slice's lanes)
    for g in range(len(groups)):
        first.append(first[-1] + sum(len(atoms[lane.flow]) for lane in lanes_of[g]))
    made = np.zeros((phases, first[-1]), dtype=np.intp)  # [slice, lane of the pattern]
    total = made.size * (1 + _TAIL)
    for phase in range(max(offset, default=0) + phases):
        done = len(new.lanes)
        if deadline is not None and (timed is None or 8 * done >= made.size):
            now = time.perf_counter()
            projected = began + (now - began) * total / done if timed is not None else now
            if now > deadline or projected > deadline:
                raise _Late
        for g, (sender, receiver, pipelined) in enumerate(groups):
            k = phase - offset[g]
            if not 0 <= k < phases:
                continue
            after = []
            for j in sharing[g]:  # each sharing hop's latest slice of an earlier phase
                q = min(phase - 1, offset[j] + phases - 1)
                if q >= offset[j]:
                    after.append(ids[j, q])
            hop = new.hop(sender, receiver, phase=phase, pipelined=pipelined, after=after)
            ids[g, phase] = hop
            at = first[g]
            for lane in lanes_of[g]:
                pace = old.flows[lane.flow].max_bytes_per_s
                for lo, hi, share in _slices(lane, atoms[lane.flow], k, phases):
                    made[k, at] = len(new.lanes)
                    at += 1
                    new.add_lane(
                        hop,
                        lane.holder,
                        lane.exit,
                        lane.dst,
                        lane.rank,
                        lo,
                        hi,
                        pace_bytes_per_s=pace * share,
                    )
    if timed is None:
        return run(problem, new, built.live, None if deadline is None else _by(deadline))
    timeline = timed.timeline(new, made)
    new.deps = [list(feeds) for feeds in timeline.lane_feeds]
    ready = {name: max(times, default=0.0) for name, times in timeline.layer_ready_s.items()}
    return Built(new, timeline, ready, built.live)


class _Late(Exception):
    """A slicing's build would not end, or its evaluation did not end, by its deadline."""


def _by(deadline: float) -> Callable[[str], None]:
    """The evaluation's checkpoint (called per level of lanes): :class:`_Late` past
    ``deadline``."""

    def check(_: str) -> None:
        if time.perf_counter() > deadline:
            raise _Late

    return check


def _atom_cuts(lanes: Sequence[Lane], tp: int) -> dict[int, list[float]]:
    """Per rank (and :data:`ALL_RANKS`: every rank's), the sorted atom boundaries."""
    points: dict[int, set[float]] = {r: set() for r in range(tp)}
    for lane in lanes:
        for r in range(tp) if lane.rank == ALL_RANKS else (lane.rank,):
            points.setdefault(r, set()).update((lane.lo, lane.hi))
    out = {r: _snapped(v) for r, v in points.items()}
    out[ALL_RANKS] = _snapped(set().union(*points.values()))
    return out


def _snapped(values: set[float]) -> list[float]:
    out: list[float] = []
    for x in sorted(values):
        if not out or x - out[-1] > SNAP:
            out.append(x)
    return out


def _slices(
    lane: Lane, atoms: list[tuple[float, float]], k: int, phases: int
) -> list[tuple[float, float, float]]:
    """Part ``k`` of each of ``lane``'s ``atoms``: ``(lo, hi, share of the lane)``."""
    width = lane.hi - lane.lo
    out = []
    for a, b in atoms:
        step = (b - a) / phases
        hi = b if k == phases - 1 else a + (k + 1) * step
        out.append((a + k * step, hi, (b - a) / width))
    return out


BY_LANE = 1
"""``staggered`` of :func:`slice_layout`: offsets by the depth of each lane's bytes."""
BY_SENDER = 2
"""... by its sender's distance from the nearest node that receives nothing (one group per
hop): where a node forwards bytes of several depths, the deeper ones' forwards wait for their
feeders (case 193: 1.9x), elsewhere the slicing may end fewer slices after its last
(:func:`staggering` chooses)."""


def slice_layout(
    built: Built, staggered: int
) -> tuple[list[tuple[int, int, bool]], list[int], list[int], list[list[int]]]:
    """How ``built`` is cut: its groups ``(sender, receiver, pipelined)`` (its hops, then one
    hop of each node to itself for its gathers, which cannot wait; such a hop can), each lane's
    group, each group's phase offset and the groups sharing a link with each (itself
    included). Plain (``staggered`` 0 or False): one group per hop, offsets 0.
    :data:`BY_LANE` (or True): one group per hop and depth of its lanes' bytes (the lanes
    before each on its longest chain of feeders, the plan's timeline's), offset by that depth;
    groups of one hop share links with the same groups (the union of theirs), so they wait for
    the same hops (module docstring). :data:`BY_SENDER`: one group per hop, offset by its
    sender's distance from the nearest node that receives nothing."""
    if staggered not in (0, BY_LANE, BY_SENDER):
        raise InvalidInputError(f"staggered must be 0, 1 or 2, got {staggered!r}")
    builder = built.builder
    hops = [(spec[0], spec[1], spec[3]) for spec in builder.hop_specs]
    own: dict[int, int] = {}  # a node's gathers -> their hop of the node to itself
    hop_of = []
    for lane, h in zip(builder.lanes, builder.hop_of_lane, strict=True):
        if h < 0:
            h = own.setdefault(lane.receiver, len(hops))
            if h == len(hops):
                hops.append((lane.receiver, lane.receiver, True))
        hop_of.append(h)
    by_lane = staggered == BY_LANE
    depth = _lane_depths(built.timeline.lane_feeds) if by_lane else [0] * len(hop_of)
    laneless = set(range(len(hops))) - set(hop_of)
    found = sorted(set(zip(hop_of, depth, strict=True)) | {(h, 0) for h in laneless})
    index = {part: g for g, part in enumerate(found)}
    group_of = [index[part] for part in zip(hop_of, depth, strict=True)]
    edges: list[set[Edge]] = [set() for _ in hops]
    for lane, h in zip(builder.lanes, hop_of, strict=True):
        edges[h].update(builder.flows[lane.flow].edges)
    of_hop: list[list[int]] = [[] for _ in hops]
    for g, (h, _) in enumerate(found):
        of_hop[h].append(g)
    meets = [[j for j, other in enumerate(edges) if mine & other] for mine in edges]
    sharing = [[g for j in meets[h] for g in of_hop[j]] for h, _ in found]
    groups = [hops[h] for h, _ in found]
    offsets = _sender_depths(groups) if staggered == BY_SENDER else [d for _, d in found]
    return groups, group_of, offsets, sharing


def staggering(built: Built) -> int:
    """The staggering for ``built``: :data:`BY_SENDER` when no lane of it is in an earlier phase
    than one of its feeders (none then waits for a feeder's later phase, and its deepest offset
    is at most the lanes' deepest), else :data:`BY_LANE` (a node forwarding bytes that reached
    it deeper than its distance from the holders: case 193)."""
    _, group_of, offsets, _ = slice_layout(built, BY_SENDER)
    for f, fed in enumerate(built.timeline.lane_feeds):
        if any(offsets[group_of[f]] < offsets[group_of[d]] for d in fed):
            return BY_LANE
    return BY_SENDER


def _sender_depths(groups: Sequence[tuple[int, int, bool]]) -> list[int]:
    """Per group, the hop count from the nearest node that receives nothing to its sender."""
    into: dict[int, list[int]] = {}
    for sender, receiver, _ in groups:
        if sender != receiver:
            into.setdefault(receiver, []).append(sender)
    nodes = {n for s, r, _ in groups for n in (s, r)}
    depth = {n: 0 for n in nodes if n not in into}
    frontier = list(depth)
    while frontier:
        nxt = []
        for sender, receiver, _ in groups:
            if sender in frontier and receiver not in depth:
                depth[receiver] = depth[sender] + 1
                nxt.append(receiver)
        frontier = nxt
    return [depth.get(sender, 0) for sender, _, _ in groups]


def _lane_depths(feeds: Sequence[Sequence[int]]) -> list[int]:
    """Per lane, how many lanes its bytes crossed before it: 0 from a holder, else one more
    than its deepest feeder's (``feeds``: per lane, the lanes it waits for)."""
    depth = [-1] * len(feeds)
    for start in range(len(feeds)):
        stack = [start]
        while stack:
            f = stack[-1]
            if depth[f] >= 0:
                stack.pop()
                continue
            waiting = [d for d in feeds[f] if depth[d] < 0]
            if waiting:
                depth[f] = -2 if depth[f] == -1 else depth[f]
                if any(depth[d] == -2 for d in waiting):
                    raise InvalidInputError("the plan's lanes feed each other in a cycle")
                stack.extend(waiting)
                continue
            depth[f] = 1 + max((depth[d] for d in feeds[f]), default=-1)
            stack.pop()
    return depth


def phases_apart(problem: Problem, built: Built) -> bool:
    """Whether lanes of different phases never stream over one link at once: on each link, a
    phase streams from its lanes' earliest ``end - bytes / rate`` to their latest ``end``, and
    those windows, in order of their starts, do not overlap by more than a tenth of the
    validator's tolerance (the rule it checks, float noise of back-to-back slices aside). The
    lanes of one route and phase are one window first (their links are the route's), then
    each route's windows are spread over its links, as arrays."""
    with collector_paused():
        return _apart(problem, built)


def _apart(problem: Problem, built: Built) -> bool:
    """:func:`phases_apart`."""
    b, t = built.builder, built.timeline
    if len(set(b.flow_phase)) < 2:
        return True
    rates = np.asarray(t.rates, dtype=float)
    if len(rates) and rates.min() <= 0:
        return False
    shard = problem.unit_bytes
    carried = {}  # per receiver, the bytes of the units it lacks
    for node in b.nodes:
        carried[node.id] = sum(u for i, u in enumerate(shard) if not node.has(i))
    tp = problem.tp
    size = np.array(
        [
            (lane.hi - lane.lo) * (tp if lane.rank == ALL_RANKS else 1) * carried[lane.receiver]
            for lane in b.lanes
        ],
        dtype=float,
    )
    ends = t.lane_arrival_s.max(axis=1) if len(shard) else np.zeros(len(b.lanes))
    begins = ends - size / rates
    routes: dict[int, int] = {}  # id of a flow's edges -> its route
    links: list[tuple[Edge, ...]] = []
    route = np.empty(len(b.lanes), dtype=np.intp)
    for f, flow in enumerate(b.flows):
        r = routes.setdefault(id(flow.edges), len(routes))
        if r == len(links):
            links.append(tuple(flow.edges))
        route[f] = r
    phase = np.asarray(b.flow_phase, dtype=np.intp)
    # one window per route and phase ...
    key, inverse = np.unique(route * (int(phase.max()) + 1) + phase, return_inverse=True)
    lo = np.full(len(key), np.inf)
    hi = np.full(len(key), -np.inf)
    np.minimum.at(lo, inverse, begins)
    np.maximum.at(hi, inverse, ends)
    span = int(phase.max()) + 1
    # ... spread over the route's links, one window per link and phase
    edge_ids: dict[Edge, int] = {}
    per_route = [[edge_ids.setdefault(e, len(edge_ids)) for e in edges] for edges in links]
    rows = [(e, i) for i, k in enumerate(key.tolist()) for e in per_route[k // span]]
    if not rows:
        return True
    edge, window = np.asarray(rows, dtype=np.intp).T
    link_key, link_of = np.unique(edge * span + key[window] % span, return_inverse=True)
    begin = np.full(len(link_key), np.inf)
    end = np.full(len(link_key), -np.inf)
    np.minimum.at(begin, link_of, lo[window])
    np.maximum.at(end, link_of, hi[window])
    link = link_key // span
    order = np.lexsort((end, begin, link))
    link, begin, end = link[order], begin[order], end[order]
    same = link[1:] == link[:-1]
    overlap = begin[1:] < end[:-1] - _APART * np.maximum(1.0, end[:-1])
    return not bool(np.any(same & overlap))
