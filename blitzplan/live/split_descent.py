"""Split descent with N in the preemptive program's order: incumbents the live exact search's
split moves miss.

:func:`~blitzplan.live.preemptive_order.preemptive_jump` moves one batch's split to 0 or to
``L``. Some better schedules lie at a split no single move of the local search
(:func:`~blitzplan.live.improve.polish`, N's order kept) reaches: on (80,8) FIFO seed 7 of
``benchmarks/partition.py`` every incumbent of bnb (10 and 60 CPU s) finishes batches 1 and 6
on N (1.8646-1.8652), where serving batch 6 with about 50 layers on N and moving the other
splits a little, with N list-scheduled in the preemptive program's order, gives 1.8335, and
polished 1.8277 (docs/benchmarks.md, s27-h2). :func:`split_descent` walks one batch's split at
a time by the steps :data:`STEPS` (to and from ``L`` included: a batch then leaves or enters
O's order at its release-order place), each split valued by the preemptive program
(:func:`~blitzplan.live.preemptive_order.order_program` where that is cheap, else its greedy
form), keeps a move as soon as it lowers that value, and list-schedules N at the end in the
program's order (:func:`~blitzplan.live.preemptive_order.list_sequence`). Guided by the
program (a bound at each split) rather than by the list schedule's value, the descent on
seed 7 ended at 1.8301 (polished 1.8277) in 0.4 CPU s, against 1.8351 (1.8325) in 0.9 s.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import NamedTuple

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.preemptive_order import (
    EXACT_CELLS,
    alone_chains,
    greedy_order,
    list_sequence,
    order_program,
)
from blitzplan.live.schedule import order_value
from blitzplan.live.split_jump import old_after_move

__all__ = ["STEPS", "Descended", "split_descent"]

STEPS = (16, 8, 4, 2, 1)
"""The moves of one batch's split, each tried down and up (largest first)."""


class Descended(NamedTuple):
    """Where :func:`split_descent` ended: the split, N's and O's orders and their mean latency."""

    split: list[int]
    new: list[int]
    old: list[int]
    value: float


def _scored(
    instance: LiveScalingInstance, split: Sequence[int], old: Sequence[int]
) -> tuple[float, list[int]]:
    """The preemptive program's value of ``split`` with O in ``old`` and its order of the
    batches' N work: the exact program's (a bound on every schedule of that split and O
    order) while its sets times points are at most
    :data:`~blitzplan.live.preemptive_order.EXACT_CELLS`, else its greedy form's score."""
    m = sum(1 for k in split if k > 0)
    points = len({t for chain in alone_chains(instance, split)[0] for t in chain})
    if (1 << m) * max(1, points) <= EXACT_CELLS:
        return order_program(instance, split, old)
    return greedy_order(instance, split, old)


def split_descent(
    instance: LiveScalingInstance,
    split: Sequence[int],
    old_sequence: Sequence[int],
    *,
    deadline_s: float,
) -> Descended | None:
    """The split descent from ``split`` (O in ``old_sequence``; module docstring) until no
    move lowers the program's value or ``deadline_s`` (a ``time.perf_counter()`` instant)
    passes, and its end list-scheduled; None when not even the start was valued by then.
    Mean latency."""
    if time.perf_counter() >= deadline_s:
        return None
    L = instance.num_layers
    best = (*_scored(instance, split, old_sequence), list(split), list(old_sequence))
    moved = True
    while moved and time.perf_counter() < deadline_s:
        moved = False
        for batch in range(instance.num_batches):
            k = best[2][batch]
            for target in (t for step in STEPS for t in (k - step, k + step) if 0 <= t <= L):
                if time.perf_counter() >= deadline_s:
                    break
                trial = [*best[2][:batch], target, *best[2][batch + 1 :]]
                old = old_after_move(instance, best[3], batch, k, target)
                score, order = _scored(instance, trial, old)
                if score < best[0]:
                    best, moved = (score, order, trial, old), True
                    break
    _, order, at, old = best
    new = list_sequence(instance, at, order)
    return Descended(at, new, old, order_value(instance, at, new, old, "mean_latency"))
