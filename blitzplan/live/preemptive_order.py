"""N in the preemptive program's order: split jumps the live exact search's incumbents miss.

At fixed splits and a fixed O order, every layer of batch ``i`` on N is work ``pN_i`` released
at its *alone* start (its chain run with N to itself). ``M(S)``, the preemptive makespan of a
set ``S`` of batches' N work, is the largest ``t`` plus ``S``'s work released from ``t`` on. In
any schedule, sorted by the end ``E`` of their N work, the ``m``-th batch ends no earlier than
``M`` of the first ``m`` and its alone end, and every completion is non-decreasing in ``E``
(``E`` itself for a batch N finishes; O's chain from ``E + d`` for a served one). So a dynamic
program over the sets (:func:`order_program`; each served batch's O block starting no earlier
than its O predecessor's least completion) gives a lower bound on every preemptive schedule at
these splits; the preemptive priority schedule in the order it takes met that bound to 1e-15
on every (32,16) FIFO instance of ``benchmarks/partition.py`` s24-h3 tried (docs/benchmarks.md):
there the order is a preemptive optimum's.

The search's schedules keep the N order of their relaxed plans; a split moved far (a batch to
0 or to ``L``) with that order misses what the program's order finds: from bnb's 10 s
incumbents on (32,16) FIFO seed 2, batch 15 served whole by O and N list-scheduled in the
program's order, polished, gives 0.6463712 against 0.6500819 (with bnb's own N order the same
jump polishes back to 0.6500819). :func:`preemptive_jump` scores every jump of one batch's split
to 0 or to ``L`` by the program's greedy form (:func:`greedy_order`, the batch to end last
picked one at a time: the exact program's sets are too many for a short call) and returns the
best one list-scheduled in the program's order (N runs, at each step, the first batch of the
order with a layer ready; the exact program's order up to :data:`EXACT_CELLS`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import order_value, time_old
from blitzplan.live.split_jump import old_after_move

__all__ = [
    "EXACT_CELLS",
    "alone_chains",
    "exact_cheap",
    "greedy_order",
    "list_sequence",
    "makespans",
    "order_program",
    "preemptive_jump",
    "program_point",
]

EXACT_CELLS = 1 << 18
"""The exact program orders a jump while its sets times the release points are at most this
many (on (32,16) a program of 2^16 sets took 10-70 ms of CPU, the greedy form 1-2 ms)."""

_ROWS_CELLS = 1 << 20
"""The most cells (sets times points) one slice of :func:`makespans` holds at once."""

_TOL_S = 1e-12

Jump = tuple[list[int], list[int], list[int], float]
"""(split, N order, O order, value) of a jump's list schedule."""


def alone_chains(
    instance: LiveScalingInstance, split: Sequence[int]
) -> tuple[list[list[float]], list[float]]:
    """Per batch, its N layers' starts with N to itself, and its alone end (its release if it
    runs no layer on N)."""
    starts, ends = [], []
    for i, k in enumerate(split):
        p, end, mine = instance.new_layer_s[i], instance.release_s[i], []
        for layer in range(k):
            mine.append(max(end, instance.usable_s[layer]))
            end = mine[-1] + p
        starts.append(mine)
        ends.append(end)
    return starts, ends


