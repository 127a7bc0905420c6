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
from blitzplan.multicast.plan_types import ALL_RANKS, MulticastPlan, NodeKind
from blitzplan.multicast.validation.lane_table import LaneTable, flow_routes, lane_table
from blitzplan.multicast.validation.lane_waits import Waits, lane_waits, spans

__all__ = ["check_timeline"]

_TOL = 1e-6


def check_timeline(
    state: ClusterState,
    plan: MulticastPlan,
    table: LaneTable | None = None,
    theirs: np.ndarray | None = None,
) -> list[str]:
    """Recompute every lane's arrivals in dependency order and compare (module docstring);
    ``table``: the plan's lanes as columns, ``theirs`` its arrivals as one array
    (:func:`.plan_arrivals`), when the caller has them."""
    units = len(plan.unit_bytes)
    table = lane_table(plan) if table is None else table
    waits = lane_waits(plan, table)
    if waits is None:
        return ["the plan's lanes wait for each other in a cycle"]
    arrive = _Arrivals(state, plan, table, waits).run()
    problems = [
        f"lane {f} arrivals differ from the recurrence"
        for f in (
            _far(arrive, theirs).tolist()
            if theirs is not None and theirs.shape == arrive.shape
            else _differ(arrive, plan.lane_arrival_s)
        )
    ]
    return problems or _check_ready(plan, table, arrive, units)


class _Arrivals:
    """Every lane's arrivals, level by level (:func:`.lane_waits`: a lane's level is one past
    every lane it waits for, so the lanes of one level are computed at once). Per lane, with
    ``d_u`` unit ``u``'s bytes over the rate (0 for a unit it does not carry) and ``a_u =
    avail_u + chunk_u / rate + latency``, the recurrence ``t_u = max(a_u, t_{u-1} + d_u)`` from
    ``t = begin`` is, in closed form, ``t_u = D_u + max(begin, max_{k <= u} (a_k - D_k))`` with
    ``D`` the prefix sums of ``d`` (equal to the loop's up to rounding, far inside the
    tolerance)."""

    def __init__(
        self, state: ClusterState, plan: MulticastPlan, table: LaneTable, waits: Waits
    ) -> None:
        self.plan, self.table, self.waits = plan, table, waits
        n, units = len(table.lanes), len(plan.unit_bytes)
        self.arrive = np.zeros((n, units))
        self.last = np.zeros(n)  # each lane's latest arrival
        self.first = np.zeros(n)  # when each lane's first chunk arrives
        self.hop_last: dict[int, float] = {}  # per hop ended: its latest arrival
        self.node_last: dict[int, float] = {}  # per node fed in full: its latest arrival
        startup = np.zeros(len(plan.nodes))
        for inst in plan.instances:
            startup[inst.node] = max(startup[inst.node], inst.startup_s)
        tp = next((node.tp for node in plan.nodes if node.kind is NodeKind.TARGET), 1)
        lacks = [tuple(not node.has(u) for u in range(units)) for node in plan.nodes]
        self.carries = np.array(lacks, dtype=bool).reshape(len(plan.nodes), units)
        self.share = (table.hi - table.lo) * np.where(table.rank == ALL_RANKS, tp, 1)
        self.rate = np.asarray(plan.rates, float).reshape(n)
        routes, route = flow_routes(plan)
        topo = state.topology
        delay = [sum(topo.latency_s(e) for e in edges) for edges in routes]
        self.latency = np.asarray(delay, float).reshape(len(routes))[route]
        self.start = startup[table.receiver]
        self.hop = table.hop
        # the sources (fed by none): every unit now, or a loading source's from its arrival
        self.fed = np.diff(waits.ptr) > 0
        stored = waits.stored
        self.fed[stored] = (waits.into_ptr[table.sender + 1] > waits.into_ptr[table.sender])[stored]
        loading = {
            i.id: tuple(i.loading.units_ready_s) for i in state.instances if i.loading is not None
        }
        rows: dict[tuple[float, ...], int] = {(0.0,) * units: 0}  # what a source holds when
        node_row = np.array(
            [
                rows.setdefault(loading.get(node.instance_id or "", (0.0,) * units), len(rows))
                for node in plan.nodes
            ],
            np.int64,
        ).reshape(len(plan.nodes))
        self.held = np.array(list(rows), dtype=float).reshape(len(rows), units)
        self.row = np.where(self.fed, 0, node_row[table.sender])
        own = np.flatnonzero(~self.fed)
        pairs = np.unique(self.row[own] * len(plan.nodes) + table.receiver[own])
        begins = {}  # per source row and receiver: its start
        for key in pairs.tolist():
            row, receiver = divmod(key, len(plan.nodes))
            carried = self.held[row][self.carries[receiver]]
            begins[key] = float(carried.min()) if len(carried) else 0.0
        keyed = self.row[own] * len(plan.nodes) + table.receiver[own]
        self.start[own] = np.maximum(
            self.start[own], np.fromiter(map(begins.__getitem__, keyed.tolist()), float, len(own))
        )

    def run(self) -> np.ndarray:
        """The arrivals, one row per lane (by flow)."""
        level = self.waits.level
        order = np.argsort(level, kind="stable")
        if len(order):
            cuts = np.flatnonzero(np.diff(level[order])) + 1
            for idx in np.split(order, cuts):
                self._level(idx)
        return self.arrive

    def _hop_begin(self, h: int) -> float:
        """When hop ``h`` may start: every lane of the hops it waits for has ended."""
        plan = self.plan
        ends = []
        for a in plan.hops[h].after:
            if a not in self.hop_last:
                mine = [lane.flow for lane in plan.hops[a].lanes]
                self.hop_last[a] = float(self.last[mine].max()) if mine else -math.inf
            ends.append(self.hop_last[a])
        return max(ends, default=-math.inf)

    def _level(self, idx: np.ndarray) -> None:
        plan, table, waits, units = self.plan, self.table, self.waits, self.arrive.shape[1]
        hop = self.hop[idx]
        begin = self.start[idx].copy()
        on = hop >= 0
        if on.any():
            used, back = np.unique(hop[on], return_inverse=True)
            after = np.fromiter(map(self._hop_begin, used.tolist()), float, len(used))
            begin[on] = np.maximum(begin[on], after[back])
        avail = self.held[self.row[idx]]
        fed = self.fed[idx]
        stored = waits.stored[idx] & fed
        if stored.any():  # store and forward: once every lane into the sender has ended
            senders = table.sender[idx[stored]]
            done = np.fromiter(map(self._node_last, senders.tolist()), float, len(senders))
            avail[stored] = done[:, None]
            begin[stored] = np.maximum(begin[stored], done)
        streamed = fed & ~waits.stored[idx]
        if streamed.any():  # the latest arrival of each unit over the lanes feeding it
            rows = idx[streamed]
            pos, starts = spans(waits.ptr, rows)
            feeds = waits.feeds[pos]
            avail[streamed] = np.maximum.reduceat(self.arrive[feeds], starts, axis=0)
            begin[streamed] = np.maximum(
                begin[streamed], np.maximum.reduceat(self.first[feeds], starts)
            )
        rate = self.rate[idx][:, None]
        carries = self.carries[table.receiver[idx]]
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

    def _node_last(self, node: int) -> float:
        """The latest arrival over every lane into ``node`` (all of them ended)."""
        if node not in self.node_last:
            ptr = self.waits.into_ptr
            self.node_last[node] = float(
                self.last[self.waits.into[ptr[node] : ptr[node + 1]]].max()
            )
        return self.node_last[node]


