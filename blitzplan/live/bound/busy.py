"""The busy bound: N's work, counted in a relaxation's states, pays for the last completion.

Every operation of N runs on N, one at a time. Fix a time ``t`` and count ``W``, the work of
the operations that cannot start before ``t`` (a layer of a batch starts on N no earlier than
its alone chain lets it: its release, the layers' arrivals, a node's start limits, its own
earlier layers). When ``W > 0`` N's last operation ends at ``t + W`` or later, and so does the
batch it belongs to: the last completion is at least ``M = t + W``. With per-batch lower bounds
``e_i`` on the completions (sorted, they bound the sorted completions), the total latency is at
least ``sum e_i - max e_i + max(max e_i, M)``.

The N-capacity relaxation picks each batch's split for O alone: it does not know ``W``. Here
its dynamic program under FIFO (:mod:`blitzplan.live.bound.subsets`: O serves the batches
it takes in release order, the others finish on N) carries ``W`` in its states: a state is the
set O served so far, O's free time, the cost so far and the work after ``t`` of the served
batches' splits; every split of a batch is a child (its completion lifted by the shared-work
condition, :meth:`~blitzplan.live.bound.conditions.Capacity.shared`) but one that ends no
earlier than a smaller split of the same state (that one has no more work after ``t``, and the
charge does not fall as O's free time or the work grow: it is dropped before the merge, which
halved the program's time on (32,16) FIFO seeds 3, 4 and 9). The batches left on N
add all their layers' work after ``t`` and their own order-statistic bound
(:meth:`~blitzplan.live.bound.conditions.Capacity.left_on_new`). States are merged per set
and work level (``W`` rounded down to :data:`BUSY_GRID_S`) to the Pareto front of O's free time
and ``cost - free`` (the charge ``free + (M - max(free, ...))^+`` does not fall as ``free``
grows, and a child's ``cost - free`` is its parent's cost less its release); each kept state
carries the least ``W`` of its merged group, so a dropped state is charged no more work than it
has. A state whose cost and least remaining cost reach the target is dropped.

Mean latency, O in FIFO order only. On (32,16) of ``benchmarks/partition.py`` (FIFO, the root,
against the best 10 s incumbents) the capacity program is 0.384% under on seed 4; this bound,
counted from ``a_5`` (where the incumbent keeps N busy to its end), 0.076%. On seeds 3, 5 and 9
it stays under the capacity program from ``a_1``, ``a_3`` and ``a_5`` (0.82 / 1.67 / 0.12% at
best, against 0.77 / 1.62 / 0.12%): those are s18-h1's program, before the child filter and
the coarser merges above (which raised seed 4's root bound from 0.476356 to 0.476563 and gave
seed 5 one, 1.8% under its incumbent, where it had none).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import numpy as np

from blitzplan.live.bound.conditions import Capacity
from blitzplan.live.bound.relaxation import Relaxation
from blitzplan.live.bound.subset_table import _Table
from blitzplan.live.bound.subsets import _pareto

__all__ = ["BUSY_GRID_S", "busy_bound", "busy_point"]

BUSY_GRID_S = 0.001
"""The work levels states are merged at (seconds of N's work; not tuned: coarser levels merge
more states, whose least work then charges less)."""

BUSY_MAX_CHILDREN = 2_000_000
"""The most children one step may have: past it the search stops (-inf)."""

BUSY_MAX_STATES = 40_000
"""The most states a merge keeps at one work grid: past it the states are merged again at a
grid four times coarser, up to :data:`BUSY_MAX_GRID_S` (on (32,16) FIFO seed 5 of
``benchmarks/partition.py`` the 1 ms grid kept 105,000 states and the next step passed
:data:`BUSY_MAX_CHILDREN`)."""

BUSY_MAX_GRID_S = 1.0
"""The coarsest grid (one level per set on the benchmark's classes)."""

BUSY_MERGE_S_PER_STATE = 1e-6
"""A merge's expected seconds per child left after the floor (sort, groups, Pareto front; about
half of it measured on (32,16)) until a merge is measured (:data:`BUSY_MEASURED_STATES`): a
merge expected to end past the time allowed is not started."""

BUSY_MEASURED_STATES = 10_000
"""Merges of at least this many states set the time per state the next is judged by (at least
:data:`BUSY_MERGE_S_PER_STATE`: on a loaded machine a merge takes longer)."""

BUSY_FRONT_STATES = 20_000
"""States a merge takes together: a larger merge is split by ranges of its keys (the same
front, in the same order) and the clock is read between the parts (on (32,16) FIFO one merge
took up to 110 ms of CPU in a node, and a merge's first time per state is a guess)."""

BUSY_FLOOR_STATES = 200_000
"""Children whose least remaining cost is taken together, batch by batch, the clock read
between parts (2,000,000 children took up to 0.1 s of CPU a batch on (32,16) FIFO)."""

_EPS_S = 1e-9
"""How far before ``t`` a start still counts as not before it (the work is charged from ``t``
less this: a start computed as an end less ``pN`` may round just under ``t``)."""

_SHIFT = 24
"""The bits of a state's merge key below its set (its work level)."""


def busy_point(relax: Relaxation, split: Sequence[int]) -> float:
    """The layer arrival ``t`` where ``split`` (a schedule's splits) keeps N busiest: the
    largest ``t`` plus the work that cannot start before ``t`` (the point to count ``W`` at)."""
    inst = relax.instance
    best, point = -math.inf, inst.usable_s[0]
    for at in sorted(set(inst.usable_s)):
        work = sum(_after(relax, i, at)[k] for i, k in enumerate(split))
        if work > 0 and at + work > best:
            best, point = at + work, at
    return point


def _after(relax: Relaxation, i: int, at: float) -> np.ndarray:
    """``[k]``: the work of batch ``i``'s first ``k`` layers that cannot start on N before
    ``at`` (its alone chain's starts, each its end less ``pN``: rounded, so compared with
    ``at`` less :data:`_EPS_S`, the time the work is then charged from)."""
    p = relax.instance.new_layer_s[i]
    starts = np.asarray(relax.options[i].chain_end[1:]) - p
    return np.concatenate([[0.0], np.cumsum(np.where(starts >= at - _EPS_S, p, 0.0))])


def busy_bound(relax: Relaxation, upper: float, at: float, until: float) -> float:
    """A bound, in cost units, on every schedule that keeps ``relax``'s restriction (mean
    latency, O in FIFO order), counting N's work from ``at`` (see the module docstring): at
    most ``upper`` (states that cannot beat it are dropped); ``-inf`` when cut short by
    ``until`` (a ``time.perf_counter()`` instant) or when the sets do not fit a key."""
    inst = relax.instance
    n = inst.num_batches
    if relax.obj.name != "mean_latency" or n + _SHIFT > 62:
        return -math.inf
    table = _Table(relax, capacity=True, fifo=True)
    cap = table.capacity
    if cap is None:  # _Table builds it when asked (capacity=True)
        raise RuntimeError("the busy bound's table has no capacity program")
    after = [_after(relax, i, at) for i in range(n)]
    level = {
        "mask": np.zeros(1, dtype=np.int64),
        "free": np.array([inst.old_free_at_s]),
        "cost": np.zeros(1),
        "work": np.zeros(1),
        "held": np.zeros(1),  # the on-N-alone values of the batches left so far
    }
    order = list(inst.fifo_order)
    rate = BUSY_MERGE_S_PER_STATE  # a merge's expected seconds per state
    for pos, i in enumerate(order):
        parts = [level] if math.isfinite(table.on_new[i]) else []
        children = _children(table, cap, level, i, after, until)
        if children is None:
            return -math.inf
        parts += children
        if not parts:
            return upper
        if sum(part["cost"].size for part in parts) > BUSY_MAX_CHILDREN:
            return -math.inf
        merged = _merge(table, parts, order[pos + 1 :], upper, i, until, rate)
        if merged is None:
            return -math.inf
        level, rate = merged
        if not level["cost"].size:
            return upper
    return min(upper, float(_charged(table, cap, level, after, at).min()))


def _children(
    table: _Table,
    cap: Capacity,
    level: dict[str, np.ndarray],
    i: int,
    after: list[np.ndarray],
    until: float,
) -> list[dict[str, np.ndarray]] | None:
    """``level``'s states grown by batch ``i`` served next on O, one child per split in its
    range that ends before every smaller one (its completion lifted by the shared work); None
    past ``until``."""
    relax = table.relax
    inst = relax.instance
    low = relax.restriction.split_min[i]
    high = min(relax.restriction.split_max[i], inst.num_layers - 1)
    if time.perf_counter() >= until:
        return None
    if low > high:
        return []
    mask, free, cost = level["mask"], level["free"], level["cost"]
    lift = cap.shared(cap.served(mask), i, free)
    opts, out = relax.options[i], []
    least = np.full(free.shape, math.inf)  # per state, the least end of a smaller split
    for k in range(low, high + 1):
        if time.perf_counter() >= until:
            return None
        ready = table.release[i] if k == 0 else opts.chain_end[k] + inst.handoff_s[i]
        end = np.maximum(
            np.maximum(free, ready) + (inst.num_layers - k) * inst.old_layer_s[i], lift
        )
        keep = end < least  # else a smaller split ends no later with no more work after t
        least = np.minimum(least, end)
        out.append(
            {
                "mask": mask[keep] | table.bits[i],
                "free": end[keep],
                "cost": cost[keep] + end[keep] - table.release[i],
                "work": level["work"][keep] + after[i][k],
                "held": level["held"][keep],
            }
        )
    return out


def _merge(
    table: _Table,
    parts: list[dict[str, np.ndarray]],
    rest: list[int],
    upper: float,
    i: int,
    until: float,
    rate: float,
) -> tuple[dict[str, np.ndarray], float] | None:
    """The children that can still beat ``upper`` (their cost, the batches left so far alone
    on N and the least of each later batch), per set and work level on their Pareto front;
    None when that would end past ``until`` at ``rate`` seconds a state; with the rate to
    expect of the next (this one's, when it merged at least :data:`BUSY_MEASURED_STATES`, and
    never under :data:`BUSY_MERGE_S_PER_STATE`)."""
    grown = {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
    left = (grown["mask"] & table.bits[i]) == 0
    grown["held"] = grown["held"] + np.where(left, table.on_new[i], 0.0)
    floor = grown["cost"] + grown["held"]
    for j in rest:
        for begin in range(0, floor.size, BUSY_FLOOR_STATES):
            if time.perf_counter() >= until:
                return None
            part = slice(begin, begin + BUSY_FLOOR_STATES)
            placed = table.end(j, grown["free"][part], None) - table.release[j]
            floor[part] += np.minimum(placed, table.on_new[j])
    keep = floor < upper
    grown = {key: value[keep] for key, value in grown.items()}
    began, size = time.perf_counter(), int(keep.sum())
    if began + rate * size >= until:
        return None
    grid, kept = BUSY_GRID_S, grown
    while True:  # coarser levels while too many states are kept (each a valid merge)
        front = _front_by_parts(kept, grid, until)
        if front is None:
            return None
        kept = front
        if size >= BUSY_MEASURED_STATES:
            rate = max(BUSY_MERGE_S_PER_STATE, (time.perf_counter() - began) / size)
        if kept["cost"].size <= BUSY_MAX_STATES or grid >= BUSY_MAX_GRID_S:
            return kept, rate
        began, size = time.perf_counter(), kept["cost"].size
        if began + rate * size >= until:
            return None
        grid *= 4


def _front_by_parts(
    states: dict[str, np.ndarray], grid: float, until: float
) -> dict[str, np.ndarray] | None:
    """:func:`_front` of ``states``, :data:`BUSY_FRONT_STATES` at a time by ranges of their
    keys (ascending: the parts' fronts, joined, are the whole front in its order); None when
    the clock reaches ``until`` between parts."""
    size = states["cost"].size
    parts = -(-size // BUSY_FRONT_STATES)
    if parts <= 1:
        return _front(states, grid)
    key = _key(states, grid)
    sample = np.sort(key[:: max(1, size // (8 * parts))])
    cuts = np.unique(sample[(np.arange(1, parts) * sample.size) // parts])
    block = np.searchsorted(cuts, key, side="right")
    fronts = []
    for part in range(cuts.size + 1):
        if time.perf_counter() >= until:
            return None
        rows = np.flatnonzero(block == part)
        if rows.size:
            part_states = {name: value[rows] for name, value in states.items()}
            fronts.append(_front(part_states, grid))
    return {name: np.concatenate([front[name] for front in fronts]) for name in fronts[0]}


def _key(states: dict[str, np.ndarray], grid: float) -> np.ndarray:
    """Each state's merge key: its set, then its work level (``grid`` seconds)."""
    level = np.floor(states["work"] / grid).astype(np.int64)
    return np.asarray((states["mask"] << _SHIFT) | np.minimum(level, (1 << _SHIFT) - 1))


def _front(states: dict[str, np.ndarray], grid: float) -> dict[str, np.ndarray]:
    """``states`` per set and work level (``grid`` seconds) on their Pareto front, each kept
    state carrying the least work of its group (a dropped state is charged no more work than
    it has)."""
    key = _key(states, grid)
    groups, index = np.unique(key, return_inverse=True)
    least = np.full(groups.size, math.inf)
    np.minimum.at(least, index, states["work"])
    grown = {**states, "work": least[index], "set": states["mask"], "mask": key}
    kept = _pareto([grown], relative=True)
    kept["mask"] = kept.pop("set")
    return kept


def _charged(
    table: _Table, cap: Capacity, level: dict[str, np.ndarray], after: list[np.ndarray], at: float
) -> np.ndarray:
    """Each complete state's bound: its cost, the batches left on N (the larger of their
    values alone and their order-statistic bound) and the last completion's charge."""
    unplaced = table.unplaced(level["mask"])
    alone_ends = np.where(unplaced, cap.alone_end, -math.inf).max(axis=1)
    total, last = cap.left_on_new(unplaced)
    left = np.maximum(level["held"], total)
    work = level["work"] + unplaced.astype(float) @ np.asarray([a[-1] for a in after])
    top = np.maximum(level["free"], np.maximum(last, alone_ends))  # the largest e_i
    return np.asarray(level["cost"] + left + last_charge(work, at - _EPS_S, top))


def last_charge(work: np.ndarray, at: float, top: np.ndarray) -> np.ndarray:
    """What the last completion adds: ``(at + work - top)^+`` where there is work after
    ``at`` (``top``: the largest per-batch bound the rest counts)."""
    return np.asarray(np.where(work > 0, np.maximum(0.0, at + work - top), 0.0))
