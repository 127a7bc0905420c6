"""``method="improve"``: ZigZag, then local search over splits and orders within a time budget.

A solution is (split, N order, O order); :func:`~blitzplan.live.schedule.timetable` times it.
Starting from the best of ZigZag and the repaired N-capacity relaxation (a large move that
re-plans every split and O's order at once), random moves are tried and kept when they lower the
objective: move one batch's split up or down (inserting or removing its layers on N, moving it
on or off O), swap or move blocks on O, swap neighbouring layers of two batches on N, or move a
layer to another place on N between its batch's previous and next layers. Before them (in at
most half the time left) a steepest descent over larger split moves
(:mod:`blitzplan.live.split_jump`: a batch moved whole to O or to N, or to a quarter of its
layers) crosses what those steps cannot; :func:`polish` (the exact backends' incumbents) does
the same and, where asked under a free O order, orders O's blocks after the moves
(:mod:`blitzplan.live.block_order`). The answer for a control loop with 10-100 ms to spare;
the bound it reports is the cheap one (each batch alone), or the N-capacity relaxation's when
O's order is fixed (``old_order="fifo"``, where that relaxation is solved exactly in linear
time).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from blitzplan.live.block_order import order_blocks
from blitzplan.live.bound.dp import relaxation_bound, relaxed_greedy
from blitzplan.live.bound.relaxation import repair
from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.loop import simulate
from blitzplan.live.policies import ZigZag
from blitzplan.live.schedule import (
    Schedule,
    build_schedule,
    lower_bound,
    order_value,
)
from blitzplan.live.split_jump import jump_splits
from blitzplan.solvers.backends import SolveStatus

__all__ = ["BLOCKS_SHARE", "Solution", "improve", "polish"]

_GREEDY_SHARE = 0.2
"""The most of the budget the relaxed plan may take."""

BLOCKS_SHARE = 0.1
"""Under a free O order, the share of a polish's time left for ordering O's blocks at its end
where asked (:mod:`~blitzplan.live.block_order`: 1-4 ms on (80,16) of
``benchmarks/partition.py``): bnb asks it of the polishes after its root bounds. Asked of
every polish (the root's too, whose incumbents seed the slot bound's steps), bnb's 10 s
incumbents of (80,16) ended worse on seeds 0 and 3 (1.528-1.532 / 1.316-1.346 against
1.506 / 1.279-1.300; docs/benchmarks.md, s25-h2)."""

_JUMP_SHARE = 0.5
"""The most of the time left that the split jumps may take before the random moves."""


@dataclass
class Solution:
    """A mutable (split, N order, O order) with its objective value."""

    split: list[int]
    new: list[int]
    old: list[int]
    value: float

    @classmethod
    def of(cls, schedule: Schedule) -> Solution:
        seq_new, seq_old = schedule.new_sequence(), schedule.old_sequence()
        return cls(list(schedule.split), list(seq_new), list(seq_old), schedule.objective)


class _Search:
    """Random first-improvement local search; owns its RNG and its current solution."""

    def __init__(
        self, instance: LiveScalingInstance, objective: str, old_order: str, seed: int
    ) -> None:
        self.inst, self.objective, self.old_order = instance, objective, old_order
        self.rng = random.Random(seed)
        self.L = instance.num_layers

    def run(
        self,
        best: Solution,
        deadline_s: float,
        *,
        bound: float = -math.inf,
        max_moves: float = math.inf,
    ) -> Solution:
        """Search until the deadline, ``max_moves`` tried moves, or the value meets ``bound``."""
        moves = [self._split_up, self._split_down, self._old_swap, self._new_swap, self._new_move]
        if self.old_order == "free":
            moves.append(self._old_move)
        tried = 0
        while time.perf_counter() < deadline_s and best.value > bound and tried < max_moves:
            tried += 1
            candidate = self.rng.choice(moves)(best)
            if candidate is None:
                continue
            value = order_value(self.inst, *candidate, self.objective)
            if value < best.value:
                best = Solution(*candidate, value=value)
        return best

    def _insert_old(self, old: list[int], batch: int) -> list[int]:
        if self.old_order == "fifo":
            rank = self.inst.fifo_order.index
            return sorted([*old, batch], key=rank)
        position = self.rng.randrange(len(old) + 1)
        return [*old[:position], batch, *old[position:]]

    def _split_up(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        batch = self.rng.randrange(len(s.split))
        k = s.split[batch]
        if k == self.L:
            return None
        step = min(self.L - k, self.rng.choice((1, 1, 2, 4)))
        positions = [p for p, b in enumerate(s.new) if b == batch]
        after = positions[-1] + 1 if positions else 0
        where = after if self.rng.random() < 0.5 else self.rng.randrange(after, len(s.new) + 1)
        new = [*s.new[:where], *([batch] * step), *s.new[where:]]
        split = list(s.split)
        split[batch] = k + step
        old = [b for b in s.old if b != batch] if split[batch] == self.L else list(s.old)
        return split, new, old

    def _split_down(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        batch = self.rng.randrange(len(s.split))
        k = s.split[batch]
        if k == 0:
            return None
        step = min(k, self.rng.choice((1, 1, 2, 4)))
        new = list(s.new)
        for _ in range(step):
            new.pop(len(new) - 1 - new[::-1].index(batch))
        split = list(s.split)
        split[batch] = k - step
        old = self._insert_old(list(s.old), batch) if k == self.L else list(s.old)
        return split, new, old

    def _old_swap(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        if len(s.old) < 2 or self.old_order == "fifo":
            return None
        a = self.rng.randrange(len(s.old) - 1)
        b = a + 1 if self.rng.random() < 0.5 else self.rng.randrange(len(s.old))
        old = list(s.old)
        old[a], old[b] = old[b], old[a]
        return list(s.split), list(s.new), old

    def _old_move(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        if len(s.old) < 2:
            return None
        old = list(s.old)
        batch = old.pop(self.rng.randrange(len(old)))
        old.insert(self.rng.randrange(len(old) + 1), batch)
        return list(s.split), list(s.new), old

    def _new_swap(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        if len(s.new) < 2:
            return None
        a = self.rng.randrange(len(s.new) - 1)
        if s.new[a] == s.new[a + 1]:
            return None
        new = list(s.new)
        new[a], new[a + 1] = new[a + 1], new[a]
        return list(s.split), new, list(s.old)

    def _new_move(self, s: Solution) -> tuple[list[int], list[int], list[int]] | None:
        """Move one layer earlier or later on N, between its batch's previous and next layers."""
        if len(s.new) < 2:
            return None
        a = self.rng.randrange(len(s.new))
        batch = s.new[a]
        low = max((p for p in range(a) if s.new[p] == batch), default=-1) + 1
        high = min((p for p in range(a + 1, len(s.new)) if s.new[p] == batch), default=len(s.new))
        if high - low < 2:
            return None
        new = list(s.new)
        new.pop(a)
        new.insert(self.rng.randrange(low, high), batch)
        return list(s.split), new, list(s.old)


