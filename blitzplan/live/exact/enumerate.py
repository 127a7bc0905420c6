"""Exhaustive search for the live-scaling problem: the test oracle, for tiny instances only.

Some optimal schedule is semi-active (every operation starts as early as the orders allow), so
trying every split, every interleaving of the batches' layers on N and every order of the blocks
on O, each timed by :func:`~blitzplan.live.schedule.timetable`, finds the optimum. No pruning,
no cleverness: its answers are what the other backends are tested against.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence

from blitzplan.errors import InvalidInputError
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import (
    Schedule,
    build_schedule,
    empty_schedule,
    lower_bound,
    order_value,
)
from blitzplan.solvers.backends import SolveStatus

__all__ = ["MAX_SCHEDULES", "count_schedules", "solve_enumerate"]

MAX_SCHEDULES = 200_000
"""The most (split, N order, O order) combinations the oracle agrees to try."""


def _interleavings(counts: list[int]) -> Iterator[tuple[int, ...]]:
    """Every sequence holding batch ``b`` exactly ``counts[b]`` times."""
    total, sequence = sum(counts), list[int]()

    def extend() -> Iterator[tuple[int, ...]]:
        if len(sequence) == total:
            yield tuple(sequence)
            return
        for batch, left in enumerate(counts):
            if left:
                counts[batch] -= 1
                sequence.append(batch)
                yield from extend()
                sequence.pop()
                counts[batch] += 1

    return extend()


def _old_orders(
    instance: LiveScalingInstance, split: Sequence[int], old_order: str
) -> Iterator[tuple[int, ...]]:
    on_old = [b for b in instance.fifo_order if split[b] < instance.num_layers]
    if old_order == "fifo":
        return iter([tuple(on_old)])
    return itertools.permutations(on_old)


def count_schedules(instance: LiveScalingInstance, *, old_order: str = "free") -> int:
    """How many combinations :func:`solve_enumerate` would time."""
    L, n = instance.num_layers, instance.num_batches
    if (L + 1) ** n > MAX_SCHEDULES:
        return int((L + 1) ** n)
    total = 0
    for split in itertools.product(range(L + 1), repeat=n):
        orders = _multinomial(split)
        on_old = sum(1 for k in split if k < L)
        total += orders * (1 if old_order == "fifo" else math.factorial(on_old))
    return total


def _multinomial(counts: Sequence[int]) -> int:
    out, seen = 1, 0
    for count in counts:  # the number of orders of a multiset: a product of binomials
        seen += count
        out *= math.comb(seen, count)
    return out


def solve_enumerate(
    instance: LiveScalingInstance,
    *,
    objective: str,
    old_order: str = "free",
    time_limit_s: float | None = None,
) -> Schedule:
    """The optimum by exhaustion: OPTIMAL, INFEASIBLE (hard SLO), or FEASIBLE at the time limit."""
    size = count_schedules(instance, old_order=old_order)
    if size > MAX_SCHEDULES:
        raise InvalidInputError(
            f"backend 'enumerate' is exhaustive and for tiny instances only: this one has "
            f"{size:,} combinations (limit {MAX_SCHEDULES:,}); use backend 'highs', 'cbc' or "
            "'cpsat'"
        )
    started = time.perf_counter()
    best: tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None = None
    timed_out = False
    for split in itertools.product(range(instance.num_layers + 1), repeat=instance.num_batches):
        for new_sequence in _interleavings(list(split)):
            for old_sequence in _old_orders(instance, split, old_order):
                value = order_value(instance, split, new_sequence, old_sequence, objective)
                if best is None or value < best[0]:
                    best = (value, split, new_sequence, old_sequence)
        if time_limit_s is not None and time.perf_counter() - started > time_limit_s:
            timed_out = True
            break
    if best is None or (math.isinf(best[0]) and not timed_out):
        return empty_schedule(
            status=SolveStatus.INFEASIBLE,
            objective=objective,
            method="exact",
            backend="enumerate",
            old_order=old_order,
            solve_s=time.perf_counter() - started,
            message="no schedule meets every SLO",
        )
    value, split, new_sequence, old_sequence = best
    return build_schedule(
        instance,
        split,
        new_sequence,
        old_sequence,
        objective=objective,
        method="exact",
        backend="enumerate",
        old_order=old_order,
        status=SolveStatus.FEASIBLE if timed_out else SolveStatus.OPTIMAL,
        bound=lower_bound(instance, objective) if timed_out else value,
        solve_s=time.perf_counter() - started,
    )
