"""The timeline part of the multicast certificate: every lane's arrivals, recomputed with a plain
loop in dependency order (:mod:`.lane_waits`), each instance's layer ready times and its
readiness, against the plan's.

A lane starts once its receiver's instances have started up, every lane of the hops its hop
waits for has ended, and (fed by others) its first fed chunk can arrive (store and forward: once
every feeding lane has ended); unit ``u`` then arrives at ``max(avail_u + chunk / rate +
latency, t_{u-1} + bytes_u / rate)``, ``avail_u`` when the holder has the unit (the latest
feeding lane's arrival of it, a loading source's own arrival, else 0).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from blitzplan.cluster import ClusterState
from blitzplan.multicast.plan_types import ALL_RANKS, Lane, MulticastPlan, NodeKind
from blitzplan.multicast.validation.lane_waits import lane_waits, waited_lanes

__all__ = ["check_timeline"]

_TOL = 1e-6


def check_timeline(state: ClusterState, plan: MulticastPlan) -> list[str]:
    """Recompute every lane's arrivals in dependency order and compare (module docstring)."""
    units = len(plan.unit_bytes)
    lanes = sorted(plan.lanes, key=lambda x: x.flow)
    hop_of = {lane.flow: h for h, hop in enumerate(plan.hops) for lane in hop.lanes}
    waits = lane_waits(plan, lanes, hop_of)
    if waits is None:
        return ["the plan's lanes wait for each other in a cycle"]
    arrive = _Arrivals(state, plan, lanes, hop_of, *waits).run()
    problems = [
        f"lane {f} arrivals differ from the recurrence"
        for f in _differ(arrive, plan.lane_arrival_s)
    ]
    return problems or _check_ready(plan, arrive, units)


class _Arrivals:
    """Every lane's arrivals, level by level: a lane's level is one past every lane it waits
    for, so the lanes of one level are computed at once. Per lane, with ``d_u`` unit ``u``'s
    bytes over the rate (0 for a unit it does not carry) and ``a_u = avail_u + chunk_u / rate +
    latency``, the recurrence ``t_u = max(a_u, t_{u-1} + d_u)`` from ``t = begin`` is, in closed
    form, ``t_u = D_u + max(begin, max_{k <= u} (a_k - D_k))`` with ``D`` the prefix sums of
    ``d`` (equal to the loop's up to rounding, far inside the tolerance)."""

    def __init__(
        self,
        state: ClusterState,
        plan: MulticastPlan,
        lanes: list[Lane],
        hop_of: dict[int, int],
        order: list[int],
        feeds: list[list[int]],
    ) -> None:
        self.plan, self.lanes, self.hop_of, self.order, self.feeds = (
            plan,
            lanes,
            hop_of,
            order,
            feeds,
        )
        n, units = len(lanes), len(plan.unit_bytes)
        self.arrive = np.zeros((n, units))
        self.last = np.zeros(n)  # each lane's latest arrival
        self.first = np.zeros(n)  # when each lane's first chunk arrives
        self.hop_end = np.full(len(plan.hops) + 1, -math.inf)  # the last slot: no hop
        self.hop_done = [False] * len(plan.hops)
        self.done: dict[int, float] = {}  # the end of a store-and-forward list of feeds, by id
        startup: dict[int, float] = defaultdict(float)
        for inst in plan.instances:
            startup[inst.node] = max(startup[inst.node], inst.startup_s)
        tp = next((node.tp for node in plan.nodes if node.kind is NodeKind.TARGET), 1)
        lacks = [tuple(not node.has(u) for u in range(units)) for node in plan.nodes]
        self.carries = np.array(lacks, dtype=bool).reshape(len(plan.nodes), units)
        loading = {
            i.id: tuple(i.loading.units_ready_s) for i in state.instances if i.loading is not None
        }
        rows: dict[tuple[float, ...], int] = {(0.0,) * units: 0}  # what a source holds when
        starts: dict[tuple[int, int], float] = {}  # per source row and receiver: its start
        latency: dict[tuple[object, ...], float] = {}
        topo = state.topology
        self.share, self.rate, self.latency = (
            np.zeros(n),
            np.asarray(plan.rates, float),
            np.zeros(n),
        )
        self.start, self.row, self.hop = np.zeros(n), np.zeros(n, int), np.full(n, len(plan.hops))
        for f, lane in enumerate(lanes):
            self.share[f] = lane.fraction * (tp if lane.rank == ALL_RANKS else 1)
            edges = tuple(plan.flows[f].edges)
            if edges not in latency:
                latency[edges] = sum(topo.latency_s(e) for e in edges)
            self.latency[f] = latency[edges]
            self.start[f] = startup[lane.receiver]
            self.hop[f] = hop_of.get(f, len(plan.hops))
            if not feeds[f]:  # a source: it holds every unit now, or a loading one from its arrival
                held = loading.get(plan.nodes[lane.sender].instance_id or "", (0.0,) * units)
                row = self.row[f] = rows.setdefault(held, len(rows))
                if (row, lane.receiver) not in starts:
                    carried = [held[u] for u in range(units) if lacks[lane.receiver][u]]
                    starts[row, lane.receiver] = min(carried, default=0.0)
                self.start[f] = max(self.start[f], starts[row, lane.receiver])
        self.held = np.array(list(rows), dtype=float).reshape(len(rows), units)

    def run(self) -> np.ndarray:
        """The arrivals, one row per lane (by flow)."""
        level = [0] * len(self.lanes)
        hop_level: dict[int, int] = {}
        list_level: dict[int, int] = {}
        for f in self.order:
            h, fed, at = self.hop_of.get(f), self.feeds[f], 0
            if h is not None:
                if h not in hop_level:
                    waited = waited_lanes(self.plan, h)
                    hop_level[h] = max((level[x] + 1 for x in waited), default=0)
                at = hop_level[h]
            if fed:
                if id(fed) not in list_level or len(fed) < 4:
                    list_level[id(fed)] = max(level[x] for x in fed) + 1
                at = max(at, list_level[id(fed)])
            level[f] = at
        groups: dict[int, list[int]] = defaultdict(list)
        for f in self.order:
            groups[level[f]].append(f)
        for at in sorted(groups):
            self._level(np.asarray(groups[at]))
        return self.arrive

    def _level(self, idx: np.ndarray) -> None:
        plan, units = self.plan, self.arrive.shape[1]
        for h in set(self.hop[idx].tolist()):
            if h < len(plan.hops) and not self.hop_done[h]:
                waited = waited_lanes(plan, h)
                self.hop_end[h] = self.last[waited].max() if waited else -math.inf
                self.hop_done[h] = True
        begin = np.maximum(self.start[idx], self.hop_end[self.hop[idx]])
        avail = self.held[self.row[idx]]
        for j, f in enumerate(idx.tolist()):
            fed = self.feeds[f]
            if not fed:
                continue
            h = self.hop_of.get(f)
            if h is not None and not plan.hops[h].pipelined:  # store and forward
                if id(fed) not in self.done:
                    self.done[id(fed)] = float(self.last[fed].max())
                avail[j] = self.done[id(fed)]
                begin[j] = max(begin[j], self.done[id(fed)])
            else:
                avail[j] = self.arrive[fed[0]] if len(fed) == 1 else self.arrive[fed].max(0)
                begin[j] = max(begin[j], self.first[fed].max())
        rate = self.rate[idx][:, None]
        lanes = self.lanes
        carries = self.carries[[lanes[f].receiver for f in idx.tolist()]]
        size = np.where(carries, self.share[idx][:, None] * np.asarray(plan.unit_bytes, float), 0.0)
        on = size > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            chunk = np.minimum(float(plan.chunk_bytes), size) / rate
            latency = self.latency[idx][:, None]
            bound = np.where(on, avail + chunk + latency, -math.inf)
            sums = np.cumsum(np.where(on, size / rate, 0.0), axis=1)
            t = sums + np.maximum.accumulate(np.maximum(begin[:, None], bound - sums), axis=1)
        times = np.where(on, t, 0.0)
        self.arrive[idx] = times
        self.last[idx] = times.max(1) if units else 0.0
        head = on.argmax(1) if units else np.zeros(len(idx), int)
        lead = np.where(on.any(1), chunk[np.arange(len(idx)), head], 0.0) if units else 0.0
        self.first[idx] = begin + lead + self.latency[idx]


