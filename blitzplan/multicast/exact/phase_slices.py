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

Staggered, a hop ``d`` hops deep sends slice ``k`` in phase ``k + d`` and waits, on every link it
shares, for the latest slice of an earlier phase: a shallow hop sharing a link with a deep one
no longer waits for the deep one's previous slice (which waits for its feeders' data), it
streams beside the deep one's slice ``k - d``.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator, Sequence

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.exact.slice_timing import SNAP, atoms_of, sliced_ready
from blitzplan.multicast.plan_types import ALL_RANKS, Lane
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built, run, score
from blitzplan.topologies import Edge

__all__ = [
    "SLICES",
    "SNAP",
    "STAGGERED_SLICES",
    "phases_apart",
    "slice_phases",
    "sliced_refinement",
]

_APART = 1e-7
"""Relative overlap of two phases' windows taken as float noise."""
SLICES = (4, 8, 16, 32)
"""The slice counts :func:`sliced_refinement` tries, in turn."""
_MARGIN = 1.5
"""A step's predicted time: this many times the slowest per lane and slice so far."""
_FULL_PRIOR_S = 100e-6
"""Before any slicing was built in full, its predicted seconds per lane and slice (about what
it takes on one loaded core of a 2-core x86_64)."""
STAGGERED_SLICES = (64, 128, 256)
"""The staggered slice counts it tries then (a hop ``d`` deep ends ``d`` slices later, so
staggering pays only once slices are thin: 16 and 32, tried before, were rarely the fastest)."""


def slice_phases(
    problem: Problem,
    built: Built,
    phases: int,
    *,
    staggered: bool = False,
    feeders: Sequence[Sequence[int]] | None = None,
) -> Built:
    """``built`` (one phase, no hop waiting for another) with every stripe sent as ``phases``
    slices in turn (module docstring), evaluated under the cost model. ``staggered``: a hop
    whose sender is ``d`` hops from the nearest node that receives nothing sends slice ``k`` in
    phase ``k + d`` (a node's gathers: ``d`` of the node), so on a shared link a shallow hop's
    slice ``k`` streams with a deep hop's slice ``k - d`` instead of waiting for its ``k - 1``.
    ``feeders``: the pattern's feeders of this slicing as
    :func:`~blitzplan.multicast.exact.slice_timing.sliced_ready` found them (each lane of a
    slice is fed by those lanes' same slice), given to the timeline instead of its search of
    every slice's lanes for overlapping stripes."""
    if isinstance(phases, bool) or not isinstance(phases, int) or phases < 1:
        raise InvalidInputError(f"phases must be a positive integer, got {phases!r}")
    old = built.builder
    if any(p != 0 for p in old.flow_phase) or any(spec[4] for spec in old.hop_specs):
        raise InvalidInputError("slice_phases takes a plan of one phase whose hops wait for none")
    new = PlanBuilder(old.topology)
    for node in old.nodes:
        new.add_node(node)
    new.instances.extend(old.instances)
    cuts = _atom_cuts(old.lanes, problem.tp)
    groups, group_of = _groups(old)
    sharing = _sharing(old, len(groups), group_of)
    offset = _depths(groups) if staggered else [0] * len(groups)
    lanes_of: list[list[Lane]] = [[] for _ in groups]
    atoms = {lane.flow: atoms_of(lane, cuts) for lane in old.lanes}
    for lane in old.lanes:
        lanes_of[group_of[lane.flow]].append(lane)
    ids: dict[tuple[int, int], int] = {}  # (group, phase) -> hop id
    first = [0]  # per group, its first lane of the pattern (one slice's lanes)
    for g in range(len(groups)):
        first.append(first[-1] + sum(len(atoms[lane.flow]) for lane in lanes_of[g]))
    made: dict[tuple[int, int], int] = {}  # (slice, lane of the pattern) -> lane id
    for phase in range(max(offset, default=0) + phases):
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
    if feeders is not None:
        for (k, f), flow in made.items():
            new.deps[flow] = [made[k, d] for d in feeders[f]]
    return run(problem, new, built.live)


def _depths(groups: Sequence[tuple[int, int, bool]]) -> list[int]:
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


