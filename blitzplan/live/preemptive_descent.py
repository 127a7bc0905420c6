"""A descent over the splits on the preemptive program's score: schedules the search misses.

:func:`~blitzplan.live.preemptive_order.preemptive_jump` moves one batch's split to 0 or to
``L``. From bnb's 10 s incumbent of ``benchmarks/partition.py``'s (80,16) FIFO seed 8
(1.302665, the best known since the twenty-second session) the better schedules lie several
moves away: one of the batches N finished served by O, another finished on N, the served
batches' splits raised (1.271168, N list-scheduled in the program's order and polished;
docs/benchmarks.md, s27-h3). :func:`preemptive_descent` scores split vectors by the program's
greedy form (:func:`~blitzplan.live.preemptive_order.greedy_order`, 1-3 ms at these sizes) and
moves each batch's split to 0, to ``L`` or by :data:`STEPS` layers while the score falls (first
improvement); from the given splits first, then, while time is left, from kicked starts (one
batch at an end moved to the middle, :func:`kicks`). The least split vector found is
list-scheduled in the program's order. The score is not a bound: the schedule is only offered.

Under a free O order (``free``) one O block moved to another place is a step too, and a split
moves by :data:`FREE_STEPS`: from bnb's 10 s incumbents on (32,16) free the descent ended,
list-scheduled in the program's order and polished, below the incumbent: seed 2 0.495221 ->
0.490699 (1 CPU s of descent, 0.5 s of polish), seed 4 0.376525 -> 0.375284
(docs/benchmarks.md, s27-h4).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.preemptive_order import Jump, greedy_order, program_point
from blitzplan.live.split_jump import old_after_move

__all__ = ["FREE_STEPS", "STEPS", "kicks", "preemptive_descent"]

STEPS = (-8, -4, -2, -1, 1, 2, 4, 8)
"""The split moves of the descent besides 0 and ``L`` (O's order FIFO)."""

FREE_STEPS = (-3, -2, -1, 1, 2, 3)
"""The split moves besides 0 and ``L`` under a free O order, where O's blocks move too."""

_Scored = tuple[float, list[int], list[int], list[int]]
"""(greedy score, split, N order of the program, O order)."""


def _moved(
    instance: LiveScalingInstance, split: list[int], old: list[int], batch: int, target: int
) -> tuple[list[int], list[int]]:
    k = split[batch]
    return [*split[:batch], target, *split[batch + 1 :]], old_after_move(
        instance, old, batch, k, target
    )


def _descend(
    instance: LiveScalingInstance,
    current: _Scored,
    deadline_s: float,
    steps: Sequence[int],
    free: bool,
) -> tuple[_Scored, bool]:
    """First-improvement descent from ``current`` (a batch's split moved by ``steps``, to 0 or
    to ``L``; with ``free`` one O block moved to another place); (the local minimum or the
    best by the deadline, whether the deadline cut it)."""
    L, n = instance.num_layers, instance.num_batches
    better = True
    while better:
        better = False
        for batch in range(n):
            k = current[1][batch]
            for target in sorted({0, L, *(k + d for d in steps)} - {k}):
                if not 0 <= target <= L:
                    continue
                if time.perf_counter() >= deadline_s:
                    return current, True
                split, old = _moved(instance, current[1], current[3], batch, target)
                value, order = greedy_order(instance, split, old)
                if value < current[0] - 1e-12:
                    current, better = (value, split, order, old), True
        for place in range(len(current[3]) if free else 0):
            for to in range(len(current[3])):
                if to == place:
                    continue
                if time.perf_counter() >= deadline_s:
                    return current, True
                old = [b for b in current[3] if b != current[3][place]]
                old.insert(to, current[3][place])
                value, order = greedy_order(instance, current[1], old)
                if value < current[0] - 1e-12:
                    current, better = (value, current[1], order, old), True
    return current, False


def kicks(instance: LiveScalingInstance, split: Sequence[int]) -> Iterator[tuple[int, int]]:
    """The kicked starts of :func:`preemptive_descent`, as (batch, new split): each batch whose
    split is 0 or ``L`` moved to ``L // 2``, the batches O serves whole first, the latest
    released first (on (80,16) FIFO seed 8 the kicks of batches 14 and 15 found the least
    score)."""
    L = instance.num_layers
    late = sorted(range(len(split)), key=lambda i: -instance.release_s[i])
    ends = [i for i in late if split[i] == 0] + [i for i in late if split[i] == L]
    for batch in ends:
        yield batch, L // 2


def preemptive_descent(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Sequence[int],
    *,
    deadline_s: float,
    free: bool = False,
) -> Jump | None:
    """The least split vector (and, with ``free``, O order) the descent (module docstring)
    finds from ``split`` (O in ``old_sequence``) and its kicked starts by ``deadline_s`` (a
    ``time.perf_counter()`` value), with N list-scheduled in the program's order (the exact
    program's where it is cheap) and its mean latency; None when nothing scored under
    ``split`` itself."""
    if time.perf_counter() >= deadline_s:
        return None
    first = list(split), list(old_sequence)
    value, order = greedy_order(instance, *first)
    origin = value
    steps = FREE_STEPS if free else STEPS
    best, cut = _descend(instance, (value, first[0], order, first[1]), deadline_s, steps, free)
    for batch, target in [] if cut else kicks(instance, split):
        if time.perf_counter() >= deadline_s:
            break
        moved, old = _moved(instance, list(split), list(old_sequence), batch, target)
        value, order = greedy_order(instance, moved, old)
        found, cut = _descend(instance, (value, moved, order, old), deadline_s, steps, free)
        if found[0] < best[0]:
            best = found
        if cut:
            break
    if best[0] >= origin - 1e-12:
        return None
    _, moved, order, old = best
    return program_point(instance, moved, order, old, deadline_s)