def _check_ready(plan: MulticastPlan, arrive: np.ndarray, units: int) -> list[str]:
    out = []
    into: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for lane in plan.lanes:
        into[lane.dst].append((lane.flow, lane.rank))
    for inst in plan.instances:
        node = plan.nodes[inst.node]
        done = [0.0] * units
        for gpu in inst.gpus:
            rank = node.rank_of(gpu)
            mine = sorted(f for f, r in into[gpu] if r in (rank, ALL_RANKS))
            got = (  # per unit, the latest arrival over the lanes into the GPU
                arrive[mine].max(0) if mine else np.full(units, math.inf)
            )
            for u in range(units):
                if not node.has(u):
                    done[u] = max(done[u], float(got[u]) if got[u] > 0 else math.inf)
        if _differ([done], [plan.layer_ready_s[inst.name]]):
            out.append(f"{inst.name} layer ready times differ from the recurrence")
        elif abs(plan.ready_at_s[inst.name] - max(done)) > _TOL * max(1.0, max(done)):
            out.append(f"{inst.name} ready_at_s differs from its last unit")
    return out


def _differ(
    ours: Sequence[Sequence[float]] | np.ndarray, theirs: Sequence[Sequence[float]]
) -> list[int]:
    """The rows of ``ours`` that differ from ``theirs``: in length, or in a value by more than
    ``_TOL`` (relative, at least absolute) unless both are the same infinity."""
    bad = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if len(a) != len(b)]
    by_width: dict[int, list[int]] = defaultdict(list)
    for i, a in enumerate(ours):
        if len(a) == len(theirs[i]):
            by_width[len(a)].append(i)
    for width, group in by_width.items():
        a = (
            ours[group]
            if isinstance(ours, np.ndarray)
            else np.array([ours[i] for i in group], dtype=float).reshape(len(group), width)
        )
        b = np.array([theirs[i] for i in group], dtype=float).reshape(len(group), width)
        with np.errstate(invalid="ignore"):
            ok = (np.isinf(a) & (a == b)) | (np.abs(a - b) <= _TOL * np.maximum(1.0, np.abs(b)))
        bad += [group[k] for k in np.flatnonzero(~ok.all(axis=1))]
    return sorted(bad)