def _groups(builder: PlanBuilder) -> tuple[list[tuple[int, int, bool]], list[int]]:
    """The plan's hops as ``(sender, receiver, pipelined)``, then one hop of each node to itself
    for its gathers (a gather cannot wait; such a hop can), and each lane's group."""
    groups = [
        (sender, receiver, pipelined) for sender, receiver, _, pipelined, _ in builder.hop_specs
    ]
    own: dict[int, int] = {}
    group_of = []
    for lane, h in zip(builder.lanes, builder.hop_of_lane, strict=True):
        if h < 0:
            h = own.setdefault(lane.receiver, len(groups))
            if h == len(groups):
                groups.append((lane.receiver, lane.receiver, True))
        group_of.append(h)
    return groups, group_of


def _sharing(builder: PlanBuilder, count: int, group_of: Sequence[int]) -> list[list[int]]:
    """Per group, the groups (itself included) whose lanes cross a link its lanes cross."""
    edges: list[set[Edge]] = [set() for _ in range(count)]
    for lane, g in zip(builder.lanes, group_of, strict=True):
        edges[g].update(builder.flows[lane.flow].edges)
    return [[j for j, other in enumerate(edges) if mine & other] for mine in edges]


def phases_apart(problem: Problem, built: Built) -> bool:
    """Whether lanes of different phases never stream over one link at once: on each link, a
    phase streams from its lanes' earliest ``end - bytes / rate`` to their latest ``end``, and
    those windows do not overlap by more than a tenth of the validator's tolerance (the rule it
    checks, float noise of back-to-back slices aside)."""
    b, t = built.builder, built.timeline
    if len(set(b.flow_phase)) < 2:
        return True
    windows: dict[Edge, dict[int, list[float]]] = {}
    shard = problem.unit_bytes
    carried: dict[int, int] = {}  # per receiver, the bytes of the units it lacks
    for node in b.nodes:
        carried[node.id] = sum(u for i, u in enumerate(shard) if not node.has(i))
    ends = t.lane_arrival_s.max(axis=1).tolist() if len(shard) else [0.0] * len(b.lanes)
    for lane in b.lanes:
        f = lane.flow
        size = (
            lane.fraction * (problem.tp if lane.rank == ALL_RANKS else 1) * carried[lane.receiver]
        )
        rate = t.rates[f]
        if rate <= 0:
            return False
        end = ends[f]
        begin = end - size / rate
        for edge in b.flows[f].edges:
            span = windows.setdefault(edge, {}).setdefault(b.flow_phase[f], [begin, end])
            span[0], span[1] = min(span[0], begin), max(span[1], end)
    for spans in windows.values():
        ordered = sorted(spans.values())
        for earlier, later in itertools.pairwise(ordered):
            if later[0] < earlier[1] - _APART * max(1.0, earlier[1]):
                return False
    return True


