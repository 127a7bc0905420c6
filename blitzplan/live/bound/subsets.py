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

import time
from collections.abc import Callable
from functools import partial

import numpy as np

from blitzplan.live.bound import last_blocks, pair_history, subset_cost
from blitzplan.live.bound.fronts import staircase
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subset_table import _Cut, _Table
from blitzplan.live.work_meter import WALL_CLOCK, Clock

__all__ = ["subset_search"]

_Arrays = dict[str, np.ndarray]
"""A level: ``mask``, ``free`` (O free time), ``cost``, ``parent`` and ``last`` (the batch
placed last), one entry per state."""


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
    the deadline bound too (:attr:`~.subset_table._Table.deadlines`)."""
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
        if pair_history.OLD_IDLE:  # O's waits' credit (pair_history)
            level["idle"] = np.zeros(1)
        if pair_history.LAST_READY:  # the batches that may end O's blocks (pair_history)
            level["lasts"] = np.zeros(1, dtype=np.int64)
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
            path = (level.get("idle"), level.get("lasts"))
            fill = partial(last_blocks.fill_pairs, table.capacity, level["free"], history=path)
            lifts = _PendingPairs(fill)
        level = _pareto(grown, relative=table.relative, lifts=lifts)
        if lifts is not None:
            lifts.out = level["pair"]
        table.pending = lifts
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
    if served is not None and table.capacity is not None and "lasts" in part:
        served[1] = pair_history.ready_after(table.capacity, mask, part["lasts"])
    # every batch at once (the same element-wise operations as one batch at a time), the
    # children in the order batch by batch, state by state
    new_cost = table.combine(cost[:, None], values)
    take = alive[:, None] & unplaced & np.isfinite(ends) & table.allowed_all(part["last"])
    take &= table.combine(new_cost, table.others_all(floors, floor, unplaced)) < best_cost
    batch, rows = np.nonzero(take.T)
    if not rows.size:
        return better
    child = {
        "mask": mask[rows] | table.bits[batch],
        "free": ends[rows, batch],
        "cost": new_cost[rows, batch],
        "parent": rows + begin,
        "last": batch,
    }
    idle = part["idle"][rows] if "idle" in part else None
    if idle is not None and table.capacity is not None:
        child["idle"] = idle + pair_history.step(table.capacity.starts, batch, free[rows])
    if "lasts" in part:
        child["lasts"] = table.bits[batch]
    if last_blocks.LAZY_PAIRS and table.pairs:  # taken in the merge, where needed
        child["pair"] = np.zeros(rows.size)
    elif served is not None and table.capacity is not None:
        cap = table.capacity
        left = unplaced[rows]
        left[np.arange(rows.size), batch] = False
        on_new = (left @ (cap.layers * cap.p_new), cap.last_on_new(left))
        child["pair"] = last_blocks.lift_s(
            cap, batch, free[rows], served[:, rows], ends[rows, batch], on_new, idle
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
    (given the states sorted and whether each is kept) takes their pair bound lifts and
    carry (:class:`_PendingPairs`: when first needed)."""
    merged = {key: np.concatenate([g[key] for g in grown]) for key in grown[0]}
    rank = merged["cost"] - merged["free"] if relative else merged["cost"]
    order = np.lexsort((rank, merged["free"], merged["mask"]))
    merged = {key: value[order] for key, value in merged.items()}
    keep = staircase(rank[order], merged["mask"])
    if "pair" in merged:  # the dropped states' pair bound lifts (last_blocks.carry_pairs)
        if lifts is not None:  # the lifts, then their carry, taken when first needed
            lifts(merged, keep)
        else:
            last_blocks.carry_pairs(merged, keep, merged["free"])
    if "idle" in merged:  # the dropped states' credits of O's waits
        pair_history.carry(merged, keep)
    if "lasts" in merged:  # and the batches that may end their blocks
        pair_history.carry_lasts(merged, keep)
    return {key: value[keep] for key, value in merged.items()}


class _PendingPairs:
    """A merged level's pair bound lifts (:func:`~blitzplan.live.bound.last_blocks.fill_pairs`,
    then :func:`~blitzplan.live.bound.last_blocks.carry_pairs`), taken when
    :meth:`~.subset_table._Table.done` first needs one: a lift only raises a complete
    state's bound, so it matters only where that bound without it is under the best cost
    (on (80,8) free seed 5 of ``benchmarks/partition.py``, 1.5% of the states, in 12% of
    the chunks). Taken, every lift of the level is, in one call as in the merge, and written
    into the level's ``pair`` (``out``, zero until then), so the values are the merge's."""

    def __init__(self, fill: Callable[[_Arrays, np.ndarray], None]) -> None:
        self.fill = fill
        self.merged: _Arrays | None = None
        self.keep = np.zeros(0, dtype=bool)
        self.out = np.zeros(0)

    def __call__(self, merged: _Arrays | None = None, keep: np.ndarray | None = None) -> None:
        """Given the merge's sorted states and front, keep them; called bare, take the lifts
        (once)."""
        if merged is not None and keep is not None:
            self.merged, self.keep = merged, keep
            return
        if self.merged is None:
            return
        merged, self.merged = self.merged, None
        self.fill(merged, self.keep)
        last_blocks.carry_pairs(merged, self.keep, merged["free"])
        self.out[:] = merged["pair"][self.keep]


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
