"""The ready times of a one-phase plan cut into time slices, from one slice of it.

:func:`~blitzplan.multicast.exact.phase_slices.slice_phases` builds ``m`` slices of every lane
(``m + D`` phases, ``D`` the deepest stagger) and evaluates them lane by lane: its time grows
with ``m`` times the plan's lanes. Every slice repeats one pattern: the same lanes, stripes as
wide, each fed by the same lanes' same slice; only the phases' rates differ, and only in the
first and last ``D`` phases, where some hops send nothing. :func:`sliced_ready` builds the
pattern once (one lane per atom of each lane), computes the fair-share rates once per distinct
set of sending hops, and runs the recurrence of
:mod:`~blitzplan.multicast.timeline.lane_times` phase by phase with the pattern's lanes as
arrays: the same arithmetic on the same inputs, without building ``m`` times the lanes.

It answers None (the caller evaluates the full slicing) wherever the pattern's feeders might not
be the full plan's: a lane of all ranks, a hop that stores and forwards, two atoms overlapping
but apart by so much that a slice of one overlaps two slices of the other, slices thinner than a
few times the holdings' tolerance, or waits that no order of rounds meets (:func:`_order`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from blitzplan.multicast.allocation.plan_builder import PlanBuilder
from blitzplan.multicast.plan_types import ALL_RANKS, Lane
from blitzplan.multicast.setup.holdings import TOLERANCE
from blitzplan.multicast.setup.problem import Problem
from blitzplan.multicast.timeline.assemble import Built
from blitzplan.multicast.timeline.lane_times import (
    CHECK_EVERY,
    Timeline,
    held_from,
    lane_dependencies,
    lane_levels,
    lane_scan,
    need_matrix,
    startup_by_node,
)
from blitzplan.multicast.timeline.readiness import hop_arrival, instance_ready
from blitzplan.topologies import fair_share_after

__all__ = ["SlicedTimes", "atoms_of", "sliced_ready"]

SNAP = TOLERANCE
"""Stripe boundaries closer than this are one atom boundary (as for the holdings: closer
points are one point)."""
_THIN = 4 * TOLERANCE
"""Slices narrower than this: no answer (which slices feed them is a matter of tolerance)."""


Groups = Sequence[tuple[int, int, bool]]


def atoms_of(lane: Lane, cuts: dict[int, list[float]]) -> list[tuple[float, float]]:
    """The atoms of ``lane``'s stripe: cut at the boundaries of ``cuts`` strictly inside it."""
    inner = [c for c in cuts[lane.rank] if lane.lo + SNAP < c < lane.hi - SNAP]
    return list(itertools.pairwise([lane.lo, *inner, lane.hi]))


def sliced_ready(
    problem: Problem,
    built: Built,
    phases: int,
    slicing: tuple[Groups, Sequence[int], Sequence[int], Sequence[Sequence[int]]],
    cuts: dict[int, list[float]],
    check: Callable[[str], None] | None = None,
) -> SlicedTimes | None:
    """The times of ``built`` cut into ``phases`` slices as
    :func:`~blitzplan.multicast.exact.phase_slices.slice_phases` cuts it, ``slicing`` being its
    ``(groups, group of each lane, offset of each group, groups sharing a link with each)``;
    None where the pattern may not be the full plan's (module docstring). ``check`` (a
    deadline's checkpoint, which raises to stop the call) is called as the pattern's
    dependencies are found and once per round of slices (``timing``)."""
    groups, group_of, offsets, sharing = slicing
    old = built.builder
    if any(lane.rank == ALL_RANKS for lane in old.lanes) or not all(g[2] for g in groups):
        return None
    pattern = PlanBuilder(old.topology)
    for node in old.nodes:
        pattern.add_node(node)
    pattern.instances.extend(old.instances)
    owner: list[int] = []  # per pattern lane (one per atom of a lane), its group
    cuts_of: list[list[float]] = []  # per pattern lane, its slices' boundaries
    by_group: list[list[Lane]] = [[] for _ in groups]
    for lane in old.lanes:
        by_group[group_of[lane.flow]].append(lane)
    for g, (sender, receiver, pipelined) in enumerate(groups):
        hop = pattern.hop(sender, receiver, pipelined=pipelined)
        for lane in by_group[g]:
            pace = old.flows[lane.flow].max_bytes_per_s
            for a, b in atoms_of(lane, cuts):
                step = (b - a) / phases
                if step < _THIN:
                    return None
                cuts_of.append([a + k * step for k in range(phases)] + [b])
                share = (b - a) / (lane.hi - lane.lo)
                pattern.add_lane(
                    hop,
                    lane.holder,
                    lane.exit,
                    lane.dst,
                    lane.rank,
                    a,
                    b,
                    pace_bytes_per_s=pace * share,
                )
                owner.append(g)
    lanes = pattern.lanes
    deps = [list(d) for d in lane_dependencies(lanes, pattern.nodes, pattern.hops(), (), check)]
    bounds = np.asarray(cuts_of, dtype=float)  # lanes x (slices + 1)
    for f, fed in enumerate(deps):
        for d in fed:
            same = (lanes[d].lo, lanes[d].hi) == (lanes[f].lo, lanes[f].hi)
            if not same and not _slice_fed(bounds[f], bounds[d]):
                return None
    order = _order(deps, owner, offsets, sharing)
    if order is None:
        return None
    width = np.diff(bounds, axis=1).T  # slices x lanes
    run = _Pattern(problem, pattern, width, deps, owner, offsets)
    return SlicedTimes(run.ready(*order, sharing, check), deps, run)


