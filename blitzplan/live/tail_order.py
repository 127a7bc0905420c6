"""The batches a schedule finishes on N, re-ordered among themselves on N.

A schedule's N order serves two kinds of batches: those O takes over (their layers on N are
due before their hand-off) and those that finish on N (``split = L``), whose completions are
N's alone. Keeping the first kind's operations where they are, the second kind's fill N's
time around them in a priority order: whenever N is free, the highest-priority batch whose
next layer can start soonest runs it, if it ends before the next kept operation's start (else
that operation runs). The kept operations then start no later than before (the O side does
not move), and with a sum objective the batches that finish on N are best served shortest
first: on (32,16) FIFO seed 7 of ``benchmarks/partition.py`` bnb's 10 s incumbent went from
0.641777 to 0.625691 so (its four batches on N had shared N layer by layer), seed 1 from
0.844571 to 0.832560. Every priority order is tried while there are at most
:data:`ALL_ORDERS_UP_TO` such batches, else shortest first and its neighbouring swaps (or,
when asked for few, shortest first alone); the best re-timed order is returned only when it
beats the schedule's value.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import order_value, time_new

__all__ = ["ALL_ORDERS_UP_TO", "reorder_tail"]

ALL_ORDERS_UP_TO = 4
"""Up to this many batches finishing on N, every priority order among them is tried (24)."""

_TOL_S = 1e-12


def reorder_tail(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Sequence[int],
    old_sequence: Sequence[int],
    objective: str,
    value: float,
    *,
    every_order: bool = True,
) -> tuple[tuple[int, ...], float] | None:
    """(N order, its value) of the best priority order among the batches that finish on N
    (see the module docstring), or None when none beats ``value`` (the schedule's); without
    ``every_order`` only shortest first is tried."""
    L = instance.num_layers
    tail = [i for i, k in enumerate(split) if k == L]
    if not tail:
        return None
    new_ops = time_new(instance, split, new_sequence)[0]
    kept = sorted((op.start_s, op.batch) for op in new_ops if split[op.batch] < L)
    best: tuple[tuple[int, ...], float] | None = None
    for priority in _priorities(instance, tail, every_order):
        order = _fill(instance, split, kept, priority)
        found = order_value(instance, split, order, old_sequence, objective)
        if found < (value if best is None else best[1]):
            best = (order, found)
    return best


def _priorities(
    instance: LiveScalingInstance, tail: list[int], every_order: bool
) -> Iterator[list[int]]:
    shortest = sorted(tail, key=lambda i: (instance.new_layer_s[i], i))
    if every_order and len(tail) <= ALL_ORDERS_UP_TO:
        yield from (list(p) for p in itertools.permutations(shortest))
        return
    yield shortest
    if not every_order:
        return
    for a in range(len(shortest) - 1):
        swapped = list(shortest)
        swapped[a], swapped[a + 1] = swapped[a + 1], swapped[a]
        yield swapped


def _fill(
    instance: LiveScalingInstance,
    split: Sequence[int],
    kept: list[tuple[float, int]],
    priority: list[int],
) -> tuple[int, ...]:
    """N's order: the ``kept`` operations (start, batch) in their order, the batches of
    ``priority`` filling N's time before each (see the module docstring)."""
    usable, p = instance.usable_s, instance.new_layer_s
    done = [0] * instance.num_batches
    last = list(instance.release_s)
    order: list[int] = []
    clock, at = 0.0, 0
    total = sum(split)
    while len(order) < total:
        limit = kept[at][0] if at < len(kept) else math.inf
        pick: tuple[float, int] | None = None
        for i in priority:
            if done[i] == split[i]:
                continue
            start = max(clock, usable[done[i]], last[i])
            if start + p[i] > limit + _TOL_S:
                continue
            if pick is None or start < pick[0] - _TOL_S:
                pick = (start, i)
            if start <= clock + _TOL_S:
                break
        if pick is not None and (pick[0] <= clock + _TOL_S or pick[0] < max(clock, limit)):
            start, batch = pick
        else:  # the kept operation (one is left: every batch of priority has ended)
            batch = kept[at][1]
            at += 1
            start = max(clock, usable[done[batch]], last[batch])
        clock = last[batch] = start + p[batch]
        done[batch] += 1
        order.append(batch)
    return tuple(order)