def _check_ready(
    plan: MulticastPlan, table: LaneTable, arrive: np.ndarray, units: int
) -> list[str]:
    out = []
    names = {name: k for k, name in enumerate(table.names)}
    for inst in plan.instances:
        node = plan.nodes[inst.node]
        done = [0.0] * units
        for gpu in inst.gpus:
            rank = node.rank_of(gpu)
            into = table.dst == names.get(gpu, -1)
            mine = into & ((table.rank == rank) | (table.rank == ALL_RANKS))
            got = (  # per unit, the latest arrival over the lanes into the GPU
                arrive[mine].max(0) if mine.any() else np.full(units, math.inf)
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
        bad += [group[k] for k in _far(a, b).tolist()]
    return sorted(bad)


def _far(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The rows where ``a`` and ``b`` differ by more than ``_TOL`` (relative, at least
    absolute) in some value, unless both are the same infinity."""
    with np.errstate(invalid="ignore"):
        gap = np.subtract(a, b)
        np.abs(gap, out=gap)
        room = np.abs(b)
        np.maximum(room, 1.0, out=room)
        room *= _TOL
        rows = np.flatnonzero(~(gap <= room).all(axis=1))  # then the infinities among them
        a, b = a[rows], b[rows]
        ok = (np.isinf(a) & (a == b)) | (np.abs(a - b) <= _TOL * np.maximum(1.0, np.abs(b)))
    far: np.ndarray = rows[~ok.all(axis=1)]
    return far