@dataclass(frozen=True)
class SlicedTimes:
    """A slicing's times from its pattern."""

    ready_at_s: dict[str, float]
    """Each new instance's ready time."""
    feeders: list[list[int]]
    """Per lane of one slice (in the order slice_phases adds them: by group, lane, atom), the
    lanes of the same slice that feed it."""
    run: _Pattern
    """Every slice's rates and times."""

    def timeline(
        self, builder: PlanBuilder, made: np.ndarray, check: Callable[[str], None] | None = None
    ) -> Timeline:
        """The timeline of the full slicing ``builder``, whose lane ``made[k, f]`` is slice
        ``k`` of the pattern's lane ``f`` (every lane once): the pattern's rates, arrivals,
        starts and feeders put in place, then each hop's arrivals and each instance's
        readiness as the timeline computes them. ``check`` (a deadline's checkpoint) is
        called with ``timeline`` about every :data:`CHECK_EVERY` lanes and between those
        parts."""
        step = check or _unchecked
        every_lanes = max(1, CHECK_EVERY // made.shape[0])  # pattern lanes between checks
        run = self.run
        slot = np.empty(made.size, dtype=np.intp)  # per lane id, its [slice, pattern lane]
        slot[made.ravel()] = np.arange(made.size)
        k, f = np.divmod(slot, made.shape[1])
        every = run.arrival[k, f]
        rates = run.rates[run.phase_class[k + run.off[f]], f]
        feeds: list[tuple[int, ...]] = [()] * made.size
        for p, fed in enumerate(self.feeders):
            if p % every_lanes == 0:
                step("timeline")
            if fed:
                for lane, row in zip(made[:, p].tolist(), made[:, fed].tolist(), strict=True):
                    feeds[lane] = tuple(row)
        step("timeline")
        by_hop = hop_arrival(builder.hops(), every)
        step("timeline")
        return Timeline(
            tuple(rates.tolist()),
            every,
            by_hop,
            instance_ready(builder.lanes, builder.nodes, builder.instances, every),
            run.start[k, f],
            tuple(feeds),
        )


def _slice_fed(mine: np.ndarray, other: np.ndarray) -> bool:
    """Whether, of two atoms that overlap (by more than the tolerance) but differ, each slice
    ``k`` of the first overlaps slice ``k`` of the second and no other, as the timeline's
    search of overlapping stripes finds them (:func:`~blitzplan.multicast.setup.holdings.overlap`
    on the same boundaries; the next and the previous slice are the only others that could)."""
    lo, hi, olo, ohi = mine[:-1], mine[1:], other[:-1], other[1:]
    if not np.all(np.minimum(hi, ohi) - np.maximum(lo, olo) > TOLERANCE):
        return False
    later = np.minimum(hi[:-1], ohi[1:]) - np.maximum(lo[:-1], olo[1:])
    earlier = np.minimum(hi[1:], ohi[:-1]) - np.maximum(lo[1:], olo[:-1])
    return bool(np.all(later <= TOLERANCE) and np.all(earlier <= TOLERANCE))


def _order(
    deps: Sequence[Sequence[int]],
    owner: Sequence[int],
    offsets: Sequence[int],
    sharing: Sequence[Sequence[int]],
) -> tuple[list[int], list[list[int]]] | None:
    """An order of the full plan's lanes by the pattern: pattern lane ``f``'s slice ``k`` in
    round ``k + c_f``, each round's lanes in the returned levels' order. Slice ``k`` of ``f``
    is in phase ``k + offsets[group]`` and waits for its feeders' slice ``k`` and for every
    lane of a group sharing a link with its group one phase before (at most); so, with ``x_f =
    c_f - offset``, ``c_d <= c_f`` for a feeder ``d`` and ``x_l <= x_f + 1`` for such a lane
    ``l``, equality ordered inside the round. The least such ``x`` by relaxation from 0 (the
    phases' order when no feeder is in a later phase); None when none exists within as many
    rounds as lanes, or a round's order has a cycle: the caller evaluates the full plan."""
    count = len(deps)
    off = [offsets[g] for g in owner]
    members: list[list[int]] = [[] for _ in offsets]
    for f, g in enumerate(owner):
        members[g].append(f)
    x = [0] * count
    for _ in range(count + 2):
        top = [max((x[f] for f in m), default=0) for m in members]
        changed = False
        for f in range(count):
            want = max(
                0,
                max((x[d] + off[d] - off[f] for d in deps[f]), default=0),
                max((top[j] - 1 for j in sharing[owner[f]]), default=0),
            )
            if want > x[f]:
                x[f], changed = want, True
                top[owner[f]] = max(top[owner[f]], want)
        if not changed:
            break
    else:
        return None
    shift = [x[f] + off[f] for f in range(count)]
    before: list[set[int]] = [set() for _ in range(count)]  # same-round predecessors
    for f in range(count):
        before[f].update(d for d in deps[f] if shift[d] == shift[f])
        for j in sharing[owner[f]]:
            before[f].update(v for v in members[j] if x[v] == x[f] + 1)
    levels = lane_levels(before)
    return (shift, levels) if levels is not None else None


class _Pattern:
    """The pattern's constant arrays and the slices' times as they are computed."""

    def __init__(
        self,
        problem: Problem,
        pattern: PlanBuilder,
        width: np.ndarray,
        deps: Sequence[Sequence[int]],
        owner: Sequence[int],
        offsets: Sequence[int],
    ) -> None:
        lanes = pattern.lanes
        self.problem, self.pattern, self.deps = problem, pattern, deps
        self.width = width  # slices x lanes
        carried = need_matrix(lanes, pattern.nodes, problem.unit_bytes, problem.tp) > 0
        shard = np.asarray(problem.unit_bytes, dtype=float)
        self.shard = np.where(carried, shard[None, :], 0.0)
        self.held, self.held_first = held_from(lanes, pattern.nodes, carried.astype(float))
        startup = startup_by_node(pattern.instances)
        self.begin = np.array([startup.get(lane.receiver, 0.0) for lane in lanes])
        self.latency = np.asarray(pattern.flow_latency_s, dtype=float)
        self.owner = np.asarray(owner, dtype=np.intp)
        self.offsets = np.asarray(offsets, dtype=np.intp)
        self.off = self.offsets[self.owner]
        phases, count, units = width.shape[0], len(lanes), len(problem.unit_bytes)
        self.arrival = np.zeros((phases, count, units))
        self.first = np.zeros((phases, count))
        self.end = np.zeros((phases, count))
        self.start = np.zeros((phases, count))
        self.hop_end = np.zeros((phases, len(offsets)))

    def ready(
        self,
        shift: Sequence[int],
        levels: list[list[int]],
        sharing: Sequence[Sequence[int]],
        check: Callable[[str], None] | None = None,
    ) -> dict[str, float]:
        """Every slice in rounds (:func:`_order`), ``check`` called before each, then each
        instance's ready time."""
        phases, groups = self.width.shape[0], len(self.offsets)
        self.share = np.zeros((groups, groups), dtype=bool)
        for g, others in enumerate(sharing):
            self.share[g, list(others)] = True
        top = int(self.offsets.max())
        classes: dict[bytes, int] = {}
        tables: list[np.ndarray] = []
        self.phase_class = np.zeros(top + phases, dtype=np.intp)
        for p in range(top + phases):
            active = (self.offsets <= p) & (p < self.offsets + phases)
            key = active.tobytes()
            if key not in classes:
                classes[key] = len(tables)
                tables.append(self._rates(active[self.owner]))
            self.phase_class[p] = classes[key]
        self.rates = np.stack(tables)
        c = np.asarray(shift, dtype=np.intp)
        steps = [np.asarray(level, dtype=np.intp) for level in levels]
        for e in range(int(c.min()), int(c.max()) + phases):
            if check is not None:
                check("timing")
            for level in steps:
                k = e - c[level]
                inside = (k >= 0) & (k < phases)
                if inside.any():
                    self._step(level[inside], k[inside])
        return self._ready()

    def _rates(self, active: np.ndarray) -> np.ndarray:
        """The pattern's lanes' fair-share rates in a phase where the ``active`` ones send."""
        ids = np.flatnonzero(active).tolist()
        flows = [self.pattern.flows[i] for i in ids]
        background = self.problem.state.background_flows
        out = np.zeros(len(active))
        out[ids] = fair_share_after(flows, self.pattern.topology.capacity, background)
        return out

    def _step(self, idx: np.ndarray, k: np.ndarray) -> None:
        """Lanes ``idx`` of the pattern, each in its slice ``k``, feeding none of each other."""
        units, phases = self.arrival.shape[2], self.arrival.shape[0]
        avail = np.zeros((len(idx), units))
        first_in = np.zeros(len(idx))
        fed = [i for i, f in enumerate(idx.tolist()) if self.deps[f]]
        if fed:
            counts = [len(self.deps[idx[i]]) for i in fed]
            rows = np.fromiter((d for i in fed for d in self.deps[idx[i]]), dtype=np.intp)
            ks = np.repeat(k[fed], counts)
            starts = np.cumsum([0, *counts[:-1]])
            avail[fed] = np.maximum.reduceat(self.arrival[ks, rows], starts, axis=0)
            first_in[fed] = np.maximum.reduceat(self.first[ks, rows], starts)
        avail = np.maximum(avail, self.held[idx])
        phase = k + self.off[idx]
        q = np.minimum(phase[:, None] - 1, self.offsets[None, :] + phases - 1)
        waited = (q >= self.offsets[None, :]) & self.share[self.owner[idx]]
        slot = np.clip(q - self.offsets[None, :], 0, phases - 1)
        ends = self.hop_end[slot, np.arange(len(self.offsets))[None, :]]
        after = np.where(waited, ends, 0.0).max(axis=1)
        start = np.maximum.reduce([self.begin[idx], first_in, after, self.held_first[idx]])
        need = self.width[k, idx][:, None] * self.shard[idx]
        rate = self.rates[self.phase_class[phase], idx]
        chunk = self.problem.chunk_bytes
        times, first = lane_scan(need, avail, rate, self.latency[idx], chunk, start)
        self.arrival[k, idx] = times
        self.first[k, idx] = first
        self.start[k, idx] = start
        self.end[k, idx] = times.max(axis=1) if units else start
        np.maximum.at(self.hop_end, (k, self.owner[idx]), self.end[k, idx])

    def _ready(self) -> dict[str, float]:
        """Per new instance, when its last unit is complete on all its GPUs (as the timeline's
        readiness: inf for a unit a GPU needs and never gets)."""
        pattern, units = self.pattern, self.arrival.shape[2]
        slot: dict[str, tuple[int, int]] = {}
        for inst in pattern.instances:
            for rank, gpu in enumerate(inst.gpus):
                slot[gpu] = (len(slot), rank)
        got = np.zeros((len(slot), units))
        latest = self.arrival.max(axis=0)  # per pattern lane, over its slices
        for lane in pattern.lanes:
            found = slot.get(lane.dst)
            if found is not None and lane.rank == found[1]:
                got[found[0]] = np.maximum(got[found[0]], latest[lane.flow])
        out = {}
        at = 0
        for inst in pattern.instances:
            present = np.asarray(pattern.nodes[inst.node].present or (False,) * units, dtype=bool)
            mine = got[at : at + len(inst.gpus)]
            done = np.where(present, 0.0, np.where(mine > 0, mine, math.inf))
            at += len(inst.gpus)
            out[inst.name] = float(done.max()) if done.size else 0.0
        return out


def _unchecked(_: str) -> None:
    """No checkpoint."""
