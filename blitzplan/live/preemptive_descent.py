"""A descent over the splits and O's order on the preemptive program's score: incumbents the live
exact search misses under a free O order.

The preemptive program (:mod:`blitzplan.live.preemptive_order`) values a split and an O order
with N's operations allowed to be interrupted; its greedy form (:func:`greedy_order`, 1-2 ms on
(32,16)) scores one in a fraction of what a schedule's local search spends. From bnb's 10 s
incumbents on (32,16) free of ``benchmarks/partition.py`` a first-improvement descent on that
score (each batch's split moved by 1-3 layers, to 0 or to ``L``; one O block moved to another
place) ends, list-scheduled in the program's order and polished, below the incumbent: seed 2
0.495221 -> 0.490699 (1 CPU s of descent, 0.5 s of polish), seed 4 0.376525 -> 0.375284
(docs/benchmarks.md, s27-h4). :func:`preemptive_jump` moves one split to 0 or ``L`` only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.preemptive_order import (
    Jump,
    exact_cheap,
    greedy_order,
    list_sequence,
    order_program,
)
from blitzplan.live.schedule import order_value
from blitzplan.live.split_jump import old_after_move

__all__ = ["SPLIT_STEPS", "preemptive_descent"]

SPLIT_STEPS = (-3, -2, -1, 1, 2, 3)
"""How far a batch's split moves in one step of the descent (besides to 0 and to ``L``)."""


def preemptive_descent(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Sequence[int],
    *,
    deadline_s: float,
    free: bool = True,
) -> Jump | None:
    """First-improvement descent from ``split`` and ``old_sequence`` on the preemptive
    program's greedy score (:func:`greedy_order`): a batch's split moved by
    :data:`SPLIT_STEPS`, to 0 or to ``L`` (a batch entering O at its release-order place, one
    leaving it dropped) and, when ``free``, one O block moved to another place; until no step
    lowers the score or ``deadline_s`` (a ``time.perf_counter()`` value). Returns the point
    reached with N list-scheduled in the program's order (the exact program's where it is cheap)
    and its mean latency; None where no step lowered the score."""
    L = instance.num_layers
    best_split = list(split)
    best_old = [b for b in old_sequence if split[b] < L]
    best, _ = greedy_order(instance, best_split, best_old)
    moved_any, better = False, True
    while better and time.perf_counter() < deadline_s:
        better = False
        for batch in range(instance.num_batches):
            k = best_split[batch]
            for target in sorted({0, L, *(k + d for d in SPLIT_STEPS)} - {k}):
                if not 0 <= target <= L or time.perf_counter() >= deadline_s:
                    continue
                trial = [*best_split[:batch], target, *best_split[batch + 1 :]]
                old = old_after_move(instance, best_old, batch, k, target)
                value, _ = greedy_order(instance, trial, old)
                if value < best - 1e-12 * abs(best):
                    best, best_split, best_old, better = value, trial, old, True
                    k = target
        for place in range(len(best_old) if free else 0):
            for to in range(len(best_old)):
                if to == place or time.perf_counter() >= deadline_s:
                    continue
                old = [b for b in best_old if b != best_old[place]]
                old.insert(to, best_old[place])
                value, _ = greedy_order(instance, best_split, old)
                if value < best - 1e-12 * abs(best):
                    best, best_old, better = value, old, True
        moved_any = moved_any or better
    if not moved_any:
        return None
    if exact_cheap(instance, best_split) and time.perf_counter() < deadline_s:
        order = order_program(instance, best_split, best_old)[1]
    else:
        order = greedy_order(instance, best_split, best_old)[1]
    new = list_sequence(instance, best_split, order)
    value = order_value(instance, best_split, new, best_old, "mean_latency")
    return best_split, new, best_old, value
