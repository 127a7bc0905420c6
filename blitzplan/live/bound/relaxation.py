"""The N-capacity relaxation: the model behind the strong lower bound and the exact search.

Relax one rule of DESIGN.md section 4 — N runs one operation at a time — and every batch's
layers on N run as if it had N to itself: layer ``k`` of batch ``i`` ends at ``f_i(k)`` (its
*alone chain*). What is left is O's sequencing, where a batch placed on O when O is free at ``T``
completes at ``g_i(T) = min over k of max(T, rho_i(k)) + (L - k) p^O_i`` (``rho_i(0) = r_i``,
``rho_i(k) = f_i(k) + d_i``), or finishes on N alone at ``f_i(L)``. Picking the best ``k`` for a
given start is optimal because it also frees O earliest. :mod:`blitzplan.live.bound.dp`
solves it (a dynamic program over the batches placed on O); its value bounds every objective from
below, and on light instances it is the optimum itself.

A :class:`Restriction` narrows the relaxation the way the exact search branches: a split range
per batch and, per layer, a time before which the layer may not start on N. The relaxation of a
restricted problem bounds every schedule that keeps the restriction.

The relaxed optimum, repaired (N's operations list-scheduled earliest-deadline-first against the
relaxed plan), is a feasible schedule: the warm start of the exact models and a move of
``improve``.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from blitzplan.live.instance import LiveScalingInstance
from blitzplan.live.schedule import SLO_TOL_S

__all__ = [
    "OptionsCache",
    "Relaxation",
    "RelaxedPlan",
    "Restriction",
    "alone_chain_s",
    "repair",
]


@dataclass(frozen=True)
class Restriction:
    """What a branch of the exact search fixes: batch ``i`` runs between ``split_min[i]`` and
    ``split_max[i]`` layers on N, and its layer ``l`` starts on N no earlier than
    ``start_after_s[i][l - 1]`` (an empty tuple: no such limit for that batch)."""

    split_min: tuple[int, ...]
    split_max: tuple[int, ...]
    start_after_s: tuple[tuple[float, ...], ...]

    @classmethod
    def none(cls, instance: LiveScalingInstance) -> Restriction:
        """No restriction at all: the relaxation of the whole problem."""
        n = instance.num_batches
        return cls((0,) * n, (instance.num_layers,) * n, ((),) * n)

    @property
    def empty(self) -> bool:
        """Whether some batch has no split left."""
        return any(low > high for low, high in zip(self.split_min, self.split_max, strict=True))

    def at_least(self, batch: int, layers: int) -> Restriction:
        """Batch ``batch`` runs at least ``layers`` layers on N."""
        low = list(self.split_min)
        low[batch] = max(low[batch], layers)
        return replace(self, split_min=tuple(low))

    def at_most(self, batch: int, layers: int) -> Restriction:
        """Batch ``batch`` runs at most ``layers`` layers on N."""
        high = list(self.split_max)
        high[batch] = min(high[batch], layers)
        return replace(self, split_max=tuple(high))

    def starting_after(self, batch: int, layer: int, at_s: float, layers: int) -> Restriction:
        """Layer ``layer`` of ``batch`` starts on N no earlier than ``at_s``."""
        limits = list(self.start_after_s[batch] or (0.0,) * layers)
        limits[layer - 1] = max(limits[layer - 1], at_s)
        after = list(self.start_after_s)
        after[batch] = tuple(limits)
        return replace(self, start_after_s=tuple(after))


def alone_chain_s(
    instance: LiveScalingInstance, i: int, restriction: Restriction | None = None
) -> tuple[float, ...]:
    """``[k]``: when layer ``k`` of batch ``i`` ends on N alone (``[0]`` is its release), each
    layer starting no earlier than its arrival and than the restriction allows."""
    after = () if restriction is None else restriction.start_after_s[i]
    chain = [instance.release_s[i]]
    p, usable = instance.new_layer_s[i], instance.usable_s
    for k in range(1, instance.num_layers + 1):
        start = max(chain[-1], usable[k - 1], after[k - 1] if after else 0.0)
        chain.append(start + p)
    return tuple(chain)


@dataclass(frozen=True)
class _Options:
    """One batch's choices on O: starts ``rho`` (ascending), remaining work ``q``, splits ``k``."""

    rho: tuple[float, ...]
    q: tuple[float, ...]
    k: tuple[int, ...]
    suffix_best: tuple[float, ...]
    suffix_arg: tuple[int, ...]
    chain_end: tuple[float, ...]
    """``chain_end[k]``: end of layer ``k`` on N alone (``[0]`` is the release)."""
    derived: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """What a bound derives from these options alone, kept with them: the exact search's nodes
    share each batch's options per restriction of that batch (:data:`OptionsCache`)."""

    def place(self, free_s: float) -> tuple[float, int]:
        """(completion, split) of the batch placed on O when O is free at ``free_s``; (inf, -1)
        when the restriction leaves it no split that ends on O."""
        j = bisect.bisect_right(self.rho, free_s) - 1
        best, arg = self.suffix_best[j + 1], self.suffix_arg[j + 1]
        if j >= 0 and free_s + self.q[j] <= best:
            best, arg = free_s + self.q[j], self.k[j]
        return best, arg


