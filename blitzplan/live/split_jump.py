"""One batch's split moved far at once: the large moves the local search cannot make.

The local search of :mod:`blitzplan.live.improve` moves a split by 1-4 layers. Between a batch
that finishes on N and one that O serves whole lie splits worse than both (under FIFO a batch
with its last few layers on O holds every later block on O behind its N work), so the search
never crosses them. On (80,16) FIFO seed 1 of ``benchmarks/partition.py`` bnb's 10 s incumbent
ran batch 13 (20.85 ms layers, released at 1.28 s) whole on N, to 6.2 s, and pushed batch 6 to
7.9 s while O stood idle from 2.7 s: served whole by O it lowered the mean latency from 2.149
to 2.035 s.

Here every batch's split is tried at 0, at ``L`` and at the quarters of ``L`` (its first layers
on N kept where they were, added ones placed right after its last one there; a batch entering O
takes its release-order place among O's blocks), each such schedule with the batches it
finishes on N in shortest-first order (:func:`~blitzplan.live.tail_order.reorder_tail`), and
the best such jump is taken while it lowers the value (steepest descent).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import order_value
from blitzplan.live.tail_order import reorder_tail

__all__ = ["JUMP_PARTS", "Orders", "jump_splits", "old_after_move"]

JUMP_PARTS = 4
"""A split jumps to ``q L / JUMP_PARTS`` for ``q = 0..JUMP_PARTS`` (0, the quarters, ``L``)."""

Orders = tuple[list[int], list[int], list[int], float]
"""(split, N order, O order, value)."""


def jump_splits(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Sequence[int],
    old_sequence: Sequence[int],
    objective: str,
    value: float,
    *,
    deadline_s: float,
) -> Orders | None:
    """The schedule steepest descent over split jumps (module docstring) ends at, or None when
    no jump lowers ``value`` (the schedule's); stops at ``deadline_s`` (a
    ``time.perf_counter()`` value) with the best found so far."""
    found: Orders | None = None
    current: Orders = (list(split), list(new_sequence), list(old_sequence), value)
    while time.perf_counter() < deadline_s:
        step = _best_jump(instance, current, objective, deadline_s)
        if step is None:
            break
        found = current = step
    return found


def _best_jump(
    instance: LiveScalingInstance,
    current: Orders,
    objective: str,
    deadline_s: float,
) -> Orders | None:
    """The best schedule one jump from ``current`` if it is better, else None."""
    best: Orders | None = None
    for split, new, old in _jumps(instance, current):
        if time.perf_counter() >= deadline_s:
            break
        bar = current[3] if best is None else best[3]
        value = order_value(instance, split, new, old, objective)
        ordered = reorder_tail(instance, split, new, old, objective, value, every_order=False)
        if ordered is not None:
            new, value = list(ordered[0]), ordered[1]
        if value < bar:
            best = (split, new, old, value)
    return best


def _jumps(
    instance: LiveScalingInstance, current: Orders
) -> Iterator[tuple[list[int], list[int], list[int]]]:
    """(split, N order, O order) of every jump of one batch's split from ``current``."""
    L = instance.num_layers
    split, new, old, _ = current
    for batch, k in enumerate(split):
        mine = [p for p, b in enumerate(new) if b == batch]
        targets = sorted({q * L // JUMP_PARTS for q in range(JUMP_PARTS + 1)} - {k})
        for target in targets:
            moved = list(split)
            moved[batch] = target
            if target < k:
                dropped = set(mine[target:])
                jumped = [b for p, b in enumerate(new) if p not in dropped]
            else:
                after = mine[-1] + 1 if mine else 0
                jumped = [*new[:after], *([batch] * (target - k)), *new[after:]]
            yield moved, jumped, old_after_move(instance, old, batch, k, target)


def old_after_move(
    instance: LiveScalingInstance, old: Sequence[int], batch: int, k: int, target: int
) -> list[int]:
    """O's order ``old`` after ``batch``'s split moves from ``k`` to ``target``: without it at
    ``L``; when it enters O, with it at its release-order place, before the first block released
    after it (under FIFO the order stays FIFO; under the free order the search moves it)."""
    L = instance.num_layers
    if target == L:
        return [b for b in old if b != batch]
    if k < L:
        return list(old)
    rank = instance.fifo_order.index
    at = next((p for p, b in enumerate(old) if rank(b) > rank(batch)), len(old))
    return [*old[:at], batch, *old[at:]]