def sliced_refinement(
    problem: Problem,
    candidates: Sequence[Built],
    objective: str,
    time_left_s: float | None,
) -> Built:
    """The fastest of ``candidates`` (the first of the fastest when no slicing beats them) and
    of their slicings into :data:`SLICES` phases, then (where a plan's hops' depths differ)
    staggered into :data:`STAGGERED_SLICES`, whose phases stay apart on every link
    (:func:`phases_apart`). Each slicing is first timed from its pattern
    (:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`: the full plan's ready times
    without building it); then the fastest of them is built and evaluated in full, the next
    fastest if its phases overlap, and the slicings the pattern could not time are built and
    evaluated in full, fastest count first. Each count is tried on every candidate: the plan
    that times fastest in one phase is often not the one that slices best. A step is not started
    when, at its predicted time (:data:`_MARGIN` times the slowest time per lane and slice so
    far of its kind), it would not end within ``time_left_s`` (None: no clock, all tried); a
    slicing whose waits form a cycle is skipped. Plans of several phases, or whose hops wait
    for others, are not sliced."""
    best = min(candidates, key=lambda p: score(objective, p.ready_at_s, p.live))
    value = score(objective, best.ready_at_s, best.live)
    clock = _Clock(time_left_s)
    plans: list[Built] = []
    for plan in candidates:
        b = plan.builder
        if any(p != 0 for p in b.flow_phase) or any(spec[4] for spec in b.hop_specs):
            continue
        v = score(objective, plan.ready_at_s, plan.live)
        if not any(abs(v - score(objective, o.ready_at_s, o.live)) <= 1e-12 * v for o in plans):
            plans.append(plan)
    shapes = [_shape(problem, p) for p in plans]
    trials = [(m, False, j) for m in SLICES for j in range(len(plans))]
    trials += [(m, True, j) for m in STAGGERED_SLICES for j in range(len(plans)) if shapes[j][3]]
    timed: list[tuple[float, int, bool, int, list[list[int]]]] = []
    full: list[tuple[int, bool, int]] = []
    for phases, staggered, j in trials:
        size = shapes[j][4] * phases
        if not clock.fits("pattern", size):
            continue
        with clock.timing("pattern", size):
            found = _pattern_ready(problem, plans[j], phases, staggered, shapes[j])
        if found is None:
            full.append((phases, staggered, j))
        else:
            v = score(objective, found[0], plans[j].live)
            timed.append((v, phases, staggered, j, found[1]))
    timed.sort(key=lambda t: t[:4])
    for v, phases, staggered, j, feeders in timed:
        if v >= value * (1 - 1e-9):
            break
        trial = _full(problem, plans[j], phases, staggered, clock, shapes[j][4], feeders)
        if trial is not None and phases_apart(problem, trial):
            best, value = trial, score(objective, trial.ready_at_s, trial.live)
            break
    for phases, staggered, j in full:
        trial = _full(problem, plans[j], phases, staggered, clock, shapes[j][4])
        if trial is None:
            continue
        trial_value = score(objective, trial.ready_at_s, trial.live)
        if trial_value < value * (1 - 1e-9) and phases_apart(problem, trial):
            best, value = trial, trial_value
    return best


_Shape = tuple[list[tuple[int, int, bool]], list[int], list[list[int]], bool, int]


def _shape(problem: Problem, plan: Built) -> _Shape:
    """A plan's groups, each lane's group, the groups sharing a link with each, whether its
    hops' depths differ (else staggering changes nothing) and its lanes' atoms (the lanes of
    one slice)."""
    groups, group_of = _groups(plan.builder)
    sharing = _sharing(plan.builder, len(groups), group_of)
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    atoms = sum(len(atoms_of(lane, cuts)) for lane in plan.builder.lanes)
    return groups, group_of, sharing, len(set(_depths(groups))) > 1, max(1, atoms)


def _pattern_ready(
    problem: Problem, plan: Built, phases: int, staggered: bool, shape: _Shape
) -> tuple[dict[str, float], list[list[int]]] | None:
    groups, group_of, sharing, _, _ = shape
    offsets = _depths(groups) if staggered else [0] * len(groups)
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    return sliced_ready(problem, plan, phases, (groups, group_of, offsets, sharing), cuts)


def _full(
    problem: Problem,
    plan: Built,
    phases: int,
    staggered: bool,
    clock: _Clock,
    atoms: int,
    feeders: list[list[int]] | None = None,
) -> Built | None:
    """The slicing built and evaluated (None: no time for it, or its waits form a cycle)."""
    size = atoms * phases
    if not clock.fits("full", size):
        return None
    with clock.timing("full", size):
        try:
            return slice_phases(problem, plan, phases, staggered=staggered, feeders=feeders)
        except InvalidInputError:  # its waits form a cycle: this slicing cannot run
            return None


class _Clock:
    """The time left and, per kind of step, the most seconds per lane and slice so far."""

    def __init__(self, time_left_s: float | None) -> None:
        self.began = time.perf_counter()
        self.left = time_left_s
        self.rate = {"pattern": 0.0, "full": _FULL_PRIOR_S}

    def fits(self, kind: str, size: int) -> bool:
        if self.left is None:
            return True
        spent = time.perf_counter() - self.began
        return spent + _MARGIN * self.rate[kind] * size <= self.left

    @contextlib.contextmanager
    def timing(self, kind: str, size: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.rate[kind] = max(self.rate[kind], took / size)