def _options(instance: LiveScalingInstance, i: int, restriction: Restriction) -> _Options:
    L, p_old = instance.num_layers, instance.old_layer_s[i]
    chain = alone_chain_s(instance, i, restriction)
    splits = range(restriction.split_min[i], min(restriction.split_max[i], L - 1) + 1)
    raw = [
        (instance.release_s[i] if k == 0 else chain[k] + instance.handoff_s[i], (L - k) * p_old, k)
        for k in splits
    ]
    raw.sort()
    kept: list[tuple[float, float, int]] = []
    for rho, q, k in raw:
        if not kept or q < kept[-1][1]:
            kept.append((rho, q, k))
    best, arg = [math.inf] * (len(kept) + 1), [-1] * (len(kept) + 1)
    for j in range(len(kept) - 1, -1, -1):
        rho, q, k = kept[j]
        best[j], arg[j] = (rho + q, k) if rho + q <= best[j + 1] else (best[j + 1], arg[j + 1])
    return _Options(
        rho=tuple(o[0] for o in kept),
        q=tuple(o[1] for o in kept),
        k=tuple(o[2] for o in kept),
        suffix_best=tuple(best),
        suffix_arg=tuple(arg),
        chain_end=chain,
    )


OptionsCache = dict[tuple[object, ...], _Options]
"""Each batch's options per (batch, its split range, its start limits): see
:class:`Relaxation`."""


class RelaxObjective:
    """Per-batch value of a completion time and how values aggregate, for each objective."""

    def __init__(self, instance: LiveScalingInstance, name: str) -> None:
        self.name, self.release = name, instance.release_s
        self.slo = instance.slo_s or (math.inf,) * instance.num_batches
        self.n = instance.num_batches
        self.use_max = name in ("max_latency", "makespan")

    def value(self, i: int, completion_s: float) -> float:
        """Batch ``i``'s share of the objective (inf when it cannot complete at all)."""
        latency = completion_s - self.release[i]
        if math.isinf(completion_s) or self.name == "makespan":
            return completion_s
        if self.name == "slo_violations":
            return 1.0 if latency > self.slo[i] + SLO_TOL_S else 0.0
        if self.name == "hard_slo" and latency > self.slo[i] + SLO_TOL_S:
            return math.inf
        return latency

    def combine(self, cost: float, value: float) -> float:
        return max(cost, value) if self.use_max else cost + value

    @property
    def empty(self) -> float:
        return -math.inf if self.use_max else 0.0

    def final(self, cost: float) -> float:
        """A cost (sum or maximum) in objective units."""
        return cost / self.n if self.name in ("mean_latency", "hard_slo") else cost

    def scaled(self, value: float) -> float:
        """An objective value in cost units (the inverse of :meth:`final`)."""
        return value * self.n if self.name in ("mean_latency", "hard_slo") else value


@dataclass(frozen=True)
class RelaxedPlan:
    """A solution of the relaxation: O's order, every batch's split, and its relaxed value."""

    old_sequence: tuple[int, ...]
    split: tuple[int, ...]
    value: float
    planned_old_start_s: tuple[float, ...]