def polish(
    instance: LiveScalingInstance,
    start: Schedule,
    *,
    objective: str,
    old_order: str,
    deadline_s: float,
    bound: float = -math.inf,
    max_moves: float = math.inf,
    seed: int = 0,
    blocks: bool = False,
) -> Solution:
    """Local search from ``start`` until ``deadline_s`` (a ``time.perf_counter()`` value),
    ``max_moves`` tried moves (a fixed budget makes runs repeatable), or it meets ``bound``.
    With ``blocks``, under a free O order, O's blocks are then ordered (:func:`_blocked`), in
    the :data:`BLOCKS_SHARE` of the time the jumps and moves leave."""
    search = _Search(instance, objective, old_order, seed)
    if not blocks or old_order != "free":
        current = _jumped(instance, Solution.of(start), objective, deadline_s)
        return search.run(current, deadline_s, bound=bound, max_moves=max_moves)
    left = max(deadline_s - time.perf_counter(), 0.0)
    until = deadline_s if math.isinf(left) else deadline_s - BLOCKS_SHARE * left
    current = _jumped(instance, Solution.of(start), objective, until)
    found = search.run(current, until, bound=bound, max_moves=max_moves)
    return _blocked(instance, found, objective, deadline_s)


def _jumped(
    instance: LiveScalingInstance, current: Solution, objective: str, deadline_s: float
) -> Solution:
    """``current`` after the split jumps (:func:`~blitzplan.live.split_jump.jump_splits`)."""
    args = (current.split, current.new, current.old, objective, current.value)
    found = jump_splits(instance, *args, deadline_s=deadline_s)
    return current if found is None else Solution(*found)


def _blocked(
    instance: LiveScalingInstance, current: Solution, objective: str, deadline_s: float
) -> Solution:
    """``current`` with O's blocks re-ordered (:func:`~blitzplan.live.block_order.order_blocks`)."""
    args = (current.split, current.new, current.old, objective, current.value)
    found = order_blocks(instance, *args, deadline_s=deadline_s)
    return current if found is None else Solution(current.split, current.new, *found)


def improve(
    instance: LiveScalingInstance,
    *,
    objective: str = "mean_latency",
    old_order: str = "free",
    time_limit_s: float = 0.1,
    seed: int = 0,
) -> Schedule:
    """ZigZag improved within ``time_limit_s`` (all of the time counts, ZigZag's included)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    best = simulate(ZigZag(), instance, objective=objective, old_order=old_order)
    plan = relaxed_greedy(
        instance,
        objective=objective,
        old_order=old_order,
        time_limit_s=min(_GREEDY_SHARE * time_limit_s, (deadline - time.perf_counter()) / 2),
    )
    split, new, old = repair(instance, plan)
    timed = time.perf_counter()
    relaxed = Solution(list(split), list(new), list(old), math.inf)
    relaxed.value = order_value(instance, split, new, old, objective)
    reserve = 2 * (time.perf_counter() - timed)  # the final timing of the answer fits in
    current = relaxed if relaxed.value < best.objective else Solution.of(best)
    bound = (
        relaxation_bound(instance, objective=objective, old_order="fifo")[0]
        if old_order == "fifo"
        else lower_bound(instance, objective)
    )
    search = _Search(instance, objective, old_order, seed)
    jumps_until = time.perf_counter() + _JUMP_SHARE * (deadline - reserve - time.perf_counter())
    current = _jumped(instance, current, objective, jumps_until)
    found = search.run(current, deadline - reserve, bound=bound)
    status = SolveStatus.OPTIMAL if found.value <= bound else SolveStatus.FEASIBLE
    return build_schedule(
        instance,
        found.split,
        found.new,
        found.old,
        objective=objective,
        method="improve",
        old_order=old_order,
        status=status,
        bound=bound,
        solve_s=time.perf_counter() - started,
    )
