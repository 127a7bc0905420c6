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

Staggered (:mod:`~blitzplan.multicast.exact.slice_layout`: which lanes form a group, each
group's phase offset and the groups it shares links with), a lane whose bytes crossed ``d``
lanes sends slice ``k`` in phase ``k + d``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from blitzplan._collector import collector_paused
from blitzplan.errors import InvalidInputError
from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.exact.slice_layout import _atom_cuts, slice_layout
from blitzplan.multicast.exact.slice_timing import SlicedTimes, atoms_of
from blitzplan.multicast.plan_types import ALL_RANKS, Lane
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, freeze, run
from blitzplan.topologies import Edge

__all__ = ["BuildPace", "Late", "deadline_check", "phases_apart", "slice_phases", "sliced_until"]

_APART = 1e-7
"""Relative overlap of two phases' windows taken as float noise."""
_TIMELINE_PRIOR = 1.0
"""Before this run measured a build, a timed slicing's times put in place are predicted at this
share of the time its lanes took to make (:class:`BuildPace`)."""
_REST_PRIOR = 2.0
"""... and its phases checked and its finished plan's tuples made at this share (measured on
timed slicings of 6-29 k lanes on a 2-core x86_64 at load 5-6: 0.57-0.98 and 1.18-1.95; the
0.6 for both that this replaces let a build start that ended after its deadline)."""
_LANES = 4096
"""Lanes walked one by one between two checkpoints of :func:`phases_apart`."""


@dataclass
class BuildPace:
    """How long a slicing's build takes after its lanes are made, as shares of the time they
    took, measured in this run: ``timeline`` (a timed slicing's times put in place) and
    ``rest`` (the phases checked apart and the finished plan's tuples made,
    :func:`~blitzplan.multicast.timeline.assemble.freeze`). The lanes' pace is measured as they
    are made, so the prediction follows the machine's load; the first build measured replaces
    the priors, later ones only raise them."""

    timeline: float = _TIMELINE_PRIOR
    rest: float = _REST_PRIOR
    measured: bool = False

    def update(self, timeline: float | None, rest: float) -> None:
        """One build's shares measured (``timeline`` None: an untimed slicing's)."""
        if not self.measured:
            self.timeline = self.timeline if timeline is None else timeline
            self.rest, self.measured = rest, True
            return
        self.timeline = max(self.timeline, timeline or 0.0)
        self.rest = max(self.rest, rest)


def slice_phases(
    problem: Problem,
    built: Built,
    phases: int,
    *,
    staggered: int = False,
    timed: SlicedTimes | None = None,
) -> Built:
    """``built`` (one phase, no hop waiting for another) with every stripe sent as ``phases``
    slices in turn (module docstring), evaluated under the cost model. ``staggered``: plain (0,
    False) or as :func:`~blitzplan.multicast.exact.slice_layout.slice_layout` lays it out
    (True or ``BY_LANE``: a lane whose bytes crossed ``d`` lanes before it sends slice ``k``
    in phase ``k + d``; ``BY_SENDER``: ``d`` its sender's distance from the holders), so on a
    shared link a shallow lane's slice ``k`` streams with a deep lane's slice ``k - d``
    instead of waiting for its ``k - 1``. ``timed``: this slicing's times from its pattern
    (:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`, the same rates, arrivals,
    starts and feeders), put in place of evaluating the plan lane by lane."""
    if isinstance(phases, bool) or not isinstance(phases, int) or phases < 1:
        raise InvalidInputError(f"phases must be a positive integer, got {phases!r}")
    old = built.builder
    if any(p != 0 for p in old.flow_phase) or any(spec[4] for spec in old.hop_specs):
        raise InvalidInputError("slice_phases takes a plan of one phase whose hops wait for none")
    with collector_paused():
        new, slot = _lanes(problem, built, phases, staggered, None)
        return _evaluated(problem, built, new, slot, timed, None)


def sliced_until(
    problem: Problem,
    built: Built,
    phases: int,
    staggered: int,
    timed: SlicedTimes | None,
    deadline: float | None,
    pace: BuildPace | None = None,
) -> Built | None:
    """:func:`slice_phases` of a plan it takes, its phases checked apart
    (:func:`phases_apart`) and its finished plan's tuples made (``Built.frozen``), or None
    where its phases meet or as soon as the build would not end by ``deadline`` (a
    :func:`time.perf_counter` value; None: no clock) at ``pace`` (this run's, updated with
    what this build measures; None: the priors): a timed slicing's lanes, once an eighth of
    them are made, at their pace so far and the parts after them at ``pace``'s shares of the
    lanes' time; an untimed slicing's lanes (evaluated lane by lane, at a pace not known
    before) until the deadline; either's evaluation until ``pace``'s rest would no longer
    fit, and the phases' check and the tuples until the deadline, each checked at a fine
    grain (:func:`deadline_check`): a load that rises mid-build stops it there, not after
    (case 115's 256 slices, untimed, searched its lanes' feeders for 1.2 s unloaded before
    its first checkpoint: a few times that under load). The collector stays paused from the
    lanes to the tuples: resumed between them, its first pass walked every object of the
    build (0.7 s of wall at load 8)."""
    pace = BuildPace() if pace is None else pace
    began = time.perf_counter()
    try:
        with collector_paused():
            share = None if timed is None else pace.timeline + pace.rest
            new, slot = _lanes(problem, built, phases, staggered, deadline, share)
            lanes_at = time.perf_counter()
            rest = pace.rest * (lanes_at - began)  # what follows the evaluation
            sliced = _evaluated(problem, built, new, slot, timed, deadline, rest)
            evaluated_at = time.perf_counter()
            if deadline is not None and evaluated_at + rest > deadline:
                return None
            check = None if deadline is None else deadline_check(deadline)
            if not phases_apart(problem, sliced, check):
                return None
            frozen = replace(sliced, frozen=freeze(sliced, check))
    except Late:
        return None
    lanes_s = max(lanes_at - began, 1e-9)
    timeline = None if timed is None else (evaluated_at - lanes_at) / lanes_s
    pace.update(timeline, (time.perf_counter() - evaluated_at) / lanes_s)
    return frozen


def _lanes(
    problem: Problem,
    built: Built,
    phases: int,
    staggered: int,
    deadline: float | None,
    share: float | None = None,
) -> tuple[PlanBuilder, np.ndarray]:
    """The slicing's lanes made, and per ``[slice, lane of the pattern]`` its lane id
    (:class:`Late` as soon as ``deadline`` is missed: past it; with ``share``, the time after
    the lanes as a share of theirs, once an eighth of them are made, at their pace so far).
    Run with the collector paused: tens of thousands of lanes, flows and lists, none in a
    cycle, whose collections took half of the build (68 k lanes: 1.3-1.7 s, 0.6-0.85 s
    without)."""
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
    total = made.size * (1 + (share or 0.0))
    for phase in range(max(offset, default=0) + phases):
        done = len(new.lanes)
        if deadline is not None and (share is None or 8 * done >= made.size):
            now = time.perf_counter()
            projected = began + (now - began) * total / done if share is not None else now
            if now > deadline or projected > deadline:
                raise Late
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
                for lo, hi, share_of in _slices(lane, atoms[lane.flow], k, phases):
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
                        pace_bytes_per_s=pace * share_of,
                    )
    return new, made


