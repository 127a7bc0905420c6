"""O's blocks re-ordered at fixed splits and a fixed N order (a free O order).

O's order changes nothing on N: with the splits and N's order fixed, every block O serves has
a fixed release (its batch's release, or its last layer's end on N plus the hand-off) and a
fixed length, and O's order is a one-machine sequence of those blocks with release times.
Its value is read in time linear in the blocks, not by re-timing N, so O's order can be
searched far more cheaply than by the local search's random moves (each re-times N): here
from the schedule's own order, the earliest-completion-first order (at each step the block
that would end first) and shortest-released-first (at each step the shortest block already
released), each improved by steepest descent over moves of one block to another place; the
best is returned when it beats the schedule. On bnb's 1 s incumbents of (80,16) under a free
order of ``benchmarks/partition.py`` that lowered the mean latency by up to 2.9% (seed 5:
1.351 -> 1.311) in 10-40 ms (docs/benchmarks.md, s25-h2).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import evaluate_objective, time_new, time_old

__all__ = ["order_blocks"]

_TOL = 1e-12


class _Blocks:
    """O's blocks at fixed splits and N order: each block's release and length."""

    def __init__(
        self, instance: LiveScalingInstance, split: Sequence[int], new_sequence: Sequence[int]
    ) -> None:
        L = instance.num_layers
        last_end = time_new(instance, split, new_sequence)[1]
        self.instance, self.split = instance, split
        self.completion = last_end
        """Each batch's completion with O unserved: its last layer's end on N (or release)."""
        self.release = {
            b: max(instance.release_s[b], last_end[b] + instance.handoff_s[b] * (k > 0))
            for b, k in enumerate(split)
            if k < L
        }
        self.length = {b: (L - split[b]) * instance.old_layer_s[b] for b in self.release}
        self.free_at = instance.old_free_at_s

    def value(self, order: Sequence[int], objective: str) -> float:
        completion = time_old(self.instance, self.split, order, self.completion)[1]
        return evaluate_objective(self.instance, completion, objective)

    def _cost(
        self, order: Sequence[int], objective: str, at: int, clock: float, done: float
    ) -> float:
        """What the descent compares: under mean latency the sum of O's completions from
        position ``at`` of ``order`` on, O free at ``clock``, ``done`` the sum before it
        (the rest of the sum does not move); else the objective's value."""
        if objective != "mean_latency":
            return self.value(order, objective)
        release, length = self.release, self.length
        for batch in order[at:]:
            clock = max(clock, release[batch]) + length[batch]
            done += clock
        return done

    def earliest_completion(self) -> list[int]:
        left, clock, order = set(self.release), self.free_at, []
        while left:
            batch = min(
                left,
                key=lambda b: (max(clock, self.release[b]) + self.length[b], self.length[b], b),
            )
            order.append(batch)
            left.remove(batch)
            clock = max(clock, self.release[batch]) + self.length[batch]
        return order

    def shortest_released(self) -> list[int]:
        left, clock, order = set(self.release), self.free_at, []
        while left:
            clock = max(clock, min(self.release[b] for b in left))
            batch = min(
                (b for b in left if self.release[b] <= clock),
                key=lambda b: (self.length[b], self.release[b], b),
            )
            order.append(batch)
            left.remove(batch)
            clock += self.length[batch]
        return order

    def descend(
        self, order: list[int], objective: str, deadline_s: float
    ) -> tuple[list[int], float]:
        """Steepest descent over moves of one block to another place in ``order``; (the order
        it ends at, what :meth:`_cost` compares)."""
        cost = self._cost(order, objective, 0, self.free_at, 0.0)
        while time.perf_counter() < deadline_s:
            clocks, sums = [self.free_at], [0.0]  # O's clock and sum before each position
            for batch in order:
                clocks.append(max(clocks[-1], self.release[batch]) + self.length[batch])
                sums.append(sums[-1] + clocks[-1])
            best: tuple[list[int], float] | None = None
            for i, batch in enumerate(order):
                rest = [*order[:i], *order[i + 1 :]]
                for j in range(len(order)):
                    if j == i:
                        continue
                    moved = [*rest[:j], batch, *rest[j:]]
                    at = min(i, j)  # the order before it is unchanged
                    found = self._cost(moved, objective, at, clocks[at], sums[at])
                    if found < (cost if best is None else best[1]) - _TOL:
                        best = (moved, found)
            if best is None:
                break
            order, cost = best
        return order, cost


def order_blocks(
    instance: LiveScalingInstance,
    split: Sequence[int],
    new_sequence: Sequence[int],
    old_sequence: Sequence[int],
    objective: str,
    value: float,
    *,
    deadline_s: float,
) -> tuple[list[int], float] | None:
    """(O order, its value) of the best order of O's blocks found at the schedule's splits and
    N order (see the module docstring), or None when none beats ``value`` (the schedule's);
    stops at ``deadline_s`` (a ``time.perf_counter()`` value) with the best found so far."""
    blocks = _Blocks(instance, split, new_sequence)
    if len(blocks.release) < 2:
        return None
    best: tuple[list[int], float] | None = None
    for order in (list(old_sequence), blocks.earliest_completion(), blocks.shortest_released()):
        if time.perf_counter() >= deadline_s:
            break
        found = blocks.descend(order, objective, deadline_s)
        if best is None or found[1] < best[1] - _TOL:
            best = found
    if best is None:
        return None
    better = blocks.value(best[0], objective)
    return (best[0], better) if better < value - _TOL * max(1.0, abs(value)) else None
