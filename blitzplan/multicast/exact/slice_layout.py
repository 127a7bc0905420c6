"""How a one-phase plan is cut into time slices: its atoms, its groups of lanes, each
group's phase offset and the groups sharing a link with it
(:func:`~blitzplan.multicast.exact.phase_slices.slice_phases` builds the slicing,
:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready` times it from one slice).

The stripe boundaries of all lanes (per rank; those of all-rank lanes in every rank) cut
``[0, 1)`` into atoms; a lane's slice ``k`` is part ``k`` of each of its atoms.

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

from collections.abc import Callable, Sequence

from blitzplan.errors import InvalidInputError
from blitzplan.multicast.exact.slice_timing import SNAP, SlicedTimes, atoms_of, sliced_ready
from blitzplan.multicast.plan_types import ALL_RANKS, Lane
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built
from blitzplan.topologies import Edge

__all__ = [
    "BY_LANE",
    "BY_SENDER",
    "Shape",
    "pattern_ready",
    "plan_shape",
    "slice_layout",
    "staggering",
]

Layout = tuple[list[tuple[int, int, bool]], list[int], list[int], list[list[int]]]
"""A plan's cut (:func:`slice_layout`)."""
Shape = tuple[dict[int, Layout], int]
"""A plan's layouts by staggering and its atom count (:func:`plan_shape`)."""


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
    it deeper than its distance from the holders: case 193). The slice search times both
    where they differ and keeps the faster; this one is tried first and decides where
    neither could be timed."""
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


def plan_shape(problem: Problem, plan: Built) -> Shape:
    """A plan's layouts (:func:`slice_layout`) by ``staggered``: plain (0), and staggered
    (:data:`BY_LANE`, :data:`BY_SENDER`; :func:`staggering`'s choice first) where its offsets
    differ (else staggering changes nothing) and put some lane in another phase than the
    other staggering does; and its lanes' atoms (the lanes of one slice)."""
    layouts = {0: slice_layout(plan, 0)}
    first = staggering(plan)
    seen: list[list[int]] = []
    for by in (first, BY_SENDER if first == BY_LANE else BY_LANE):
        layout = slice_layout(plan, by)
        offsets = [layout[2][g] for g in layout[1]]  # each lane's
        if len(set(layout[2])) > 1 and offsets not in seen:
            layouts[by] = layout
            seen.append(offsets)
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    atoms = sum(len(atoms_of(lane, cuts)) for lane in plan.builder.lanes)
    return layouts, max(1, atoms)


def pattern_ready(
    problem: Problem,
    plan: Built,
    phases: int,
    staggered: int,
    shape: Shape,
    check: Callable[[str], None] | None = None,
) -> SlicedTimes | None:
    """Slicing ``plan`` into ``phases`` with layout ``staggered`` of its ``shape``, timed from
    its pattern (:func:`~blitzplan.multicast.exact.slice_timing.sliced_ready`, ``check`` its
    checkpoint; None when the pattern cannot time it)."""
    layout = shape[0].get(staggered, shape[0][0])
    cuts = _atom_cuts(plan.builder.lanes, problem.tp)
    return sliced_ready(problem, plan, phases, layout, cuts, check)