def _work(
    instance: LiveScalingInstance, starts: list[list[float]], items: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The release points of ``items``' layers and, per item, its work released from each."""
    points = np.asarray(sorted({t for i in items for t in starts[i]}), dtype=float)
    work = np.zeros((len(items), points.size))
    for row, i in enumerate(items):
        released = np.searchsorted(points, np.asarray(starts[i], dtype=float))
        for at in released:  # a layer released at points[at] counts at every point up to it
            work[row, : at + 1] += instance.new_layer_s[i]
    return points, work


def makespans(
    instance: LiveScalingInstance, starts: list[list[float]], items: Sequence[int]
) -> np.ndarray:
    """``M(S)`` for every subset ``S`` of ``items`` (bit ``b``: ``items[b]``); -inf for none.
    Sums by doubling over the low bits of a slice (no matrix product: no BLAS threads)."""
    points, work = _work(instance, starts, items)
    m = len(items)
    low = max(0, min(m, int(math.log2(max(1, _ROWS_CELLS // max(1, points.size))))))
    part = np.zeros((1 << low, points.size))
    for b in range(low):
        part[1 << b : 2 << b] = part[: 1 << b] + work[b]
    out = np.empty(1 << m)
    for high in range(1 << (m - low)):
        extra = sum((work[low + b] for b in range(m - low) if high >> b & 1), np.zeros(points.size))
        total = part + extra
        value = np.where(total > 0, points + total, -math.inf).max(axis=1, initial=-math.inf)
        out[high << low : (high + 1) << low] = value
    return out


Cost = Callable[[int, np.ndarray], np.ndarray]


def _costs(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Sequence[int],
    alone: Sequence[float],
) -> Cost:
    """Batch ``i``'s least latency when its N work ends at ``end``: ``end`` itself, or O's
    block from its hand-off, after its O predecessor's least completion."""
    L = instance.num_layers
    least = time_old(instance, split, old_sequence, alone)[1]
    before: dict[int, float] = {}
    prior = -math.inf
    for i in old_sequence:
        before[i], prior = prior, least[i]

    def cost(i: int, end: np.ndarray) -> np.ndarray:
        release = instance.release_s[i]
        if split[i] == L:
            return end - release
        ready = end + instance.handoff_s[i] if split[i] > 0 else np.full(end.shape, release)
        start = np.maximum(np.maximum(before[i], ready), max(release, instance.old_free_at_s))
        return start + (L - split[i]) * instance.old_layer_s[i] - release

    return cost


def _rest(
    instance: LiveScalingInstance, split: Sequence[int], alone: Sequence[float], cost: Cost
) -> float:
    """The latencies of the batches O serves whole (no N work)."""
    whole = [i for i, k in enumerate(split) if k == 0]
    return sum(float(cost(i, np.asarray(alone[i]))) for i in whole)


def order_program(
    instance: LiveScalingInstance, split: Sequence[int], old_sequence: Sequence[int]
) -> tuple[float, list[int]]:
    """The dynamic program's bound on the mean latency of every schedule at ``split`` with O in
    ``old_sequence`` (N preemptive or not), and the order in which it ends the batches' N work
    (module docstring). Its cost is ``2^m`` sets times the release points (``m`` the batches
    with N work)."""
    starts, alone = alone_chains(instance, split)
    items = [i for i, k in enumerate(split) if k > 0]
    cost = _costs(instance, split, old_sequence, alone)
    makespan = makespans(instance, starts, items)
    m = len(items)
    masks = np.arange(1 << m)
    count = sum(((masks >> b) & 1 for b in range(m)), np.zeros(masks.size, dtype=int))
    value, arg = np.full(masks.size, math.inf), np.full(masks.size, -1)
    value[0] = 0.0
    for size in range(1, m + 1):
        sets = masks[count == size]
        best, pick = np.full(sets.size, math.inf), np.full(sets.size, -1)
        for b in range(m):
            has = (sets >> b) & 1 == 1
            some = sets[has]
            v = value[some ^ (1 << b)] + cost(items[b], np.maximum(alone[items[b]], makespan[some]))
            better = v < best[has]
            best[has], pick[has] = np.where(better, v, best[has]), np.where(better, b, pick[has])
        value[sets], arg[sets] = best, pick
    order, s = [], masks.size - 1
    while s:
        order.append(items[arg[s]])
        s ^= 1 << int(arg[s])
    total = float(value[-1]) + _rest(instance, split, alone, cost)
    return total / instance.num_batches, order[::-1]


def greedy_order(
    instance: LiveScalingInstance, split: Sequence[int], old_sequence: Sequence[int]
) -> tuple[float, list[int]]:
    """The program's order built from the back, greedily: of the batches left, the one to end
    their N work last is the one whose latency ending at their makespan exceeds its least
    (its alone end) the least, ties to the one whose removal lowers the makespan most; with
    the mean latency of that assignment (each batch ending at the makespan of itself and the
    batches before it: a score, not a bound). ``m^2`` makespans of one set each."""
    starts, alone = alone_chains(instance, split)
    items = [i for i, k in enumerate(split) if k > 0]
    cost = _costs(instance, split, old_sequence, alone)
    points, work = _work(instance, starts, items)
    left, total, order = list(range(len(items))), work.sum(axis=0), []
    value = 0.0

    def span(w: np.ndarray) -> float:
        return float(np.where(w > _TOL_S, points + w, -math.inf).max(initial=-math.inf))

    while left:
        end = span(total)
        late = {b: float(cost(items[b], np.asarray(max(end, alone[items[b]])))) for b in left}
        keys = {
            b: (late[b] - float(cost(items[b], np.asarray(alone[items[b]]))), span(total - work[b]))
            for b in left
        }
        b = min(left, key=keys.__getitem__)
        value += late[b]
        left.remove(b)
        total = total - work[b]
        order.append(items[b])
    value += _rest(instance, split, alone, cost)
    return value / instance.num_batches, order[::-1]


def list_sequence(
    instance: LiveScalingInstance, split: Sequence[int], order: Sequence[int]
) -> list[int]:
    """N's order of layers when N runs, whenever it is free, the first batch of ``order`` whose
    next layer is ready (its arrival, its batch's release and its earlier layer passed), or
    else waits for the first layer to be ready. ``order`` lists every batch with N work."""
    rank = {batch: q for q, batch in enumerate(order)}
    done = {i: 0 for i in order if split[i] > 0}
    last = {i: instance.release_s[i] for i in done}
    clock, sequence = 0.0, []
    while done:
        ready = {i: max(last[i], instance.usable_s[done[i]]) for i in done}
        soonest = min(ready.values())
        clock = max(clock, soonest)
        batch = min((i for i in done if ready[i] <= clock + _TOL_S), key=rank.__getitem__)
        clock = last[batch] = clock + instance.new_layer_s[batch]
        sequence.append(batch)
        done[batch] += 1
        if done[batch] == split[batch]:
            del done[batch]
    return sequence


def exact_cheap(instance: LiveScalingInstance, split: Sequence[int]) -> bool:
    """Whether :func:`order_program` is cheap enough at ``split`` (:data:`EXACT_CELLS`)."""
    m = sum(1 for k in split if k > 0)
    points = len({t for chain in alone_chains(instance, split)[0] for t in chain})
    return (1 << m) * max(1, points) <= EXACT_CELLS


def preemptive_jump(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Sequence[int],
    *,
    deadline_s: float,
) -> Jump | None:
    """The jump of one batch's split to 0 or to ``L`` that the program's greedy form scores
    least (:func:`greedy_order`: on bnb's 10 s incumbents of (32,16) FIFO, seeds 0-9, it
    picked the exact program's best jump every time at 1/5-1/25 of its CPU), N
    list-scheduled in the program's order (the exact program's where it is cheap,
    :data:`EXACT_CELLS`) and O in ``old_sequence`` (a batch entering O at its release-order
    place, one leaving it dropped); None when no jump was scored before ``deadline_s`` (a
    ``time.perf_counter()`` value: no program starts past it). Mean latency."""
    L = instance.num_layers
    best: tuple[float, list[int], list[int], list[int]] | None = None
    for batch, k in enumerate(split):
        for target in sorted({0, L} - {k}):
            if time.perf_counter() >= deadline_s:
                break
            moved = [*split[:batch], target, *split[batch + 1 :]]
            old = old_after_move(instance, old_sequence, batch, k, target)
            value, order = greedy_order(instance, moved, old)
            if best is None or value < best[0]:
                best = (value, moved, order, old)
    if best is None:
        return None
    _, moved, order, old = best
    return program_point(instance, moved, order, old, deadline_s)


def program_point(
    instance: LiveScalingInstance,
    split: list[int],
    order: list[int],
    old: list[int],
    deadline_s: float,
) -> Jump:
    """``split`` and O's order ``old`` with N list-scheduled in the preemptive program's order:
    the exact program's where it is cheap (:func:`exact_cheap`) and ``deadline_s`` has not
    passed, else ``order`` (its greedy form's); and its mean latency."""
    if exact_cheap(instance, split) and time.perf_counter() < deadline_s:
        order = order_program(instance, split, old)[1]
    new = list_sequence(instance, split, order)
    return split, new, old, order_value(instance, split, new, old, "mean_latency")
