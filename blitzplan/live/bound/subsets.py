"""The subset dynamic program of the N-capacity relaxation under a free O order, on numpy.

Level ``d`` holds states with ``d`` batches placed on O: the set (a bit mask), O's free time
and the cost so far, with a pointer to the state it grew from. Every state is bounded by its
cost plus, for each batch not yet placed, the least of its value placed next on O and its value
on N alone; a state whose bound cannot beat the best known cost is dropped, and so is a child
whose own bound cannot. Each state also completes the relaxation by leaving every unplaced
batch on N (a candidate for the best cost). The children of a level are merged, per set, to
their Pareto front of (O free time, cost) (with the capacity conditions under a free order,
mean latency: of O free time and ``cost - free``, :func:`_pareto`). All of it runs on
arrays, a chunk of states at a time; the clock is read before every chunk and every merge (a
merge is not started when the last large merge's time per state says it would end past the
time allowed). Given a
:class:`~blitzplan.live.work_meter.WorkMeter`, the clock is the meter's: every chunk and merge
counts its estimated seconds (:mod:`blitzplan.live.bound.subset_cost`: per chunk, and per
merged state, more when their costs differ) and a merge is not started when
its estimate would end past the counted time allowed, so the search does the same work on
every run.

With ``capacity``, rules the N-capacity relaxation drops are put back as necessary conditions
(:class:`~blitzplan.live.bound.conditions.Capacity`), giving a stronger bound (not the
relaxation's own value): O and N share the work of the batches O has served, the batches left
on N share N, and both crowd N at once. With ``fifo``,
O serves the batches it takes in release order (``old_order="fifo"``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from blitzplan.live.bound import deadlines as deadlines_module
from blitzplan.live.bound import last_blocks, ranks, subset_cost, subset_lifts
from blitzplan.live.bound.conditions import Capacity
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.schedule import SLO_TOL_S
from blitzplan.live.work_meter import WALL_CLOCK, Clock

__all__ = [
    "CHUNK_STATES",
    "subset_search",
]

CHUNK_STATES = 4_000
"""States bounded and expanded together (one read of the clock per chunk); half as many with
the capacity conditions under a free order, whose chunks take twice as long per state (on
(32,16) of ``benchmarks/partition.py``, up to 90 ms for 4,000 states against 40 ms without
the split apart of :meth:`~blitzplan.live.bound.conditions.Capacity.shared`): a time
limit is overrun by at most one chunk."""

REFINED_ROWS = 250
"""Complete states whose refined crowding term (and rank bound) are taken together: on the
wall clock the time is read between such parts, and a chunk that reaches ``search_until``
there is left unexpanded (on (32,16) FIFO a chunk's 2,000 states took up to 42 ms of CPU,
most of it those terms; the parts give the same values)."""


class _Cut(Exception):
    """A chunk reached the time allowed before it was expanded (it stays open)."""


_Arrays = dict[str, np.ndarray]
"""A level: ``mask``, ``free`` (O free time), ``cost``, ``parent`` and ``last`` (the batch
placed last), one entry per state."""


class _Table:
    """The relaxation's per-batch options and objective, as arrays."""

    def __init__(
        self,
        relax: Relaxation,
        *,
        capacity: bool = False,
        fifo: bool = False,
        deadlines: bool = False,
    ) -> None:
        self.relax, self.n = relax, relax.instance.num_batches
        self.deadlines = deadlines and deadlines_module.DEADLINES
        """Whether complete states under FIFO get the deadline bound
        (:mod:`blitzplan.live.bound.deadlines`): the root's capacity bound asks for it;
        a node's program does without (on (80,8) FIFO seed 6 of ``benchmarks/partition.py``
        its cost per node kept the search from proving in 10 s what it proves in 3.8 s)."""
        self.use_max = relax.obj.use_max
        self.empty = relax.obj.empty
        opts = relax.options
        self.rho = [np.asarray(o.rho, dtype=float) for o in opts]
        self.q = [np.asarray(o.q, dtype=float) for o in opts]
        self.best = [np.asarray(o.suffix_best, dtype=float) for o in opts]
        self.on_new = np.asarray(relax.on_new, dtype=float)
        self.release = np.asarray(relax.instance.release_s, dtype=float)
        self.slo = np.asarray(relax.obj.slo, dtype=float)
        self.bits = np.int64(1) << np.arange(self.n, dtype=np.int64)
        self.sums = relax.obj.name == "mean_latency"
        """Whether the bound on the batches left on N applies (a total latency)."""
        rank = np.empty(self.n, dtype=np.int64)
        rank[list(relax.instance.fifo_order)] = np.arange(self.n)
        self.fifo_rank = rank if fifo else None
        self.capacity = Capacity(relax, self, split_apart=not fifo) if capacity else None
        self.chunk = CHUNK_STATES // 2 if capacity and (not fifo or ranks.RANKS) else CHUNK_STATES
        """States per chunk (:data:`CHUNK_STATES`; under FIFO the rank bound costs 70-85 us a
        complete state it is taken on, on (32,16) and (80,16): a chunk of 4,000 up to 0.3 s)."""
        self.relative = capacity and self.sums and not fifo
        """Whether the merge compares ``cost - free``, not ``cost`` (:func:`_pareto`)."""
        self.pairs = self.relative and last_blocks.PAIRS
        """Whether states carry the pair bound's lift (:mod:`blitzplan.live.bound.last_blocks`)."""
        self.until = math.inf
        """A ``time.perf_counter()`` instant past which :meth:`done` stops between parts of
        :data:`REFINED_ROWS` states (raising :class:`_Cut`); set on the wall clock only."""

    def unplaced(self, mask: np.ndarray) -> np.ndarray:
        """(states x batches): whether each batch is outside each state's set ``mask``."""
        return np.asarray((mask[:, None] & self.bits[None, :]) == 0)

    def ends(self, free: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(states x batches): when each batch completes placed next on O (inf where the
        state has placed it: only the unplaced rows are computed, about half of a level's)."""
        out = np.full((free.size, self.n), math.inf)
        served = None if self.capacity is None else self.capacity.served(mask)
        unplaced = self.unplaced(mask)
        for i in range(self.n):
            rows = unplaced[:, i]
            if rows.all():
                out[:, i] = self.end(i, free, served)
            elif rows.any():
                part = None if served is None else served[:, rows]
                out[rows, i] = self.end(i, free[rows], part)
        return out

    def end(self, i: int, free: np.ndarray, served: np.ndarray | None) -> np.ndarray:
        """When batch ``i`` completes placed next on O, O free at ``free`` having served work
        ``served`` (:meth:`Capacity.served`; None without the capacity conditions)."""
        j = np.searchsorted(self.rho[i], free, side="right") - 1
        best = self.best[i][j + 1]
        if self.q[i].size:
            alt = np.where(j >= 0, free + self.q[i][np.maximum(j, 0)], math.inf)
            best = np.minimum(best, alt)
        if self.capacity is not None and served is not None:
            best = np.maximum(best, self.capacity.shared(served, i, free))
        return np.asarray(best)

    def done(
        self,
        cost: np.ndarray,
        unplaced: np.ndarray,
        free: np.ndarray,
        mask: np.ndarray,
        best_cost: float = math.inf,
        pair: np.ndarray | None = None,
    ) -> np.ndarray:
        """Each state completed by leaving every unplaced batch on N. The crowding term is
        taken at the chains' points too (and under FIFO counts every served block) only where
        the state could still beat ``best_cost`` (elsewhere the arrivals' points and the last
        block alone, a lower but valid bound, settle it). ``pair``: each state's pair bound
        lift (:mod:`blitzplan.live.bound.last_blocks`), the larger of it and the crowding term
        counts."""
        alone = self.fold(np.broadcast_to(self.on_new, unplaced.shape), unplaced)
        if self.capacity is None or not self.sums:
            return self.combine(cost, alone)
        total, last = self.capacity.left_on_new(unplaced)
        base = cost + np.maximum(alone, total)
        crowd = self.capacity.crowded(mask, free, unplaced, last)
        if pair is not None:
            crowd = crowd._replace(extra=np.maximum(crowd.extra, pair))
        out = base + crowd.extra
        fifo = self.fifo_rank is not None
        every = np.flatnonzero(out < best_cost)
        for begin in range(0, every.size, REFINED_ROWS):
            if time.perf_counter() > self.until:
                raise _Cut
            rows = every[begin : begin + REFINED_ROWS]
            extra = self.capacity.refined(crowd, rows, every_block=fifo)
            extra = np.maximum(extra, ranks.release_gain(self.capacity, crowd, rows))
            if ranks.RANKS and fifo:
                extra = np.maximum(extra, ranks.rank_extra_s(self.capacity, crowd, rows))
            if self.deadlines and fifo:
                still = np.flatnonzero(base[rows] + extra < best_cost)
                more = deadlines_module.deadline_extra_s(self.capacity, crowd, rows[still])
                extra[still] = np.maximum(extra[still], more)
                if subset_lifts.SUBSET_LIFTS:  # the dearer lifts where still under
                    again = still[base[rows[still]] + extra[still] < best_cost]
                    more = deadlines_module.subset_deadline_extra_s(
                        self.capacity, crowd, rows[again]
                    )
                    extra[again] = np.maximum(extra[again], more)
            if pair is not None:
                extra = np.maximum(extra, pair[rows])
            out[rows] = base[rows] + extra
        return np.asarray(out)

    def allowed(self, last: np.ndarray, i: int) -> np.ndarray | bool:
        """Whether batch ``i`` may follow ``last`` on O (always, unless O keeps FIFO order)."""
        if self.fifo_rank is None:
            return True
        return np.asarray((last < 0) | (self.fifo_rank[np.maximum(last, 0)] < self.fifo_rank[i]))

    def values(self, ends: np.ndarray) -> np.ndarray:
        """Each batch's value for those completions (as :meth:`RelaxObjective.value`)."""
        name = self.relax.obj.name
        if name == "makespan":
            return ends
        latency = ends - self.release
        if name == "slo_violations":
            late = np.where(latency > self.slo + SLO_TOL_S, 1.0, 0.0)
            return np.asarray(np.where(np.isinf(ends), math.inf, late))
        if name == "hard_slo":
            return np.asarray(np.where(latency > self.slo + SLO_TOL_S, math.inf, latency))
        return np.asarray(latency)

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.asarray(np.maximum(a, b) if self.use_max else a + b)

    def fold(self, values: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """Combine each row's values where ``keep`` (the empty value where none)."""
        if self.use_max:
            return np.asarray(np.where(keep, values, -math.inf).max(axis=1))
        return np.asarray(np.where(keep, values, 0.0).sum(axis=1))

    def others(self, floors: np.ndarray, total: np.ndarray, keep: np.ndarray, i: int) -> np.ndarray:
        """The fold of every row's floors where ``keep``, column ``i`` left out (``total`` is
        the fold with it)."""
        if not self.use_max:
            return np.asarray(total - floors[:, i])
        rest = np.delete(np.where(keep, floors, -math.inf), i, axis=1)
        if not rest.shape[1]:
            return np.full(floors.shape[0], -math.inf)
        return np.asarray(rest.max(axis=1))


def subset_search(
    relax: Relaxation,
    best_cost: float,
    search_until: float,
    deadline: float,
    *,
    capacity: bool = False,
    fifo: bool = False,
    clock: Clock = WALL_CLOCK,
    deadlines: bool = False,
) -> tuple[float, tuple[int, ...] | None, bool]:
    """(bound, best O sequence found, finished), in cost units; see the module docstring.
    ``search_until`` and ``deadline`` are instants on ``clock`` (``time.perf_counter()``
    values, or counted seconds on a meter). With ``deadlines`` (and ``capacity``, ``fifo``),
    the deadline bound too (:attr:`_Table.deadlines`)."""
    table = _Table(relax, capacity=capacity, fifo=fifo, deadlines=deadlines)
    if clock is WALL_CLOCK:
        table.until = search_until
    level: _Arrays = {
        "mask": np.zeros(1, dtype=np.int64),
        "free": np.array([relax.instance.old_free_at_s]),
        "cost": np.array([table.empty]),
        "parent": np.array([-1]),
        "last": np.array([-1]),
    }
    if table.pairs:
        level["pair"] = np.zeros(1)
    history: list[_Arrays] = []
    best_ref: tuple[int, int] | None = None
    merge_s_per_state = 0.0  # the last large merge's time per state: what the next will take
    for depth in range(table.n + 1):
        history.append(level)
        grown: list[_Arrays] = []
        for begin in range(0, level["cost"].size, table.chunk):
            if clock.passed(search_until):
                bound = _open_bound(table, level, begin, grown, best_cost, deadline, clock)
                return bound, _sequence(history, best_ref), False
            subset_cost.count_chunk(clock, table.n, min(table.chunk, level["cost"].size - begin))
            try:
                found = _expand(table, level, begin, best_cost, grown)
            except _Cut:  # nothing of the chunk was grown: it is bounded as open
                bound = _open_bound(table, level, begin, grown, best_cost, deadline, clock)
                return bound, _sequence(history, best_ref), False
            if found is not None:
                best_cost, best_ref = found[0], (depth, found[1])
        if not grown:
            break
        size = sum(part["cost"].size for part in grown)
        began = time.perf_counter()
        merge_s = clock.step_s(partial(subset_cost.merge_s, grown, size), merge_s_per_state * size)
        if clock.passed(search_until - merge_s):  # no time to merge: bound them
            empty = {key: value[:0] for key, value in level.items()}
            bound = _open_bound(table, empty, 0, grown, best_cost, deadline, clock)
            return bound, _sequence(history, best_ref), False
        clock.spend(merge_s)
        lifts = None
        if last_blocks.LAZY_PAIRS and table.pairs and table.capacity is not None:
            lifts = partial(last_blocks.fill_pairs, table.capacity, level["free"])
        level = _pareto(grown, relative=table.relative, lifts=lifts)
        if size >= subset_cost.MEASURED_MERGE_STATES:
            merge_s_per_state = (time.perf_counter() - began) / size
    return best_cost, _sequence(history, best_ref), True


def _chunk(level: _Arrays, begin: int, size: int) -> _Arrays:
    return {key: value[begin : begin + size] for key, value in level.items()}


def _expand(
    table: _Table, level: _Arrays, begin: int, best_cost: float, grown: list[_Arrays]
) -> tuple[float, int] | None:
    """Bound and expand one chunk; returns (cost, index) of a better complete relaxed plan."""
    part = _chunk(level, begin, table.chunk)
    with np.errstate(invalid="ignore"):  # inf - inf in rows already out of the running
        return _expand_chunk(table, part, begin, best_cost, grown)


def _expand_chunk(
    table: _Table, part: _Arrays, begin: int, best_cost: float, grown: list[_Arrays]
) -> tuple[float, int] | None:
    mask, free, cost = part["mask"], part["free"], part["cost"]
    unplaced = table.unplaced(mask)
    ends = table.ends(free, mask)
    values = table.values(ends)
    floors = np.minimum(values, table.on_new[None, :])
    floor = table.fold(floors, unplaced)
    done = table.done(cost, unplaced, free, mask, best_cost, part.get("pair"))
    better = None
    if done.size and done.min() < best_cost:
        index = int(done.argmin())
        best_cost, better = float(done[index]), (float(done[index]), begin + index)
    alive = table.combine(cost, floor) < best_cost
    eager = table.pairs and table.capacity and not last_blocks.LAZY_PAIRS
    served = table.capacity.served(mask) if eager and table.capacity else None
    for i in range(table.n):
        new_cost = table.combine(cost, values[:, i])
        take = alive & unplaced[:, i] & np.isfinite(ends[:, i]) & table.allowed(part["last"], i)
        take &= table.combine(new_cost, table.others(floors, floor, unplaced, i)) < best_cost
        if take.any():
            child = {
                "mask": mask[take] | table.bits[i],
                "free": ends[take, i],
                "cost": new_cost[take],
                "parent": np.flatnonzero(take) + begin,
                "last": np.full(int(take.sum()), i),
            }
            if last_blocks.LAZY_PAIRS and table.pairs:  # taken in the merge, where needed
                child["pair"] = np.zeros(child["cost"].size)
            elif served is not None and table.capacity is not None:
                cap = table.capacity
                left = unplaced[take]
                left[:, i] = False
                on_new = (left @ (cap.layers * cap.p_new), cap.last_on_new(left))
                child["pair"] = last_blocks.lift_s(
                    cap, i, free[take], served[:, take], ends[take, i], on_new
                )
            grown.append(child)
    return better


def _pareto(
    grown: list[_Arrays],
    *,
    relative: bool = False,
    lifts: Callable[[_Arrays, np.ndarray], None] | None = None,
) -> _Arrays:
    """Per set, the states no other state of the set beats on both O free time and cost (with
    ``relative``, on O free time and ``cost - free``, which implies cost).

    The capacity conditions' crowding term charges a complete state ``(T - free) + ...`` over
    the real last O completion ``T >= free``: that is ``cost - free`` plus a term that does
    not fall as ``free`` grows, so a state beaten on free time and cost alone may complete
    lower than the state that beats it (the other blocks' latencies, ``cost - free``, are
    what its real schedule pays). Under a free order, mean latency, the merge must keep it:
    beaten on ``free`` and ``cost - free`` it is not (a child's ``cost - free`` is its
    parent's cost less the child's release, so the order carries to children). ``lifts``
    (given the states sorted and whether each is kept) sets their pair bound lifts before
    the carry (:func:`~blitzplan.live.bound.last_blocks.fill_pairs`)."""
    merged = {key: np.concatenate([g[key] for g in grown]) for key in grown[0]}
    rank = merged["cost"] - merged["free"] if relative else merged["cost"]
    order = np.lexsort((rank, merged["free"], merged["mask"]))
    merged = {key: value[order] for key, value in merged.items()}
    mask, cost = merged["mask"], rank[order]
    before = np.full(cost.size, math.inf)  # least cost earlier in the same set
    before[1:] = np.where(mask[1:] == mask[:-1], cost[:-1], math.inf)
    starts = np.flatnonzero(np.r_[True, mask[1:] != mask[:-1], True])
    longest = int(np.diff(starts).max()) if cost.size else 0
    shift = 1
    while shift < longest:  # a segmented running minimum, by doubling
        same = mask[shift:] == mask[:-shift]
        before[shift:] = np.where(same, np.minimum(before[shift:], before[:-shift]), before[shift:])
        shift *= 2
    keep = cost < before
    if "pair" in merged:  # the dropped states' pair bound lifts (last_blocks.carry_pairs)
        if lifts is not None:
            lifts(merged, keep)
        last_blocks.carry_pairs(merged, keep, merged["free"])
    return {key: value[keep] for key, value in merged.items()}


def _open_bound(
    table: _Table,
    level: _Arrays,
    begin: int,
    grown: list[_Arrays],
    best_cost: float,
    deadline: float,
    clock: Clock,
) -> float:
    """The least cost any open state could reach: its cost and floor until ``deadline``, its
    cost alone after it (values are never negative, so still a bound)."""
    size = table.chunk
    parts = [_chunk(level, b, size) for b in range(begin, level["cost"].size, size)]
    parts += grown
    bound = best_cost
    for part in parts:
        cost = part["cost"]
        if not cost.size:
            continue
        if clock.passed(deadline):
            bound = min(bound, float(cost.min()))
            continue
        subset_cost.count_chunk(clock, table.n, cost.size)
        unplaced = table.unplaced(part["mask"])
        ends = table.ends(part["free"], part["mask"])
        floors = np.minimum(table.values(ends), table.on_new[None, :])
        bound = min(bound, float(table.combine(cost, table.fold(floors, unplaced)).min()))
    return bound


def _sequence(history: list[_Arrays], ref: tuple[int, int] | None) -> tuple[int, ...] | None:
    """The O sequence of state ``ref`` = (depth, index), read back through the parents."""
    if ref is None:
        return None
    depth, index = ref
    out = []
    while depth > 0:
        out.append(int(history[depth]["last"][index]))
        index = int(history[depth]["parent"][index])
        depth -= 1
    return tuple(reversed(out))