class Relaxation:
    """The relaxation of one (possibly restricted) problem: per-batch options and values."""

    def __init__(
        self,
        instance: LiveScalingInstance,
        objective: str,
        restriction: Restriction | None = None,
        *,
        cache: OptionsCache | None = None,
    ) -> None:
        """``cache`` (owned by the caller, for one instance) keeps each batch's options per
        restriction of that batch: the nodes of a search differ in one or two batches."""
        self.instance = instance
        self.restriction = Restriction.none(instance) if restriction is None else restriction
        n = instance.num_batches
        self.options = [self._batch_options(i, cache) for i in range(n)]
        self.obj = RelaxObjective(instance, objective)
        L = instance.num_layers
        self.on_new = [
            self.obj.value(i, o.chain_end[-1]) if self.restriction.split_max[i] == L else math.inf
            for i, o in enumerate(self.options)
        ]

    def _batch_options(self, i: int, cache: OptionsCache | None) -> _Options:
        if cache is None:
            return _options(self.instance, i, self.restriction)
        r = self.restriction
        key = (i, r.split_min[i], r.split_max[i], r.start_after_s[i])
        found = cache.get(key)
        if found is None:
            found = cache[key] = _options(self.instance, i, r)
        return found

    def evaluate(self, old_sequence: Sequence[int]) -> float:
        """Relaxed cost: batches in ``old_sequence`` on O in that order, the rest on N alone."""
        free, cost = self.instance.old_free_at_s, self.obj.empty
        placed = set(old_sequence)
        for i in old_sequence:
            free, _ = self.options[i].place(free)
            cost = self.obj.combine(cost, self.obj.value(i, free))
        for i in range(self.instance.num_batches):
            if i not in placed:
                cost = self.obj.combine(cost, self.on_new[i])
        return cost

    def plan(self, old_sequence: Sequence[int]) -> RelaxedPlan:
        L, free = self.instance.num_layers, self.instance.old_free_at_s
        split, starts = [L] * self.instance.num_batches, [math.inf] * self.instance.num_batches
        for i in old_sequence:
            end, split[i] = self.options[i].place(free)
            starts[i], free = end - (L - split[i]) * self.instance.old_layer_s[i], end
        value = self.obj.final(self.evaluate(old_sequence))
        return RelaxedPlan(tuple(old_sequence), tuple(split), value, tuple(starts))

    def remaining_bound(self, free_s: float, rest: Sequence[int]) -> float:
        """The least cost the batches ``rest`` can add when O is free at ``free_s``."""
        cost = self.obj.empty
        for i in rest:
            on_old = self.obj.value(i, self.options[i].place(free_s)[0])
            cost = self.obj.combine(cost, min(on_old, self.on_new[i]))
        return cost


def repair(
    instance: LiveScalingInstance, plan: RelaxedPlan
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """A feasible (split, N order, O order) from a relaxed plan.

    N's operations are list-scheduled: whenever N is free, it runs the ready operation with the
    earliest deadline, the latest start that keeps the plan (the planned O start minus the
    hand-off and the batch's remaining N layers; for a batch finishing on N, its alone chain
    plus the N work of the batches finishing on N with less of it: those are due shortest
    first). Due alike, they would share N layer by layer and all end last: on (80,16) under
    FIFO, where O in release order leaves several long batches to N, the mean latency was 2.72
    s against 1.92 s so repaired (seed 0 of benchmarks/partition.py).
    """
    L, split, p = instance.num_layers, plan.split, instance.new_layer_s
    usable = instance.usable_s
    due = [
        plan.planned_old_start_s[i] - instance.handoff_s[i]
        if split[i] < L
        else alone_chain_s(instance, i)[L]
        for i in range(instance.num_batches)
    ]
    ahead = 0.0  # batches ending on N: shortest first, each due after the shorter ones
    for i in sorted((i for i in range(len(split)) if split[i] == L), key=lambda i: (p[i], i)):
        due[i] += ahead
        ahead += L * p[i]
    done = [0] * instance.num_batches
    waiting = [(max(usable[0], instance.release_s[i]), i) for i in range(len(split)) if split[i]]
    heapq.heapify(waiting)
    ready: list[tuple[float, int]] = []
    clock, sequence = 0.0, []
    while waiting or ready:
        if not ready and waiting[0][0] > clock:
            clock = waiting[0][0]
        while waiting and waiting[0][0] <= clock:
            _, i = heapq.heappop(waiting)
            heapq.heappush(ready, (due[i] - (split[i] - done[i]) * p[i], i))
        _, pick = heapq.heappop(ready)
        clock += p[pick]
        done[pick] += 1
        sequence.append(pick)
        if done[pick] < split[pick]:
            heapq.heappush(waiting, (max(usable[done[pick]], clock), pick))
    return split, tuple(sequence), plan.old_sequence