def _evaluated(
    problem: Problem,
    built: Built,
    new: PlanBuilder,
    made: np.ndarray,
    timed: SlicedTimes | None,
    deadline: float | None,
    rest: float = 0.0,
) -> Built:
    """The slicing ``new`` of ``built`` evaluated: ``timed``'s times put in place, else lane by
    lane (:class:`Late` once ``rest`` seconds from one of their checkpoints end after
    ``deadline``)."""
    check = None if deadline is None else deadline_check(deadline - rest)
    if timed is None:
        return run(problem, new, built.live, check)
    timeline = timed.timeline(new, made, check)
    new.deps = [list(feeds) for feeds in timeline.lane_feeds]
    ready = {name: max(times, default=0.0) for name, times in timeline.layer_ready_s.items()}
    return Built(new, timeline, ready, built.live)


class Late(Exception):
    """A slicing's build or pattern would not end, or did not end, by its deadline."""


def deadline_check(deadline: float) -> Callable[[str], None]:
    """A build's or a pattern's checkpoint (called per level of lanes, every
    :data:`~blitzplan.multicast.timeline.lane_times.CHECK_EVERY` lanes where they are walked
    one by one, and between the parts of the evaluation, the phases' check and the freezing):
    :class:`Late` past ``deadline``."""

    def check(_: str) -> None:
        if time.perf_counter() > deadline:
            raise Late

    return check


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


def phases_apart(
    problem: Problem, built: Built, check: Callable[[str], None] | None = None
) -> bool:
    """Whether lanes of different phases never stream over one link at once: on each link, a
    phase streams from its lanes' earliest ``end - bytes / rate`` to their latest ``end``, and
    those windows, in order of their starts, do not overlap by more than a tenth of the
    validator's tolerance (the rule it checks, float noise of back-to-back slices aside). The
    lanes of one route and phase are one window first (their links are the route's), then
    each route's windows are spread over its links, as arrays. ``check`` (a deadline's
    checkpoint) is called with ``apart`` between those steps."""
    with collector_paused():
        return _apart(problem, built, check or _unchecked)


def _unchecked(_: str) -> None:
    """No checkpoint."""


def _apart(problem: Problem, built: Built, check: Callable[[str], None]) -> bool:
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
    size = np.empty(len(b.lanes))
    for at in range(0, len(b.lanes), _LANES):
        check("apart")
        size[at : at + _LANES] = [
            (lane.hi - lane.lo) * (tp if lane.rank == ALL_RANKS else 1) * carried[lane.receiver]
            for lane in b.lanes[at : at + _LANES]
        ]
    check("apart")
    ends = t.lane_arrival_s.max(axis=1) if len(shard) else np.zeros(len(b.lanes))
    begins = ends - size / rates
    routes: dict[int, int] = {}  # id of a flow's edges -> its route
    links: list[tuple[Edge, ...]] = []
    route = np.empty(len(b.lanes), dtype=np.intp)
    for f, flow in enumerate(b.flows):
        if f % _LANES == 0:
            check("apart")
        r = routes.setdefault(id(flow.edges), len(routes))
        if r == len(links):
            links.append(tuple(flow.edges))
        route[f] = r
    check("apart")
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
    check("apart")
    rows = [(e, i) for i, k in enumerate(key.tolist()) for e in per_route[k // span]]
    if not rows:
        return True
    check("apart")
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
